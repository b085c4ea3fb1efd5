//! A redis-server (or valkey-server) of a test's own, on a free port, for the crate's tests that
//! need Redis itself (the script's effects, the dispatcher's pipelines, the conditional `SET`):
//! killed and waited for on drop.

use std::process::{Child, Command, Stdio};

/// A running redis-server.
pub(crate) struct TestRedis {
    process: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TestRedis {
    /// A fresh server that answers `PING`; `None` (said loudly) where there is no redis-server
    /// and `CI` is unset, as the root package's tests do.
    pub(crate) fn start() -> Option<TestRedis> {
        Self::start_program("redis-server", "apt-get install redis-server")
    }

    /// A fresh Valkey (8.1 or later: it has `SET … IFEQ`), the same way; `None` (said loudly)
    /// where there is no valkey-server and `CI` is unset.
    pub(crate) fn start_valkey() -> Option<TestRedis> {
        Self::start_program("valkey-server", "scripts/install-valkey.sh")
    }

    fn start_program(program: &str, install: &str) -> Option<TestRedis> {
        let found = Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(std::env::var_os("CI").is_none(), "{program} not on PATH");
            eprintln!("SKIPPED: {program} is not on PATH ({install})");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let process = Command::new(program)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &dir.path().display().to_string()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let redis = TestRedis {
            process,
            port,
            _dir: dir,
        };
        for _ in 0..500 {
            if redis
                .connection()
                .is_ok_and(|mut c| ::redis::cmd("PING").query::<String>(&mut c).is_ok())
            {
                return Some(redis);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("{program} on port {port} did not answer");
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A blocking connection of the test's own.
    pub(crate) fn connection(&self) -> ::redis::RedisResult<::redis::Connection> {
        ::redis::Client::open(self.url())?.get_connection()
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the server.
    pub(crate) fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.process.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} redis-server");
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
