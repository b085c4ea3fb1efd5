//! Fair shares of one bucket's pool among the Envoys (streams) that report it. Pure: every call
//! takes `now`.
//!
//! Each stream is assigned a token bucket (`max_tokens`, `tokens_per_fill`, a fill interval that
//! is the same for the whole pool) so that, over every stream, the rates add up to at most the
//! pool's rate and the capacities to at most its burst. Shares follow each stream's recent demand
//! (allowed + denied per second, from its reports), with a floor so a newcomer gets some.
//!
//! **No token is handed out twice.** Envoy starts a token bucket full whenever an assignment
//! changes it (an identical one carries the old bucket over), so every (re)assignment hands out
//! its `max_tokens` at once. The ledger keeps the pool's own level (refilled at the pool's rate,
//! capped at its burst, less what the reports say was allowed) and, per stream, a bound on what
//! its current bucket can still admit beyond what it reported (its level at its last report plus
//! its rate since). A new bucket is given only when the pool's level less every other stream's
//! bound covers it; the old bucket's bound is released, since Envoy drops that bucket. A stream
//! that cannot be covered gets DENY_ALL until its share comes back. A stream whose stream closed
//! keeps its bound until its assignment's TTL has passed (Envoy enforces it until then).
//!
//! With instances sharing the pool through a shared store, this instance hands out only its fraction of
//! it (`set_fraction`, see `quota::fraction`): the rate, the burst and the ledger's cap scaled
//! down; a smaller fraction clamps the level at once, a larger one only refills faster.

use litemap::LiteMap;

use crate::clock::{NANOS_PER_SECOND, Nanos};
use crate::quota::fraction::scaled;
use crate::quota::pool::Pool;

/// A stream's identity, given by the caller.
pub type StreamId = u64;

/// How long an assignment lives in Envoy without being re-sent, in whole seconds (Envoy reads
/// only the seconds). Re-sent on every report (Envoy reports every 5 s).
pub const ASSIGNMENT_TTL_SECS: u64 = 20;
/// A stream whose reports for a bucket say nothing for this long is told to abandon it.
pub(crate) const IDLE_AFTER: Nanos = 60 * NANOS_PER_SECOND;
/// A newcomer's (or an idle stream's) weight: at least this share of the streams' mean demand.
pub(crate) const NEWCOMER_FLOOR: f64 = 0.25;
/// A current bucket at least this share of its new target (and not above it) is kept as is:
/// every change resets Envoy's bucket, so small moves are not worth one.
pub(crate) const KEEP_WITHIN: f64 = 0.8;
/// Envoy's report interval (5 s, whatever the filter's `reporting_interval` says): how late a
/// report may tell of what was admitted.
pub(crate) const REPORT_LAG_SECS: f64 = 5.0;
/// Tokens the ledger's float sums may be off by (refills in one step or in many).
const LEDGER_SLACK: f64 = 1e-6;
/// Weight of the newest report in a stream's demand (an exponential moving average).
const DEMAND_WEIGHT: f64 = 0.5;

/// A token bucket as Envoy's `envoy.type.v3.TokenBucket`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenGrant {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    /// Whole seconds (Envoy divides by the whole seconds of the interval).
    pub fill_interval_secs: u64,
}

impl TokenGrant {
    /// Tokens per second.
    pub(crate) fn rate(&self) -> f64 {
        f64::from(self.tokens_per_fill) / self.fill_interval_secs.max(1) as f64
    }

    /// Tokens per `secs` seconds, rounded up (for sums that must not be underestimated).
    fn tokens_per_ceil(&self, secs: u64) -> u128 {
        (u128::from(self.tokens_per_fill) * u128::from(secs))
            .div_ceil(u128::from(self.fill_interval_secs.max(1)))
    }

    /// Whether `self` is nowhere above `other`.
    fn within(&self, other: &TokenGrant) -> bool {
        self.fill_interval_secs == other.fill_interval_secs
            && self.tokens_per_fill <= other.tokens_per_fill
            && self.max_tokens <= other.max_tokens
    }
}

/// What one stream is assigned for the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    TokenBucket(TokenGrant),
    DenyAll,
}

