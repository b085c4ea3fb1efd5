//! `serve --record`: a real server (in process, manual clock) and a real tonic client; the record
//! file is read back and checked line by line (docs/record.md).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::metrics::scrape_count;
use common::{Code, START, TestServer, request, start_with};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use ratelimit_server::record::HashKey;
use ratelimit_server::settings::ServeSettings;
use serde_json::{Value, json};

const RULES: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}\n  - key: client\n    value: acme\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

async fn recording(path: &Path, adjust: impl FnOnce(&mut ServeSettings)) -> TestServer {
    let path = path.to_path_buf();
    start_with(&[("edge.yaml", RULES)], move |s| {
        s.record.record_file = Some(path);
        adjust(s);
    })
    .await
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn ip(n: usize) -> RateLimitRequest {
    request(
        "edge",
        &[&[("remote_address", &format!("10.0.{}.{}", n / 256, n % 256))]],
    )
}

/// Value of a labelled series from `/metrics`.
async fn metric(server: &TestServer, series: &str) -> u64 {
    scrape_count(&server.http("/metrics"), series).await
}

#[tokio::test]
async fn grpc_decisions_are_recorded_in_order_with_their_time_and_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("rec.jsonl");
    let mut t = recording(&path, |_| {}).await;
    let one = request("edge", &[&[("remote_address", "10.0.0.7")]]);
    assert_eq!(
        common::code(t.call(one.clone()).await.overall_code),
        Code::Ok
    );
    t.clock
        .advance(std::time::Duration::from_nanos(1_500_000_001));
    let mut two = request(
        "edge",
        &[&[("remote_address", "10.0.0.7")], &[("client", "acme")]],
    );
    two.hits_addend = 2;
    two.descriptors[1].limit = Some(RateLimitOverride {
        requests_per_unit: 9,
        unit: 2,
    });
    two.descriptors[1].hits_addend = Some(UInt64Value { value: 1 });
    assert_eq!(
        common::code(t.call(two).await.overall_code),
        Code::OverLimit
    );
    let refused = t.call_err(request("", &[&[("remote_address", "x")]])).await;
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    t.server.shutdown().await;

    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(
        lines[0],
        r#"{"v":1,"time":"2026-01-01T00:00:10.000000000Z","domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.7"}]}],"decision":{"code":"OK","statuses":["OK"]}}"#
    );
    assert_eq!(
        lines[1],
        r#"{"v":1,"time":"2026-01-01T00:00:11.500000001Z","domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.7"}]},{"entries":[{"key":"client","value":"acme"}],"limit":{"requestsPerUnit":9,"unit":"MINUTE"},"hitsAddend":"1"}],"hitsAddend":2,"decision":{"code":"OVER_LIMIT","statuses":["OVER_LIMIT","OK"]}}"#
    );
    assert_eq!(
        lines[2],
        r#"{"v":1,"time":"2026-01-01T00:00:11.500000001Z","domain":"","descriptors":[{"entries":[{"key":"remote_address","value":"x"}]}],"decision":{"code":"UNKNOWN","statuses":[]}}"#
    );
}

