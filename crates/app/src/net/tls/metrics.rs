//! The TLS counters, and when each listener's certificate expires, by listener ("gRPC", "admin").

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

#[derive(Clone)]
pub(crate) struct TlsMetrics {
    reload_success: IntCounterVec,
    reload_error: IntCounterVec,
    handshake_error: IntCounterVec,
    polls: IntCounterVec,
    expiry: IntGaugeVec,
}

fn counter_vec(registry: &Registry, name: &str, help: &str) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), &["listener"]).expect("valid metric");
    // Registering twice (a second server on one registry) keeps the first; counts still work.
    let _ = registry.register(Box::new(c.clone()));
    c
}

impl TlsMetrics {
    pub(crate) fn register(registry: &Registry) -> TlsMetrics {
        TlsMetrics {
            reload_success: counter_vec(
                registry,
                "ratelimit_tls_reload_success_total",
                "Changed TLS certificate files that were loaded and now serve new connections",
            ),
            reload_error: counter_vec(
                registry,
                "ratelimit_tls_reload_errors_total",
                "Changed TLS certificate files that were refused (the previous ones keep serving)",
            ),
            handshake_error: counter_vec(
                registry,
                "ratelimit_tls_handshake_errors_total",
                "Connections closed because their TLS handshake failed or timed out",
            ),
            polls: counter_vec(
                registry,
                "ratelimit_tls_polls_total",
                "Times the listener's certificate files were read to look for a change",
            ),
            expiry: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "ratelimit_tls_certificate_expiry_seconds",
                        "When the certificate chain the listener serves expires (the earliest \
                         notAfter of the chain), as Unix seconds: alert on it minus time()",
                    ),
                    &["listener"],
                )
                .expect("valid metric");
                let _ = registry.register(Box::new(g.clone()));
                g
            },
        }
    }

    /// The serving chain of `listener` expires at `not_after` (Unix seconds).
    pub(crate) fn set_expiry(&self, listener: &str, not_after: i64) {
        self.expiry.with_label_values(&[listener]).set(not_after);
    }

    #[cfg(test)]
    pub(crate) fn expiry(&self, listener: &str) -> i64 {
        self.expiry.with_label_values(&[listener]).get()
    }

    /// Counters on a registry of their own, for tests.
    #[cfg(test)]
    pub(crate) fn unregistered() -> TlsMetrics {
        TlsMetrics::register(&Registry::new())
    }

    pub(crate) fn reload_success(&self, listener: &str) {
        self.reload_success.with_label_values(&[listener]).inc();
    }

    pub(crate) fn reload_error(&self, listener: &str) {
        self.reload_error.with_label_values(&[listener]).inc();
    }

    pub(crate) fn polled(&self, listener: &str) {
        self.polls.with_label_values(&[listener]).inc();
    }

    pub(crate) fn handshake_error(&self, listener: &str) {
        self.handshake_error.with_label_values(&[listener]).inc();
    }

    #[cfg(test)]
    pub(crate) fn reload_errors(&self, listener: &str) -> u64 {
        self.reload_error.with_label_values(&[listener]).get()
    }

    #[cfg(test)]
    pub(crate) fn reload_successes(&self, listener: &str) -> u64 {
        self.reload_success.with_label_values(&[listener]).get()
    }
}
