//! A listener's live TLS config and its reloading: the files are read every interval, and a change
//! that has stayed the same for one interval (so a cert written before its key is not caught half
//! way) is built into a new `ServerConfig` and swapped in. Connections already established keep the
//! config they were made with; new ones get the new one; a change that does not build, or whose
//! certificate is expired or not yet valid, is refused with a WARN line and a count, and the
//! previous config keeps serving (a not-yet-valid one is taken once it is valid). Every poll also
//! looks at the serving chain's end: `ratelimit_tls_certificate_expiry_seconds` says when it is,
//! and from a third of its lifetime (at most 7 days) before it, a WARN line says so, repeated
//! (an ERROR once it has expired). Time comes from the server's `Clock`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use tokio::sync::watch;

use super::expiry::{Expiry, Validity, Warned, human, instant};
use super::files::{PemFiles, Refusal, TlsError, TlsSpec};
use super::metrics::TlsMetrics;
use ratelimit_core::clock::{Clock, NANOS_PER_SECOND};
use ratelimit_remote::Every;

/// A client's handshake refused (no certificate, another CA, no shared TLS version…) is warned of
/// at most this often per listener; a connection that ends before or during its handshake (a TCP
/// health probe) is not.
const REFUSED_HANDSHAKE_WARN_EVERY: Duration = Duration::from_secs(60);

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
    /// `decided` was refused as not valid yet: from when it will be (then it is tried again).
    retry_at: Option<i64>,
    /// When the serving chain is valid.
    serving: Validity,
    warned: Warned,
}

/// What one poll did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Polled {
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
pub(crate) struct TlsSource {
    spec: TlsSpec,
    current: ArcSwap<ServerConfig>,
    state: Mutex<PollState>,
    metrics: TlsMetrics,
    clock: Arc<dyn Clock>,
    /// Handshakes refused for what the client sent are warned of at most this often.
    refused_handshakes: Every,
}

/// Unix seconds of a clock.
fn seconds(clock: &dyn Clock) -> i64 {
    i64::try_from(clock.now() / NANOS_PER_SECOND).unwrap_or(i64::MAX)
}

impl TlsSource {
    /// Reads and builds the config at the clock's time; at start-up any error is fatal, an
    /// expired or not-yet-valid certificate included.
    pub(crate) fn load(
        spec: TlsSpec,
        metrics: TlsMetrics,
        clock: Arc<dyn Clock>,
    ) -> Result<TlsSource, TlsError> {
        let files = spec.read()?;
        let built = spec.build(&files, seconds(&*clock)).map_err(|r| r.error)?;
        let snapshot = Snapshot::Files(files);
        metrics.set_expiry(spec.names.listener, built.validity.not_after);
        let source = TlsSource {
            spec,
            current: ArcSwap::new(built.config),
            state: Mutex::new(PollState {
                decided: snapshot.clone(),
                previous: snapshot,
                retry_at: None,
                serving: built.validity,
                warned: Warned::default(),
            }),
            metrics,
            clock,
            refused_handshakes: Every::new(REFUSED_HANDSHAKE_WARN_EVERY),
        };
        source.warn_of_expiry();
        Ok(source)
    }

    pub(crate) fn listener(&self) -> &'static str {
        self.spec.names.listener
    }

    pub(crate) fn metrics(&self) -> &TlsMetrics {
        &self.metrics
    }

    /// Whether a handshake refused now is to be warned of (at most once per
    /// [`REFUSED_HANDSHAKE_WARN_EVERY`]; each is counted).
    pub(crate) fn warn_of_refused_handshake(&self) -> bool {
        self.refused_handshakes.due(self.clock.now())
    }

    /// The config new connections get.
    pub(crate) fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// When the serving chain is valid.
    #[cfg(test)]
    pub(crate) fn validity(&self) -> Validity {
        self.lock().serving
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PollState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the files once and acts on what changed (see the module docs), then warns if the
    /// serving certificate's end is near.
    pub(crate) fn poll(&self) -> Polled {
        let polled = self.poll_files();
        self.warn_of_expiry();
        self.metrics.polled(self.spec.names.listener);
        polled
    }

    fn poll_files(&self) -> Polled {
        let now = seconds(&*self.clock);
        let seen = Snapshot::take(&self.spec);
        let mut state = self.lock();
        let now_valid = state.retry_at.is_some_and(|at| now >= at);
        if seen == state.decided && !now_valid {
            state.previous = seen;
            return Polled::Unchanged;
        }
        if seen != state.previous {
            state.previous = seen;
            return Polled::Settling;
        }
        state.decided = seen.clone();
        state.retry_at = None;
        drop(state);
        let listener = self.listener();
        let built = match &seen {
            Snapshot::Files(files) => self.spec.build(files, now),
            Snapshot::Unreadable(e) => Err(Refusal::from(e.clone())),
        };
        match built {
            Ok(built) => {
                self.current.store(built.config);
                {
                    let mut state = self.lock();
                    state.serving = built.validity;
                    state.warned = Warned::default();
                }
                self.metrics.reload_success(listener);
                self.metrics.set_expiry(listener, built.validity.not_after);
                tracing::info!(
                    listener,
                    cert = %self.spec.cert.display(),
                    valid_until = %instant(built.validity.not_after),
                    "TLS certificate reloaded; new connections get it"
                );
                Polled::Reloaded
            }
            Err(Refusal { error, valid_from }) => {
                self.lock().retry_at = valid_from;
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

    /// Says, at most every so often, that the serving chain expires soon or has expired.
    fn warn_of_expiry(&self) {
        let now = seconds(&*self.clock);
        let (serving, due) = {
            let mut state = self.lock();
            let serving = state.serving;
            let due = state
                .warned
                .due(serving.state(now), now, serving.repeat_every());
            (serving, due)
        };
        if !due {
            return;
        }
        let listener = self.listener();
        let cert = self.spec.cert.display();
        match serving.state(now) {
            Expiry::Fine => {}
            Expiry::Near { left } => tracing::warn!(
                listener,
                %cert,
                expires_at = %instant(serving.not_after),
                "the TLS certificate served expires in {}: renew it (the new files are taken \
                 without a restart)",
                human(left)
            ),
            Expiry::Expired => tracing::error!(
                listener,
                %cert,
                expired_at = %instant(serving.not_after),
                "the TLS certificate served has expired: clients refuse every new connection \
                 until valid files are in place"
            ),
        }
    }
}

/// Polls `source` every `interval` until `stop` turns true.
pub(crate) async fn watch_files(
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
