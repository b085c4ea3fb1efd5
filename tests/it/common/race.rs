//! The exact-limit race: several server instances on one store, many requests at once on one key.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::sync::Semaphore;
use tonic::transport::Channel;

use super::{Code, code, request};

/// Domain `shared`: 300 per hour on `tb`, `fw` and `sw`, one per algorithm that counts, and a
/// leaky bucket `lb` of 300 per day whose answers may not wait (`max_delay: 0s`): one request
/// passes, the next one's turn is 288 s away.
pub const SHARED_RULES: &str = "\
domain: shared
descriptors:
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 300, algorithm: token_bucket}
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 300, algorithm: fixed_window}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 300, algorithm: sliding_window}
  - key: lb
    rate_limit: {unit: day, requests_per_unit: 300, algorithm: leaky_bucket, max_delay: 0s}
";

/// What each key of `SHARED_RULES` admits of a burst far above its limit.
pub const SHARED_LIMITS: [(&str, usize); 4] = [("tb", 300), ("fw", 300), ("sw", 300), ("lb", 1)];

/// A rules directory holding `SHARED_RULES`.
pub fn shared_rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shared.yaml"), SHARED_RULES).unwrap();
    dir
}

/// `count` requests on `key=value` in domain `shared`, `in_flight` at a time; how many were OK.
/// Every request must be answered (an error fails the test).
pub async fn fire(
    client: RateLimitServiceClient<Channel>,
    key: &'static str,
    value: String,
    count: usize,
    in_flight: usize,
) -> usize {
    let gate = Arc::new(Semaphore::new(in_flight));
    let mut tasks = Vec::with_capacity(count);
    for _ in 0..count {
        let permit = gate.clone().acquire_owned().await.unwrap();
        let mut client = client.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let r = client
                .should_rate_limit(request("shared", &[&[(key, value.as_str())]]))
                .await
                .expect("answered")
                .into_inner();
            drop(permit);
            code(r.overall_code) == Code::Ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap());
    }
    ok
}

/// Two `while :; do :; done` loops holding both cores of a CI machine, stopped on drop.
pub struct BusyLoops(Vec<Child>);

impl BusyLoops {
    pub fn start(count: usize) -> BusyLoops {
        BusyLoops(
            (0..count)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A turn for a test that puts a heavy load through a server and asserts what only a fault may
/// cause (the breaker never opening, exactly the limit admitted): one such test at a time, so that
/// another's hundreds of calls in flight on the same two cores cannot starve its proxy and server
/// for a whole `REDIS_TIMEOUT` and pass for the fault it looks for. Timeouts stay the defaults.
pub async fn heavy_load_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE_AT_A_TIME.lock().await
}
