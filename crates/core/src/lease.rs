//! Concurrency leases, pure: the slots of one concurrency key as a small set of leases (whose
//! request, and when it ends), taken, given back and expired at a `now` passed in. The memory
//! backend keeps one [`Leases`] per key; the Redis backend runs the same rules in a script on a
//! sorted set (crate `ratelimit-redis`, `lease`), and the contract tests hold both to them.
//!
//! The rules: an acquisition takes a slot iff fewer than `max_in_flight` unexpired leases are
//! held (else it is denied and takes nothing); an acquisition by a request id that already holds
//! a lease on the key renews that lease and takes no second slot (a retried call); a release
//! removes exactly its request id's lease, and is a no-op for an id that holds none (its
//! acquisition was denied, its lease expired, or it was released already); a lease ends `lease`
//! after it was taken whatever happens, so a lost release frees its slot then.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Nanos;
use crate::config::ConcurrencySpec;

/// A concurrency rule's numbers, as a decision uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseParams {
    pub max_in_flight: u32,
    /// How long a lease lasts when nobody releases it.
    pub lease: Nanos,
}

impl LeaseParams {
    pub fn of(spec: &ConcurrencySpec) -> LeaseParams {
        LeaseParams {
            max_in_flight: spec.max_in_flight,
            lease: nanos(spec.lease),
        }
    }
}

fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

/// What a call does to a key's leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAction {
    /// Take a slot for the request id (at request time).
    Acquire,
    /// Give the request id's slot back (at stream done).
    Release,
    /// Look, changing nothing but dropping expired leases (for `/explain`).
    Peek,
}

impl LeaseAction {
    /// The one-letter code the Redis script reads.
    pub fn code(self) -> &'static str {
        match self {
            LeaseAction::Acquire => "a",
            LeaseAction::Release => "r",
            LeaseAction::Peek => "p",
        }
    }
}

/// What became of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// A slot was free: the request id holds it until released or its lease ends.
    Taken,
    /// The request id held a lease on this key already: renewed, no second slot taken.
    Renewed,
    /// Every slot is held: nothing taken.
    Denied,
    /// The request id's lease was removed: its slot is free.
    Released,
    /// The request id held no lease: nothing changed.
    Unknown,
    /// Looked at.
    Peeked,
}

impl LeaseOutcome {
    /// Every outcome, by its code (the Redis script answers with the index).
    pub const ALL: [LeaseOutcome; 6] = [
        LeaseOutcome::Taken,
        LeaseOutcome::Renewed,
        LeaseOutcome::Denied,
        LeaseOutcome::Released,
        LeaseOutcome::Unknown,
        LeaseOutcome::Peeked,
    ];

    pub fn from_code(code: i64) -> Option<LeaseOutcome> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }
}

/// The answer of one call on a key's leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAnswer {
    pub outcome: LeaseOutcome,
    /// Leases held once the call is done.
    pub in_use: u32,
    /// Leases found expired (and dropped) by this call.
    pub expired: u32,
    /// When the soonest-ending held lease ends, if any.
    pub next_end: Option<Nanos>,
}

impl LeaseAnswer {
    /// Whether the call let its request go ahead (a release or a look always does).
    pub fn allowed(&self) -> bool {
        self.outcome != LeaseOutcome::Denied
    }

    /// Slots still free for `params`.
    pub fn free(&self, params: &LeaseParams) -> u32 {
        params.max_in_flight.saturating_sub(self.in_use)
    }
}

/// Told of leases that ended unreleased outside a decision (a memory sweep), so the per-rule
/// metrics that count them stay true.
pub trait LeaseWatch: Send + Sync {
    fn expired(&self, leases: u32);
}

/// A [`LeaseWatch`] as the store keeps it beside a key's leases.
pub type Watch = Arc<dyn LeaseWatch>;

/// One lease: the digest of its request id, and when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    id: u128,
    ends_at: Nanos,
}

/// The leases of one key: at most `max_in_flight` of them (as it was when each was taken), so a
/// key costs 32 bytes per request in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leases {
    held: Vec<Lease>,
}

impl Leases {
    /// Runs `action` for request id `id` (its digest) at `now`: expired leases go first.
    pub fn apply(
        &mut self,
        action: LeaseAction,
        id: u128,
        params: &LeaseParams,
        now: Nanos,
    ) -> LeaseAnswer {
        let expired = self.expire(now);
        let ends_at = now.saturating_add(params.lease);
        let outcome = match action {
            LeaseAction::Acquire => match self.held.iter().position(|l| l.id == id) {
                Some(at) => {
                    self.held[at].ends_at = ends_at;
                    LeaseOutcome::Renewed
                }
                None if self.held.len() >= params.max_in_flight as usize => LeaseOutcome::Denied,
                None => {
                    self.held.push(Lease { id, ends_at });
                    LeaseOutcome::Taken
                }
            },
            LeaseAction::Release => match self.held.iter().position(|l| l.id == id) {
                Some(at) => {
                    self.held.swap_remove(at);
                    LeaseOutcome::Released
                }
                None => LeaseOutcome::Unknown,
            },
            LeaseAction::Peek => LeaseOutcome::Peeked,
        };
        LeaseAnswer {
            outcome,
            in_use: self.in_use(),
            expired,
            next_end: self.held.iter().map(|l| l.ends_at).min(),
        }
    }

    /// Drops the leases that have ended by `now`; returns how many.
    pub fn expire(&mut self, now: Nanos) -> u32 {
        let before = self.held.len();
        self.held.retain(|l| l.ends_at > now);
        u32::try_from(before - self.held.len()).unwrap_or(u32::MAX)
    }

    /// Leases held (expired ones included until the next call or sweep drops them).
    pub fn in_use(&self) -> u32 {
        u32::try_from(self.held.len()).unwrap_or(u32::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests;
