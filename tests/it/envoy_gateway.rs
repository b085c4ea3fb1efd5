//! The real binary run with exactly the environment Envoy Gateway gives its rate-limit container
//! (envoyproxy/gateway `internal/infrastructure/kubernetes/ratelimit/resource.go`, the default
//! Deployment with a Redis backend and Prometheus on), no command-line arguments, only its paths
//! and addresses substituted: `/certs` → a directory of certificates made here, the management
//! server `envoy-gateway:18001` → an ADS server in the test requiring client certificates and
//! TLS 1.3 as Envoy Gateway's does, the Redis URL → a redis-server, and the listeners
//! (defaults 8080/8081, Prometheus `:19001`) → free ports. It must start, say what it does
//! differently, take its rules over xDS, decide over TLS, answer `/healthcheck` on the admin port
//! and serve the metrics on the Prometheus port, named by Envoy Gateway's statsd-exporter mapping
//! (`PROMETHEUS_MAPPER_YAML`, tests/fixtures/envoy-gateway/statsd-exporter.yaml). Run as root (CI),
//! it runs as the pod's user, 65534, in a working directory it cannot write.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::common::process::Served;
use crate::common::redis::RedisServer;
use crate::common::{Code, code, free_port, request};
use crate::support::ads::{Ads, tls13_requiring_client_certs};
use crate::support::certs::{Ca, client_config};
use crate::support::pod::is_root;
use crate::xds::user_limit;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitUnit;

/// The container's environment, as resource.go writes it (default Deployment, Redis backend,
/// Prometheus enabled).
pub(crate) const ENVOY_GATEWAY_ENV: &[(&str, &str)] = &[
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server on PATH")]
async fn envoy_gateway_s_environment_starts_takes_xds_rules_and_decides_over_tls() {
    let redis = RedisServer::start().expect("redis-server");
    let (certs, ca, ads) = gateway().await;
    // Envoy Gateway's mapping file, where its ConfigMap is mounted (under a temporary root).
    let etc = tempfile::tempdir().unwrap();
    let mapping = etc.path().join("statsd-exporter/conf.yaml");
    std::fs::create_dir_all(mapping.parent().unwrap()).unwrap();
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/envoy-gateway/statsd-exporter.yaml"
        ),
        &mapping,
    )
    .unwrap();
    // Readable by the pod's user; the working directory writable by nobody but root.
    let read_only = tempfile::tempdir().unwrap();
    for dir in [
        certs.path(),
        etc.path(),
        mapping.parent().unwrap(),
        read_only.path(),
    ] {
        chmod(dir, 0o555);
    }
    let prometheus = free_port();
    let mut command = gateway_command(&ads, &redis, certs.path(), prometheus, &mapping);
    let (http, grpc) = on_free_ports(&mut command);
    command.current_dir(read_only.path());
    if is_root() {
        // The pod's securityContext: runAsUser/runAsGroup 65534.
        command.uid(65534).gid(65534);
    }
    let mut served = Served::spawn_command(command, grpc, http);
    served.wait_healthy().await;
    let read_log = || served.log();
    ads.wait_ack("1").await;
    // gRPC over TLS, as Envoy reaches it (no client certificate: GRPC_SERVER_TLS_CA_CERT is not
    // the reference's name for the client CA, and the reference does not ask for one either).
    let mut client = tls_client(&ca.cert_pem(), grpc).await;
    decides_on_redis(&mut client, &redis, read_log).await;
    let log_text = read_log();
    eprintln!("--- start-up log under Envoy Gateway's environment ---\n{log_text}");
    eprintln!("--- the ADS exchange ---\n{}", ads.log());
    for expected in [
        "BACKEND_TYPE=redis (from envoyproxy/ratelimit's settings)",
        "DEFAULT_ALGORITHM=fixed_window (from envoyproxy/ratelimit's settings)",
        "GRPC_SERVER_TLS_CA_CERT=",
        &format!("METRICS_ADDR=0.0.0.0:{prometheus} (from envoyproxy/ratelimit's settings)"),
        "named by the statsd-exporter mapping",
        "rules from xDS: subscribing",
        "rules loaded from xDS",
    ] {
        assert!(
            log_text.contains(expected),
            "no '{expected}' in:\n{log_text}"
        );
    }
    // Each difference is named once.
    assert_eq!(log_text.matches("GRPC_SERVER_TLS_CA_CERT=").count(), 1);
    // The Prometheus port: the reference's stats as Envoy Gateway's mapping names them (what its
    // dashboard queries), beside the process metrics.
    let page =
        crate::common::metrics::scrape(&format!("http://127.0.0.1:{prometheus}/metrics")).await;
    for series in [
        r#"ratelimit_service_rate_limit_total_hits{domain="eg",key1="user"} 3"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="eg",key1="user"} 2"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="eg",key1="user"} 1"#,
        "ratelimit_service_config_load_success 1",
    ] {
        assert!(page.contains(series), "no {series} in:\n{page}");
    }
    assert!(page.contains("process_resident_memory_bytes "), "{page}");
    assert!(
        !page.contains("rule=\"user\""),
        "the mapping replaces our per-rule labels:\n{page}"
    );
    if is_root() {
        let status = std::fs::read_to_string(format!("/proc/{}/status", served.pid())).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(uid.contains("65534"), "{uid}");
    }
    assert_eq!(
        std::fs::read_dir(read_only.path()).unwrap().count(),
        0,
        "nothing written in the working directory"
    );
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Envoy Gateway's side: the `/certs` secret (one certificate for both ends, as its
/// `envoy-rate-limit` secret, and the CA), and its xDS server requiring client certificates and
/// TLS 1.3, serving a limit of 2 a day on `user` in domain `eg` (a day's window, the reference's
/// fixed window on the wall clock: three calls cannot straddle its end but at midnight UTC).
pub(crate) async fn gateway() -> (tempfile::TempDir, Ca, Ads) {
    let certs = tempfile::tempdir().unwrap();
    let ca = Ca::new("envoy-gateway CA");
    ca.server_and_client("envoy-ratelimit")
        .write(certs.path(), "tls");
    std::fs::write(certs.path().join("ca.crt"), ca.cert_pem()).unwrap();
    // Its name in the cluster, and loopback for the tests that dial it on the host.
    let leaf = ca.server_named(
        "envoy-gateway",
        &["envoy-gateway", "localhost", "127.0.0.1"],
    );
    let ads = Ads::start(Some(tls13_requiring_client_certs(&ca.cert_pem(), &leaf))).await;
    ads.set(
        "1",
        &[user_limit("default/eg", "eg", 2, RateLimitUnit::Day)],
    );
    (certs, ca, ads)
}

