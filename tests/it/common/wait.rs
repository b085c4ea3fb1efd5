//! The one way tests wait for something to happen: poll until it does, failing after a bound far
//! above the normal time (a bound for a stuck server, never a timing assertion).

use std::future::Future;
use std::time::Duration;

use ratelimit_server::clock::monotonic;

/// How long anything may take before the test fails: far above the normal time, so that a loaded
/// two-core machine does not fail a test.
pub const BOUND: Duration = Duration::from_secs(30);

/// Polls `probe` every 10 ms until it returns true; returns how long that took. Fails saying
/// `what` after [`BOUND`].
pub async fn eventually<F, Fut>(what: &str, probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(what, BOUND, probe).await
}

/// [`eventually`] with a bound of its own, for what an outside process paces (Envoy reports
/// every 5 s, an assignment lives 20 s): still far above the normal time.
pub async fn eventually_within<F, Fut>(what: &str, bound: Duration, mut probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = monotonic();
    while !probe().await {
        assert!(started.elapsed() < bound, "{what}: not after {bound:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

/// The same for a test on a plain thread: polls `done` every 20 ms.
pub fn eventually_blocking(what: &str, mut done: impl FnMut() -> bool) {
    let started = monotonic();
    while !done() {
        assert!(started.elapsed() < BOUND, "{what}: not after {BOUND:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
