//! Memory backend tests: atomic all-or-nothing charging, exactness under threads, bounds, sweeping.

use std::sync::Arc;

use super::*;
use crate::clock::NANOS_PER_SECOND as S;
use crate::config::Algorithm;
use crate::limiter::LimitParams;

/// The old names, for these tests: a transaction run at once.
impl MemoryBackend {
    fn apply_sync(&self, charges: &[Charge<StoreKey>], now: Nanos) -> Verdicts {
        self.run(Transaction::apply(charges, now))
    }

    fn refund_sync(&self, charges: &[Charge<StoreKey>], now: Nanos) {
        self.run(Transaction::refund(charges, now));
    }
}

fn params(rpu: u32) -> LimitParams {
    LimitParams {
        algorithm: Algorithm::FixedWindow,
        requests_per_unit: rpu,
        period: 60 * S,
        burst: rpu,
        max_delay: 0,
        charge_denied: false,
    }
}

fn charge(key: u128, rpu: u32, hits: u64) -> Charge<StoreKey> {
    Charge {
        key: StoreKey(key),
        params: params(rpu),
        hits,
        enforced: true,
        quota: None,
    }
}

#[test]
fn a_denied_request_charges_none_of_its_keys() {
    let store = MemoryBackend::new(1000);
    let v = store.apply_sync(&[charge(1, 10, 1), charge(2, 1, 1)], 0);
    assert!(v.iter().all(|v| v.allowed));
    assert_eq!(v[0].outlook.remaining, 9);
    // key 2 is now full: the request is denied and key 1 is not charged.
    let v = store.apply_sync(&[charge(1, 10, 1), charge(2, 1, 1)], 0);
    assert!(v[0].allowed && !v[1].allowed);
    assert_eq!(v[0].outlook.remaining, 9, "not charged");
    let v = store.apply_sync(&[charge(1, 10, 1)], 0);
    assert_eq!(v[0].outlook.remaining, 8);
}

#[test]
fn shadow_charges_do_not_block_the_request() {
    let store = MemoryBackend::new(1000);
    store.apply_sync(&[charge(2, 1, 1)], 0);
    let mut shadow = charge(2, 1, 1);
    shadow.enforced = false;
    let v = store.apply_sync(&[charge(1, 10, 1), shadow], 0);
    assert!(v[0].allowed && !v[1].allowed);
    assert_eq!(
        v[0].outlook.remaining, 9,
        "charged although the shadow limit is over"
    );
}

#[test]
fn the_same_key_twice_in_one_request_is_counted_twice() {
    let store = MemoryBackend::new(1000);
    let v = store.apply_sync(&[charge(1, 3, 2), charge(1, 3, 2)], 0);
    assert!(v[0].allowed && !v[1].allowed);
    let v = store.apply_sync(&[charge(1, 3, 2), charge(1, 3, 1)], 0);
    assert!(v[0].allowed && v[1].allowed);
    assert_eq!(v[1].outlook.remaining, 0);
}

#[test]
fn racing_threads_never_get_more_than_the_limit() {
    let store = Arc::new(MemoryBackend::new(1000));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..500)
                    .filter(|_| {
                        store.apply_sync(&[charge(7, 1000, 1), charge(8, 5000, 1)], 0)[0].allowed
                    })
                    .count()
            })
        })
        .collect();
    let admitted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(admitted, 1000);
    let left = store.apply_sync(&[charge(8, 5000, 0)], 0);
    assert_eq!(
        left[0].outlook.remaining, 4000,
        "only admitted requests were charged"
    );
}

#[test]
fn key_count_stays_bounded_under_a_flood() {
    let store = MemoryBackend::new(1024);
    for k in 0..100_000u128 {
        store.apply_sync(
            &[charge(
                k.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835),
                10,
                1,
            )],
            0,
        );
    }
    let stats = store.stats();
    assert!(stats.keys <= 1024, "{} keys", stats.keys);
    assert!(stats.evictions >= 100_000 - 1024);
}

#[test]
fn sweep_drops_expired_keys_only_and_fresh_state_is_not_stored() {
    let store = MemoryBackend::new(1000);
    store.apply_sync(&[charge(1, 10, 1)], 0);
    store.apply_sync(&[charge(2, 10, 1)], 59 * S);
    store.apply_sync(&[charge(3, 10, 0)], 0);
    assert_eq!(store.stats().keys, 2, "a zero-hit check stores nothing");
    assert_eq!(store.sweep(59 * S), 0);
    store.apply_sync(&[charge(4, 10, 1)], 60 * S);
    assert_eq!(store.sweep(60 * S), 2, "the first window's keys expired");
    assert_eq!(store.stats().keys, 1);
    assert!(store.peek_now(StoreKey(4)).is_some());
}

