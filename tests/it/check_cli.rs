//! `ratelimit-server check` on real files: every bad file is rejected with its file, line, column
//! and field named; the shipped rules pass.

use std::path::Path;
use std::process::Command;

fn check(dir: &Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .arg("check")
        .arg(dir)
        .output()
        .expect("run ratelimit-server check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn each_bad_file_is_reported_with_file_line_column_and_field() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad");
    let expected = std::fs::read_to_string(dir.join("EXPECTED.txt")).expect("EXPECTED.txt");
    let (code, stdout, stderr) = check(&dir);
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let mut cases = 0;
    for line in expected
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let (place, words) = line
            .split_once('\t')
            .expect("<file>:<line>:<col>\\t<words>");
        let prefix = format!("{}:", dir.join(place).display());
        let found = stdout
            .lines()
            .any(|l| l.starts_with(&prefix) && l.contains(words));
        assert!(
            found,
            "no line starting with {prefix:?} and containing {words:?} in:\n{stdout}"
        );
        cases += 1;
    }
    assert!(cases >= 10, "EXPECTED.txt lists {cases} cases");
}

#[test]
fn shipped_rules_and_examples_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["config", "examples/rules"] {
        let (code, stdout, stderr) = check(&root.join(dir));
        assert_eq!(code, 0, "{dir}: {stdout}{stderr}");
        assert!(stdout.contains("OK"), "{stdout}");
    }
}

#[test]
fn a_missing_directory_is_an_error() {
    let (code, stdout, stderr) = check(Path::new("/nonexistent/rules"));
    assert_eq!(code, 1);
    assert!(format!("{stdout}{stderr}").contains("/nonexistent/rules"));
}

#[test]
fn an_empty_directory_passes_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "not rules").unwrap();
    let (code, stdout, stderr) = check(dir.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("OK (0 domains, 0 rules)"), "{stdout}");
    assert_eq!(
        stderr.trim(),
        format!(
            "warning: no rules files in {0}: every request is allowed\n\
             warning: 1 file(s) in {0} not read, as only *.yaml and *.yml files are rules files \
             here (envoyproxy/ratelimit reads every file): README.md; rename a rules file to end \
             in .yaml",
            dir.path().display()
        )
    );
}

#[test]
fn a_file_over_max_file_bytes_is_refused_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let text = "domain: a\ndescriptors: []\n";
    std::fs::write(dir.path().join("a.yaml"), text).unwrap();
    let run = |cap: usize| {
        let out = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
            .arg("check")
            .arg(dir.path())
            .env("MAX_FILE_BYTES", cap.to_string())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(run(text.len()).0, Some(0));
    let (code, stdout) = run(text.len() - 1);
    assert_eq!(code, Some(1));
    assert!(
        stdout.contains(&format!("a.yaml: the file is {} bytes", text.len()))
            && stdout.contains("MAX_FILE_BYTES"),
        "{stdout}"
    );
}

#[test]
fn version_is_the_cargo_version_and_names_the_commit_when_built_with_one() {
    let out = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let want = match option_env!("RATELIMIT_SERVER_COMMIT").filter(|c| !c.is_empty()) {
        Some(commit) => format!(
            "ratelimit-server {} (commit {commit})\n",
            env!("CARGO_PKG_VERSION")
        ),
        None => format!("ratelimit-server {}\n", env!("CARGO_PKG_VERSION")),
    };
    assert_eq!(text, want);
}

/// `check --merge-domain-config DIR` (the flag before the directory) used to read DIR as the flag's
/// value and fail ("invalid value"); the flag now takes a value only after `=`.
#[test]
fn merge_domain_config_before_the_directory_is_the_flag_and_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    for (file, key) in [("a.yaml", "a"), ("b.yaml", "b")] {
        std::fs::write(
            dir.path().join(file),
            format!("domain: shared\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"),
        )
        .unwrap();
    }
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ratelimit-server"))
            .arg("check")
            .args(args)
            .arg(dir.path())
            .env_remove("MERGE_DOMAIN_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, out) = run(&["--merge-domain-config"]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run(&["--merge-domain-config=false"]);
    assert_eq!(code, Some(1), "one domain in two files, not merged: {out}");
    let (code, out) = run(&["--merge-domain-config=true"]);
    assert_eq!(code, Some(0), "{out}");
}
