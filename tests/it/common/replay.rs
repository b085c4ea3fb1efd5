//! Runs the built `ratelimit-server replay` as a user does and reads its `--format json` report.

use std::ffi::OsStr;
use std::process::Command;

/// `ratelimit-server replay --format json ARGS…`; panics with both outputs unless it exits 0.
pub fn replay_json<I, S>(args: I) -> serde_json::Value
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .args(["replay", "--format", "json"])
        .args(args)
        .output()
        .expect("run ratelimit-server replay");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}
