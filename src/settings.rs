//! Server settings: one struct with documented defaults, filled from flags or environment variables
//! (the reference's names where one exists).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use crate::config::Algorithm;
use crate::engine::{EngineSettings, HeaderNames, RequestBounds};

/// `ratelimit-server serve` flags; each also reads the environment variable named.
#[derive(Debug, Clone, Args)]
pub struct ServeSettings {
    /// Directory of rules files (*.yaml, *.yml, searched recursively).
    #[arg(long, env = "CONFIG_DIR", default_value = "config")]
    pub config: PathBuf,
    /// gRPC listen address (RateLimitService and grpc.health.v1).
    #[arg(long, env = "GRPC_ADDR", default_value = "0.0.0.0:8081")]
    pub grpc_addr: SocketAddr,
    /// HTTP admin listen address (/metrics, /healthcheck, /readyz, /rlconfig, POST /json).
    #[arg(long, env = "HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// Answer OK overall even when over a limit; statuses and counters still tell the truth.
    #[arg(long, env = "SHADOW_MODE", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub shadow_mode: bool,
    /// Share of a limit past which hits count as near the limit (metrics).
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,
    /// Add RateLimit-Limit/Remaining/Reset headers to responses.
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
    /// Most descriptors in one request.
    #[arg(long, env = "MAX_DESCRIPTORS", default_value_t = 64)]
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    #[arg(long, env = "MAX_ENTRIES", default_value_t = 32)]
    pub max_entries: usize,
    /// Longest domain, key or value in bytes.
    #[arg(long, env = "MAX_STRING_LEN", default_value_t = 4096)]
    pub max_string_len: usize,
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
        settings
    }

    pub fn engine_settings(&self) -> EngineSettings {
        EngineSettings {
            shadow_mode: self.shadow_mode,
            near_limit_ratio: self.near_limit_ratio,
            response_headers: self.limit_response_headers_enabled.then(|| HeaderNames {
                limit: self.limit_limit_header.clone(),
                remaining: self.limit_remaining_header.clone(),
                reset: self.limit_reset_header.clone(),
            }),
            default_algorithm: Algorithm::TokenBucket,
            bounds: RequestBounds {
                max_descriptors: self.max_descriptors,
                max_entries: self.max_entries,
                max_string_len: self.max_string_len,
            },
        }
    }
}

/// Parses `250ms`, `10s`, `2m` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (e.g. 250ms, 10s, 2m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{text}' is not a duration (e.g. 250ms, 10s, 2m)"));
    }
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("'{text}': {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
