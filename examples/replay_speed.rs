//! Replay speed and memory: writes `--lines` record lines (docs/record.md) for the shipped rules
//! (`config/`, domain `edge`) to a file, then replays them, measuring CPU time (/proc/self/stat: user +
//! system, not wall time) and peak RSS. As a baseline in the same run, it first only reads and
//! decodes the file (no engine).
//!
//! `cargo run --release --example replay_speed -- --lines 1000000 --keys 10000`
//!
//! The traffic: 5000 requests per virtual second; each line is one request with one descriptor,
//! a third each `remote_address=<ip>`, `api_key=<key>`, and `api_key=<key>,path=/v1/search`,
//! drawn from `--keys` values, so the keys held stay the same whatever the number of lines; and
//! `--hot` percent of the lines go to key 0 (so that one client is over its limits and the
//! replay has denials to count, as real traffic does: 10 % by default).

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use ratelimit_server::engine::EngineSettings;
use ratelimit_server::policy::Policy;
use ratelimit_server::replay::input::{Merged, Problems};
use ratelimit_server::replay::{RecordLines, Side, replay};
use ratelimit_server::rules_dir::{SizeCaps, load_rules_dir};
use ratelimit_server::wire::time::format_second;

/// User + system CPU seconds and peak RSS (KiB) of this process so far, from `/proc/self/stat`
/// (utime and stime, in the kernel's USER_HZ ticks of 1/100 s) and `/proc/self/status` (VmHWM).
fn usage() -> (f64, i64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line; after the name, field 3 is index 0.
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (cpu, peak)
}

fn write_lines(path: &PathBuf, lines: u64, keys: u64, hot: u64) -> std::io::Result<()> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    // 2026-12-01T05:00:00Z; 5000 lines per second: 200 µs apart.
    let t0: u64 = 1_796_101_200;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..lines {
        // xorshift: a fixed pseudo-random key per line.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = if x % 100 < hot { 0 } else { (x >> 8) % keys };
        let at = i * 200_000;
        let (s, ns) = (t0 + at / 1_000_000_000, at % 1_000_000_000);
        let time = format!("{}.{ns:09}Z", format_second(s).trim_end_matches('Z'));
        let entries = match i % 3 {
            0 => format!(
                "{{\"key\":\"remote_address\",\"value\":\"10.{}.{}.{}\"}}",
                k >> 16,
                (k >> 8) & 255,
                k & 255
            ),
            1 => format!("{{\"key\":\"api_key\",\"value\":\"key-{k}\"}}"),
            _ => format!(
                "{{\"key\":\"api_key\",\"value\":\"key-{k}\"}},{{\"key\":\"path\",\"value\":\"/v1/search\"}}"
            ),
        };
        writeln!(
            out,
            "{{\"v\":1,\"time\":\"{time}\",\"domain\":\"edge\",\"descriptors\":[{{\"entries\":[{entries}]}}],\"hitsAddend\":1,\"decision\":{{\"code\":\"OK\",\"statuses\":[\"OK\"]}}}}"
        )?;
    }
    out.flush()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut lines: u64 = 1_000_000;
    let mut keys: u64 = 10_000;
    let mut hot: u64 = 10;
    let mut file = std::env::temp_dir().join("ratelimit-replay-speed.jsonl");
    let mut reuse = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--lines" => lines = value()?.parse()?,
            "--keys" => keys = value()?.parse()?,
            "--hot" => hot = value()?.parse::<u64>()?.min(100),
            "--file" => file = PathBuf::from(value()?),
            "--reuse" => reuse = true,
            other => return Err(format!("unknown argument {other} (usage: replay_speed [--lines N] [--keys N] [--hot PERCENT] [--file PATH] [--reuse])").into()),
        }
    }
    if !reuse || !file.exists() {
        write_lines(&file, lines, keys, hot)?;
    }
    let bytes = std::fs::metadata(&file)?.len();
    let configs = load_rules_dir(std::path::Path::new("config"), SizeCaps::default())
        .map_err(|e| format!("config/: {} error(s)", e.0.len()))?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;

    // Baseline: read and decode only.
    let (cpu0, _) = usage();
    let mut input = Merged::open(&[&file], &RecordLines, Problems::new(20))?;
    let mut n = 0u64;
    while input.next_request()?.is_some() {
        n += 1;
    }
    let (cpu1, rss_decode) = usage();

    // The replay: decode + engine + tally.
    let mut side = Side::new(
        "config".into(),
        Policy::new(&configs),
        EngineSettings::default(),
        50_000_000,
    );
    let mut input = Merged::open(&[&file], &RecordLines, Problems::new(20))?;
    let run = rt.block_on(replay(&mut input, &mut side, None))?;
    let (cpu2, rss) = usage();

    let decode = cpu1 - cpu0;
    let full = cpu2 - cpu1;
    println!(
        "lines: {lines} ({} MB), keys: {keys}, hot: {hot}%",
        bytes / 1_000_000
    );
    println!(
        "decode only: {n} lines in {decode:.3} CPU s = {:.0} lines per CPU second",
        n as f64 / decode
    );
    println!(
        "replay: {} requests in {full:.3} CPU s = {:.0} requests per CPU second ({:.2}x the decode-only time)",
        run.lines_replayed,
        run.lines_replayed as f64 / full,
        full / decode
    );
    println!(
        "denied: {}, peak keys held: {}, peak RSS: {} MiB (after decode only: {} MiB)",
        side.denied(),
        run.peak_keys,
        rss / 1024,
        rss_decode / 1024
    );
    Ok(())
}
