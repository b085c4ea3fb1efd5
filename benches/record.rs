//! What `serve --record` costs, per decision. `record/caller` is the whole caller side (the
//! sampling counter, and the decision's frame written into the pending buffer under its lock),
//! `record/caller_hashed` the same with `--record-hash-values` (hashing is the writer's, so it
//! should not differ); a writer thread drains the pending decisions to a file meanwhile, as in the
//! server. `record/encode_line` is the writer's work per decision: encoding the JSON line.
//! `cargo bench --bench record`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratelimit_server::clock::monotonic;
use ratelimit_server::policy::Policy;
use ratelimit_server::record::{
    Answer, Decided, DropReason, FileSpec, HashKey, LivePolicy, RecordConfig, Recorder, Values,
    encode,
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

fn recorder(dir: &std::path::Path, name: &str, hash_key: Option<HashKey>) -> Recorder {
    let policy: LivePolicy = {
        let p = Arc::new(Policy::default());
        Arc::new(move || p.clone())
    };
    Recorder::start(
        RecordConfig {
            file: FileSpec {
                path: dir.join(name),
                max_bytes: 64 << 20,
                max_files: 1,
            },
            sample: 1.0,
            hash_key,
            queue: 65536,
            queue_bytes: 64 << 20,
        },
        policy,
        &prometheus::Registry::new(),
    )
    .expect("recorder")
}

fn record(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let clear = recorder(dir.path(), "clear.jsonl", None);
    let hashed = recorder(
        dir.path(),
        "hashed.jsonl",
        Some(HashKey::parse(&"5a".repeat(16)).expect("key")),
    );
    let response = RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        }],
        ..Default::default()
    };
    let requests: Vec<RateLimitRequest> = (0..1024).map(request).collect();
    let mut group = c.benchmark_group("record");
    for (name, recorder) in [("caller", &clear), ("caller_hashed", &hashed)] {
        let mut i = 0;
        let mut recorded = 0;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                // In runs of 10 000 decisions (under 1 MB of frames, the size the pending buffer
                // keeps), each timed alone; between them, untimed, the writer catches up, so no
                // decision is dropped (a dropped one would time the cheaper refusal).
                let mut timed = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let run = (iters - done).min(10_000);
                    let started = monotonic();
                    for _ in 0..run {
                        i = (i + 1) % requests.len();
                        recorder.record(black_box(1), &requests[i], Some(&response));
                    }
                    timed += monotonic() - started;
                    done += run;
                    recorded += run;
                    let m = recorder.metrics();
                    while m.lines_written() + m.dropped(DropReason::QueueFull) < recorded {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                timed
            })
        });
    }
    let request = request(7);
    let decided = Decided {
        time: 1_767_225_610_000_000_000,
        request: &request,
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
    group.finish();
    for (name, recorder) in [("clear", &clear), ("hashed", &hashed)] {
        let m = recorder.metrics();
        eprintln!(
            "record ({name}): {} lines written, {} dropped (queue full) during the benchmark",
            m.lines_written(),
            m.dropped(DropReason::QueueFull)
        );
        recorder.finish(Duration::from_secs(10));
    }
}

criterion_group!(benches, record);
criterion_main!(benches);
