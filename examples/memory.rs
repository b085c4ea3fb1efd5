//! Memory benchmark of the in-memory store: RSS growth per held key at 1M keys, memory returned when
//! idle keys are swept, and the key-count bound holding under a flood of unique keys.
//!
//! `cargo run --release --example memory -- --keys 1000000`

use clap::Parser;
use ratelimit_server::clock::NANOS_PER_SECOND;
use ratelimit_server::config::Algorithm;
use ratelimit_server::limiter::LimitParams;
use ratelimit_server::store::memory::{KeyBuilder, MemoryBackend};
use ratelimit_server::store::{Charge, CounterId, Transaction};

#[derive(Debug, Parser)]
struct Args {
    /// Distinct keys to fill.
    #[arg(long, default_value_t = 1_000_000)]
    keys: usize,
}

/// Resident set size in bytes, from /proc/self/statm.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn fill(store: &MemoryBackend, keys: &KeyBuilder, count: usize, now: u64, algorithm: Algorithm) {
    let params = LimitParams {
        algorithm,
        requests_per_unit: 100,
        period: 60 * NANOS_PER_SECOND,
        burst: 100,
        max_delay: 0,
        charge_denied: false,
    };
    let mut value = String::new();
    for i in 0..count {
        use std::fmt::Write;
        value.clear();
        let _ = write!(value, "10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        let key = keys.key(&CounterId::new(
            "edge",
            &[("remote_address", value.as_str())],
            0,
            &params,
        ));
        store.run(Transaction::apply(
            &[Charge {
                key,
                params,
                hits: 1,
                enforced: true,
                quota: None,
            }],
            now,
        ));
    }
}

fn main() {
    let args = Args::parse();
    let keys = KeyBuilder::new(7, 9);
    let now = 1_767_225_600 * NANOS_PER_SECOND;
    println!("| measurement | value |");
    println!("|---|---|");
    for algorithm in [Algorithm::TokenBucket, Algorithm::FixedWindow] {
        // Room to spare: the bound is per shard, so a full bound starts evicting a little early.
        let store = MemoryBackend::new(args.keys * 2);
        let before = rss();
        fill(&store, &keys, args.keys, now, algorithm);
        let held = store.stats().keys;
        let grown = rss().saturating_sub(before);
        println!(
            "| {algorithm}: keys held after filling {} | {held} |",
            args.keys
        );
        println!(
            "| {algorithm}: RSS growth per held key (key = 16 bytes) | {:.1} bytes |",
            grown as f64 / held.max(1) as f64
        );
        let swept = store.sweep(now + 3600 * NANOS_PER_SECOND);
        let after_sweep = rss().saturating_sub(before);
        println!(
            "| {algorithm}: swept idle keys / RSS still held after sweep | {swept} / {:.1} MiB |",
            after_sweep as f64 / 1048576.0
        );
        drop(store);
    }
    let bound = args.keys / 10;
    let store = MemoryBackend::new(bound);
    fill(&store, &keys, args.keys, now, Algorithm::TokenBucket);
    let stats = store.stats();
    println!(
        "| flood of {} unique keys with --max-keys {bound}: keys held / evicted | {} / {} |",
        args.keys, stats.keys, stats.evictions
    );
}
