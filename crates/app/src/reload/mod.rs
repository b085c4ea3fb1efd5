//! Hot reload: re-read, parse and validate every rules file; only a fully valid set replaces the
//! live rules. Counters live in the store under keys made of the descriptor, the limit's position
//! in its rule, its algorithm and its window, not its numbers: they survive every reload that
//! keeps those (a raised or lowered limit keeps its counter; a new algorithm or window starts
//! afresh). A failed reload is logged with every error, counted, shown on `/rlconfig`, and the
//! previous rules keep serving. Files byte-identical to the last load are a no-op (not counted,
//! not logged above debug). The watcher that calls it is in `watch`.
//!
//! Rules from xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`) take the same path: each response's resources,
//! rendered as rules documents, are validated as files are and swapped in whole
//! ([`Reloader::load_documents`]).

mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::status::{LoadReport, ServerStatus};
use ratelimit_core::clock::{Clock, NANOS_PER_SECOND};
use ratelimit_core::config::{self, ConfigErrors, DomainConfig};
use ratelimit_core::engine::Rules;
use ratelimit_core::metrics::Metrics;
use ratelimit_core::policy::{Policy, Rule};
use ratelimit_core::rules_dir::{RulesDir, SizeCaps, parse_rules_merging, read_rules_dir};

pub(crate) use watch::spawn_watcher;

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

/// Where a load's rules came from, for its log line and report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The rules directory.
    Files,
    /// An xDS response: its `version_info` and nonce.
    Xds { version: String, nonce: String },
}

impl Origin {
    fn source(&self) -> &'static str {
        match self {
            Origin::Files => "files",
            Origin::Xds { .. } => "xds",
        }
    }

    /// Fills the report's source, version and nonce.
    fn stamp(&self, report: &mut LoadReport) {
        report.source = self.source().to_owned();
        if let Origin::Xds { version, nonce } = self {
            report.version = Some(version.clone());
            report.nonce = Some(nonce.clone());
        }
    }
}

#[derive(Default)]
struct State {
    /// Fingerprint of the files of the last load that got as far as parsing (valid or not).
    fingerprint: Option<u128>,
    /// Whether a valid set was ever installed (else no rules are in force).
    installed: bool,
}

/// A 128-bit hash of every file's path and bytes, in order.
/// The rules files as read, in one number: their names and bytes. (Not the files that are not
/// read: an editor's or a tool's temporary file beside the rules is no change of them. Those are
/// said at the next load.)
fn fingerprint(read: &RulesDir) -> u128 {
    let mut h = SipHasher13::new();
    for (path, bytes) in &read.files {
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
    pub(crate) fn new(
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
    pub(crate) fn with_merged_domains(mut self, merge_domains: bool) -> Self {
        self.merge_domains = merge_domains;
        self
    }

    pub(crate) fn dir(&self) -> &Path {
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
        let read = read_rules_dir(&self.dir, self.caps);
        let fingerprint = read.as_ref().ok().map(fingerprint);
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
        let warnings = read
            .as_ref()
            .map(|read| read.warnings(&self.dir))
            .unwrap_or_default();
        let loaded = read
            .map_err(|e| ConfigErrors(vec![e.into()]))
            .and_then(|read| parse_rules_merging(read.files, self.merge_domains));
        state.fingerprint = fingerprint;
        match loaded {
            Ok(configs) => {
                state.installed = true;
                let warning = (!warnings.is_empty()).then(|| warnings.join("; "));
                Ok(self.install(&configs, at, warning, &Origin::Files))
            }
            Err(errors) => {
                let explained = errors.0.iter().map(ToString::to_string).collect();
                self.reject(explained, at, state.installed, &Origin::Files);
                Err(errors)
            }
        }
    }

    /// Validates rules documents (name, YAML text) that did not come from the directory (xDS
    /// resources) exactly as rules files are validated (`MERGE_DOMAIN_CONFIG` included) and, if
    /// valid, installs them in place of every rule in force. Never skipped as unchanged: each
    /// response is a whole new set. `explain` tells an error as the log and `/rlconfig` show it
    /// (in terms of the resource and field rather than a line of the rendered text).
    pub(crate) fn load_documents(
        &self,
        documents: &[(PathBuf, String)],
        origin: &Origin,
        explain: &dyn Fn(&ConfigErrors) -> Vec<String>,
    ) -> Result<LoadReport, Vec<String>> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = self.clock.now() / NANOS_PER_SECOND;
        state.fingerprint = None;
        match config::parse_files_merging(documents, self.merge_domains) {
            Ok(configs) => {
                for warning in configs.iter().flat_map(|c| &c.warnings) {
                    tracing::warn!("{warning}");
                }
                state.installed = true;
                let warning = documents
                    .is_empty()
                    .then(|| "the xDS response holds no rules: every request is allowed".into());
                Ok(self.install(&configs, at, warning, origin))
            }
            Err(errors) => {
                let explained = explain(&errors);
                self.reject(explained.clone(), at, state.installed, origin);
                Err(explained)
            }
        }
    }

    /// Counts, logs and reports a set of rules refused before validation (xDS resources that
    /// cannot be decoded); the rules in force stay.
    pub(crate) fn refuse(&self, errors: Vec<String>, origin: &Origin) {
        let state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = self.clock.now() / NANOS_PER_SECOND;
        self.reject(errors, at, state.installed, origin);
    }

    /// Counts, logs and reports refused rules (`errors`, each told in full).
    fn reject(&self, errors: Vec<String>, at: u64, installed: bool, origin: &Origin) {
        let outcome = if installed {
            "previous rules stay in force"
        } else {
            "no rules are in force"
        };
        self.metrics.config_load_error.inc();
        for e in &errors {
            tracing::error!(source = origin.source(), error = %e, "rules rejected; {outcome}");
        }
        let mut report = LoadReport {
            at,
            ok: false,
            summary: format!("{} error(s); {outcome}", errors.len()),
            errors,
            ..LoadReport::default()
        };
        origin.stamp(&mut report);
        self.status.set_last_load(report);
    }

    /// Swaps `configs` in; `warning`, if any, is logged and added to the summary.
    fn install(
        &self,
        configs: &[DomainConfig],
        at: u64,
        warning: Option<String>,
        origin: &Origin,
    ) -> LoadReport {
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
        match origin {
            Origin::Files => {
                tracing::info!(dir = %self.dir.display(), "rules loaded: {summary}");
            }
            Origin::Xds { version, nonce } => {
                tracing::info!(%version, %nonce, "rules loaded from xDS: {summary}");
            }
        }
        if let Some(warning) = warning {
            tracing::warn!("{warning}");
            summary = format!("{summary}; warning: {warning}");
        }
        let mut report = LoadReport {
            at,
            ok: true,
            errors: Vec::new(),
            summary,
            ..LoadReport::default()
        };
        origin.stamp(&mut report);
        self.status.set_last_load(report.clone());
        report
    }
}
