//! A batch of single hits on one fixed window's counter, counted as the reference counts them:
//! `INCRBY` by the batch's hits, no script and no compare-and-set. Which batches can go so
//! ([`hits`]) and their verdicts from the count Redis returns ([`decide`]); the call is the
//! writer's (`Writer::increment`). And how any decision reads a count that went past its limit
//! ([`counts_within_limits`]). Pure: transactions and counts in, verdicts out.
//!
//! Exact as the compare-and-set is: each request is decided in turn on the count before the batch
//! (what Redis returned less the batch's hits), so the first ones that fit are admitted and the
//! rest denied. Redis then also counts the denied ones' hits, but only past the limit: a denial
//! means the window was full before it, and a full window stays full (nothing takes an admitted
//! hit back within a window), so a count past the limit turns away exactly what the limit would.
//! With `--charge-denied-hits` a denied request's hits count anyway, as here, whatever they are.

use ratelimit_core::config::Algorithm;
use ratelimit_core::limiter::State;
use ratelimit_core::store::{Transaction, TransactionKind, Verdicts};

use crate::batch::decide_batch;
use crate::key::TextKey;

/// The hits to add to the counter for `requests` (a batch's transactions) when each is one
/// charge on the same fixed window's counter that only adds (a hit each; any hits when denied
/// hits count), and they add some; `None` when the batch must go by compare-and-set (a refund, a
/// look, several hits or several limits in one request, another algorithm).
pub(crate) fn hits<'a>(requests: &[Transaction<'a, TextKey>]) -> Option<(&'a TextKey, u64)> {
    let first = requests.first()?.charges.first()?;
    first.key.window_end()?;
    let mut total: u64 = 0;
    for tx in requests {
        if tx.kind != TransactionKind::Apply {
            return None;
        }
        let [charge] = tx.charges else {
            return None;
        };
        let counts_any = charge.params.charge_denied;
        if charge.key != first.key
            || charge.params.algorithm != Algorithm::FixedWindow
            || !(charge.hits == 1 || counts_any)
        {
            return None;
        }
        total = total.checked_add(charge.hits)?;
    }
    (total > 0 && total <= i64::MAX as u64).then_some((&first.key, total))
}

