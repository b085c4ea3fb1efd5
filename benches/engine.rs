//! Cost of one whole decision through the engine (validate, match, key, store, response), with
//! and without metrics, for 1 key and 100k keys. `cargo bench --bench engine`. The `any_store`
//! rows run the same memory store behind `AnyStore` (what the server runs on), so one run shows
//! what the backend dispatch costs the memory path.
// Awaiting the engine on `AnyStore` (the Redis store with its failure handling inside) nests
// futures deeper than the default limit lets the compiler lay out in criterion's async bencher.
#![recursion_limit = "256"]

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimit_server::clock::SystemClock;
use ratelimit_server::config::parse_files;
use ratelimit_server::engine::{Engine, EngineSettings};
use ratelimit_server::metrics::Metrics;
use ratelimit_server::policy::Policy;
use ratelimit_server::store::{AnyStore, MemoryStore, Store};

const RULES: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n";

fn requests(keys: usize) -> Vec<RateLimitRequest> {
    (0..keys)
        .map(|i| RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .collect()
}

fn engine<S: Store>(store: S, with_metrics: bool) -> Engine<S> {
    let configs = parse_files(&[("edge.yaml".into(), RULES.into())]).expect("valid rules");
    let engine = Engine::new(
        Policy::new(&configs),
        Arc::new(store),
        Arc::new(SystemClock),
        EngineSettings::default(),
    );
    if with_metrics {
        engine.with_metrics(Arc::new(Metrics::new(1000)))
    } else {
        engine
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for keys in [1usize, 100_000] {
        let requests = requests(keys);
        for with_metrics in [false, true] {
            let metrics = if with_metrics {
                "with_metrics"
            } else {
                "no_metrics"
            };
            let direct = engine(MemoryStore::new(1_000_000), with_metrics);
            let any = engine(AnyStore::memory(1_000_000), with_metrics);
            run(
                c,
                &rt,
                &format!("engine/{keys}_keys/{metrics}"),
                &direct,
                &requests,
            );
            run(
                c,
                &rt,
                &format!("engine/{keys}_keys/{metrics}/any_store"),
                &any,
                &requests,
            );
        }
    }
}

fn run<S: Store>(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    engine: &Engine<S>,
    requests: &[RateLimitRequest],
) {
    let mut i = 0;
    c.bench_function(name, |b| {
        b.to_async(rt).iter(|| {
            i = (i + 1) % requests.len();
            let request = &requests[i];
            async move { engine.should_rate_limit(request).await }
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
