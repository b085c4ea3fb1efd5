//! What the admin endpoints report about the server: whether it is draining, and the last rules
//! load (when, whether it succeeded, and every error).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The outcome of the most recent rules load.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LoadReport {
    /// Unix seconds of the attempt.
    pub at: u64,
    pub ok: bool,
    /// Every error of the attempt (`file:line:col: message`); empty when ok.
    pub errors: Vec<String>,
    /// A one-line account of what changed, or why nothing did.
    pub summary: String,
}

#[derive(Debug, Default)]
pub struct ServerStatus {
    draining: AtomicBool,
    last_load: Mutex<LoadReport>,
}

impl ServerStatus {
    pub fn new(initial: LoadReport) -> Self {
        ServerStatus {
            draining: AtomicBool::new(false),
            last_load: Mutex::new(initial),
        }
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
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
