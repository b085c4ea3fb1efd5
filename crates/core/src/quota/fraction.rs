//! Which part of a rule's pool one server instance hands out when several instances share a
//! bucket (through a shared store). Pure: the snapshot of every instance's demand and the snapshot's time
//! are passed in.
//!
//! Each instance publishes its demand for the bucket (requests per second, from its Envoys'
//! reports) and reads every instance's. Its fraction is its weight over the sum of the fresh
//! instances' weights, a weight being the demand floored at `NEWCOMER_FLOOR` of the mean (as
//! for streams within an instance), so instances computing on one snapshot take fractions that
//! add up to at most 1, and their scaled pools (`scaled`) to at most the rule's. An entry is as
//! fresh as its instance's beat while it is held (`vouched`): a demand at rest is not rewritten
//! every second.

use std::collections::BTreeMap;

use crate::quota::shares::NEWCOMER_FLOOR;

/// An instance's identity, chosen at its start.
pub type InstanceId = u64;

/// An entry older than this (by the snapshot's clock, in ms) is of an instance gone or cut off:
/// it is not counted. Instances beat every second.
pub const STALE_AFTER_MS: u64 = 5_000;

/// A bucket's entry that its instance has not rewritten for this long (ms) no longer counts,
/// however fresh the instance's beat ([`vouched`]). An instance rewrites an unchanged demand well
/// within it, and deletes its entry when it stops holding the bucket.
pub const HELD_MS: u64 = 300_000;

/// One instance's published demand for a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peer {
    pub instance: InstanceId,
    /// Requests per second.
    pub demand: f64,
    /// When it was published, in ms, on the snapshot's clock.
    pub at_ms: u64,
}

/// A demand as a weight's input: negative, NaN or infinite counts as none.
fn sane(demand: f64) -> f64 {
    if demand.is_finite() && demand > 0.0 {
        demand
    } else {
        0.0
    }
}

/// The fresh instances of `snapshot` at `now_ms` with their demands, `own` always among them
/// with `own_demand` (whatever the snapshot says of it). An instance listed twice counts once,
/// by its latest entry.
fn fresh(
    own: InstanceId,
    own_demand: f64,
    snapshot: &[Peer],
    now_ms: u64,
) -> BTreeMap<InstanceId, f64> {
    let mut latest: BTreeMap<InstanceId, Peer> = BTreeMap::new();
    for peer in snapshot {
        if peer.instance == own || now_ms.saturating_sub(peer.at_ms) > STALE_AFTER_MS {
            continue;
        }
        let keep = latest
            .get(&peer.instance)
            .is_none_or(|seen| seen.at_ms <= peer.at_ms);
        if keep {
            latest.insert(peer.instance, *peer);
        }
    }
    let mut demands: BTreeMap<InstanceId, f64> = latest
        .into_iter()
        .map(|(id, p)| (id, sane(p.demand)))
        .collect();
    demands.insert(own, sane(own_demand));
    demands
}

/// A bucket's `entries` as they count at `now_ms` against `beats` (the instances' hash): an entry
/// written within [`HELD_MS`] is as fresh as its instance's latest beat, so an instance whose
/// demand for the bucket has not changed need not write it every second; it stops counting
/// [`STALE_AFTER_MS`] after its instance's last beat, as an entry written every second would.
/// An entry older than [`HELD_MS`], or whose instance has no beat, keeps its own time.
pub fn vouched(entries: &[Peer], beats: &[Peer], now_ms: u64) -> Vec<Peer> {
    entries
        .iter()
        .map(|entry| {
            let mut entry = *entry;
            if now_ms.saturating_sub(entry.at_ms) <= HELD_MS {
                let beat = beats
                    .iter()
                    .filter(|b| b.instance == entry.instance)
                    .map(|b| b.at_ms)
                    .max();
                if let Some(at) = beat {
                    entry.at_ms = entry.at_ms.max(at);
                }
            }
            entry
        })
        .collect()
}

/// Instances alive in `snapshot` at `now_ms`, `own` included.
pub fn live(own: InstanceId, snapshot: &[Peer], now_ms: u64) -> usize {
    fresh(own, 0.0, snapshot, now_ms).len()
}

