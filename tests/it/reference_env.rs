//! The real binary started with nothing but envoyproxy/ratelimit's environment, as a Deployment
//! that only changed its image would start it: config under `RUNTIME_ROOT/ratelimit/config`,
//! `PORT`/`GRPC_PORT`/`DEBUG_PORT`, `USE_STATSD=false`, `LOG_LEVEL=debug`,
//! `RUNTIME_WATCH_ROOT=false`, and no subcommand.

use crate::common;

use common::process::Served;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Code, code, free_port, request};
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
    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"));
    command
        .env_clear()
        .env("RUNTIME_ROOT", root.path())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", debug.to_string())
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
