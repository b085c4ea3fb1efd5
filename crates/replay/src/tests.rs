//! The replay driven end to end in the library: record lines (written here in the documented
//! format) through real engines and memory stores.

use std::io::Cursor;
use std::path::Path;

use super::input::{Merged, Problems};
use super::tally::DiffTally;
use super::*;
use ratelimit_core::clock::NANOS_PER_SECOND;

const T0: Nanos = 1_796_101_200 * NANOS_PER_SECOND; // 2026-12-01T05:00:00Z

/// A record line as `serve --record` writes it (docs/record.md, version 1).
fn line(at: Nanos, domain: &str, entries: &[(&str, &str)]) -> String {
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    let seconds = at / NANOS_PER_SECOND;
    let time = format!(
        "{}.{:09}Z",
        ratelimit_core::wire::time::format_second(seconds).trim_end_matches('Z'),
        at % NANOS_PER_SECOND
    );
    serde_json::json!({
        "v": 1,
        "time": time,
        "domain": domain,
        "descriptors": [{"entries": entries}],
        "decision": {"code": "OK", "statuses": ["OK"]},
    })
    .to_string()
        + "\n"
}

fn policy(yaml: &str) -> Policy {
    let configs = ratelimit_core::config::parse_files(&[("t.yaml".into(), yaml.to_owned())])
        .expect("valid rules");
    Policy::new(&configs)
}

fn side(yaml: &str) -> Side {
    Side::new(
        "rules".into(),
        policy(yaml),
        EngineSettings::default(),
        100_000,
    )
}

fn fixed(limit: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {{unit: minute, requests_per_unit: {limit}, algorithm: fixed_window}}\n"
    )
}

/// `per_minute` requests per key per minute for `minutes` minutes, evenly spaced.
fn traffic(keys: usize, per_minute: u64, minutes: u64) -> String {
    let mut text = String::new();
    for m in 0..minutes {
        for i in 0..per_minute {
            for k in 0..keys {
                let at = T0 + m * 60 * NANOS_PER_SECOND + i * (50 * NANOS_PER_SECOND / per_minute);
                text.push_str(&line(at, "edge", &[("ip", &format!("10.0.0.{k}"))]));
            }
        }
    }
    text
}

fn input<'d>(files: &[&str], decoder: &'d RecordLines) -> Merged<'d> {
    let mut m = Merged::open(&[] as &[&Path], decoder, Problems::new(0)).expect("open");
    for (i, text) in files.iter().enumerate() {
        m.add(
            format!("f{i}"),
            Box::new(Cursor::new(text.as_bytes().to_vec())),
        )
        .expect("first line");
    }
    m
}

#[tokio::test]
async fn halving_a_limit_denies_exactly_the_computed_extra_requests() {
    // 3 keys × 10 requests a minute × 2 minutes; fixed window of 8 → 2 denied per key-minute,
    // of 4 → 6 denied: 4 newly denied per key-minute, 24 in all.
    let text = traffic(3, 10, 2);
    let decoder = RecordLines;
    let mut m = input(&[&text], &decoder);
    let (mut before, mut after) = (side(&fixed(8)), side(&fixed(4)));
    let mut diff = DiffTally::default();
    let run = replay(&mut m, &mut before, Some((&mut after, &mut diff)))
        .await
        .expect("replay");
    assert_eq!(run.lines_replayed, 60);
    let (b, a) = (&before.tally.rules[0], &after.tally.rules[0]);
    assert_eq!((b.requests, b.allowed, b.denied), (60, 48, 12));
    assert_eq!((a.requests, a.allowed, a.denied), (60, 24, 36));
    // Near: the 8th allowed hit of 8 (used 8 > floor(6.4)) and the 7th; of 4: the 4th (> 3).
    assert_eq!(b.near, 2 * 6);
    assert_eq!(a.near, 6);
    let row = &diff.rules[&("edge".to_owned(), "ip".to_owned())];
    assert_eq!((row.newly_denied, row.freed), (24, 0));
    assert_eq!(row.newly_limited_keys["ip=10.0.0.1"], 8);
    assert_eq!((diff.ok_to_over, diff.over_to_ok), (24, 0));
    assert_eq!(before.tally.totals.denied, 12);
    assert_eq!(b.top_denied(2), [("ip=10.0.0.0", 4), ("ip=10.0.0.1", 4)]);
    assert_eq!(b.busiest_minute(), Some((T0 / NANOS_PER_SECOND, 30)));
}

#[tokio::test]
async fn a_leaky_bucket_turn_counts_as_allowed_and_is_not_waited_for() {
    // 1 per second, queue of 3 (max_delay 10 s): of 5 at once, the first and 3 queued pass.
    let rules = "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3, algorithm: leaky_bucket, max_delay: 10s}\n";
    let text: String = (0..5).map(|_| line(T0, "edge", &[("ip", "a")])).collect();
    let decoder = RecordLines;
    let mut m = input(&[&text], &decoder);
    let mut s = side(rules);
    replay(&mut m, &mut s, None).await.expect("replay");
    let r = &s.tally.rules[0];
    assert_eq!((r.requests, r.allowed + r.denied), (5, 5));
    assert!(r.allowed >= 3 && r.denied >= 1, "{r:?}");
}

