//! `ratelimit-server replay` run as a user runs it: record lines written here in the documented
//! format (docs/record.md), rules directories on disk, the report read back as JSON or text.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn replay(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .arg("replay")
        .args(args)
        .output()
        .expect("run ratelimit-server replay");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> Value {
    let mut all = vec!["--format", "json"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = replay(&all);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// A record line (format version 1) at `second` seconds after 2026-12-01T05:00:00Z.
fn line(second: u64, domain: &str, key: &str, value: &str) -> String {
    assert!(second < 3600);
    format!(
        "{{\"v\":1,\"time\":\"2026-12-01T05:{:02}:{:02}.000000000Z\",\"domain\":\"{domain}\",\"descriptors\":[{{\"entries\":[{{\"key\":\"{key}\",\"value\":\"{value}\"}}]}}],\"decision\":{{\"code\":\"OK\",\"statuses\":[\"OK\"]}}}}\n",
        second / 60,
        second % 60
    )
}

fn rules(dir: &Path, name: &str, limit: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(&path).unwrap();
    std::fs::write(
        path.join("edge.yaml"),
        format!(
            "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {{unit: minute, requests_per_unit: {limit}, algorithm: fixed_window}}\n"
        ),
    )
    .unwrap();
    path
}

fn file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn halving_a_limit_shows_the_expected_newly_denied_count() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (rules(dir.path(), "now", 8), rules(dir.path(), "halved", 4));
    // 5 keys × 10 requests a minute × 3 minutes. Limit 8 denies 2 per key-minute (30 in all),
    // limit 4 denies 6 (90): 60 newly denied, 12 per key, none freed.
    let mut text = String::new();
    for minute in 0..3 {
        for i in 0..10 {
            for k in 0..5 {
                text += &line(minute * 60 + i * 5, "edge", "ip", &format!("10.0.0.{k}"));
            }
        }
    }
    let input = file(dir.path(), "rec.jsonl", &text);
    let r = json(&["--config", s(&before), "--against", s(&after), &input]);
    assert_eq!(r["format"], 1);
    assert_eq!(r["lines"]["replayed"], 150);
    assert_eq!(r["runs"][0]["rules"][0]["denied"], 30);
    assert_eq!(r["runs"][1]["rules"][0]["denied"], 90);
    assert_eq!(r["runs"][0]["totals"]["denied"], 30);
    let row = &r["diff"]["rules"][0];
    assert_eq!(row["rule"], "ip");
    assert_eq!(row["change"], "kept");
    assert_eq!(
        (row["denied_before"].as_u64(), row["denied_after"].as_u64()),
        (Some(30), Some(90))
    );
    assert_eq!(
        (row["newly_denied"].as_u64(), row["freed"].as_u64()),
        (Some(60), Some(0))
    );
    assert_eq!(row["newly_limited_keys"].as_array().unwrap().len(), 5);
    assert_eq!(row["newly_limited_keys"][0]["requests"], 12);
    assert_eq!(r["diff"]["requests_ok_to_over"], 60);
    // The text form says the same.
    let (code, out, _) = replay(&["--config", s(&before), "--against", s(&after), &input]);
    assert_eq!(code, 0);
    assert!(out.contains("30 → 90"), "{out}");
}

#[test]
fn malformed_and_truncated_lines_are_reported_with_line_numbers_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let config = rules(dir.path(), "rules", 100);
    let good = line(0, "edge", "ip", "a");
    let text = format!(
        "{good}{{\"v\":1,\"time\":\"2026-12-01T05:00:00Z\",\"domain\":\"edge\",\"descriptors\":[{{\"entries\n{good}{{\"v\":1,\"domain\":\"edge\"}}\n{good}{}",
        &good[..40]
    );
    let input = file(dir.path(), "rec.jsonl", &text);
    let (code, stdout, stderr) = replay(&["--format", "json", "--config", s(&config), &input]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains(&format!("{input}:2: ")), "{stderr}");
    assert!(
        stderr.contains(&format!("{input}:4: no `time`")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{input}:6: truncated (no newline at the end of the file)"
        )),
        "{stderr}"
    );
    let r: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (
            r["lines"]["replayed"].as_u64(),
            r["lines"]["skipped"].as_u64()
        ),
        (Some(3), Some(3))
    );
    assert_eq!(r["runs"][0]["rules"][0]["allowed"], 3);
}

