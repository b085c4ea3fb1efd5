//! What the admin endpoints report about the server: whether it is draining, whether it still
//! waits for its first rules (xDS), and the last rules load (when, from where, whether it
//! succeeded, and every error).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The outcome of the most recent rules load: plain data, shown on `/rlconfig` and read by callers.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LoadReport {
    /// Unix seconds of the attempt.
    pub at: u64,
    pub ok: bool,
    /// Every error of the attempt (`file:line:col: message`); empty when ok.
    pub errors: Vec<String>,
    /// A one-line account of what changed, or why nothing did.
    pub summary: String,
    /// Where the rules came from: `files` (the rules directory) or `xds` (`CONFIG_TYPE=GRPC_XDS_SOTW`).
    pub source: String,
    /// xDS: the `version_info` of the response this load was made of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// xDS: the response's nonce.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
}

#[derive(Debug, Default)]
pub struct ServerStatus {
    draining: AtomicBool,
    /// No rules yet and not allowed to serve without them (xDS without
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`): health fails until the first good load.
    awaiting_rules: AtomicBool,
    last_load: Mutex<LoadReport>,
}

impl ServerStatus {
    pub fn new(initial: LoadReport) -> Self {
        ServerStatus {
            draining: AtomicBool::new(false),
            awaiting_rules: AtomicBool::new(false),
            last_load: Mutex::new(initial),
        }
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Whether health fails until the first good rules load.
    pub fn set_awaiting_rules(&self, awaiting: bool) {
        self.awaiting_rules.store(awaiting, Ordering::SeqCst);
    }

    pub fn is_awaiting_rules(&self) -> bool {
        self.awaiting_rules.load(Ordering::SeqCst)
    }

    pub fn set_last_load(&self, report: LoadReport) {
        *self
            .last_load
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = report;
    }

    pub fn last_load(&self) -> LoadReport {
        self.last_load
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
