//! Logging setup: `RUST_LOG` (a full filter) or `LOG_LEVEL` (default info) and
//! `LOG_FORMAT=json|text`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = std::env::var("RUST_LOG")
        .or_else(|_| {
            std::env::var("LOG_LEVEL").map(|l| level_filter(&crate::reference_env::log_level(&l)))
        })
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The server's own crates, as `tracing` names their events' targets (the binary's and each
/// workspace library's).
const OUR_CRATES: [&str; 6] = [
    "ratelimit_server",
    "ratelimit_app",
    "ratelimit_core",
    "ratelimit_remote",
    "ratelimit_redis",
    "ratelimit_replay",
];

/// The filter for a `LOG_LEVEL`: `debug` and `trace` are the server's own crates' (libraries stay
/// at `info`: HTTP/2 frame dumps are not what an operator turning on debug logs asks for); lower
/// levels apply to everything. `RUST_LOG` sets any filter.
fn level_filter(level: &str) -> String {
    match level {
        "debug" | "trace" => std::iter::once("info".to_owned())
            .chain(OUR_CRATES.iter().map(|c| format!("{c}={level}")))
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{OUR_CRATES, level_filter};

    #[test]
    fn debug_levels_are_the_servers_own_and_lower_levels_apply_to_all() {
        assert_eq!(
            level_filter("debug"),
            "info,ratelimit_server=debug,ratelimit_app=debug,ratelimit_core=debug,\
             ratelimit_remote=debug,ratelimit_redis=debug,ratelimit_replay=debug"
        );
        assert!(level_filter("trace").ends_with(",ratelimit_replay=trace"));
        assert_eq!(level_filter("warn"), "warn");
        assert_eq!(level_filter("error"), "error");
    }

    /// Every crate of the workspace is named (its library's target is its name with `_`): a crate
    /// left out logs nothing at `LOG_LEVEL=debug`, as all but the binary's did.
    #[test]
    fn every_crate_of_the_workspace_is_ours() {
        let manifest = include_str!("../../../Cargo.toml");
        let members = manifest
            .lines()
            .find_map(|l| l.strip_prefix("members = "))
            .expect("the workspace's members");
        for member in members.split('"').filter(|m| m.starts_with("crates/")) {
            let krate = format!("ratelimit_{}", member.trim_start_matches("crates/"));
            assert!(OUR_CRATES.contains(&krate.as_str()), "{krate} is not named");
        }
    }
}