#[derive(Debug, Clone)]
struct Member {
    /// Requests per second; `None` until its first report with a known elapsed time.
    demand: Option<f64>,
    last_report: Nanos,
    /// The last report with any request, or the join.
    last_active: Nanos,
    grant: Option<Grant>,
    /// Bound on what the current bucket can admit beyond the reports, at `bound_at`.
    bound: f64,
    /// The bound released by a reassignment since the last report: that much of the next
    /// report's allowed requests may have come from the old bucket, not the current one.
    released: f64,
    bound_at: Nanos,
    /// When the grant was last sent (its TTL runs from there).
    sent_at: Nanos,
    closed: bool,
}

impl Member {
    /// What this stream's bucket may still admit beyond its reports, at `now`.
    fn bound(&self, now: Nanos) -> f64 {
        match self.grant {
            Some(Grant::TokenBucket(g)) => {
                self.bound + g.rate() * secs(now.saturating_sub(self.bound_at))
            }
            _ => 0.0,
        }
    }

    fn expired(&self, now: Nanos) -> bool {
        self.grant.is_none()
            || now
                >= self
                    .sent_at
                    .saturating_add(ASSIGNMENT_TTL_SECS * NANOS_PER_SECOND)
    }
}

fn secs(nanos: Nanos) -> f64 {
    nanos as f64 / NANOS_PER_SECOND as f64
}

/// One bucket's pool and its streams.
#[derive(Debug, Clone)]
pub struct Shares {
    pool: Pool,
    /// This instance's part of the pool (1 unless instances share it through a shared store: see
    /// `quota::fraction`); the rate and burst handed out here are the pool's scaled by it.
    fraction: f64,
    /// The pool's level (may go below zero when Envoys admitted more than it held, e.g. before
    /// their first assignment), at `level_at`.
    level: f64,
    level_at: Nanos,
    /// By stream, in order (sorted: one slot per stream, where a `BTreeMap` allocates a node of
    /// eleven for the first; most buckets have one stream).
    members: LiteMap<StreamId, Member>,
    /// The last [`Shares::assign`] left a stream short of its target (the ledger could not cover
    /// it yet): the next one, a tick later, may move it.
    unsettled: bool,
}

/// What one report did to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reported {
    /// Allowed requests the pool did not hold (for shadow-mode counting).
    pub over: u64,
}

impl Shares {
    /// A full pool.
    pub fn new(pool: Pool, now: Nanos) -> Shares {
        Shares {
            pool,
            fraction: 1.0,
            level: f64::from(pool.burst),
            level_at: now,
            members: LiteMap::with_capacity(1),
            unsettled: false,
        }
    }

    #[cfg(test)]
    pub(crate) fn pool(&self) -> Pool {
        self.pool
    }

    #[cfg(test)]
    /// Streams that report the bucket (closed ones whose assignment still lives included).
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether a stream that reports the bucket is still open.
    pub fn has_open(&self) -> bool {
        self.members.values().any(|m| !m.closed)
    }

    /// When [`Shares::idle`] or [`Shares::assign`] may next change something without a report,
    /// a close, a reload or a new fraction (each of which calls for a visit of its own): the
    /// first open stream's idle deadline, the first closed stream's TTL, or `now + 1` while a
    /// stream waits for the ledger to cover its share. `None`: nothing ever will.
    pub fn next_due(&self, now: Nanos) -> Option<Nanos> {
        let ttl = ASSIGNMENT_TTL_SECS * NANOS_PER_SECOND;
        let first = self
            .members
            .values()
            .map(|m| {
                if !m.closed {
                    m.last_active.saturating_add(IDLE_AFTER)
                } else if m.grant.is_none() {
                    now
                } else {
                    m.sent_at.saturating_add(ttl)
                }
            })
            .min()?;
        let first = first.max(now.saturating_add(1));
        Some(if self.unsettled {
            now.saturating_add(1)
        } else {
            first
        })
    }

    /// This instance's part of the pool.
    pub fn fraction(&self) -> f64 {
        self.fraction
    }

    /// The burst this instance hands out: the pool's, scaled by its fraction.
    fn burst(&self) -> u64 {
        scaled(u128::from(self.pool.burst), self.fraction) as u64
    }

