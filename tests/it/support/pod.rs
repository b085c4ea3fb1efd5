//! A rendered Deployment's container run on the host as kubelet would run it (the spec read by
//! tests/it/support/manifest.rs): the image's binary paths and working directory laid out in a
//! temporary root, absolute paths of the environment mapped into it, ConfigMap and Secret volumes
//! written in kubelet's layout (files are symlinks through `..data` to a timestamped directory,
//! swapped atomically on update), the listen addresses moved to free loopback ports, and the
//! container's user when the test runs as root.
#![allow(
    dead_code,
    reason = "a harness for every test module; each uses a part"
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ratelimit_server::clock::monotonic;

use crate::common::free_port;
use crate::support::manifest::{Container, EnvValue, Image, Probe, Source, repo};

/// The binary under test: `RATELIMIT_SERVER_BIN` (e.g. target/release/ratelimit-server), else
/// the one cargo built for this test.
pub fn binary() -> PathBuf {
    std::env::var_os("RATELIMIT_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ratelimit-server")))
}

/// The binary's default for the `serve` setting read from `env` (`serve --help`'s
/// `[env: NAME=] [default: VALUE]`).
pub fn binary_default(env: &str) -> String {
    let out = Command::new(binary())
        .args(["serve", "--help"])
        .env_clear()
        .output()
        .expect("serve --help runs");
    let help = String::from_utf8_lossy(&out.stdout);
    let marker = format!("[env: {env}=] [default: ");
    let at = help
        .find(&marker)
        .unwrap_or_else(|| panic!("serve --help names no default for {env}"));
    let rest = &help[at + marker.len()..];
    rest[..rest.find(']').expect("closing bracket")].to_owned()
}

/// Whether this process is root (and so can run the container as its user).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A volume directory in kubelet's layout: `..<timestamp>/` holds the files, `..data` links to
/// it, and each file is a link through `..data`. [`Volume::update`] swaps `..data` atomically.
pub struct Volume {
    dir: PathBuf,
    keys: Vec<String>,
    generation: u32,
}

impl Volume {
    pub fn create(dir: &Path, files: &[(String, String)]) -> Volume {
        std::fs::create_dir_all(dir).expect("mount point");
        chmod(dir, 0o755);
        let mut volume = Volume {
            dir: dir.to_owned(),
            keys: Vec::new(),
            generation: 0,
        };
        volume.update(files);
        volume
    }

    /// Writes `files` the way kubelet's atomic writer does: a new timestamped directory, a
    /// `..data_tmp` link to it renamed over `..data`, links for new keys, old keys' links and the
    /// old directory removed.
    pub fn update(&mut self, files: &[(String, String)]) {
        static UNIQUE: AtomicU32 = AtomicU32::new(0);
        self.generation += 1;
        let name = format!(
            "..2026_12_01_00_00_{:02}.{}{}",
            self.generation,
            std::process::id(),
            UNIQUE.fetch_add(1, Ordering::Relaxed)
        );
        let data = self.dir.join(&name);
        std::fs::create_dir(&data).expect("data dir");
        for (key, text) in files {
            let file = data.join(key);
            std::fs::write(&file, text).expect("volume file");
            chmod(&file, 0o644);
        }
        chmod(&data, 0o755);
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let tmp = self.dir.join("..data_tmp");
        symlink(&name, &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        let keys: Vec<String> = files.iter().map(|(k, _)| k.clone()).collect();
        for key in &keys {
            let link = self.dir.join(key);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(Path::new("..data").join(key), &link).expect("key link");
            }
        }
        for key in self.keys.iter().filter(|k| !keys.contains(k)) {
            let _ = std::fs::remove_file(self.dir.join(key));
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).expect("old data dir");
        }
        self.keys = keys;
    }
}

/// What the test supplies that the cluster would: Secret contents.
#[derive(Default)]
pub struct Cluster {
    /// secret name → (key, value)
    pub secrets: HashMap<String, Vec<(String, String)>>,
}

impl Cluster {
    fn secret(&self, name: &str) -> Option<&Vec<(String, String)>> {
        self.secrets.get(name)
    }
}

/// One replica of the container, running on the host, killed when dropped.
pub struct Pod {
    pub child: Child,
    pub root: tempfile::TempDir,
    /// container port → host address.
    pub ports: HashMap<u16, SocketAddr>,
    pub volumes: HashMap<String, Volume>,
    pub container: Container,
    pub user: String,
    log: tempfile::NamedTempFile,
}