/// A ShouldRateLimit client over TLS to `grpc` (no client certificate), as Envoy reaches it.
pub(crate) async fn tls_client(ca_pem: &str, grpc: u16) -> RateLimitServiceClient<Channel> {
    let connector = TlsConnector::from(client_config(ca_pem, None, &[b"h2"]));
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{grpc}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(("127.0.0.1", grpc)).await?;
                let name = ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

/// Three ShouldRateLimit calls for `user=gateway` in domain `eg` (a limit of 2): their codes.
pub(crate) async fn three_calls(client: &mut RateLimitServiceClient<Channel>) -> Vec<Code> {
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("eg", &[&[("user", "gateway")]]))
            .await
            .unwrap()
            .into_inner();
        codes.push(code(r.overall_code));
    }
    codes
}

/// Three calls for `user` answer OK, OK, OVER_LIMIT (its limit is 2 a day) with the counters in
/// `redis`, as the reference keeps them; `log` is the server's, shown on failure.
pub(crate) async fn decides_on_redis(
    client: &mut RateLimitServiceClient<Channel>,
    redis: &RedisServer,
    log: impl Fn() -> String,
) {
    assert_eq!(
        three_calls(client).await,
        [Code::Ok, Code::Ok, Code::OverLimit],
        "{}",
        log()
    );
    assert!(!redis.keys("*").is_empty(), "no key in Redis:\n{}", log());
}

/// The binary as Envoy Gateway's container runs it (`/bin/ratelimit`, exactly its environment),
/// with its addresses and paths substituted: the management server, Redis, the Prometheus port,
/// the mapping file and the `/certs` secret.
fn gateway_command(
    ads: &Ads,
    redis: &RedisServer,
    certs: &Path,
    prometheus: u16,
    mapping: &Path,
) -> Command {
    let certs_dir = format!("{}/", certs.display());
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"));
    command.arg0("/bin/ratelimit").env_clear();
    for (name, value) in ENVOY_GATEWAY_ENV {
        let value = match *name {
            "CONFIG_GRPC_XDS_SERVER_URL" => ads.url(),
            "REDIS_URL" => redis.addr(),
            "PROMETHEUS_ADDR" => format!(":{prometheus}"),
            "PROMETHEUS_MAPPER_YAML" => mapping.display().to_string(),
            _ => value.replace("/certs/", &certs_dir),
        };
        command.env(name, value);
    }
    command
}

