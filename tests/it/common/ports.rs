//! Free ports for the processes tests start (servers, redis-server, Envoy).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The first port of the kernel's ephemeral range (the source ports of outgoing connections).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// A port free right now on 127.0.0.1, from 20000 up to the ephemeral range: a port the kernel
/// picked (bind to :0) could be handed out again as some connection's source port before Envoy
/// binds it. Successive calls walk the range from a per-process random start.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: OnceLock<u32> = OnceLock::new();
    let start = *START.get_or_init(|| {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() as u32
    });
    let (low, high) = (20000u32, u32::from(ephemeral_low()).max(20100));
    for _ in 0..(high - low) {
        let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        let port = (low + n % (high - low)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{high}");
}
