//! A request whose keys span Redis Cluster slots: one compare-and-set per slot, sent side by side,
//! and the all-or-nothing rule kept across them. Each slot's call is atomic and writes only if the
//! request's charges there fit, so the request is admitted only once every slot took its charge:
//! it never over-admits. When a slot's keys changed under it, the request is decided again on
//! what they hold; if it is now denied, the slots that already took their charge give it back
//! (`limiter::uncharge`, compare-and-set again). Until then other requests see that charge: a
//! brief over-denial, at most this request's hits, for about one round trip.

use smallvec::SmallVec;

use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::{self, LimitParams, State};
use ratelimit_core::store::{Charge, StoreError, Verdicts, decide};

use crate::cas::{Raw, decode, states};
use crate::key::{TextKey, distinct};
use crate::retry::{MAX_ATTEMPTS, before_retry};
use crate::slot::slot;
use crate::writer::Writer;

/// Per key (by position in the request's distinct keys), the state to write (`None`: unchanged).
type Changes = SmallVec<[Option<State>; 4]>;

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

impl Part {
    fn new(first: usize) -> Part {
        Part {
            members: [first].into_iter().collect(),
            ours: None,
            taken: Vec::new(),
            verified: false,
        }
    }

    /// Whether this attempt's decision writes any of the slot's keys.
    fn writes(&self, new: &Changes) -> bool {
        self.members.iter().any(|&i| new[i].is_some())
    }
}

/// What to send one slot.
enum Send {
    /// Check the keys hold what the decision assumed, and write the request's charge (if any).
    Apply,
    /// Take our charge back.
    Undo,
}

/// One attempt's request and decision, which the slots' answers are read against.
struct Round<'a> {
    keys: &'a [TextKey],
    charges: &'a [Charge<TextKey>],
    /// (charge index, state to store) of the decision.
    writes: &'a [(usize, State)],
    new: &'a Changes,
}

/// Decides one request whose keys span slots.
pub(crate) async fn spread(
    writer: &Writer,
    charges: &[Charge<TextKey>],
    now: Nanos,
) -> Result<Verdicts, StoreError> {
    let keys = distinct(charges);
    let mut parts = by_slot(&keys);
    // What each key holds without our charge.
    let mut expected = writer.expected(&keys, now);
    for attempt in 0..MAX_ATTEMPTS {
        let stored = states(&expected);
        let decision = decide(charges, now, |k| position(&keys, k).and_then(|i| stored[i]));
        let new = changes(&keys, charges, &decision.writes, &stored);
        let sends = to_send(&parts, &new);
        if sends.is_empty() {
            return Ok(decision.verdicts);
        }
        let answers = send(writer, &keys, &parts, &sends, &expected, &new, now).await;
        let round = Round {
            keys: &keys,
            charges,
            writes: &decision.writes,
            new: &new,
        };
        let mut conflicted = false;
        for ((n, send), answer) in sends.iter().zip(answers) {
            let part = &mut parts[*n].1;
            conflicted |= settle(part, send, answer?, &mut expected, &round);
        }
        if conflicted {
            before_retry(attempt).await;
        }
    }
    writer.calls().metrics().error("conflict_exhausted");
    Err(StoreError::Contention(MAX_ATTEMPTS))
}

/// The request's keys grouped by slot, in order of first appearance.
fn by_slot(keys: &[TextKey]) -> Vec<(u16, Part)> {
    let mut parts: Vec<(u16, Part)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let s = slot(k.as_str().as_bytes());
        match parts.iter_mut().find(|(p, _)| *p == s) {
            Some((_, part)) => part.members.push(i),
            None => parts.push((s, Part::new(i))),
        }
    }
    parts
}

fn position(keys: &[TextKey], key: &TextKey) -> Option<usize> {
    keys.iter().position(|k| k == key)
}

/// Per key, the state the decision writes there if it differs from the stored one.
fn changes(
    keys: &[TextKey],
    charges: &[Charge<TextKey>],
    writes: &[(usize, State)],
    stored: &[Option<State>],
) -> Changes {
    let mut new: Changes = SmallVec::from_elem(None, keys.len());
    for (index, state) in writes {
        if let Some(i) = position(keys, &charges[*index].key)
            && Some(*state) != stored[i]
        {
            new[i] = Some(*state);
        }
    }
    new
}

/// The slots to call this attempt, and what to send each.
fn to_send(parts: &[(u16, Part)], new: &Changes) -> Vec<(usize, Send)> {
    parts
        .iter()
        .enumerate()
        .filter_map(|(n, (_, part))| {
            match (&part.ours, part.writes(new)) {
                // Our charge stands: same states without it, same `now`, same writes.
                (Some(_), true) => None,
                (Some(_), false) => Some((n, Send::Undo)),
                (None, false) if part.verified => None,
                (None, _) => Some((n, Send::Apply)),
            }
        })
        .collect()
}

/// Sends each slot its compare-and-set, side by side; the answers in the order of `sends`.
async fn send(
    writer: &Writer,
    keys: &[TextKey],
    parts: &[(u16, Part)],
    sends: &[(usize, Send)],
    expected: &Raw,
    new: &Changes,
    now: Nanos,
) -> Vec<Result<Result<Raw, Raw>, StoreError>> {
    let calls = sends.iter().map(|(n, send)| {
        let part = &parts[*n].1;
        let part_keys: SmallVec<[TextKey; 4]> =
            part.members.iter().map(|&i| keys[i].clone()).collect();
        let (held, writes): (Raw, Changes) = match send {
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
            writer
                .compare_and_set(&part_keys, &held, &writes, now)
                .await
        }
    });
    futures_util::future::join_all(calls).await
}

/// Reads one slot's answer into its part and `expected`; whether it conflicted.
fn settle(
    part: &mut Part,
    send: &Send,
    answer: Result<Raw, Raw>,
    expected: &mut Raw,
    round: &Round<'_>,
) -> bool {
    match (send, answer) {
        (Send::Apply, Ok(written)) => {
            if part.writes(round.new) {
                part.ours = Some(written);
                part.taken = taken(part, round);
            } else {
                part.verified = true;
            }
            false
        }
        (Send::Apply, Err(current)) => {
            part.verified = false;
            for (&i, value) in part.members.iter().zip(current) {
                expected[i] = value;
            }
            true
        }
        (Send::Undo, Ok(left)) => {
            part.ours = None;
            part.verified = true;
            for (&i, value) in part.members.iter().zip(left) {
                expected[i] = value;
            }
            false
        }
        (Send::Undo, Err(current)) => {
            part.ours = Some(current);
            true
        }
    }
}

/// The charges the decision's write took in this slot: (key, limit, hits).
fn taken(part: &Part, round: &Round<'_>) -> Vec<(TextKey, LimitParams, u64)> {
    round
        .writes
        .iter()
        .map(|(i, _)| &round.charges[*i])
        .filter(|c| part.members.iter().any(|&m| round.keys[m] == c.key))
        .map(|c| (c.key.clone(), c.params, c.hits))
        .collect()
}

/// The states of `keys` (holding `held`, our charge among them) with the charges we `took` at
/// `now` given back (`None` where nothing changes).
fn without(
    keys: &[TextKey],
    held: &Raw,
    took: &[(TextKey, LimitParams, u64)],
    now: Nanos,
) -> Changes {
    keys.iter()
        .zip(held)
        .map(|(key, raw)| {
            let before = raw.as_deref().and_then(decode)?;
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
