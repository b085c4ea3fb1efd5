//! Where the rules come from (`CONFIG_TYPE`) and the xDS client's settings, under the names
//! envoyproxy/ratelimit reads (each also a flag), checked into one [`XdsConfig`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};

use super::backoff::Backoff;
use super::tls::ClientTls;
use ratelimit_core::config::parse_duration;

/// Where the rules come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    /// The rules directory (`--config`), watched.
    File,
    /// An xDS management server, over ADS, State of the World.
    GrpcXdsSotw,
}

fn parse_config_type(text: &str) -> Result<ConfigType, String> {
    match text.trim().to_ascii_uppercase().as_str() {
        "FILE" => Ok(ConfigType::File),
        "GRPC_XDS_SOTW" => Ok(ConfigType::GrpcXdsSotw),
        _ => Err(format!("'{text}' is not FILE or GRPC_XDS_SOTW")),
    }
}

fn ratio(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{text}' is not a ratio between 0 and 1")),
    }
}

/// The rules source and the xDS client's settings.
#[derive(Debug, Clone, Args)]
pub struct XdsArgs {
    /// Where the rules come from: FILE (the --config directory) or GRPC_XDS_SOTW (an xDS
    /// management server, ADS State of the World, resources of type
    /// ratelimit.config.ratelimit.v3.RateLimitConfig).
    #[arg(long, env = "CONFIG_TYPE", default_value = "FILE", value_parser = parse_config_type)]
    pub config_type: ConfigType,
    /// The management server's host:port.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_URL",
        default_value = "localhost:18000"
    )]
    pub xds_server_url: String,
    /// The node id sent to the management server (Envoy Gateway serves `envoy-ratelimit`).
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_ID", default_value = "default")]
    pub xds_node_id: String,
    /// The node's metadata: `key1:val1,key2=val2` (string values).
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_METADATA", default_value = "")]
    pub xds_node_metadata: String,
    /// Headers sent on the xDS stream: `name1:value1,name2:value2`.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        default_value = ""
    )]
    pub xds_client_additional_headers: String,
    /// Wait between attempts to connect while the management server cannot be reached (± 50%).
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", default_value = "3s", value_parser = parse_duration)]
    pub xds_server_connect_retry_interval: Duration,
    /// Connect to the management server over TLS.
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_USE_TLS", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub xds_server_use_tls: bool,
    /// PEM client certificate chain presented to the management server (mTLS).
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT")]
    pub xds_client_tls_cert: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY")]
    pub xds_client_tls_key: Option<PathBuf>,
    /// PEM CA certificates the management server's certificate must chain to (default: the
    /// system's roots).
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")]
    pub xds_server_tls_cacert: Option<PathBuf>,
    /// The name the management server's certificate must carry (default: the URL's host).
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_TLS_SAN")]
    pub xds_server_tls_san: Option<String>,
    /// First wait before reopening a stream that ended; doubles per failed try.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub xds_client_backoff_initial_interval: Duration,
    /// Longest wait before reopening a stream.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_MAX_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub xds_client_backoff_max_interval: Duration,
    /// Share by which each wait is spread either way when jitter is on.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", default_value_t = 0.5, value_parser = ratio)]
    pub xds_client_backoff_random_factor: f64,
    /// Spread the waits (so many instances do not reconnect at once).
    #[arg(long, env = "XDS_CLIENT_BACKOFF_JITTER", action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub xds_client_backoff_jitter: bool,
    /// Largest xDS response accepted, in bytes (default 4194304, gRPC's).
    #[arg(long, env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")]
    pub xds_client_max_msg_size_in_bytes: Option<usize>,
    /// How long a stream may go without a response before a warning (and
    /// ratelimit_xds_stream_unanswered).
    #[arg(long, env = "XDS_CLIENT_ANSWER_WAIT", default_value = "15s", value_parser = parse_duration)]
    pub xds_client_answer_wait: Duration,
}