#[test]
fn several_files_are_merged_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let config = rules(dir.path(), "rules", 2);
    // Merged: 0 s (a), 1 s (b), 2 s (b) fall in the first minute, 120 s (a) later. Read one file
    // after the other, the clock would be at 120 s for b's lines.
    let a = file(
        dir.path(),
        "a.jsonl",
        &(line(0, "edge", "ip", "x") + &line(120, "edge", "ip", "x")),
    );
    let b = file(
        dir.path(),
        "b.jsonl",
        &(line(1, "edge", "ip", "x") + &line(2, "edge", "ip", "x")),
    );
    let r = json(&["--config", s(&config), &a, &b]);
    let rule = &r["runs"][0]["rules"][0];
    assert_eq!(
        (rule["allowed"].as_u64(), rule["denied"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(rule["busiest_minute"]["start"], "2026-12-01T05:00:00Z");
    assert_eq!(rule["busiest_minute"]["requests"], 3);
    assert_eq!(rule["top_denied"][0]["key"], "ip=x");
    assert_eq!(r["time"]["first"], "2026-12-01T05:00:00Z");
    assert_eq!(r["time"]["last"], "2026-12-01T05:02:00Z");
}

#[test]
fn envoy_access_logs_replay_through_a_shipped_mapping() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    // Four searches with a key (3 a minute allowed per key), a health check (no call), and a
    // request without a key (only the global descriptor).
    let log_line = |ms: u32, path: &str, key: &str| {
        format!(
            "{{\"start_time\":\"2026-12-01T05:00:00.{ms:03}Z\",\"remote_address\":\"10.0.0.9\",\"method\":\"GET\",\"path\":\"{path}\",\"authority\":\"example\",\"x-api-key\":{key},\"envoy.filters.http.jwt_authn:jwt_payload:sub\":null,\"response_code\":200}}\n"
        )
    };
    let mut text: String = (0..4)
        .map(|i| log_line(i, "/v1/search?q=1", "\"k1\""))
        .collect();
    text += &log_line(5, "/healthz", "null");
    text += &log_line(6, "/other", "null");
    let log = file(dir.path(), "access.log", &text);
    let r = json(&[
        "--from-envoy-log",
        "--map",
        s(&root.join("envoy/replay/per-route.map.yaml")),
        "--config",
        s(&root.join("examples/envoy")),
        &log,
    ]);
    assert_eq!(r["lines"]["replayed"], 5);
    assert_eq!(r["lines"]["without_call"], 1);
    let rules = r["runs"][0]["rules"].as_array().unwrap();
    let rule = |d: &str, p: &str| {
        rules
            .iter()
            .find(|x| x["domain"] == d && x["rule"] == p)
            .unwrap_or_else(|| panic!("no {d} {p} in {rules:?}"))
    };
    let global = rule("per-route", "generic_key_global");
    assert_eq!(
        (global["requests"].as_u64(), global["denied"].as_u64()),
        (Some(5), Some(0))
    );
    let search = rule("per-route", "api_key.path_/v1/search");
    assert_eq!(
        (search["requests"].as_u64(), search["denied"].as_u64()),
        (Some(4), Some(1))
    );
    assert_eq!(search["top_denied"][0]["key"], "api_key=k1,path=/v1/search");
    assert_eq!(r["runs"][0]["totals"]["denied"], 1);
}

#[test]
fn every_shipped_mapping_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let empty = file(dir.path(), "empty.log", "");
    for name in [
        "per-ip",
        "per-ip-mtls",
        "per-api-key",
        "per-route",
        "per-user-jwt",
    ] {
        let map = root.join(format!("envoy/replay/{name}.map.yaml"));
        let rules = root.join("examples/envoy");
        let r = json(&[
            "--from-envoy-log",
            "--map",
            s(&map),
            "--config",
            s(&rules),
            &empty,
        ]);
        assert_eq!(r["lines"]["replayed"], 0, "{name}");
        // The mapping's domain is the one of the Envoy config it was copied from.
        let envoy = std::fs::read_to_string(root.join(format!("envoy/{name}.yaml"))).unwrap();
        let mapping = std::fs::read_to_string(&map).unwrap();
        let domain = mapping
            .lines()
            .find_map(|l| l.strip_prefix("domain: "))
            .unwrap();
        assert!(
            envoy.contains(&format!("domain: {domain}\n")),
            "{name}: {domain}"
        );
    }
}

