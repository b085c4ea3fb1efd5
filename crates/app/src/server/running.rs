//! A running server: its addresses and handles, and how it stops (health NOT_SERVING first, then
//! the listeners close and in-flight calls drain).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::health::HealthReporter;
use crate::record::Recorder;
use crate::reload::Reloader;
use crate::settings::{ConfigType, ServeSettings};
use crate::status::ServerStatus;
use crate::telemetry::Tracing;
use ratelimit_core::clock::Clock;
use ratelimit_core::metrics::Metrics;

use super::{StartError, start};

/// At shutdown, how long the record writer may take to write what is queued.
const RECORD_FLUSH_WAIT: Duration = Duration::from_secs(10);

/// A running server: its bound addresses, metrics, reloader and status (public: its caller reads
/// them), and a handle to stop it.
pub struct Server {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The debug listener's address, when `--debug-addr` is set.
    pub debug_addr: Option<SocketAddr>,
    /// The metrics listener's address, when `--metrics-addr` is set.
    pub metrics_addr: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    pub reloader: Arc<Reloader>,
    pub status: Arc<ServerStatus>,
    pub(super) health: HealthReporter,
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) tasks: Vec<JoinHandle<()>>,
    pub(super) drain_timeout: Duration,
    pub(super) shutdown_delay: Duration,
    /// Flushed once the listeners are closed.
    pub(super) tracing: Option<Tracing>,
    /// `--record`: its queue is written out once the listeners are closed.
    pub(crate) recorder: Option<Arc<Recorder>>,
}

impl Server {
    /// Shuts down after the configured `SHUTDOWN_DELAY` (see [`Server::shutdown_after`]).
    pub async fn shutdown(self) {
        let delay = self.shutdown_delay;
        self.shutdown_after(delay).await;
    }

    /// Flips health to NOT_SERVING (gRPC health and HTTP `/healthcheck`) while still serving every
    /// call for `delay`, so that load balancers see it; then ends health Watch streams, stops
    /// accepting, lets in-flight calls finish (for at most `drain_timeout`; what is left is then
    /// cut), and returns.
    pub async fn shutdown_after(self, delay: Duration) {
        self.status.set_draining();
        self.health.set(ServingStatus::NotServing);
        if !delay.is_zero() {
            tracing::info!(
                ?delay,
                "health is NOT_SERVING; serving on until the shutdown delay ends"
            );
            tokio::time::sleep(delay).await;
        }
        self.health.close();
        let _ = self.shutdown.send(true);
        let drain_timeout = self.drain_timeout;
        for mut task in self.tasks {
            if tokio::time::timeout(drain_timeout, &mut task)
                .await
                .is_err()
            {
                tracing::warn!(
                    ?drain_timeout,
                    "drain timeout: closing remaining connections"
                );
                task.abort();
            }
        }
        if let Some(tracing) = &self.tracing {
            tracing.shutdown().await;
        }
        if let Some(recorder) = self.recorder {
            let _ = tokio::task::spawn_blocking(move || recorder.finish(RECORD_FLUSH_WAIT)).await;
        }
    }
}

/// Which signal asked the server to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGTERM (an orchestrator): keep serving for `SHUTDOWN_DELAY` with health NOT_SERVING.
    Terminate,
    /// SIGINT (Ctrl-C at a terminal): stop without the delay.
    Interrupt,
}

/// Runs until SIGTERM or SIGINT, then shuts down gracefully. SIGHUP re-reads the rules files at
/// once and never stops the server (its default action would end the process on the spot).
pub async fn run(settings: &ServeSettings, clock: Arc<dyn Clock>) -> Result<(), StartError> {
    // Listened for before starting, so that one sent while Redis or the rules load is not fatal.
    let hangups = Hangups::listen();
    let server = start(settings, clock).await?;
    let from_files = settings.xds.config_type == ConfigType::File;
    let signal = tokio::select! {
        signal = wait_for_signal() => signal,
        () = hangups.reload_on_each(&server.reloader, from_files) => unreachable!("never ends"),
    };
    let delay = match signal {
        Signal::Terminate => settings.shutdown_delay,
        Signal::Interrupt => Duration::ZERO,
    };
    tracing::info!(
        ?signal,
        "shutting down: health NOT_SERVING, then draining in-flight requests"
    );
    server.shutdown_after(delay).await;
    Ok(())
}

/// SIGHUP, as an operator sends it to have a server re-read its configuration (or the watcher was
/// not told of an edit: a network or FUSE filesystem).
struct Hangups {
    #[cfg(unix)]
    signals: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn listen() -> Hangups {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signals = signal(SignalKind::hangup())
                .inspect_err(|e| tracing::warn!(error = %e, "cannot listen for SIGHUP"))
                .ok();
            Hangups { signals }
        }
        #[cfg(not(unix))]
        Hangups {}
    }

    /// Re-reads the rules files at each SIGHUP (with rules from xDS there is nothing to read, and
    /// it says so). Never returns.
    async fn reload_on_each(mut self, reloader: &Arc<Reloader>, from_files: bool) {
        #[cfg(unix)]
        if let Some(signals) = &mut self.signals {
            while signals.recv().await.is_some() {
                if !from_files {
                    tracing::info!(
                        "SIGHUP: the rules come from the xDS server (CONFIG_TYPE=GRPC_XDS_SOTW); no file to re-read"
                    );
                    continue;
                }
                let r = reloader.clone();
                // A load logs what it changed, or its errors (an unchanged one only at debug).
                if let Ok(Ok(report)) = tokio::task::spawn_blocking(move || r.reload()).await {
                    tracing::info!(
                        dir = %reloader.dir().display(),
                        summary = %report.summary,
                        "SIGHUP: the rules files were read again"
                    );
                }
            }
        }
        std::future::pending().await
    }
}

async fn wait_for_signal() -> Signal {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => Signal::Interrupt,
        _ = term => Signal::Terminate,
    }
}
