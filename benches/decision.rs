//! Cost of one decision in the memory store: key hashing + shard lock + algorithm, for 1 key and
//! for 100k keys (round robin), for each of the four algorithms; and the algorithm alone
//! (`evaluate/<algorithm>`), and with two threads racing on the same store
//! (`decision_2_threads/…`). `cargo bench --bench decision`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ratelimit_server::clock::NANOS_PER_SECOND;
use ratelimit_server::clock::monotonic;
use ratelimit_server::config::Algorithm;
use ratelimit_server::limiter::{self, LimitParams};
use ratelimit_server::store::memory::{KeyBuilder, MemoryBackend, StoreKey};
use ratelimit_server::store::{Charge, CounterId, Transaction};

fn params(algorithm: Algorithm) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_unit: u32::MAX,
        period: NANOS_PER_SECOND,
        burst: u32::MAX,
        max_delay: NANOS_PER_SECOND,
        charge_denied: false,
    }
}

/// The `i`th client address, `10.x.y.z`, written into `buf`. A server finds a descriptor's value in
/// the request it has just decoded, hot in cache; formatting it here (a few ns, and counted in the
/// figure) rather than reading it from a table of 100k strings keeps the benchmark's own data from
/// crowding the store's table out of the cache.
fn client_address(i: usize, buf: &mut [u8; 15]) -> &str {
    let mut len = 0;
    for (n, octet) in [10, (i >> 16) & 255, (i >> 8) & 255, i & 255]
        .into_iter()
        .enumerate()
    {
        if n > 0 {
            buf[len] = b'.';
            len += 1;
        }
        let mut digits = [0u8; 3];
        let mut d = 0;
        let mut v = octet;
        loop {
            digits[d] = b'0' + (v % 10) as u8;
            d += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        for k in (0..d).rev() {
            buf[len] = digits[k];
            len += 1;
        }
    }
    std::str::from_utf8(&buf[..len]).expect("ASCII digits and dots")
}

fn decision(c: &mut Criterion) {
    let keys = KeyBuilder::new(1, 2);
    for algorithm in Algorithm::ALL {
        for key_count in [1usize, 100_000] {
            let store = MemoryBackend::new(1_000_000);
            let p = params(algorithm);
            let mut i = 0usize;
            let mut now = 1_767_225_600 * NANOS_PER_SECOND;
            c.bench_function(&format!("decision/{algorithm}/{key_count}_keys"), |b| {
                b.iter(|| {
                    i = (i + 1) % key_count;
                    now += 1;
                    let mut buf = [0u8; 15];
                    let value = client_address(i, &mut buf);
                    let key =
                        keys.key(&CounterId::new("edge", &[("remote_address", value)], 0, &p));
                    let charge = Charge {
                        key,
                        params: p,
                        hits: 1,
                        enforced: true,
                        quota: None,
                    };
                    black_box(store.run(Transaction::apply(black_box(&[charge]), now)))
                })
            });
        }
    }
}

/// Two threads deciding at once on the same store and keys: time per decision on each thread
/// (wall time of `iters` decisions per thread), so contention on shard locks shows as a slowdown
/// against the single-threaded figure.
fn decision_two_threads(c: &mut Criterion) {
    let keys = KeyBuilder::new(1, 2);
    for algorithm in Algorithm::ALL {
        for key_count in [1usize, 100_000] {
            let store = std::sync::Arc::new(MemoryBackend::new(1_000_000));
            let p = params(algorithm);
            let charges: std::sync::Arc<Vec<Charge<StoreKey>>> = std::sync::Arc::new(
                (0..key_count)
                    .map(|i| Charge {
                        key: keys.key(&CounterId::new(
                            "edge",
                            &[(
                                "remote_address",
                                format!("10.0.{}.{}", i / 256, i % 256).as_str(),
                            )],
                            0,
                            &p,
                        )),
                        params: p,
                        hits: 1,
                        enforced: true,
                        quota: None,
                    })
                    .collect(),
            );
            c.bench_function(
                &format!("decision_2_threads/{algorithm}/{key_count}_keys"),
                |b| {
                    b.iter_custom(|iters| {
                        let start = monotonic();
                        let threads: Vec<_> = (0..2u64)
                            .map(|t| {
                                let (store, charges) = (store.clone(), charges.clone());
                                std::thread::spawn(move || {
                                    let mut now = 1_767_225_600 * NANOS_PER_SECOND + t;
                                    for i in 0..iters as usize {
                                        now += 2;
                                        let charge = charges[(i * 7 + t as usize) % charges.len()];
                                        black_box(
                                            store
                                                .run(Transaction::apply(black_box(&[charge]), now)),
                                        );
                                    }
                                })
                            })
                            .collect();
                        for t in threads {
                            t.join().expect("bench thread");
                        }
                        start.elapsed()
                    })
                },
            );
        }
    }
}

/// Building a store key alone: the counter's identity, then its keyed hash (domain, descriptor
/// entries, limit).
fn key(c: &mut Criterion) {
    let keys = KeyBuilder::new(1, 2);
    let p = params(Algorithm::TokenBucket);
    let mut i = 0usize;
    c.bench_function("key/one_entry", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let mut buf = [0u8; 15];
            let value = client_address(i, &mut buf);
            black_box(keys.key(&CounterId::new(
                black_box("edge"),
                &[("remote_address", value)],
                0,
                &p,
            )))
        })
    });
}

/// The machine's own cost of one cache miss, as a baseline for the 100k-key figures: a chain of
/// dependent reads in random order through 4 MiB, about the size of the store's table at 100k keys
/// (32-byte slots at hashbrown's load factor) and twice this machine's L2. A 100k-key decision
/// pays about one such read more than a 1-key decision; on a shared VM its cost moves with the
/// neighbours' load, so compare the two in the same run.
fn memory_latency(c: &mut Criterion) {
    const LINES: usize = 4 * 1024 * 1024 / 64;
    // next[i] = the line visited after line i: a random permutation of the lines, walked in order,
    // so every read depends on the one before and the walk is one cycle through all of them.
    let mut order: Vec<usize> = (0..LINES).collect();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..LINES).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        order.swap(i, (seed % i as u64) as usize);
    }
    let mut next = vec![[0usize; 8]; LINES];
    for w in 0..LINES {
        next[order[w]][0] = order[(w + 1) % LINES];
    }
    let mut at = 0usize;
    c.bench_function("memory_latency/random_read_4MiB", |b| {
        b.iter(|| {
            at = next[at][0];
            black_box(at)
        })
    });
}

/// The algorithm alone: one `limiter::evaluate` on a state carried from call to call.
fn evaluate(c: &mut Criterion) {
    for algorithm in Algorithm::ALL {
        let p = params(algorithm);
        let mut state = None;
        let mut now = 1_767_225_600 * NANOS_PER_SECOND;
        c.bench_function(&format!("evaluate/{algorithm}"), |b| {
            b.iter(|| {
                now += 1;
                let e = limiter::evaluate(black_box(&p), state, now, 1);
                state = Some(e.state_after);
                black_box(e)
            })
        });
    }
}

criterion_group!(
    benches,
    decision,
    decision_two_threads,
    key,
    evaluate,
    memory_latency
);
criterion_main!(benches);
