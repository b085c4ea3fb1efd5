//! The compare-and-sets of one instance, sent together: those made while others are out wait in
//! one list, and its dispatcher sends all of them in one write: one plain command
//! for each that needs no script (one key: only checked, expected absent, or held on a server
//! with a conditional `SET`; `cas::Group::plain`), and a few script calls for the others
//! (`pack`: up to 32 compare-and-sets each, each still all-or-nothing on its own keys), pipelined,
//! then hands each compare-and-set its own part of the reply. One write, one read and one script
//! set-up serve many decisions on many keys. One made while fewer than `AT_ONCE`
//! compare-and-sets are out wakes the dispatcher and goes at once (with those made beside it:
//! when a pipeline is out, the dispatcher first lets the tasks ready beside it hand theirs over),
//! so a few calls in flight, as Envoy sends them, do not wait for each other's round trips. One
//! made while more are out waits: it goes with the others waiting when a reply comes, or when the
//! dispatcher's timer next fires if none comes sooner, and is still answered within
//! `REDIS_TIMEOUT` of when it was handed over. (A second pipeline let out at once whatever the
//! first carried cost redis-server 12–15 % more per decision at 4 connections with 16 calls in
//! flight each, for 0–10 % less of the server's: docs/performance.md, "Redis I/O on the request
//! workers"; bounding what goes at once by the compare-and-sets out: docs/cost-per-decision.md,
//! "A few compare-and-sets go at once".) A script call that Redis fails as a whole (not for want
//! of the script) is sent again one compare-and-set per call, so one's error never becomes
//! another's. (Not on a cluster, whose commands are routed by slot: there each compare-and-set is
//! sent on its own.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{ErrorKind, Pipeline, RedisError, RedisResult, Value};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::cas::{self, Group};
use crate::conditional::ConditionalSet;
use crate::conn::{Conn, Conns};
use crate::io::within;
use crate::pack;

/// While fewer compare-and-sets than this are out, one made with none waiting wakes the
/// dispatcher, which sends it at once; with more out, it waits for a reply. (At 4 connections
/// with one call each, one pipeline out at a time cost a decision 17–20 % more of the server's CPU
/// and 12 % more of Redis's; with many calls in flight, each pipeline carries more than this.)
const AT_ONCE: usize = 4;

/// Most compare-and-sets in one pipeline.
const MAX_PIPELINE: usize = 256;

/// One command of a pipeline: one compare-and-set as a plain command, or a script call carrying
/// several (their indexes in the jobs sent).
enum Command {
    Plain(usize),
    Script(Vec<usize>),
}

struct Job {
    group: Arc<Group>,
    reply: oneshot::Sender<RedisResult<Value>>,
}

/// The compare-and-sets waiting to be sent, and the pipelines out.
#[derive(Default)]
struct Waiting {
    jobs: Vec<Job>,
    /// When the oldest of `jobs` was handed over.
    since: Option<Instant>,
    /// Pipelines sent and not yet answered.
    out: usize,
    /// The compare-and-sets in the pipelines out: while `AT_ONCE` or more are, a new job does
    /// not wake the dispatcher (a reply will).
    out_jobs: usize,
}

/// The list of waiting compare-and-sets and the dispatcher that sends them.
pub(super) struct Dispatcher {
    waiting: Mutex<Waiting>,
    wake: Notify,
    closed: AtomicBool,
    /// Whether one key held goes as `SET … IFEQ … GET`.
    conditional: Arc<ConditionalSet>,
}