#[tokio::test]
async fn the_clock_never_moves_back_and_files_merge_by_time() {
    // One request per second per file, 2 per minute allowed: merged, the 4 requests of the first
    // two seconds meet one window; a line a minute back in file b is decided at the clock's time.
    let a =
        line(T0, "edge", &[("ip", "x")]) + &line(T0 + 2 * NANOS_PER_SECOND, "edge", &[("ip", "x")]);
    let b = line(T0 + NANOS_PER_SECOND, "edge", &[("ip", "x")])
        + &line(T0 - 60 * NANOS_PER_SECOND, "edge", &[("ip", "x")]);
    let decoder = RecordLines;
    let mut m = input(&[&a, &b], &decoder);
    let mut s = side(&fixed(2));
    let run = replay(&mut m, &mut s, None).await.expect("replay");
    let r = &s.tally.rules[0];
    // Order: a@0, b@1, b@-60 (decided at 1 s: same window), a@2.
    assert_eq!((r.allowed, r.denied), (2, 2));
    assert_eq!(run.first, Some(T0));
    assert_eq!(run.last, Some(T0 + 2 * NANOS_PER_SECOND));
    assert_eq!(r.busiest_minute(), Some((T0 / NANOS_PER_SECOND, 4)));
}

#[tokio::test]
async fn bad_lines_are_skipped_and_the_rest_replayed() {
    let good = line(T0, "edge", &[("ip", "x")]);
    let text = format!(
        "{good}{{\"v\":1,\"time\"\n{good}not json\n{}",
        &good[..good.len() / 2]
    );
    let decoder = RecordLines;
    let mut m = input(&[&text], &decoder);
    let mut s = side(&fixed(10));
    let run = replay(&mut m, &mut s, None).await.expect("replay");
    assert_eq!((run.lines_replayed, run.lines_skipped), (2, 3));
    assert_eq!(s.tally.rules[0].allowed, 2);
}

#[tokio::test]
async fn rules_only_on_one_side_show_as_added_or_removed() {
    let before = "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let after = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let text = line(T0, "edge", &[("ip", "a")])
        + &line(T0, "edge", &[("ip", "a")])
        + &line(T0, "edge", &[("user", "u")])
        + &line(T0, "edge", &[("user", "u")]);
    let decoder = RecordLines;
    let mut m = input(&[&text], &decoder);
    let (mut b, mut a) = (side(before), side(after));
    let mut diff = DiffTally::default();
    replay(&mut m, &mut b, Some((&mut a, &mut diff)))
        .await
        .expect("replay");
    let report = report::build(
        &Run::default(),
        report::RunInput {
            label: "before",
            names: &b.names,
            tally: &b.tally,
        },
        Some((
            report::RunInput {
                label: "after",
                names: &a.names,
                tally: &a.tally,
            },
            &diff,
        )),
        10,
    );
    let rows: Vec<(&str, &str, u64, u64, u64, u64)> = report
        .diff
        .as_ref()
        .expect("diff")
        .rules
        .iter()
        .map(|r| {
            (
                r.rule.as_str(),
                r.change,
                r.denied_before,
                r.denied_after,
                r.newly_denied,
                r.freed,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [("ip", "removed", 1, 0, 0, 1), ("user", "added", 0, 1, 1, 0)]
    );
    assert_eq!(b.tally.totals.unmatched, 2);
}

#[tokio::test]
async fn a_jump_of_the_clock_is_counted_and_later_lines_keep_its_time() {
    // Two lines an hour apart (no jump), one dated 2500 (a jump), one back in 2026: decided at
    // the 2500 time, as the clock never goes back.
    let hour = 3_600 * NANOS_PER_SECOND;
    let far = 16_725_225_600 * NANOS_PER_SECOND; // 2500-01-01T00:00:00Z
    let text = [T0, T0 + hour, far, T0 + 2 * hour]
        .iter()
        .map(|&at| line(at, "edge", &[("ip", "a")]))
        .collect::<String>();
    let decoder = RecordLines;
    let mut m = input(&[&text], &decoder);
    let mut s = side(&fixed(100));
    let run = replay(&mut m, &mut s, None).await.expect("replay");
    assert_eq!((run.lines_replayed, run.time_jumps), (4, 1));
    assert_eq!(run.last, Some(far));
    assert_eq!(m.problems.time_jumps, 1);
}

#[tokio::test]
async fn evictions_for_the_key_cap_are_counted() {
    let text = traffic(50, 1, 1);
    let decoder = RecordLines;
    let mut m = input(&[&text], &decoder);
    let mut s = Side::new(
        "rules".into(),
        policy(&fixed(10)),
        EngineSettings::default(),
        1,
    );
    let run = replay(&mut m, &mut s, None).await.expect("replay");
    assert!(run.evictions > 0, "{run:?}");
}
