//! A fuzzer that runs on stable Rust (cargo-fuzz needs nightly): for each target, seeds from
//! `fuzz/corpus/<target>/`, then inputs mutated from them (bit flips, dictionary tokens, splices)
//! and inputs generated from the target's grammar, for a time budget. It is blind (no coverage
//! feedback); the oracles are what count: no panic, the target's own checks, and per input a time
//! and a memory bound linear in its size. A failing input is saved to `fuzz/crashes/<target>/` and
//! the run exits non-zero.
//!
//!   cargo run --example fuzz -- --seconds 60                  # all targets, the time split
//!   cargo run --example fuzz -- --target rules --seconds 30
//!   cargo run --example fuzz -- --target rules --replay fuzz/crashes/rules/crash-…
//!
//! Targets: rules, requests, json, explain, record.

mod admin;
mod input;
mod record;
mod requests;
mod rules;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use input::{Choices, mutate};
use ratelimit_server::clock::monotonic;

/// Counts live heap bytes and their peak, to bound each input's memory.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

#[allow(
    unsafe_code,
    reason = "a global allocator cannot be written without it; the package denies unsafe code \
              everywhere else (Cargo.toml [lints]), the library and the binary forbid it"
)]
// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, that is from the system allocator, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

thread_local! {
    static IN_TARGET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

const TARGETS: [&str; 5] = ["rules", "requests", "json", "explain", "record"];

/// Time one input may take: a base plus a per-byte allowance (debug builds are slow; quadratic
/// behaviour on a 64 KiB input still blows far past it).
fn time_bound(len: usize) -> Duration {
    Duration::from_millis(250) + Duration::from_micros(50) * len as u32
}

/// Heap one input may add at its peak.
fn memory_bound(len: usize) -> usize {
    (16 << 20) + len * 512
}

enum Target {
    Rules,
    Requests(Box<requests::Requests>),
    Json(Box<admin::AdminTarget>),
    Explain(Box<admin::AdminTarget>),
    Record,
}

impl Target {
    fn new(name: &str) -> Target {
        match name {
            "rules" => Target::Rules,
            "requests" => Target::Requests(Box::new(requests::Requests::new())),
            "json" => Target::Json(Box::new(admin::AdminTarget::new())),
            "explain" => Target::Explain(Box::new(admin::AdminTarget::new())),
            "record" => Target::Record,
            other => panic!("unknown target '{other}' (expected one of {TARGETS:?})"),
        }
    }

    fn dictionary(&self) -> &'static [&'static [u8]] {
        match self {
            Target::Rules => rules::DICTIONARY,
            Target::Requests(_) => &[],
            Target::Json(_) => admin::JSON_DICTIONARY,
            Target::Explain(_) => admin::QUERY_DICTIONARY,
            Target::Record => record::DICTIONARY,
        }
    }

    /// An input from the target's grammar, driven by random bytes.
    fn generate(&self, seed: &[u8]) -> Vec<u8> {
        let mut c = Choices::new(seed);
        match self {
            Target::Rules => rules::generate(&mut c),
            Target::Requests(_) => seed.to_vec(),
            Target::Json(_) => admin::generate_json(&mut c),
            Target::Explain(_) => admin::generate_query(&mut c),
            Target::Record => record::generate(&mut c),
        }
    }

    fn check(&mut self, input: &[u8]) -> Result<(), String> {
        match self {
            Target::Rules => rules::check(input),
            Target::Requests(t) => t.check(input),
            Target::Json(t) => t.check_json(input),
            Target::Explain(t) => t.check_explain(input),
            Target::Record => record::check(input),
        }
    }

    /// Runs one input under the panic, time and memory oracles.
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let started = monotonic();
        IN_TARGET.with(|t| t.set(true));
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| self.check(input)));
        IN_TARGET.with(|t| t.set(false));
        let took = started.elapsed();
        let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
        match result {
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                Err(format!("panicked: {message}"))
            }
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) if took > time_bound(input.len()) => Err(format!(
                "took {took:?} for {} bytes (bound {:?})",
                input.len(),
                time_bound(input.len())
            )),
            Ok(Ok(())) if peak > memory_bound(input.len()) => Err(format!(
                "used {peak} bytes of heap for {} bytes (bound {})",
                input.len(),
                memory_bound(input.len())
            )),
            Ok(Ok(())) => Ok(()),
        }
    }
}

