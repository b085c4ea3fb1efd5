//! Which buckets a round of the RLQS demand exchange writes, reads and deletes, and what this
//! instance takes from the answers (pure: the table's changes, the round's start and the store's
//! answers are passed in). The plan keeps what it published between rounds and takes only what
//! the table says moved ([`Plan::take`]), so a round costs the buckets that changed and the
//! entries due a rewrite, not every bucket. A bucket at rest costs no call: its demand is the one
//! this instance last wrote, and no instance moved since this one last read (the moves counter
//! is where this instance left it, the same instances are alive, nothing failed). A bucket whose
//! demand changed is written and read at once, and the round then increments the moves counter;
//! when any other instance moved, every bucket held is read again. Entries at rest are written
//! again every `HELD_MS` / 4 to / 2 (`quota::fraction::vouched`: they count while their instance
//! beats), spread over the buckets, found by their deadlines (`quota::Deadlines`); a bucket this
//! instance stopped holding has its entry deleted (until that succeeds).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::Arc;

use ratelimit_core::quota::Deadlines;
use ratelimit_core::quota::fraction::{self, HELD_MS, InstanceId};

use super::coordinate::Seen;
use super::table::BucketKey;

/// What the table says moved since the last round: each bucket's demand now, or `None` where
/// this instance holds it no more.
pub(crate) type Demands = [(Arc<BucketKey>, Option<f64>)];

/// What a round asks of one bucket's hash.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Call {
    /// Write this instance's demand (and renew the hash's TTL).
    pub(crate) write: Option<f64>,
    /// Read every instance's entry, after the write.
    pub(crate) read: bool,
    /// Delete this instance's entry.
    pub(crate) delete: bool,
}

const DELETE: Call = Call {
    write: None,
    read: false,
    delete: true,
};

/// How a round started, read from the store.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Begun {
    /// The instances' beats, this one's written in this round (its time is the round's).
    pub(crate) instances: Seen,
    /// The moves counter (`None`: not there).
    pub(crate) moves: Option<u64>,
    /// This instance's beat was not there before: its entries may be gone too.
    pub(crate) new: bool,
}

/// A bucket as the plan's maps hold it: its key with the key's hash, taken once when the table
/// hands the bucket over, so the maps hash a number, not the bucket's strings, at each lookup.
#[derive(Debug, Clone)]
struct Key {
    hash: u64,
    key: Arc<BucketKey>,
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.hash == other.hash && (Arc::ptr_eq(&self.key, &other.key) || self.key == other.key)
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// One bucket of a round: what to ask, and why.
#[derive(Debug, Clone, PartialEq)]
struct Asked {
    /// The bucket's hash (its `Key` with the call's key).
    hash: u64,
    /// This instance's demand now.
    demand: f64,
    /// The demand differs from the one written (or the bucket is new): the others must read it.
    changed: bool,
}

/// One round's calls: the deletes, to send first, then the others.
#[derive(Debug, Default)]
pub(crate) struct Round {
    pub(crate) deletes: Vec<(Arc<BucketKey>, Call)>,
    pub(crate) calls: Vec<(Arc<BucketKey>, Call)>,
    /// Each delete's hash.
    deleted: Vec<u64>,
    asked: Vec<Asked>,
}

impl Round {
    fn ask(&mut self, key: &Key, held: &Held, write: bool, read: bool, changed: bool) {
        self.calls.push((
            key.key.clone(),
            Call {
                write: write.then_some(held.demand),
                read,
                delete: false,
            },
        ));
        self.asked.push(Asked {
            hash: key.hash,
            demand: held.demand,
            changed,
        });
    }
}

/// What a round gave: the fractions of the buckets read, the instances alive, the calls made
/// and those that failed, and whether the others must be told (the moves counter incremented).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Settled {
    pub(crate) fractions: Vec<(Arc<BucketKey>, f64)>,
    pub(crate) alive: usize,
    pub(crate) asked: usize,
    pub(crate) failed: u64,
    pub(crate) announce: bool,
}

/// A bucket this instance holds (an open stream reports it and its rule limits it).
#[derive(Debug)]
struct Held {
    /// Its demand now, as the table last said.
    demand: f64,
    /// The demand last written with success (NaN: none yet).
    written: f64,
}

