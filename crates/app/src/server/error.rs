//! Why a server refused to start: each variant names the setting, file or address at fault.

use std::net::SocketAddr;

use crate::net::tls::TlsError;
use ratelimit_core::config::ConfigErrors;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid rules in {dir}:\n{errors}\nno rules are in force; refusing to start")]
    Rules { dir: String, errors: ConfigErrors },
    #[error("cannot watch the rules directory: {0}")]
    Watch(#[from] notify::Error),
    #[error("invalid setting {0}")]
    Setting(#[from] crate::settings::SettingError),
    #[error("invalid xDS setting {0}")]
    Xds(String),
    #[error("cannot use the store: {0}")]
    Store(#[from] ratelimit_core::store::StoreError),
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("{0}")]
    Tracing(#[from] crate::telemetry::TracingError),
    #[error("cannot record to {path} (RECORD_FILE): {source}")]
    Record {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot use ADMIN_TOKEN_FILE {path}: {error}")]
    AdminToken { path: String, error: String },
    #[error("invalid PROMETHEUS_MAPPER_YAML {path}: {error}")]
    Mapper { path: String, error: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on the Unix socket {path}: {source}")]
    BindUnix {
        path: String,
        source: std::io::Error,
    },
}
