//! The keys the local failure mode took over in one outage, and the bookkeeping of writing their
//! hits back: a key whose write-back is under way stays taken over (decisions on it stay local)
//! until its hits are in the remote backend, so no decision there races its own write-back, and no
//! new hand-over starts the key afresh from a value that lacks them. No I/O: the guard calls it.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::LimitParams;

/// A key taken over: its limit, the hits the local mode admitted on it (to write back), and
/// whether a write-back of them is under way.
struct TakenOver {
    params: LimitParams,
    hits: u64,
    settling: bool,
}

/// A key's write-back: the key, its limit, the hits to write.
pub(crate) type Settle<K> = (K, LimitParams, u64);

/// What the local failure mode decided in one outage.
pub(crate) struct Outage<K> {
    keys: HashMap<K, TakenOver>,
    /// The last `now` it decided at, and when.
    pub last_now: Option<(Nanos, Instant)>,
}

/// What a decision on some keys must do about the outage first.
#[derive(Debug, PartialEq)]
pub(crate) enum Claim<K> {
    /// None of them is taken over: decide on the remote backend.
    Free,
    /// One is being written back by another call: decide locally meanwhile.
    Busy,
    /// These were taken over and are now this caller's to write back.
    Settle(Vec<Settle<K>>),
}

impl<K: Hash + Eq + Clone> Outage<K> {
    pub(crate) fn new() -> Outage<K> {
        Outage {
            keys: HashMap::new(),
            last_now: None,
        }
    }

