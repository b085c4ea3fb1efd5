//! Sentinel: one master, one replica, one sentinel (redis-server --sentinel with a conf the test
//! writes); the server finds the master through the sentinel and decides there, and follows a
//! failover without a restart.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::process::Served;
use common::redis::{RedisServer, free_port};
use common::wait::eventually_blocking;
use common::{Code, code, request};
use ratelimit_server::clock::monotonic;

struct Sentinel {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    cli_as(port, &[], args)
}

/// redis-cli at `port` with `auth` (`-a`, `--user` …) before `args`.
fn cli_as(port: u16, auth: &[&str], args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--no-auth-warning",
        ])
        .args(auth)
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A master, its replica and a sentinel watching them, and a rules directory with `rules`.
struct Topology {
    master: RedisServer,
    replica: RedisServer,
    sentinel: Sentinel,
    rules: tempfile::TempDir,
}

fn topology(rules: &str) -> Option<Topology> {
    let master = RedisServer::start()?;
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let sentinel = sentinel(master.port);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.yaml"), rules).unwrap();
    Some(Topology {
        master,
        replica,
        sentinel,
        rules: dir,
    })
}

fn sentinel(master_port: u16) -> Sentinel {
    sentinel_with(master_port, "", &[])
}

/// A sentinel watching the master at `master_port`, with `extra` lines added to its configuration
/// and asked by redis-cli with `auth`.
fn sentinel_with(master_port: u16, extra: &str, auth: &[&str]) -> Sentinel {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
             sentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds mymaster 5000\n{extra}",
            dir.path().display()
        ),
    )
    .unwrap();
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server --sentinel");
    let s = Sentinel {
        port,
        child,
        _dir: dir,
    };
    eventually_blocking("sentinel never knew the master", || {
        cli_as(
            port,
            auth,
            &["SENTINEL", "get-master-addr-by-name", "mymaster"],
        )
        .contains(&master_port.to_string())
    });
    s
}

/// Three calls on `s` `k=v` (its rules allow two an hour), once the server decides on Redis: their
/// codes. On a loaded machine the server may start in the failure mode (Sentinel and master slow
/// to answer) and reach Redis a moment later: the tests are about decisions on Redis.
async fn three_calls(server: &mut Served) -> Vec<Code> {
    let mut client = server.client().await;
    server.wait_for_metric("ratelimit_store_up", 1).await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("s", &[&[("k", "v")]]))
            .await
            .expect("answered")
            .into_inner();
        codes.push(code(r.overall_code));
    }
    codes
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn the_server_finds_the_master_through_the_sentinel() {
    let Some(Topology {
        master,
        replica,
        sentinel,
        rules,
    }) = topology(
        "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    else {
        return;
    };
    let env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_TYPE", "SENTINEL".into()),
        ("REDIS_URL", format!("mymaster,127.0.0.1:{}", sentinel.port)),
        ("CACHE_KEY_PREFIX", "sn:".into()),
    ];
    let mut server = Served::with_env(rules.path(), &env);
    assert_eq!(
        three_calls(&mut server).await,
        [Code::Ok, Code::Ok, Code::OverLimit]
    );
    assert_eq!(
        master.keys("sn:*"),
        ["sn:s|k=v|0.0.3600s"],
        "written on the master"
    );
    eventually_blocking("never replicated", || !replica.keys("sn:*").is_empty());
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn after_a_failover_the_server_follows_the_new_master_and_keeps_counting() {
    let Some(Topology {
        master,
        replica,
        sentinel,
        rules,
    }) = topology(
        "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}\n",
    )
    else {
        return;
    };
    let env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_TYPE", "sentinel".into()),
        ("REDIS_URL", format!("mymaster,127.0.0.1:{}", sentinel.port)),
        ("REDIS_TIMEOUT", "500ms".into()),
    ];
    let mut server = Served::with_env(rules.path(), &env);
    let mut client = server.client().await;
    // On a loaded machine the server may start in the failure mode (Sentinel and master slow to
    // answer) and reach Redis a moment later: the test is about decisions on Redis.
    server.wait_for_metric("ratelimit_store_up", 1).await;
    let mut call = async || {
        client
            .should_rate_limit(request("s", &[&[("k", "v")]]))
            .await
            .map(|r| {
                (
                    code(r.get_ref().overall_code),
                    r.get_ref().statuses[0].limit_remaining,
                )
            })
    };
    assert_eq!(call().await.unwrap(), (Code::Ok, 4));
    assert_eq!(call().await.unwrap(), (Code::Ok, 3));
    eventually_blocking("never replicated", || {
        !replica
            .cli(&["GET", "s|k=v|0.1.3600s"])
            .unwrap_or_default()
            .trim()
            .is_empty()
    });
    assert!(cli(sentinel.port, &["SENTINEL", "FAILOVER", "mymaster"]).contains("OK"));
    eventually_blocking("failover never happened", || {
        cli(
            sentinel.port,
            &["SENTINEL", "get-master-addr-by-name", "mymaster"],
        )
        .contains(&replica.port.to_string())
    });
    // Until Sentinel turns the old master into a replica it still takes writes (any Sentinel
    // client can lose those); from then on the server must follow to the new master.
    // While Sentinel reconfigures it, the old master may close the connection of an INFO: that
    // is "not yet", not a failure (seen once in 10 runs with both cores busy).
    eventually_blocking("old master never demoted", || {
        master
            .cli(&["INFO", "replication"])
            .is_ok_and(|info| info.contains("role:slave"))
    });
    // The next calls may fail while the server notices; then it decides on the new master, where
    // the count went on.
    let started = monotonic();
    let mut failed = 0;
    let answer = loop {
        match call().await {
            Ok(answer) => break answer,
            Err(_) => failed += 1,
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never followed the failover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "followed the failover after {failed} failed call(s) in {:?}",
        started.elapsed()
    );
    assert_eq!(answer, (Code::Ok, 2));
    assert_eq!(call().await.unwrap(), (Code::Ok, 1));
    let held = replica.cli(&["GET", "s|k=v|0.1.3600s"]);
    // Both answers came from the new master (not from the failure mode, which would have
    // counted them locally and written them back only at a later decision).
    assert!(
        held.as_deref().is_ok_and(|v| v
            .trim()
            .split(';')
            .next()
            .is_some_and(|s| s.ends_with(":4"))),
        "the new master holds {held:?}; failure-mode decisions {}; log:\n{}",
        server
            .metric("ratelimit_store_failure_mode_decisions")
            .await,
        server.log()
    );
}

