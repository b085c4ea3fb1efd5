//! Redis Cluster: three masters made by the test (`--cluster-enabled yes` and
//! `redis-cli --cluster create`). The store contract holds on it; keys of several domains spread
//! over the masters while a request's keys share one slot; two server processes racing admit
//! exactly the limit; a two-descriptor request that cannot fit charges neither.

mod common;

use std::time::Duration;

use common::contract::{charges, params, run, trace};
use common::race::{fire, shared_rules};
use common::redis::{RedisServer, ServerProcess, available, free_port};
use ratelimit_server::clock::monotonic;
use ratelimit_server::clock::{Clock, SystemClock};
use ratelimit_server::config::Algorithm;
use ratelimit_server::store::{AnyStore, RedisConfig, Store, Topology};
use redis::IntoConnectionInfo;

/// A free port whose cluster bus port (+10000) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

struct Cluster {
    nodes: Vec<RedisServer>,
}

impl Cluster {
    fn start() -> Option<Cluster> {
        if !available() {
            return None;
        }
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::spawn(
                    cluster_port(),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ],
                    Vec::new(),
                )
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(RedisServer::addr).collect();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        nodes[0].cli(&args).expect("redis-cli --cluster create");
        let started = monotonic();
        while !nodes.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"])
                .is_ok_and(|i| i.contains("cluster_state:ok"))
        }) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "cluster never became ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(Cluster { nodes })
    }

    fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::addr)
            .collect::<Vec<_>>()
            .join(",")
    }

    async fn store(&self, prefix: &str) -> AnyStore {
        let mut config = RedisConfig::single("redis://127.0.0.1:1").unwrap();
        config.topology = Topology::Cluster(
            self.nodes
                .iter()
                .map(|n| n.url().as_str().into_connection_info().unwrap())
                .collect(),
        );
        config.prefix = prefix.into();
        AnyStore::redis(&config).await.expect("cluster connects")
    }

    /// Keys per master matching `pattern`.
    fn keys_per_master(&self, pattern: &str) -> Vec<usize> {
        self.nodes.iter().map(|n| n.keys(pattern).len()).collect()
    }
}

#[tokio::test]
async fn the_store_contract_holds_on_a_cluster_and_domains_spread_over_masters() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let base = SystemClock.now();
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let steps = trace(100 + i as u64, algorithm, 80);
        let memory = AnyStore::memory(10_000);
        let shared = cluster.store(&format!("c{i}:")).await;
        assert_eq!(
            run(&memory, base, &steps).await,
            run(&shared, base, &steps).await,
            "{algorithm}"
        );
    }
    let store = cluster.store("spread:").await;
    let p = params(Algorithm::FixedWindow, 10, 3600, 10);
    for d in 0..30 {
        let domain = format!("domain{d}");
        let c: Vec<_> = ["a", "b"]
            .iter()
            .map(|v| ratelimit_server::store::Charge {
                key: store.key(&domain, [("user", *v)], 0, &p),
                params: p,
                hits: 1,
                enforced: true,
                quota: None,
            })
            .collect();
        assert!(
            store
                .apply(&c, base)
                .await
                .unwrap()
                .iter()
                .all(|v| v.charged)
        );
        // Both keys of the request are in one slot (the domain's hash tag).
        let slots: Vec<String> = ["a", "b"]
            .iter()
            .map(|v| {
                cluster.nodes[0]
                    .cli(&[
                        "CLUSTER",
                        "KEYSLOT",
                        &format!("spread:{{{domain}}}|user={v}|0.1.3600s"),
                    ])
                    .unwrap()
            })
            .collect();
        assert_eq!(slots[0], slots[1]);
    }
    let per_master = cluster.keys_per_master("spread:*");
    eprintln!("keys per master: {per_master:?}");
    assert_eq!(per_master.iter().sum::<usize>(), 60);
    assert!(
        per_master.iter().all(|&n| n > 0),
        "30 domains land on all three masters: {per_master:?}"
    );
}

#[tokio::test]
async fn a_request_that_cannot_fit_charges_neither_descriptor() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let store = cluster.store("aon:").await;
    let now = SystemClock.now();
    let roomy = params(Algorithm::TokenBucket, 10, 3600, 10);
    let tight = params(Algorithm::TokenBucket, 1, 3600, 1);
    let both = [("a", 0, roomy, 1, true), ("b", 0, tight, 1, true)];
    let v = store.apply(&charges(&store, &both), now).await.unwrap();
    assert!(v.iter().all(|v| v.charged));
    let v = store.apply(&charges(&store, &both), now).await.unwrap();
    assert!(v[0].allowed && !v[0].charged && !v[1].allowed, "{v:?}");
    let v = store
        .apply(&charges(&store, &[("a", 0, roomy, 0, true)]), now)
        .await
        .unwrap();
    assert_eq!(v[0].outlook.remaining, 9, "a was charged once, not twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_on_a_cluster_admit_exactly_the_limit() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let rules = shared_rules();
    let env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_TYPE", "cluster".into()),
        ("REDIS_URL", cluster.seeds()),
        ("CACHE_KEY_PREFIX", "it:".into()),
        // Exact while Redis answers: see redis_servers::redis_env.
        ("REDIS_TIMEOUT", "30s".into()),
        ("REDIS_FAILURE_MODE", "error".into()),
    ];
    let mut a = ServerProcess::start(rules.path(), &env);
    let mut b = ServerProcess::start(rules.path(), &env);
    let (ca, cb) = (a.client().await, b.client().await);
    for key in ["tb", "fw", "sw"] {
        let (oa, ob) = tokio::join!(
            fire(ca.clone(), key, "hot".into(), 1000, 64),
            fire(cb.clone(), key, "hot".into(), 1000, 64),
        );
        eprintln!("{key}: {oa} + {ob}");
        assert_eq!(oa + ob, 300, "{key}");
    }
}
