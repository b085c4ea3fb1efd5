//! Server settings: one struct with documented defaults, filled from flags or environment variables
//! (the reference's names where one exists).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use crate::net::tls::TlsArgs;
pub(crate) use crate::statsd::StatsdArgs;
pub use crate::xds::ConfigType;
pub(crate) use crate::xds::XdsArgs;
use ratelimit_core::config::{Algorithm, MAX_DELAY_LIMIT, format_duration, parse_duration};
use ratelimit_core::engine::{EngineSettings, HeaderNames, RequestBounds, ResponseHeaders};
use ratelimit_core::limiter::LimitDefaults;
use ratelimit_core::rules_dir::SizeCaps;
pub(crate) use transport_args::{TransportArgs, byte_size};

/// Caps on the rules files read, checked from each file's size before reading it; shared by
/// `serve` and `check`.
#[derive(Debug, Clone, Args)]
pub struct RulesFilesArgs {
    /// Largest rules file (bytes; 8MiB, 512KiB accepted); a larger one is a load error.
    #[arg(long, env = "MAX_FILE_BYTES", default_value = "8MiB", value_parser = byte_size)]
    pub max_file_bytes: usize,
    /// Most bytes of all rules files together; more is a load error.
    #[arg(long, env = "MAX_TOTAL_BYTES", default_value = "32MiB", value_parser = byte_size)]
    pub max_total_bytes: usize,
    /// Let one domain span several files (their descriptors are merged; the same key and value
    /// at the top level of two files is an error), as the reference's MERGE_DOMAIN_CONFIG.
    /// A value takes `=` (`--merge-domain-config=false`): `check --merge-domain-config DIR` is the
    /// flag and the directory, not DIR read as the flag's value.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", action = clap::ArgAction::Set, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub merge_domain_config: bool,
}

impl RulesFilesArgs {
    pub fn caps(&self) -> SizeCaps {
        SizeCaps {
            max_file_bytes: self.max_file_bytes as u64,
            max_total_bytes: self.max_total_bytes as u64,
        }
    }
}

mod store_args;

pub use store_args::BackendType;
pub(crate) use store_args::{SettingError, StoreArgs};

mod tracing_args;

mod transport_args;

mod record_args;

pub(crate) use record_args::RecordArgs;

pub(crate) use tracing_args::TracingArgs;

/// What a limit that does not say gets; shared by `serve` and `explain`.
#[derive(Debug, Clone, Args)]
pub struct DefaultsArgs {
    /// Algorithm of limits that name none: token_bucket, fixed_window, sliding_window or
    /// leaky_bucket.
    #[arg(long, env = "DEFAULT_ALGORITHM", default_value = "token_bucket", value_parser = parse_algorithm)]
    pub default_algorithm: Algorithm,
    /// Leaky bucket: longest wait for a turn when a limit sets no max_delay (250ms, 2s, 1m).
    /// Envoy's rate-limit filter `timeout` must be longer.
    #[arg(long, env = "DEFAULT_MAX_DELAY", default_value = "1s", value_parser = parse_max_delay)]
    pub default_max_delay: Duration,
    /// Fixed and sliding windows count the hits of denied requests too, as the reference counts
    /// them: a cost charged after the fact (Envoy's `apply_on_stream_done`, an AI Gateway's token
    /// count) stays spent even when it did not fit, and keeps the window over until it ends.
    /// On by default with CONFIG_TYPE=GRPC_XDS_SOTW.
    #[arg(long, env = "CHARGE_DENIED_HITS", action = clap::ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub charge_denied_hits: bool,
}

impl DefaultsArgs {
    pub fn limit_defaults(&self) -> LimitDefaults {
        LimitDefaults {
            algorithm: self.default_algorithm,
            max_delay: self.default_max_delay.as_nanos() as u64,
            charge_denied: self.charge_denied_hits,
        }
    }
}

/// An algorithm name from the command line; the error lists the valid ones.
pub fn parse_algorithm(text: &str) -> Result<Algorithm, String> {
    Algorithm::parse(text).ok_or_else(|| {
        format!(
            "invalid algorithm '{text}' (expected one of: {})",
            Algorithm::ALL.map(Algorithm::name).join(", ")
        )
    })
}

fn parse_metrics_path(text: &str) -> Result<String, String> {
    let path = text.trim();
    if path.starts_with('/') && path.len() > 1 && !path.contains(['{', '}', '*', ' ']) {
        Ok(path.to_owned())
    } else {
        Err(format!("'{text}' is not a path like /metrics"))
    }
}

fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{text}' is not a ratio between 0 and 1")),
    }
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("'{text}' must be a whole number of at least 1")),
    }
}

fn parse_max_delay(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d > MAX_DELAY_LIMIT {
        return Err(format!(
            "must be at most {}",
            format_duration(MAX_DELAY_LIMIT)
        ));
    }
    Ok(d)
}

