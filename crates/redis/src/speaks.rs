//! Whether the server at `REDIS_URL` speaks TLS or plain Redis, asked when a connection failed the
//! way a mismatch of the two makes it fail. Redis's TLS port resets a plaintext client once it has
//! read its first command (the store sees a cut connection); its plaintext port answers a TLS
//! ClientHello as a bad command, or waits for the line end the ClientHello lacks (the store sees a
//! TLS error, or no connection in time). Each question is a connection of the store's own to the
//! same address: a ClientHello (rustls's, no certificate checked: whatever TLS record comes back
//! says TLS), or a `PING` (a Redis reply, `+` or `-`, says plain Redis).

use std::sync::Arc;
use std::time::Duration;

use ::redis::ConnectionAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TLS record's content types a server answers a ClientHello with: an alert (21) or a handshake
/// (22), then the record's major version (3).
const TLS_RECORDS: [[u8; 2]; 2] = [[0x15, 0x03], [0x16, 0x03]];

/// Whether the server at `addr` (TCP) answers a TLS ClientHello with TLS, within `within`.
pub(crate) async fn speaks_tls(addr: &ConnectionAddr, within: Duration) -> bool {
    let Some((host, port)) = tcp(addr) else {
        return false;
    };
    let Some(hello) = client_hello(host) else {
        return false;
    };
    let first = tokio::time::timeout(within, first_bytes(host, port, &hello)).await;
    matches!(first, Ok(Some(bytes)) if bytes.len() >= 2 && TLS_RECORDS.contains(&[bytes[0], bytes[1]]))
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

/// The first bytes the server at `host:port` answers `sent` with; `None` if it closed first.
async fn first_bytes(host: &str, port: u16, sent: &[u8]) -> Option<Vec<u8>> {
    let mut stream = TcpStream::connect((host, port)).await.ok()?;
    stream.write_all(sent).await.ok()?;
    let mut buf = vec![0u8; 64];
    match stream.read(&mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(read) => {
            buf.truncate(read);
            Some(buf)
        }
    }
}

/// A ClientHello for `host`, as rustls writes it (the process's crypto provider, no roots: only
/// the answer's first bytes are read).
fn client_hello(host: &str) -> Option<Vec<u8>> {
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .unwrap_or_else(|_| rustls::pki_types::ServerName::try_from("redis").expect("a DNS name"));
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).ok()?;
    Some(hello)
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
