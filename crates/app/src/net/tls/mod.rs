//! TLS on our listeners (rustls, ring provider; no OpenSSL). It sits on top of the [`Acceptor`](super::Acceptor)
//! (crate::net::Acceptor): a connection is accepted, capped and limited as a plaintext one is,
//! then its TLS handshake must finish within the connection's handshake timeout, and its limits
//! move onto the decrypted stream with the same deadline for the first request bytes. Certificate,
//! key and CA files are polled and swapped in when they change (`reload`); established connections
//! keep the config they were made with. A certificate outside its validity is refused, and the
//! serving one's end is exported and warned about (`expiry`).
//!
//! Owns: TLS settings, files → `ServerConfig`, reloading, handshakes. Must not touch: the engine,
//! rules, or how requests are served.

mod expiry;
mod files;
mod metrics;
mod reload;
mod settings;
mod stream;
#[cfg(test)]
mod tests;

pub(crate) use files::read_capped;
pub(crate) use files::{TlsError, TlsSpec};
pub(crate) use metrics::TlsMetrics;
pub(crate) use reload::{TlsSource, watch_files};
pub(crate) use settings::TlsArgs;
pub(crate) use stream::{Conn, open};
