//! Start-up on a Redis that is slow, cuts its replies, turns connections away, refuses us, or is
//! too old for the compare-and-set: the
//! real binary at the defaults a user gets, a real redis-server, behind a proxy whose faults
//! change while the server runs (`common::fault_proxy`) or reconfigured. Only a refusal (password,
//! ACL, TLS, protected mode) stops the start; a Redis too far, a reply cut short or a Redis at its
//! `maxclients` leaves it "unreachable": the server starts in the failure mode, says so once (and
//! what Redis said), and keeps connecting until Redis answers.

use crate::common;

use std::net::{IpAddr, UdpSocket};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use common::fault_proxy::FaultProxy;
use common::metrics::{count, scrape};
use common::process::Served;
use common::redis::{RedisServer, free_port};
use common::wait::eventually;
use common::{Code, code, request};

const RULES: &str =
    "domain: boot\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";

/// One way: a round trip of 120 ms, past the default 100 ms `REDIS_TIMEOUT`, yet near enough
/// that connecting succeeds and only the first PING times out (the server must start).
const TOO_FAR: Duration = Duration::from_millis(60);

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("boot.yaml"), RULES).unwrap();
    dir
}

fn env(redis: &str, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("BACKEND_TYPE", "redis".into()),
        ("REDIS_URL", redis.into()),
        ("CACHE_KEY_PREFIX", "boot:".into()),
    ];
    env.extend_from_slice(extra);
    env
}

fn proxy_to(redis: &RedisServer) -> FaultProxy {
    FaultProxy::start(redis.addr().parse().unwrap())
}

/// The server on Redis at `addr`, started in the failure mode: it said so once, and its first
/// request is answered OK by the default failure mode (local); its rules directory, and a client.
async fn started_in_the_failure_mode(
    addr: &str,
) -> (Served, tempfile::TempDir, RateLimitServiceClient<Channel>) {
    let rules = rules();
    let mut server = Served::with_env(rules.path(), &env(addr, &[]));
    let mut client = server.client().await;
    assert_eq!(
        server.log_lines("REDIS IS UNREACHABLE AT START-UP"),
        1,
        "{}",
        server.log()
    );
    let metrics = format!("{}/metrics", server.http);
    assert_eq!(count(&scrape(&metrics).await, "ratelimit_store_up"), 0);
    let r = client
        .should_rate_limit(request("boot", &[&[("k", "v")]]))
        .await
        .expect("answered by the failure mode")
        .into_inner();
    assert_eq!(code(r.overall_code), Code::Ok);
    (server, rules, client)
}

