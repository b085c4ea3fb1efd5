//! The Redis settings as the server reads them (`REDIS_URL`, `REDIS_TYPE`, `REDIS_SOCKET_TYPE`,
//! `REDIS_AUTH`, `REDIS_SENTINEL_AUTH`, `REDIS_TLS*`, `REDIS_POOL_SIZE`, `REDIS_TIMEOUT`,
//! `CACHE_KEY_PREFIX`), checked
//! together into a [`RedisConfig`], the TLS files read; every error names the setting at fault.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ::redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use ratelimit_core::redact;

use crate::conn::{RedisConfig, RedisTls, Topology};

/// How Redis is deployed (`REDIS_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisType {
    Single,
    Sentinel,
    Cluster,
}

impl RedisType {
    /// `single`, `sentinel` or `cluster`, in any case.
    pub fn parse(text: &str) -> Result<RedisType, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "single" => Ok(RedisType::Single),
            "sentinel" => Ok(RedisType::Sentinel),
            "cluster" => Ok(RedisType::Cluster),
            _ => Err(format!(
                "'{text}' is not a Redis type (expected single, sentinel or cluster)"
            )),
        }
    }
}

/// What a `REDIS_URL` without a scheme is (`REDIS_SOCKET_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    Tcp,
    Unix,
}

impl SocketType {
    /// `tcp` or `unix`, in any case.
    pub fn parse(text: &str) -> Result<SocketType, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(SocketType::Tcp),
            "unix" => Ok(SocketType::Unix),
            _ => Err(format!(
                "'{text}' is not a socket type (expected tcp or unix)"
            )),
        }
    }
}

/// The Redis settings as given, each already parsed on its own (the server's flags and
/// environment); [`RedisConfig::from_settings`] checks them together.
#[derive(Debug, Clone, Copy)]
pub struct RedisSettings<'a> {
    /// `REDIS_URL`: an address, comma-separated seeds (cluster), or `master,sentinel…`.
    pub url: &'a str,
    pub redis_type: RedisType,
    pub socket_type: SocketType,
    /// `REDIS_AUTH`: a password, `user:password`, or empty.
    pub auth: &'a str,
    /// `REDIS_SENTINEL_AUTH`: the sentinels' own password, `user:password`, or empty; read with
    /// `REDIS_TYPE=sentinel` only.
    pub sentinel_auth: &'a str,
    pub tls: bool,
    pub tls_cacert: Option<&'a Path>,
    pub tls_client_cert: Option<&'a Path>,
    pub tls_client_key: Option<&'a Path>,
    pub tls_skip_hostname_verification: bool,
    pub pool_size: usize,
    pub timeout: Duration,
    /// `CACHE_KEY_PREFIX` (checked for hash tags by the settings' parser).
    pub prefix: &'a str,
}

/// A bad Redis setting: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct InvalidSetting {
    setting: &'static str,
    message: String,
}

impl InvalidSetting {
    /// The setting at fault, by its environment variable's name (`REDIS_URL`).
    pub fn setting(&self) -> &'static str {
        self.setting
    }

    /// Why it is refused.
    pub fn message(&self) -> &str {
        &self.message
    }
}

fn bad(setting: &'static str, message: impl Into<String>) -> InvalidSetting {
    InvalidSetting {
        setting,
        message: message.into(),
    }
}

impl RedisConfig {
    /// The Redis connection settings, checked together; the TLS files are read now.
    pub fn from_settings(settings: &RedisSettings<'_>) -> Result<RedisConfig, InvalidSetting> {
        let topology = topology(settings)?;
        // Only sentinels read it; set beside another REDIS_TYPE it is unused, as by the reference.
        let sentinel_auth = match settings.redis_type {
            RedisType::Sentinel => auth(settings.sentinel_auth),
            _ => None,
        };
        Ok(RedisConfig {
            topology,
            auth: auth(settings.auth),
            sentinel_auth,
            tls: tls(settings)?,
            pool_size: settings.pool_size,
            timeout: settings.timeout,
            prefix: settings.prefix.to_owned(),
        })
    }

    /// A single server at `url` (`redis://host:port`), no auth or TLS (for tests and tools).
    pub fn single(url: &str) -> Result<RedisConfig, InvalidSetting> {
        Ok(Self::for_tools(Topology::Single(node(
            url,
            SocketType::Tcp,
        )?)))
    }