    /// The rate this instance hands out, in tokens per second.
    fn rate(&self) -> f64 {
        self.pool.rate() * self.fraction.clamp(0.0, 1.0)
    }

    /// The pool's cap in the ledger: its burst plus one report interval of refill, since what
    /// Envoys admitted in that time is not reported yet (their bounds grow alike).
    fn cap(&self) -> f64 {
        self.burst() as f64 + self.rate() * REPORT_LAG_SECS
    }

    fn refill(&mut self, now: Nanos) {
        let elapsed = secs(now.saturating_sub(self.level_at));
        self.level = (self.level + self.rate() * elapsed).min(self.cap());
        self.level_at = self.level_at.max(now);
    }

    /// This instance's part of the pool is now `fraction` (clamped to `[0, 1]`; NaN is 0). A
    /// smaller part clamps the level down to its cap at once; a larger one only refills faster
    /// from now on, so no token is handed out twice within the instance. Shares follow at the
    /// next [`Shares::assign`]. Returns whether the part changed.
    pub fn set_fraction(&mut self, fraction: f64, now: Nanos) -> bool {
        let fraction = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        if fraction == self.fraction {
            return false;
        }
        self.refill(now);
        self.fraction = fraction;
        self.level = self.level.min(self.cap());
        true
    }

    /// The open streams' demand for the bucket, in requests per second (what this instance
    /// publishes for it).
    pub fn demand(&self) -> f64 {
        self.members
            .values()
            .filter(|m| !m.closed)
            .filter_map(|m| m.demand.filter(|d| d.is_finite() && *d > 0.0))
            .sum()
    }

    /// A reload changed the rule's numbers: shares follow at the next [`Shares::assign`].
    pub fn set_pool(&mut self, pool: Pool, now: Nanos) {
        self.refill(now);
        self.pool = pool;
        self.level = self.level.min(self.cap());
    }

    /// One stream's report for the bucket: `allowed` and `denied` since its last one.
    pub fn report(&mut self, stream: StreamId, allowed: u64, denied: u64, now: Nanos) -> Reported {
        self.refill(now);
        let before = self.level.max(0.0);
        self.level -= allowed as f64;
        let over = (allowed as f64 - before).max(0.0).ceil() as u64;
        let member = self.members.entry(stream).or_insert_with(|| Member {
            demand: None,
            last_report: now,
            last_active: now,
            grant: None,
            bound: 0.0,
            released: 0.0,
            bound_at: now,
            sent_at: now,
            closed: false,
        });
        member.closed = false;
        let count = allowed.saturating_add(denied) as f64;
        let elapsed = secs(now.saturating_sub(member.last_report)).max(1.0);
        let sample = count / elapsed;
        member.demand = Some(match member.demand {
            Some(d) => d * (1.0 - DEMAND_WEIGHT) + sample * DEMAND_WEIGHT,
            None => sample,
        });
        member.last_report = now;
        if count > 0.0 {
            member.last_active = now;
        }
        if let Some(Grant::TokenBucket(g)) = member.grant {
            let grown = (member.bound(now)).min(f64::from(g.max_tokens));
            // What the old bucket may have admitted is not the current one's.
            let from_current = (allowed as f64 - member.released).max(0.0);
            member.bound = (grown - from_current).max(0.0);
            member.bound_at = now;
        }
        member.released = 0.0;
        Reported { over }
    }

    /// The stream ended; its assignment still binds its Envoy until the TTL.
    pub fn close(&mut self, stream: StreamId) {
        if let Some(member) = self.members.get_mut(&stream) {
            member.closed = true;
        }
    }

    /// Forgets a stream at once (its Envoy was told to abandon the bucket, or lost it).
    pub fn remove(&mut self, stream: StreamId) {
        self.members.remove(&stream);
    }

    /// The stream's current grant, marking it sent at `now` (its TTL restarts).
    pub fn send(&mut self, stream: StreamId, now: Nanos) -> Option<Grant> {
        let member = self.members.get_mut(&stream)?;
        member.sent_at = now;
        member.grant
    }