/// The ids of the instances alive in `snapshot` at `now_ms`, `own` included, in order.
pub fn alive(own: InstanceId, snapshot: &[Peer], now_ms: u64) -> Vec<InstanceId> {
    fresh(own, 0.0, snapshot, now_ms).into_keys().collect()
}

/// `own`'s part of the pool, in `[0, 1]`: its weight over the sum of every fresh instance's.
/// Alone, 1.
pub fn fraction(own: InstanceId, own_demand: f64, snapshot: &[Peer], now_ms: u64) -> f64 {
    let demands = fresh(own, own_demand, snapshot, now_ms);
    if demands.len() <= 1 {
        return 1.0;
    }
    let mean = demands.values().sum::<f64>() / demands.len() as f64;
    let floor = (mean * NEWCOMER_FLOOR).max(1e-6);
    let weight = |d: f64| d.max(floor);
    let total: f64 = demands.values().map(|d| weight(*d)).sum();
    let mine = demands.get(&own).copied().map_or(0.0, weight);
    if total > 0.0 && total.is_finite() {
        (mine / total).clamp(0.0, 1.0)
    } else {
        1.0 / demands.len() as f64
    }
}

/// An even split among `instances` (at least one): a new bucket's fraction before its first
/// exchange.
pub fn even(instances: usize) -> f64 {
    1.0 / instances.max(1) as f64
}

