//! The background tasks of a guarded backend, each holding the shared state weakly (it ends when
//! the store is dropped): `reconnect` (until the first or a lost connection is made), `heartbeat`
//! (this instance alive in the backend's registry, for the local share), `probe` (while the
//! breaker is open), `check_again` (failures right after an answer) and `write_back` (the local
//! failure mode's hits, once the backend answers again).

mod check_again;
mod heartbeat;
mod probe;
mod reconnect;
mod write_back;

pub(super) use check_again::check_again;
pub(super) use heartbeat::heartbeat;
pub(super) use probe::probe;
pub(super) use reconnect::reconnect;
pub(super) use write_back::write_back;
