//! The Redis side of `--backend redis`: a redis-server for the run (or the one given), emptied
//! before each run, its command counts (`INFO commandstats`) and its memory (`INFO memory`).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_server::clock::monotonic;

pub struct Redis {
    pub addr: String,
    child: Option<Child>,
    client: redis::Client,
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One `field:value` of an INFO section, as a number.
fn field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

impl Redis {
    /// Uses `url` (host:port), or starts `redis-server` (or the program `REDIS_SERVER` names, e.g.
    /// `valkey-server`) on a free port.
    pub fn start_or_use(url: Option<&str>) -> Redis {
        let (addr, child) = match url {
            Some(url) => (url.to_owned(), None),
            None => {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .expect("free port")
                    .port();
                let program =
                    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
                let child = Command::new(&program)
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| {
                        panic!("{program} on PATH (apt-get install redis-server): {e}")
                    });
                (format!("127.0.0.1:{port}"), Some(child))
            }
        };
        let client = redis::Client::open(format!("redis://{addr}")).expect("redis url");
        let redis = Redis {
            addr,
            child,
            client,
        };
        let started = monotonic();
        while redis.info("server").is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    /// redis-server's process id, when this run started it.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn info(&self, section: &str) -> Option<String> {
        let mut c = self.client.get_connection().ok()?;
        redis::cmd("INFO").arg(section).query(&mut c).ok()
    }

    fn run(&self, args: &[&str]) {
        let mut c = self.client.get_connection().expect("connect to Redis");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let _: redis::Value = cmd.query(&mut c).expect("Redis command");
    }

    /// Empties Redis, so each run starts from no counters.
    pub fn flush(&self) {
        self.run(&["FLUSHALL"]);
    }

    /// The Redis store's `MGET`s and script calls so far (`EVALSHA`, or `EVAL` when the script
    /// was not loaded yet). Its plain compare-and-sets (`SET … NX … GET`, one key expected
    /// absent) are not counted: Redis counts them with the `SET`s scripts run inside it
    /// (`cmdstat_set`). Returns (`MGET`s and script calls, of which script calls).
    pub fn commands(&self) -> (u64, u64) {
        let info = self.info("commandstats").unwrap_or_default();
        let calls = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(":calls="))
                .and_then(|v| v.split(',').next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let scripts = calls("cmdstat_evalsha") + calls("cmdstat_eval");
        (calls("cmdstat_mget") + scripts, scripts)
    }

    /// Sends `n` distinct counters (fixed window, one hour: they stay held) through the server at
    /// `addr` and reports Redis' memory growth per counter.
    pub async fn memory_per_counter(&self, addr: SocketAddr, n: usize) -> String {
        let before = field(&self.info("memory").unwrap_or_default(), "used_memory").unwrap_or(0);
        let started = monotonic();
        let client = loop {
            match RateLimitServiceClient::connect(format!("http://{addr}")).await {
                Ok(c) => break c,
                Err(_) if started.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("cannot connect to {addr}: {e}"),
            }
        };
        let gate = Arc::new(tokio::sync::Semaphore::new(64));
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let permit = gate.clone().acquire_owned().await.expect("semaphore");
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let request = RateLimitRequest {
                    domain: "load".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "held".into(),
                            value: format!("user-{i:07}"),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                };
                let ok = client.should_rate_limit(request).await.is_ok();
                drop(permit);
                ok
            }));
        }
        let mut answered = 0;
        for t in tasks {
            answered += usize::from(t.await.unwrap_or(false));
        }
        let after = field(&self.info("memory").unwrap_or_default(), "used_memory").unwrap_or(0);
        // `db0:keys=N,expires=N,avg_ttl=N`
        let keyspace = self.info("keyspace").unwrap_or_default();
        let keys: u64 = keyspace
            .lines()
            .find_map(|l| l.strip_prefix("db0:"))
            .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("keys=")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        format!(
            "Redis memory per held counter: {:.0} bytes (used_memory {} → {} with {} keys; {} of {} \
             requests answered; keys like `load:load|held=user-0000001|0.1.3600s`)",
            after.saturating_sub(before) as f64 / keys.max(1) as f64,
            before,
            after,
            keys,
            answered,
            n
        )
    }
}
