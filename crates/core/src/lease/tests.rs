use super::*;
use crate::clock::{Clock, ManualClock, NANOS_PER_SECOND};

const SECOND: Nanos = NANOS_PER_SECOND;

fn params(max_in_flight: u32) -> LeaseParams {
    LeaseParams {
        max_in_flight,
        lease: 10 * SECOND,
    }
}

fn take(leases: &mut Leases, id: u128, clock: &ManualClock) -> LeaseOutcome {
    leases
        .apply(LeaseAction::Acquire, id, &params(3), clock.now())
        .outcome
}

fn give_back(leases: &mut Leases, id: u128, clock: &ManualClock) -> LeaseOutcome {
    leases
        .apply(LeaseAction::Release, id, &params(3), clock.now())
        .outcome
}

#[test]
fn max_in_flight_slots_are_taken_then_the_next_is_denied_and_takes_nothing() {
    let clock = ManualClock::new(1_000 * SECOND);
    let mut leases = Leases::default();
    for id in 1..=3 {
        assert_eq!(take(&mut leases, id, &clock), LeaseOutcome::Taken);
    }
    let denied = leases.apply(LeaseAction::Acquire, 4, &params(3), clock.now());
    assert_eq!(denied.outcome, LeaseOutcome::Denied);
    assert!(!denied.allowed());
    assert_eq!(denied.in_use, 3);
    assert_eq!(denied.free(&params(3)), 0);
    assert_eq!(denied.next_end, Some(clock.now() + 10 * SECOND));
}

#[test]
fn a_release_frees_exactly_its_own_slot() {
    let clock = ManualClock::new(0);
    let mut leases = Leases::default();
    for id in 1..=3 {
        take(&mut leases, id, &clock);
    }
    assert_eq!(give_back(&mut leases, 2, &clock), LeaseOutcome::Released);
    assert_eq!(give_back(&mut leases, 2, &clock), LeaseOutcome::Unknown);
    assert_eq!(take(&mut leases, 5, &clock), LeaseOutcome::Taken);
    assert_eq!(take(&mut leases, 6, &clock), LeaseOutcome::Denied);
    // 1, 3 and 5 hold the slots: releasing them frees them, one each.
    for id in [1, 3, 5] {
        assert_eq!(give_back(&mut leases, id, &clock), LeaseOutcome::Released);
    }
    assert!(leases.is_empty());
}

#[test]
fn a_denied_requests_release_frees_nobody_elses_slot() {
    let clock = ManualClock::new(0);
    let mut leases = Leases::default();
    for id in 1..=3 {
        take(&mut leases, id, &clock);
    }
    assert_eq!(take(&mut leases, 9, &clock), LeaseOutcome::Denied);
    // Envoy sends the stream-done call of the denied request too.
    assert_eq!(give_back(&mut leases, 9, &clock), LeaseOutcome::Unknown);
    assert_eq!(leases.in_use(), 3);
    assert_eq!(take(&mut leases, 10, &clock), LeaseOutcome::Denied);
}

#[test]
fn an_acquisition_retried_by_the_same_request_renews_its_lease() {
    let clock = ManualClock::new(0);
    let mut leases = Leases::default();
    take(&mut leases, 1, &clock);
    clock.advance(std::time::Duration::from_secs(8));
    let again = leases.apply(LeaseAction::Acquire, 1, &params(3), clock.now());
    assert_eq!(again.outcome, LeaseOutcome::Renewed);
    assert_eq!(again.in_use, 1);
    assert_eq!(again.next_end, Some(clock.now() + 10 * SECOND));
}

#[test]
fn a_lost_release_frees_its_slot_when_the_lease_ends() {
    let clock = ManualClock::new(0);
    let mut leases = Leases::default();
    for id in 1..=3 {
        take(&mut leases, id, &clock);
    }
    clock.advance(std::time::Duration::from_secs(9));
    assert_eq!(take(&mut leases, 4, &clock), LeaseOutcome::Denied);
    clock.advance(std::time::Duration::from_secs(1));
    // At exactly `lease` after it was taken, a lease has ended.
    let answer = leases.apply(LeaseAction::Acquire, 4, &params(3), clock.now());
    assert_eq!(answer.outcome, LeaseOutcome::Taken);
    assert_eq!(answer.expired, 3);
    assert_eq!(answer.in_use, 1);
    // The late release of an expired lease is a no-op.
    assert_eq!(give_back(&mut leases, 1, &clock), LeaseOutcome::Unknown);
}

#[test]
fn a_lowered_limit_denies_until_the_held_leases_drop_below_it() {
    let clock = ManualClock::new(0);
    let mut leases = Leases::default();
    for id in 1..=3 {
        take(&mut leases, id, &clock);
    }
    let lowered = params(1);
    let answer = leases.apply(LeaseAction::Acquire, 7, &lowered, clock.now());
    assert_eq!(answer.outcome, LeaseOutcome::Denied);
    assert_eq!(answer.free(&lowered), 0);
    for id in [1, 2] {
        leases.apply(LeaseAction::Release, id, &lowered, clock.now());
    }
    assert_eq!(
        leases
            .apply(LeaseAction::Acquire, 7, &lowered, clock.now())
            .outcome,
        LeaseOutcome::Denied
    );
    leases.apply(LeaseAction::Release, 3, &lowered, clock.now());
    assert_eq!(
        leases
            .apply(LeaseAction::Acquire, 7, &lowered, clock.now())
            .outcome,
        LeaseOutcome::Taken
    );
}

#[test]
fn a_peek_changes_nothing_but_expiry() {
    let clock = ManualClock::new(0);
    let mut leases = Leases::default();
    take(&mut leases, 1, &clock);
    let before = leases.clone();
    let answer = leases.apply(LeaseAction::Peek, 1, &params(3), clock.now());
    assert_eq!(answer.outcome, LeaseOutcome::Peeked);
    assert_eq!(leases, before);
    clock.advance(std::time::Duration::from_secs(10));
    assert_eq!(
        leases
            .apply(LeaseAction::Peek, 1, &params(3), clock.now())
            .expired,
        1
    );
    assert!(leases.is_empty());
}

#[test]
fn outcome_codes_round_trip() {
    for (i, o) in LeaseOutcome::ALL.iter().enumerate() {
        assert_eq!(LeaseOutcome::from_code(i as i64), Some(*o));
    }
    assert_eq!(LeaseOutcome::from_code(-1), None);
    assert_eq!(LeaseOutcome::from_code(6), None);
}
