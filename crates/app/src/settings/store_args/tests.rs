//! Store settings: names, URL forms, auth and TLS files, and errors that name the setting.
use super::*;
use clap::Parser;

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    store: StoreArgs,
}

fn args(flags: &[&str]) -> Result<StoreArgs, String> {
    let mut argv = vec!["test"];
    argv.extend_from_slice(flags);
    Wrapper::try_parse_from(argv)
        .map(|w| w.store)
        .map_err(|e| e.to_string())
}

fn config(flags: &[&str]) -> Result<RedisConfig, SettingError> {
    args(flags).expect("flags parse").redis_config()
}

#[test]
fn names_parse_in_any_case_and_bad_ones_name_the_setting() {
    assert_eq!(parse_backend("Redis"), Ok(BackendType::Redis));
    assert_eq!(parse_redis_type("CLUSTER"), Ok(RedisType::Cluster));
    assert_eq!(parse_socket_type("Unix"), Ok(SocketType::Unix));
    assert!(
        parse_backend("memcache")
            .unwrap_err()
            .contains("memory or redis")
    );
    let e = args(&["--redis-type", "ring"]).unwrap_err();
    assert!(
        e.contains("--redis-type") && e.contains("single, sentinel or cluster"),
        "{e}"
    );
    let e = args(&["--redis-pool-size", "0"]).unwrap_err();
    assert!(e.contains("--redis-pool-size"), "{e}");
    let e = args(&["--redis-timeout", "soon"]).unwrap_err();
    assert!(e.contains("--redis-timeout"), "{e}");
    let e = args(&["--cache-key-prefix", "a{b}"]).unwrap_err();
    assert!(e.contains("--cache-key-prefix"), "{e}");
    let d = args(&[]).unwrap();
    assert_eq!(d.backend, BackendType::Memory);
    assert_eq!(d.redis_timeout, Duration::from_millis(100));
    assert_eq!(d.redis_failure_mode, FailureMode::Local);
    assert_eq!(d.local_cache_size_in_bytes, 0);
    assert_eq!(cache_bytes("1MiB"), Ok(1 << 20));
    assert_eq!(parse_failure_mode("DENY"), Ok(FailureMode::Deny));
    assert!(
        parse_failure_mode("open")
            .unwrap_err()
            .contains("local, allow, deny or error")
    );
}

#[test]
fn every_url_form_is_understood() {
    let single = |flags: &[&str]| match config(flags).map(|c| c.topology) {
        Ok(Topology::Single(info)) => info,
        other => panic!("{other:?}"),
    };
    let info = single(&["--redis-url", "localhost:6380"]);
    assert_eq!(info.addr(), &ConnectionAddr::Tcp("localhost".into(), 6380));
    let info = single(&["--redis-url", "redis://bob:secret@10.0.0.1:7000/3"]);
    assert_eq!(info.redis_settings().db(), 3);
    assert_eq!(info.redis_settings().username(), Some("bob"));
    assert_eq!(info.redis_settings().password(), Some("secret"));
    let info = single(&["--redis-url", "rediss://cache.internal:6380"]);
    assert!(matches!(info.addr(), ConnectionAddr::TcpTls { .. }));
    let info = single(&[
        "--redis-socket-type",
        "unix",
        "--redis-url",
        "/run/redis.sock",
    ]);
    assert_eq!(info.addr(), &ConnectionAddr::Unix("/run/redis.sock".into()));
    match config(&["--redis-type", "cluster", "--redis-url", "a:1, b:2,c:3"])
        .unwrap()
        .topology
    {
        Topology::Cluster(seeds) => assert_eq!(seeds.len(), 3),
        other => panic!("{other:?}"),
    }
    match config(&[
        "--redis-type",
        "Sentinel",
        "--redis-url",
        "mymaster,s1:26379,s2:26379",
    ])
    .unwrap()
    .topology
    {
        Topology::Sentinel { master, sentinels } => {
            assert_eq!(master, "mymaster");
            assert_eq!(sentinels.len(), 2);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn auth_and_tls_settings() {
    let c = config(&["--redis-auth", "pass:word"]).unwrap();
    assert_eq!(c.auth, Some((Some("pass".into()), "word".into())));
    let c = config(&["--redis-auth", "justapassword"]).unwrap();
    assert_eq!(c.auth, Some((None, "justapassword".into())));
    assert!(config(&[]).unwrap().tls.is_none());
    assert!(config(&["--redis-tls"]).unwrap().tls.is_some());
    assert!(
        config(&["--redis-url", "rediss://h:1"])
            .unwrap()
            .tls
            .is_some()
    );
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("ca.pem");
    std::fs::write(
        &pem,
        "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello").unwrap();
    let p = pem.to_str().unwrap();
    assert!(
        config(&["--redis-tls", "--redis-tls-cacert", p])
            .unwrap()
            .tls
            .unwrap()
            .ca_cert
            .is_some()
    );
    let e = config(&["--redis-tls-cacert", p]).unwrap_err();
    assert_eq!(e.setting, "REDIS_TLS");
    let e = config(&["--redis-tls", "--redis-tls-cacert", junk.to_str().unwrap()]).unwrap_err();
    assert_eq!(e.setting, "REDIS_TLS_CACERT");
    let e = config(&["--redis-tls", "--redis-tls-cacert", "/nonexistent.pem"]).unwrap_err();
    assert!(
        e.to_string().starts_with("REDIS_TLS_CACERT: cannot read"),
        "{e}"
    );
    let e = config(&["--redis-tls", "--redis-tls-client-cert", p]).unwrap_err();
    assert_eq!(e.setting, "REDIS_TLS_CLIENT_KEY");
}

#[test]
fn bad_addresses_name_redis_url() {
    for (flags, setting) in [
        (&["--redis-url", "nohostport"][..], "REDIS_URL"),
        (&["--redis-url", "h:notaport"], "REDIS_URL"),
        (&["--redis-url", "a:1,b:2"], "REDIS_URL"),
        (&["--redis-url", "http://h:1"], "REDIS_URL"),
        (
            &["--redis-type", "sentinel", "--redis-url", "h:1"],
            "REDIS_URL",
        ),
        (
            &["--redis-type", "cluster", "--redis-socket-type", "unix"],
            "REDIS_SOCKET_TYPE",
        ),
    ] {
        let e = config(flags).unwrap_err();
        assert_eq!(e.setting, setting, "{flags:?}: {e}");
    }
}
