//! Store settings: `--backend memory|redis` and the Redis connection, with envoyproxy/ratelimit's
//! environment variable names. `RedisArgs::config` checks them together and reads the TLS files;
//! every error names the setting at fault, and stops the server at start-up.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use ratelimit_core::config::parse_duration;
use ratelimit_redis::{RedisConfig, RedisTls, Topology};
use ratelimit_remote::{FailureMode, LocalShare};

/// Where counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendType {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisType {
    Single,
    Sentinel,
    Cluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    Tcp,
    Unix,
}

pub(super) fn parse_backend(text: &str) -> Result<BackendType, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "memory" => Ok(BackendType::Memory),
        "redis" => Ok(BackendType::Redis),
        _ => Err(format!(
            "'{text}' is not a backend (expected memory or redis)"
        )),
    }
}

pub(super) fn parse_redis_type(text: &str) -> Result<RedisType, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "single" => Ok(RedisType::Single),
        "sentinel" => Ok(RedisType::Sentinel),
        "cluster" => Ok(RedisType::Cluster),
        _ => Err(format!(
            "'{text}' is not a Redis type (expected single, sentinel or cluster)"
        )),
    }
}

pub(super) fn parse_socket_type(text: &str) -> Result<SocketType, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "tcp" => Ok(SocketType::Tcp),
        "unix" => Ok(SocketType::Unix),
        _ => Err(format!(
            "'{text}' is not a socket type (expected tcp or unix)"
        )),
    }
}

fn parse_pool_size(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("'{text}' must be a whole number from 1 to 1024")),
    }
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err("must be longer than 0".into());
    }
    Ok(d)
}

pub(super) fn parse_failure_mode(text: &str) -> Result<FailureMode, String> {
    FailureMode::parse(text).ok_or_else(|| {
        format!("'{text}' is not a failure mode (expected local, allow, deny or error)")
    })
}

/// A byte size, or 0 (off).
fn cache_bytes(text: &str) -> Result<usize, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    super::byte_size(text)
}

fn parse_prefix(text: &str) -> Result<String, String> {
    if text.contains(['{', '}']) {
        return Err(format!(
            "'{text}' must not contain '{{' or '}}' (a Redis Cluster hash tag: every key would land in one slot, on one master)"
        ));
    }
    Ok(text.to_owned())
}

