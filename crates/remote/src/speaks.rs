//! What a server at a TCP address speaks, asked when a connection to it failed the way TLS on one
//! side only makes it fail: a connection of our own, a first message, and the first bytes of the
//! answer. A TLS ClientHello (rustls's, no certificate checked) answered with a TLS record says
//! TLS; an HTTP/2 client preface answered with a SETTINGS frame says plaintext HTTP/2 (gRPC).
//! The Redis store asks the first of its Redis (`ratelimit-redis`'s `speaks`); the xDS client both
//! of its management server.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TLS record's content types a server answers a ClientHello with: an alert (21) or a handshake
/// (22), then the record's major version (3).
const TLS_RECORDS: [[u8; 2]; 2] = [[0x15, 0x03], [0x16, 0x03]];

/// HTTP/2's client connection preface, then an empty SETTINGS frame.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// The frame type of HTTP/2's SETTINGS, the fourth byte of its frame header.
const SETTINGS_FRAME: u8 = 0x04;

/// Whether the server at `host:port` answers a TLS ClientHello with TLS, within `within`.
pub async fn speaks_tls(host: &str, port: u16, within: Duration) -> bool {
    let Some(hello) = client_hello(host) else {
        return false;
    };
    let first = tokio::time::timeout(within, first_bytes(host, port, &hello)).await;
    matches!(first, Ok(Some(bytes)) if bytes.len() >= 2 && TLS_RECORDS.contains(&[bytes[0], bytes[1]]))
}

/// Whether the server at `host:port` answers HTTP/2's client preface in plaintext, with a SETTINGS
/// frame (as a plaintext gRPC server does), within `within`.
pub async fn speaks_plaintext_http2(host: &str, port: u16, within: Duration) -> bool {
    let first = tokio::time::timeout(within, first_bytes(host, port, HTTP2_PREFACE)).await;
    matches!(first, Ok(Some(bytes)) if bytes.len() >= 4 && bytes[3] == SETTINGS_FRAME)
}

/// The first bytes the server at `host:port` answers `sent` with; `None` if it closed first.
pub async fn first_bytes(host: &str, port: u16, sent: &[u8]) -> Option<Vec<u8>> {
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
        .unwrap_or_else(|_| rustls::pki_types::ServerName::try_from("server").expect("a DNS name"));
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).ok()?;
    Some(hello)
}
