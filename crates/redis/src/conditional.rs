//! Whether the server has a conditional `SET` that returns what the key held (`SET … IFEQ …
//! GET`: Valkey 8.1, Redis 8.4), which takes a one-key compare-and-set of a held key off the
//! script: probed once connected (again on each fresh connection, e.g. after an outage); given up
//! the first time the server answers one with an error saying it has none (failed over to, or
//! restarted as, an older version), that compare-and-set then sent again by script. What was
//! found is said when it changes, once per process.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// What the log last said of the conditional `SET` (any store of this process).
static SAID: AtomicU8 = AtomicU8::new(NOTHING);
const NOTHING: u8 = 0;
const HAS: u8 = 1;
const HAS_NOT: u8 = 2;

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
        let said = SAID.swap(if has { HAS } else { HAS_NOT }, Ordering::Relaxed);
        if has && said != HAS {
            tracing::info!(
                "the Redis server takes SET … IFEQ … GET: one-key compare-and-sets of held keys go without the script"
            );
        } else if !has && said == HAS {
            tracing::warn!(
                "the Redis server no longer takes SET … IFEQ (an older version?): compare-and-sets of held keys go by script"
            );
        }
    }

    /// The server answered a conditional `SET` with an error saying it has none: not used again
    /// on this connection (a fresh one asks again).
    pub(crate) fn lost(&self) {
        if self.on.swap(false, Ordering::Relaxed) && SAID.swap(HAS_NOT, Ordering::Relaxed) == HAS {
            tracing::warn!(
                "the Redis server no longer takes SET … IFEQ (an older version failed over to or restarted?): compare-and-sets of held keys go by script, sent again where it was refused"
            );
        }
    }
}
