//! Whether the server has a conditional `SET` that returns what the key held (`SET … IFEQ …
//! GET`: Valkey 8.1, Redis 8.4), which takes a one-key compare-and-set of a held key off the
//! script: probed once connected; given up for good the first time the server answers one with
//! an error saying it has none (failed over to, or restarted as, an older version), that
//! compare-and-set then sent again by script.

use std::sync::atomic::{AtomicBool, Ordering};

/// The server's conditional `SET`, as last found.
#[derive(Debug, Default)]
pub(crate) struct ConditionalSet {
    on: AtomicBool,
}

impl ConditionalSet {
    /// Whether one-key compare-and-sets of held keys go as `SET … IFEQ … GET`.
    pub(crate) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The probe's answer: the server has one (or not).
    pub(crate) fn found(&self, has: bool) {
        self.on.store(has, Ordering::Relaxed);
    }

    /// The server answered a conditional `SET` with an error saying it has none: not used again.
    pub(crate) fn lost(&self) {
        if self.on.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                "the Redis server no longer takes SET … IFEQ (an older version failed over to or restarted?): one-key compare-and-sets go by script again until this server restarts"
            );
        }
    }
}
