//! Which buckets a round of the RLQS demand exchange writes, reads and deletes, and what this
//! instance takes from the answers (pure: the round's start and the store's answers are passed
//! in). A bucket at rest costs no call: its demand is the one this instance last wrote, and no
//! instance moved since this one last read (the moves counter is where this instance left it,
//! the same instances are alive, nothing failed). A bucket whose demand changed is written and
//! read at once, and the round then increments the moves counter; when any other instance moved,
//! every bucket is read again. Entries at rest are written again every `HELD_MS` / 4 to / 2
//! (`quota::fraction::vouched`: they count while their instance beats), spread over the buckets;
//! a bucket this instance stopped holding has its entry deleted (until that succeeds).

use std::collections::HashMap;
use std::sync::Arc;

use ratelimit_core::quota::fraction::{self, HELD_MS, InstanceId};

use super::coordinate::Seen;
use super::table::BucketKey;

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

/// One bucket of a round: what to ask, and why.
#[derive(Debug, Clone, PartialEq)]
struct Asked {
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
    asked: Vec<Asked>,
}

/// What a round gave: the fractions of the buckets read, the instances alive, the buckets whose
/// call failed, and whether the others must be told (the moves counter incremented).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Settled {
    pub(crate) fractions: Vec<(Arc<BucketKey>, f64)>,
    pub(crate) alive: usize,
    pub(crate) failed: u64,
    pub(crate) announce: bool,
}

/// A bucket this instance holds (it is in the table's demands), by the `Arc`'s address; the
/// entry keeps the `Arc`, so the address is not reused while it is here.
#[derive(Debug)]
struct Held {
    key: Arc<BucketKey>,
    /// The demand last written with success (NaN: none yet).
    written: f64,
    /// When the entry is to be written again though unchanged, on the store's clock.
    due_ms: u64,
    /// The last round whose demands held it.
    round: u64,
}

/// The exchange's memory between rounds.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    held: HashMap<usize, Held>,
    /// The moves counter as this instance left it.
    moves: Option<u64>,
    /// The instances alive at the last round.
    alive: Vec<InstanceId>,
    /// The next round reads every bucket (a failure, or the counter moved under this instance's
    /// own increment).
    full: bool,
    /// An increment of the moves counter failed: owed still.
    owed: bool,
    round: u64,
}

fn id(key: &Arc<BucketKey>) -> usize {
    Arc::as_ptr(key) as usize
}