/// `ratelimit-server serve` flags; each also reads the environment variable named.
#[derive(Debug, Clone, Args)]
pub struct ServeSettings {
    /// Directory of rules files (*.yaml, *.yml, searched recursively); with CONFIG_TYPE=FILE.
    #[arg(long, env = "CONFIG_DIR", default_value = "config")]
    pub config: PathBuf,
    /// gRPC listen address (RateLimitService and grpc.health.v1).
    #[arg(long, env = "GRPC_ADDR", default_value = "0.0.0.0:8081")]
    pub grpc_addr: SocketAddr,
    /// HTTP admin listen address (/metrics, /healthcheck, /readyz, /rlconfig, POST /json).
    #[arg(long, env = "HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// `/healthcheck` fails while no rules domain is loaded (the reference's
    /// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
    #[arg(long, env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub healthy_with_at_least_one_config_loaded: bool,
    /// Also serve gRPC on this Unix socket (Envoy can use it as a pipe address); the reference's
    /// GRPC_UDS.
    #[arg(long, env = "GRPC_UDS")]
    pub grpc_uds: Option<PathBuf>,
    /// Close each gRPC connection (with a GOAWAY) after this long, so clients rebalance across
    /// instances; Go-style durations (`24h`, `1h30m`, `90s`). Off unless set (the reference's
    /// GRPC_MAX_CONNECTION_AGE; there 24h by default).
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE", value_parser = parse_go_duration)]
    pub grpc_max_connection_age: Option<Duration>,
    /// After GRPC_MAX_CONNECTION_AGE, how long calls in progress may finish (the reference's
    /// GRPC_MAX_CONNECTION_AGE_GRACE).
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "1h", value_parser = parse_go_duration)]
    pub grpc_max_connection_age_grace: Duration,
    /// Start even when the rules are invalid, with none in force, until a reload brings valid
    /// ones (the reference's FORCE_START_WITHOUT_INITIAL_CONFIG); by default invalid rules stop
    /// the start. With rules from xDS: serve (and report healthy) before the first response;
    /// by default health fails until the first valid one.
    #[arg(long, env = "FORCE_START_WITHOUT_INITIAL_CONFIG", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub force_start_without_initial_config: bool,
    /// Debug listen address (an index and /rlconfig, as the reference's debug port); off unless
    /// set (the reference's DEBUG_HOST/DEBUG_PORT set it too).
    #[arg(long, env = "DEBUG_ADDR")]
    pub debug_addr: Option<SocketAddr>,
    /// Also serve the metrics on this address, alone (the reference's PROMETHEUS_ADDR with
    /// USE_PROMETHEUS=true sets it); off unless set. The HTTP port's /metrics stays.
    #[arg(long, env = "METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// The metrics' path on METRICS_ADDR (the reference's PROMETHEUS_PATH).
    #[arg(long, env = "METRICS_PATH", default_value = "/metrics", value_parser = parse_metrics_path)]
    pub metrics_path: String,
    /// A statsd-exporter mapping file (the reference's PROMETHEUS_MAPPER_YAML; Envoy Gateway
    /// passes one): the reference's stats (per rule, config loads) appear on the metrics pages
    /// under the names and labels it maps them to, instead of ours. Unset: ours.
    #[arg(long, env = "PROMETHEUS_MAPPER_YAML")]
    pub prometheus_mapper_yaml: Option<PathBuf>,
    /// A file holding the quota API's bearer token (read once, at start; surrounding whitespace
    /// ignored): with it the admin port serves `/v1/counters`, `/v1/reset` and `/v1/overrides`
    /// to calls carrying `Authorization: Bearer <token>`; without it those paths are 404.
    #[arg(long, env = "ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// The most overrides in force at once (the quota API's `PUT /v1/overrides` of a new
    /// descriptor beyond it is refused, 409): each change is read back by every instance whole.
    #[arg(long, env = "MAX_OVERRIDES", default_value_t = 10_000, value_parser = at_least_one)]
    pub max_overrides: usize,
    /// Serve the Rate Limit Quota Service (`StreamRateLimitQuotas`, for Envoy's rate_limit_quota
    /// filter) on the gRPC listener beside ShouldRateLimit.
    #[arg(long, env = "RLQS_ENABLED", action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    pub rlqs_enabled: bool,
    /// Answer OK overall even when over a limit; statuses and counters still tell the truth.
    #[arg(long, env = "SHADOW_MODE", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub shadow_mode: bool,
    /// Treat every descriptor as `quota_mode` (the reference's QUOTA_MODE): over the limit, the
    /// request is denied only when every descriptor is over.
    #[arg(long, env = "QUOTA_MODE", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub quota_mode: bool,
    /// Return the request and the passing descriptors' `metadata` in the response's dynamic
    /// metadata (the reference's RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "RESPONSE_DYNAMIC_METADATA", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub response_dynamic_metadata: bool,
    /// Share of a limit past which hits count as near the limit (metrics).
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    pub near_limit_ratio: f64,
    /// Rate-limit headers in answers: `off`, `draft03` (the reference's RateLimit-Limit/
    /// Remaining/Reset of the tightest limit, named by LIMIT_*_HEADER) or `ietf`
    /// (draft-ietf-httpapi-ratelimit-headers-11: RateLimit-Policy and RateLimit of every
    /// advertised limit, Retry-After on OVER_LIMIT). Unset: `draft03` if
    /// LIMIT_RESPONSE_HEADERS_ENABLED is true, else `off`.
    #[arg(long, env = "RATE_LIMIT_HEADERS", value_parser = parse_rate_limit_headers)]
    pub rate_limit_headers: Option<RateLimitHeaders>,
    /// Add RateLimit-Limit/Remaining/Reset headers to responses (the reference's setting; the
    /// same as RATE_LIMIT_HEADERS=draft03, which wins when both are set).
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub limit_response_headers_enabled: bool,
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit")]
    pub limit_limit_header: String,
    #[arg(
        long,
        env = "LIMIT_REMAINING_HEADER",
        default_value = "RateLimit-Remaining"
    )]
    pub limit_remaining_header: String,
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset")]
    pub limit_reset_header: String,
    /// Most keys the memory store holds; past it the soonest-expiring sampled keys are evicted.
    #[arg(long, env = "MAX_KEYS", default_value_t = 1_000_000)]
    pub max_keys: usize,
    /// Most distinct label sets of `detailed_metric` rules; past it hits go to `<rule>_overflow`.
    #[arg(long, env = "DETAILED_METRICS_CAP", default_value_t = 1000)]
    pub detailed_metrics_cap: usize,
    /// On SIGTERM, how long in-flight calls may take to finish before connections are closed.
    #[arg(long, env = "DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// On SIGTERM, how long to keep serving while health says NOT_SERVING (so load balancers and
    /// Kubernetes see it and stop sending) before the listeners close. SIGINT skips it.
    #[arg(long, env = "SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// Most descriptors in one request.
    #[arg(long, env = "MAX_DESCRIPTORS", default_value_t = 64, value_parser = at_least_one)]
    pub max_descriptors: usize,
    /// The most answers held for a leaky bucket's turn at once, across keys (about 4 KB each):
    /// one more is answered RESOURCE_EXHAUSTED at once, its turn given back.
    #[arg(long, env = "MAX_WAITING_ANSWERS", default_value_t = ratelimit_core::engine::MAX_WAITING_ANSWERS, value_parser = at_least_one)]
    pub max_waiting_answers: usize,
    /// Most entries in one descriptor.
    #[arg(long, env = "MAX_ENTRIES", default_value_t = 32, value_parser = at_least_one)]
    pub max_entries: usize,
    /// Longest domain, key or value in bytes.
    #[arg(long, env = "MAX_STRING_LEN", default_value_t = 4096, value_parser = at_least_one)]
    pub max_string_len: usize,
    /// Threads that serve requests (the async runtime's workers); by default one per CPU the
    /// process may use. tokio's own variable: set for another tokio program, it means the same
    /// here. Fewer than the CPUs can cost less per request where the server shares its CPUs
    /// (docs/cost-per-decision.md, "Fewer request workers").
    #[arg(long, env = "TOKIO_WORKER_THREADS", value_parser = at_least_one)]
    pub worker_threads: Option<usize>,
    #[command(flatten)]
    pub rules_files: RulesFilesArgs,
    #[command(flatten)]
    pub defaults: DefaultsArgs,
    #[command(flatten)]
    pub transport: TransportArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub tracing: TracingArgs,
    #[command(flatten)]
    pub record: RecordArgs,
    #[command(flatten)]
    pub xds: XdsArgs,
    #[command(flatten)]
    pub statsd: StatsdArgs,
}

