//! `ratelimit-server query`: `host:port` is accepted, limits print with unit names, and a server
//! it cannot reach is reported with the cause.

use crate::common;

use common::start;

const RULES: &str = r#"
domain: q
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

fn query(args: Vec<String>) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .arg("query")
        .args(args)
        .output()
        .expect("run query");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_accepts_host_port_and_prints_unit_names() {
    let s = start(&[("q.yaml", RULES)]).await;
    let args = vec![
        "--server".into(),
        s.server.grpc_addr.to_string(),
        "--domain".into(),
        "q".into(),
        "user=a".into(),
    ];
    let (status, out) = tokio::task::spawn_blocking(move || query(args))
        .await
        .unwrap();
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("overall: OK"), "{out}");
    assert!(
        out.contains("user=a: OK (1000 per minute), remaining 999"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_names_why_it_cannot_connect() {
    let args = vec![
        "--server".into(),
        "127.0.0.1:1".into(),
        "--domain".into(),
        "q".into(),
        "user=a".into(),
    ];
    let (status, out) = tokio::task::spawn_blocking(move || query(args))
        .await
        .unwrap();
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains("cannot connect to http://127.0.0.1:1"),
        "{out}"
    );
    assert!(out.to_lowercase().contains("refused"), "{out}");
}
