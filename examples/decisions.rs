//! A fixed run of decisions in the memory store (key hash + lock + algorithm + write, as in
//! `benches/decision.rs`), for counting instructions: on this shared machine wall time varies by
//! ±30 % from run to run, an instruction count under callgrind does not.
//!
//! `cargo build --release --example decisions`, then
//! `valgrind --tool=callgrind target/release/examples/decisions --algorithm token_bucket --keys 1`
//! then subtract a run with `--decisions 0` (the set-up: formatting the key strings, about 0.4M
//! instructions with 1 key and 145M with 100k keys) and divide by `--decisions`.

use std::hint::black_box;

use clap::Parser;
use ratelimit_server::clock::NANOS_PER_SECOND;
use ratelimit_server::config::Algorithm;
use ratelimit_server::limiter::LimitParams;
use ratelimit_server::settings::parse_algorithm;
use ratelimit_server::store::memory::{KeyBuilder, MemoryBackend};
use ratelimit_server::store::{Charge, CounterId, Transaction};

#[derive(Debug, Parser)]
struct Args {
    /// token_bucket, fixed_window, sliding_window or leaky_bucket.
    #[arg(long, default_value = "token_bucket", value_parser = parse_algorithm)]
    algorithm: Algorithm,
    /// Distinct keys, visited round robin.
    #[arg(long, default_value_t = 1)]
    keys: usize,
    #[arg(long, default_value_t = 1_000_000)]
    decisions: usize,
}

fn main() {
    let args = Args::parse();
    let params = LimitParams {
        algorithm: args.algorithm,
        requests_per_unit: u32::MAX,
        period: NANOS_PER_SECOND,
        burst: u32::MAX,
        max_delay: NANOS_PER_SECOND,
        charge_denied: false,
    };
    let keys = KeyBuilder::new(1, 2);
    let store = MemoryBackend::new(args.keys.max(1_000_000));
    let values: Vec<String> = (0..args.keys.max(1))
        .map(|i| format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255))
        .collect();
    let mut now = 1_767_225_600 * NANOS_PER_SECOND;
    let mut allowed = 0usize;
    for i in 0..args.decisions {
        now += 1;
        let value = values[i % values.len()].as_str();
        let key = keys.key(&CounterId::new(
            "edge",
            &[("remote_address", black_box(value))],
            0,
            &params,
        ));
        let charge = Charge {
            key,
            params,
            hits: 1,
            enforced: true,
            quota: None,
        };
        allowed += usize::from(store.run(Transaction::apply(black_box(&[charge]), now))[0].allowed);
    }
    println!(
        "{} decisions ({} allowed), {}, {} keys",
        args.decisions, allowed, args.algorithm, args.keys
    );
}