/// A sentinel's address given as a single Redis (`REDIS_TYPE` left at `single`): the sentinel
/// answers the first `PING`, then refuses every decision (`unknown command 'EVALSHA'`), and the
/// server used to run on its failure mode for good, the log naming neither. Start-up now stops,
/// saying what to set.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_sentinel_named_as_a_single_redis_stops_start_up_saying_what_to_set() {
    let Some(topology) = topology("domain: s\ndescriptors:\n  - key: k\n") else {
        return;
    };
    let sentinel = format!("127.0.0.1:{}", topology.sentinel.port);
    let env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_URL", sentinel.clone()),
    ];
    let log = Served::refused(topology.rules.path(), &env);
    assert!(
        log.contains(&format!(
            "REDIS_URL {sentinel} is a Redis Sentinel, not a Redis server: set REDIS_TYPE=sentinel"
        )),
        "{log}"
    );
}

/// Sentinels with a password of their own (`requirepass` in sentinel.conf; Bitnami's chart sets
/// one by default) and a master with another: envoyproxy/ratelimit asks the sentinels with
/// `REDIS_SENTINEL_AUTH` and the master with `REDIS_AUTH`. Without the sentinels' password start-up
/// stops naming the setting (it used to say only "NOAUTH", as if the master had refused); with
/// both, decisions are made on the master.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn sentinels_with_a_password_of_their_own_are_asked_with_redis_sentinel_auth() {
    if !common::redis::available() {
        return;
    }
    let master = RedisServer::spawn(
        free_port(),
        &["--requirepass", "master-pass"],
        ["-a", "master-pass", "--no-auth-warning"]
            .map(String::from)
            .to_vec(),
    );
    let sentinel = sentinel_with(
        master.port,
        "requirepass sentinel-pass\nsentinel auth-pass mymaster master-pass\n",
        &["-a", "sentinel-pass"],
    );
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("s.yaml"),
        "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .unwrap();
    let env = |sentinel_auth: Option<&str>| {
        let mut env = vec![
            ("BACKEND_TYPE", "redis".to_string()),
            ("REDIS_TYPE", "sentinel".into()),
            ("REDIS_URL", format!("mymaster,127.0.0.1:{}", sentinel.port)),
            ("REDIS_AUTH", "master-pass".into()),
        ];
        env.extend(sentinel_auth.map(|a| ("REDIS_SENTINEL_AUTH", a.to_string())));
        env
    };
    let log = Served::refused(rules.path(), &env(None));
    assert!(
        log.contains("the sentinels refuse this server")
            && log.contains("set REDIS_SENTINEL_AUTH (REDIS_AUTH is the master's)"),
        "{log}"
    );
    let log = Served::refused(rules.path(), &env(Some("master-pass")));
    assert!(
        log.contains("REDIS_SENTINEL_AUTH is not the password they take"),
        "{log}"
    );

    let mut server = Served::with_env(rules.path(), &env(Some("sentinel-pass")));
    assert_eq!(
        three_calls(&mut server).await,
        [Code::Ok, Code::Ok, Code::OverLimit]
    );
    assert_eq!(
        master.keys("s|*"),
        ["s|k=v|0.0.3600s"],
        "counted on the master"
    );
}