fn read_dir_files(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.sort();
    paths
        .into_iter()
        .filter(|p| p.is_file())
        .filter_map(|p| std::fs::read(p).ok())
        .collect()
}

fn save_crash(root: &Path, target: &str, input: &[u8]) -> PathBuf {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    input.hash(&mut h);
    let dir = root.join("crashes").join(target);
    std::fs::create_dir_all(&dir).expect("create the crashes directory");
    let path = dir.join(format!("crash-{:016x}", h.finish()));
    std::fs::write(&path, input).expect("save the crashing input");
    path
}

struct Report {
    executions: u64,
    generated: u64,
    mutated: u64,
    crashes: Vec<(PathBuf, String)>,
}

/// Seeds, then mutations and generations until `budget` is spent.
fn fuzz(name: &str, root: &Path, budget: Duration, rng: &mut StdRng) -> Report {
    let mut target = Target::new(name);
    let corpus = read_dir_files(&root.join("corpus").join(name));
    let mut report = Report {
        executions: 0,
        generated: 0,
        mutated: 0,
        crashes: Vec::new(),
    };
    let fail = |input: &[u8], why: String, report: &mut Report| {
        let path = save_crash(root, name, input);
        eprintln!("CRASH {name}: {why}\n  input saved to {}", path.display());
        report.crashes.push((path, why));
    };
    for seed in &corpus {
        report.executions += 1;
        if let Err(why) = target.run(seed) {
            fail(seed, why, &mut report);
        }
    }
    let started = monotonic();
    while started.elapsed() < budget && report.crashes.len() < 5 {
        let input = if corpus.is_empty() || rng.random_bool(0.4) {
            let len = rng.random_range(0..512);
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            report.generated += 1;
            let made = target.generate(&bytes);
            if rng.random_bool(0.3) {
                mutate(rng, &made, &[], target.dictionary())
            } else {
                made
            }
        } else {
            let base = &corpus[rng.random_range(0..corpus.len())];
            let other = &corpus[rng.random_range(0..corpus.len())];
            report.mutated += 1;
            mutate(rng, base, other, target.dictionary())
        };
        report.executions += 1;
        if let Err(why) = target.run(&input) {
            fail(&input, why, &mut report);
        }
    }
    report
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut seconds = 60.0f64;
    let mut targets: Vec<String> = TARGETS.iter().map(|t| (*t).to_owned()).collect();
    let mut replay = None;
    let mut seed = None;
    let mut root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--seconds" => seconds = value().parse().expect("--seconds N"),
            "--target" => targets = vec![value()],
            "--replay" => replay = Some(PathBuf::from(value())),
            "--seed" => seed = Some(value().parse::<u64>().expect("--seed N")),
            "--dir" => root = PathBuf::from(value()),
            other => panic!("unknown argument {other}"),
        }
    }
    // Panics inside a target are reported by the harness with the input; others as usual.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !IN_TARGET.with(|t| t.get()) {
            default_hook(info);
        }
    }));
    if let Some(path) = replay {
        let input = std::fs::read(&path).expect("read the input to replay");
        let mut target = Target::new(&targets[0]);
        match target.run(&input) {
            Ok(()) => println!("{}: {} passes", targets[0], path.display()),
            Err(why) => {
                println!("{}: {} fails: {why}", targets[0], path.display());
                std::process::exit(1);
            }
        }
        return;
    }
    let seed = seed.unwrap_or_else(|| {
        use ratelimit_server::clock::{Clock, SystemClock};
        SystemClock.now()
    });
    println!("fuzz: seed {seed}, {seconds} s over {targets:?}");
    let mut rng = StdRng::seed_from_u64(seed);
    let budget = Duration::from_secs_f64(seconds / targets.len() as f64);
    let mut crashed = 0;
    for name in &targets {
        let started = monotonic();
        let r = fuzz(name, &root, budget, &mut rng);
        let took = started.elapsed().as_secs_f64();
        println!(
            "fuzz {name:<9} {:>8} executions in {took:.1} s ({:.0}/s; {} mutated, {} generated), {} crashes",
            r.executions,
            r.executions as f64 / took,
            r.mutated,
            r.generated,
            r.crashes.len()
        );
        crashed += r.crashes.len();
    }
    if crashed > 0 {
        println!(
            "fuzz: {crashed} crashing inputs saved under {}",
            root.join("crashes").display()
        );
        std::process::exit(1);
    }
}
