//! [`Guarded::call`] on a fake backend: a call under the breaker's permit, refused without calling
//! while the breaker is open, its failures counted as a decision's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::clock::Nanos;
use ratelimit_core::limiter::State;
use ratelimit_core::quota::fraction::InstanceId;
use ratelimit_core::store::memory::{MemoryKey, StoreKey};
use ratelimit_core::store::{Backend, CounterId, StoreError, Transaction, Verdicts};

use super::Guarded;
use crate::metrics::RemoteMetrics;
use crate::mode::{FailureMode, GuardSettings, LocalShare};
use crate::remote::{Connect, Remote, RemoteKey};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FakeKey(u64);

impl MemoryKey for FakeKey {
    fn id(&self) -> StoreKey {
        StoreKey(u128::from(self.0))
    }
}

impl RemoteKey for FakeKey {
    fn bytes(&self) -> usize {
        8
    }
}

/// A backend that counts the calls made on it.
#[derive(Default)]
struct Fake {
    calls: AtomicUsize,
}

impl Backend for Fake {
    type Key = FakeKey;
    const NAME: &'static str = "fake";

    fn key(&self, _id: &CounterId<'_>) -> FakeKey {
        FakeKey(0)
    }

    async fn transact(&self, _tx: Transaction<'_, FakeKey>) -> Result<Verdicts, StoreError> {
        Ok(Verdicts::new())
    }

    async fn peek(&self, _key: &FakeKey) -> Result<Option<State>, StoreError> {
        Ok(None)
    }
}

impl Remote for Fake {
    async fn probe(&self) -> Result<(), StoreError> {
        Err(StoreError::Unreachable("fake".into()))
    }

    fn answered_since(&self, _since: Instant) -> bool {
        false
    }

    fn last_seen(&self, _key: &FakeKey, _now: Nanos) -> Option<State> {
        None
    }

    async fn heartbeat(&self, _id: InstanceId) -> Result<usize, StoreError> {
        Ok(1)
    }
}

/// Connects to a [`Fake`], or finds nobody.
#[derive(Clone)]
struct FakeConnect {
    reachable: bool,
}

impl Connect for FakeConnect {
    type Backend = Fake;

    async fn connect(&self, _metrics: RemoteMetrics) -> Result<Fake, StoreError> {
        match self.reachable {
            true => Ok(Fake::default()),
            false => Err(StoreError::Unreachable("nobody there".into())),
        }
    }

    fn key(&self, _id: &CounterId<'_>) -> FakeKey {
        FakeKey(0)
    }

    fn describe(&self) -> String {
        "fake".into()
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn decision_deadline(&self) -> Duration {
        Duration::from_secs(5)
    }
}

async fn guarded(reachable: bool) -> (Guarded<FakeConnect>, RemoteMetrics) {
    let settings = GuardSettings {
        mode: FailureMode::Error,
        local_max_keys: 16,
        local_cache_bytes: 0,
        local_share: LocalShare::Fixed(1.0),
    };
    let metrics = RemoteMetrics::unregistered(Fake::NAME);
    let store = Guarded::start(FakeConnect { reachable }, settings, metrics.clone())
        .await
        .expect("an unreachable backend is no start-up error");
    (store, metrics)
}

/// A call that counts itself on the backend and fails.
async fn failing(store: &Guarded<FakeConnect>) -> Result<(), StoreError> {
    store
        .call(|fake| async move {
            fake.calls.fetch_add(1, Ordering::Relaxed);
            Err(StoreError::Unavailable("broken".into()))
        })
        .await
}

#[tokio::test]
async fn a_call_answers_with_the_backends_answer() {
    let (store, _) = guarded(true).await;
    let answer = store.call(|fake| async move { Ok(Arc::strong_count(&fake) > 0) });
    assert!(answer.await.unwrap());
}

#[tokio::test]
async fn failed_calls_open_the_breaker_and_then_nothing_is_called() {
    let (store, metrics) = guarded(true).await;
    for _ in 0..3 {
        let error = failing(&store).await.unwrap_err();
        assert!(error.to_string().contains("broken"), "{error}");
    }
    assert!(
        !store.is_up(),
        "three failures and no answer open the breaker"
    );
    assert_eq!(metrics.store_errors.get(), 3);
    let remote = store.shared.remote.load_full().unwrap();
    assert_eq!(remote.calls.load(Ordering::Relaxed), 3);

    let error = failing(&store).await.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    assert_eq!(remote.calls.load(Ordering::Relaxed), 3, "not called");
}

#[tokio::test]
async fn before_the_first_connection_a_call_is_unavailable() {
    let (store, _) = guarded(false).await;
    let error = failing(&store).await.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    assert!(error.to_string().contains("Fake"), "{error}");
}
