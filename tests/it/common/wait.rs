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
pub async fn eventually_within<F, Fut>(what: &str, bound: Duration, probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_until(bound, probe)
        .await
        .unwrap_or_else(|| panic!("{what}: not after {bound:?}"))
}

/// [`eventually`], failing with what `context` says then (the store's state, a server's log) as
/// well as `what`: for a wait whose failure would otherwise say nothing of why.
pub async fn eventually_or<F, Fut>(what: &str, probe: F, context: impl FnOnce() -> String)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    if poll_until(BOUND, probe).await.is_none() {
        panic!("{what}: not after {BOUND:?}\n{}", context());
    }
}

/// Polls `probe` every 10 ms until it returns true (how long that took) or `bound` passes (`None`).
async fn poll_until<F, Fut>(bound: Duration, mut probe: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = monotonic();
    while !probe().await {
        if started.elapsed() >= bound {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Some(started.elapsed())
}

/// The same for a test on a plain thread: polls `done` every 20 ms.
pub fn eventually_blocking(what: &str, mut done: impl FnMut() -> bool) {
    let started = monotonic();
    while !done() {
        assert!(started.elapsed() < BOUND, "{what}: not after {BOUND:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