/// The store flags of `serve`; each also reads the environment variable named.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Where counters live: memory (per instance) or redis (shared by every instance).
    #[arg(long, env = "BACKEND_TYPE", default_value = "memory", value_parser = parse_backend)]
    pub backend: BackendType,
    /// Redis address: host:port, redis://user:pass@host:port/db (user, pass and db optional), rediss://… (TLS), or a Unix
    /// socket path (with REDIS_SOCKET_TYPE=unix); cluster: comma-separated seed nodes; sentinel:
    /// master_name,host:port[,host:port…] (the sentinels).
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,
    /// single, sentinel or cluster (any case).
    #[arg(long, env = "REDIS_TYPE", default_value = "single", value_parser = parse_redis_type)]
    pub redis_type: RedisType,
    /// tcp or unix: what a REDIS_URL without a scheme is.
    #[arg(long, env = "REDIS_SOCKET_TYPE", default_value = "tcp", value_parser = parse_socket_type)]
    pub redis_socket_type: SocketType,
    /// Password, or user:password (ACL). A password in a redis:// URL wins.
    #[arg(long, env = "REDIS_AUTH", default_value = "", hide_env_values = true)]
    pub redis_auth: String,
    /// Connect with TLS (also implied by rediss:// URLs).
    #[arg(long, env = "REDIS_TLS", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub redis_tls: bool,
    /// PEM file of the CA(s) to trust for Redis (default: the system's roots).
    #[arg(long, env = "REDIS_TLS_CACERT")]
    pub redis_tls_cacert: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with REDIS_TLS_CLIENT_KEY).
    #[arg(long, env = "REDIS_TLS_CLIENT_CERT")]
    pub redis_tls_client_cert: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, env = "REDIS_TLS_CLIENT_KEY")]
    pub redis_tls_client_key: Option<PathBuf>,
    /// Accept a Redis certificate issued for another host name (the chain is still checked).
    #[arg(long, env = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub redis_tls_skip_hostname_verification: bool,
    /// Multiplexed connections to Redis (requests are pipelined over them).
    #[arg(long, env = "REDIS_POOL_SIZE", default_value = "4", value_parser = parse_pool_size)]
    pub redis_pool_size: usize,
    /// Bound on every Redis call, connecting included (100ms, 2s). Envoy's rate-limit filter
    /// `timeout` (20ms by default) should be longer, or Envoy gives up first (see README).
    #[arg(long, env = "REDIS_TIMEOUT", default_value = "100ms", value_parser = parse_timeout)]
    pub redis_timeout: Duration,
    /// While Redis is unreachable: local (decide from this instance's memory, same rules),
    /// allow (OK), deny (OVER_LIMIT) or error (gRPC UNAVAILABLE).
    #[arg(long, env = "REDIS_FAILURE_MODE", default_value = "local", value_parser = parse_failure_mode)]
    pub redis_failure_mode: FailureMode,
    /// With REDIS_FAILURE_MODE=local: the share of what each limit had left (by the values this
    /// instance last saw in Redis) that this instance may admit alone during an outage; what it
    /// admits is written back into Redis when it answers. `auto`: one over the instances alive on
    /// this Redis (each says so every 2 s; `ratelimit_redis_instances`), or a fraction (0.5).
    #[arg(long, env = "REDIS_FAILURE_LOCAL_SHARE", default_value = "auto", value_parser = LocalShare::parse)]
    pub redis_failure_local_share: LocalShare,
    /// Bytes for the local over-limit cache (0 = off; 1MiB, 64KiB accepted): a fixed-window key
    /// Redis denied is answered OVER_LIMIT without a Redis call until its window ends.
    #[arg(long, env = "LOCAL_CACHE_SIZE_IN_BYTES", default_value = "0", value_parser = cache_bytes)]
    pub local_cache_size_in_bytes: usize,
    /// Prepended to every Redis key (no braces).
    #[arg(long, env = "CACHE_KEY_PREFIX", default_value = "", value_parser = parse_prefix)]
    pub cache_key_prefix: String,
}

/// A bad store setting: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct SettingError {
    pub setting: &'static str,
    pub message: String,
}

fn bad(setting: &'static str, message: impl Into<String>) -> SettingError {
    SettingError {
        setting,
        message: message.into(),
    }
}

fn read_pem(
    setting: &'static str,
    path: &Option<PathBuf>,
) -> Result<Option<Vec<u8>>, SettingError> {
    let Some(path) = path else { return Ok(None) };
    let bytes = std::fs::read(path)
        .map_err(|e| bad(setting, format!("cannot read {}: {e}", path.display())))?;
    if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
        return Err(bad(
            setting,
            format!("{} is not a PEM file", path.display()),
        ));
    }
    Ok(Some(bytes))
}

/// One address of REDIS_URL.
fn node(text: &str, socket: SocketType) -> Result<ConnectionInfo, SettingError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(bad("REDIS_URL", "an address is empty"));
    }
    // The address as messages show it: a password in it is never repeated.
    let shown = ratelimit_core::redact::credentials(text);
    let invalid = |e: redis::RedisError| bad("REDIS_URL", format!("'{shown}': {e}"));
    if text.contains("://") {
        if !(text.starts_with("redis://")
            || text.starts_with("rediss://")
            || text.starts_with("redis+unix://")
            || text.starts_with("unix://"))
        {
            return Err(bad(
                "REDIS_URL",
                format!("'{shown}': the scheme must be redis, rediss or unix"),
            ));
        }
        return text.into_connection_info().map_err(invalid);
    }
    match socket {
        SocketType::Unix => Ok(ConnectionAddr::Unix(PathBuf::from(text))
            .into_connection_info()
            .map_err(invalid)?),
        SocketType::Tcp => {
            let (host, port) = text
                .rsplit_once(':')
                .ok_or_else(|| bad("REDIS_URL", format!("'{shown}' is not host:port")))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port: u16 = port
                .parse()
                .map_err(|_| bad("REDIS_URL", format!("'{shown}': bad port '{port}'")))?;
            if host.is_empty() {
                return Err(bad("REDIS_URL", format!("'{shown}' has no host")));
            }
            ConnectionAddr::Tcp(host.to_owned(), port)
                .into_connection_info()
                .map_err(invalid)
        }
    }
}