    /// A cluster seeded by `urls`, no auth or TLS (for tests and tools).
    pub fn cluster(urls: &[&str]) -> Result<RedisConfig, InvalidSetting> {
        let seeds = urls.iter().map(|u| node(u, SocketType::Tcp));
        Ok(Self::for_tools(Topology::Cluster(
            seeds.collect::<Result<_, _>>()?,
        )))
    }

    fn for_tools(topology: Topology) -> RedisConfig {
        RedisConfig {
            topology,
            auth: None,
            sentinel_auth: None,
            tls: None,
            pool_size: 2,
            timeout: Duration::from_secs(2),
            prefix: String::new(),
        }
    }
}

/// Where Redis is: `REDIS_URL` read as `REDIS_TYPE` and `REDIS_SOCKET_TYPE` say.
fn topology(settings: &RedisSettings<'_>) -> Result<Topology, InvalidSetting> {
    let parts: Vec<&str> = settings.url.split(',').collect();
    let socket = settings.socket_type;
    match settings.redis_type {
        RedisType::Single => {
            if parts.len() != 1 {
                return Err(bad(
                    "REDIS_URL",
                    "several addresses need REDIS_TYPE=cluster or sentinel",
                ));
            }
            Ok(Topology::Single(node(parts[0], socket)?))
        }
        RedisType::Cluster => {
            if socket == SocketType::Unix {
                return Err(bad("REDIS_SOCKET_TYPE", "a cluster is reached over tcp"));
            }
            let seeds = parts.iter().map(|p| node(p, SocketType::Tcp));
            Ok(Topology::Cluster(seeds.collect::<Result<_, _>>()?))
        }
        RedisType::Sentinel => {
            let master = parts[0].trim();
            if parts.len() < 2 || master.is_empty() || master.contains(':') {
                return Err(bad(
                    "REDIS_URL",
                    "sentinel needs master_name,host:port[,host:port…]",
                ));
            }
            let sentinels = parts[1..].iter().map(|p| node(p, SocketType::Tcp));
            Ok(Topology::Sentinel {
                master: master.to_owned(),
                sentinels: sentinels.collect::<Result<_, _>>()?,
            })
        }
    }
}

/// `REDIS_AUTH` or `REDIS_SENTINEL_AUTH`: (user, password), a user only when the text holds one
/// before a `:`.
fn auth(text: &str) -> Option<(Option<String>, String)> {
    match text {
        "" => None,
        text => Some(match text.split_once(':') {
            Some((user, password)) if !user.is_empty() => {
                (Some(user.to_owned()), password.to_owned())
            }
            _ => (None, text.to_owned()),
        }),
    }
}

/// TLS on (with the certificates read) or off: `REDIS_TLS`, or a `rediss://` URL.
fn tls(settings: &RedisSettings<'_>) -> Result<Option<RedisTls>, InvalidSetting> {
    let cert = read_pem("REDIS_TLS_CLIENT_CERT", settings.tls_client_cert)?;
    let key = read_pem("REDIS_TLS_CLIENT_KEY", settings.tls_client_key)?;
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
    let files = RedisTls {
        ca_cert: read_pem("REDIS_TLS_CACERT", settings.tls_cacert)?,
        client_cert: cert,
        client_key: key,
        skip_hostname_verification: settings.tls_skip_hostname_verification,
    };
    let url_tls = settings.url.contains("rediss://");
    let files_given = files.ca_cert.is_some() || files.client_cert.is_some();
    if files_given && !(settings.tls || url_tls) {
        return Err(bad(
            "REDIS_TLS",
            "TLS certificates are set but TLS is off (set REDIS_TLS=true or use rediss://)",
        ));
    }
    if settings.tls && settings.socket_type == SocketType::Unix {
        return Err(bad("REDIS_TLS", "TLS does not apply to a Unix socket"));
    }
    Ok((settings.tls || url_tls).then_some(files))
}

fn read_pem(setting: &'static str, path: Option<&Path>) -> Result<Option<Vec<u8>>, InvalidSetting> {
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
fn node(text: &str, socket: SocketType) -> Result<ConnectionInfo, InvalidSetting> {
    let text = text.trim();
    if text.is_empty() {
        return Err(bad("REDIS_URL", "an address is empty"));
    }
    // The address as messages show it: a password in it is never repeated.
    let shown = redact::credentials(text);
    let invalid = |e: ::redis::RedisError| bad("REDIS_URL", format!("'{shown}': {e}"));
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
        SocketType::Unix => ConnectionAddr::Unix(PathBuf::from(text))
            .into_connection_info()
            .map_err(invalid),
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

#[cfg(test)]
mod tests;
