//! Failures came right after an answer (a dropped connection, or the start of an outage): once
//! the breaker's quiet time has passed, a probe (`Remote::probe`) tells which, so the breaker opens on a dead
//! backend even if no more requests come to fail.

use std::sync::atomic::Ordering;
use std::sync::{PoisonError, Weak};

use crate::breaker::Permit;
use crate::guarded::{Guarded, Shared};
use crate::remote::{Connect, Remote};

pub(in crate::guarded) async fn check_again<C: Connect>(shared: Weak<Shared<C>>) {
    let quiet = match shared.upgrade() {
        Some(s) => s
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .quiet(),
        None => return,
    };
    tokio::time::sleep(quiet).await;
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let store = Guarded { shared };
    if let Some(remote) = store.shared.remote.load_full()
        && store.permit() == Permit::Call
    {
        let probed = remote.probe().await;
        if let Err(e) = &probed {
            store.shared.failed_with(e);
        }
        store.shared.checking.store(false, Ordering::Release);
        store.record(Permit::Call, probed.is_ok());
    } else {
        store.shared.checking.store(false, Ordering::Release);
    }
}