/// The xDS client, as the settings ask for it.
#[derive(Debug, Clone)]
pub struct XdsConfig {
    /// `host:port` of the management server.
    pub authority: String,
    pub node: Node,
    pub headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    pub connect_retry: Duration,
    pub backoff: Backoff,
    pub tls: Option<ClientTls>,
    pub max_message_bytes: usize,
    /// How long a stream may go without a response before a warning.
    pub answer_wait: Duration,
}

impl XdsConfig {
    /// Reads the TLS files once, so that a missing or broken one stops the start naming its
    /// setting (as the reference's start does), rather than failing every connection attempt.
    /// Each connection reads them again (rotated certificates are picked up).
    pub fn check(&self) -> Result<(), String> {
        match &self.tls {
            Some(tls) => tls.server_name().and(tls.client_config()).map(|_| ()),
            None => Ok(()),
        }
    }
}

/// gRPC's default largest message.
const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// `k1:v1,k2=v2` as pairs; `what` names the setting in errors. Values are not repeated in errors
/// (a header may carry a credential).
fn pairs(what: &str, text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .enumerate()
        .map(|(i, pair)| {
            let at = pair
                .find([':', '='])
                .ok_or_else(|| format!("{what}: entry {} is not key:value", i + 1))?;
            let (k, v) = (pair[..at].trim(), pair[at + 1..].trim());
            if k.is_empty() {
                return Err(format!("{what}: entry {} has an empty key", i + 1));
            }
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// `CONFIG_GRPC_XDS_NODE_METADATA` as pairs: an entry with neither `=` nor `:` is skipped with a
/// warning, as the reference's node skips it (`getClientNode`), rather than stopping the start.
fn node_metadata(text: &str) -> Result<Vec<(String, String)>, String> {
    let (entries, stray): (Vec<&str>, Vec<&str>) = text
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .partition(|p| p.contains([':', '=']));
    if !stray.is_empty() {
        tracing::warn!(
            skipped = stray.len(),
            "CONFIG_GRPC_XDS_NODE_METADATA: entries without `=` (key=value) are not sent, as by the reference"
        );
    }
    pairs("CONFIG_GRPC_XDS_NODE_METADATA", &entries.join(","))
}

impl XdsArgs {
    /// The client's settings when the rules come from xDS; `None` for files.
    pub fn config(&self) -> Result<Option<XdsConfig>, String> {
        if self.config_type == ConfigType::File {
            return Ok(None);
        }
        let authority = self
            .xds_server_url
            .trim()
            .trim_start_matches("grpc://")
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_owned();
        if authority.is_empty() || !authority.contains(':') {
            return Err(format!(
                "CONFIG_GRPC_XDS_SERVER_URL: '{}' is not host:port",
                self.xds_server_url
            ));
        }
        let metadata = node_metadata(&self.xds_node_metadata)?;
        let node = Node {
            id: self.xds_node_id.clone(),
            metadata: (!metadata.is_empty()).then(|| Struct {
                fields: metadata
                    .into_iter()
                    .map(|(k, v)| {
                        let value = Value {
                            kind: Some(Kind::StringValue(v)),
                        };
                        (k, value)
                    })
                    .collect(),
            }),
            user_agent_name: "ratelimit-server".into(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").into(),
            )),
            ..Default::default()
        };
        let what = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
        let headers = pairs(what, &self.xds_client_additional_headers)?
            .into_iter()
            .enumerate()
            .map(|(i, (k, v))| {
                let key = AsciiMetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                    .map_err(|_| format!("{what}: '{k}' is not a header name"))?;
                let value = AsciiMetadataValue::try_from(v.as_str()).map_err(|_| {
                    format!("{what}: the value of entry {} is not a header value", i + 1)
                })?;
                Ok((key, value))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let tls = self.xds_server_use_tls.then(|| ClientTls {
            ca: self.xds_server_tls_cacert.clone(),
            cert: self.xds_client_tls_cert.clone(),
            key: self.xds_client_tls_key.clone(),
            server_name: self
                .xds_server_tls_san
                .clone()
                .unwrap_or_else(|| host(&authority)),
        });
        if self.xds_client_backoff_max_interval < self.xds_client_backoff_initial_interval {
            return Err(
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL is shorter than XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"
                    .into(),
            );
        }
        Ok(Some(XdsConfig {
            authority,
            node,
            headers,
            connect_retry: self.xds_server_connect_retry_interval,
            backoff: Backoff {
                initial: self.xds_client_backoff_initial_interval,
                max: self.xds_client_backoff_max_interval,
                random_factor: self.xds_client_backoff_random_factor,
                jitter: self.xds_client_backoff_jitter,
            },
            tls,
            max_message_bytes: self
                .xds_client_max_msg_size_in_bytes
                .filter(|n| *n > 0)
                .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES),
            answer_wait: self.xds_client_answer_wait,
        }))
    }
}

/// The host of `host:port` (brackets of an IPv6 literal removed).
fn host(authority: &str) -> String {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        xds: XdsArgs,
    }

    fn args(argv: &[&str]) -> XdsArgs {
        let mut all = vec!["test"];
        all.extend_from_slice(argv);
        Wrapper::parse_from(all).xds
    }

    #[test]
    fn files_by_default_and_the_reference_defaults_for_xds() {
        assert!(args(&[]).config().unwrap().is_none());
        let c = args(&["--config-type", "grpc_xds_sotw"])
            .config()
            .unwrap()
            .unwrap();
        assert_eq!(c.authority, "localhost:18000");
        assert_eq!(c.node.id, "default");
        assert_eq!(c.connect_retry, Duration::from_secs(3));
        assert_eq!(c.backoff.initial, Duration::from_secs(10));
        assert_eq!(c.backoff.max, Duration::from_secs(60));
        assert!(c.backoff.jitter && c.tls.is_none());
        assert_eq!(c.max_message_bytes, 4 << 20);
    }

    #[test]
    fn metadata_headers_and_tls_are_read() {
        let c = args(&[
            "--config-type=GRPC_XDS_SOTW",
            "--xds-server-url=envoy-gateway:18001",
            "--xds-node-id=envoy-ratelimit",
            "--xds-node-metadata=zone:a, team=rl",
            "--xds-client-additional-headers=X-Token:abc",
            "--xds-server-use-tls",
            "--xds-server-tls-cacert=/certs/ca.crt",
        ])
        .config()
        .unwrap()
        .unwrap();
        let fields = c.node.metadata.unwrap().fields;
        assert_eq!(fields.len(), 2);
        assert_eq!(
            fields.get("team").and_then(|v| v.kind.clone()),
            Some(Kind::StringValue("rl".into()))
        );
        assert_eq!(c.headers[0].0.as_str(), "x-token");
        let tls = c.tls.unwrap();
        assert_eq!(tls.server_name, "envoy-gateway");
        assert_eq!(tls.ca, Some(PathBuf::from("/certs/ca.crt")));
    }

    #[test]
    fn bad_values_name_the_setting_without_repeating_a_header_value() {
        let e = args(&["--config-type=GRPC_XDS_SOTW", "--xds-server-url=nohost"])
            .config()
            .unwrap_err();
        assert!(e.starts_with("CONFIG_GRPC_XDS_SERVER_URL"), "{e}");
        let e = args(&[
            "--config-type=GRPC_XDS_SOTW",
            "--xds-client-additional-headers=x-token:sec\u{7}ret",
        ])
        .config()
        .unwrap_err();
        assert!(e.starts_with("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") && !e.contains("sec"));
        assert!(parse_config_type("GRPC").is_err());
        assert_eq!(host("[::1]:18000"), "::1");
    }
}
