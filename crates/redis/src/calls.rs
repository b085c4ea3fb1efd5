//! Calls to Redis, each in a task of its own and bounded by `REDIS_TIMEOUT`: plain commands counted
//! in the store's `ratelimit_redis_*` series ([`Calls::bounded`]), the compare-and-set script
//! ([`Calls::script`]: pipelined, or alone on a cluster; sent once more when its reply was lost),
//! and uncounted ones ([`Calls::quiet`], the RLQS exchange's). Remembers when Redis last answered,
//! and says when it answers slower than Envoy waits or with errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_core::clock::monotonic;
use ratelimit_core::store::StoreError;
use ratelimit_remote::Every;
use ratelimit_remote::RemoteMetrics;

use crate::cas;
use crate::conditional::ConditionalSet;
use crate::conn::{Conn, Conns};
use crate::dispatch::Dispatcher;
use crate::io::{self, within};
use crate::refusal::{self, Failure};

/// The default `timeout` of Envoy's ratelimit filter (20 ms): a call slower than this fails
/// behind an Envoy that keeps the default.
const ENVOY_FILTER_TIMEOUT: Duration = Duration::from_millis(20);

/// How often a slow Redis is said again while it stays slow.
const SLOW_WARNING_EVERY: Duration = Duration::from_secs(60);

/// How often Redis's error replies are said again while they go on.
const REFUSED_WARNING_EVERY: Duration = Duration::from_secs(60);

/// How often calls that failed without an answer (a lost connection, a timeout) are said again.
const UNANSWERED_WARNING_EVERY: Duration = Duration::from_secs(60);

/// A call's outcome before it is counted: `Err(())` when no answer came within `REDIS_TIMEOUT`.
type Sent = Result<::redis::RedisResult<::redis::Value>, ()>;

/// The connections, and how calls on them are bounded and counted.
pub(crate) struct Calls {
    conns: Arc<Conns>,
    /// Pipelines the script calls (`None` on a cluster: each call goes alone, routed by slot).
    dispatcher: Option<Arc<Dispatcher>>,
    /// Whether the server takes `SET … IFEQ … GET` (probed by [`Calls::probe_conditional_set`]).
    conditional: Arc<ConditionalSet>,
    timeout: Duration,
    /// When a call last got an answer, in ns after `epoch`.
    answered: AtomicU64,
    epoch: Instant,
    metrics: RemoteMetrics,
    /// When the last "Redis is slower than Envoy waits" warning was said.
    slow_warning: Every,
    /// When the last "Redis answered a call with an error" warning was said.
    refused_warning: Every,
    /// When the last "a call failed without an answer" warning was said.
    unanswered_warning: Every,
}

impl Calls {
    /// Calls on `conns`, each bounded by `timeout`, counted in `metrics`.
    pub(crate) fn new(conns: Arc<Conns>, timeout: Duration, metrics: RemoteMetrics) -> Calls {
        let conditional = Arc::new(ConditionalSet::default());
        let dispatcher = (!conns.is_cluster())
            .then(|| Dispatcher::start(conns.clone(), timeout, conditional.clone()));
        Calls {
            conns,
            dispatcher,
            conditional,
            timeout,
            answered: AtomicU64::new(0),
            epoch: monotonic(),
            metrics,
            slow_warning: Every::new(SLOW_WARNING_EVERY),
            refused_warning: Every::new(REFUSED_WARNING_EVERY),
            unanswered_warning: Every::new(UNANSWERED_WARNING_EVERY),
        }
    }

    /// A connection to send a command on.
    pub(crate) fn conn(&self) -> Conn {
        self.conns.get()
    }

    /// Whether the connections are to a cluster (keys are then grouped by slot).
    pub(crate) fn is_cluster(&self) -> bool {
        self.conns.is_cluster()
    }

    pub(crate) fn metrics(&self) -> &RemoteMetrics {
        &self.metrics
    }