/// The server on Redis at `addr`, started in the failure mode (`started_in_the_failure_mode`),
/// then back on Redis once `heal` mends the way: decisions then reach Redis.
async fn starts_unreachable_then_decides(
    redis: &RedisServer,
    addr: &str,
    heal: impl FnOnce(),
) -> Served {
    let (server, rules, mut client) = started_in_the_failure_mode(addr).await;
    let metrics = format!("{}/metrics", server.http);
    heal();
    eventually("back on Redis", || async {
        count(&scrape(&metrics).await, "ratelimit_store_up") == 1
    })
    .await;
    let r = client
        .should_rate_limit(request("boot", &[&[("k", "v")]]))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(redis.keys("boot:*"), ["boot:boot|k=v|0.0.3600s"]);
    assert_eq!(
        server.log_lines("REDIS REFUSES"),
        0,
        "a slow or cut Redis is no refusal:\n{}",
        server.log()
    );
    drop(rules);
    server
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_redis_too_far_at_start_up_is_unreachable_then_decides_once_near() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let proxy = proxy_to(&redis);
    proxy.set_delay(TOO_FAR);
    let server =
        starts_unreachable_then_decides(&redis, &proxy.addr(), || proxy.set_delay(Duration::ZERO))
            .await;
    let log = server.log();
    assert!(log.contains("timed out"), "{log}");
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn replies_cut_at_start_up_never_stop_the_server() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let proxy = proxy_to(&redis);
    proxy.cut_pongs(true);
    let _server =
        starts_unreachable_then_decides(&redis, &proxy.addr(), || proxy.cut_pongs(false)).await;
    assert!(proxy.cuts() >= 1, "the first PING's reply was cut");
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn an_acl_that_refuses_the_first_ping_stops_start_up_saying_why() {
    assert!(common::redis::available());
    let redis = RedisServer::spawn(free_port(), &[], Vec::new());
    // A user that may do everything but PING: connecting succeeds, the first call is refused.
    redis
        .cli(&[
            "ACL",
            "SETUSER",
            "boot",
            "on",
            ">boot-pass",
            "~*",
            "+@all",
            "-ping",
        ])
        .expect("the user is made");
    let rules = rules();
    let log = Served::refused(
        rules.path(),
        &env(&redis.addr(), &[("REDIS_AUTH", "boot:boot-pass".into())]),
    );
    assert!(log.contains("Redis refuses this server (ACL)"), "{log}");
    assert!(
        log.contains("no permissions to run the 'ping' command"),
        "{log}"
    );
}

/// A Redis before 6.2 (Debian 11's 6.0, as envoyproxy/ratelimit's users may run: its `INCRBY`
/// and `EXPIRE` work on any) answers `PING` and loads the script, then answers every decision's
/// `SET … PXAT … GET` with a syntax error: the server served on its failure mode for good, its
/// log naming no version. Start-up now stops, naming the version and what to run instead.
#[tokio::test]
#[cfg_attr(no_redis6, ignore = "needs redis6-server (scripts/install-redis6.sh)")]
async fn a_redis_too_old_for_the_compare_and_set_stops_start_up_naming_its_version() {
    let Some(redis) = RedisServer::start_redis6() else {
        return;
    };
    let rules = rules();
    let log = Served::refused(rules.path(), &env(&redis.addr(), &[]));
    let said = format!(
        "Redis 6.0.16 (single {}) is too old for this server",
        redis.addr()
    );
    assert!(log.contains(&said), "{log}");
    assert!(
        log.contains("ERR syntax error") && log.contains("upgrade to Redis 7.0 or later"),
        "{log}"
    );
}

/// A replica named in `REDIS_URL` answers `PING` and refuses every write (`READONLY`): the server
/// served every decision from its failure mode, its log saying only `ReadOnly` once a minute.
/// Start-up now says the server is a replica, of which master, and what to set.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_replica_named_as_the_server_is_said_at_start_up_with_its_master() {
    let Some(master) = RedisServer::start() else {
        return;
    };
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let rules = rules();
    let mut server = Served::with_env(rules.path(), &env(&replica.addr(), &[]));
    server.wait_healthy().await;
    let said = "REDIS_URL names a replica";
    eventually(said, || async { server.log_lines(said) > 0 }).await;
    let line = server.lines_with(said).remove(0);
    assert!(
        line.contains("WARN") && line.contains(&format!("master=127.0.0.1:{port}")),
        "{line}"
    );
}

/// A Redis bounded by `maxmemory` with a policy that evicts drops counters when it is full: each
/// one evicted starts afresh, so its key is admitted past its limit, and nothing said so. Start-up
/// now says it, with the policy and the bound; of an unbounded Redis (the default) it says nothing.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_redis_that_evicts_keys_when_full_is_said_at_start_up() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let said = "Redis evicts keys when it reaches maxmemory";
    let rules = rules();
    let mut unbounded = Served::with_env(rules.path(), &env(&redis.addr(), &[]));
    unbounded.wait_healthy().await;
    assert_eq!(unbounded.log_lines(said), 0, "{}", unbounded.log());
    for (name, value) in [("maxmemory", "100mb"), ("maxmemory-policy", "allkeys-lru")] {
        assert_eq!(
            redis.cli(&["CONFIG", "SET", name, value]).unwrap().trim(),
            "OK"
        );
    }
    let mut evicting = Served::with_env(rules.path(), &env(&redis.addr(), &[]));
    evicting.wait_healthy().await;
    eventually(said, || async { evicting.log_lines(said) > 0 }).await;
    let line = evicting.lines_with(said).remove(0);
    assert!(
        line.contains("WARN")
            && line.contains("maxmemory_policy=allkeys-lru")
            && line.contains("maxmemory=100.00M")
            && line.contains("maxmemory-policy noeviction"),
        "{line}"
    );
}