impl StoreArgs {
    /// The Redis connection settings, checked together.
    pub fn redis_config(&self) -> Result<RedisConfig, SettingError> {
        let parts: Vec<&str> = self.redis_url.split(',').collect();
        let socket = self.redis_socket_type;
        let topology = match self.redis_type {
            RedisType::Single => {
                if parts.len() != 1 {
                    return Err(bad(
                        "REDIS_URL",
                        "several addresses need REDIS_TYPE=cluster or sentinel",
                    ));
                }
                Topology::Single(node(parts[0], socket)?)
            }
            RedisType::Cluster => {
                if socket == SocketType::Unix {
                    return Err(bad("REDIS_SOCKET_TYPE", "a cluster is reached over tcp"));
                }
                Topology::Cluster(
                    parts
                        .iter()
                        .map(|p| node(p, SocketType::Tcp))
                        .collect::<Result<_, _>>()?,
                )
            }
            RedisType::Sentinel => {
                let master = parts[0].trim();
                if parts.len() < 2 || master.is_empty() || master.contains(':') {
                    return Err(bad(
                        "REDIS_URL",
                        "sentinel needs master_name,host:port[,host:port…]",
                    ));
                }
                Topology::Sentinel {
                    master: master.to_owned(),
                    sentinels: parts[1..]
                        .iter()
                        .map(|p| node(p, SocketType::Tcp))
                        .collect::<Result<_, _>>()?,
                }
            }
        };
        let auth = match self.redis_auth.as_str() {
            "" => None,
            text => Some(match text.split_once(':') {
                Some((user, password)) if !user.is_empty() => {
                    (Some(user.to_owned()), password.to_owned())
                }
                _ => (None, text.to_owned()),
            }),
        };
        let cert = read_pem("REDIS_TLS_CLIENT_CERT", &self.redis_tls_client_cert)?;
        let key = read_pem("REDIS_TLS_CLIENT_KEY", &self.redis_tls_client_key)?;
        if cert.is_some() != key.is_some() {
            return Err(bad(
                if cert.is_some() {
                    "REDIS_TLS_CLIENT_KEY"
                } else {
                    "REDIS_TLS_CLIENT_CERT"
                },
                "a client certificate needs both REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY",
            ));
        }
        let tls_files = RedisTls {
            ca_cert: read_pem("REDIS_TLS_CACERT", &self.redis_tls_cacert)?,
            client_cert: cert,
            client_key: key,
            skip_hostname_verification: self.redis_tls_skip_hostname_verification,
        };
        let url_tls = self.redis_url.contains("rediss://");
        let files_given = tls_files.ca_cert.is_some() || tls_files.client_cert.is_some();
        if files_given && !(self.redis_tls || url_tls) {
            return Err(bad(
                "REDIS_TLS",
                "TLS certificates are set but TLS is off (set REDIS_TLS=true or use rediss://)",
            ));
        }
        if self.redis_tls && socket == SocketType::Unix {
            return Err(bad("REDIS_TLS", "TLS does not apply to a Unix socket"));
        }
        Ok(RedisConfig {
            topology,
            auth,
            tls: (self.redis_tls || url_tls).then_some(tls_files),
            pool_size: self.redis_pool_size,
            timeout: self.redis_timeout,
            prefix: self.cache_key_prefix.clone(),
        })
    }
}

#[cfg(test)]
mod tests;