/// The verdicts of `requests` ([`hits`] said they can go so) on `key`, whose counter Redis
/// returned as `counted` after adding `added`: each decided in turn on the count before them.
pub(crate) fn decide(
    key: &TextKey,
    requests: &[Transaction<'_, TextKey>],
    counted: u64,
    added: u64,
) -> Vec<Verdicts> {
    let before = counted.saturating_sub(added);
    let mut stored = [key
        .window_end()
        .filter(|_| before > 0)
        .map(|end| State { a: end, b: before })];
    let keys = std::slice::from_ref(key);
    counts_within_limits(requests, keys, &mut stored);
    decide_batch(requests, keys, &stored).verdicts
}

/// Reads each fixed window's count past its limit as the limit, in `states` (of `keys`, as `txs`
/// charge them). Redis counts a window's denied single hits too (`increment`), but only once the
/// window is full, so what is past the limit is denied hits, which the window does not count
/// (unless its limit counts denied hits, `charge_denied`, whose counts are left as they are): a
/// look at a full window (no hits) is then answered as on the memory store, within the limit.
pub(crate) fn counts_within_limits(
    txs: &[Transaction<'_, TextKey>],
    keys: &[TextKey],
    states: &mut [Option<State>],
) {
    for charge in txs.iter().flat_map(|tx| tx.charges) {
        if charge.key.window_end().is_none() || charge.params.charge_denied {
            continue;
        }
        let Some(i) = keys.iter().position(|k| *k == charge.key) else {
            continue;
        };
        if let Some(state) = &mut states[i] {
            state.b = state.b.min(u64::from(charge.params.requests_per_unit));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::clock::NANOS_PER_SECOND as S;
    use ratelimit_core::limiter::LimitParams;
    use ratelimit_core::store::Charge;

    fn params(algorithm: Algorithm, limit: u32, charge_denied: bool) -> LimitParams {
        LimitParams {
            algorithm,
            requests_per_unit: limit,
            period: 60 * S,
            burst: limit,
            max_delay: 0,
            charge_denied,
        }
    }

    fn base() -> TextKey {
        TextKey::from_text("rl:d|k=v|0.1.60s".to_owned())
    }

    /// One charge of `hits` on `key`'s counter at `now` (its window's key, as the store makes it).
    fn charge(key: &TextKey, params: LimitParams, hits: u64, now: u64) -> [Charge<TextKey>; 1] {
        [Charge::new(
            key.at(params.algorithm, params.period, now),
            params,
            hits,
        )]
    }

    #[test]
    fn single_hits_on_one_windows_counter_are_counted_by_increment() {
        let now = 1_000 * S;
        let p = params(Algorithm::FixedWindow, 3, false);
        let (a, b) = (charge(&base(), p, 1, now), charge(&base(), p, 1, now + 1));
        let batch = [Transaction::apply(&a, now), Transaction::apply(&b, now + 1)];
        let (key, by) = hits(&batch).expect("by increment");
        assert_eq!(by, 2);
        assert_eq!(key.window_end(), Some(1_020 * S));
        assert!(key.as_str().ends_with("|0.1.60s|w1020000000000"));
    }

    #[test]
    fn what_an_increment_could_count_wrong_goes_by_compare_and_set() {
        let now = 1_000 * S;
        let fixed = params(Algorithm::FixedWindow, 3, false);
        let other = TextKey::from_text("rl:d|k=w|0.1.60s".to_owned());
        let alone = |c: &[Charge<TextKey>]| hits(&[Transaction::apply(c, now)]).map(|h| h.1);
        // Two hits at once: denied, they would be counted below the limit.
        assert_eq!(alone(&charge(&base(), fixed, 2, now)), None);
        // A look (no hit) adds nothing.
        assert_eq!(alone(&charge(&base(), fixed, 0, now)), None);
        // Another algorithm.
        let bucket = params(Algorithm::TokenBucket, 3, false);
        assert_eq!(alone(&charge(&base(), bucket, 1, now)), None);
        // Two counters in one batch.
        let (a, b) = (
            charge(&base(), fixed, 1, now),
            charge(&other, fixed, 1, now),
        );
        assert!(hits(&[Transaction::apply(&a, now), Transaction::apply(&b, now)]).is_none());
        // Two charges in one request (all or nothing across them).
        let both = [a[0].clone(), b[0].clone()];
        assert_eq!(alone(&both), None);
        // A refund (nobody waits for its verdicts).
        assert!(hits(&[Transaction::refund(&a, now)]).is_none());
        // With denied hits counted, any hits go so.
        let counting = params(Algorithm::FixedWindow, 3, true);
        assert_eq!(alone(&charge(&base(), counting, 5, now)), Some(5));
    }

    /// The batch is decided on the count before it: the first that fit are admitted, the rest
    /// denied, with the remaining counts the memory store would give.
    #[test]
    fn the_first_hits_that_fit_are_admitted() {
        let now = 1_000 * S;
        let p = params(Algorithm::FixedWindow, 3, false);
        let charges: Vec<[Charge<TextKey>; 1]> =
            (0..4).map(|i| charge(&base(), p, 1, now + i)).collect();
        let batch: Vec<Transaction<'_, TextKey>> = charges
            .iter()
            .zip(0..)
            .map(|(c, i)| Transaction::apply(c, now + i))
            .collect();
        let (key, by) = hits(&batch).unwrap();
        // One hit counted before: Redis returns 5 after adding 4.
        let verdicts = decide(key, &batch, 5, by);
        let allowed: Vec<bool> = verdicts.iter().map(|v| v[0].allowed).collect();
        assert_eq!(allowed, [true, true, false, false]);
        let remaining: Vec<u32> = verdicts.iter().map(|v| v[0].outlook.remaining).collect();
        assert_eq!(remaining, [1, 0, 0, 0]);
        // A count already past the limit (denied hits counted there) denies them all.
        let verdicts = decide(key, &batch, 9, by);
        assert!(verdicts.iter().all(|v| !v[0].allowed));
        // … and a look at it is answered as within the limit, none remaining, as in memory.
        let look = charge(&base(), p, 0, now);
        let verdicts = decide(key, &[Transaction::apply(&look, now)], 9, 0);
        assert!(verdicts[0][0].allowed);
        assert_eq!(verdicts[0][0].outlook.remaining, 0);
    }
}