/// The exchange's memory between rounds.
#[derive(Default)]
pub(crate) struct Plan {
    /// How a bucket's [`Key`] hash is taken.
    hasher: RandomState,
    held: HashMap<Key, Held>,
    /// The held buckets whose demand is not the one written (new, changed, or its write failed):
    /// written and read at the next round. Always those whose `written` is not their `demand`.
    unwritten: HashSet<Key>,
    /// Buckets no longer held whose entry is still to be deleted.
    gone: HashSet<Key>,
    /// When each written entry is to be written again though unchanged, on the store's clock
    /// (milliseconds).
    rewrites: Deadlines<Key>,
    /// The moves counter as this instance left it.
    moves: Option<u64>,
    /// The instances alive at the last round.
    alive: Vec<InstanceId>,
    /// The next round reads every bucket (a failure, or the counter moved under this instance's
    /// own increment).
    full: bool,
    /// An increment of the moves counter failed: owed still.
    owed: bool,
}

/// When an entry written at `now_ms` is due again: between `HELD_MS` / 4 and / 2 later, spread
/// over the buckets by their hash, so entries written in one round are not all due in one.
fn due(key: &Key, now_ms: u64) -> u64 {
    now_ms + HELD_MS / 4 + key.hash % (HELD_MS / 4)
}

impl Plan {
    /// Takes what the table says moved (`Table::demands`): a demand other than the one written
    /// is to be written; a bucket no longer held has its entry deleted. Taken before the round
    /// starts, so a round that fails as a whole loses none of it.
    pub(crate) fn take(&mut self, demands: &Demands) {
        for (key, demand) in demands {
            let key = &Key {
                hash: self.hasher.hash_one(&**key),
                key: key.clone(),
            };
            match demand {
                Some(demand) => {
                    self.gone.remove(key);
                    let held = self.held.entry(key.clone()).or_insert(Held {
                        demand: *demand,
                        written: f64::NAN,
                    });
                    held.demand = *demand;
                    if held.written == *demand {
                        self.unwritten.remove(key);
                    } else {
                        self.unwritten.insert(key.clone());
                    }
                }
                None => {
                    if self.held.remove(key).is_some() {
                        self.unwritten.remove(key);
                        self.rewrites.remove(key);
                        self.gone.insert(key.clone());
                    }
                }
            }
        }
    }

    /// Whether a round would read every bucket as things stand (for tests and `settle`).
    fn reads_all(&self, instance: InstanceId, begun: &Begun) -> bool {
        let alive = fraction::alive(instance, &begun.instances.peers, begun.instances.now_ms);
        self.full
            || self.held.is_empty()
            || begun.new
            || begun.moves.is_none()
            || begun.moves != self.moves
            || alive != self.alive
    }

    /// The calls of a round that started as `begun`, for the buckets taken so far: the deletes
    /// owed, the buckets whose demand is unwritten (written and read), the entries due a rewrite
    /// (written only) and, when another instance moved, every other bucket held (read only).
    pub(crate) fn round(&mut self, instance: InstanceId, begun: &Begun) -> Round {
        if begun.new {
            // The store may have lost this instance's entries: every one is written again.
            for (key, held) in &mut self.held {
                held.written = f64::NAN;
                self.unwritten.insert(key.clone());
            }
        }
        let all = self.reads_all(instance, begun);
        self.full = false;
        self.alive = fraction::alive(instance, &begun.instances.peers, begun.instances.now_ms);
        let now = begun.instances.now_ms;
        let due = self.rewrites.due(now);
        let mut round = Round::default();
        for key in &self.gone {
            round.deletes.push((key.key.clone(), DELETE));
            round.deleted.push(key.hash);
        }
        if all {
            let due: HashSet<&Key> = due.iter().collect();
            for (key, held) in &self.held {
                let changed = self.unwritten.contains(key);
                round.ask(key, held, changed || due.contains(key), true, changed);
            }
        } else {
            for key in &self.unwritten {
                if let Some(held) = self.held.get(key) {
                    round.ask(key, held, true, true, true);
                }
            }
            for key in &due {
                if let Some(held) = self.held.get(key)
                    && !self.unwritten.contains(key)
                {
                    round.ask(key, held, true, false, false);
                }
            }
        }
        round
    }