impl ServeSettings {
    /// Settings for a server on loopback with ephemeral ports, for tests and examples.
    pub fn for_tests(config: PathBuf) -> ServeSettings {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            settings: ServeSettings,
        }
        let mut settings = Wrapper::parse_from(["test"]).settings;
        settings.config = config;
        settings.grpc_addr = "127.0.0.1:0".parse().expect("valid address");
        settings.http_addr = "127.0.0.1:0".parse().expect("valid address");
        settings.shutdown_delay = Duration::ZERO;
        settings
    }

    /// Settings from the environment (and defaults) alone: `ratelimit-server` with no command.
    pub fn from_env() -> ServeSettings {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            settings: ServeSettings,
        }
        Wrapper::parse_from(["ratelimit-server"]).settings
    }

    /// The headers answers carry: RATE_LIMIT_HEADERS, else what LIMIT_RESPONSE_HEADERS_ENABLED
    /// says.
    pub fn rate_limit_headers(&self) -> RateLimitHeaders {
        self.rate_limit_headers
            .unwrap_or(if self.limit_response_headers_enabled {
                RateLimitHeaders::Draft03
            } else {
                RateLimitHeaders::Off
            })
    }

    pub fn engine_settings(&self) -> EngineSettings {
        EngineSettings {
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            dynamic_metadata: self.response_dynamic_metadata,
            near_limit_ratio: self.near_limit_ratio,
            response_headers: match self.rate_limit_headers() {
                RateLimitHeaders::Off => ResponseHeaders::Off,
                RateLimitHeaders::Draft03 => ResponseHeaders::Draft03(HeaderNames {
                    limit: self.limit_limit_header.clone(),
                    remaining: self.limit_remaining_header.clone(),
                    reset: self.limit_reset_header.clone(),
                }),
                RateLimitHeaders::Ietf => ResponseHeaders::Ietf,
            },
            defaults: self.defaults.limit_defaults(),
            bounds: RequestBounds {
                max_descriptors: self.max_descriptors,
                max_entries: self.max_entries,
                max_string_len: self.max_string_len,
            },
            max_waiting: self.max_waiting_answers,
        }
    }
}

