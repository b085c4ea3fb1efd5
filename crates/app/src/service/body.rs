//! A request body with two bounds: all calls together buffer at most a fixed number of request
//! bytes (a byte budget, returned when the body is dropped, which tonic does once the message is
//! decoded), and a body that has not arrived in full within its timeout ends the call, so a client
//! that stops sending mid-message holds nothing for long.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::Status;
use tonic::codegen::{Bytes, StdError};

/// A request body bounded by the shared byte budget and by its own timeout.
pub(crate) struct BoundedBody<B> {
    inner: B,
    budget: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
    ended: bool,
}

impl<B> BoundedBody<B> {
    pub(crate) fn new(inner: B, budget: Arc<Semaphore>, timeout: Duration) -> Self {
        BoundedBody {
            inner,
            budget,
            held: None,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            ended: false,
        }
    }

    /// Takes `len` bytes from the budget, or says why not.
    fn reserve(&mut self, len: usize) -> Result<(), Status> {
        let refused = || {
            Status::resource_exhausted(
                "the server is buffering too many request bytes; retry shortly",
            )
        };
        let permits = u32::try_from(len).map_err(|_| refused())?;
        let permit = self
            .budget
            .clone()
            .try_acquire_many_owned(permits)
            .map_err(|_| refused())?;
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        Ok(())
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
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                    "the request did not arrive in full within {:?}",
                    this.timeout
                ))
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