#[test]
fn a_plot_is_written_as_svg() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (rules(dir.path(), "a", 2), rules(dir.path(), "b", 1));
    let text: String = (0..300).map(|i| line(i, "edge", "ip", "x")).collect();
    let input = file(dir.path(), "rec.jsonl", &text);
    let svg = dir.path().join("out.svg");
    let (code, _, stderr) = replay(&[
        "--config",
        s(&before),
        "--against",
        s(&after),
        "--plot",
        s(&svg),
        &input,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawn.starts_with("<svg"),
        "{}",
        &drawn[..100.min(drawn.len())]
    );
    assert!(drawn.contains("edge ip: requests per"), "no panel caption");
    assert!(
        drawn.contains("denied ("),
        "no legend naming the rules sets"
    );
}

#[test]
fn a_broken_rules_directory_or_a_missing_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("x.yaml"), "domain: d\ndescriptors: 3\n").unwrap();
    let input = file(dir.path(), "rec.jsonl", &line(0, "d", "k", "v"));
    let (code, _, stderr) = replay(&["--config", s(&bad), &input]);
    assert_eq!(code, 1);
    assert!(stderr.contains("x.yaml:2"), "{stderr}");
    let good = rules(dir.path(), "good", 1);
    let missing = dir.path().join("nope.jsonl");
    let (code, _, stderr) = replay(&["--config", s(&good), s(&missing)]);
    assert_eq!(code, 1);
    assert!(stderr.contains("nope.jsonl"), "{stderr}");
}

#[test]
fn a_date_out_of_range_is_told_apart_and_a_jump_of_the_clock_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    let config = rules(dir.path(), "now", 2);
    let far = line(0, "edge", "ip", "a")
        .replace("2026-12-01T05:00:00.000000000Z", "2500-01-01T00:00:00Z");
    let beyond = line(0, "edge", "ip", "a")
        .replace("2026-12-01T05:00:00.000000000Z", "9999-12-31T23:59:59Z");
    let text = [
        line(0, "edge", "ip", "a"),
        line(1, "edge", "ip", "a"),
        far,
        line(2, "edge", "ip", "a"),
        beyond,
    ]
    .concat();
    let input = file(dir.path(), "hostile.jsonl", &text);
    let (code, stdout, stderr) = replay(&["--config", s(&config), &input]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(":5: `time` \"9999-12-31T23:59:59Z\" is valid RFC 3339 but outside the instants replay handles, 1970-01-01T00:00:00Z to 2554-07-21T23:34:33Z"),
        "{stderr}"
    );
    assert!(
        stderr.contains(":3: warning: the time jumps 473 years ahead, from 2026-12-01T05:00:01Z to 2500-01-01T00:00:00Z"),
        "{stderr}"
    );
    assert!(
        stdout.starts_with("replayed 4 lines (1 skipped, 0 without a call, 1 time jump)"),
        "{stdout}"
    );
    let report = json(&["--config", s(&config), &input]);
    assert_eq!(report["lines"]["time_jumps"], 1);
    // The line after the jump was decided in 2500, the second in that window: allowed (in 2026
    // it would have been the third of its minute, over the limit of 2).
    assert_eq!(report["runs"][0]["totals"]["allowed"], 4);
    assert_eq!(report["runs"][0]["totals"]["denied"], 0);
}