    /// Takes the answers of `round` (per call, `None` where it failed, else what its hash held
    /// where it was read): this instance's fraction of each bucket read, at the round's time.
    pub(crate) fn settle(
        &mut self,
        instance: InstanceId,
        begun: &Begun,
        round: &Round,
        deleted: &[Option<Option<Seen>>],
        answers: &[Option<Option<Seen>>],
    ) -> Settled {
        let now = begun.instances.now_ms;
        let beats = &begun.instances.peers;
        let mut settled = Settled {
            alive: self.alive.len().max(1),
            asked: round.deletes.len() + round.calls.len(),
            announce: self.owed,
            ..Settled::default()
        };
        for (i, ((key, _), hash)) in round.deletes.iter().zip(&round.deleted).enumerate() {
            match deleted.get(i) {
                Some(Some(_)) => {
                    self.gone.remove(&Key {
                        hash: *hash,
                        key: key.clone(),
                    });
                    settled.announce = true;
                }
                _ => settled.failed += 1,
            }
        }
        for (i, ((bucket, call), asked)) in round.calls.iter().zip(&round.asked).enumerate() {
            let key = &Key {
                hash: asked.hash,
                key: bucket.clone(),
            };
            let Some(Some(answer)) = answers.get(i) else {
                settled.failed += 1;
                if call.write.is_some() && !self.unwritten.contains(key) {
                    // A rewrite that failed: due again at the next round.
                    self.rewrites.schedule(key.clone(), now);
                }
                continue;
            };
            if let (Some(demand), Some(held)) = (call.write, self.held.get_mut(key)) {
                held.written = demand;
                if held.written == held.demand {
                    self.unwritten.remove(key);
                }
                self.rewrites.remove(key);
                self.rewrites.schedule(key.clone(), due(key, now));
                settled.announce |= asked.changed;
            }
            if let Some(seen) = answer {
                let peers = fraction::vouched(&seen.peers, beats, seen.now_ms);
                settled.fractions.push((
                    bucket.clone(),
                    fraction::fraction(instance, asked.demand, &peers, seen.now_ms),
                ));
            }
        }
        if settled.failed > 0 {
            // Whatever was not read is read at the next round.
            self.full = true;
        }
        self.moves = begun.moves;
        settled
    }

    /// The moves counter after this instance's increment (`None`: the increment failed, owed to
    /// the next round). Counted past by another instance meanwhile: the next round reads all.
    pub(crate) fn announced(&mut self, begun: &Begun, moves: Option<u64>) {
        match moves {
            Some(moves) => {
                self.owed = false;
                if moves != begun.moves.unwrap_or(0) + 1 {
                    self.full = true;
                }
                self.moves = Some(moves);
            }
            None => {
                self.owed = true;
                self.full = true;
            }
        }
    }