impl Pod {
    /// Starts the container: its command (or the image's ENTRYPOINT) and args, exactly its
    /// environment with absolute paths mapped into a temporary root, the listen addresses moved to
    /// free loopback ports (the container ports they stand for checked against the binary's
    /// defaults), as its user when this process is root.
    pub fn start(container: &Container, image: &Image, cluster: &Cluster) -> Pod {
        let root = tempfile::tempdir().expect("pod root");
        chmod(root.path(), 0o755);
        let host = |path: &str| root.path().join(path.trim_start_matches('/'));
        // The image: the binary at both its paths, the working directory with the shipped rules.
        let bin = host("/usr/local/bin/ratelimit-server");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        // A hard link (a copy across file systems), not a symlink: the container's user must be
        // able to run it even where the build directory is closed to other users.
        let built = std::fs::canonicalize(binary()).expect("the binary exists");
        if std::fs::hard_link(&built, &bin).is_err() {
            std::fs::copy(&built, &bin).expect("copy the binary");
            chmod(&bin, 0o755);
        }
        std::fs::create_dir_all(host("/bin")).unwrap();
        symlink("../usr/local/bin/ratelimit-server", host("/bin/ratelimit")).unwrap();
        let workdir = host(&image.workdir);
        std::fs::create_dir_all(workdir.join("config")).unwrap();
        for entry in std::fs::read_dir(repo().join("config")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), workdir.join("config").join(entry.file_name())).unwrap();
        }
        for dir in ["usr", "usr/local", "usr/local/bin", "bin", "srv"] {
            chmod(&host(dir), 0o755);
        }
        chmod(&workdir, 0o755);
        chmod(&workdir.join("config"), 0o755);
        // Volumes.
        let mut volumes = HashMap::new();
        for mount in &container.mounts {
            let files = match &mount.source {
                Source::ConfigMap { data, .. } => data.clone(),
                Source::Secret { name } => cluster
                    .secret(name)
                    .unwrap_or_else(|| panic!("the test supplies no Secret {name}"))
                    .clone(),
            };
            volumes.insert(
                mount.path.clone(),
                Volume::create(&host(&mount.path), &files),
            );
        }
        // The environment, absolute paths (the container's filesystem) mapped into the root.
        let map_path = |value: &str| -> String {
            if value.starts_with('/') {
                host(value).display().to_string()
            } else {
                value.to_owned()
            }
        };
        let mut env: Vec<(String, String)> = Vec::new();
        for (name, value) in &container.env {
            match value {
                EnvValue::Literal(v) => env.push((name.clone(), map_path(v))),
                EnvValue::Secret {
                    name: secret,
                    key,
                    optional,
                } => {
                    let found = cluster
                        .secret(secret)
                        .and_then(|kv| kv.iter().find(|(k, _)| k == key))
                        .map(|(_, v)| v.clone());
                    match found {
                        Some(v) => env.push((name.clone(), v)),
                        None => assert!(*optional, "{name}: Secret {secret} has no key {key}"),
                    }
                }
            }
        }
        // Listen addresses: the container port each one stands for, moved to a free port.
        let mut ports = HashMap::new();
        // METRICS_ADDR (off by default) only when the container sets it.
        for (setting, port_name) in [
            ("GRPC_ADDR", "grpc"),
            ("HTTP_ADDR", "admin"),
            ("METRICS_ADDR", "metrics"),
        ] {
            let inside = match container.literal(setting) {
                Some(value) => value.to_owned(),
                None if setting == "METRICS_ADDR" => continue,
                None => binary_default(setting),
            };
            let inside: SocketAddr = inside.parse().expect("a socket address");
            assert_eq!(
                inside.port(),
                container.port(port_name),
                "{setting} listens on {inside}, but container port {port_name} is {}",
                container.port(port_name)
            );
            let outside: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            env.retain(|(n, _)| n != setting);
            env.push((setting.to_owned(), outside.to_string()));
            ports.insert(inside.port(), outside);
        }
        // Command and args as kubelet combines them with the image's.
        let (command, args) = if container.command.is_empty() {
            (image.entrypoint.clone(), container.args.clone())
        } else {
            (container.command.clone(), container.args.clone())
        };
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut cmd = Command::new(host(&command[0]));
        cmd.args(&command[1..])
            .args(&args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(&workdir)
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap());
        let user = match container.run_as {
            Some((uid, gid)) if is_root() => {
                cmd.uid(uid).gid(gid);
                format!("uid {uid}, gid {gid} (the container's)")
            }
            Some((uid, _)) => format!(
                "this test's user, not the container's uid {uid} (running as root would use it)"
            ),
            None => "this test's user".to_owned(),
        };
        let child = cmd.spawn().expect("the container's command starts");
        eprintln!(
            "pod: {} {:?} as {user}; ports {ports:?}; env {env:?}",
            command.join(" "),
            args
        );
        Pod {
            child,
            root,
            ports,
            volumes,
            container: container.clone(),
            user,
            log,
        }
    }

    /// The host address of a named container port.
    pub fn addr(&self, port_name: &str) -> SocketAddr {
        self.ports[&self.container.port(port_name)]
    }

    /// The HTTP status of `probe` now (None: no answer, as kubelet's connection refused).
    pub async fn probe(&self, probe: &Probe) -> Option<u16> {
        let url = format!("http://{}{}", self.addr(&probe.port), probe.path);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(probe.timeout as u64))
            .build()
            .unwrap();
        client
            .get(url)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// Waits until `probe` succeeds (200-399). Fails if the process exits or 60 s pass.
    pub async fn wait_for(&mut self, probe: &Probe) {
        let started = monotonic();
        loop {
            if self
                .probe(probe)
                .await
                .is_some_and(|s| (200..400).contains(&s))
            {
                return;
            }
            if let Some(exit) = self.child.try_wait().unwrap() {
                panic!("the container exited ({exit}):\n{}", self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{} never succeeded:\n{}",
                probe.path,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Rewrites a mounted volume's files (kubelet's update of a ConfigMap or Secret).
    pub fn update_volume(&mut self, mount_path: &str, files: &[(String, String)]) {
        self.volumes
            .get_mut(mount_path)
            .unwrap_or_else(|| panic!("nothing mounted at {mount_path}"))
            .update(files);
    }

    /// Sends SIGTERM, as kubelet does to stop the container.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits for the process to exit; None if it is still running after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = monotonic();
        loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                return Some(exit);
            }
            if started.elapsed() > limit {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
