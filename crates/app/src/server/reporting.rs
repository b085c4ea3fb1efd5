//! What the server reports beside its answers, each set up from its settings before serving:
//! process metrics, the statsd-exporter mapping of the metrics pages, OpenTelemetry tracing and
//! the `--record` writer.

use std::sync::Arc;

use crate::record::{LivePolicy, Recorder};
use crate::settings::ServeSettings;
use crate::statsd::Mapper;
use crate::telemetry::Tracing;
use ratelimit_core::engine::Engine;
use ratelimit_core::metrics::Metrics;
use ratelimit_core::rules_dir::{self, CappedReadError};
use ratelimit_core::store::Backend;

use super::StartError;

/// Largest `PROMETHEUS_MAPPER_YAML` file read (a rules file's default cap).
const MAX_MAPPER_BYTES: u64 = 8 << 20;

/// The standard process metrics (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
/// `process_open_fds`, `process_max_fds`, `process_start_time_seconds`, …), read from /proc at
/// scrape time. Linux only; elsewhere there are none.
pub(super) fn register_process_metrics(metrics: &Metrics) {
    #[cfg(target_os = "linux")]
    {
        let collector = prometheus::process_collector::ProcessCollector::for_self();
        if let Err(e) = metrics.registry().register(Box::new(collector)) {
            tracing::warn!(error = %e, "process metrics are not exported");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = metrics;
}

/// The `--record` writer, when asked for: the file is opened now (an error stops the start).
pub(super) fn recorder<B: Backend>(
    settings: &ServeSettings,
    engine: &Arc<Engine<B>>,
    metrics: &Metrics,
) -> Result<Option<Arc<Recorder>>, StartError> {
    let Some(config) = settings.record.config()? else {
        return Ok(None);
    };
    catch_file_size_signal();
    let live = engine.clone();
    let policy: LivePolicy = Arc::new(move || live.policy());
    let file = config.file.clone();
    let recorder =
        Recorder::start(config.clone(), policy, metrics.registry()).map_err(|source| {
            StartError::Record {
                path: file.path.display().to_string(),
                source,
            }
        })?;
    tracing::info!(
        path = %file.path.display(),
        max_bytes = file.max_bytes,
        max_files = file.max_files,
        sample = config.sample,
        hash_values = config.hash_key.is_some(),
        queue = config.queue,
        "recording decisions as JSON lines; a full queue or a failed write drops lines and \
         counts them, never slowing an answer"
    );
    Ok(Some(Arc::new(recorder)))
}

/// SIGXFSZ's default action ends the process when a write passes the file size limit
/// (`ulimit -f`, RLIMIT_FSIZE); caught, the write fails with EFBIG instead, which the recorder
/// handles as it handles a full disk. The handler, once installed, stays for the process's life.
fn catch_file_size_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Err(e) = signal(SignalKind::from_raw(libc::SIGXFSZ)) {
            tracing::warn!(error = %e, "cannot catch SIGXFSZ: a file size limit would end the server");
        }
    }
}

/// `PROMETHEUS_MAPPER_YAML`, read once. A file that is not there serves our names, with a warning
/// (Envoy Gateway mounts its mapping from an optional ConfigMap); one that cannot be read or
/// parsed stops start-up.
pub(super) fn metrics_mapper(settings: &ServeSettings) -> Result<Option<Arc<Mapper>>, StartError> {
    let Some(path) = &settings.prometheus_mapper_yaml else {
        return Ok(None);
    };
    let error = |error: String| StartError::Mapper {
        path: path.display().to_string(),
        error,
    };
    let bytes = match rules_dir::read_file_capped(path, MAX_MAPPER_BYTES) {
        Ok(bytes) => bytes,
        Err(CappedReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(
                file = %path.display(),
                "PROMETHEUS_MAPPER_YAML names no file: the metrics keep our names (the \
                 reference's default mapping's, with `rule`, `key1` and `key2` labels)"
            );
            return Ok(None);
        }
        Err(e) => return Err(error(e.to_string())),
    };
    let text = String::from_utf8(bytes).map_err(|e| error(format!("not UTF-8: {e}")))?;
    let mapper = Mapper::parse(&text).map_err(error)?;
    tracing::info!(
        file = %path.display(),
        ignored = ?mapper.ignored(),
        "the reference's stats are named by the statsd-exporter mapping (what it says of timers \
         and histograms is not used: only counters are mapped)"
    );
    Ok(Some(Arc::new(mapper)))
}

/// OpenTelemetry tracing, started if the settings configure it.
pub(super) fn start_tracing(
    settings: &ServeSettings,
    metrics: &Metrics,
) -> Result<Option<Tracing>, StartError> {
    let Some(config) = settings.tracing.config()? else {
        return Ok(None);
    };
    let tracing = Tracing::start(&config, metrics.registry())?;
    tracing::info!(
        endpoint = %ratelimit_core::redact::credentials(&config.endpoint),
        service_name = %config.service_name,
        sampling_rate = config.sampling_rate,
        record_values = config.record_values,
        "OpenTelemetry tracing on: a span per ShouldRateLimit over OTLP/gRPC"
    );
    Ok(Some(tracing))
}
