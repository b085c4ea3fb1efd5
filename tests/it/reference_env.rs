//! The real binary started with nothing but envoyproxy/ratelimit's environment, as a Deployment
//! that only changed its image would start it: config under `RUNTIME_ROOT/ratelimit/config`,
//! `PORT`/`GRPC_PORT`/`DEBUG_PORT`, `USE_STATSD=false`, `LOG_LEVEL=debug`,
//! `RUNTIME_WATCH_ROOT=false`, and no subcommand.

use crate::common;

use common::process::{Served, reference_listeners};

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Code, code, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_server::clock::monotonic;

fn rules(rpu: u32) -> String {
    format!(
        "domain: rl\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: {rpu}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_style_environment_serves_reloads_and_warns() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), rules(5)).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"));
    command.env_clear();
    let (http, grpc, debug) = reference_listeners(&mut command);
    command
        .env("RUNTIME_ROOT", root.path())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("USE_STATSD", "false")
        .env("LOG_LEVEL", "DEBUG")
        .env("MEMCACHE_HOST_PORT", "memcached:11211")
        .env("GRPC_MAX_CONNECTION_AGE", "24h")
        .env("GRPC_MAX_CONNECTION_AGE_GRACE", "1h")
        .env("MERGE_DOMAIN_CONFIG", "true");
    let mut served = Served::spawn_command(command, grpc, http);
    served.wait_healthy().await;
    let read_log = || served.log();
    // The rules served over gRPC on GRPC_PORT.
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    let r = client
        .should_rate_limit(request("rl", &[&[("user", "a")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // The debug listener on DEBUG_PORT: an index and /rlconfig.
    let index = reqwest::get(format!("http://127.0.0.1:{debug}/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(index.contains("/rlconfig"), "{index}");
    let dump = reqwest::get(format!("http://127.0.0.1:{debug}/rlconfig"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        dump.starts_with(
            "rl.user: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false"
        ),
        "the reference's text dump: {dump}"
    );
    // An edit in place (RUNTIME_WATCH_ROOT=false style) reloads.
    std::fs::write(config.join("config.yaml"), rules(50)).unwrap();
    let started = monotonic();
    loop {
        let mut probe = request("rl", &[&[("user", "probe")]]);
        probe.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        let r = client.should_rate_limit(probe).await.unwrap().into_inner();
        if r.statuses[0].limit_remaining == 50 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "edit not in force:\n{}",
            read_log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The start-up log: where the settings came from, one warning per unsupported setting, and
    // LOG_LEVEL=DEBUG honoured.
    let text = read_log();
    eprintln!("{text}");
    let config_line = format!("CONFIG_DIR={}", config.display());
    assert!(text.contains(&config_line), "{text}");
    assert_eq!(
        text.matches("MEMCACHE_HOST_PORT=memcached:11211 is not supported")
            .count(),
        1,
        "{text}"
    );
    assert!(
        !text.contains("USE_STATSD"),
        "USE_STATSD=false needs no warning:\n{text}"
    );
    assert_eq!(
        text.matches(" WARN ").count(),
        1,
        "one warning only:\n{text}"
    );
    assert!(text.contains("DEBUG"), "debug lines are logged:\n{text}");
}

/// The binary's whole output (stdout and stderr) for `args` with `env`, run to its end (at most
/// 10 s; a server that starts is killed then).
fn output_of(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"));
    command
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let child = command.spawn().unwrap();
    let pid = child.id();
    let started = monotonic();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !waiter.is_finished() {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    let out = waiter.join().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn passwords_in_addresses_never_reach_the_output() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), rules(5)).unwrap();
    let config = dir.path().to_str().unwrap();
    let listen = ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"];
    let mut serve = vec!["serve", "--config", config];
    serve.extend_from_slice(&listen);
    for (what, args, env) in [
        (
            "a malformed REDIS_URL",
            serve.clone(),
            vec![
                ("BACKEND_TYPE", "redis"),
                ("REDIS_URL", "redis://default:s3cret@bad host:6379"),
            ],
        ),
        (
            "a bad port",
            serve.clone(),
            vec![
                ("BACKEND_TYPE", "redis"),
                ("REDIS_URL", "redis://default:s3cret@h:notaport"),
            ],
        ),
        (
            "a cluster seed",
            serve.clone(),
            vec![
                ("BACKEND_TYPE", "redis"),
                ("REDIS_TYPE", "cluster"),
                ("REDIS_URL", "h1:1,ftp://u:s3cret@h2:2"),
            ],
        ),
        (
            "a Unix socket's pass parameter",
            serve.clone(),
            vec![
                ("BACKEND_TYPE", "redis"),
                ("REDIS_URL", "redis+unix:///no/such.sock?pass=s3cret&db=x"),
            ],
        ),
        (
            "the reference's REDIS_PERSECOND_URL, warned about",
            vec!["check", config],
            vec![("REDIS_PERSECOND_URL", "redis://u:s3cret@persecond:6379")],
        ),
        (
            "--help, which shows environment values",
            vec!["serve", "--help"],
            vec![
                ("REDIS_URL", "redis://u:s3cret@h:1"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://u:s3cret@c:4317"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20s3cret",
                ),
            ],
        ),
        (
            "a RECORD_HASH_KEY that is not 32 hex digits",
            {
                let mut args = serve.clone();
                args.extend_from_slice(&["--record", "/dev/null", "--record-hash-values"]);
                args
            },
            vec![("RECORD_HASH_KEY", "s3cret")],
        ),
        (
            "a malformed OTLP header",
            serve.clone(),
            vec![
                ("TRACING_ENABLED", "true"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "authorization Bearer s3cret"),
            ],
        ),
    ] {
        let output = output_of(&args, &env);
        assert!(!output.trim().is_empty(), "{what}: no output");
        assert!(
            !output.contains("s3cret"),
            "{what}: the password is in the output:\n{output}"
        );
    }
    // What is shown instead.
    let output = output_of(
        &serve,
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_URL", "redis://default:s3cret@h:notaport"),
        ],
    );
    assert!(
        output.contains("'redis://default:***@h:notaport'"),
        "{output}"
    );
}

/// Every setting envoyproxy/ratelimit reads (the `envconfig` names of its `src/settings/settings.go`,
/// as of its commit f2fb157, 2026), each either read here under the same name, translated, or said
/// at start-up when set: a user who switches images is never left with a setting nothing answers
/// for. Its newer ones (REDIS_SENTINEL_AUTH, REDIS_STARTUP_*,
/// PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS, REDIS_CLUSTER_PIPELINE_PARALLELISM) were found this way.
#[test]
fn every_setting_of_the_reference_is_read_or_said() {
    const REFERENCE: &[&str] = &[
        "BACKEND_TYPE",
        "CACHE_KEY_PREFIX",
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "CONFIG_GRPC_XDS_NODE_ID",
        "CONFIG_GRPC_XDS_NODE_METADATA",
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "CONFIG_GRPC_XDS_SERVER_URL",
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        "CONFIG_TYPE",
        "DEBUG_HOST",
        "DEBUG_PORT",
        "DISABLE_STATS",
        "EXPIRATION_JITTER_MAX_SECONDS",
        "EXTRA_TAGS",
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "GRPC_CLIENT_TLS_CACERT",
        "GRPC_CLIENT_TLS_SAN",
        "GRPC_HOST",
        "GRPC_MAX_CONNECTION_AGE",
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "GRPC_PORT",
        "GRPC_SERVER_TLS_CERT",
        "GRPC_SERVER_TLS_KEY",
        "GRPC_SERVER_USE_TLS",
        "GRPC_UDS",
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "HOST",
        "LIMIT_LIMIT_HEADER",
        "LIMIT_REMAINING_HEADER",
        "LIMIT_RESET_HEADER",
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "LOG_FORMAT",
        "LOG_LEVEL",
        "MEMCACHE_HOST_PORT",
        "MEMCACHE_MAX_IDLE_CONNS",
        "MEMCACHE_SRV",
        "MEMCACHE_SRV_REFRESH",
        "MEMCACHE_TLS",
        "MEMCACHE_TLS_CACERT",
        "MEMCACHE_TLS_CLIENT_CERT",
        "MEMCACHE_TLS_CLIENT_KEY",
        "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        "MERGE_DOMAIN_CONFIG",
        "NEAR_LIMIT_RATIO",
        "PORT",
        "PROMETHEUS_ADDR",
        "PROMETHEUS_MAPPER_YAML",
        "PROMETHEUS_PATH",
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "QUOTA_MODE",
        "REDIS_AUTH",
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "REDIS_PERSECOND",
        "REDIS_PERSECOND_AUTH",
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        "REDIS_PERSECOND_POOL_SIZE",
        "REDIS_PERSECOND_SENTINEL_AUTH",
        "REDIS_PERSECOND_SOCKET_TYPE",
        "REDIS_PERSECOND_TIMEOUT",
        "REDIS_PERSECOND_TLS",
        "REDIS_PERSECOND_TYPE",
        "REDIS_PERSECOND_URL",
        "REDIS_PIPELINE_LIMIT",
        "REDIS_PIPELINE_WINDOW",
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "REDIS_POOL_SIZE",
        "REDIS_SENTINEL_AUTH",
        "REDIS_SOCKET_TYPE",
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "REDIS_STARTUP_MAX_INTERVAL",
        "REDIS_TIMEOUT",
        "REDIS_TLS",
        "REDIS_TLS_CACERT",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_CLIENT_KEY",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "REDIS_TYPE",
        "REDIS_URL",
        "RESPONSE_DYNAMIC_METADATA",
        "RUNTIME_APPDIRECTORY",
        "RUNTIME_IGNOREDOTFILES",
        "RUNTIME_ROOT",
        "RUNTIME_SUBDIRECTORY",
        "RUNTIME_WATCH_ROOT",
        "SHADOW_MODE",
        "STATSD_HOST",
        "STATSD_PORT",
        "STATS_FLUSH_INTERVAL",
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "TRACING_ENABLED",
        "TRACING_EXPORTER_PROTOCOL",
        "TRACING_SAMPLING_RATE",
        "TRACING_SERVICE_INSTANCE_ID",
        "TRACING_SERVICE_NAME",
        "TRACING_SERVICE_NAMESPACE",
        "USE_DOG_STATSD",
        "USE_DOG_STATSD_MOGRIFIERS",
        "USE_PROMETHEUS",
        "USE_STATSD",
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "XDS_CLIENT_BACKOFF_JITTER",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    ];
    // Read only beside a setting that is itself warned of (a second Redis, memcached, DogStatsD).
    const UNDER_A_WARNED_ONE: &[(&str, &str)] = &[
        ("REDIS_PERSECOND_", "REDIS_PERSECOND"),
        ("MEMCACHE_", "MEMCACHE_HOST_PORT"),
        ("USE_DOG_STATSD_", "USE_DOG_STATSD"),
    ];
    // Ours too, read by the logging's set-up rather than by a flag.
    const OURS_OUTSIDE_THE_FLAGS: &[&str] = &["LOG_LEVEL", "LOG_FORMAT"];
    fn envs(command: &clap::Command, into: &mut Vec<String>) {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env() {
                into.push(env.to_string_lossy().into_owned());
            }
        }
        for sub in command.get_subcommands() {
            envs(sub, into);
        }
    }
    let mut ours: Vec<String> = OURS_OUTSIDE_THE_FLAGS
        .iter()
        .map(|n| n.to_string())
        .collect();
    envs(
        &<ratelimit_server::cli::Cli as clap::CommandFactory>::command(),
        &mut ours,
    );
    let nothing_answers: Vec<&str> = REFERENCE
        .iter()
        .copied()
        .filter(|name| !ours.iter().any(|o| o == name))
        .filter(|name| !ratelimit_server::reference_env::reads(name))
        .filter(|name| {
            !UNDER_A_WARNED_ONE.iter().any(|(prefix, parent)| {
                name.starts_with(prefix) && ratelimit_server::reference_env::reads(parent)
            })
        })
        .collect();
    assert!(nothing_answers.is_empty(), "{nothing_answers:?}");
}
