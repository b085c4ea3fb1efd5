//! Store settings: `--backend memory|redis` and the Redis connection, with envoyproxy/ratelimit's
//! environment variable names. `StoreArgs::redis_config` hands the Redis ones to the Redis crate,
//! which checks them together and reads the TLS files; every error names the setting at fault,
//! and stops the server at start-up.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use ratelimit_core::config::parse_duration;
use ratelimit_redis::{InvalidSetting, RedisConfig, RedisSettings, RedisType, SocketType};
use ratelimit_remote::{FailureMode, LocalShare};

/// Where counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendType {
    Memory,
    Redis,
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
    #[arg(long, env = "REDIS_TYPE", default_value = "single", value_parser = RedisType::parse)]
    pub redis_type: RedisType,
    /// tcp or unix: what a REDIS_URL without a scheme is.
    #[arg(long, env = "REDIS_SOCKET_TYPE", default_value = "tcp", value_parser = SocketType::parse)]
    pub redis_socket_type: SocketType,
    /// Password, or user:password (ACL). A password in a redis:// URL wins.
    #[arg(long, env = "REDIS_AUTH", default_value = "", hide_env_values = true)]
    pub redis_auth: String,
    /// With REDIS_TYPE=sentinel: the sentinels' own password, or user:password (ACL); REDIS_AUTH
    /// is the master's. Unset: the sentinels are asked without one.
    #[arg(
        long,
        env = "REDIS_SENTINEL_AUTH",
        default_value = "",
        hide_env_values = true
    )]
    pub redis_sentinel_auth: String,
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
    /// this Redis (each says so every 2 s, sooner at start; `ratelimit_redis_instances`), or a
    /// fraction (0.5).
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

impl From<InvalidSetting> for SettingError {
    fn from(e: InvalidSetting) -> SettingError {
        SettingError {
            setting: e.setting(),
            message: e.message().to_owned(),
        }
    }
}

impl StoreArgs {
    /// The Redis connection settings, checked together (by the Redis crate).
    pub fn redis_config(&self) -> Result<RedisConfig, SettingError> {
        let settings = RedisSettings {
            url: &self.redis_url,
            redis_type: self.redis_type,
            socket_type: self.redis_socket_type,
            auth: &self.redis_auth,
            sentinel_auth: &self.redis_sentinel_auth,
            tls: self.redis_tls,
            tls_cacert: self.redis_tls_cacert.as_deref(),
            tls_client_cert: self.redis_tls_client_cert.as_deref(),
            tls_client_key: self.redis_tls_client_key.as_deref(),
            tls_skip_hostname_verification: self.redis_tls_skip_hostname_verification,
            pool_size: self.redis_pool_size,
            timeout: self.redis_timeout,
            prefix: &self.cache_key_prefix,
        };
        Ok(RedisConfig::from_settings(&settings)?)
    }
}

#[cfg(test)]
mod tests;
