//! Redis I/O on a thread of its own: the connections' tasks (writing commands, reading replies,
//! reconnecting) and the timers that bound each call run there, not among the server's request
//! tasks. A server short of CPU, its workers queued up with requests, still reads Redis's replies
//! when they come, so a call times out because Redis (or the network) was slow, not because we
//! were: an overloaded instance never mistakes itself for a Redis outage. `within` bounds a call
//! by a timeout without mistaking a reply already there for none.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::runtime::{Builder, Handle};

/// The Redis I/O runtime (one thread, made on first use, for the life of the process).
pub(super) fn handle() -> Handle {
    static IO: OnceLock<Handle> = OnceLock::new();
    IO.get_or_init(|| {
        let runtime = Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the Redis I/O runtime starts");
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("redis-io".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .expect("the Redis I/O thread starts");
        handle
    })
    .clone()
}

/// Runs `call` on the Redis I/O thread; its output, or `None` if that runtime dropped it.
pub(super) async fn run<T: Send + 'static>(
    call: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    handle().spawn(call).await.ok()
}

/// `call`'s output if it comes within `timeout`. A process short of CPU can wake up to find its
/// timer expired and the reply already in the socket, both in the same wake-up, and the timer may
/// be seen first: before calling it a timeout, let the connection's task run (a few yields) and
/// look once more, so a reply that is there counts as the answer it is.
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
