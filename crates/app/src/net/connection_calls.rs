//! The calls of one HTTP/2 connection run inside that connection's own task instead of a task
//! each: hyper hands every new stream to a [`CallSpawner`], and [`Calls::run`] polls them beside
//! the connection. A connection's frames, calls and answers then stay on one thread at a time,
//! with no task handed from worker to worker and no wake across threads between a call and the
//! connection that writes its answer (on tokio's multi-thread runtime those cost a call more than
//! the call itself: docs/performance.md, "One task per connection"), while the runtime still
//! moves whole connections to idle workers.

use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::AtomicWaker;

/// One stream's task as hyper spawns it: it runs the call and sends its answer.
type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How many times one poll goes round the connection and its calls while either asks to be polled
/// again, before it lets the runtime run other connections.
const ROUNDS_PER_POLL: usize = 8;

/// Calls spawned and not yet taken by the connection's task.
type Spawned = Mutex<Vec<Call>>;

/// The waker the connection and its calls are polled with. A wake while the task polls them (a
/// call spawned, an answer ready to write) only marks another round of that poll; a wake from
/// elsewhere (a socket ready, a Redis reply) wakes the task. So the task never wakes itself, which
/// on the multi-thread runtime would queue it again and rouse an idle worker to take it.
#[derive(Default)]
struct TaskWaker {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // SeqCst with `Calls::run`'s stores: a wake that finds the task polling is seen by it.
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// The executor given to hyper for one connection: what it spawns runs in that connection's task.
#[derive(Clone)]
pub(crate) struct CallSpawner {
    spawned: Arc<Spawned>,
    waker: Arc<TaskWaker>,
}

impl<F> hyper::rt::Executor<F> for CallSpawner
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, call: F) {
        // A call that panics ends alone (its stream reset), as a task of its own would, not with
        // the connection and every other call on it.
        let call = AssertUnwindSafe(call).catch_unwind().map(|_| ());
        self.spawned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::pin(call));
        self.waker.wake_by_ref();
    }
}

/// The calls of one connection, run by [`Calls::run`].
pub(crate) struct Calls {
    spawned: Arc<Spawned>,
    waker: Arc<TaskWaker>,
    running: FuturesUnordered<Call>,
}

/// An executor for one connection's hyper server, and the calls it will run.
pub(crate) fn calls() -> (CallSpawner, Calls) {
    let (spawned, waker) = (Arc::new(Spawned::default()), Arc::new(TaskWaker::default()));
    let calls = Calls {
        spawned: spawned.clone(),
        waker: waker.clone(),
        running: FuturesUnordered::new(),
    };
    (CallSpawner { spawned, waker }, calls)
}

impl Calls {
    /// Drives `connection` and the calls it spawns until the connection has ended and every call
    /// has finished. Each poll goes round while there is progress: the connection (reading
    /// requests, spawning their calls), then the calls (whose answers it will write), then the
    /// connection again, so a burst of calls is read, answered and written in one go.
    pub(crate) async fn run(mut self, connection: impl Future<Output = ()>) {
        let mut connection = pin!(connection);
        let mut open = true;
        let waker = Waker::from(self.waker.clone());
        poll_fn(|cx| {
            self.waker.task.register(cx.waker());
            self.waker.polling.store(true, Ordering::SeqCst);
            let mut inner = Context::from_waker(&waker);
            for _ in 0..ROUNDS_PER_POLL {
                self.waker.woken.store(false, Ordering::SeqCst);
                if open && connection.as_mut().poll(&mut inner).is_ready() {
                    open = false;
                }
                self.take_spawned();
                while let Poll::Ready(Some(())) = self.running.poll_next_unpin(&mut inner) {}
                if !open && self.running.is_empty() && self.spawned_is_empty() {
                    self.waker.polling.store(false, Ordering::SeqCst);
                    return Poll::Ready(());
                }
                if !self.waker.woken.load(Ordering::SeqCst) {
                    self.waker.polling.store(false, Ordering::SeqCst);
                    // A wake that came after the check and before `polling` was cleared.
                    if self.waker.woken.load(Ordering::SeqCst) {
                        cx.waker().wake_by_ref();
                    }
                    return Poll::Pending;
                }
            }
            // Still busy: come back after the runtime's other tasks.
            self.waker.polling.store(false, Ordering::SeqCst);
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await;
    }

    /// Moves the calls spawned since the last poll to the running ones.
    fn take_spawned(&mut self) {
        let mut spawned = self.spawned.lock().unwrap_or_else(PoisonError::into_inner);
        self.running.extend(spawned.drain(..));
    }

    fn spawned_is_empty(&self) -> bool {
        self.spawned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn every_call_spawned_runs_and_the_run_ends_when_they_have() {
        let (spawner, calls) = calls();
        let done = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let connection = {
            let (spawner, done) = (spawner.clone(), done.clone());
            async move {
                for _ in 0..3 {
                    let (done, mut released) = (done.clone(), released.clone());
                    spawner.execute(async move {
                        let _ = released.wait_for(|r| *r).await;
                        done.fetch_add(1, Ordering::SeqCst);
                    });
                }
                // The connection ends first; its calls still wait.
            }
        };
        let run = tokio::spawn(calls.run(connection));
        tokio::task::yield_now().await;
        assert!(
            !run.is_finished(),
            "calls still running keep the connection's task"
        );
        release.send(true).expect("calls wait");
        run.await.expect("the run ends");
        assert_eq!(done.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_call_that_panics_ends_alone() {
        let (spawner, calls) = calls();
        let done = Arc::new(AtomicUsize::new(0));
        let connection = {
            let done = done.clone();
            async move {
                spawner.execute(async { panic!("a call's bug") });
                spawner.execute(async move {
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        };
        tokio::spawn(calls.run(connection))
            .await
            .expect("the connection's task ends normally");
        assert_eq!(done.load(Ordering::SeqCst), 1, "the other call ran");
    }

    #[tokio::test]
    async fn a_call_spawned_from_another_thread_wakes_the_connection_s_task() {
        let (spawner, calls) = calls();
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let connection = async move {
            std::thread::spawn(move || {
                spawner.execute(async move {
                    let _ = done.send(());
                });
            });
            // The connection stays open until its call has answered.
            std::future::pending::<()>().await;
        };
        tokio::spawn(calls.run(connection));
        finished.await.expect("the call ran");
    }
}
