//! Hot reload: watch the rules directory (and its parent, to see the directory itself swapped by a
//! symlink), debounce bursts of events, then re-read, parse and validate every file; only a fully
//! valid set replaces the live rules. Counters live in the store under keys that do not depend on
//! the rules, so they survive every reload. A failed reload is logged with every error, counted,
//! shown on `/rlconfig`, and the previous rules keep serving.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::clock::{Clock, NANOS_PER_SECOND};
use crate::config::{ConfigErrors, DomainConfig};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::policy::{Policy, Rule};
use crate::rules_dir::load_rules_dir;
use crate::status::{LoadReport, ServerStatus};
use crate::store::AnyStore;

/// Quiet time after the last file event before reloading.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Loads the rules directory into the engine.
pub struct Reloader {
    dir: PathBuf,
    engine: Arc<Engine<AnyStore>>,
    metrics: Arc<Metrics>,
    status: Arc<ServerStatus>,
    clock: Arc<dyn Clock>,
    /// Serialises reloads.
    lock: Mutex<()>,
}

/// How the rules of two policies differ, rule by rule (keyed by domain and path).
fn rule_changes(old: &Policy, new: &Policy) -> (Vec<String>, usize) {
    fn table(p: &Policy) -> BTreeMap<(String, String), (String, Rule)> {
        p.domains()
            .iter()
            .flat_map(|d| {
                d.rules().into_iter().map(|r| {
                    let rule = Rule { id: 0, ..r.clone() };
                    ((d.name.clone(), r.path.clone()), (d.name.clone(), rule))
                })
            })
            .collect()
    }
    let (old, new) = (table(old), table(new));
    let mut domains = std::collections::BTreeSet::new();
    let mut changed = 0;
    for key in old
        .keys()
        .chain(new.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let differs = match (old.get(key), new.get(key)) {
            (Some(a), Some(b)) => a != b,
            _ => true,
        };
        if differs {
            changed += 1;
            domains.insert(key.0.clone());
        }
    }
    (domains.into_iter().collect(), changed)
}

impl Reloader {
    pub fn new(
        dir: PathBuf,
        engine: Arc<Engine<AnyStore>>,
        metrics: Arc<Metrics>,
        status: Arc<ServerStatus>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Reloader {
            dir,
            engine,
            metrics,
            status,
            clock,
            lock: Mutex::new(()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads, validates and (if valid) installs the rules. Returns the report also shown on
    /// `/rlconfig`.
    pub fn reload(&self) -> Result<LoadReport, ConfigErrors> {
        let _serial = self
            .lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = self.clock.now() / NANOS_PER_SECOND;
        match load_rules_dir(&self.dir) {
            Ok(configs) => Ok(self.install(&configs, at)),
            Err(errors) => {
                self.metrics.config_load_error.inc();
                for e in &errors.0 {
                    tracing::error!(error = %e, "rules reload rejected; previous rules stay in force");
                }
                self.status.set_last_load(LoadReport {
                    at,
                    ok: false,
                    errors: errors.0.iter().map(ToString::to_string).collect(),
                    summary: format!("{} error(s); previous rules stay in force", errors.0.len()),
                });
                Err(errors)
            }
        }
    }

    fn install(&self, configs: &[DomainConfig], at: u64) -> LoadReport {
        let new = Policy::new(configs);
        let (domains, changed) = rule_changes(&self.engine.policy(), &new);
        let summary = format!(
            "{} domain(s), {} rule(s) in force; {changed} rule(s) changed{}",
            configs.len(),
            new.rule_count(),
            if domains.is_empty() {
                String::new()
            } else {
                format!(" in {}", domains.join(", "))
            }
        );
        self.engine.set_policy(new);
        self.metrics.config_load_success.inc();
        tracing::info!(dir = %self.dir.display(), "rules loaded: {summary}");
        let report = LoadReport {
            at,
            ok: true,
            errors: Vec::new(),
            summary,
        };
        self.status.set_last_load(report.clone());
        report
    }
}

/// Watches the directory recursively (through its symlink, if it is one).
fn watch_dir(watcher: &mut RecommendedWatcher, dir: &Path) {
    if let Err(e) = watcher.watch(dir, RecursiveMode::Recursive) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the rules directory");
    }
}

/// Watches the rules directory until `stop` turns true, reloading after each burst of changes.
pub fn spawn_watcher(
    reloader: Arc<Reloader>,
    mut stop: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, notify::Error> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let dir = reloader.dir().to_path_buf();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // The parent's watch also reports its other entries: keep only events on the directory.
        if event.is_ok_and(|e| e.paths.iter().any(|p| p.starts_with(&dir))) {
            let _ = tx.send(());
        }
    })?;
    watch_dir(&mut watcher, reloader.dir());
    // The parent sees the directory itself replaced (`ln -s new tmp && mv -T tmp dir`).
    let parent = reloader
        .dir()
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    watcher.watch(parent, RecursiveMode::NonRecursive)?;
    let mut watched = std::fs::canonicalize(reloader.dir()).ok();
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                event = rx.recv() => if event.is_none() { break },
                _ = stop.wait_for(|s| *s) => break,
            }
            while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
            let r = reloader.clone();
            let _ = tokio::task::spawn_blocking(move || r.reload()).await;
            // The directory itself may now be another one (symlink swap): watch the new target.
            let now = std::fs::canonicalize(reloader.dir()).ok();
            if now != watched {
                if let Some(old) = &watched {
                    let _ = watcher.unwatch(old);
                }
                let _ = watcher.unwatch(reloader.dir());
                watch_dir(&mut watcher, reloader.dir());
                watched = now;
            }
        }
    }))
}