    /// Whether any call got an answer from Redis at or after `since`.
    pub(crate) fn answered_since(&self, since: Instant) -> bool {
        let at = self.answered.load(Ordering::Relaxed);
        self.epoch + Duration::from_nanos(at) >= since
    }

    /// Sends `call` in a task of its own, bounded there by `REDIS_TIMEOUT`; counts it.
    pub(crate) async fn bounded<T: Send + 'static>(
        self: &Arc<Self>,
        call: impl Future<Output = ::redis::RedisResult<T>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let calls = self.clone();
        io::run(async move {
            let started = monotonic();
            let result = within(calls.timeout, call).await;
            calls.account(started, result)
        })
        .await
        .unwrap_or_else(|| Err(stopped()))
    }

    /// The PING that ends connecting, counted as any call: fails with `Unavailable` only if Redis
    /// refused us (`NOAUTH`, `WRONGPASS`, `NOPERM`), with `Unreachable` when it timed out or its
    /// reply was cut.
    pub(crate) async fn first_ping(self: &Arc<Self>) -> Result<(), StoreError> {
        let calls = self.clone();
        let mut c = calls.conns.get();
        io::run(async move {
            let started = monotonic();
            let ping = async move { c.ping().await };
            let result = within(calls.timeout, ping).await;
            let said = match &result {
                Ok(Err(e)) => refusal::failure(e),
                _ => Failure::Unreachable,
            };
            calls
                .account(started, result)
                .map(drop)
                .map_err(|e| refusal::at_start(e, said))
        })
        .await
        .unwrap_or_else(|| Err(stopped()))
    }

    /// The breaker's probe (`RedisBackend::probe`): `call` in a task of its own, bounded and
    /// counted as any call. Fails with `Unavailable` when Redis answered it with an error (it
    /// refuses the call: a fresh connection would be refused alike), with `Unreachable` when
    /// nothing answered (no reply in time, the connection failed).
    pub(crate) async fn probe<T: Send + 'static>(
        self: &Arc<Self>,
        call: impl Future<Output = ::redis::RedisResult<T>> + Send + 'static,
    ) -> Result<(), StoreError> {
        let calls = self.clone();
        io::run(async move {
            let started = monotonic();
            let result = within(calls.timeout, call).await;
            let refused = matches!(&result, Ok(Err(e)) if answered_with_error(e));
            match calls.account(started, result) {
                Ok(_) => Ok(()),
                Err(StoreError::Unavailable(message)) if !refused => {
                    Err(StoreError::Unreachable(message))
                }
                Err(e) => Err(e),
            }
        })
        .await
        .unwrap_or_else(|| Err(stopped()))
    }

    /// Asks the server whether it has a conditional `SET` that answers as the store needs
    /// (`cas::conditional_set_probe` on `probe_key`): with one, one-key compare-and-sets of held
    /// keys go without the script (`ConditionalSet::found` says so when it changes). A probe that
    /// fails leaves them on the script.
    pub(crate) async fn probe_conditional_set(&self, probe_key: &str) {
        let probe = cas::conditional_set_probe(probe_key);
        let mut c = self.conns.get();
        let replies = self
            .quiet(async move { probe.query_async::<Vec<::redis::Value>>(&mut c).await })
            .await;
        match replies {
            Ok(replies) => self
                .conditional
                .found(cas::conditional_set_answers(&replies)),
            // An error: no such option (or no right to use it).
            Err(StoreError::Unavailable(_)) => self.conditional.found(false),
            Err(e) => tracing::warn!(
                error = %e,
                "could not ask the Redis server whether it takes SET … IFEQ: compare-and-sets of held keys go by script"
            ),
        }
    }

    /// `call` in a task of its own within `REDIS_TIMEOUT`, not counted as a store call.
    pub(crate) async fn quiet<T: Send + 'static>(
        &self,
        call: impl Future<Output = ::redis::RedisResult<T>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let timeout = self.timeout;
        match io::run(async move { within(timeout, call).await }).await {
            Some(Ok(Ok(value))) => Ok(value),
            Some(Ok(Err(e))) => Err(StoreError::Unavailable(e.to_string())),
            Some(Err(())) => Err(StoreError::Unreachable(format!(
                "no answer from Redis within {timeout:?}"
            ))),
            None => Err(stopped()),
        }
    }

    /// One compare-and-set: sent with the others waiting (single server, Sentinel), or alone
    /// (cluster); its part of the script's reply. A Redis that does not know the script gets it
    /// loaded and the call again. A compare-and-set whose reply was lost (its connection dropped,
    /// or it timed out while Redis answered other calls) is sent once more, on the next
    /// connection: it recognises its own write if the first attempt landed, so it is charged once
    /// (`ratelimit_redis_retries`).
    pub(crate) async fn script(&self, group: cas::Group) -> Result<::redis::Value, StoreError> {
        // Shared, not copied: the retry sends the same one, and each step's future holds a
        // pointer where it held the whole (256 bytes, several times over).
        let group = Arc::new(group);
        let started = monotonic();
        let first = self.send_script(group.clone()).await;
        if !self.lost(&first, started) {
            return self.account(started, first);
        }
        let _ = self.account(started, first);
        self.metrics.retries.inc();
        let again = monotonic();
        let second = self.send_script(group).await;
        self.account(again, second)
    }

    /// Whether a call failed on the way (its reply lost), not by Redis's answer: its connection
    /// failed, or it timed out while Redis answered other calls (a timeout with nothing
    /// answered is Redis gone quiet: not sent again, so a frozen Redis costs one timeout).
    fn lost(&self, sent: &Sent, started: Instant) -> bool {
        match sent {
            Ok(Ok(_)) => false,
            Ok(Err(e)) => e.is_io_error() || e.is_connection_dropped(),
            Err(()) => self.answered_since(started),
        }
    }

    /// Sends one compare-and-set, uncounted.
    async fn send_script(&self, group: Arc<cas::Group>) -> Sent {
        let Some(dispatcher) = &self.dispatcher else {
            let mut c = self.conns.get();
            let timeout = self.timeout;
            let conditional = self.conditional.clone();
            let call =
                async move {
                    within(timeout, async move {
                        // One key only checked, expected absent, or held on a server with a
                        // conditional SET: a plain command, no script (`cas::Group::plain`).
                        if let Some(cmd) = group.plain(conditional.on()) {
                            match cmd.query_async(&mut c).await {
                                Err(e) if cas::lacks_option(&e) => conditional.lost(),
                                value => return Ok(cas::plain_reply(value?, &group)),
                            }
                        }
                        let cmd = cas::command(std::iter::once(&*group));
                        let value = script_call(&mut c, &cmd, cas::SCRIPT).await?;
                        // Its part of the reply (one that cannot be split: whole, for the writer
                        // to refuse).
                        Ok(cas::split(value, 1)
                            .map_or_else(|whole| whole, |mut parts| parts.remove(0)))
                    })
                    .await
                };
            // Boxed: this branch's state (a redis-rs query in flight) is 1.8 KB, and inline it
            // would size every decision's future, the dispatcher's branch's too.
            return Box::pin(io::run(call))
                .await
                .unwrap_or_else(|| Ok(Err(runtime_stopped())));
        };
        // The dispatcher bounded it by REDIS_TIMEOUT; a timeout is no answer.
        // Redis's error reply to the compare-and-set (out of memory, read-only, a key of another
        // type) is the call's error, as a lone call's is.
        match dispatcher.call(group).await {
            Err(e) if e.is_timeout() => Err(()),
            Ok(::redis::Value::ServerError(e)) => Ok(Err(e.into())),
            other => Ok(other),
        }
    }

    /// Counts one call's outcome (`Err(())`: no answer within `REDIS_TIMEOUT`) and turns a
    /// failure into the store's error.
    fn account<T>(
        &self,
        started: Instant,
        result: Result<::redis::RedisResult<T>, ()>,
    ) -> Result<T, StoreError> {
        let m = &self.metrics;
        let took = started.elapsed();
        m.calls.inc();
        m.latency.observe(took.as_secs_f64());
        let error = match result {
            Ok(Ok(value)) => {
                let at = monotonic().saturating_duration_since(self.epoch);
                self.answered
                    .fetch_max(at.as_nanos() as u64, Ordering::Relaxed);
                if took > ENVOY_FILTER_TIMEOUT {
                    self.slow(took, at);
                }
                return Ok(value);
            }
            Ok(Err(e)) => {
                m.error(error_kind(&e));
                if answered_with_error(&e) {
                    self.refused(&e);
                } else {
                    self.unanswered(&e.to_string());
                }
                let message = StoreError::Unavailable(e.to_string());
                self.failed(Some(e));
                message
            }
            Err(()) => {
                m.error("timeout");
                let message = format!("Redis call timed out after {:?}", self.timeout);
                self.unanswered(&message);
                self.failed(None);
                StoreError::Unavailable(message)
            }
        };
        Err(error)
    }

    /// A call answered, but later than Envoy's filter would have waited: counted, and said at
    /// most every [`SLOW_WARNING_EVERY`] (a Redis slow but within `REDIS_TIMEOUT` is otherwise
    /// invisible, while behind Envoy every such call fails by the filter's `failure_mode_deny`).
    fn slow(&self, took: Duration, at: Duration) {
        self.metrics.slow_calls.inc();
        if self.slow_warning.due(at.as_nanos() as u64) {
            tracing::warn!(
                ?took,
                envoy_timeout = ?ENVOY_FILTER_TIMEOUT,
                "Redis calls take longer than Envoy's default ratelimit filter timeout: behind such an Envoy these decisions time out (and fail open unless failure_mode_deny); raise the filter's timeout or move Redis closer (ratelimit_redis_slow_calls counts them)"
            );
        }
    }

    /// Redis answered a call with an error (`WRONGTYPE` on one key, `OOM`, `READONLY`, `NOPERM`):
    /// said at most every [`REFUSED_WARNING_EVERY`], since one key of another type fails only its
    /// own decisions and opens no breaker, which would say it.
    fn refused(&self, e: &::redis::RedisError) {
        let at = monotonic().saturating_duration_since(self.epoch);
        if self.refused_warning.due(at.as_nanos() as u64) {
            tracing::warn!(
                error = %e,
                "Redis answered a call with an error: its decisions are answered by REDIS_FAILURE_MODE (said at most once a minute; ratelimit_redis_errors{{kind=\"script\"}} counts every one)"
            );
        }
    }

    /// A call failed without an answer (its connection lost, or no answer in time): said at most
    /// every [`UNANSWERED_WARNING_EVERY`], since a Redis restarted or a connection cut now and then
    /// fails a few decisions and opens no breaker, which would say it.
    fn unanswered(&self, error: &str) {
        let at = monotonic().saturating_duration_since(self.epoch);
        if self.unanswered_warning.due(at.as_nanos() as u64) {
            tracing::warn!(
                error,
                "a Redis call failed without an answer: the connection is made again, a call whose reply was lost is sent once more, and decisions left without an answer are answered by REDIS_FAILURE_MODE; the breaker opens if failures go on (said at most once a minute; ratelimit_redis_errors{{kind=\"connection\"|\"timeout\"}} counts every one)"
            );
        }
    }

    /// Tells the connections a call failed (with Sentinel, the master may have moved), in a task
    /// of its own.
    fn failed(&self, error: Option<::redis::RedisError>) {
        let conns = self.conns.clone();
        tokio::spawn(async move { conns.failed(error.as_ref()).await });
    }
}