    /// Keys taken over.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn contains(&self, key: &K) -> bool {
        self.keys.contains_key(key)
    }

    /// Whether `key`'s write-back is under way (`None`: it is not taken over).
    pub(crate) fn settling(&self, key: &K) -> Option<bool> {
        self.keys.get(key).map(|t| t.settling)
    }

    /// Takes `key` over (it was not).
    pub(crate) fn take_over(&mut self, key: K, params: LimitParams) {
        self.keys.insert(
            key,
            TakenOver {
                params,
                hits: 0,
                settling: false,
            },
        );
    }

    /// The local mode admitted `hits` on `key` (counted if it is taken over).
    pub(crate) fn count(&mut self, key: &K, hits: u64) {
        if let Some(t) = self.keys.get_mut(key) {
            t.hits = t.hits.saturating_add(hits);
        }
    }

    /// Claims the write-back of those of `keys` that are taken over.
    pub(crate) fn claim<'k>(&mut self, keys: impl IntoIterator<Item = &'k K>) -> Claim<K>
    where
        K: 'k,
    {
        let mut claimed = Vec::new();
        for key in keys {
            match self.keys.get(key) {
                None => {}
                Some(t) if t.settling => return Claim::Busy,
                Some(t) if !claimed.iter().any(|(k, _, _): &Settle<K>| k == key) => {
                    claimed.push((key.clone(), t.params, t.hits));
                }
                Some(_) => {}
            }
        }
        if claimed.is_empty() {
            return Claim::Free;
        }
        for (key, _, _) in &claimed {
            if let Some(t) = self.keys.get_mut(key) {
                t.settling = true;
            }
        }
        Claim::Settle(claimed)
    }

    /// The keys taken over whose write-back is not under way (the background write-back's work,
    /// claimed a chunk at a time with [`Outage::claim_free`]).
    pub(crate) fn not_settling(&self) -> Vec<K> {
        self.keys
            .iter()
            .filter(|(_, t)| !t.settling)
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Claims the write-back of those of `keys` that are taken over and not being written back
    /// already (the others are skipped: gone, or a decision's own write-back has them).
    pub(crate) fn claim_free<'k>(&mut self, keys: impl IntoIterator<Item = &'k K>) -> Vec<Settle<K>>
    where
        K: 'k,
    {
        let mut claimed = Vec::new();
        for key in keys {
            if let Some(t) = self.keys.get_mut(key)
                && !t.settling
            {
                t.settling = true;
                claimed.push((key.clone(), t.params, t.hits));
            }
        }
        claimed
    }

    /// Claims the write-back of every key taken over that is not being written back already.
    pub(crate) fn claim_all(&mut self) -> Vec<Settle<K>> {
        self.keys
            .iter_mut()
            .filter(|(_, t)| !t.settling)
            .map(|(key, t)| {
                t.settling = true;
                (key.clone(), t.params, t.hits)
            })
            .collect()
    }

    /// The write-back of `claimed` ended, `unsettled` of them not written (the remote failed):
    /// those stay taken over with all their hits; the others leave once every hit they have is
    /// written (hits admitted locally meanwhile keep a key taken over for the next decision).
    /// Returns the keys that left, whose local state can go.
    pub(crate) fn release(&mut self, claimed: Vec<Settle<K>>, unsettled: &[K]) -> Vec<K> {
        let mut left = Vec::new();
        for (key, _, written) in claimed {
            let Some(t) = self.keys.get_mut(&key) else {
                continue;
            };
            t.settling = false;
            if unsettled.contains(&key) {
                continue;
            }
            t.hits = t.hits.saturating_sub(written);
            if t.hits == 0 {
                self.keys.remove(&key);
                left.push(key);
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::config::Algorithm;

    fn params() -> LimitParams {
        LimitParams {
            algorithm: Algorithm::FixedWindow,
            requests_per_unit: 10,
            period: 1_000_000_000,
            burst: 10,
            max_delay: 0,
            charge_denied: false,
        }
    }

    #[test]
    fn a_key_being_written_back_stays_local_until_its_hits_are_in() {
        let mut o = Outage::new();
        o.take_over("a", params());
        o.count(&"a", 5);
        assert_eq!(o.claim([&"b"]), Claim::Free);
        let Claim::Settle(claimed) = o.claim([&"a", &"b", &"a"]) else {
            panic!("a is taken over")
        };
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].2, 5);
        assert_eq!(o.claim([&"a"]), Claim::Busy);
        assert_eq!(o.settling(&"a"), Some(true));
        assert_eq!(o.settling(&"b"), None);
        assert!(o.claim_all().is_empty(), "already claimed");
        // Admitted locally while its write-back was under way: it stays for those.
        o.count(&"a", 2);
        assert!(o.release(claimed, &[]).is_empty());
        let Claim::Settle(claimed) = o.claim([&"a"]) else {
            panic!("a still has 2 hits")
        };
        assert_eq!(claimed[0].2, 2);
        assert_eq!(o.release(claimed, &[]), ["a"]);
        assert_eq!(o.len(), 0);
    }

    /// The background write-back claims a chunk at a time: a key it has not reached is the next
    /// decision's to write back (not `Busy`, so that decision does not wait for the others).
    #[test]
    fn a_chunk_claimed_leaves_the_other_keys_to_their_decisions() {
        let mut o = Outage::new();
        for key in ["a", "b", "c"] {
            o.take_over(key, params());
            o.count(&key, 1);
        }
        let mut pending = o.not_settling();
        pending.sort();
        assert_eq!(pending, ["a", "b", "c"]);
        let chunk = o.claim_free([&"a", &"z"]);
        assert_eq!(chunk.len(), 1, "only a: z is not taken over");
        assert_eq!(o.claim([&"a"]), Claim::Busy);
        let Claim::Settle(mine) = o.claim([&"b"]) else {
            panic!("b is not in the chunk: its decision writes it back")
        };
        assert_eq!(
            o.claim_free([&"b", &"c"]).len(),
            1,
            "b is the decision's now: c only"
        );
        assert!(o.not_settling().is_empty());
        assert_eq!(o.release(chunk, &[]), ["a"]);
        assert_eq!(o.release(mine, &[]), ["b"]);
    }

    #[test]
    fn a_failed_write_back_keeps_the_key_and_its_hits() {
        let mut o = Outage::new();
        o.take_over("a", params());
        o.count(&"a", 3);
        let claimed = o.claim_all();
        assert!(o.release(claimed, &["a"]).is_empty());
        assert!(o.contains(&"a"));
        let Claim::Settle(claimed) = o.claim([&"a"]) else {
            panic!("a is taken over")
        };
        assert_eq!(claimed[0].2, 3);
    }
}