#[tokio::test]
async fn a_record_line_posts_to_json_as_it_is_and_is_recorded_too() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("rec.jsonl");
    let mut t = recording(&path, |_| {}).await;
    t.call(request("edge", &[&[("client", "acme")]])).await;
    let url = t.http("/json");
    let line = loop {
        if let Some(line) = std::fs::read_to_string(&path).unwrap().lines().next() {
            break line.to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let client = reqwest::Client::new();
    let answer = client
        .post(&url)
        .header("content-type", "application/json")
        .body(line.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["overallCode"], "OK");
    t.server.shutdown().await;
    let recorded = lines(&path);
    assert_eq!(recorded.len(), 2);
    let first: Value = serde_json::from_str(&line).unwrap();
    for field in ["v", "time", "domain", "descriptors", "decision"] {
        assert_eq!(recorded[1][field], first[field], "{field}");
    }
}

/// FILE's rotated files, oldest (lowest number) first, then FILE.
fn all_files(path: &Path) -> Vec<PathBuf> {
    let stem = format!("{}.", path.file_name().unwrap().to_str().unwrap());
    let mut numbered: Vec<(u64, PathBuf)> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let n = e.file_name().to_str()?.strip_prefix(&stem)?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    numbered.sort();
    let mut files: Vec<PathBuf> = numbered.into_iter().map(|(_, p)| p).collect();
    files.push(path.to_path_buf());
    files
}

#[tokio::test]
async fn rotation_at_the_size_bound_loses_no_line() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("rec.jsonl");
    let mut t = recording(&path, |s| {
        s.record.record_max_bytes = 1024;
        s.record.record_max_files = 100;
    })
    .await;
    for n in 0..200 {
        t.call(ip(n)).await;
    }
    t.server.shutdown().await;
    let files = all_files(&path);
    assert!(files.len() > 10, "{} files", files.len());
    let mut seen = Vec::new();
    // Oldest first: FILE.1 … FILE.N, then FILE.
    for file in &files {
        assert!(
            std::fs::metadata(file).unwrap().len() <= 1024,
            "{}",
            file.display()
        );
        for line in lines(file) {
            seen.push(line["descriptors"][0]["entries"][0]["value"].clone());
        }
    }
    let sent: Vec<Value> = (0..200)
        .map(|n| json!(format!("10.0.{}.{}", n / 256, n % 256)))
        .collect();
    assert_eq!(seen, sent, "every line once, in order, across the files");
}

#[tokio::test]
async fn rotation_keeps_max_files_and_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("rec.jsonl");
    let mut t = recording(&path, |s| {
        s.record.record_max_bytes = 1024;
        s.record.record_max_files = 2;
    })
    .await;
    for n in 0..100 {
        t.call(ip(n)).await;
    }
    let lines_total = t
        .eventually_metric("ratelimit_record_lines_total", 100)
        .await;
    assert_eq!(lines_total, 100);
    let rotations = metric(&t, "ratelimit_record_rotations_total").await;
    t.server.shutdown().await;
    assert_eq!(
        all_files(&path).len(),
        3,
        "FILE and the two newest rotated files"
    );
    assert!(rotations > 2, "{rotations} rotations");
    // The newest lines are all there, the oldest went with the deleted files.
    let last = lines(&path);
    assert_eq!(
        last.last().unwrap()["descriptors"][0]["entries"][0]["value"],
        "10.0.0.99"
    );
}

#[tokio::test]
async fn sampling_half_records_exactly_every_second_decision() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("rec.jsonl");
    let mut t = recording(&path, |s| s.record.record_sample = 0.5).await;
    for n in 0..100 {
        t.call(ip(n)).await;
    }
    let sampled_out = metric(
        &t,
        r#"ratelimit_record_dropped_total{reason="sampled_out"}"#,
    )
    .await;
    t.server.shutdown().await;
    assert_eq!(sampled_out, 50);
    let values: Vec<Value> = lines(&path)
        .iter()
        .map(|l| l["descriptors"][0]["entries"][0]["value"].clone())
        .collect();
    let odd: Vec<Value> = (0..100)
        .filter(|n| n % 2 == 1)
        .map(|n| json!(format!("10.0.0.{n}")))
        .collect();
    assert_eq!(values, odd);
}