impl Drop for Calls {
    fn drop(&mut self) {
        if let Some(d) = &self.dispatcher {
            d.close();
        }
    }
}

/// `by_hash`, an `EVALSHA` of `script`; where Redis answers `NOSCRIPT`, the same call with the
/// script's text (`EVAL`), which that Redis then keeps. It goes to the keys' own master alone: on
/// a cluster `SCRIPT LOAD` would go to every master and fail while one is down, failing a call to
/// a master that answers. (A master may first meet a script long after start-up: a
/// compare-and-set of a key expected absent needs none.)
pub(crate) async fn script_call<T: ::redis::FromRedisValue>(
    c: &mut Conn,
    by_hash: &::redis::Cmd,
    script: &str,
) -> ::redis::RedisResult<T> {
    match by_hash.query_async(c).await {
        Err(e) if e.code() == Some("NOSCRIPT") => {
            let mut with_text = ::redis::cmd("EVAL");
            with_text.arg(script);
            // Its keys and arguments: all but `EVALSHA` and the hash.
            for arg in by_hash.args_iter().skip(2) {
                if let ::redis::Arg::Simple(bytes) = arg {
                    with_text.arg(bytes);
                }
            }
            with_text.query_async(c).await
        }
        other => other,
    }
}

/// What a call the runtime dropped (shutting down) before Redis answered says.
const STOPPED: &str = "the runtime stopped before Redis answered";