/// A leaky bucket of 10 per second, queue 3, max delay 1 s.
fn leaky(key: u128, hits: u64) -> Charge<StoreKey> {
    Charge {
        key: StoreKey(key),
        params: LimitParams {
            algorithm: Algorithm::LeakyBucket,
            requests_per_unit: 10,
            period: S,
            burst: 3,
            max_delay: S,
            charge_denied: false,
        },
        hits,
        enforced: true,
        quota: None,
    }
}

#[test]
fn delays_are_reported_only_for_committed_charges() {
    let store = MemoryBackend::new(1000);
    let ms = S / 1000;
    let v = store.apply_sync(&[leaky(1, 1)], 0);
    assert_eq!((v[0].charged, v[0].delay), (true, 0));
    let v = store.apply_sync(&[leaky(1, 1)], 0);
    assert_eq!((v[0].charged, v[0].delay), (true, 100 * ms));
    // Another limit of the request denies it: the leaky charge is not taken, and not delayed.
    store.apply_sync(&[charge(2, 1, 1)], 0);
    let v = store.apply_sync(&[leaky(1, 1), charge(2, 1, 1)], 0);
    assert!(v[0].allowed && !v[1].allowed);
    assert_eq!((v[0].charged, v[0].delay), (false, 0));
    let v = store.apply_sync(&[leaky(1, 1)], 0);
    assert_eq!(v[0].delay, 200 * ms, "the denied request took no turn");
}

#[test]
fn a_refund_gives_back_the_leaky_turn_only() {
    let store = MemoryBackend::new(1000);
    for _ in 0..3 {
        assert!(store.apply_sync(&[leaky(1, 1)], 0)[0].charged);
    }
    assert!(
        !store.apply_sync(&[leaky(1, 1)], 0)[0].allowed,
        "queue full"
    );
    store.apply_sync(&[charge(2, 5, 1)], 0);
    store.refund_sync(&[leaky(1, 1), charge(2, 5, 1)], 0);
    let v = store.apply_sync(&[leaky(1, 1), charge(2, 5, 0)], 0);
    assert!(v[0].charged, "the turn was given back");
    assert_eq!(v[1].outlook.remaining, 4, "a fixed window keeps its count");
    // A refund for a key that is gone does nothing.
    store.refund_sync(&[leaky(9, 1)], 0);
    assert!(store.peek_now(StoreKey(9)).is_none());
}

/// Counts what a sweep tells it.
#[derive(Default)]
struct Ended(std::sync::atomic::AtomicU32);

impl crate::lease::LeaseWatch for Ended {
    fn expired(&self, leases: u32) {
        self.0.fetch_add(leases, Ordering::Relaxed);
    }
}

#[test]
fn the_sweep_drops_ended_leases_tells_their_rule_and_forgets_empty_keys() {
    use crate::lease::{LeaseAction, LeaseOutcome, LeaseParams, Watch};
    let store = MemoryBackend::new(1000);
    let ended = Arc::new(Ended::default());
    let watch: Watch = ended.clone();
    let params = LeaseParams {
        max_in_flight: 2,
        lease: 10 * S,
    };
    let key = StoreKey(7 << 64 | 9);
    let call = |id: &'static str, action, now| {
        store.lease_now(&LeaseCall {
            key: &key,
            id,
            action,
            params,
            now,
            watch: Some(&watch),
        })
    };
    assert_eq!(
        call("a", LeaseAction::Acquire, S).outcome,
        LeaseOutcome::Taken
    );
    assert_eq!(
        call("b", LeaseAction::Acquire, 5 * S).outcome,
        LeaseOutcome::Taken
    );
    assert_eq!(
        call("c", LeaseAction::Acquire, 5 * S).outcome,
        LeaseOutcome::Denied
    );
    assert_eq!(store.lease_keys(), 1);
    store.sweep(11 * S);
    assert_eq!(ended.0.load(Ordering::Relaxed), 1, "a ended at 11 s");
    assert_eq!(store.lease_keys(), 1, "b still holds its slot");
    store.sweep(15 * S);
    assert_eq!(ended.0.load(Ordering::Relaxed), 2);
    assert_eq!(store.lease_keys(), 0, "no lease left: the key is gone");
    // A release that empties a key drops it at once.
    call("d", LeaseAction::Acquire, 20 * S);
    assert_eq!(
        call("d", LeaseAction::Release, 21 * S).outcome,
        LeaseOutcome::Released
    );
    assert_eq!(store.lease_keys(), 0);
}