#[tokio::test]
async fn hashed_values_hide_raw_values_but_keep_the_ones_the_rules_name() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("rec.jsonl");
    let key = "00112233445566778899aabbccddeeff";
    let mut t = recording(&path, |s| {
        s.record.record_hash_values = true;
        s.record.record_hash_key = Some(key.to_owned());
    })
    .await;
    for (k, v) in [
        ("remote_address", "10.0.0.7"),
        ("remote_address", "10.0.0.7"),
        ("remote_address", "10.0.0.8"),
        ("client", "acme"),
        ("client", "globex"),
    ] {
        t.call(request("edge", &[&[(k, v)]])).await;
    }
    t.server.shutdown().await;
    let text = std::fs::read_to_string(&path).unwrap();
    for raw in ["10.0.0.7", "10.0.0.8", "globex"] {
        assert!(!text.contains(raw), "{raw} in {text}");
    }
    let values: Vec<String> = lines(&path)
        .iter()
        .map(|l| {
            l["descriptors"][0]["entries"][0]["value"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        values[0].starts_with("h:") && values[0].len() == 34,
        "{}",
        values[0]
    );
    assert_eq!(values[0], values[1], "the same value hashes the same");
    assert_ne!(values[0], values[2]);
    assert_eq!(values[3], "acme", "a value the rules name stays clear");
    assert!(values[4].starts_with("h:"));
    let expected = HashKey::parse(key).unwrap().hash_hex("10.0.0.7");
    assert_eq!(values[0], format!("h:{expected}"));
}

#[tokio::test]
async fn a_full_disk_drops_and_counts_and_every_decision_is_answered() {
    let mut t = recording(Path::new("/dev/full"), |_| {}).await;
    for n in 0..200 {
        assert_eq!(common::code(t.call(ip(n)).await.overall_code), Code::Ok);
    }
    let dropped = t
        .eventually_metric(
            r#"ratelimit_record_dropped_total{reason="write_error"}"#,
            200,
        )
        .await;
    assert_eq!(dropped, 200);
    assert_eq!(metric(&t, "ratelimit_record_lines_total").await, 0);
    t.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_queue_under_a_burst_drops_and_counts_and_never_fails_a_call() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("rec.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo (coreutils) runs");
    assert!(made.success(), "mkfifo {}", fifo.display());
    // A reader that does not read yet: the pipe fills and the writer blocks on it. Opening a FIFO
    // for reading waits for its writer, so the reader is opened on a thread while the server
    // (the writer) starts.
    let opening = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::File::open(fifo).unwrap())
    };
    let t = recording(&fifo, |s| s.record.record_queue = 4).await;
    let reader = opening.join().unwrap();
    const CALLS: usize = 4000;
    let mut tasks = Vec::new();
    for task in 0..16 {
        let mut client = t.client.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..CALLS / 16 {
                let r = client.should_rate_limit(ip(task * 1000 + n)).await;
                assert!(r.is_ok(), "{r:?}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let queue_full = metric(&t, r#"ratelimit_record_dropped_total{reason="queue_full"}"#).await;
    // The pipe (64 KiB), the batch the writer is blocked writing, and the 4 pending decisions hold far
    // fewer than 4000 lines of ~100 bytes.
    assert!(queue_full >= 1000, "{queue_full} dropped");
    // Now read: what was queued is written, and every call is a line or a drop.
    let counter = std::thread::spawn(move || count_lines_until_eof(reader));
    let written = t
        .eventually_metric("ratelimit_record_lines_total", (CALLS as u64) - queue_full)
        .await;
    assert_eq!(written + queue_full, CALLS as u64);
    t.server.shutdown().await;
    assert_eq!(counter.join().unwrap(), written);
}

fn count_lines_until_eof(mut reader: std::fs::File) -> u64 {
    use std::io::Read;
    let mut buf = vec![0u8; 1 << 16];
    let mut lines = 0;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return lines,
            Ok(n) => lines += buf[..n].iter().filter(|b| **b == b'\n').count() as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn a_record_file_that_cannot_be_opened_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("edge.yaml"), RULES).unwrap();
    let mut settings = ServeSettings::for_tests(dir.path().to_path_buf());
    settings.record.record_file = Some(dir.path().join("missing/dir/rec.jsonl"));
    let clock = Arc::new(ratelimit_server::clock::ManualClock::new(START));
    let error = ratelimit_server::server::start(&settings, clock)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        error.contains("RECORD_FILE") && error.contains("missing/dir"),
        "{error}"
    );
}

trait Eventually {
    /// Waits until `series` reaches `at_least` on `/metrics`; returns its value.
    async fn eventually_metric(&self, series: &str, at_least: u64) -> u64;
}

