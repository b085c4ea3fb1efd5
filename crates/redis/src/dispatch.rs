//! The script calls of one instance, pipelined: calls made while the Redis I/O thread is busy
//! wait in one list, and its dispatcher sends all of them in one write (a pipeline of `EVALSHA`s,
//! each still its own atomic script) and hands each reply back. One write and one read serve many
//! decisions on many keys; a call made while nothing else waits goes out alone, at once.
//! (Not on a cluster, whose commands are routed by slot: there each call is sent on its own.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, Value};
use tokio::sync::{Notify, oneshot};

use crate::cas;
use crate::conn::{Conn, Conns};
use crate::io::{self, within};

/// Most calls in one pipeline.
const MAX_PIPELINE: usize = 256;

struct Job {
    cmd: Cmd,
    reply: oneshot::Sender<RedisResult<Value>>,
}

/// The list of waiting calls and the dispatcher that sends them.
pub(super) struct Dispatcher {
    jobs: Mutex<Vec<Job>>,
    wake: Notify,
    closed: AtomicBool,
}

impl Dispatcher {
    /// A dispatcher sending on `conns`, each pipeline bounded by `timeout`; it runs on the Redis
    /// I/O thread until [`Dispatcher::close`].
    pub(super) fn start(conns: Arc<Conns>, timeout: Duration) -> Arc<Dispatcher> {
        let dispatcher = Arc::new(Dispatcher {
            jobs: Mutex::new(Vec::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        io::handle().spawn(dispatch(dispatcher.clone(), conns, timeout));
        dispatcher
    }

    /// Sends `cmd` with the calls waiting beside it; its reply (a `NOSCRIPT` reply has already
    /// been answered by loading the script and calling again).
    pub(super) async fn call(&self, cmd: Cmd) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Job { cmd, reply });
        self.wake.notify_one();
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Stops the dispatcher (the store is gone).
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }
}

fn gone() -> RedisError {
    RedisError::from((ErrorKind::Io, "the Redis dispatcher stopped"))
}

async fn dispatch(dispatcher: Arc<Dispatcher>, conns: Arc<Conns>, timeout: Duration) {
    loop {
        dispatcher.wake.notified().await;
        if dispatcher.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut jobs = std::mem::take(
            &mut *dispatcher
                .jobs
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        while !jobs.is_empty() {
            let rest = jobs.split_off(jobs.len().min(MAX_PIPELINE));
            tokio::spawn(send(conns.clone(), jobs, timeout));
            jobs = rest;
        }
    }
}

/// Sends `jobs` as one pipeline and answers each.
async fn send(conns: Arc<Conns>, jobs: Vec<Job>, timeout: Duration) {
    let mut pipeline = Pipeline::with_capacity(jobs.len());
    let mut replies = Vec::with_capacity(jobs.len());
    for job in jobs {
        pipeline.add_command(job.cmd);
        replies.push(job.reply);
    }
    let mut conn = conns.get();
    let mut values = match sent(&mut conn, &pipeline, timeout).await {
        Ok(values) => values,
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
            return;
        }
    };
    let unknown: Vec<usize> = (0..values.len())
        .filter(|&i| cas::unknown_script(&values[i]))
        .collect();
    if !unknown.is_empty() {
        // Redis forgot the script (restarted, failed over): load it and send those again.
        let mut again = Pipeline::with_capacity(unknown.len() + 1);
        again.add_command(cas::load());
        for &i in &unknown {
            if let Some(cmd) = pipeline.cmd_iter().nth(i) {
                again.add_command(cmd.clone());
            }
        }
        match sent(&mut conn, &again, timeout).await {
            Ok(retried) => {
                for (&i, value) in unknown.iter().zip(retried.into_iter().skip(1)) {
                    values[i] = value;
                }
            }
            Err(e) => {
                for (i, reply) in replies.into_iter().enumerate() {
                    let answer = if unknown.contains(&i) {
                        Err(e.clone())
                    } else {
                        Ok(std::mem::replace(&mut values[i], Value::Nil))
                    };
                    let _ = reply.send(answer);
                }
                return;
            }
        }
    }
    for (reply, value) in replies.into_iter().zip(values) {
        let _ = reply.send(Ok(value));
    }
}

/// The replies to `pipeline`, one per command, within `timeout`.
async fn sent(conn: &mut Conn, pipeline: &Pipeline, timeout: Duration) -> RedisResult<Vec<Value>> {
    match within(
        timeout,
        conn.req_packed_commands(pipeline, 0, pipeline.len()),
    )
    .await
    {
        Ok(Ok(values)) if values.len() == pipeline.len() => Ok(values),
        Ok(Ok(_)) => Err(RedisError::from((
            ErrorKind::Parse,
            "a pipeline reply of another length",
        ))),
        Ok(Err(e)) => Err(e),
        Err(()) => Err(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        ))),
    }
}