    #[cfg(test)]
    /// The stream's current grant.
    pub(crate) fn grant(&self, stream: StreamId) -> Option<Grant> {
        self.members.get(&stream)?.grant
    }

    /// The current grants, by stream (for `explain`).
    pub fn grants(&self) -> Vec<(StreamId, Option<Grant>, f64)> {
        self.members
            .iter()
            .map(|(id, m)| (*id, m.grant, m.demand.unwrap_or(0.0)))
            .collect()
    }

    /// Open streams whose reports said nothing for `IDLE_AFTER`: they are removed here; tell
    /// their Envoys to abandon the bucket.
    pub fn idle(&mut self, now: Nanos) -> Vec<StreamId> {
        let idle: Vec<StreamId> = self
            .members
            .iter()
            .filter(|(_, m)| !m.closed && now.saturating_sub(m.last_active) >= IDLE_AFTER)
            .map(|(id, _)| *id)
            .collect();
        for id in &idle {
            self.members.remove(id);
        }
        idle
    }

    /// Recomputes every open stream's share at `now` and returns the grants that changed (send
    /// them now). Closed streams whose assignment has expired are forgotten.
    pub fn assign(&mut self, now: Nanos) -> Vec<(StreamId, Grant)> {
        self.refill(now);
        self.members.retain(|_, m| !(m.closed && m.expired(now)));
        let fill = self.pool.fill_interval_secs();
        // What closed streams still hold is fixed until their TTL.
        let (mut fixed_tokens, mut fixed_burst) = (0u128, 0u64);
        for m in self.members.values().filter(|m| m.closed) {
            if let Some(Grant::TokenBucket(g)) = m.grant {
                fixed_tokens += g.tokens_per_ceil(fill);
                fixed_burst += u64::from(g.max_tokens);
            }
        }
        let tokens_budget =
            scaled(self.pool.tokens_per(fill), self.fraction).saturating_sub(fixed_tokens);
        let burst_budget = self.burst().saturating_sub(fixed_burst);
        let open: Vec<(StreamId, f64)> = self.weights();
        if open.is_empty() {
            self.unsettled = false;
            return Vec::new();
        }
        let tokens = split(tokens_budget, &open);
        let bursts = split(u128::from(burst_budget), &open);
        let targets: Vec<(StreamId, Grant)> = open
            .iter()
            .zip(tokens.iter().zip(&bursts))
            .map(|((id, _), (&t, &b))| {
                let target = match (u32::try_from(t), u32::try_from(b)) {
                    (Ok(t), Ok(b)) if t > 0 && b > 0 => Grant::TokenBucket(TokenGrant {
                        max_tokens: b,
                        tokens_per_fill: t,
                        fill_interval_secs: fill,
                    }),
                    _ => Grant::DenyAll,
                };
                (*id, target)
            })
            .collect();
        // One pass may leave a stream short that a later stream's release in the same pass would
        // have covered: pass again until nothing moves, so that assigning twice at one instant
        // changes nothing the second time (the ticker visits a bucket only when it is due).
        let mut changed: Vec<(StreamId, Grant)> = Vec::new();
        for _ in 0..=self.members.len() {
            let moved = self.apply(targets.clone(), now);
            if moved.is_empty() {
                break;
            }
            for (id, grant) in moved {
                changed.retain(|(other, _)| *other != id);
                changed.push((id, grant));
            }
            if !self.unsettled {
                break;
            }
        }
        changed
    }

    /// Open streams and their weights: demand, floored at a share of the mean.
    fn weights(&self) -> Vec<(StreamId, f64)> {
        let open: Vec<(StreamId, Option<f64>)> = self
            .members
            .iter()
            .filter(|(_, m)| !m.closed)
            .map(|(id, m)| (*id, m.demand.filter(|d| d.is_finite())))
            .collect();
        let known: Vec<f64> = open.iter().filter_map(|(_, d)| *d).collect();
        let mean = if known.is_empty() {
            1.0
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        };
        let floor = (mean * NEWCOMER_FLOOR).max(1e-6);
        open.into_iter()
            .map(|(id, d)| (id, d.unwrap_or(mean).max(floor)))
            .collect()
    }

