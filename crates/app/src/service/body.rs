//! A request body with two bounds: all calls together buffer at most a fixed number of request
//! bytes (a byte budget, returned when the body is dropped, which tonic does once the message is
//! decoded), and a body that has not arrived in full within its timeout ends the call, so a client
//! that stops sending mid-message holds nothing for long. A call that has to wait for its request
//! also counts [`WAITING_CALL_BYTES`] against the budget while it waits, for what it holds beside
//! its bytes (its headers, its stream, its task): calls whose request never comes cannot pile up
//! past the budget either. Both bounds cost nothing while the body is already there (the common
//! case: its one frame came with the headers): the budget is one atomic count, and the timer and
//! the waiting charge are taken only when the body has to be waited for.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;
use tonic::Status;
use tonic::codegen::{Bytes, StdError};

/// What a call waiting for its request counts against the budget beside the bytes it has: its
/// headers (at most 16 KiB, hyper's default limit on an HTTP/2 header list, which the gRPC
/// listeners keep) and its stream and task (about 11 KiB: 20,480 such calls open took the release
/// binary from 12 to 237 MB resident, `scripts/measure-waiting-calls.sh`).
pub(crate) const WAITING_CALL_BYTES: usize = 16 * 1024;

/// Request bytes all calls may hold buffered together. Bytes are taken without waiting (or
/// refused) and given back when their body is dropped; nothing ever waits for them, so this is one
/// atomic count (no wait list, no lock).
#[derive(Debug)]
pub(crate) struct ByteBudget {
    left: AtomicUsize,
}

impl ByteBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        ByteBudget {
            left: AtomicUsize::new(bytes),
        }
    }

    /// Takes `n` bytes, or none if fewer are left.
    fn take(&self, n: usize) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.left.fetch_add(n, Ordering::AcqRel);
    }
}

/// A request body bounded by the shared byte budget and by its own timeout.
pub(crate) struct BoundedBody<B> {
    inner: B,
    budget: Arc<ByteBudget>,
    /// Bytes this body holds of the budget.
    held: usize,
    /// Set when the body first has to be waited for: it must then arrive within `timeout`.
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    ended: bool,
}

impl<B> BoundedBody<B> {
    pub(crate) fn new(inner: B, budget: Arc<ByteBudget>, timeout: Duration) -> Self {
        BoundedBody {
            inner,
            budget,
            held: 0,
            deadline: None,
            timeout,
            ended: false,
        }
    }

    /// Takes `len` bytes from the budget, or says why not.
    fn reserve(&mut self, len: usize) -> Result<(), Status> {
        if !self.budget.take(len) {
            return Err(Status::resource_exhausted(
                "the server is buffering too many request bytes; retry shortly",
            ));
        }
        self.held += len;
        Ok(())
    }
}

impl<B> Drop for BoundedBody<B> {
    fn drop(&mut self) {
        if self.held > 0 {
            self.budget.give(self.held);
        }
    }
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = self.get_mut();
        let timeout = this.timeout;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(status) = this.reserve(data.len())
                {
                    return Poll::Ready(Some(Err(status.into())));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                // The first wait: the call now holds its headers and stream for as long as its
                // request takes, so it counts them, and the wait is bounded.
                if this.deadline.is_none()
                    && let Err(status) = this.reserve(WAITING_CALL_BYTES)
                {
                    return Poll::Ready(Some(Err(status.into())));
                }
                let deadline = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                        "the request did not arrive in full within {timeout:?}"
                    ))
                    .into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
