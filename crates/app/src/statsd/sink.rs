//! The statsd sink (`USE_STATSD=true`), for deployments whose dashboards read the reference's stats
//! through a `statsd-exporter` (some Envoy Gateway versions): every `STATS_FLUSH_INTERVAL` the
//! counters that moved since the last flush are sent over TCP, as the reference's gostats sends
//! them, under the reference's names ([`super::names`]). Read from the metrics registry off the
//! hot path: a decision never waits on the sink; a sink that is down loses those flushes' counts
//! (as a statsd counter would) and is reconnected on the next.

use std::collections::HashMap;
use std::time::Duration;

use clap::{ArgAction, Args};
use prometheus::proto::MetricFamily;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use ratelimit_core::config::parse_duration;
use ratelimit_core::metrics::Metrics;

/// How long a connection to the sink may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The statsd settings, under the reference's names: plain data, part of the settings record.
#[derive(Debug, Clone, Args)]
pub struct StatsdArgs {
    /// Send the reference's statsd stats over TCP (the reference's default is on; ours is off).
    #[arg(long, env = "USE_STATSD", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub use_statsd: bool,
    /// The statsd sink's host.
    #[arg(long, env = "STATSD_HOST", default_value = "localhost")]
    pub statsd_host: String,
    /// The statsd sink's TCP port.
    #[arg(long, env = "STATSD_PORT", default_value_t = 8125)]
    pub statsd_port: u16,
    /// How often the counters that moved are sent.
    #[arg(long, env = "STATS_FLUSH_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub stats_flush_interval: Duration,
}

/// The statsd lines of the counters that moved since `last` (which is updated): `name:delta|c`.
/// Pure.
pub(crate) fn lines(families: &[MetricFamily], last: &mut HashMap<String, f64>) -> String {
    let mut out = String::new();
    for (name, value) in super::names::stats(families) {
        let before = last.insert(name.clone(), value).unwrap_or(0.0);
        // A series that went away and came back starts again from zero.
        let delta = if value >= before {
            value - before
        } else {
            value
        };
        if delta > 0.0 {
            out.push_str(&format!("{name}:{delta}|c\n"));
        }
    }
    out
}

/// Sends the stats every flush interval until `stop` turns true.
pub(crate) fn spawn(
    args: &StatsdArgs,
    metrics: std::sync::Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let target = format!("{}:{}", args.statsd_host, args.statsd_port);
    let interval = args.stats_flush_interval.max(Duration::from_millis(10));
    tracing::info!(
        sink = %target,
        ?interval,
        "statsd stats (the reference's names) sent over TCP"
    );
    tokio::spawn(async move {
        let mut last = HashMap::new();
        let mut conn: Option<TcpStream> = None;
        let mut failing = false;
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let text = lines(&metrics.registry().gather(), &mut last);
            if text.is_empty() {
                continue;
            }
            if conn.is_none() {
                let connected =
                    tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target.as_str()))
                        .await;
                match connected {
                    Ok(Ok(c)) => {
                        let _ = c.set_nodelay(true);
                        conn = Some(c);
                    }
                    Ok(Err(e)) => warn_once(&mut failing, &target, &e.to_string()),
                    Err(_) => warn_once(&mut failing, &target, "connection timed out"),
                }
            }
            let Some(c) = conn.as_mut() else { continue };
            match c.write_all(text.as_bytes()).await {
                Ok(()) => {
                    if failing {
                        tracing::info!(sink = %target, "statsd sink reachable again");
                    }
                    failing = false;
                }
                Err(e) => {
                    warn_once(&mut failing, &target, &e.to_string());
                    conn = None;
                }
            }
        }
    })
}

/// One warning per run of failures.
fn warn_once(failing: &mut bool, target: &str, error: &str) {
    if !*failing {
        tracing::warn!(sink = %target, %error, "statsd sink unreachable; these counts are dropped");
    }
    *failing = true;
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::metrics::Metrics;

    #[test]
    fn only_what_moved_is_sent_under_the_reference_s_names() {
        let metrics = Metrics::new(10);
        let mut last = HashMap::new();
        metrics.config_load_success.inc();
        let first = lines(&metrics.registry().gather(), &mut last);
        assert_eq!(first, "ratelimit.service.config_load_success:1|c\n");
        assert_eq!(lines(&metrics.registry().gather(), &mut last), "");
        metrics.config_load_success.inc_by(2);
        metrics.config_load_error.inc();
        let next = lines(&metrics.registry().gather(), &mut last);
        assert!(
            next.contains("ratelimit.service.config_load_success:2|c\n"),
            "{next}"
        );
        assert!(
            next.contains("ratelimit.service.config_load_error:1|c\n"),
            "{next}"
        );
    }
}
