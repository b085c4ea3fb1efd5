//! TLS and passwords to Redis: certificates made with `openssl` by the test, redis-server on a
//! `--tls-port` with `--requirepass`, and the real server binary connecting with `REDIS_TLS*` and
//! `REDIS_AUTH` (mutual TLS, a wrong password, a certificate for another host name).

use crate::common;

use std::path::Path;
use std::process::Command;

use common::process::Served;
use common::redis::{RedisServer, available, free_port};
use common::{Code, code, request};

const RULES: &str =
    "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
const PASSWORD: &str = "s3cret-pass";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for `san` and a client certificate, all signed by the CA.
fn certificates(dir: &Path, san: &str) {
    // Extensions make them X.509 v3 certificates, which rustls requires.
    std::fs::write(dir.join("server.ext"), format!("subjectAltName={san}\n")).unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
        ],
    );
    for name in ["server", "client"] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        let mut args = vec![
            "x509",
            "-req",
            "-in",
            &*format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &*format!("{name}.crt"),
            "-days",
            "2",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        args.extend(["-extfile".into(), format!("{name}.ext")]);
        openssl(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

/// redis-server on a TLS port only, with a password; `clients` = require client certificates.
fn tls_redis(certs: &Path, clients: bool) -> RedisServer {
    let port = free_port();
    let p = |f: &str| certs.join(f).display().to_string();
    let port_s = port.to_string();
    let (ca, crt, key) = (p("ca.crt"), p("server.crt"), p("server.key"));
    let args = [
        "--port",
        "0",
        "--tls-port",
        &port_s,
        "--tls-cert-file",
        &crt,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        if clients { "yes" } else { "no" },
        "--requirepass",
        PASSWORD,
    ];
    let cli = vec![
        "--tls".into(),
        "--cacert".into(),
        ca.clone(),
        "--cert".into(),
        p("client.crt"),
        "--key".into(),
        p("client.key"),
        "-a".into(),
        PASSWORD.into(),
        "--no-auth-warning".into(),
    ];
    RedisServer::spawn(port, &args, cli)
}

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.yaml"), RULES).unwrap();
    dir
}

fn env(
    redis: &RedisServer,
    certs: &Path,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_URL", redis.addr()),
        ("REDIS_TLS", "true".into()),
        (
            "REDIS_TLS_CACERT",
            certs.join("ca.crt").display().to_string(),
        ),
        ("REDIS_AUTH", PASSWORD.into()),
        ("REDIS_TIMEOUT", "2s".into()),
        ("CACHE_KEY_PREFIX", "tls:".into()),
    ];
    env.extend_from_slice(extra);
    env
}

async fn decides(server: &mut Served) -> Vec<Code> {
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = client
            .should_rate_limit(request("tls", &[&[("k", "v")]]))
            .await
            .expect("answered")
            .into_inner();
        codes.push(code(r.overall_code));
    }
    codes
}

fn ready() -> bool {
    available() && Command::new("openssl").arg("version").output().is_ok()
}

/// Certificates for `san`, a rules directory, and a TLS-only redis-server on them (no client
/// certificates asked); `None` (the test skipped) without redis-server or openssl.
fn set_up(san: &str) -> Option<(tempfile::TempDir, tempfile::TempDir, RedisServer)> {
    if !ready() {
        return None;
    }
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path(), san);
    let redis = tls_redis(certs.path(), false);
    Some((certs, rules(), redis))
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn tls_with_a_password_and_mutual_tls() {
    // Server-authenticated TLS and a password.
    let Some((certs, rules, redis)) = set_up("DNS:localhost,IP:127.0.0.1") else {
        return;
    };
    let mut server = Served::with_env(rules.path(), &env(&redis, certs.path(), &[]));
    assert_eq!(
        decides(&mut server).await,
        [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]
    );
    assert_eq!(redis.keys("tls:*"), ["tls:tls|k=v|0.0.3600s"]);
    server.stop();

    // A wrong password stops the server at start-up.
    let wrong = env(&redis, certs.path(), &[("REDIS_AUTH", "nope".into())]);
    assert!(!Served::with_env(rules.path(), &wrong).wait_exit().success());
    drop(redis);

    // Mutual TLS: with the client certificate it works; without, Redis refuses the handshake.
    let redis = tls_redis(certs.path(), true);
    let p = |f: &str| certs.path().join(f).display().to_string();
    let mtls = env(
        &redis,
        certs.path(),
        &[
            ("REDIS_TLS_CLIENT_CERT", p("client.crt")),
            ("REDIS_TLS_CLIENT_KEY", p("client.key")),
        ],
    );
    let mut server = Served::with_env(rules.path(), &mtls);
    assert_eq!(decides(&mut server).await[0], Code::Ok);
    server.stop();
    let no_cert = env(&redis, certs.path(), &[]);
    assert!(
        !Served::with_env(rules.path(), &no_cert)
            .wait_exit()
            .success()
    );
}

