//! A real `redis-server` per test, on a free loopback port, killed on drop. A test that needs it
//! carries `#[cfg_attr(no_redis, ignore = …)]`: listed as ignored where the build found no
//! redis-server and `CI` is unset; otherwise it runs, and fails without one.
#![allow(
    dead_code,
    reason = "a harness for every test module; each uses a part"
)]

use ratelimit_server::clock::monotonic;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub use super::ports::free_port;

/// Whether `redis-server` (or the server `REDIS_TEST_SERVER` names) can be run. A test that needs
/// it is ignored where the build found none (`build.rs`, `no_redis`), so here it must be there: a
/// missing one fails the test.
pub fn available() -> bool {
    runs(
        server_program(),
        "apt-get install -y redis-server; .ci/run installs it",
    )
}

/// Whether `valkey-server` (8.1 or later, for `SET … IFEQ`) can be run: as [`available`], for
/// the tests marked `no_valkey`.
pub fn valkey_available() -> bool {
    runs(VALKEY, "scripts/install-valkey.sh; .ci/run runs it")
}

/// Whether `redis6-server` (Redis 6.0, older than the compare-and-set needs) can be run: as
/// [`available`], for the tests marked `no_redis6`.
pub fn redis6_available() -> bool {
    runs(REDIS6, "scripts/install-redis6.sh; .ci/run runs it")
}

fn runs(program: &str, install: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{program} is not on PATH ({install}). \
         Outside CI, rebuild the tests to have them listed as ignored instead."
    );
    found
}

/// A plain connection to Redis held by a test ([`RedisServer::hold`]).
pub struct HeldClient(std::net::TcpStream);

impl HeldClient {
    /// Sends `args` as one command and reads its one-line reply (`+OK`, `:4`…).
    pub fn command(&mut self, args: &[&str]) -> String {
        use std::io::{Read, Write};
        let mut sent = format!("*{}\r\n", args.len());
        for arg in args {
            sent += &format!("${}\r\n{arg}\r\n", arg.len());
        }
        self.0.write_all(sent.as_bytes()).unwrap();
        let mut reply = [0u8; 256];
        let n = self.0.read(&mut reply).unwrap();
        String::from_utf8_lossy(&reply[..n]).trim().to_owned()
    }
}

pub const REDIS: &str = "redis-server";
pub const VALKEY: &str = "valkey-server";
pub const REDIS6: &str = "redis6-server";

/// The server the Redis tests start: redis-server, or valkey-server where `REDIS_TEST_SERVER`
/// says so (.ci/run runs the Redis tests a second time on Valkey that way). Tests that start a
/// server of their own kind (`start_valkey`, `restart_as_redis`, Sentinel's) keep it.
pub fn server_program() -> &'static str {
    match std::env::var("REDIS_TEST_SERVER").as_deref() {
        Ok(VALKEY) => VALKEY,
        _ => REDIS,
    }
}

pub struct RedisServer {
    pub port: u16,
    /// The server's program: `redis-server` or `valkey-server`.
    program: &'static str,
    child: Child,
    /// Where the server runs (its logs and files), removed on drop.
    pub dir: tempfile::TempDir,
    /// Extra redis-cli arguments to reach it (TLS, password).
    pub cli_args: Vec<String>,
    /// The extra redis-server arguments it was started with (kept for [`RedisServer::restart`]).
    extra: Vec<String>,
}

impl RedisServer {
    /// A plain server on a free port, or None (after a loud message) without redis-server.
    pub fn start() -> Option<RedisServer> {
        Self::start_with(&[])
    }

    /// A server with extra arguments; waits until it answers PING.
    pub fn start_with(extra: &[&str]) -> Option<RedisServer> {
        if !available() {
            return None;
        }
        let port = free_port();
        Some(Self::spawn(port, extra, Vec::new()))
    }

    /// A Valkey server (8.1 or later) on a free port, or None (after a loud message) without one.
    pub fn start_valkey() -> Option<RedisServer> {
        if !valkey_available() {
            return None;
        }
        Some(Self::spawn_program(VALKEY, free_port(), &[], Vec::new()))
    }

    /// A Redis 6.0 server on a free port, or None (after a loud message) without one.
    pub fn start_redis6() -> Option<RedisServer> {
        if !redis6_available() {
            return None;
        }
        Some(Self::spawn_program(REDIS6, free_port(), &[], Vec::new()))
    }

    /// Starts redis-server on `port` with `extra` arguments, reached by redis-cli with `cli_args`.
    pub fn spawn(port: u16, extra: &[&str], cli_args: Vec<String>) -> RedisServer {
        Self::spawn_program(server_program(), port, extra, cli_args)
    }