/// `--rate-limit-headers`: which rate-limit headers answers carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitHeaders {
    Off,
    Draft03,
    Ietf,
}

fn parse_rate_limit_headers(text: &str) -> Result<RateLimitHeaders, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "off" => Ok(RateLimitHeaders::Off),
        "draft03" => Ok(RateLimitHeaders::Draft03),
        "ietf" => Ok(RateLimitHeaders::Ietf),
        _ => Err(format!(
            "'{text}' is not a header style (expected off, draft03 or ietf)"
        )),
    }
}

/// A Go-style duration, as the reference's settings are written: one or more `<n><unit>` with
/// units `h`, `m`, `s`, `ms` (`24h`, `1h30m`, `500ms`).
pub(crate) fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("'{text}' is not a duration (write e.g. 24h, 1h30m, 90s or 500ms)");
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let value: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let after = &rest[digits..];
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let unit = match &after[..unit_len] {
            "h" => Duration::from_secs(3_600),
            "m" => Duration::from_secs(60),
            "s" => Duration::from_secs(1),
            "ms" => Duration::from_millis(1),
            _ => return Err(bad()),
        };
        let part = u32::try_from(value)
            .ok()
            .and_then(|v| unit.checked_mul(v))
            .ok_or_else(bad)?;
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = &after[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_as_the_reference_writes_them() {
        assert_eq!(parse_go_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_go_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "h", "5", "5d", "1.5h", "-1h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_parse_and_reject_bad_values() {
        assert_eq!(parse_algorithm("leaky_bucket"), Ok(Algorithm::LeakyBucket));
        assert!(
            parse_algorithm("leaky")
                .unwrap_err()
                .contains("sliding_window")
        );
        assert_eq!(parse_max_delay("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_ratio("0.9"), Ok(0.9));
        assert!(parse_ratio("1.5").is_err() && parse_ratio("NaN").is_err());
        assert!(parse_max_delay("2h").is_err());
        assert!(at_least_one("0").is_err() && at_least_one("-3").is_err());
        assert_eq!(at_least_one("64"), Ok(64));
        assert_eq!(parse_max_delay("61m").unwrap_err(), "must be at most 60m");
        let s = ServeSettings::for_tests(PathBuf::from("x"));
        assert_eq!(s.engine_settings().defaults, LimitDefaults::default());
        assert_eq!(s.rules_files.caps(), SizeCaps::default());
    }

    #[test]
    fn rate_limit_headers_default_off_and_the_reference_setting_means_draft03() {
        let mut s = ServeSettings::for_tests(PathBuf::from("x"));
        assert_eq!(s.rate_limit_headers(), RateLimitHeaders::Off);
        assert_eq!(s.engine_settings().response_headers, ResponseHeaders::Off);
        s.limit_response_headers_enabled = true;
        assert_eq!(s.rate_limit_headers(), RateLimitHeaders::Draft03);
        assert!(matches!(
            s.engine_settings().response_headers,
            ResponseHeaders::Draft03(_)
        ));
        s.rate_limit_headers = Some(RateLimitHeaders::Ietf);
        assert_eq!(s.engine_settings().response_headers, ResponseHeaders::Ietf);
        assert_eq!(
            parse_rate_limit_headers(" IETF"),
            Ok(RateLimitHeaders::Ietf)
        );
        assert!(
            parse_rate_limit_headers("draft-03")
                .unwrap_err()
                .contains("draft03")
        );
    }
}