/// When an entry written at `now_ms` is due again: between `HELD_MS` / 4 and / 2 later, spread
/// over the buckets by their address, so entries written in one round are not all due in one.
fn due(key: &Arc<BucketKey>, now_ms: u64) -> u64 {
    let spread = (id(key) as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    now_ms + HELD_MS / 4 + spread % (HELD_MS / 4)
}

impl Plan {
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

    /// The calls of a round that started as `begun`, for the table's `demands` (each bucket this
    /// instance holds, with its demand).
    pub(crate) fn round(
        &mut self,
        instance: InstanceId,
        demands: &[(Arc<BucketKey>, f64)],
        begun: &Begun,
    ) -> Round {
        let all = self.reads_all(instance, begun);
        self.full = false;
        self.alive = fraction::alive(instance, &begun.instances.peers, begun.instances.now_ms);
        self.round += 1;
        let now = begun.instances.now_ms;
        let mut round = Round::default();
        for (key, demand) in demands {
            let held = self.held.entry(id(key)).or_insert_with(|| Held {
                key: key.clone(),
                written: f64::NAN,
                due_ms: 0,
                round: 0,
            });
            held.round = self.round;
            let changed = held.written != *demand || begun.new;
            let write = changed || now >= held.due_ms;
            let read = all || changed;
            if write || read {
                round.calls.push((
                    key.clone(),
                    Call {
                        write: write.then_some(*demand),
                        read,
                        delete: false,
                    },
                ));
                round.asked.push(Asked {
                    demand: *demand,
                    changed,
                });
            }
        }
        for held in self.held.values().filter(|h| h.round != self.round) {
            round.deletes.push((
                held.key.clone(),
                Call {
                    write: None,
                    read: false,
                    delete: true,
                },
            ));
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
            announce: self.owed,
            ..Settled::default()
        };
        for (i, (key, _)) in round.deletes.iter().enumerate() {
            match deleted.get(i) {
                Some(Some(_)) => {
                    self.held.remove(&id(key));
                    settled.announce = true;
                }
                _ => settled.failed += 1,
            }
        }
        for (i, ((key, call), asked)) in round.calls.iter().zip(&round.asked).enumerate() {
            let Some(Some(answer)) = answers.get(i) else {
                settled.failed += 1;
                continue;
            };
            if let (Some(demand), Some(held)) = (call.write, self.held.get_mut(&id(key))) {
                held.written = demand;
                held.due_ms = due(key, now);
                settled.announce |= asked.changed;
            }
            if let Some(seen) = answer {
                let peers = fraction::vouched(&seen.peers, beats, seen.now_ms);
                settled.fractions.push((
                    key.clone(),
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

    fn names(calls: &[(Arc<BucketKey>, Call)]) -> Vec<(String, Call)> {
        calls.iter().map(|(k, c)| (k.1[0].1.clone(), *c)).collect()
    }

    const WRITE_READ: fn(f64) -> Call = |d| Call {
        write: Some(d),
        read: true,
        delete: false,
    };

    #[test]
    fn buckets_at_rest_cost_no_call_and_a_changed_one_is_written_read_and_told() {
        let mut plan = Plan::default();
        let (a, b) = (key("a"), key("b"));
        let me = vec![peer(1, 0.0, 10_000)];
        // First round: everything written and read, and the others told.
        let demands = vec![(a.clone(), 2.0), (b.clone(), 1.0)];
        let first = begun(10_000, None, me.clone());
        let round = plan.round(1, &demands, &first);
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), WRITE_READ(2.0)), ("b".into(), WRITE_READ(1.0))]
        );
        let settled = plan.settle(1, &first, &round, &[], &answer(&round, 10_000, &[]));
        assert_eq!(settled.fractions, vec![(a.clone(), 1.0), (b.clone(), 1.0)]);
        assert!(settled.announce);
        plan.announced(&first, Some(1));
        // At rest, nobody moved: no call at all.
        let rest = begun(11_000, Some(1), vec![peer(1, 0.0, 11_000)]);
        let round = plan.round(1, &demands, &rest);
        assert!(round.calls.is_empty() && round.deletes.is_empty());
        let settled = plan.settle(1, &rest, &round, &[], &[]);
        assert!(!settled.announce && settled.fractions.is_empty());
        assert_eq!(settled.alive, 1);
        // b's demand changes: b alone, written and read, and the others told.
        let demands = vec![(a.clone(), 2.0), (b.clone(), 3.0)];
        let round = plan.round(1, &demands, &rest);
        assert_eq!(names(&round.calls), vec![("b".into(), WRITE_READ(3.0))]);
        let settled = plan.settle(1, &rest, &round, &[], &answer(&round, 11_000, &[]));
        assert!(settled.announce);
        plan.announced(&rest, Some(2));
        let again = begun(12_000, Some(2), vec![peer(1, 0.0, 12_000)]);
        assert!(plan.round(1, &demands, &again).calls.is_empty());
    }

    #[test]
    fn another_instance_moving_or_coming_or_a_failure_reads_every_bucket_again() {
        let mut plan = Plan::default();
        let (a, b) = (key("a"), key("b"));
        let demands = vec![(a.clone(), 2.0), (b.clone(), 2.0)];
        let first = begun(100_000, Some(7), vec![peer(1, 0.0, 100_000)]);
        let round = plan.round(1, &demands, &first);
        plan.settle(1, &first, &round, &[], &answer(&round, 100_000, &[]));
        plan.announced(&first, Some(8));
        let read = Call {
            write: None,
            read: true,
            delete: false,
        };
        // Another instance incremented the counter: every bucket read, none written.
        let moved = begun(101_000, Some(9), vec![peer(1, 0.0, 101_000)]);
        let round = plan.round(1, &demands, &moved);
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), read), ("b".into(), read)]
        );
        // Instance 2 holds b with demand 6, written a minute ago, and beats: b's fraction
        // follows it (2 of 8).
        let beats = vec![peer(1, 0.0, 101_000), peer(2, 0.0, 100_900)];
        let moved = begun(101_000, Some(9), beats.clone());
        let mut answers = answer(&round, 101_000, &[]);
        answers[1] = Some(Some(Seen {
            now_ms: 101_000,
            peers: vec![peer(2, 6.0, 101_000 - 60_000)],
        }));
        let settled = plan.settle(1, &moved, &round, &[], &answers);
        assert_eq!(settled.fractions, vec![(a.clone(), 1.0), (b.clone(), 0.25)]);
        assert!(!settled.announce);
        // A new instance alive: every bucket read again (the counter as left).
        let round = plan.round(1, &demands, &begun(102_000, Some(9), beats.clone()));
        assert_eq!(round.calls.len(), 2);
        // Now at rest; then a call fails: the next round reads all again.
        let rest = begun(103_000, Some(9), beats.clone());
        plan.settle(1, &rest, &round, &[], &answer(&round, 102_000, &[]));
        assert!(plan.round(1, &demands, &rest).calls.is_empty());
        let demands2 = vec![(a.clone(), 5.0), (b.clone(), 2.0)];
        let round = plan.round(1, &demands2, &rest);
        let settled = plan.settle(1, &rest, &round, &[], &[None]);
        assert_eq!(settled.failed, 1);
        let round = plan.round(1, &demands2, &rest);
        // a still to write (its write failed), b read.
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), WRITE_READ(5.0)), ("b".into(), read)]
        );
    }

    #[test]
    fn a_counter_moved_under_this_instances_increment_or_a_failed_one_reads_all_next() {
        let mut plan = Plan::default();
        let demands = vec![(key("a"), 1.0)];
        let me = vec![peer(1, 0.0, 0)];
        let first = begun(0, Some(3), me.clone());
        let round = plan.round(1, &demands, &first);
        plan.settle(1, &first, &round, &[], &answer(&round, 0, &[]));
        // Another instance incremented between this one's GET and INCR: 5, not 4.
        plan.announced(&first, Some(5));
        assert_eq!(
            plan.round(1, &demands, &begun(1000, Some(5), me.clone()))
                .calls
                .len(),
            1
        );
        // A failed increment is owed, and the next round reads all.
        let rest = begun(2000, Some(5), me.clone());
        let round = plan.round(1, &demands, &rest);
        assert!(round.calls.is_empty());
        plan.settle(1, &rest, &round, &[], &[]);
        plan.announced(&rest, None);
        let round = plan.round(1, &demands, &rest);
        assert_eq!(round.calls.len(), 1);
        let settled = plan.settle(1, &rest, &round, &[], &answer(&round, 2000, &[]));
        assert!(settled.announce, "the owed increment");
    }

    #[test]
    fn entries_at_rest_are_written_again_before_they_stop_counting_and_dropped_ones_deleted() {
        let mut plan = Plan::default();
        let (a, b) = (key("a"), key("b"));
        let demands = vec![(a.clone(), 1.0), (b.clone(), 1.0)];
        let me = |now| vec![peer(1, 0.0, now)];
        let first = begun(0, Some(1), me(0));
        let round = plan.round(1, &demands, &first);
        plan.settle(1, &first, &round, &[], &answer(&round, 0, &[]));
        plan.announced(&first, Some(2));
        let at = |now| begun(now, Some(2), me(now));
        assert!(
            plan.round(1, &demands, &at(HELD_MS / 4 - 1))
                .calls
                .is_empty()
        );
        // By HELD_MS / 2 each is written again, unchanged, and not read: nobody is told.
        let round = plan.round(1, &demands, &at(HELD_MS / 2));
        let rewrite = Call {
            write: Some(1.0),
            read: false,
            delete: false,
        };
        assert_eq!(
            names(&round.calls),
            vec![("a".into(), rewrite), ("b".into(), rewrite)]
        );
        let settled = plan.settle(1, &at(HELD_MS / 2), &round, &[], &answer(&round, 0, &[]));
        assert!(!settled.announce);
        // b no longer held: its entry deleted, until that succeeds; then the others are told.
        let demands = vec![(a.clone(), 1.0)];
        let now = HELD_MS / 2 + 1000;
        let round = plan.round(1, &demands, &at(now));
        assert_eq!(names(&round.deletes).len(), 1);
        assert!(round.deletes[0].1.delete);
        let settled = plan.settle(1, &at(now), &round, &[None], &[]);
        assert_eq!(settled.failed, 1);
        let round = plan.round(1, &demands, &at(now + 1000));
        assert_eq!(round.deletes.len(), 1);
        let settled = plan.settle(
            1,
            &at(now + 1000),
            &round,
            &[Some(None)],
            &answer(&round, 0, &[]),
        );
        assert!(settled.announce);
        assert!(plan.round(1, &demands, &at(now + 2000)).deletes.is_empty());
    }

    #[test]
    fn a_beat_that_was_not_there_writes_every_entry_again() {
        let mut plan = Plan::default();
        let demands = vec![(key("a"), 1.0)];
        let first = begun(0, Some(1), vec![peer(1, 0.0, 0)]);
        let round = plan.round(1, &demands, &first);
        plan.settle(1, &first, &round, &[], &answer(&round, 0, &[]));
        plan.announced(&first, Some(2));
        // Redis restarted empty: no counter, this instance's beat new.
        let mut lost = begun(1000, None, vec![peer(1, 0.0, 1000)]);
        lost.new = true;
        let round = plan.round(1, &demands, &lost);
        assert_eq!(names(&round.calls), vec![("a".into(), WRITE_READ(1.0))]);
        let settled = plan.settle(1, &lost, &round, &[], &answer(&round, 1000, &[]));
        assert!(settled.announce);
    }
}
