//! Which real parts the integration tests can run here. A test that needs `redis-server`, Envoy or
//! kubectl is marked `#[cfg_attr(no_redis, ignore = …)]` (and so on): when this build finds the
//! tool missing and `CI` is unset, `cargo test` lists the test as ignored, with the reason, instead
//! of passing it silently. Under CI every such test runs, and fails without its tool.

use std::env;
use std::path::{Path, PathBuf};

fn on_path(program: &str) -> bool {
    env::var_os("PATH")
        .is_some_and(|path| env::split_paths(&path).any(|dir| is_executable(&dir.join(program))))
}

fn is_executable(path: &Path) -> bool {
    path.is_file()
}

fn file_from_env(name: &str) -> Option<PathBuf> {
    env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn main() {
    for name in [
        "no_redis",
        "no_valkey",
        "no_redis6",
        "no_envoy",
        "no_kubectl",
    ] {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    for var in ["CI", "PATH", "ENVOY_BIN", "KUBECTL"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    println!("cargo::rerun-if-changed=build.rs");
    if env::var_os("CI").is_some() {
        return;
    }
    if !on_path("redis-server") {
        println!("cargo::rustc-cfg=no_redis");
    }
    if !on_path("valkey-server") {
        println!("cargo::rustc-cfg=no_valkey");
    }
    if !on_path("redis6-server") {
        println!("cargo::rustc-cfg=no_redis6");
    }
    let envoy = file_from_env("ENVOY_BIN").is_some_and(|p| p.is_file()) || on_path("envoy");
    if !envoy {
        println!("cargo::rustc-cfg=no_envoy");
    }
    let kubectl = file_from_env("KUBECTL").is_some_and(|p| p.is_file()) || on_path("kubectl");
    if !kubectl {
        println!("cargo::rustc-cfg=no_kubectl");
    }
}
