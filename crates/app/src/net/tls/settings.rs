//! The TLS flags (each also an environment variable, the gRPC ones named as envoyproxy/ratelimit
//! names them), checked into one [`TlsSpec`] per listener.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use super::files::{ADMIN_SETTINGS, GRPC_SETTINGS, SettingNames, TlsError, TlsSpec, parse_san};
use ratelimit_core::config::parse_duration;

/// ALPN of the gRPC listener: HTTP/2 only.
const GRPC_ALPN: &[&[u8]] = &[b"h2"];
/// ALPN of the admin listener, which speaks both.
const ADMIN_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// Serve gRPC over TLS, with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY.
    #[arg(long, env = "GRPC_SERVER_USE_TLS", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub grpc_server_use_tls: bool,
    /// PEM certificate chain of the gRPC listener (reloaded when it changes).
    #[arg(long, env = "GRPC_SERVER_TLS_CERT")]
    pub grpc_server_tls_cert: Option<PathBuf>,
    /// PEM private key of the gRPC listener (reloaded when it changes).
    #[arg(long, env = "GRPC_SERVER_TLS_KEY")]
    pub grpc_server_tls_key: Option<PathBuf>,
    /// PEM CA certificates: gRPC clients must present a certificate signed by one (mTLS).
    #[arg(long, env = "GRPC_CLIENT_TLS_CACERT")]
    pub grpc_client_tls_cacert: Option<PathBuf>,
    /// A DNS name or IP address the gRPC client's certificate must carry as a SAN.
    #[arg(long, env = "GRPC_CLIENT_TLS_SAN")]
    pub grpc_client_tls_san: Option<String>,
    /// PEM certificate chain of the admin HTTP listener; with ADMIN_TLS_KEY, it serves HTTPS.
    #[arg(long, env = "ADMIN_TLS_CERT")]
    pub admin_tls_cert: Option<PathBuf>,
    /// PEM private key of the admin HTTP listener.
    #[arg(long, env = "ADMIN_TLS_KEY")]
    pub admin_tls_key: Option<PathBuf>,
    /// PEM CA certificates: admin clients must present a certificate signed by one.
    #[arg(long, env = "ADMIN_CLIENT_TLS_CACERT")]
    pub admin_client_tls_cacert: Option<PathBuf>,
    /// A DNS name or IP address the admin client's certificate must carry as a SAN.
    #[arg(long, env = "ADMIN_CLIENT_TLS_SAN")]
    pub admin_client_tls_san: Option<String>,
    /// How often certificate, key and CA files are checked for changes.
    #[arg(long, env = "TLS_RELOAD_INTERVAL", default_value = "1s", value_parser = positive_duration)]
    pub tls_reload_interval: Duration,
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err("must be longer than 0".into()),
        d => Ok(d),
    }
}

struct Listener<'a> {
    names: SettingNames,
    /// Why TLS is on: "GRPC_SERVER_USE_TLS is true", or `None` when it is off.
    enabled_by: Option<String>,
    cert: &'a Option<PathBuf>,
    key: &'a Option<PathBuf>,
    client_ca: &'a Option<PathBuf>,
    client_san: &'a Option<String>,
    alpn: &'static [&'static [u8]],
}

impl Listener<'_> {
    fn spec(&self) -> Result<Option<TlsSpec>, TlsError> {
        let n = self.names;
        let Some(because) = &self.enabled_by else {
            for (setting, set) in [
                (n.client_ca, self.client_ca.is_some()),
                (n.client_san, self.client_san.is_some()),
            ] {
                if set {
                    return Err(TlsError::Invalid {
                        setting: setting.to_owned(),
                        message: format!("requires TLS on the {} listener", n.listener),
                    });
                }
            }
            return Ok(None);
        };
        let required = |setting: &'static str, value: &Option<PathBuf>| {
            value.clone().ok_or_else(|| TlsError::Missing {
                setting,
                because: because.clone(),
            })
        };
        let cert = required(n.cert, self.cert)?;
        let key = required(n.key, self.key)?;
        let client_san = match self.client_san {
            Some(text) => Some(parse_san(n.client_san, text)?),
            None => None,
        };
        if client_san.is_some() && self.client_ca.is_none() {
            return Err(TlsError::Missing {
                setting: n.client_ca,
                because: format!("{} is set", n.client_san),
            });
        }
        Ok(Some(TlsSpec {
            names: n,
            cert,
            key,
            client_ca: self.client_ca.clone(),
            client_san,
            alpn: self.alpn.iter().map(|p| p.to_vec()).collect(),
        }))
    }
}

impl TlsArgs {
    /// The gRPC listener's TLS, `None` when GRPC_SERVER_USE_TLS is off.
    pub fn grpc(&self) -> Result<Option<TlsSpec>, TlsError> {
        if !self.grpc_server_use_tls
            && (self.grpc_server_tls_cert.is_some() || self.grpc_server_tls_key.is_some())
        {
            tracing::warn!(
                "GRPC_SERVER_TLS_CERT/KEY are set but GRPC_SERVER_USE_TLS is false: gRPC is served in plaintext"
            );
        }
        Listener {
            names: GRPC_SETTINGS,
            enabled_by: self
                .grpc_server_use_tls
                .then(|| "GRPC_SERVER_USE_TLS is true".to_owned()),
            cert: &self.grpc_server_tls_cert,
            key: &self.grpc_server_tls_key,
            client_ca: &self.grpc_client_tls_cacert,
            client_san: &self.grpc_client_tls_san,
            alpn: GRPC_ALPN,
        }
        .spec()
    }

    /// The admin listener's TLS, on when ADMIN_TLS_CERT or ADMIN_TLS_KEY is set (both must be).
    pub fn admin(&self) -> Result<Option<TlsSpec>, TlsError> {
        let enabled_by = match (&self.admin_tls_cert, &self.admin_tls_key) {
            (Some(_), _) => Some("ADMIN_TLS_CERT is set".to_owned()),
            (None, Some(_)) => Some("ADMIN_TLS_KEY is set".to_owned()),
            (None, None) => None,
        };
        Listener {
            names: ADMIN_SETTINGS,
            enabled_by,
            cert: &self.admin_tls_cert,
            key: &self.admin_tls_key,
            client_ca: &self.admin_client_tls_cacert,
            client_san: &self.admin_client_tls_san,
            alpn: ADMIN_ALPN,
        }
        .spec()
    }
}
