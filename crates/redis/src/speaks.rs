//! Whether the server at `REDIS_URL` speaks TLS or plain Redis, asked when a connection failed the
//! way a mismatch of the two makes it fail. Redis's TLS port resets a plaintext client once it has
//! read its first command (the store sees a cut connection); its plaintext port answers a TLS
//! ClientHello as a bad command, or waits for the line end the ClientHello lacks (the store sees a
//! TLS error, or no connection in time). Each question is a connection of the store's own to the
//! same address: a ClientHello (`ratelimit_remote::speaks`: whatever TLS record comes back says
//! TLS), or a `PING` (a Redis reply, `+` or `-`, says plain Redis).

use std::time::Duration;

use ::redis::ConnectionAddr;
use ratelimit_remote::speaks::{self, first_bytes};

/// Whether the server at `addr` (TCP) answers a TLS ClientHello with TLS, within `within`.
pub(crate) async fn speaks_tls(addr: &ConnectionAddr, within: Duration) -> bool {
    let Some((host, port)) = tcp(addr) else {
        return false;
    };
    speaks::speaks_tls(host, port, within).await
}

/// Whether the server at `addr` (TCP) answers a plaintext `PING` as Redis does (`+PONG`, or an
/// error line such as `-NOAUTH`), within `within`.
pub(crate) async fn answers_plain_redis(addr: &ConnectionAddr, within: Duration) -> bool {
    let Some((host, port)) = tcp(addr) else {
        return false;
    };
    let first = tokio::time::timeout(within, first_bytes(host, port, b"PING\r\n")).await;
    matches!(first, Ok(Some(bytes)) if bytes.starts_with(b"+") || bytes.starts_with(b"-"))
}

/// The host and port of a TCP address, with or without TLS.
fn tcp(addr: &ConnectionAddr) -> Option<(&str, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.as_str(), *port))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real Redis on its plaintext port: it answers a PING, and answers no ClientHello with TLS.
    #[tokio::test]
    async fn a_plaintext_redis_answers_a_ping_and_not_a_client_hello() {
        let Some(redis) = crate::test_redis::TestRedis::start() else {
            return;
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let info = ::redis::Client::open(redis.url()).unwrap();
        let addr = info.get_connection_info().addr().clone();
        let within = Duration::from_secs(2);
        assert!(answers_plain_redis(&addr, within).await);
        assert!(!speaks_tls(&addr, within).await);
    }
}