    /// Moves every stream towards its target, reductions first, each new bucket covered by the
    /// ledger; returns the grants that changed.
    fn apply(&mut self, targets: Vec<(StreamId, Grant)>, now: Nanos) -> Vec<(StreamId, Grant)> {
        let mut free = self.level - self.members.values().map(|m| m.bound(now)).sum::<f64>();
        let mut moves: Vec<(bool, StreamId, Grant)> = Vec::new();
        for (id, target) in targets {
            let current = self.members.get(&id).and_then(|m| m.grant);
            match (current, target) {
                (Some(Grant::DenyAll), Grant::DenyAll) => {}
                (Some(Grant::TokenBucket(c)), Grant::TokenBucket(t)) if c.within(&t) => {
                    let close_enough = f64::from(c.tokens_per_fill)
                        >= KEEP_WITHIN * f64::from(t.tokens_per_fill)
                        && f64::from(c.max_tokens)
                            >= (KEEP_WITHIN * f64::from(t.max_tokens)).floor();
                    if !close_enough {
                        moves.push((false, id, target));
                    }
                }
                (Some(Grant::TokenBucket(_)), _) => moves.push((true, id, target)),
                (Some(Grant::DenyAll) | None, _) => moves.push((false, id, target)),
            }
        }
        // Reductions release what they held before increases are covered.
        moves.sort_by_key(|(reduction, _, _)| !*reduction);
        let mut changed = Vec::new();
        self.unsettled = false;
        for (reduction, id, target) in moves {
            let Some(member) = self.members.get_mut(&id) else {
                continue;
            };
            let has_bucket = matches!(member.grant, Some(Grant::TokenBucket(_)));
            let held = member.bound(now);
            // Refilled in one step or in many, the level differs in its last bits: a millionth
            // of a token is not worth a different grant.
            let available = free + held + LEDGER_SLACK;
            let next = match target {
                Grant::DenyAll => Some(Grant::DenyAll),
                Grant::TokenBucket(t) if available >= f64::from(t.max_tokens) => Some(target),
                // A smaller bucket now rather than none: a reduction, or a stream without one.
                Grant::TokenBucket(t) if available >= 1.0 && (reduction || !has_bucket) => {
                    Some(Grant::TokenBucket(TokenGrant {
                        max_tokens: available.floor().min(f64::from(t.max_tokens)) as u32,
                        ..t
                    }))
                }
                // An increase that cannot be covered yet: keep the current bucket.
                Grant::TokenBucket(_) if has_bucket && !reduction => None,
                Grant::TokenBucket(_) => Some(Grant::DenyAll),
            };
            self.unsettled |= next != Some(target);
            let Some(next) = next else {
                continue;
            };
            if member.grant == Some(next) {
                continue;
            }
            let granted = match next {
                Grant::TokenBucket(g) => f64::from(g.max_tokens),
                Grant::DenyAll => 0.0,
            };
            free = available - LEDGER_SLACK - granted;
            member.released += held;
            member.grant = Some(next);
            member.bound = granted;
            member.bound_at = now;
            changed.push((id, next));
        }
        changed
    }
}

/// Splits `budget` in proportion to the weights, rounding down, then hands the rest out one by
/// one: first to those left with nothing, then by weight. The parts never add up to more than
/// `budget`.
fn split(budget: u128, weights: &[(StreamId, f64)]) -> Vec<u128> {
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    if weights.is_empty() || total <= 0.0 || !total.is_finite() {
        return vec![0; weights.len()];
    }
    let mut parts: Vec<u128> = weights
        .iter()
        .map(|(_, w)| ((budget as f64) * w / total).floor().max(0.0) as u128)
        .collect();
    // Float rounding may overshoot by a little: take it back from the largest.
    while parts.iter().sum::<u128>() > budget {
        if let Some(max) = parts.iter_mut().max() {
            *max -= 1;
        }
    }
    let mut rest = budget - parts.iter().sum::<u128>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        (parts[a] > 0)
            .cmp(&(parts[b] > 0))
            .then(weights[b].1.total_cmp(&weights[a].1))
            .then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(order.len()) {
        if rest == 0 {
            break;
        }
        parts[i] += 1;
        rest -= 1;
    }
    parts
}

#[cfg(test)]
mod tests;
