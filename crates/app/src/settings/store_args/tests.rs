//! Store settings: names, flags reaching the Redis crate's settings, and errors that name the
//! setting (the URL forms, auth and TLS files themselves: `ratelimit_redis`'s settings tests).
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

/// Whether the Redis config of `flags` has TLS on.
fn described_tls(flags: &[&str]) -> bool {
    config(flags).unwrap().describe().ends_with("(TLS)")
}

#[test]
fn names_parse_in_any_case_and_bad_ones_name_the_setting() {
    assert_eq!(parse_backend("Redis"), Ok(BackendType::Redis));
    assert_eq!(RedisType::parse("CLUSTER"), Ok(RedisType::Cluster));
    assert_eq!(SocketType::parse("Unix"), Ok(SocketType::Unix));
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
fn the_redis_flags_reach_the_redis_settings() {
    let described = |flags: &[&str]| config(flags).unwrap().describe();
    assert_eq!(
        described(&["--redis-url", "localhost:6380"]),
        "single localhost:6380"
    );
    assert_eq!(
        described(&["--redis-type", "cluster", "--redis-url", "a:1, b:2,c:3"]),
        "cluster seeded by a:1,b:2,c:3"
    );
    assert_eq!(
        described(&[
            "--redis-type",
            "Sentinel",
            "--redis-url",
            "mymaster,s1:26379,s2:26379",
        ]),
        "master 'mymaster' via sentinels s1:26379,s2:26379"
    );
    assert_eq!(
        config(&["--cache-key-prefix", "rl:"]).unwrap().prefix(),
        "rl:"
    );
}

#[test]
fn auth_and_tls_flags_reach_the_redis_settings() {
    assert!(config(&["--redis-auth", "pass:word"]).is_ok());
    assert!(!described_tls(&[]));
    assert!(described_tls(&["--redis-tls"]));
    assert!(described_tls(&["--redis-url", "rediss://h:1"]));
    // Each file flag reaches its setting: a file that cannot be read is refused by its name.
    for (flag, setting) in [
        ("--redis-tls-cacert", "REDIS_TLS_CACERT"),
        ("--redis-tls-client-cert", "REDIS_TLS_CLIENT_CERT"),
        ("--redis-tls-client-key", "REDIS_TLS_CLIENT_KEY"),
    ] {
        let e = config(&["--redis-tls", flag, "/nonexistent.pem"]).unwrap_err();
        assert_eq!(e.setting, setting, "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("{setting}: cannot read")),
            "{e}"
        );
    }
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
