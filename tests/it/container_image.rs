//! The image built from the Dockerfile (`scripts/container-image.sh build`, podman) run as
//! Kubernetes would: the smoke script's checks (read-only root, UID 65532, no capabilities,
//! decisions from the shipped rules, the admin endpoints, Redis on the host, `podman kube play` of
//! the base and a changed ConfigMap), and `/bin/ratelimit` in the image under Envoy Gateway's
//! environment taking its rules over xDS from this test's mTLS ADS server. Runs when `CI` or
//! `CONTAINER_IMAGE_SMOKE` is set (then a missing podman or image fails it); otherwise it says
//! loudly that it was skipped and passes. `.ci/run` builds the image while the other tests run and
//! runs these after it.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::free_port;
use crate::common::redis::RedisServer;
use crate::common::wait::eventually;
use crate::envoy_gateway::{ENVOY_GATEWAY_ENV, decides_on_redis, gateway, tls_client};

/// The image `scripts/container-image.sh build` tags (CONTAINER_IMAGE names another).
fn image() -> String {
    std::env::var("CONTAINER_IMAGE").unwrap_or_else(|_| "localhost/ratelimit-server:dev".into())
}

/// The host's loopback as a container on slirp4netns with `allow_host_loopback` reaches it.
const HOST_LOOPBACK: &str = "10.0.2.2";

/// Whether the image tests run here: under CI or when asked; else a loud skip (false).
fn enabled(test: &str) -> bool {
    let asked = ["CI", "CONTAINER_IMAGE_SMOKE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    if !asked {
        eprintln!(
            "SKIPPED {test}: set CONTAINER_IMAGE_SMOKE=1 (or CI) after \
             `scripts/container-image.sh build` to run the image (needs root and podman)"
        );
        return false;
    }
    let image = image();
    let exists = Command::new("podman")
        .args(["image", "exists", &image])
        .status();
    assert!(
        exists.is_ok_and(|s| s.success()),
        "{test}: no podman or no image {image}: run `scripts/container-image.sh build` first \
         (.ci/run does)"
    );
    true
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("podman runs")
}

/// A running container, removed when dropped.
struct Container(String);

impl Container {
    fn log(&self) -> String {
        let out = podman(&["logs", &self.0]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.0]);
    }
}

/// The port of an `address:port` string.
fn port_of(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap_or(addr)
}

#[test]
fn the_image_runs_as_kubernetes_would() {
    if !enabled("the_image_runs_as_kubernetes_would") {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(repo.join("scripts/container-smoke.sh"))
        .env("IMAGE", image())
        .env("RATELIMIT_BIN", env!("CARGO_BIN_EXE_ratelimit-server"))
        .output()
        .expect("bash runs the smoke script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success(), "smoke failed:\n{stdout}\n{stderr}");
    for check in [
        "ok   image ",
        "ok   process: uid 65532, CapEff 0000000000000000, read-only root",
        "ok   ShouldRateLimit api_key=k2 with 1001 hits (limit 1000 per minute): OVER_LIMIT",
        "ok   decided on Redis three times",
        "ok   the ConfigMap's rules decide",
        "ok   changed ConfigMap",
        "container smoke: all checks passed",
    ] {
        assert!(stdout.contains(check), "no '{check}' in:\n{stdout}");
    }
}

/// Envoy Gateway's rate-limit container with the image itself: `/bin/ratelimit`, exactly its
/// environment, its `/certs` secret and statsd-exporter mapping mounted read-only where it mounts
/// them, the management server `envoy-gateway:18001` → this test's ADS server (mTLS, TLS 1.3) and
/// Redis → a redis-server, both on the host's loopback; the pod's user 65534 and a read-only root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server on PATH")]
async fn envoy_gateway_s_environment_in_the_image_takes_xds_rules() {
    if !enabled("envoy_gateway_s_environment_in_the_image_takes_xds_rules") {
        return;
    }
    let redis = RedisServer::start().expect("redis-server");
    let (certs, ca, ads) = gateway().await;
    let mapping = tempfile::tempdir().unwrap();
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/envoy-gateway/statsd-exporter.yaml"
        ),
        mapping.path().join("conf.yaml"),
    )
    .unwrap();
    // Readable by the pod's user, as the kubelet's secret and ConfigMap volumes are.
    for dir in [certs.path(), mapping.path()] {
        chmod_tree(dir);
    }
    let (grpc, http, prometheus) = (free_port(), free_port(), free_port());
    let name = format!("rl-envoy-gateway-{grpc}");
    let mut args: Vec<String> = [
        "run",
        "-d",
        "--name",
        &name,
        "--read-only",
        "--user",
        "65534:65534",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--network",
        "slirp4netns:allow_host_loopback=true",
        "--add-host",
        &format!("envoy-gateway:{HOST_LOOPBACK}"),
        "--entrypoint",
        "/bin/ratelimit",
    ]
    .map(String::from)
    .to_vec();
    for (host, container) in [(grpc, 8081), (http, 8080), (prometheus, 19001)] {
        args.extend(["-p".into(), format!("127.0.0.1:{host}:{container}")]);
    }
    args.extend([
        "-v".into(),
        format!("{}:/certs:ro", certs.path().display()),
        "-v".into(),
        format!("{}:/etc/statsd-exporter:ro", mapping.path().display()),
    ]);
    for (key, value) in ENVOY_GATEWAY_ENV {
        let value = match *key {
            "CONFIG_GRPC_XDS_SERVER_URL" => format!("envoy-gateway:{}", port_of(&ads.url())),
            "REDIS_URL" => format!("{HOST_LOOPBACK}:{}", port_of(&redis.addr())),
            _ => (*value).to_owned(),
        };
        args.extend(["-e".into(), format!("{key}={value}")]);
    }
    args.push(image());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = podman(&args);
    assert!(
        started.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let container = Container(name);
    let health = format!("http://127.0.0.1:{http}/healthcheck");
    eventually("the image's /healthcheck answers 200", || async {
        reqwest::get(&health)
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    ads.wait_ack("1").await;
    let mut client = tls_client(&ca.cert_pem(), grpc).await;
    decides_on_redis(&mut client, &redis, || container.log()).await;
    let log = container.log();
    for expected in ["rules from xDS: subscribing", "rules loaded from xDS"] {
        assert!(log.contains(expected), "no '{expected}' in:\n{log}");
    }
    let page =
        crate::common::metrics::scrape(&format!("http://127.0.0.1:{prometheus}/metrics")).await;
    let series = r#"ratelimit_service_rate_limit_over_limit{domain="eg",key1="user"} 1"#;
    assert!(page.contains(series), "no {series} in:\n{page}");
}

/// Every file and directory under `dir` readable (and directories enterable) by anyone.
fn chmod_tree(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let mode = if entry.path().is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    }
}