/// A Redis at its `maxclients` (the test holds its one client) writes `ERR max number of clients
/// reached` on each connection it turns away and closes it, which redis-rs reads as a broken pipe.
/// The server starts in the failure mode saying what Redis said (it said "broken pipe", which sent
/// operators looking at the network), and decides on Redis once Redis takes clients again.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_redis_at_maxclients_at_start_up_is_unreachable_saying_so_then_decides() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mut held = redis.hold();
    assert_eq!(held.command(&["CONFIG", "SET", "maxclients", "1"]), "+OK");
    let server = starts_unreachable_then_decides(&redis, &redis.addr(), || {
        assert_eq!(
            held.command(&["CONFIG", "SET", "maxclients", "10000"]),
            "+OK"
        );
    })
    .await;
    let log = server.log();
    let said = |line: &&str| {
        line.contains("REDIS IS UNREACHABLE AT START-UP")
            && line.contains("Redis turned the connection away: ERR max number of clients reached")
    };
    assert_eq!(log.lines().filter(said).count(), 1, "{log}");
}

/// This machine's address outside the loopback (the source of a route out; nothing is sent).
fn outside_loopback() -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("198.51.100.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A Redis in protected mode (no password, bound beyond the loopback) turns away every client from
/// outside the loopback with `DENIED …` as it connects: only its operator can mend that, so start-up
/// stops and says so in Redis's words (it used to start in the failure mode saying "broken pipe",
/// and stay there).
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_redis_in_protected_mode_stops_start_up_saying_so() {
    let Some(ip) = outside_loopback() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no address outside the loopback to reach Redis from"
        );
        eprintln!("SKIPPED: no address outside the loopback to reach Redis from");
        return;
    };
    let Some(redis) = RedisServer::start_with(&["--bind", "0.0.0.0", "--protected-mode", "yes"])
    else {
        return;
    };
    let rules = rules();
    let addr = format!("{ip}:{}", redis.port);
    let log = Served::refused(rules.path(), &env(&addr, &[]));
    assert!(
        // Redis's words ("DENIED Redis is running in protected mode …"; Valkey's "DENIED Running
        // in protected mode …").
        log.contains("Redis refuses this server (protected mode): DENIED ")
            && log.contains("no password is set for the default user"),
        "{log}"
    );
}

/// `REDIS_URL` naming another service's port: here a server that greets each client as MariaDB
/// does (a handshake packet written unasked, then it waits). redis-rs reads it as a parse error
/// ("Incompatible type - Parse error at 1"); the server now says that what answers is not Redis,
/// with what it wrote, and keeps serving from the failure mode (and connecting) meanwhile.
#[tokio::test]
async fn a_server_that_is_not_redis_at_start_up_is_said_not_to_be() {
    const GREETING: &[u8] = b"J\0\0\0\n5.5.5-10.11.19-MariaDB-0+deb12u1\0";
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut conn in listener.incoming().flatten() {
            let _ = std::io::Write::write_all(&mut conn, GREETING);
            held.push(conn);
        }
    });
    let (server, _rules, _) = started_in_the_failure_mode(&addr).await;
    let log = server.log();
    let said = |line: &&str| {
        line.contains("REDIS IS UNREACHABLE AT START-UP")
            && line.contains("what answers there is not Redis: it wrote \"J\\x00\\x00\\x00\\n5.5.5-10.11.19-MariaDB")
    };
    assert_eq!(log.lines().filter(said).count(), 1, "{log}");
}
