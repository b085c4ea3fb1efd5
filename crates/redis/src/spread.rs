//! A request whose keys span Redis Cluster slots: one compare-and-set per slot, sent side by side,
//! and the all-or-nothing rule kept across them. Each slot's call is atomic and writes only if the
//! request's charges there fit, so the request is admitted only once every slot took its charge:
//! it never over-admits. When a slot's keys changed under it, the request is decided again on
//! what they hold; if it is now denied, the slots that already took their charge give it back
//! (`limiter::uncharge`, compare-and-set again). Until then other requests see that charge: a
//! brief over-denial, at most this request's hits, for about one round trip.

use smallvec::SmallVec;

use super::cas::Raw;
use super::{MAX_ATTEMPTS, Pending, RedisBackend, TextKey, backoff, distinct, slot, states};
use crate::clock::Nanos;
use crate::limiter::{self, LimitParams, State};
use crate::store::{StoreError, Verdicts, decide};

/// One slot's share of the request.
struct Part {
    /// Positions, in the request's distinct keys, of this slot's keys.
    members: SmallVec<[usize; 4]>,
    /// Our charge is in this slot's keys, which last held this (what we wrote, or what we found
    /// on top of it); `None` while it is not.
    ours: Option<Raw>,
    /// The charges our write took here: (key, limit, hits).
    taken: Vec<(TextKey, LimitParams, u64)>,
    /// The slot's keys were seen holding `expected` with nothing of ours in them.
    verified: bool,
}

/// What to send one slot.
enum Send {
    /// Check the keys hold what the decision assumed, and write the request's charge (if any).
    Apply,
    /// Take our charge back.
    Undo,
}

impl RedisBackend {
    /// Decides one request whose keys span slots.
    pub(super) async fn spread(&self, request: &Pending) -> Result<Verdicts, StoreError> {
        let charges = &request.charges;
        let now = request.now;
        let keys = distinct(charges);
        let mut parts: Vec<(u16, Part)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let s = slot(k.as_str().as_bytes());
            match parts.iter_mut().find(|(p, _)| *p == s) {
                Some((_, part)) => part.members.push(i),
                None => parts.push((
                    s,
                    Part {
                        members: [i].into_iter().collect(),
                        ours: None,
                        taken: Vec::new(),
                        verified: false,
                    },
                )),
            }
        }
        // What each key holds without our charge.
        let mut expected = self.expected(&keys, now);
        for attempt in 0..MAX_ATTEMPTS {
            let stored = states(&expected);
            let at = |key: &TextKey| keys.iter().position(|k| k == key);
            let decision = decide(charges, now, |k| at(k).and_then(|i| stored[i]));
            let mut new: SmallVec<[Option<State>; 4]> = SmallVec::from_elem(None, keys.len());
            for (index, state) in &decision.writes {
                if let Some(i) = at(&charges[*index].key)
                    && Some(*state) != stored[i]
                {
                    new[i] = Some(*state);
                }
            }
            let sends: Vec<(usize, Send)> = parts
                .iter()
                .enumerate()
                .filter_map(|(n, (_, part))| {
                    let writes = part.members.iter().any(|&i| new[i].is_some());
                    match (&part.ours, writes) {
                        // Our charge stands: same states without it, same `now`, same writes.
                        (Some(_), true) => None,
                        (Some(_), false) => Some((n, Send::Undo)),
                        (None, false) if part.verified => None,
                        (None, _) => Some((n, Send::Apply)),
                    }
                })
                .collect();
            if sends.is_empty() {
                return Ok(decision.verdicts);
            }
            let calls = sends.iter().map(|(n, send)| {
                let part = &parts[*n].1;
                let part_keys: SmallVec<[TextKey; 4]> =
                    part.members.iter().map(|&i| keys[i].clone()).collect();
                let (held, writes): (Raw, SmallVec<[Option<State>; 4]>) = match send {
                    Send::Apply => (
                        part.members.iter().map(|&i| expected[i].clone()).collect(),
                        part.members.iter().map(|&i| new[i]).collect(),
                    ),
                    Send::Undo => {
                        let held = part.ours.clone().unwrap_or_default();
                        let without = without(&part_keys, &held, &part.taken, now);
                        (held, without)
                    }
                };
                async move {
                    let current = self
                        .compare_and_set(&part_keys, &held, &writes, now)
                        .await?;
                    Ok::<_, StoreError>(current)
                }
            });
            let results = futures_util::future::join_all(calls).await;
            let mut conflicted = false;
            for ((n, send), result) in sends.iter().zip(results) {
                let current = result?;
                let part = &mut parts[*n].1;
                let wrote = part.members.iter().any(|&i| new[i].is_some());
                match (send, current) {
                    (Send::Apply, Ok(written)) => {
                        if wrote {
                            part.ours = Some(written);
                            part.taken = decision
                                .writes
                                .iter()
                                .map(|(i, _)| &charges[*i])
                                .filter(|c| part.members.iter().any(|&m| keys[m] == c.key))
                                .map(|c| (c.key.clone(), c.params, c.hits))
                                .collect();
                        } else {
                            part.verified = true;
                        }
                    }
                    (Send::Apply, Err(current)) => {
                        conflicted = true;
                        part.verified = false;
                        for (&i, value) in part.members.iter().zip(current) {
                            expected[i] = value;
                        }
                    }
                    (Send::Undo, Ok(left)) => {
                        part.ours = None;
                        part.verified = true;
                        for (&i, value) in part.members.iter().zip(left) {
                            expected[i] = value;
                        }
                    }
                    (Send::Undo, Err(current)) => {
                        conflicted = true;
                        part.ours = Some(current);
                    }
                }
            }
            if conflicted && attempt + 1 >= super::FRESH_RETRIES {
                backoff(attempt).await;
            }
        }
        self.inner.metrics.error("conflict_exhausted");
        Err(StoreError::Contention(MAX_ATTEMPTS))
    }
}

/// The states of `keys` (holding `held`, our charge among them) with the charges we `took` at
/// `now` given back (`None` where nothing changes).
fn without(
    keys: &[TextKey],
    held: &Raw,
    took: &[(TextKey, LimitParams, u64)],
    now: Nanos,
) -> SmallVec<[Option<State>; 4]> {
    keys.iter()
        .zip(held)
        .map(|(key, raw)| {
            let before = raw.as_deref().and_then(super::decode)?;
            let mut state = before;
            for (k, params, hits) in took {
                if k == key {
                    state = limiter::uncharge(params, &state, now, *hits);
                }
            }
            (state != before).then_some(state)
        })
        .collect()
}
