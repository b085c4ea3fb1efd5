//! A listener's live TLS config and its reloading: the files are read every interval, and a change
//! that has stayed the same for one interval (so a cert written before its key is not caught half
//! way) is built into a new `ServerConfig` and swapped in. Connections already established keep the
//! config they were made with; new ones get the new one; a change that does not build is refused
//! with a WARN line and a count, and the previous config keeps serving.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use tokio::sync::watch;

use super::files::{PemFiles, TlsError, TlsSpec};
use super::metrics::TlsMetrics;

/// What the files held when read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Snapshot {
    Files(PemFiles),
    Unreadable(TlsError),
}

impl Snapshot {
    fn take(spec: &TlsSpec) -> Snapshot {
        match spec.read() {
            Ok(files) => Snapshot::Files(files),
            Err(e) => Snapshot::Unreadable(e),
        }
    }
}

#[derive(Debug)]
struct PollState {
    /// The last snapshot acted on: installed, or refused.
    decided: Snapshot,
    /// The snapshot of the previous poll.
    previous: Snapshot,
}

/// What one poll did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Polled {
    /// The files are as last acted on.
    Unchanged,
    /// The files changed since the previous poll; acted on once they stay the same for a poll.
    Settling,
    /// A new config is serving.
    Reloaded,
    /// The new files were refused; the previous config keeps serving.
    Refused(TlsError),
}

/// One listener's TLS config, swapped when its files change.
pub struct TlsSource {
    spec: TlsSpec,
    current: ArcSwap<ServerConfig>,
    state: Mutex<PollState>,
    metrics: TlsMetrics,
}

impl TlsSource {
    /// Reads and builds the config; at start-up any error is fatal.
    pub fn load(spec: TlsSpec, metrics: TlsMetrics) -> Result<TlsSource, TlsError> {
        let files = spec.read()?;
        let config = spec.build(&files)?;
        let snapshot = Snapshot::Files(files);
        Ok(TlsSource {
            spec,
            current: ArcSwap::new(config),
            state: Mutex::new(PollState {
                decided: snapshot.clone(),
                previous: snapshot,
            }),
            metrics,
        })
    }

    pub fn spec(&self) -> &TlsSpec {
        &self.spec
    }

    pub fn listener(&self) -> &'static str {
        self.spec.names.listener
    }

    pub fn metrics(&self) -> &TlsMetrics {
        &self.metrics
    }

    /// The config new connections get.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// Reads the files once and acts on what changed (see the module docs).
    pub fn poll(&self) -> Polled {
        let seen = Snapshot::take(&self.spec);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if seen == state.decided {
            state.previous = seen;
            return Polled::Unchanged;
        }
        if seen != state.previous {
            state.previous = seen;
            return Polled::Settling;
        }
        state.decided = seen.clone();
        drop(state);
        let listener = self.listener();
        let built = match &seen {
            Snapshot::Files(files) => self.spec.build(files),
            Snapshot::Unreadable(e) => Err(e.clone()),
        };
        match built {
            Ok(config) => {
                self.current.store(config);
                self.metrics.reload_success(listener);
                tracing::info!(
                    listener,
                    cert = %self.spec.cert.display(),
                    "TLS certificate reloaded; new connections get it"
                );
                Polled::Reloaded
            }
            Err(error) => {
                self.metrics.reload_error(listener);
                tracing::warn!(
                    listener,
                    %error,
                    "TLS files changed but cannot be used; the previous certificate keeps serving"
                );
                Polled::Refused(error)
            }
        }
    }
}

/// Polls `source` every `interval` until `stop` turns true.
pub async fn watch_files(
    source: Arc<TlsSource>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let stopped = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopped {
            break;
        }
        let source = source.clone();
        // File reads and key parsing are blocking work.
        let _ = tokio::task::spawn_blocking(move || source.poll()).await;
    }
}