/// A call the runtime dropped before Redis answered, as the store's error.
fn stopped() -> StoreError {
    StoreError::Unavailable(STOPPED.into())
}

/// The same, as redis-rs's error (inside a call, before it is counted).
fn runtime_stopped() -> ::redis::RedisError {
    ::redis::RedisError::from((::redis::ErrorKind::Io, STOPPED))
}

/// The `ratelimit_redis_errors` kind of a failed call.
fn error_kind(e: &::redis::RedisError) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if answered_with_error(e) {
        "script"
    } else {
        "connection"
    }
}

/// Whether Redis answered the call, with an error (not a timeout or a failed connection).
fn answered_with_error(e: &::redis::RedisError) -> bool {
    !(e.is_timeout() || e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cas::{Group, Tag};
    use crate::conn::RedisConfig;
    use crate::test_redis::TestRedis;

    /// An instance whose request workers could not run for several `REDIS_TIMEOUT`s while Redis
    /// answered (here the test's one thread, blocked) takes the answer that came: the reply in the
    /// socket counts, not the timers that expired beside it. Redis I/O runs on those workers, so
    /// this is what keeps an instance short of CPU from taking itself for a Redis outage.
    #[tokio::test]
    async fn a_reply_that_came_while_the_workers_were_blocked_is_the_answer() {
        let Some(redis) = TestRedis::start() else {
            return;
        };
        let mut config = RedisConfig::single(&redis.url()).unwrap();
        // REDIS_TIMEOUT's default, as a user has it.
        config.timeout = Duration::from_millis(100);
        let conns = Conns::connect(&config).await.unwrap();
        let calls = Arc::new(Calls::new(
            Arc::new(conns),
            config.timeout,
            RemoteMetrics::unregistered("redis"),
        ));
        let group = Group::writing_absent(
            "blocked",
            Tag {
                writer: 0xb,
                seq: 1,
            },
        );

        let sending = calls.clone();
        let answer = tokio::spawn(async move { sending.script(group).await });
        // The compare-and-set handed over and written: every task on this thread has run.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        // The workers busy (a blocking stretch, not a timed assertion) well past REDIS_TIMEOUT,
        // while Redis answers.
        std::thread::sleep(config.timeout * 6);

        let answer = answer.await.unwrap();
        assert!(
            answer.is_ok(),
            "the reply that came is the answer: {answer:?}"
        );
        let timeouts = calls.metrics().errors.with_label_values(&["timeout"]).get();
        assert_eq!(timeouts, 0, "no call counted as timed out");
        assert_eq!(calls.metrics().retries.get(), 0, "nothing sent again");
    }
}
