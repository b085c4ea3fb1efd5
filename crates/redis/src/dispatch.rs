//! The compare-and-sets of one instance, sent together: those made while the Redis I/O thread is
//! busy wait in one list, and its dispatcher sends all of them in one write: one plain command
//! for each that needs no script (one key expected absent), and a few script calls for the others
//! (`pack`: up to 32 compare-and-sets each, each still all-or-nothing on its own keys), pipelined,
//! then hands each compare-and-set its own part of the reply. One write, one read and one script
//! set-up serve many decisions on many keys; one made while nothing else waits goes out alone,
//! at once. A script call that Redis fails as a whole (not for want of the script) is sent again
//! one compare-and-set per call, so one's error never becomes another's. (Not on a cluster, whose
//! commands are routed by slot: there each compare-and-set is sent on its own.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{ErrorKind, Pipeline, RedisError, RedisResult, Value};
use tokio::sync::{Notify, oneshot};

use crate::cas::{self, Group};
use crate::conn::{Conn, Conns};
use crate::io::{self, within};
use crate::pack;

/// Most compare-and-sets in one pipeline.
const MAX_PIPELINE: usize = 256;

/// One command of a pipeline: one compare-and-set as a plain command, or a script call carrying
/// several (their indexes in the jobs sent).
enum Command {
    Plain(usize),
    Script(Vec<usize>),
}

struct Job {
    group: Group,
    reply: oneshot::Sender<RedisResult<Value>>,
}

/// The list of waiting compare-and-sets and the dispatcher that sends them.
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

    /// Sends `group` with the compare-and-sets waiting beside it; its part of the reply (a
    /// `NOSCRIPT` reply has already been answered by loading the script and calling again).
    pub(super) async fn call(&self, group: Group) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Job { group, reply });
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
    // While pipelines are sent, a timer due before any pipeline's deadline: tokio's time driver
    // writes its own eventfd (a syscall, and one more turn of its epoll) whenever a timer is set
    // that is due before every other, also from its own thread, which each pipeline's timeout did
    // after the thread had gone quiet (0.13 writes per decision at 4x64). It fires every half
    // timeout while pipelines go out, and stops after one quiet period.
    let period = (timeout / 2).max(Duration::from_millis(1));
    let mut keeper = std::pin::pin!(tokio::time::sleep(period));
    let (mut armed, mut sent_since) = (false, false);
    loop {
        tokio::select! {
            biased;
            () = dispatcher.wake.notified() => {}
            () = &mut keeper, if armed => {
                armed = std::mem::take(&mut sent_since);
                keeper.as_mut().reset(tokio::time::Instant::now() + period);
                continue;
            }
        }
        if dispatcher.closed.load(Ordering::Relaxed) {
            return;
        }
        if !armed {
            armed = true;
            keeper.as_mut().reset(tokio::time::Instant::now() + period);
        }
        sent_since = true;
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

/// Sends `jobs` pipelined, each that can go as a plain command alone (`cas::Group::plain`), the
/// others in a few script calls (`pack`), and answers each.
async fn send(conns: Arc<Conns>, jobs: Vec<Job>, timeout: Duration) {
    let mut pipeline = Pipeline::with_capacity(jobs.len());
    let mut commands: Vec<Command> = Vec::with_capacity(jobs.len());
    let mut scripted: Vec<usize> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        match job.group.plain() {
            Some(cmd) => {
                pipeline.add_command(cmd);
                commands.push(Command::Plain(i));
            }
            None => scripted.push(i),
        }
    }
    for call in pack::calls(scripted.iter().map(|&i| jobs[i].group.keys.len())) {
        let call = scripted[call].to_vec();
        pipeline.add_command(cas::command(call.iter().map(|&i| &jobs[i].group)));
        commands.push(Command::Script(call));
    }
    let mut conn = conns.get();
    let values = match replies(&mut conn, &pipeline, timeout).await {
        Ok(values) => values,
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    // A script call Redis failed as a whole (a key of the wrong type, say) carrying several
    // compare-and-sets: each is sent again alone, so the error is only its own.
    let mut alone: Vec<usize> = Vec::new();
    let mut answers: Vec<Option<RedisResult<Value>>> = (0..jobs.len()).map(|_| None).collect();
    for (command, value) in commands.into_iter().zip(values) {
        match (command, value) {
            (Command::Plain(i), value) => {
                answers[i] = Some(value.map(|v| cas::plain_reply(v, &jobs[i].group)));
            }
            (Command::Script(call), Err(e)) => {
                call.iter().for_each(|&i| answers[i] = Some(Err(e.clone())));
            }
            (Command::Script(call), Ok(Value::ServerError(_))) if call.len() > 1 => {
                alone.extend(call);
            }
            (Command::Script(call), Ok(value)) => spread(&call, value, &mut answers),
        }
    }
    if !alone.is_empty() {
        let mut again = Pipeline::with_capacity(alone.len());
        for &i in &alone {
            again.add_command(cas::command(std::iter::once(&jobs[i].group)));
        }
        match replies(&mut conn, &again, timeout).await {
            Ok(values) => {
                for (&i, value) in alone.iter().zip(values) {
                    match value {
                        Ok(value) => spread(&[i], value, &mut answers),
                        Err(e) => answers[i] = Some(Err(e)),
                    }
                }
            }
            Err(e) => alone
                .iter()
                .for_each(|&i| answers[i] = Some(Err(e.clone()))),
        }
    }
    for (job, answer) in jobs.into_iter().zip(answers) {
        let _ = job.reply.send(answer.unwrap_or_else(|| Err(gone())));
    }
}

/// Gives each compare-and-set of script call `call` its part of the call's reply `value` (a reply
/// that cannot be split goes to each whole: the writer refuses it).
fn spread(call: &[usize], value: Value, answers: &mut [Option<RedisResult<Value>>]) {
    match cas::split(value, call.len()) {
        Ok(parts) => {
            for (&i, part) in call.iter().zip(parts) {
                answers[i] = Some(Ok(part));
            }
        }
        Err(whole) => call
            .iter()
            .for_each(|&i| answers[i] = Some(Ok(whole.clone()))),
    }
}

/// The replies to `pipeline`, one per command, within `timeout` (a script call Redis did not know
/// the script for is answered after loading it and sending that call again): `Err` when no
/// reply came (each call's `Err` when its second attempt had none).
async fn replies(
    conn: &mut Conn,
    pipeline: &Pipeline,
    timeout: Duration,
) -> RedisResult<Vec<RedisResult<Value>>> {
    let mut values: Vec<RedisResult<Value>> = sent(conn, pipeline, timeout)
        .await?
        .into_iter()
        .map(Ok)
        .collect();
    let unknown: Vec<usize> = (0..values.len())
        .filter(|&i| matches!(&values[i], Ok(v) if cas::unknown_script(v)))
        .collect();
    if unknown.is_empty() {
        return Ok(values);
    }
    // Redis forgot the script (restarted, failed over): load it and send those again.
    let mut again = Pipeline::with_capacity(unknown.len() + 1);
    again.add_command(cas::load());
    for &i in &unknown {
        if let Some(cmd) = pipeline.cmd_iter().nth(i) {
            again.add_command(cmd.clone());
        }
    }
    match sent(conn, &again, timeout).await {
        Ok(retried) => {
            for (&i, value) in unknown.iter().zip(retried.into_iter().skip(1)) {
                values[i] = Ok(value);
            }
        }
        Err(e) => unknown.iter().for_each(|&i| values[i] = Err(e.clone())),
    }
    Ok(values)
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
