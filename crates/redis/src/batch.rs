//! The decision of one batch, as a pure function of its keys' stored states: each request's
//! transaction in arrival order, on the states the earlier ones of the batch left, as the memory
//! backend would run them one after the other (refunds included).

use smallvec::SmallVec;

use ratelimit_core::limiter::State;
use ratelimit_core::store::{Transaction, Verdicts};

/// What a batch answers and leaves.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Per transaction, in order: its verdicts (empty for a refund).
    pub(crate) verdicts: Vec<Verdicts>,
    /// Per key (in the order given): the state after the whole batch.
    pub(crate) states: SmallVec<[Option<State>; 4]>,
}

/// Runs `txs` in order on `keys`, which hold `stored` before the batch. Every key of every
/// transaction must be in `keys`.
pub(crate) fn decide_batch<K: PartialEq>(
    txs: &[Transaction<'_, K>],
    keys: &[K],
    stored: &[Option<State>],
) -> Outcome {
    let mut states: SmallVec<[Option<State>; 4]> = stored.iter().copied().collect();
    let verdicts = txs.iter().map(|tx| tx.run(keys, &mut states)).collect();
    Outcome { verdicts, states }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::clock::NANOS_PER_SECOND as S;
    use ratelimit_core::config::Algorithm;
    use ratelimit_core::limiter::LimitParams;
    use ratelimit_core::store::memory::{MemoryBackend, StoreKey};
    use ratelimit_core::store::{Charge, Transaction};

    fn params(algorithm: Algorithm, limit: u32) -> LimitParams {
        LimitParams {
            algorithm,
            requests_per_unit: limit,
            period: 60 * S,
            burst: limit,
            max_delay: 30 * S,
            charge_denied: false,
        }
    }

    fn charge(key: u32, params: LimitParams, hits: u64) -> Charge<u32> {
        Charge::new(key, params, hits)
    }

    /// A batch decides as the memory store does the same requests one after the other.
    #[test]
    fn a_batch_gives_the_verdicts_of_its_requests_decided_in_turn() {
        for algorithm in Algorithm::ALL {
            let p = params(algorithm, 5);
            let requests: Vec<Vec<Charge<u32>>> = vec![
                vec![charge(1, p, 2)],
                vec![charge(1, p, 1), charge(2, p, 1)],
                vec![charge(2, p, 4), charge(1, p, 1)], // 2 is over: 1 not charged
                vec![charge(1, p, 2)],
                vec![charge(1, p, 1)],
                vec![charge(2, p, 0)],
            ];
            let base = 1_000 * S;
            let steps: Vec<Transaction<'_, u32>> = requests
                .iter()
                .enumerate()
                .map(|(i, c)| Transaction::apply(c, base + i as u64 * 1_000))
                .collect();
            let outcome = decide_batch(&steps, &[1, 2], &[None, None]);
            // Room for every key in each shard (keys 1 and 2 share one).
            let memory = MemoryBackend::new(1 << 20);
            let key = |k: u32| StoreKey(u128::from(k));
            for (step, got) in steps.iter().zip(&outcome.verdicts) {
                let charges: Vec<Charge<StoreKey>> = step
                    .charges
                    .iter()
                    .map(|c| Charge {
                        key: key(c.key),
                        params: c.params,
                        hits: c.hits,
                        enforced: c.enforced,
                        quota: c.quota,
                    })
                    .collect();
                assert_eq!(
                    *got,
                    memory.run(Transaction::apply(&charges, step.now)),
                    "{algorithm}"
                );
            }
            for (i, k) in [1u32, 2].into_iter().enumerate() {
                assert_eq!(outcome.states[i], memory.peek_now(key(k)), "{algorithm}");
            }
        }
    }

    #[test]
    fn a_refund_in_a_batch_gives_a_leaky_turn_back() {
        let p = params(Algorithm::LeakyBucket, 5);
        let c = [charge(1, p, 1)];
        let step = |refund| {
            if refund {
                Transaction::refund(&c, 100 * S)
            } else {
                Transaction::apply(&c, 100 * S)
            }
        };
        let charged = decide_batch(&[step(false), step(false)], &[1], &[None]);
        let refunded = decide_batch(&[step(false), step(false), step(true)], &[1], &[None]);
        let once = decide_batch(&[step(false)], &[1], &[None]);
        assert_ne!(charged.states[0], once.states[0]);
        assert_eq!(refunded.states[0], once.states[0]);
        assert!(refunded.verdicts[2].is_empty());
    }
}
