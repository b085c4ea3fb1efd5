//! What `serve --record` costs the caller of a decision, per decision: `record/try_send` is the
//! whole caller side (sampling counter, answer codes, `try_send` of the moved request; the request
//! is built outside the timing), against what the alternatives would add on the caller:
//! `record/encode_line` (encoding the JSON line there instead of on the writer thread) and
//! `record/clone_request` (copying the request, had the faces not owned it).
//! `cargo bench --bench record`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratelimit_server::policy::Policy;
use ratelimit_server::record::{
    Answer, Decided, FileSpec, LivePolicy, RecordConfig, Recorder, Values, encode,
};

fn request(i: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "remote_address".into(),
                    value: format!("10.0.{}.{}", (i >> 8) & 255, i & 255),
                },
                Entry {
                    key: "path".into(),
                    value: "/v1/search".into(),
                },
            ],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

fn record(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let policy: LivePolicy = {
        let p = Arc::new(Policy::default());
        Arc::new(move || p.clone())
    };
    let recorder = Recorder::start(
        RecordConfig {
            file: FileSpec {
                path: dir.path().join("bench.jsonl"),
                max_bytes: 64 << 20,
                max_files: 1,
            },
            sample: 1.0,
            hash_key: None,
            queue: 65536,
            queue_bytes: 64 << 20,
        },
        policy,
        &prometheus::Registry::new(),
    )
    .expect("recorder");
    let response = RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut group = c.benchmark_group("record");
    let mut i = 0;
    group.bench_function("try_send", |b| {
        b.iter_batched(
            || {
                i += 1;
                request(i)
            },
            |r| recorder.record(black_box(1), r, Some(&response)),
            BatchSize::SmallInput,
        )
    });
    let decided = Decided {
        time: 1_767_225_610_000_000_000,
        request: request(7),
        answer: Some(Answer {
            code: Code::Ok as i32,
            statuses: [Code::Ok as i32].into_iter().collect(),
        }),
    };
    let mut line = Vec::with_capacity(512);
    group.bench_function("encode_line", |b| {
        b.iter(|| {
            line.clear();
            encode(black_box(&decided), &Values::Clear, &mut line);
            black_box(line.len())
        })
    });
    group.bench_function("clone_request", |b| {
        b.iter(|| black_box(decided.request.clone()))
    });
    group.finish();
    let m = recorder.metrics();
    eprintln!(
        "record: {} lines written, {} dropped (queue full) during the benchmark",
        m.lines.get(),
        m.dropped(ratelimit_server::record::DropReason::QueueFull)
    );
    recorder.finish(std::time::Duration::from_secs(10));
}

criterion_group!(benches, record);
criterion_main!(benches);