/// `whole` scaled by `fraction`, rounded down (`whole` itself at 1 or above, 0 at 0 or below or
/// NaN). Over fractions that add up to at most 1 the parts add up to at most `whole`.
pub(crate) fn scaled(whole: u128, fraction: f64) -> u128 {
    if fraction >= 1.0 {
        whole
    } else if fraction > 0.0 {
        ((whole as f64) * fraction).floor().min(whole as f64) as u128
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn peer(instance: InstanceId, demand: f64, at_ms: u64) -> Peer {
        Peer {
            instance,
            demand,
            at_ms,
        }
    }

    #[test]
    fn alone_an_instance_has_the_whole_pool() {
        assert_eq!(fraction(1, 3.0, &[], 10_000), 1.0);
        assert_eq!(fraction(1, 3.0, &[peer(1, 0.5, 10_000)], 10_000), 1.0);
        assert_eq!(live(1, &[], 0), 1);
    }

    #[test]
    fn equal_demand_splits_evenly_and_unequal_follows_demand() {
        let now = 50_000;
        let snapshot = [peer(1, 2.0, now), peer(2, 2.0, now - 900)];
        assert_eq!(fraction(1, 2.0, &snapshot, now), 0.5);
        assert_eq!(fraction(2, 2.0, &snapshot, now), 0.5);
        let snapshot = [peer(1, 3.0, now), peer(2, 1.0, now)];
        assert_eq!(fraction(1, 3.0, &snapshot, now), 0.75);
        assert_eq!(fraction(2, 1.0, &snapshot, now), 0.25);
    }

    #[test]
    fn a_quiet_instance_keeps_a_floor() {
        let now = 1_000;
        let snapshot = [peer(1, 8.0, now), peer(2, 0.0, now)];
        // Mean 4, floor 1: 8 / 9 and 1 / 9.
        assert!((fraction(1, 8.0, &snapshot, now) - 8.0 / 9.0).abs() < 1e-12);
        assert!((fraction(2, 0.0, &snapshot, now) - 1.0 / 9.0).abs() < 1e-12);
        // Both quiet: an even split.
        let quiet = [peer(1, 0.0, now), peer(2, 0.0, now)];
        assert_eq!(fraction(1, 0.0, &quiet, now), 0.5);
    }

    #[test]
    fn stale_entries_and_nonsense_demands_do_not_count() {
        let now = 100_000;
        let snapshot = [
            peer(1, 1.0, now),
            peer(2, 1.0, now - STALE_AFTER_MS - 1),
            peer(3, f64::NAN, now),
        ];
        assert_eq!(live(1, &snapshot, now), 2);
        assert_eq!(alive(1, &snapshot, now), vec![1, 3]);
        // Instance 3's NaN is no demand: it gets the floor (mean 0.5, floor 0.125).
        assert!((fraction(1, 1.0, &snapshot, now) - 1.0 / 1.125).abs() < 1e-12);
        assert_eq!(fraction(1, f64::INFINITY, &[peer(2, -4.0, now)], now), 0.5);
    }

    #[test]
    fn an_instance_listed_twice_counts_once_by_its_latest_entry() {
        let now = 10_000;
        let snapshot = [peer(2, 9.0, now - 3000), peer(2, 1.0, now)];
        assert_eq!(fraction(1, 1.0, &snapshot, now), 0.5);
    }

    #[test]
    fn an_entry_at_rest_counts_while_its_instance_beats_and_it_is_held() {
        let now = 1_000_000;
        // Instance 2 wrote its demand a minute ago and beat just now: it counts.
        let entries = [peer(1, 1.0, now), peer(2, 3.0, now - 60_000)];
        let beats = [peer(1, 0.0, now), peer(2, 0.0, now - 800)];
        let counted = vouched(&entries, &beats, now);
        assert_eq!(counted[1], peer(2, 3.0, now - 800));
        assert_eq!(fraction(1, 1.0, &counted, now), 0.25);
        // Its beat 6 s old (gone, or cut off): not counted, as a stale entry.
        let beats = [peer(2, 0.0, now - STALE_AFTER_MS - 1_000)];
        assert_eq!(fraction(1, 1.0, &vouched(&entries, &beats, now), now), 1.0);
        // Written longer ago than it is held, or no beat at all: its own time.
        let old = [peer(2, 3.0, now - HELD_MS - 1)];
        let beats = [peer(2, 0.0, now)];
        assert_eq!(vouched(&old, &beats, now), old.to_vec());
        assert_eq!(vouched(&entries, &[], now), entries.to_vec());
        // A beat older than the entry leaves the entry's time.
        let beats = [peer(2, 0.0, now - 90_000)];
        assert_eq!(vouched(&entries, &beats, now), entries.to_vec());
    }

    #[test]
    fn scaling_rounds_down_and_keeps_the_whole_at_one() {
        assert_eq!(scaled(600, 1.0), 600);
        assert_eq!(scaled(600, 0.5), 300);
        assert_eq!(scaled(10, 1.0 / 3.0), 3);
        assert_eq!(scaled(10, 0.0), 0);
        assert_eq!(scaled(10, f64::NAN), 0);
        assert_eq!(scaled(u128::from(u32::MAX), 0.999_999_999_9), 4_294_967_294);
        assert_eq!(even(0), 1.0);
        assert_eq!(even(4), 0.25);
    }

    fn snapshot() -> impl Strategy<Value = (Vec<Peer>, u64)> {
        let now = 100_000u64;
        proptest::collection::vec(
            (
                prop_oneof![Just(0.0), 0.0f64..1000.0, Just(f64::NAN), Just(-1.0)],
                0u64..(2 * STALE_AFTER_MS),
            ),
            1..12,
        )
        .prop_map(move |entries| {
            let peers = entries
                .into_iter()
                .enumerate()
                .map(|(i, (demand, age))| peer(i as InstanceId + 1, demand, now - age))
                .collect();
            (peers, now)
        })
    }

    proptest! {
        /// Every instance alive in one snapshot takes its fraction from it: the fractions add up
        /// to at most 1 (within float rounding), and the pools they scale to never add up to more
        /// than the rule's.
        #[test]
        fn fractions_of_a_shared_snapshot_never_exceed_the_whole(
            (peers, now) in snapshot(),
            whole in prop_oneof![0u128..100, Just(600), Just(u128::from(u32::MAX))],
        ) {
            let alive: Vec<&Peer> = peers
                .iter()
                .filter(|p| now - p.at_ms <= STALE_AFTER_MS)
                .collect();
            let fractions: Vec<f64> = alive
                .iter()
                .map(|p| fraction(p.instance, p.demand, &peers, now))
                .collect();
            let sum: f64 = fractions.iter().sum();
            prop_assert!(sum <= 1.0 + 1e-9, "{fractions:?}");
            prop_assert!(fractions.iter().all(|f| (0.0..=1.0).contains(f)));
            let parts: u128 = fractions.iter().map(|f| scaled(whole, *f)).sum();
            prop_assert!(parts <= whole, "{parts} of {whole}: {fractions:?}");
            if !alive.is_empty() {
                prop_assert!(fractions.iter().all(|f| *f > 0.0), "{fractions:?}");
            }
        }
    }
}
