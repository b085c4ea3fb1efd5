//! `ratelimit-server replay`: recorded requests (or Envoy access-log lines through a mapping) run
//! through one or two rules sets on a virtual clock (each line's recorded time, never moving
//! backwards, no sleeping), each set on its own real `Engine` with its own memory backend, in one
//! pass over the input; counted per rule (`tally`), reported as text or JSON (`report`), drawn
//! (`plot`). A leaky bucket's turn is taken but not waited for: a delayed request counts as
//! allowed. The pure parts (`tally`, `envoy_log`, `report`; lines are read by the core's
//! `wire::record`) do no I/O; `input` reads the files, this module drives the engines. `chart`
//! draws SVG charts in one style (also for `examples/simulate.rs`).
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

pub mod chart;
mod envoy_log;
mod input;
mod plot;
mod report;
mod tally;

pub use envoy_log::Mapping as EnvoyLogMapping;
pub use input::{Decode, Merged, Problems};
pub use plot::draw as draw_plot;
pub use report::{Report, RunInput, build as build_report, text as report_text};
pub use tally::DiffTally;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use ratelimit_core::clock::{ManualClock, NANOS_PER_SECOND, Nanos};
use ratelimit_core::engine::{Attribution, Engine, EngineSettings};
use ratelimit_core::policy::Policy;
use ratelimit_core::store::Store;
use ratelimit_core::store::memory::MemoryBackend;
use tally::Tally;

/// Record lines (`docs/record.md`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordLines;

impl Decode for RecordLines {
    fn decode(&self, line: &[u8], out: &mut RateLimitRequest) -> Result<Option<Nanos>, String> {
        ratelimit_core::wire::record::parse_into(line, out).map(Some)
    }
}

/// The name of every rule of a policy by `Rule::id`: (domain, path), and the ids in report order
/// (domains by name, rules depth first in file order).
#[derive(Debug, Clone, Default)]
pub struct RuleNames {
    pub(crate) by_id: Vec<(String, String)>,
    pub(crate) order: Vec<usize>,
}

impl RuleNames {
    pub fn of(policy: &Policy) -> Self {
        let mut names = RuleNames {
            by_id: vec![Default::default(); policy.rule_count()],
            order: Vec::with_capacity(policy.rule_count()),
        };
        for domain in policy.domains() {
            for rule in domain.rules() {
                if let Some(slot) = names.by_id.get_mut(rule.id) {
                    *slot = (domain.name.clone(), rule.path.clone());
                    names.order.push(rule.id);
                }
            }
        }
        names
    }

    /// The (domain, rule) a descriptor's decision counts under, as `/rlconfig` and the metrics
    /// name it: the rule's path, or `override` for a request-supplied limit.
    pub fn name<'a>(&'a self, domain: &'a str, a: &Attribution) -> Option<(&'a str, &'a str)> {
        match (a.rule, a.outcome) {
            (Some(id), _) => self.by_id.get(id).map(|(d, p)| (d.as_str(), p.as_str())),
            (None, Some(_)) => Some((domain, ratelimit_core::metrics::OVERRIDE_RULE)),
            (None, None) => None,
        }
    }
}

/// One rules set being replayed.
pub struct Side {
    /// What the report calls it (the rules directory).
    pub(crate) label: String,
    engine: Engine<MemoryBackend>,
    pub(crate) names: RuleNames,
    pub(crate) tally: Tally,
    attribution: Vec<Attribution>,
}

impl Side {
    /// `max_keys`: the memory store's bound (a full store evicts, which would change answers).
    pub fn new(label: String, policy: Policy, settings: EngineSettings, max_keys: usize) -> Self {
        let names = RuleNames::of(&policy);
        let tally = Tally::new(policy.rule_count());
        Side {
            label,
            engine: Engine::new(
                policy,
                Store::new(MemoryBackend::new(max_keys)),
                Arc::new(ManualClock::new(0)),
                settings,
            ),
            names,
            tally,
            attribution: Vec::new(),
        }
    }

