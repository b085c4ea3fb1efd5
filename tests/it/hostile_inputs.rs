//! Hostile and outsized inputs against the real binary: YAML alias
//! bombs and oversized files in `PROMETHEUS_MAPPER_YAML` and in rules files stop the start at once
//! with a clear message; `/rlconfig` of a large rule set, asked by clients that do not read,
//! leaves decisions and health checks answering and still serves the whole document; a management
//! server that accepts the xDS stream and never answers is warned of once and shown on
//! `/metrics` until its first response.

use std::path::Path;

use crate::common::process::Served;
use crate::common::wait::eventually;
use crate::common::{self, Code};
use crate::support::ads::Ads;
use crate::xds::limits;

const RULES: &str = "
domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
";

/// Nine levels of ten aliases: 10^9 copies of one string once a loader expands them.
fn alias_bomb(root: &str) -> String {
    let mut text = String::from("a0: &a0 [\"lol\"]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    text.push_str(&format!("{root}: *a9\n"));
    text
}

/// A file of `bytes` bytes that takes no disk (a hole): only its size is read before the refusal.
fn sparse(path: &Path, bytes: u64) {
    std::fs::File::create(path).unwrap().set_len(bytes).unwrap();
}

fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), RULES).unwrap();
    dir
}

/// Starts the binary with `mapping` as its `PROMETHEUS_MAPPER_YAML`; returns its log once it
/// exited (it must not start).
fn refused_mapping(mapping: &Path) -> String {
    let dir = rules_dir();
    let mut server = Served::with_env(
        dir.path(),
        &[("PROMETHEUS_MAPPER_YAML", mapping.display().to_string())],
    );
    assert!(!server.wait_exit().success(), "the server must not start");
    server.log()
}

#[test]
fn a_mapping_file_alias_bomb_stops_the_start_at_once() {
    let mapping = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(mapping.path(), alias_bomb("mappings")).unwrap();
    let log = refused_mapping(mapping.path());
    assert!(
        log.contains("invalid PROMETHEUS_MAPPER_YAML")
            && log.contains("YAML aliases (*name) are not supported in a mapping file"),
        "{log}"
    );
}

#[test]
fn a_mapping_file_over_the_size_cap_is_not_read() {
    let mapping = tempfile::NamedTempFile::new().unwrap();
    sparse(mapping.path(), (8 << 20) + 1);
    let log = refused_mapping(mapping.path());
    assert!(
        log.contains("invalid PROMETHEUS_MAPPER_YAML")
            && log.contains("the file is 8388609 bytes, over the 8388608-byte cap"),
        "{log}"
    );
}

#[test]
fn a_rules_file_alias_bomb_stops_the_start_at_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("web.yaml"),
        format!("domain: web\n{}", alias_bomb("descriptors")),
    )
    .unwrap();
    let mut server = Served::with_env(dir.path(), &[]);
    assert!(!server.wait_exit().success(), "the server must not start");
    let log = server.log();
    assert!(
        log.contains("YAML anchors (&name) are not supported in rules files")
            || log.contains("YAML aliases (*name) are not supported in rules files"),
        "{log}"
    );
}

#[test]
fn a_rules_file_over_the_size_cap_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    sparse(&dir.path().join("web.yaml"), (8 << 20) + 1);
    let mut server = Served::with_env(dir.path(), &[]);
    assert!(!server.wait_exit().success(), "the server must not start");
    let log = server.log();
    assert!(log.contains("over the 8388608-byte cap"), "{log}");
}

/// One domain per file, `rules` descriptors each: `key: k, value: v<i>`.
fn large_rules(dir: &Path, domains: usize, rules: usize) {
    for d in 0..domains {
        let mut text = format!("domain: big{d}\ndescriptors:\n");
        for i in 0..rules {
            text.push_str(&format!(
                "  - {{key: k, value: v{i}, rate_limit: {{unit: hour, requests_per_unit: {}}}}}\n",
                i + 100
            ));
        }
        std::fs::write(dir.join(format!("big{d}.yaml")), text).unwrap();
    }
}

/// Four `/rlconfig` requests (twice the renders that run at once) whose clients read nothing yet:
/// two renders are held mid-answer and two wait their turn. Meanwhile health checks and decisions
/// answer; then every answer is read whole and holds every rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlconfig_of_a_large_rule_set_leaves_decisions_and_health_answering() {
    const DOMAINS: usize = 2;
    const RULES_EACH: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    large_rules(dir.path(), DOMAINS, RULES_EACH);
    let mut server = Served::with_env(dir.path(), &[]);
    server.wait_healthy().await;
    let mut client = server.client().await;
    let url = format!("{}/rlconfig", server.http);
    let stalled: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { reqwest::get(url).await.unwrap() })
        })
        .collect();
    let health = format!("{}/healthcheck", server.http);
    for i in 0..20 {
        let status = reqwest::get(&health).await.unwrap().status().as_u16();
        assert_eq!(status, 200, "health check {i}");
        let r = client
            .should_rate_limit(common::request("big0", &[&[("k", "v1")]]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(common::code(r.overall_code), Code::Ok, "decision {i}");
    }
    // No answer could be whole yet: none was read. Now all four are read at once (the two that
    // waited for a render slot get one as the first two end).
    let answers = stalled.into_iter().map(|answer| async move {
        let response = answer.await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response.json::<serde_json::Value>().await.unwrap()
    });
    for body in futures_util::future::join_all(answers).await {
        let domains = body["domains"].as_array().unwrap();
        assert_eq!(domains.len(), DOMAINS);
        for d in domains {
            assert_eq!(d["rules"].as_array().unwrap().len(), RULES_EACH);
        }
        assert_eq!(body["last_load"]["ok"], true);
    }
    let text = reqwest::get(format!("{url}?format=text"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text.lines().count(), DOMAINS * RULES_EACH);
}

/// A management server that takes the subscription and sends nothing: one WARN once the wait
/// (`XDS_CLIENT_ANSWER_WAIT`) ran out, the gauge at 1 and one stream counted; the first response
/// sets the gauge back to 0 and the rules apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_management_server_is_warned_of_once_until_it_answers() {
    let ads = Ads::start(None).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Served::with_env(
        dir.path(),
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
            ("CONFIG_GRPC_XDS_SERVER_URL", ads.url()),
            ("XDS_CLIENT_ANSWER_WAIT", "1s".into()),
        ],
    );
    ads.wait_for("the subscription", |r| !r.is_empty()).await;
    server
        .wait_for_metric("ratelimit_xds_stream_unanswered", 1)
        .await;
    let warning = "has sent no response";
    eventually("the warning", || async { server.log_lines(warning) == 1 }).await;
    assert_eq!(
        server
            .metric("ratelimit_xds_unanswered_streams_total")
            .await,
        1
    );
    assert!(server.log_lines("WARN") >= 1, "{}", server.log());
    ads.set("1", &[limits(1)]);
    ads.wait_ack("1").await;
    eventually("the gauge cleared", || async {
        server.metric("ratelimit_xds_stream_unanswered").await == 0
    })
    .await;
    assert_eq!(
        server
            .metric("ratelimit_xds_unanswered_streams_total")
            .await,
        1
    );
    assert_eq!(server.log_lines(warning), 1, "{}", server.log());
}
