//! The transport's flags (each also an environment variable): connection caps, timeouts, keepalive,
//! and the bounds on what one call may make the server hold.

use std::time::Duration;

use clap::Args;

use crate::net::Timeouts;
use crate::service::CallLimits;
use ratelimit_core::config::parse_duration;

/// Listener and call bounds for `serve`.
#[derive(Debug, Clone, Args)]
pub struct TransportArgs {
    /// Most open gRPC connections; lowered to fit the process's file descriptor limit.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Most open admin HTTP connections; lowered to fit the file descriptor limit.
    #[arg(long, env = "MAX_ADMIN_CONNECTIONS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_admin_connections: u32,
    /// Most connections one client (source address; an IPv6 one by its /64) holds on each
    /// listener, TLS handshakes in progress included; past it, its new connections are closed at
    /// once. Default: a quarter of the listener's cap.
    #[arg(long, env = "MAX_CONNECTIONS_PER_CLIENT", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_client: Option<u32>,
    /// A new connection that has not sent its first request bytes by then is closed.
    #[arg(long, env = "HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = positive_duration)]
    pub handshake_timeout: Duration,
    /// A connection with nothing read or written for this long is closed. gRPC peers that answer
    /// keepalive pings are never idle.
    #[arg(long, env = "IDLE_TIMEOUT", default_value = "2m", value_parser = positive_duration)]
    pub idle_timeout: Duration,
    /// HTTP/2 keepalive: how often the server pings a gRPC connection...
    #[arg(long, env = "GRPC_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = positive_duration)]
    pub grpc_keepalive_interval: Duration,
    /// ...and how long it waits for the answer before closing the connection.
    #[arg(long, env = "GRPC_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = positive_duration)]
    pub grpc_keepalive_timeout: Duration,
    /// Most calls in progress on one gRPC connection.
    #[arg(long, env = "GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_concurrent_streams: u32,
    /// Largest encoded RateLimitRequest (bytes; 64KiB, 1MiB accepted).
    #[arg(long, env = "MAX_REQUEST_BYTES", default_value = "64KiB", value_parser = byte_size)]
    pub max_request_bytes: usize,
    /// Request bytes buffered by all calls together before new ones are refused.
    #[arg(long, env = "MAX_BUFFERED_REQUEST_BYTES", default_value = "64MiB", value_parser = byte_size)]
    pub max_buffered_request_bytes: usize,
    /// A request that has not arrived in full by then is ended (DEADLINE_EXCEEDED).
    #[arg(long, env = "REQUEST_TIMEOUT", default_value = "10s", value_parser = positive_duration)]
    pub request_timeout: Duration,
}

impl TransportArgs {
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            handshake: self.handshake_timeout,
            idle: self.idle_timeout,
        }
    }

    pub fn call_limits(&self) -> CallLimits {
        CallLimits {
            max_request_bytes: self.max_request_bytes,
            max_buffered_bytes: self.max_buffered_request_bytes,
            body_timeout: self.request_timeout,
        }
    }
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err("must be longer than 0".into()),
        d => Ok(d),
    }
}

/// `65536`, `64KiB`, `1MiB` (binary units; `KB`/`MB` read the same).
pub(crate) fn byte_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("'{text}' is not a size (e.g. 65536, 64KiB, 1MiB)")),
    };
    let n: usize = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (e.g. 65536, 64KiB, 1MiB)"))?;
    match n.checked_mul(scale) {
        Some(0) => Err("must be at least 1 byte".into()),
        Some(bytes) => Ok(bytes),
        None => Err(format!("'{text}' is too large")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(byte_size("65536"), Ok(65536));
        assert_eq!(byte_size("64KiB"), Ok(65536));
        assert_eq!(byte_size("1 MiB"), Ok(1 << 20));
        assert!(byte_size("0").is_err());
        assert!(byte_size("12 parsecs").is_err());
        assert!(byte_size("-1").is_err());
        assert!(byte_size("99999999999999999999G").is_err());
    }

    #[test]
    fn zero_durations_are_refused() {
        assert!(positive_duration("0s").is_err());
        assert_eq!(positive_duration("250ms"), Ok(Duration::from_millis(250)));
    }
}
