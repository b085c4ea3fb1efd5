//! The TLS counters, by listener ("gRPC", "admin").

use prometheus::{IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct TlsMetrics {
    reload_success: IntCounterVec,
    reload_error: IntCounterVec,
    handshake_error: IntCounterVec,
}

fn counter_vec(registry: &Registry, name: &str, help: &str) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), &["listener"]).expect("valid metric");
    // Registering twice (a second server on one registry) keeps the first; counts still work.
    let _ = registry.register(Box::new(c.clone()));
    c
}

impl TlsMetrics {
    pub fn register(registry: &Registry) -> TlsMetrics {
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
        }
    }

    /// Counters on a registry of their own, for tests.
    pub fn unregistered() -> TlsMetrics {
        TlsMetrics::register(&Registry::new())
    }

    pub fn reload_success(&self, listener: &str) {
        self.reload_success.with_label_values(&[listener]).inc();
    }

    pub fn reload_error(&self, listener: &str) {
        self.reload_error.with_label_values(&[listener]).inc();
    }

    pub fn handshake_error(&self, listener: &str) {
        self.handshake_error.with_label_values(&[listener]).inc();
    }

    pub fn reload_errors(&self, listener: &str) -> u64 {
        self.reload_error.with_label_values(&[listener]).get()
    }

    pub fn reload_successes(&self, listener: &str) -> u64 {
        self.reload_success.with_label_values(&[listener]).get()
    }

    pub fn handshake_errors(&self, listener: &str) -> u64 {
        self.handshake_error.with_label_values(&[listener]).get()
    }
}
