//! The Redis settings: URL forms, auth and TLS files, and errors that name the setting.
use super::*;

fn settings(url: &str) -> RedisSettings<'_> {
    RedisSettings {
        url,
        redis_type: RedisType::Single,
        socket_type: SocketType::Tcp,
        auth: "",
        sentinel_auth: "",
        tls: false,
        tls_cacert: None,
        tls_client_cert: None,
        tls_client_key: None,
        tls_skip_hostname_verification: false,
        pool_size: 4,
        timeout: Duration::from_millis(100),
        prefix: "",
    }
}

fn single(settings: RedisSettings<'_>) -> ConnectionInfo {
    match RedisConfig::from_settings(&settings).map(|c| c.topology) {
        Ok(Topology::Single(info)) => info,
        other => panic!("{other:?}"),
    }
}

#[test]
fn names_parse_in_any_case() {
    assert_eq!(RedisType::parse("CLUSTER"), Ok(RedisType::Cluster));
    assert_eq!(SocketType::parse("Unix"), Ok(SocketType::Unix));
    assert!(
        RedisType::parse("ring")
            .unwrap_err()
            .contains("single, sentinel or cluster")
    );
    assert!(
        SocketType::parse("udp")
            .unwrap_err()
            .contains("tcp or unix")
    );
}

#[test]
fn every_url_form_is_understood() {
    let info = single(settings("localhost:6380"));
    assert_eq!(info.addr(), &ConnectionAddr::Tcp("localhost".into(), 6380));
    let info = single(settings("redis://bob:secret@10.0.0.1:7000/3"));
    assert_eq!(info.redis_settings().db(), 3);
    assert_eq!(info.redis_settings().username(), Some("bob"));
    assert_eq!(info.redis_settings().password(), Some("secret"));
    let info = single(settings("rediss://cache.internal:6380"));
    assert!(matches!(info.addr(), ConnectionAddr::TcpTls { .. }));
    let info = single(RedisSettings {
        socket_type: SocketType::Unix,
        ..settings("/run/redis.sock")
    });
    assert_eq!(info.addr(), &ConnectionAddr::Unix("/run/redis.sock".into()));
    let cluster = RedisSettings {
        redis_type: RedisType::Cluster,
        ..settings("a:1, b:2,c:3")
    };
    match RedisConfig::from_settings(&cluster).unwrap().topology {
        Topology::Cluster(seeds) => assert_eq!(seeds.len(), 3),
        other => panic!("{other:?}"),
    }
    let sentinel = RedisSettings {
        redis_type: RedisType::Sentinel,
        ..settings("mymaster,s1:26379,s2:26379")
    };
    match RedisConfig::from_settings(&sentinel).unwrap().topology {
        Topology::Sentinel { master, sentinels } => {
            assert_eq!(master, "mymaster");
            assert_eq!(sentinels.len(), 2);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tools_name_a_server_or_a_cluster_by_url() {
    let c = RedisConfig::single("redis://127.0.0.1:7000")
        .unwrap()
        .with_prefix("t:");
    assert_eq!(c.prefix(), "t:");
    assert_eq!(c.describe(), "single 127.0.0.1:7000");
    let c = RedisConfig::cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).unwrap();
    assert!(matches!(c.topology, Topology::Cluster(seeds) if seeds.len() == 2));
    assert_eq!(
        RedisConfig::single("http://h:1").unwrap_err().setting(),
        "REDIS_URL"
    );
}

fn with_ca<'a>(base: RedisSettings<'a>, ca: &'a Path) -> RedisSettings<'a> {
    RedisSettings {
        tls_cacert: Some(ca),
        ..base
    }
}

#[test]
fn auth_and_tls_settings() {
    let config = |s: RedisSettings<'_>| RedisConfig::from_settings(&s);
    let base = settings("127.0.0.1:6379");
    let c = config(RedisSettings {
        auth: "pass:word",
        ..base
    })
    .unwrap();
    assert_eq!(c.auth, Some((Some("pass".into()), "word".into())));
    let c = config(RedisSettings {
        auth: "justapassword",
        ..base
    })
    .unwrap();
    assert_eq!(c.auth, Some((None, "justapassword".into())));
    assert!(config(base).unwrap().tls.is_none());
    let tls = RedisSettings { tls: true, ..base };
    assert!(config(tls).unwrap().tls.is_some());
    assert!(config(settings("rediss://h:1")).unwrap().tls.is_some());
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("ca.pem");
    std::fs::write(
        &pem,
        "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello").unwrap();
    let c = config(with_ca(tls, &pem)).unwrap();
    assert!(c.tls.unwrap().ca_cert.is_some());
    assert_eq!(
        config(with_ca(base, &pem)).unwrap_err().setting(),
        "REDIS_TLS"
    );
    let e = config(with_ca(tls, &junk)).unwrap_err();
    assert_eq!(e.setting(), "REDIS_TLS_CACERT");
    let e = config(with_ca(tls, Path::new("/nonexistent.pem"))).unwrap_err();
    assert!(
        e.to_string().starts_with("REDIS_TLS_CACERT: cannot read"),
        "{e}"
    );
    let e = config(RedisSettings {
        tls_client_cert: Some(&pem),
        ..tls
    })
    .unwrap_err();
    assert_eq!(e.setting(), "REDIS_TLS_CLIENT_KEY");
    let unix_tls = RedisSettings {
        socket_type: SocketType::Unix,
        ..tls
    };
    assert_eq!(config(unix_tls).unwrap_err().setting(), "REDIS_TLS");
}

#[test]
fn the_sentinels_password_is_read_for_sentinels_only() {
    let config = |s: RedisSettings<'_>| RedisConfig::from_settings(&s).unwrap();
    let sentinel = RedisSettings {
        redis_type: RedisType::Sentinel,
        auth: "master-pass",
        sentinel_auth: "sentinel-user:sentinel-pass",
        ..settings("mymaster,127.0.0.1:26379")
    };
    let c = config(sentinel);
    assert_eq!(c.auth, Some((None, "master-pass".into())));
    assert_eq!(
        c.sentinel_auth,
        Some((Some("sentinel-user".into()), "sentinel-pass".into()))
    );
    // Beside a single server it is unused, as the reference leaves it.
    let single = RedisSettings {
        sentinel_auth: "sentinel-pass",
        ..settings("127.0.0.1:6379")
    };
    assert_eq!(config(single).sentinel_auth, None);
}

#[test]
fn bad_addresses_name_redis_url() {
    let sentinel = RedisSettings {
        redis_type: RedisType::Sentinel,
        ..settings("h:1")
    };
    let unix_cluster = RedisSettings {
        redis_type: RedisType::Cluster,
        socket_type: SocketType::Unix,
        ..settings("127.0.0.1:6379")
    };
    for (settings, setting) in [
        (settings("nohostport"), "REDIS_URL"),
        (settings("h:notaport"), "REDIS_URL"),
        (settings(":1"), "REDIS_URL"),
        (settings(" "), "REDIS_URL"),
        (settings("a:1,b:2"), "REDIS_URL"),
        (settings("http://h:1"), "REDIS_URL"),
        (sentinel, "REDIS_URL"),
        (unix_cluster, "REDIS_SOCKET_TYPE"),
    ] {
        let e = RedisConfig::from_settings(&settings).unwrap_err();
        assert_eq!(e.setting(), setting, "{}: {e}", settings.url);
    }
}

#[test]
fn a_password_in_a_bad_url_is_not_repeated() {
    let e = RedisConfig::from_settings(&settings("http://bob:hunter2@h:1")).unwrap_err();
    assert!(!e.message().contains("hunter2"), "{e}");
}
