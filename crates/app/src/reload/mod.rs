//! Hot reload: re-read, parse and validate every rules file; only a fully valid set replaces the
//! live rules. Counters live in the store under keys made of the descriptor, the limit's position
//! in its rule, its algorithm and its window, not its numbers: they survive every reload that
//! keeps those (a raised or lowered limit keeps its counter; a new algorithm or window starts
//! afresh). A failed reload is logged with every error, counted, shown on `/rlconfig`, and the
//! previous rules keep serving. Files byte-identical to the last load are a no-op (not counted,
//! not logged above debug). The watcher that calls it is in `watch`.

mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::clock::{Clock, NANOS_PER_SECOND};
use crate::config::{ConfigErrors, DomainConfig};
use crate::engine::Rules;
use crate::metrics::Metrics;
use crate::policy::{Policy, Rule};
use crate::rules_dir::{
    RulesFiles, SizeCaps, no_rules_warning, parse_rules_merging, read_rules_dir,
};
use crate::status::{LoadReport, ServerStatus};

pub use watch::spawn_watcher;

/// Loads the rules directory into the engine.
pub struct Reloader {
    dir: PathBuf,
    caps: SizeCaps,
    /// `MERGE_DOMAIN_CONFIG`: a domain may span several files.
    merge_domains: bool,
    engine: Arc<dyn Rules>,
    metrics: Arc<Metrics>,
    status: Arc<ServerStatus>,
    clock: Arc<dyn Clock>,
    /// Serialises reloads; remembers what the last one read.
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Fingerprint of the files of the last load that got as far as parsing (valid or not).
    fingerprint: Option<u128>,
    /// Whether a valid set was ever installed (else no rules are in force).
    installed: bool,
}

/// A 128-bit hash of every file's path and bytes, in order.
fn fingerprint(files: &RulesFiles) -> u128 {
    let mut h = SipHasher13::new();
    for (path, bytes) in files {
        let name = path.as_os_str().as_encoded_bytes();
        h.write_usize(name.len());
        h.write(name);
        h.write_usize(bytes.len());
        h.write(bytes);
    }
    h.finish128().as_u128()
}

/// How the rules of two policies differ, rule by rule (keyed by domain and path): the domains
/// touched and the number of rules added, removed or changed. Borrows; copies no rule.
fn rule_changes(old: &Policy, new: &Policy) -> (Vec<String>, usize) {
    fn table(p: &Policy) -> BTreeMap<(&str, &str), &Rule> {
        p.domains()
            .iter()
            .flat_map(|d| {
                d.rules()
                    .into_iter()
                    .map(|r| ((d.name.as_str(), r.path.as_str()), r))
            })
            .collect()
    }
    // Rule ids are positions in their policy: not part of what a rule says.
    fn same(a: &Rule, b: &Rule) -> bool {
        a.kind == b.kind && a.shadow_mode == b.shadow_mode && a.detailed_metric == b.detailed_metric
    }
    let (old, new) = (table(old), table(new));
    let mut domains = BTreeSet::new();
    let mut changed = 0;
    for key in old.keys().chain(new.keys()).collect::<BTreeSet<_>>() {
        let differs = match (old.get(key), new.get(key)) {
            (Some(a), Some(b)) => !same(a, b),
            _ => true,
        };
        if differs {
            changed += 1;
            domains.insert(key.0.to_owned());
        }
    }
    (domains.into_iter().collect(), changed)
}

impl Reloader {
    pub fn new(
        dir: PathBuf,
        caps: SizeCaps,
        engine: Arc<dyn Rules>,
        metrics: Arc<Metrics>,
        status: Arc<ServerStatus>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Reloader {
            dir,
            caps,
            merge_domains: false,
            engine,
            metrics,
            status,
            clock,
            state: Mutex::new(State::default()),
        }
    }

    /// Lets one domain span several files (`MERGE_DOMAIN_CONFIG`).
    pub fn with_merged_domains(mut self, merge_domains: bool) -> Self {
        self.merge_domains = merge_domains;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads, validates and (if valid) installs the rules. Returns the report also shown on
    /// `/rlconfig`; files identical to the last load's change nothing and return the last report
    /// with a summary saying so.
    pub fn reload(&self) -> Result<LoadReport, ConfigErrors> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = self.clock.now() / NANOS_PER_SECOND;
        self.metrics.rules_checks.inc();
        let files = read_rules_dir(&self.dir, self.caps);
        let fingerprint = files.as_ref().ok().map(fingerprint);
        if fingerprint.is_some() && fingerprint == state.fingerprint {
            tracing::debug!(dir = %self.dir.display(), "rules files unchanged; nothing to do");
            let last = self.status.last_load();
            return Ok(LoadReport {
                summary: format!(
                    "rules files unchanged since the last load ({})",
                    last.summary
                ),
                ..last
            });
        }
        let empty = files.as_ref().is_ok_and(Vec::is_empty);
        let loaded = files
            .map_err(|e| ConfigErrors(vec![e.into()]))
            .and_then(|files| parse_rules_merging(files, self.merge_domains));
        state.fingerprint = fingerprint;
        match loaded {
            Ok(configs) => {
                state.installed = true;
                Ok(self.install(&configs, at, empty))
            }
            Err(errors) => Err(self.reject(errors, at, state.installed)),
        }
    }

    fn reject(&self, errors: ConfigErrors, at: u64, installed: bool) -> ConfigErrors {
        let outcome = if installed {
            "previous rules stay in force"
        } else {
            "no rules are in force"
        };
        self.metrics.config_load_error.inc();
        for e in &errors.0 {
            tracing::error!(error = %e, "rules rejected; {outcome}");
        }
        self.status.set_last_load(LoadReport {
            at,
            ok: false,
            errors: errors.0.iter().map(ToString::to_string).collect(),
            summary: format!("{} error(s); {outcome}", errors.0.len()),
        });
        errors
    }

    fn install(&self, configs: &[DomainConfig], at: u64, empty: bool) -> LoadReport {
        let new = Policy::new(configs);
        let (domains, changed) = rule_changes(&self.engine.policy(), &new);
        let mut summary = format!(
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
        if empty {
            let warning = no_rules_warning(&self.dir);
            tracing::warn!("{warning}");
            summary = format!("{summary}; warning: {warning}");
        }
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