impl Eventually for TestServer {
    async fn eventually_metric(&self, series: &str, at_least: u64) -> u64 {
        let url = self.http("/metrics");
        let reached = || async { scrape_count(&url, series).await >= at_least };
        common::wait::eventually(&format!("{series} >= {at_least}"), reached).await;
        scrape_count(&url, series).await
    }
}

/// The rules of the record → replay round trip: three algorithms, limits small enough to deny.
const ROUND_TRIP_RULES: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 40, algorithm: fixed_window}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: sliding_window}
";

/// What the gRPC client saw, per rule (the descriptor's key): allowed, denied, and the denials
/// per key (`key=value`, as replay names keys).
#[derive(Debug, Default, PartialEq)]
struct Seen {
    allowed: u64,
    denied: u64,
    denied_keys: std::collections::BTreeMap<String, u64>,
}

#[tokio::test]
async fn a_recording_replays_to_the_decisions_the_server_gave() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("rec.jsonl");
    let record = path.clone();
    let mut t = start_with(&[("edge.yaml", ROUND_TRIP_RULES)], move |s| {
        s.record.record_file = Some(record);
    })
    .await;
    let mut seen: std::collections::BTreeMap<&str, Seen> = Default::default();
    let (mut overall_ok, mut overall_over) = (0u64, 0u64);
    // 400 requests, 137 ms apart on the server's (manual) clock: one, two or three descriptors
    // each, drawn from a few values per key by a fixed pseudo-random sequence.
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for _ in 0..400 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let ip = format!("10.0.0.{}", x % 4);
        let client = format!("c{}", (x >> 8) % 3);
        let route = format!("/p{}", (x >> 16) % 2);
        let mut descriptors: Vec<(&str, &str)> = vec![("remote_address", ip.as_str())];
        if x & (1 << 30) != 0 {
            descriptors.push(("client", client.as_str()));
        }
        if x & (1 << 31) != 0 {
            descriptors.push(("path", route.as_str()));
        }
        let entries: Vec<[(&str, &str); 1]> = descriptors.iter().map(|d| [*d]).collect();
        let refs: Vec<&[(&str, &str)]> = entries.iter().map(|e| &e[..]).collect();
        let answer = t.call(request("edge", &refs)).await;
        match common::code(answer.overall_code) {
            Code::Ok => overall_ok += 1,
            _ => overall_over += 1,
        }
        for ((key, value), status) in descriptors.iter().zip(&answer.statuses) {
            let rule = seen.entry(key).or_default();
            if common::code(status.code) == Code::Ok {
                rule.allowed += 1;
            } else {
                rule.denied += 1;
                *rule
                    .denied_keys
                    .entry(format!("{key}={value}"))
                    .or_default() += 1;
            }
        }
        t.clock.advance(std::time::Duration::from_millis(137));
    }
    let config = t.dir.path().to_path_buf();
    t.server.shutdown().await;
    assert_eq!(lines(&path).len(), 400, "every decision recorded");
    assert!(
        seen.values().all(|s| s.allowed > 0 && s.denied > 0),
        "the traffic must exercise both answers of every rule: {seen:?}"
    );

    let report = common::replay::replay_json([
        "--top".as_ref(),
        "100".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
        path.as_os_str(),
    ]);
    let run = &report["runs"][0];
    assert_eq!(report["lines"]["replayed"], 400);
    assert_eq!(report["lines"]["skipped"], 0);
    assert_eq!(run["totals"]["allowed"], overall_ok, "{run}");
    assert_eq!(run["totals"]["denied"], overall_over, "{run}");
    let mut replayed: std::collections::BTreeMap<&str, Seen> = Default::default();
    for rule in run["rules"].as_array().unwrap() {
        let name = rule["rule"].as_str().unwrap();
        let denied_keys = rule["top_denied"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["key"].as_str().unwrap().to_owned(),
                    k["requests"].as_u64().unwrap(),
                )
            })
            .collect();
        let tally = Seen {
            allowed: rule["allowed"].as_u64().unwrap(),
            denied: rule["denied"].as_u64().unwrap(),
            denied_keys,
        };
        if tally.allowed + tally.denied > 0 {
            replayed.insert(name, tally);
        }
    }
    assert_eq!(replayed, seen, "replay against what the server answered");
}

