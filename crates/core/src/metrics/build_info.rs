//! What this binary is: the version from `Cargo.toml` and the commit it was built from (when the
//! build was given one in `RATELIMIT_SERVER_COMMIT`), for `--version` and the
//! `ratelimit_build_info` gauge.

use std::sync::OnceLock;

use prometheus::{IntGaugeVec, Opts, Registry};

/// The package version, from `Cargo.toml`.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the binary was built from: `RATELIMIT_SERVER_COMMIT` in the build's environment
/// (the Dockerfile passes its `REVISION` build argument), read at compile time, so no git is
/// needed at run time. `None` when the build was not given one or it was empty.
pub(crate) const COMMIT: Option<&str> = match option_env!("RATELIMIT_SERVER_COMMIT") {
    Some(commit) if !commit.is_empty() => Some(commit),
    _ => None,
};

/// The `commit` label's value when the build was given no commit.
pub(crate) const UNKNOWN_COMMIT: &str = "unknown";

/// `--version`'s text after the program name: `0.1.0`, or `0.1.0 (commit 1a2b3c4)`.
pub fn long_version() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| match COMMIT {
        Some(commit) => format!("{VERSION} (commit {commit})"),
        None => VERSION.to_owned(),
    })
}

/// Registers `ratelimit_build_info{version, commit} 1`.
pub(super) fn register(registry: &Registry) {
    let gauge = IntGaugeVec::new(
        Opts::new(
            "ratelimit_build_info",
            "Always 1; the labels say which build is running",
        ),
        &["version", "commit"],
    )
    .expect("valid metric definition");
    gauge
        .with_label_values(&[VERSION, COMMIT.unwrap_or(UNKNOWN_COMMIT)])
        .set(1);
    registry
        .register(Box::new(gauge))
        .expect("metric registered once");
}