impl Dispatcher {
    /// A dispatcher sending on `conns`, each pipeline bounded by `timeout`; it runs in a task of
    /// its own until [`Dispatcher::close`].
    pub(super) fn start(
        conns: Arc<Conns>,
        timeout: Duration,
        conditional: Arc<ConditionalSet>,
    ) -> Arc<Dispatcher> {
        let dispatcher = Arc::new(Dispatcher {
            waiting: Mutex::new(Waiting::default()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            conditional,
        });
        tokio::spawn(dispatch(dispatcher.clone(), conns, timeout));
        dispatcher
    }

    /// Sends `group` with the compare-and-sets waiting beside it; its part of the reply (a
    /// `NOSCRIPT` reply has already been answered by loading the script and calling again).
    pub(super) async fn call(&self, group: Arc<Group>) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        let wake = {
            let mut waiting = self.waiting();
            if waiting.jobs.is_empty() {
                waiting.since = Some(Instant::now());
            }
            waiting.jobs.push(Job { group, reply });
            // (The first job waiting wakes it; those after it find it woken.)
            waiting.jobs.len() == 1 && waiting.out_jobs < AT_ONCE
        };
        if wake {
            self.wake.notify_one();
        }
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
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
    // While pipelines go out, a timer fires every quarter timeout: it sends the jobs that came
    // while a pipeline was out and no reply has come since (a slow Redis, a dead connection), so
    // they still have three quarters of their timeout; and, due before any pipeline's deadline, it
    // keeps tokio's time driver from writing its own eventfd whenever a pipeline's timeout is the
    // earliest timer (a syscall and one more turn of its epoll: 0.13 per decision at 4x64). It
    // stops after a quiet period with no pipeline out.
    let period = (timeout / 4).max(Duration::from_millis(1));
    let mut keeper = std::pin::pin!(tokio::time::sleep(period));
    let (mut armed, mut sent_since) = (false, false);
    loop {
        tokio::select! {
            biased;
            () = dispatcher.wake.notified() => {
                if !armed {
                    armed = true;
                    keeper.as_mut().reset(Instant::now() + period);
                }
            }
            () = &mut keeper, if armed => {
                armed = std::mem::take(&mut sent_since) || dispatcher.waiting().out > 0;
                keeper.as_mut().reset(Instant::now() + period);
            }
        }
        if dispatcher.closed.load(Ordering::Relaxed) {
            return;
        }
        // With a pipeline out already, let the tasks ready beside this one (connections whose
        // requests came in the same wake-up) hand theirs over first, so they go in this pipeline.
        if dispatcher.waiting().out > 0 {
            tokio::task::yield_now().await;
        }
        let (mut jobs, since) = {
            let mut waiting = dispatcher.waiting();
            let jobs = std::mem::take(&mut waiting.jobs);
            waiting.out += jobs.len().div_ceil(MAX_PIPELINE);
            waiting.out_jobs += jobs.len();
            (jobs, waiting.since.take())
        };
        let Some(since) = since else { continue };
        sent_since = true;
        // Answered within `timeout` of the oldest job's hand-over (it waited at most `period`
        // behind a pipeline out), unless this instance could not send it for half of it: then
        // half a timeout from now, so a stalled process does not fail calls unsent.
        let deadline = (since + timeout).max(Instant::now() + timeout / 2);
        while !jobs.is_empty() {
            let rest = jobs.split_off(jobs.len().min(MAX_PIPELINE));
            let out = Out {
                dispatcher: dispatcher.clone(),
                jobs: jobs.len(),
            };
            let conditional = dispatcher.conditional.clone();
            tokio::spawn(send(
                conns.clone(),
                jobs,
                deadline,
                timeout,
                conditional,
                out,
            ));
            jobs = rest;
        }
    }
}

/// A pipeline out, carrying `jobs` compare-and-sets: when it is answered (or dropped), the jobs
/// that came meanwhile are sent.
struct Out {
    dispatcher: Arc<Dispatcher>,
    jobs: usize,
}

impl Drop for Out {
    fn drop(&mut self) {
        let more = {
            let mut waiting = self.dispatcher.waiting();
            waiting.out = waiting.out.saturating_sub(1);
            waiting.out_jobs = waiting.out_jobs.saturating_sub(self.jobs);
            !waiting.jobs.is_empty()
        };
        if more {
            self.dispatcher.wake.notify_one();
        }
    }
}

/// Sends `jobs` pipelined, each that can go as a plain command alone (`cas::Group::plain`), the
/// others in a few script calls (`pack`), and answers each: the pipeline's reply by `deadline`,
/// any call sent again (the script loaded, one alone) within `timeout`.
async fn send(
    conns: Arc<Conns>,
    jobs: Vec<Job>,
    deadline: Instant,
    timeout: Duration,
    conditional: Arc<ConditionalSet>,
    out: Out,
) {
    let _out = out;
    let conditional_set = conditional.on();
    let first = deadline.saturating_duration_since(Instant::now());
    let mut pipeline = Pipeline::with_capacity(jobs.len());
    let mut commands: Vec<Command> = Vec::with_capacity(jobs.len());
    let mut scripted: Vec<usize> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        match job.group.plain(conditional_set) {
            Some(cmd) => {
                pipeline.add_command(cmd);
                commands.push(Command::Plain(i));
            }
            None => scripted.push(i),
        }
    }
    for call in pack::calls(scripted.iter().map(|&i| jobs[i].group.keys.len())) {
        let call = scripted[call].to_vec();
        pipeline.add_command(cas::command(call.iter().map(|&i| &*jobs[i].group)));
        commands.push(Command::Script(call));
    }
    let mut conn = conns.get();
    let values = match replies(&mut conn, &pipeline, first, timeout).await {
        Ok(values) => values,
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    // A script call Redis failed as a whole (a key of the wrong type, say) carrying several
    // compare-and-sets: each is sent again alone, so the error is only its own. So is one sent as
    // a conditional `SET` to a server that turned out to have none.
    let mut alone: Vec<usize> = Vec::new();
    let mut answers: Vec<Option<RedisResult<Value>>> = (0..jobs.len()).map(|_| None).collect();
    for (command, value) in commands.into_iter().zip(values) {
        match (command, value) {
            (Command::Plain(i), Ok(value)) if cas::no_conditional_set(&value) => {
                conditional.lost();
                alone.push(i);
            }
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
            again.add_command(cas::command(std::iter::once(&*jobs[i].group)));
        }
        match replies(&mut conn, &again, timeout, timeout).await {
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

/// The replies to `pipeline`, one per command, within `first` (a script call Redis did not know
/// the script for is answered after loading it and sending that call again, within `timeout`):
/// `Err` when no reply came (each call's `Err` when its second attempt had none).
async fn replies(
    conn: &mut Conn,
    pipeline: &Pipeline,
    first: Duration,
    timeout: Duration,
) -> RedisResult<Vec<RedisResult<Value>>> {
    let mut values: Vec<RedisResult<Value>> = sent(conn, pipeline, first)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cas::Tag;
    use crate::conn::RedisConfig;
    use crate::test_redis::TestRedis;

    /// A compare-and-set writing key `name`, expected absent.
    fn group(name: &str, seq: u64) -> Arc<Group> {
        Arc::new(Group::writing_absent(name, Tag { writer: 0xd, seq }))
    }

    /// Waits (yielding, no timing) until the dispatcher's list says `ready`.
    async fn until(dispatcher: &Dispatcher, ready: impl Fn(&Waiting) -> bool) {
        while !ready(&dispatcher.waiting()) {
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Compare-and-sets made while fewer than `AT_ONCE` are out go at once, each without waiting
    /// for the others' replies; those made while more are out do not wake the dispatcher: they
    /// wait in the list and go out when a reply comes, not when the dispatcher's timer (a quarter
    /// of `REDIS_TIMEOUT`, here 15 minutes) would send them.
    #[tokio::test]
    async fn a_few_compare_and_sets_go_at_once_and_more_wait_for_a_reply() {
        let Some(redis) = TestRedis::start() else {
            return;
        };
        let mut config = RedisConfig::single(&redis.url()).unwrap();
        config.timeout = Duration::from_secs(3600);
        let timeout = config.timeout;
        let conns = crate::io::run(async move { Conns::connect(&config).await })
            .await
            .unwrap()
            .unwrap();
        let dispatcher = Dispatcher::start(Arc::new(conns), timeout, Default::default());
        let call = |name: &str, seq| {
            let (dispatcher, group) = (dispatcher.clone(), group(name, seq));
            tokio::spawn(async move { dispatcher.call(group).await })
        };

        redis.signal("STOP");
        let mut first = Vec::new();
        for seq in 1..=AT_ONCE {
            first.push(call(&format!("first{seq}"), seq as u64));
            until(&dispatcher, |w| w.out_jobs == seq && w.jobs.is_empty()).await;
        }
        assert_eq!(
            dispatcher.waiting().out,
            AT_ONCE,
            "each went alone, with no reply come"
        );
        let later: Vec<_> = (1..4)
            .map(|seq| call(&format!("later{seq}"), 100 + seq))
            .collect();
        until(&dispatcher, |w| w.jobs.len() == 3).await;
        assert_eq!(
            dispatcher.waiting().out_jobs,
            AT_ONCE,
            "the later ones were not sent"
        );
        redis.signal("CONT");

        let answers = tokio::time::timeout(Duration::from_secs(60), async {
            let mut answers = Vec::new();
            for call in first.into_iter().chain(later) {
                answers.push(call.await.unwrap());
            }
            answers
        })
        .await
        .expect("the later compare-and-sets went out with a reply");
        for answer in answers {
            assert_eq!(answer.unwrap(), Value::Int(1), "each wrote its key");
        }
        let mut c = redis.connection().unwrap();
        let names = (1..=AT_ONCE)
            .map(|seq| format!("first{seq}"))
            .chain((1..4).map(|seq| format!("later{seq}")));
        for name in names {
            let held: Option<Vec<u8>> = ::redis::cmd("GET").arg(&name).query(&mut c).unwrap();
            assert!(held.is_some(), "{name} was written");
        }
        // A pipeline is counted out until `send` returns, which is after it answers its jobs.
        let none_out = until(&dispatcher, |w| w.out == 0 && w.out_jobs == 0);
        tokio::time::timeout(Duration::from_secs(60), none_out)
            .await
            .expect("no pipeline is left counted out once every job is answered");
        dispatcher.close();
    }
}
