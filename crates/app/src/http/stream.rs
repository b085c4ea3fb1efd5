//! Large admin answers (`/rlconfig` of a big rule set) rendered off the async threads: the
//! render runs on a blocking thread and its text leaves in [`CHUNK`]-byte pieces as the client
//! reads them, so an answer never sits whole in memory and decisions and health checks keep their
//! threads. At most [`MAX_RENDERS`] run at once per server; further requests wait their turn.
//! A render that fails, or whose client reads nothing for 30 s, ends its answer as an error: the
//! client sees a cut answer, never a short one that looks whole.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

/// Bytes sent per piece.
pub(super) const CHUNK: usize = 64 << 10;

/// Renders running at once; the rest wait.
pub(super) const MAX_RENDERS: usize = 2;

/// Pieces rendered ahead of the client.
const AHEAD: usize = 2;

/// How long a render waits for a client that reads nothing before giving up.
const CLIENT_WAIT: Duration = Duration::from_secs(30);

/// The server's render slots.
#[derive(Debug, Clone)]
pub(crate) struct Renders(Arc<Semaphore>);

impl Default for Renders {
    fn default() -> Self {
        Renders(Arc::new(Semaphore::new(MAX_RENDERS)))
    }
}

type Piece = Result<Bytes, io::Error>;

impl Renders {
    /// A `content_type` response whose body `render` writes, once a slot is free.
    pub(crate) async fn stream<F>(&self, content_type: &'static str, render: F) -> Response
    where
        F: FnOnce(&mut dyn Write) -> io::Result<()> + Send + 'static,
    {
        let Ok(slot) = self.0.clone().acquire_owned().await else {
            // Never closed; answer something true should it be.
            return (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "shutting down\n",
            )
                .into_response();
        };
        let (tx, rx) = mpsc::channel::<Piece>(AHEAD);
        // How a render that did not finish ends the body: as an error after the pieces already
        // sent, so the client sees a cut answer, never a short one that looks whole. (The
        // channel may be full then, so the error has a slot of its own.)
        let (failed, failure) = oneshot::channel::<io::Error>();
        let handle = Handle::current();
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let mut out = Pieces {
                buffer: Vec::with_capacity(CHUNK),
                tx,
                handle,
            };
            if let Err(e) = render(&mut out).and_then(|()| out.flush()) {
                let _ = failed.send(e);
            }
        });
        let cut = futures_util::stream::once(failure)
            .filter_map(|failed| async move { failed.ok().map(Err) });
        (
            [(header::CONTENT_TYPE, content_type)],
            Body::from_stream(ReceiverStream::new(rx).chain(cut)),
        )
            .into_response()
    }
}

/// A writer that sends what it holds once it holds a [`CHUNK`].
struct Pieces {
    buffer: Vec<u8>,
    tx: mpsc::Sender<Piece>,
    handle: Handle,
}

impl Pieces {
    fn send(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(
            &mut self.buffer,
            Vec::with_capacity(CHUNK),
        ));
        let sent = self
            .handle
            .block_on(tokio::time::timeout(CLIENT_WAIT, self.tx.send(Ok(piece))));
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(io::Error::new(io::ErrorKind::BrokenPipe, "the client left")),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the client read nothing for 30 s",
            )),
        }
    }
}

impl Write for Pieces {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(response: Response) -> Result<Bytes, axum::Error> {
        axum::body::to_bytes(response.into_body(), usize::MAX).await
    }

    #[tokio::test]
    async fn a_finished_render_is_sent_whole() {
        let text = "x".repeat(3 * CHUNK + 7);
        let sent = text.clone();
        let response = Renders::default()
            .stream("text/plain", move |out| out.write_all(sent.as_bytes()))
            .await;
        assert_eq!(body_of(response).await.unwrap(), text.as_bytes());
    }

    #[tokio::test]
    async fn a_render_that_fails_midway_ends_its_answer_as_an_error_not_short() {
        let response = Renders::default()
            .stream("text/plain", |out| {
                out.write_all(&vec![b'x'; 2 * CHUNK])?;
                Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the client read nothing for 30 s",
                ))
            })
            .await;
        assert!(body_of(response).await.is_err());
    }
}
