//! The answers while the remote backend cannot decide, by the operator's failure mode: the local
//! memory backend (after the outage's hand-over, `hand_over`), allow or deny every charge
//! ([`fixed`]), or an error. Concurrency leases alike: the local mode keeps them in the local
//! memory backend (this instance's own slots, up to the full limit, released only through this
//! instance; leases held in the remote store are not seen and end there by their lease), allow
//! and deny take and give back nothing.

use std::sync::atomic::Ordering;

use ratelimit_core::clock::Nanos;
use ratelimit_core::lease::{LeaseAction, LeaseAnswer, LeaseOutcome};
use ratelimit_core::limiter::{self, Outlook};
use ratelimit_core::store::{Charge, LeaseCall, StoreError, Transaction, Verdict, Verdicts};

use super::{BREAKER_MAX, Guarded, KeyOf};
use crate::mode::{FailureMode, LocalShare};
use crate::remote::Connect;

impl<C: Connect> Guarded<C> {
    /// The answer while the remote backend cannot decide; `cause`: this decision's own call's
    /// error, if it made one (none while the breaker is open).
    pub(super) fn fallback(
        &self,
        tx: Transaction<'_, KeyOf<C>>,
        cause: Option<StoreError>,
    ) -> Result<Verdicts, StoreError> {
        if tx.is_refund() {
            self.shared.local.run(tx);
            return Ok(Verdicts::new());
        }
        let mode = self.shared.mode;
        self.shared
            .metrics
            .failure_mode_decisions
            .with_label_values(&[mode.name()])
            .inc();
        match mode {
            FailureMode::Local => {
                self.hand_over(&tx);
                let verdicts = self.shared.local.run(tx);
                self.count_outage_use(&tx, &verdicts);
                Ok(verdicts)
            }
            FailureMode::Allow => Ok(fixed(tx.charges, tx.now, true)),
            FailureMode::Deny => Ok(fixed(tx.charges, tx.now, false)),
            FailureMode::Error => Err(self.failed(cause)),
        }
    }

    /// The failure mode `error`'s answer: the call's own error when it made one (Redis may have
    /// answered it, e.g. a key of another type); else, with the breaker open, the last error the
    /// backend's calls and probes failed with (a Redis out of memory answers every probe), or
    /// that it is unreachable.
    fn failed(&self, cause: Option<StoreError>) -> StoreError {
        let name = &self.shared.name;
        StoreError::Unavailable(match (cause, self.shared.last_error()) {
            (Some(e), _) => format!(
                "{} call failed: {e} ({}_FAILURE_MODE=error)",
                name.title, name.upper
            ),
            (None, Some(last)) => format!(
                "{} is down, its calls failing (the last: {last}) ({}_FAILURE_MODE=error)",
                name.title, name.upper
            ),
            (None, None) => format!(
                "{} is unreachable ({}_FAILURE_MODE=error)",
                name.title, name.upper
            ),
        })
    }

    /// The answer to a lease call while the remote backend cannot decide (`cause` as for
    /// [`Guarded::fallback`]).
    pub(super) fn lease_fallback(
        &self,
        call: &LeaseCall<'_, KeyOf<C>>,
        cause: Option<StoreError>,
    ) -> Result<LeaseAnswer, StoreError> {
        let mode = self.shared.mode;
        if call.action == LeaseAction::Acquire {
            self.shared
                .metrics
                .failure_mode_decisions
                .with_label_values(&[mode.name()])
                .inc();
        }
        let fixed = |outcome| LeaseAnswer {
            outcome,
            in_use: 0,
            expired: 0,
            next_end: None,
        };
        match (mode, call.action) {
            (FailureMode::Local, _) => Ok(self.shared.local.lease_now(call)),
            // Let through without a slot to keep: nothing to give back, nothing counted in use.
            (FailureMode::Allow, LeaseAction::Acquire) => Ok(fixed(LeaseOutcome::Renewed)),
            (FailureMode::Deny, LeaseAction::Acquire) => Ok(fixed(LeaseOutcome::Denied)),
            (FailureMode::Allow | FailureMode::Deny, LeaseAction::Release) => {
                Ok(fixed(LeaseOutcome::Unknown))
            }
            (FailureMode::Allow | FailureMode::Deny, LeaseAction::Peek) => {
                Ok(fixed(LeaseOutcome::Peeked))
            }
            (FailureMode::Error, _) => Err(self.failed(cause)),
        }
    }

    /// This instance's share of what each limit has left, while the local failure mode decides.
    pub(super) fn share(&self) -> f64 {
        match self.shared.share {
            LocalShare::Fixed(share) => share,
            LocalShare::Auto => {
                1.0 / self.shared.live_instances.load(Ordering::Relaxed).max(1) as f64
            }
        }
    }
}

/// Allow or deny every charge, charging nothing.
fn fixed<K>(charges: &[Charge<K>], now: Nanos, allowed: bool) -> Verdicts {
    charges
        .iter()
        .map(|c| {
            let fresh = limiter::evaluate(&c.params, None, now, c.hits).without_charge;
            let outlook = if allowed {
                fresh
            } else {
                Outlook {
                    remaining: 0,
                    reset_after: BREAKER_MAX.as_nanos() as Nanos,
                }
            };
            Verdict {
                allowed,
                outlook,
                remaining_before: outlook.remaining,
                charged: false,
                delay: 0,
                retry_after: if allowed {
                    0
                } else {
                    BREAKER_MAX.as_nanos() as Nanos
                },
            }
        })
        .collect()
}