#[tokio::test]
async fn a_request_beyond_the_queue_byte_bound_is_dropped_and_counted_not_queued() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("rec.jsonl");
    let mut t = recording(&path, |s| s.record.record_queue_bytes = 1024).await;
    // 2 KiB on the wire: more than the pending buffer may hold, so it can never be queued.
    let big = "x".repeat(2048);
    let answer = t
        .call(request("edge", &[&[("remote_address", big.as_str())]]))
        .await;
    assert_eq!(
        common::code(answer.overall_code),
        Code::Ok,
        "answered all the same"
    );
    assert_eq!(
        metric(&t, r#"ratelimit_record_dropped_total{reason="queue_full"}"#).await,
        1
    );
    // A small one fits.
    assert_eq!(common::code(t.call(ip(1)).await.overall_code), Code::Ok);
    t.server.shutdown().await;
    let written = lines(&path);
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(
        written[0]["descriptors"][0]["entries"][0]["value"],
        "10.0.0.1"
    );
}

/// The real binary recording under a file size limit (`prlimit --fsize`, RLIMIT_FSIZE: writes past
/// it stop short, then fail with EFBIG), as a full disk would stop them: the server lives on (it
/// catches SIGXFSZ), the file holds only whole lines, and every decision is either a line counted
/// in `ratelimit_record_lines_total` or a drop counted as `write_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_short_leaves_only_whole_lines_and_counts_the_rest() {
    const LIMIT: u64 = 20_000;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("edge.yaml"), RULES).unwrap();
    let path = tmp.path().join("rec.jsonl");
    let (grpc, http) = (common::free_port(), common::free_port());
    let limit = format!("--fsize={LIMIT}:{LIMIT}");
    let Some(mut child) = common::process::under_prlimit(&limit, |c| {
        c.args(["serve", "--config"])
            .arg(tmp.path())
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .arg("--record")
            .arg(&path)
            .env("LOG_LEVEL", "error")
            .stderr(std::process::Stdio::null());
    }) else {
        return;
    };
    let metrics = format!("http://127.0.0.1:{http}/metrics");
    let mut client = loop {
        match envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    };
    // About 150 bytes a line: 300 decisions are twice what the limit lets the file hold. Sent in
    // rounds, so the writer's batches end part way through the limit.
    const SENT: u64 = 300;
    for n in 0..SENT as usize {
        client.should_rate_limit(ip(n)).await.unwrap();
        if n % 7 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(6)).await;
        }
    }
    let started = ratelimit_server::clock::monotonic();
    let (written, dropped) = loop {
        let written = scrape_count(&metrics, "ratelimit_record_lines_total").await;
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        let dropped = text
            .lines()
            .find_map(|l| l.strip_prefix("ratelimit_record_dropped_total{reason=\"write_error\"} "))
            .map_or(0, |v| v.parse::<u64>().unwrap());
        if written + dropped == SENT {
            break (written, dropped);
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{written} written + {dropped} dropped of {SENT}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the server died at the file size limit"
    );
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() as u64 <= LIMIT);
    assert!(
        dropped > 0,
        "the limit was never reached ({} bytes)",
        bytes.len()
    );
    assert_eq!(
        bytes.last(),
        Some(&b'\n'),
        "the file ends in a partial line"
    );
    let text = String::from_utf8(bytes).unwrap();
    let file_lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a whole line: {l}: {e}")))
        .collect();
    assert_eq!(
        file_lines.len() as u64,
        written,
        "lines counted = lines in the file"
    );
    // The lines kept are the first decisions, in order.
    for (n, line) in file_lines.iter().enumerate() {
        assert_eq!(
            line["descriptors"][0]["entries"][0]["value"],
            format!("10.0.{}.{}", n / 256, n % 256)
        );
    }
    child.0.kill().unwrap();
}
