//! The real binary as a child process: `serve` on free loopback ports with its log captured, for
//! tests that count log lines or need a second, independent process.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tempfile::NamedTempFile;

use super::free_port;
use super::wait::BOUND;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_server::clock::monotonic;
use tonic::transport::Channel;

/// A `ratelimit-server serve` child on free loopback ports, its log (stderr) in a temp file,
/// killed when dropped. The one launcher of the real binary for every test.
pub struct Served {
    child: Child,
    /// The gRPC port.
    pub grpc: u16,
    /// The admin port's base URL, `http://127.0.0.1:PORT`.
    pub http: String,
    log: NamedTempFile,
}

impl Served {
    /// Starts `serve --config dir` with extra arguments.
    pub fn start(dir: &Path, args: &[&str]) -> Served {
        Served::spawn(Path::new("."), dir, args, &[])
    }

    /// Same, run in `cwd` (so a relative `dir` is relative to it).
    pub fn start_in(cwd: &Path, dir: &Path, args: &[&str]) -> Served {
        Served::spawn(cwd, dir, args, &[])
    }

    /// Starts `serve --config dir` with extra environment (`SHUTDOWN_DELAY` 0 unless `env` says).
    pub fn with_env(dir: &Path, env: &[(&str, String)]) -> Served {
        let mut all = vec![("SHUTDOWN_DELAY", "0s".to_owned())];
        all.extend(env.iter().cloned());
        Served::spawn(Path::new("."), dir, &[], &all)
    }

    fn spawn(cwd: &Path, dir: &Path, args: &[&str], env: &[(&str, String)]) -> Served {
        let log = NamedTempFile::new().unwrap();
        let (grpc, http) = (free_port(), free_port());
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"));
        command
            .current_dir(cwd)
            .args(["serve", "--config"])
            .arg(dir)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(args)
            .env("LOG_LEVEL", "info")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap());
        for (name, value) in env {
            command.env(name, value);
        }
        Served {
            child: command.spawn().expect("the server binary runs"),
            grpc,
            http: format!("http://127.0.0.1:{http}"),
            log,
        }
    }

    /// The binary as `command` sets it up (environment and arguments are the test's: e.g. the
    /// reference's variables alone), its gRPC port `grpc` and admin port `http`, its stderr in the
    /// log.
    pub fn spawn_command(mut command: Command, grpc: u16, http: u16) -> Served {
        let log = NamedTempFile::new().unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("the server binary runs");
        Served {
            child,
            grpc,
            http: format!("http://127.0.0.1:{http}"),
            log,
        }
    }

    /// Waits until `/healthcheck` answers 200 (fails if the server exits first).
    pub async fn wait_healthy(&mut self) {
        let url = format!("{}/healthcheck", self.http);
        let started = monotonic();
        loop {
            if reqwest::get(&url)
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            if let Some(exit) = self.child.try_wait().unwrap() {
                panic!("server exited ({exit}):\n{}", self.log());
            }
            assert!(started.elapsed() < BOUND, "not healthy:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A gRPC client, once the server accepts (fails if it exits first).
    pub async fn client(&mut self) -> RateLimitServiceClient<Channel> {
        let url = format!("http://127.0.0.1:{}", self.grpc);
        let started = monotonic();
        loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                panic!("server exited ({exit}):\n{}", self.log());
            }
            if let Ok(client) = RateLimitServiceClient::connect(url.clone()).await {
                return client;
            }
            assert!(
                started.elapsed() < BOUND,
                "server never listened:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the process to exit (it is expected to fail at start-up); returns its status.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let started = monotonic();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(started.elapsed() < BOUND, "server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `serve --config dir` with `env` (as [`Served::with_env`]) where start-up must stop:
    /// asserts that it exits with status 1; its log.
    pub fn refused(dir: &Path, env: &[(&str, String)]) -> String {
        let mut server = Served::with_env(dir, env);
        assert_eq!(
            server.wait_exit().code(),
            Some(1),
            "the server must not start"
        );
        server.log()
    }

    /// Kills the server now.
    pub fn stop(self) {}

    pub async fn wait_ready(&mut self) {
        let started = monotonic();
        loop {
            let ready = reqwest::get(format!("{}/readyz", self.http)).await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            if let Some(exit) = self.child.try_wait().unwrap() {
                panic!("server exited ({exit}):\n{}", self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "server not ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A counter or gauge from `/metrics` (0 when absent). A page that cannot be read (the
    /// server gone, or not listening) fails the test with the server's log, which says why.
    pub async fn metric(&self, name: &str) -> u64 {
        let url = format!("{}/metrics", self.http);
        let page = match reqwest::get(&url).await {
            Ok(answer) => answer.text().await,
            Err(e) => Err(e),
        };
        match page {
            Ok(page) => super::metrics::count(&page, name),
            Err(e) => panic!(
                "GET {url}: {e}
the server's log:
{}",
                self.log()
            ),
        }
    }

    /// Waits (at most 30 s) until `name` reaches `value`.
    pub async fn wait_for_metric(&self, name: &str, value: u64) {
        let started = monotonic();
        while self.metric(name).await < value {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{name} did not reach {value}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends SIGTERM, as an orchestrator stops the server.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends SIGHUP, as an operator asks a server to read its configuration again.
    pub fn hang_up(&self) {
        self.signal("HUP");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} {}", self.child.id());
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }

    /// How many log lines contain `text`.
    pub fn log_lines(&self, text: &str) -> usize {
        self.lines_with(text).len()
    }

    /// The log lines that contain `text`.
    pub fn lines_with(&self, text: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time (user + system) process `pid` has used, in clock ticks (1/100 s).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // After the command name: state is field 3, utime 14 and stime 15 (1-based).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A child process, killed and reaped when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ratelimit-server` run by `prlimit LIMIT` (util-linux sets the limit on itself, then execs the
/// server, which keeps it: no code of ours runs between fork and exec), with the arguments and
/// environment `command` adds. `None` where prlimit cannot run and `CI` is not set (the test is
/// then reported as skipped); with `CI` set that is a failure.
pub fn under_prlimit(limit: &str, command: impl FnOnce(&mut Command)) -> Option<Killed> {
    let mut prlimit = Command::new("prlimit");
    prlimit
        .arg(limit)
        .arg(env!("CARGO_BIN_EXE_ratelimit-server"))
        .stdout(Stdio::null());
    command(&mut prlimit);
    match prlimit.spawn() {
        Ok(child) => Some(Killed(child)),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPING: prlimit (util-linux) cannot run the server: {e}");
            None
        }
        Err(e) => panic!("prlimit (util-linux) runs the server: {e}"),
    }
}

/// Waits (at most 10 s, far above the normal time) until `health` answers 200.
pub async fn wait_healthy(health: &str) {
    let started = monotonic();
    while !reqwest::get(health).await.is_ok_and(|r| r.status() == 200) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "server did not become healthy at {health}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The reference's listener settings on `command`: `HOST`/`PORT`, `GRPC_HOST`/`GRPC_PORT`,
/// `DEBUG_HOST`/`DEBUG_PORT` on free loopback ports; returns (http, grpc, debug).
pub fn reference_listeners(command: &mut Command) -> (u16, u16, u16) {
    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    command
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", debug.to_string());
    (http, grpc, debug)
}