#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn a_certificate_for_another_host_needs_the_hostname_check_skipped() {
    let Some((certs, rules, redis)) = set_up("DNS:redis.elsewhere.example") else {
        return;
    };
    let strict = env(&redis, certs.path(), &[]);
    assert!(
        !Served::with_env(rules.path(), &strict)
            .wait_exit()
            .success(),
        "127.0.0.1 is not redis.elsewhere.example"
    );
    let skip = env(
        &redis,
        certs.path(),
        &[("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true".into())],
    );
    let mut server = Served::with_env(rules.path(), &skip);
    assert_eq!(decides(&mut server).await[0], Code::Ok);
    // The chain is still checked: a CA that did not sign the certificate is refused.
    let other = tempfile::tempdir().unwrap();
    certificates(other.path(), "DNS:redis.elsewhere.example");
    let untrusted = env(
        &redis,
        certs.path(),
        &[
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true".into()),
            (
                "REDIS_TLS_CACERT",
                other.path().join("ca.crt").display().to_string(),
            ),
        ],
    );
    assert!(
        !Served::with_env(rules.path(), &untrusted)
            .wait_exit()
            .success()
    );
}

/// TLS on one side only, the commonest TLS mistake with a managed Redis (its TLS port given
/// without `REDIS_TLS`, or `rediss://` at a plaintext port): start-up stops saying which side
/// speaks what and what to set, where it said "unreachable" (a reset, or no connection in time)
/// and served on the failure mode for good.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn tls_on_one_side_only_stops_start_up_saying_which() {
    let Some((_certs, rules, redis)) = set_up("DNS:localhost,IP:127.0.0.1") else {
        return;
    };
    let log = refused_at(rules.path(), redis.addr(), Some(PASSWORD));
    let said = format!(
        "Redis refuses this server (TLS): {} serves TLS, and this server connects in plaintext: set REDIS_TLS=true",
        redis.addr()
    );
    assert!(log.contains(&said), "{log}");
    drop(redis);

    let Some(redis) = RedisServer::start() else {
        return;
    };
    let log = refused_at(rules.path(), format!("rediss://{}", redis.addr()), None);
    let said = format!(
        "Redis refuses this server (TLS): {} answers in plaintext, and this server connects with TLS",
        redis.addr()
    );
    assert!(log.contains(&said), "{log}");
}

/// The log of a start-up that must stop, on Redis at `url` (TLS only as the URL says), with the
/// password `auth`.
fn refused_at(rules: &Path, url: String, auth: Option<&str>) -> String {
    let mut env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_URL", url),
        ("REDIS_TIMEOUT", "1s".into()),
    ];
    env.extend(auth.map(|auth| ("REDIS_AUTH", auth.to_owned())));
    Served::refused(rules, &env)
}

/// A sentinel on a TLS port only, watching the TLS master at `master_port` (its password given),
/// with TLS to the master as well (`tls-replication`). Killed with its directory.
struct TlsSentinel {
    port: u16,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for TlsSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_sentinel(certs: &Path, master_port: u16) -> TlsSentinel {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let p = |f: &str| certs.join(f).display().to_string();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
             tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n\
             tls-replication yes\n\
             sentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel auth-pass mymaster {PASSWORD}\n\
             sentinel down-after-milliseconds mymaster 5000\n",
            dir.path().display(),
            p("server.crt"),
            p("server.key"),
            p("ca.crt"),
        ),
    )
    .unwrap();
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server --sentinel");
    let sentinel = TlsSentinel {
        port,
        child,
        _dir: dir,
    };
    common::wait::eventually_blocking("the TLS sentinel never knew the master", || {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--tls"])
            .args(["--cacert", &p("ca.crt")])
            .args(["SENTINEL", "get-master-addr-by-name", "mymaster"])
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).contains(&master_port.to_string())
    });
    sentinel
}

/// Sentinels behind TLS: with `REDIS_TLS` envoyproxy/ratelimit speaks TLS to the sentinels as to
/// the master (its #1015). Ours spoke plaintext to them, so the sentinel reset the connection and
/// the server started in the failure mode for good ("REDIS IS UNREACHABLE AT START-UP …
/// Connection reset by peer"); now it finds the master through them and decides there.
#[tokio::test]
#[cfg_attr(no_redis, ignore = "needs redis-server (apt-get install redis-server)")]
async fn sentinels_behind_tls_are_spoken_to_over_tls() {
    let Some((certs, rules, redis)) = set_up("DNS:localhost,IP:127.0.0.1") else {
        return;
    };
    let sentinel = tls_sentinel(certs.path(), redis.port);
    let sentinel_env = env(
        &redis,
        certs.path(),
        &[
            ("REDIS_TYPE", "sentinel".into()),
            ("REDIS_URL", format!("mymaster,127.0.0.1:{}", sentinel.port)),
        ],
    );
    let mut server = Served::with_env(rules.path(), &sentinel_env);
    server.client().await;
    // The test is about decisions on Redis: a slow start may begin in the failure mode.
    server.wait_for_metric("ratelimit_store_up", 1).await;
    assert_eq!(
        decides(&mut server).await,
        [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]
    );
    assert_eq!(redis.keys("tls:*"), ["tls:tls|k=v|0.0.3600s"]);
}
