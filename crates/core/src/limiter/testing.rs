//! Helpers shared by the algorithms' unit tests.

use super::{LimitParams, State, evaluate};
use crate::clock::Nanos;

/// Sends `requests` single hits at `now`, storing the state as a store would; returns how many
/// passed.
pub(super) fn drive(p: &LimitParams, state: &mut Option<State>, now: Nanos, requests: u32) -> u32 {
    let mut admitted = 0;
    for _ in 0..requests {
        let e = evaluate(p, *state, now, 1);
        if e.allowed {
            *state = Some(e.state_after);
            admitted += 1;
        }
    }
    admitted
}
