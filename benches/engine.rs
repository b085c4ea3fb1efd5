//! Cost of one whole decision through the engine (validate, match, key, store, response), with
//! and without metrics, for 1 key and 100k keys, on the memory backend as the server runs it
//! (`Engine<MemoryBackend>`, statically dispatched). `cargo bench --bench engine`.

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
use ratelimit_server::store::memory::MemoryBackend;
use ratelimit_server::store::{Backend, Store};

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

fn engine<B: Backend>(backend: B, with_metrics: bool) -> Engine<B> {
    let configs = parse_files(&[("edge.yaml".into(), RULES.into())]).expect("valid rules");
    let engine = Engine::new(
        Policy::new(&configs),
        Store::new(backend),
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
            let memory = engine(MemoryBackend::new(1_000_000), with_metrics);
            run(
                c,
                &rt,
                &format!("engine/{keys}_keys/{metrics}"),
                &memory,
                &requests,
            );
        }
    }
}

fn run<B: Backend>(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    engine: &Engine<B>,
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