    /// [`RedisServer::spawn`] of `program` (`redis-server` or `valkey-server`).
    pub fn spawn_program(
        program: &'static str,
        port: u16,
        extra: &[&str],
        cli_args: Vec<String>,
    ) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let child = Self::run(program, port, dir.path(), &extra);
        let server = RedisServer {
            port,
            program,
            child,
            dir,
            cli_args,
            extra,
        };
        server.wait_ready();
        server
    }

    fn run(program: &str, port: u16, dir: &Path, extra: &[String]) -> Child {
        let mut cmd = Command::new(program);
        cmd.args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", &dir.display().to_string()])
            .args(["--logfile", "redis.log"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd.spawn().expect("the server starts")
    }

    /// The redis-server process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (STOP, CONT, KILL) to the redis-server process with `kill`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Lets a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    /// Kills the server (SIGKILL) and waits for it to be gone; [`RedisServer::restart`] brings
    /// it back on the same port.
    pub fn kill_now(&mut self) {
        self.kill();
    }

    /// Starts redis-server again on the same port with the same arguments (empty: nothing was
    /// saved) and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Self::run(self.program, self.port, self.dir.path(), &self.extra);
        self.wait_ready();
    }

    /// [`RedisServer::restart`] as redis-server (7.0 here, without `SET … IFEQ`): a Valkey
    /// replaced by an older server on the same address.
    pub fn restart_as_redis(&mut self) {
        self.program = REDIS;
        self.restart();
    }

    fn wait_ready(&self) {
        let started = monotonic();
        loop {
            if self.cli(&["PING"]).is_ok_and(|out| out.trim() == "PONG") {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server on port {} did not answer PING; log:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// A client connection the test holds (it keeps a client slot: with `maxclients` reached,
    /// the test can still configure Redis through it).
    pub fn hold(&self) -> HeldClient {
        HeldClient(std::net::TcpStream::connect(self.addr()).expect("a connection to Redis"))
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `host:port` of the server.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs redis-cli against this server; returns its standard output.
    pub fn cli(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli_args)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || stdout.starts_with("ERR") {
            return Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(stdout)
    }

    /// The keys matching `pattern` (SCAN). The RLQS demand exchange's keys (`<prefix>%rlqs…`)
    /// and the instances' registry (`<prefix>%instances`, which every server on Redis beats in)
    /// are left out unless `pattern` names them, so tests of the counters see the counters.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let out = self
            .cli(&["--scan", "--pattern", pattern])
            .expect("redis-cli --scan");
        let rlqs = pattern.contains("%rlqs");
        let instances = pattern.contains("%instances");
        let mut keys: Vec<String> = out
            .lines()
            .filter(|k| rlqs || !k.contains("%rlqs"))
            .filter(|k| instances || !k.ends_with("%instances"))
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys
    }

    /// Starts counting the commands clients send ([`RedisServer::commands_sent`]): from now on
    /// Redis logs every command in its slow log, which starts empty.
    pub fn count_commands(&self) {
        self.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"])
            .expect("CONFIG SET");
        self.cli(&["CONFIG", "SET", "slowlog-max-len", "100000"])
            .expect("CONFIG SET");
        self.cli(&["SLOWLOG", "RESET"]).expect("SLOWLOG RESET");
    }

    /// The commands clients sent since [`RedisServer::count_commands`], each as its name (lower
    /// case) and arguments: round trips, where `INFO commandstats` also counts the commands a
    /// script runs inside Redis (the slow log has those too, with no client: `?:0`).
    fn sent(&self) -> Vec<(String, Vec<String>)> {
        let out = self
            .cli(&["--json", "SLOWLOG", "GET", "-1"])
            .expect("SLOWLOG GET");
        let entries: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
        entries
            .iter()
            .filter(|e| !e[4].as_str().unwrap_or("?").starts_with('?'))
            .filter_map(|e| {
                let mut words = e[3]
                    .as_array()?
                    .iter()
                    .map(|a| a.as_str().unwrap_or_default().to_owned());
                Some((words.next()?.to_ascii_lowercase(), words.collect()))
            })
            .collect()
    }

    /// Commands named `names` (lower case) that clients sent since
    /// [`RedisServer::count_commands`].
    pub fn commands_sent(&self, names: &[&str]) -> u64 {
        self.sent()
            .iter()
            .filter(|(name, _)| names.contains(&name.as_str()))
            .count() as u64
    }

    /// `GET`s of counters that clients sent since [`RedisServer::count_commands`]: a one-key
    /// compare-and-set that writes nothing (a denial's check). Not those of the store's own keys
    /// (`<prefix>%…`: the instances' beat reads one every second or two).
    pub fn counter_gets_sent(&self) -> u64 {
        self.sent()
            .iter()
            .filter(|(name, args)| name == "get" && args.first().is_some_and(|k| !k.contains('%')))
            .count() as u64
    }

    /// Commands named `name` (lower case) that clients sent with `arg` among their arguments,
    /// since [`RedisServer::count_commands`].
    pub fn commands_sent_with(&self, name: &str, arg: &str) -> u64 {
        self.sent()
            .iter()
            .filter(|(named, args)| named == name && args.iter().any(|a| a == arg))
            .count() as u64
    }

    /// One field of `INFO section` (e.g. ("commandstats", "cmdstat_mget")).
    pub fn info(&self, section: &str) -> String {
        self.cli(&["INFO", section]).expect("INFO")
    }

    pub fn stop(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A directory path as a string argument.
pub fn arg(path: &Path) -> String {
    path.display().to_string()
}

/// Where the tests put generated files that must outlive one server (certificates).
pub fn scratch() -> PathBuf {
    tempfile::tempdir().expect("temp dir").keep()
}
