//! Where Redis I/O runs: on the server's request workers, beside the decisions waiting for it
//! (`run`), and how a call is bounded by a timeout without mistaking a reply already there for
//! none (`within`), so an instance whose workers fall behind does not take its own lateness for
//! a Redis outage.
//!
//! A thread of its own drove the connections until 2026-12-06. Handing each call over and each
//! answer back cost four more thread switches per call with one call in flight (2.3× the CPU per
//! decision), and saved 7–18 % with 8 to 16 in flight per connection (docs/performance.md, "Redis
//! I/O on the request workers").

use std::time::Duration;

/// Runs `call` in a task of its own on the current runtime: a caller that gives up on it (its
/// request cancelled) does not cut a call Redis may be answering. Its output, or `None` if the
/// runtime dropped it (shutting down).
pub(super) async fn run<T: Send + 'static>(
    call: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    tokio::spawn(call).await.ok()
}

/// `call`'s output if it comes within `timeout`. A process short of CPU can wake up to find its
/// timer expired and the reply already in the socket, both in the same wake-up, and the timer may
/// be seen first: before calling it a timeout, let the connection's task run (a few yields, each
/// after the runtime has looked at its sockets again) and look once more, so a reply that is there
/// counts as the answer it is.
pub(crate) async fn within<T>(timeout: Duration, call: impl Future<Output = T>) -> Result<T, ()> {
    use futures_util::FutureExt;
    let mut call = std::pin::pin!(call);
    if let Ok(output) = tokio::time::timeout(timeout, call.as_mut()).await {
        return Ok(output);
    }
    for _ in 0..3 {
        tokio::task::yield_now().await;
        if let Some(output) = call.as_mut().now_or_never() {
            return Ok(output);
        }
    }
    Err(())
}