    /// A round that failed as a whole: the next reads every bucket.
    pub(crate) fn failed(&mut self) {
        self.full = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::quota::fraction::Peer;

    fn key(name: &str) -> Arc<BucketKey> {
        Arc::new(("d".to_owned(), vec![("k".to_owned(), name.to_owned())]))
    }

    fn peer(instance: InstanceId, demand: f64, at_ms: u64) -> Peer {
        Peer {
            instance,
            demand,
            at_ms,
        }
    }

    fn begun(now: u64, moves: Option<u64>, beats: Vec<Peer>) -> Begun {
        Begun {
            instances: Seen {
                now_ms: now,
                peers: beats,
            },
            moves,
            new: false,
        }
    }

    /// The table's changes: each bucket's demand now.
    fn held(demands: &[(&Arc<BucketKey>, f64)]) -> Vec<(Arc<BucketKey>, Option<f64>)> {
        demands
            .iter()
            .map(|(k, d)| ((*k).clone(), Some(*d)))
            .collect()
    }

    /// Answers every call: a read finds `peers`.
    fn answer(round: &Round, now: u64, peers: &[Peer]) -> Vec<Option<Option<Seen>>> {
        round
            .calls
            .iter()
            .map(|(_, c)| {
                Some(c.read.then(|| Seen {
                    now_ms: now,
                    peers: peers.to_vec(),
                }))
            })
            .collect()
    }

    /// The calls by bucket name, in name order (a round's order is the plan's sets').
    fn names(calls: &[(Arc<BucketKey>, Call)]) -> Vec<(String, Call)> {
        let mut names: Vec<_> = calls.iter().map(|(k, c)| (k.1[0].1.clone(), *c)).collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        names
    }

    fn sorted(mut fractions: Vec<(Arc<BucketKey>, f64)>) -> Vec<(Arc<BucketKey>, f64)> {
        fractions.sort_by(|a, b| a.0.cmp(&b.0));
        fractions
    }

    const WRITE_READ: fn(f64) -> Call = |d| Call {
        write: Some(d),
        read: true,
        delete: false,
    };
    const READ: Call = Call {
        write: None,
        read: true,
        delete: false,
    };
    const REWRITE: fn(f64) -> Call = |d| Call {
        write: Some(d),
        read: false,
        delete: false,
    };

    /// A plan at rest after a first round of `demands` at `now` (counter 1 → 2, one instance).
    fn at_rest(demands: &[(&Arc<BucketKey>, f64)], now: u64) -> Plan {
        let mut plan = Plan::default();
        plan.take(&held(demands));
        let first = begun(now, Some(1), vec![peer(1, 0.0, now)]);
        let round = plan.round(1, &first);
        plan.settle(1, &first, &round, &[], &answer(&round, now, &[]));
        plan.announced(&first, Some(2));
        plan
    }

    fn rest(now: u64) -> Begun {
        begun(now, Some(2), vec![peer(1, 0.0, now)])
    }

    #[test]
    fn buckets_at_rest_cost_no_call_and_a_changed_one_is_written_read_and_told() {
        let mut plan = Plan::default();
        let (a, b) = (key("a"), key("b"));
        let me = vec![peer(1, 0.0, 10_000)];
        // First round: everything written and read, and the others told.
        plan.take(&held(&[(&a, 2.0), (&b, 1.0)]));
        let first = begun(10_000, None, me.clone());
        let round = plan.round(1, &first);
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), WRITE_READ(2.0)), ("b".into(), WRITE_READ(1.0))]
        );
        let settled = plan.settle(1, &first, &round, &[], &answer(&round, 10_000, &[]));
        assert_eq!(
            sorted(settled.fractions),
            vec![(a.clone(), 1.0), (b.clone(), 1.0)]
        );
        assert!(settled.announce);
        plan.announced(&first, Some(1));
        // At rest, nobody moved, the table says nothing: no call at all.
        let rest = begun(11_000, Some(1), vec![peer(1, 0.0, 11_000)]);
        plan.take(&[]);
        let round = plan.round(1, &rest);
        assert!(round.calls.is_empty() && round.deletes.is_empty());
        let settled = plan.settle(1, &rest, &round, &[], &[]);
        assert!(!settled.announce && settled.fractions.is_empty());
        assert_eq!(settled.alive, 1);
        // b's demand changes: b alone, written and read, and the others told.
        plan.take(&held(&[(&b, 3.0)]));
        let round = plan.round(1, &rest);
        assert_eq!(names(&round.calls), vec![("b".into(), WRITE_READ(3.0))]);
        let settled = plan.settle(1, &rest, &round, &[], &answer(&round, 11_000, &[]));
        assert!(settled.announce);
        plan.announced(&rest, Some(2));
        let again = begun(12_000, Some(2), vec![peer(1, 0.0, 12_000)]);
        assert!(plan.round(1, &again).calls.is_empty());
    }

    #[test]
    fn a_bucket_the_table_marks_with_the_demand_written_costs_no_call() {
        let (a, b) = (key("a"), key("b"));
        let mut plan = at_rest(&[(&a, 2.0), (&b, 1.0)], 0);
        // Marked (its streams moved) but publishing the same demand: nothing to send.
        plan.take(&held(&[(&a, 2.0)]));
        assert!(plan.round(1, &rest(1000)).calls.is_empty());
        // Moved and back between two rounds: nothing either.
        plan.take(&held(&[(&a, 5.0)]));
        plan.take(&held(&[(&a, 2.0)]));
        assert!(plan.round(1, &rest(2000)).calls.is_empty());
        // Moved, and a round later back: written each time.
        plan.take(&held(&[(&a, 5.0)]));
        let round = plan.round(1, &rest(3000));
        assert_eq!(names(&round.calls), vec![("a".into(), WRITE_READ(5.0))]);
        plan.settle(1, &rest(3000), &round, &[], &answer(&round, 3000, &[]));
        plan.announced(&rest(3000), Some(3));
        plan.take(&held(&[(&a, 2.0)]));
        let moved = begun(4000, Some(3), vec![peer(1, 0.0, 4000)]);
        let round = plan.round(1, &moved);
        assert_eq!(names(&round.calls), vec![("a".into(), WRITE_READ(2.0))]);
    }

    #[test]
    fn another_instance_moving_or_coming_or_a_failure_reads_every_bucket_again() {
        let mut plan = Plan::default();
        let (a, b) = (key("a"), key("b"));
        plan.take(&held(&[(&a, 2.0), (&b, 2.0)]));
        let first = begun(100_000, Some(7), vec![peer(1, 0.0, 100_000)]);
        let round = plan.round(1, &first);
        plan.settle(1, &first, &round, &[], &answer(&round, 100_000, &[]));
        plan.announced(&first, Some(8));
        // Another instance incremented the counter: every bucket read, none written.
        let moved = begun(101_000, Some(9), vec![peer(1, 0.0, 101_000)]);
        let round = plan.round(1, &moved);
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), READ), ("b".into(), READ)]
        );
        // Instance 2 holds b with demand 6, written a minute ago, and beats: b's fraction
        // follows it (2 of 8).
        let beats = vec![peer(1, 0.0, 101_000), peer(2, 0.0, 100_900)];
        let moved = begun(101_000, Some(9), beats.clone());
        let answers: Vec<_> = round
            .calls
            .iter()
            .map(|(k, _)| {
                let peers = if k == &b {
                    vec![peer(2, 6.0, 101_000 - 60_000)]
                } else {
                    vec![]
                };
                Some(Some(Seen {
                    now_ms: 101_000,
                    peers,
                }))
            })
            .collect();
        let settled = plan.settle(1, &moved, &round, &[], &answers);
        assert_eq!(
            sorted(settled.fractions),
            vec![(a.clone(), 1.0), (b.clone(), 0.25)]
        );
        assert!(!settled.announce);
        // A new instance alive: every bucket read again (the counter as left).
        let round = plan.round(1, &begun(102_000, Some(9), beats.clone()));
        assert_eq!(round.calls.len(), 2);
        // Now at rest; then a call fails: the next round reads all again.
        let rest = begun(103_000, Some(9), beats.clone());
        plan.settle(1, &rest, &round, &[], &answer(&round, 102_000, &[]));
        assert!(plan.round(1, &rest).calls.is_empty());
        plan.take(&held(&[(&a, 5.0)]));
        let round = plan.round(1, &rest);
        let settled = plan.settle(1, &rest, &round, &[], &[None]);
        assert_eq!((settled.failed, settled.asked), (1, 1));
        let round = plan.round(1, &rest);
        // a still to write (its write failed), b read.
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), WRITE_READ(5.0)), ("b".into(), READ)]
        );
    }

    #[test]
    fn a_round_that_failed_as_a_whole_keeps_what_was_taken_and_reads_all_next() {
        let (a, b) = (key("a"), key("b"));
        let mut plan = at_rest(&[(&a, 1.0), (&b, 1.0)], 0);
        // The table's change is taken, then the round fails before any call (Redis down).
        plan.take(&held(&[(&a, 4.0)]));
        plan.failed();
        let round = plan.round(1, &rest(1000));
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), WRITE_READ(4.0)), ("b".into(), READ)]
        );
    }

    #[test]
    fn a_counter_moved_under_this_instances_increment_or_a_failed_one_reads_all_next() {
        let mut plan = Plan::default();
        let a = key("a");
        plan.take(&held(&[(&a, 1.0)]));
        let me = vec![peer(1, 0.0, 0)];
        let first = begun(0, Some(3), me.clone());
        let round = plan.round(1, &first);
        plan.settle(1, &first, &round, &[], &answer(&round, 0, &[]));
        // Another instance incremented between this one's GET and INCR: 5, not 4.
        plan.announced(&first, Some(5));
        assert_eq!(
            plan.round(1, &begun(1000, Some(5), me.clone())).calls.len(),
            1
        );
        // A failed increment is owed, and the next round reads all.
        let rest = begun(2000, Some(5), me.clone());
        let round = plan.round(1, &rest);
        assert!(round.calls.is_empty());
        plan.settle(1, &rest, &round, &[], &[]);
        plan.announced(&rest, None);
        let round = plan.round(1, &rest);
        assert_eq!(round.calls.len(), 1);
        let settled = plan.settle(1, &rest, &round, &[], &answer(&round, 2000, &[]));
        assert!(settled.announce, "the owed increment");
    }

    #[test]
    fn entries_at_rest_are_written_again_before_they_stop_counting_and_dropped_ones_deleted() {
        let (a, b) = (key("a"), key("b"));
        let mut plan = at_rest(&[(&a, 1.0), (&b, 1.0)], 0);
        assert!(plan.round(1, &rest(HELD_MS / 4 - 1)).calls.is_empty());
        // By HELD_MS / 2 each is written again, unchanged, and not read: nobody is told.
        let round = plan.round(1, &rest(HELD_MS / 2));
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), REWRITE(1.0)), ("b".into(), REWRITE(1.0))]
        );
        let settled = plan.settle(1, &rest(HELD_MS / 2), &round, &[], &answer(&round, 0, &[]));
        assert!(!settled.announce);
        // Not due again before another HELD_MS / 4.
        assert!(
            plan.round(1, &rest(HELD_MS / 2 + HELD_MS / 4 - 1))
                .calls
                .is_empty()
        );
        // b no longer held: its entry deleted, until that succeeds; then the others are told.
        plan.take(&[(b.clone(), None)]);
        let now = HELD_MS / 2 + 1000;
        let round = plan.round(1, &rest(now));
        assert_eq!(names(&round.deletes), vec![("b".into(), DELETE)]);
        let settled = plan.settle(1, &rest(now), &round, &[None], &[]);
        assert_eq!(settled.failed, 1);
        let round = plan.round(1, &rest(now + 1000));
        assert_eq!(round.deletes.len(), 1);
        let settled = plan.settle(
            1,
            &rest(now + 1000),
            &round,
            &[Some(None)],
            &answer(&round, 0, &[]),
        );
        assert!(settled.announce);
        plan.announced(&rest(now + 1000), Some(3));
        let later = begun(now + 2000, Some(3), vec![peer(1, 0.0, now + 2000)]);
        let round = plan.round(1, &later);
        assert!(round.deletes.is_empty() && round.calls.is_empty());
        // b's entry is no longer rewritten: by HELD_MS only a is.
        let round = plan.round(1, &begun(HELD_MS + 1, Some(3), vec![peer(1, 0.0, HELD_MS)]));
        assert_eq!(names(&round.calls), vec![("a".into(), REWRITE(1.0))]);
    }

    #[test]
    fn a_failed_rewrite_is_due_again_at_the_next_round() {
        let a = key("a");
        let mut plan = at_rest(&[(&a, 1.0)], 0);
        let round = plan.round(1, &rest(HELD_MS / 2));
        assert_eq!(names(&round.calls), vec![("a".into(), REWRITE(1.0))]);
        plan.settle(1, &rest(HELD_MS / 2), &round, &[], &[None]);
        // The failure reads all, and writes a again.
        let round = plan.round(1, &rest(HELD_MS / 2 + 1000));
        assert_eq!(
            names(&round.calls),
            vec![(
                "a".into(),
                Call {
                    write: Some(1.0),
                    read: true,
                    delete: false
                }
            )]
        );
    }

    #[test]
    fn a_bucket_held_again_before_its_delete_went_through_is_written_not_deleted() {
        let a = key("a");
        let mut plan = at_rest(&[(&a, 1.0)], 0);
        plan.take(&[(a.clone(), None)]);
        let round = plan.round(1, &rest(1000));
        assert_eq!(round.deletes.len(), 1);
        plan.settle(1, &rest(1000), &round, &[None], &[]);
        // Held again (a stream opened for it), by another `Arc` of the same key.
        plan.take(&[(key("a"), Some(1.0))]);
        let round = plan.round(1, &rest(2000));
        assert!(round.deletes.is_empty());
        assert_eq!(names(&round.calls), vec![("a".into(), WRITE_READ(1.0))]);
        // Unheld when it was never held: nothing to delete.
        plan.take(&[(key("z"), None)]);
        assert!(plan.round(1, &rest(3000)).deletes.is_empty());
    }

    #[test]
    fn a_beat_that_was_not_there_writes_every_entry_again() {
        let a = key("a");
        let mut plan = at_rest(&[(&a, 1.0)], 0);
        // Redis restarted empty: no counter, this instance's beat new.
        let mut lost = begun(1000, None, vec![peer(1, 0.0, 1000)]);
        lost.new = true;
        let round = plan.round(1, &lost);
        assert_eq!(names(&round.calls), vec![("a".into(), WRITE_READ(1.0))]);
        let settled = plan.settle(1, &lost, &round, &[], &answer(&round, 1000, &[]));
        assert!(settled.announce);
    }
}