/// Envoy Gateway's listeners moved to free loopback ports, as the other tests here do.
fn on_free_ports(command: &mut Command) -> (u16, u16) {
    let (http, grpc) = (free_port(), free_port());
    command
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string());
    (http, grpc)
}

/// Envoy Gateway's `redis-auth-settings` Deployment (an older shape, still rendered): rules from
/// the ConfigMap mounted at `/data/ratelimit/config` (no xDS), Redis with a password, statsd on
/// (to the default sink, localhost:8125, which need not be there: decisions never wait on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server on PATH")]
async fn envoy_gateway_s_file_rules_with_redis_auth_variant_decides_on_redis() {
    const ENV: &[(&str, &str)] = &[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.redis.svc:6379"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "true"),
        ("REDIS_AUTH", "redis_auth_password"),
    ];
    let redis = RedisServer::spawn(
        free_port(),
        &["--requirepass", "redis_auth_password"],
        ["-a", "redis_auth_password", "--no-auth-warning"]
            .map(String::from)
            .to_vec(),
    );
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.yaml"),
        "domain: eg\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"));
    command.arg0("/bin/ratelimit").env_clear();
    for (name, value) in ENV {
        let value = match *name {
            "REDIS_URL" => redis.addr(),
            "RUNTIME_ROOT" => data.path().display().to_string(),
            _ => (*value).to_owned(),
        };
        command.env(name, value);
    }
    let (http, grpc) = on_free_ports(&mut command);
    let mut served = Served::spawn_command(command, grpc, http);
    served.wait_healthy().await;
    let mut client = served.client().await;
    decides_on_redis(&mut client, &redis, || served.log()).await;
    let log = served.log();
    for expected in [
        "BACKEND_TYPE=redis",
        "statsd stats (the reference's names) sent over TCP",
    ] {
        assert!(log.contains(expected), "no '{expected}' in:\n{log}");
    }
}

/// Envoy Gateway's `enable-tracing-custom` Deployment: the default one plus the reference's
/// tracing settings (OTLP to a collector that is not there here), and its statsd-exporter
/// ConfigMap, which is optional, absent: the server starts, decides, and keeps our metric names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_redis, ignore = "needs redis-server on PATH")]
async fn envoy_gateway_s_tracing_variant_without_its_optional_mapping_decides() {
    let tracing_env = [
        ("TRACING_ENABLED", "true".to_owned()),
        ("TRACING_SERVICE_NAME", "envoy-ratelimit".to_owned()),
        (
            "TRACING_SERVICE_NAMESPACE",
            "envoy-gateway-system".to_owned(),
        ),
        (
            "TRACING_SERVICE_INSTANCE_ID",
            "envoy-ratelimit-5d8f7b-x2x9q".to_owned(),
        ),
        ("TRACING_SAMPLING_RATE", "0.6".to_owned()),
        // trace-collector.envoy-gateway-system.svc.cluster.local:4317, where nothing listens.
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}", free_port()),
        ),
    ];
    let redis = RedisServer::start().expect("redis-server");
    let (certs, ca, ads) = gateway().await;
    let prometheus = free_port();
    let absent = tempfile::tempdir().unwrap();
    let mapping = absent.path().join("statsd-exporter/conf.yaml");
    let mut command = gateway_command(&ads, &redis, certs.path(), prometheus, &mapping);
    command.envs(tracing_env);
    let (http, grpc) = on_free_ports(&mut command);
    let mut served = Served::spawn_command(command, grpc, http);
    served.wait_healthy().await;
    ads.wait_ack("1").await;
    let mut client = tls_client(&ca.cert_pem(), grpc).await;
    assert_eq!(
        three_calls(&mut client).await,
        [Code::Ok, Code::Ok, Code::OverLimit],
        "{}",
        served.log()
    );
    let page =
        crate::common::metrics::scrape(&format!("http://127.0.0.1:{prometheus}/metrics")).await;
    assert!(
        page.contains(
            r#"ratelimit_service_rate_limit_total_hits{domain="eg",rule="user",key1="user"} 3"#
        ),
        "{page}"
    );
    let log = served.log();
    assert!(
        log.contains("PROMETHEUS_MAPPER_YAML names no file"),
        "{log}"
    );
}
