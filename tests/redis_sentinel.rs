//! Sentinel: one master, one replica, one sentinel (redis-server --sentinel with a conf the test
//! writes); the server finds the master through the sentinel and decides there.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::redis::{RedisServer, ServerProcess, free_port};
use common::{Code, code, request};

struct Sentinel {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sentinel(master_port: u16) -> Sentinel {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
             sentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds mymaster 5000\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server --sentinel");
    let s = Sentinel {
        port,
        child,
        _dir: dir,
    };
    let started = Instant::now();
    while !cli(port, &["SENTINEL", "get-master-addr-by-name", "mymaster"])
        .contains(&master_port.to_string())
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "sentinel never knew the master"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

#[tokio::test]
async fn the_server_finds_the_master_through_the_sentinel() {
    let Some(master) = RedisServer::start() else {
        return;
    };
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let sentinel = sentinel(master.port);
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("s.yaml"),
        "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .unwrap();
    let env = vec![
        ("BACKEND_TYPE", "redis".to_string()),
        ("REDIS_TYPE", "SENTINEL".into()),
        ("REDIS_URL", format!("mymaster,127.0.0.1:{}", sentinel.port)),
        ("CACHE_KEY_PREFIX", "sn:".into()),
    ];
    let mut server = ServerProcess::start(rules.path(), &env);
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("s", &[&[("k", "v")]]))
            .await
            .expect("answered")
            .into_inner();
        codes.push(code(r.overall_code));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    assert_eq!(
        master.keys("sn:*"),
        ["sn:{s}|k=v|0.0.3600s"],
        "written on the master"
    );
    let started = Instant::now();
    while replica.keys("sn:*").is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never replicated"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