    /// Decides `request` at `now`; the answer, or None when the engine refused it (counted).
    async fn decide(
        &mut self,
        request: &RateLimitRequest,
        now: Nanos,
    ) -> Option<RateLimitResponse> {
        match self
            .engine
            .decide_at(request, now, &mut self.attribution)
            .await
        {
            Ok(response) => {
                self.tally.record(
                    &request.domain,
                    &request.descriptors,
                    &response,
                    &self.attribution,
                    now,
                );
                Some(response)
            }
            Err(_) => {
                self.tally.refused();
                None
            }
        }
    }

    /// What the report needs of this side: its label, its rules' names and its counts.
    pub fn report_input(&self) -> RunInput<'_> {
        RunInput {
            label: self.label.as_str(),
            names: &self.names,
            tally: &self.tally,
        }
    }

    /// Requests this side has answered OVER_LIMIT so far.
    pub fn denied(&self) -> u64 {
        self.tally.totals.denied
    }

    /// Keys held by this side's store now.
    pub fn keys(&self) -> u64 {
        self.engine.store().stats().keys as u64
    }
}

/// What a replay saw: a plain record of counts, read by the caller field by field.
#[derive(Debug, Default, Clone, Copy)]
pub struct Run {
    pub lines_replayed: u64,
    pub lines_skipped: u64,
    /// Lines that stand for no call (access-log lines of routes that send no descriptor).
    pub lines_without_call: u64,
    /// Virtual time of the first and last replayed line.
    pub first: Option<Nanos>,
    pub last: Option<Nanos>,
    /// Most keys a store held at a sweep (both sides together).
    pub peak_keys: u64,
    /// Lines that moved the virtual clock forward by more than [`JUMP_WARNING`] at once.
    pub time_jumps: u64,
    /// Keys the stores evicted for `--max-keys` (both sides): past the first, answers may differ
    /// from the server's.
    pub evictions: u64,
}

/// A line that moves the virtual clock forward by more than this is warned about: every later line
/// is decided at its time or after, so one wrong date ends the replay's sense of time.
pub const JUMP_WARNING: Nanos = 86_400 * NANOS_PER_SECOND;

/// Expired keys are dropped from the stores once per this much virtual time, so memory follows
/// the keys in use, not the length of the input.
const SWEEP_EVERY: Nanos = 60 * NANOS_PER_SECOND;

/// Replays every line of `input` through `before` and, if given, `after`; `diff` counts what
/// changed between them.
pub async fn replay(
    input: &mut Merged<'_>,
    before: &mut Side,
    mut after: Option<(&mut Side, &mut DiffTally)>,
) -> std::io::Result<Run> {
    let mut run = Run::default();
    let mut clock: Nanos = 0;
    let mut next_sweep: Nanos = 0;
    let mut jumps = 0;
    while let Some((time, _)) = input.next_request()? {
        // The virtual clock: the recorded time, never backwards.
        if clock != 0 && time > clock.saturating_add(JUMP_WARNING) {
            input.jumped(clock, time);
            jumps += 1;
        }
        let Some(request) = input.current_request() else {
            break;
        };
        clock = clock.max(time);
        if clock >= next_sweep {
            if next_sweep != 0 {
                let mut keys = 0;
                for side in std::iter::once(&*before).chain(after.as_ref().map(|(s, _)| &**s)) {
                    side.engine.store().sweep(clock);
                    keys += side.keys();
                }
                run.peak_keys = run.peak_keys.max(keys);
            }
            next_sweep = clock.saturating_add(SWEEP_EVERY);
        }
        run.first.get_or_insert(clock);
        run.last = Some(clock);
        let answer_before = before.decide(request, clock).await;
        if let Some((side, diff)) = after.as_mut() {
            let answer_after = side.decide(request, clock).await;
            if let (Some(b), Some(a)) = (&answer_before, &answer_after) {
                let domain = request.domain.as_str();
                diff.record(
                    &request.descriptors,
                    (b, &before.attribution),
                    (a, &side.attribution),
                    |x| before.names.name(domain, x),
                    |x| side.names.name(domain, x),
                );
            }
        }
    }
    run.lines_replayed = input.lines_replayed;
    run.lines_skipped = input.problems.skipped;
    run.lines_without_call = input.problems.without_call;
    run.time_jumps = jumps;
    run.evictions = std::iter::once(&*before)
        .chain(after.as_ref().map(|(s, _)| &**s))
        .map(|side| side.engine.store().stats().evictions)
        .sum();
    Ok(run)
}

#[cfg(test)]
mod tests;
