//! The dependency rule of `docs/architecture.md`, checked on the source text: modules are layered,
//! a module names only modules of lower layers (`crate::…`), and the pure modules name no runtime,
//! network, file system or wall clock. A failure names the file, the line and the offending text.

use std::fs;
use std::path::{Path, PathBuf};

/// Lowest first. A module may name modules of lower layers only (not its own layer's others).
const LAYERS: &[&[&str]] = &[
    &["clock", "testing", "redact"],
    &["config", "wire"],
    &["limiter"],
    &["policy"],
    &["store"],
    &["metrics", "telemetry"],
    &["status", "rules_dir", "health", "record", "plot"],
    &["engine"],
    &["front"],
    &["service", "http", "reload", "replay"],
    &["net"],
    &["settings", "reference_env"],
    &["app"],
    &["cli", "logging"],
];

/// Pure: no runtime, I/O or clock reads (the clock module is the one reader of wall time).
const PURE: &[&str] = &["config", "limiter", "policy", "redact", "wire"];

/// The clock is held to the same rule but for time itself: it reads the wall clock and waits on
/// tokio's timer (its manual clock wakes waiters with a tokio `Notify`), so it may name `tokio`.
const CLOCK: &str = "clock";
const CLOCK_MAY_NAME: &[&str] = &["tokio"];

/// What pure modules must not name.
const IMPURE: &[&str] = &[
    "tokio",
    "tonic",
    "axum",
    "hyper",
    "notify",
    "redis",
    "reqwest",
    "std::fs",
    "std::net",
    "std::thread",
];

/// Wall-clock reads: the modules that decide take a `Clock` or a time instead.
const CLOCK_READS: &[&str] = &["Instant::now", "SystemTime::now"];

/// Modules that must not read the wall clock themselves (`clock` is the one reader). The
/// transport (`net`, `service`) and the Redis connections still read it for timeouts and latency.
const CLOCK_FREE: &[&str] = &["config", "limiter", "policy", "engine", "redact", "wire"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/store/redis/mod.rs` → `store`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The code of a line, without a trailing `//` comment; whole comment lines are skipped.
fn code(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return None;
    }
    Some(line.split(" // ").next().unwrap_or(line))
}

/// Every `crate::name` a line of code mentions.
fn crate_paths(code: &str) -> Vec<&str> {
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // Not the tail of another identifier (`ratelimit_crate::`) or a `$crate::` in a macro.
            !code[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
        })
        .map(|(at, m)| {
            let rest = &code[at + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// Whether `code` names `what` as a path (`tokio::`, `use tokio;`, `std::fs::read`).
fn names(code: &str, what: &str) -> bool {
    code.match_indices(what).any(|(at, _)| {
        let before_ok = !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        let after = &code[at + what.len()..];
        before_ok && (after.starts_with("::") || after.starts_with(';') || after.starts_with(','))
    })
}

fn violations() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        if module == "main" || module == "lib" {
            continue;
        }
        let Some(layer) = layer_of(&module) else {
            found.push(format!(
                "{}: module `{module}` has no layer in tests/architecture.rs (and docs/architecture.md)",
                file.display()
            ));
            continue;
        };
        let text = fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let Some(code) = code(line) else { continue };
            let at = format!("{}:{}", file.display(), n + 1);
            for used in crate_paths(code) {
                if used == module {
                    continue;
                }
                match layer_of(used) {
                    Some(l) if l < layer => {}
                    Some(_) => found.push(format!(
                        "{at}: `{module}` names `crate::{used}`, which is not below it: {}",
                        line.trim()
                    )),
                    None => {}
                }
            }
            if PURE.contains(&module.as_str()) || module == CLOCK {
                for what in IMPURE {
                    if module == CLOCK && CLOCK_MAY_NAME.contains(what) {
                        continue;
                    }
                    if names(code, what) {
                        found.push(format!(
                            "{at}: pure module `{module}` names `{what}`: {}",
                            line.trim()
                        ));
                    }
                }
            }
            if CLOCK_FREE.contains(&module.as_str()) {
                for read in CLOCK_READS {
                    if code.contains(read) && !file.ends_with("tests.rs") {
                        found.push(format!(
                            "{at}: `{module}` reads the wall clock (`{read}`) instead of taking a `Clock` or a time: {}",
                            line.trim()
                        ));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn modules_name_only_lower_layers_and_pure_modules_stay_pure() {
    let found = violations();
    assert!(
        found.is_empty(),
        "the dependency rule (docs/architecture.md) is broken:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_what_it_checks() {
    assert_eq!(
        crate_paths("use crate::store::{AnyStore, Store}; let x = crate::clock::now;"),
        ["store", "clock"]
    );
    assert!(crate_paths("$crate::foo::bar and other_crate::x").is_empty());
    assert!(names("use tokio::sync::watch;", "tokio"));
    assert!(names("    std::fs::read(path)", "std::fs"));
    assert!(!names("let my_tokio::x = 1;", "tokio"));
    assert_eq!(code("    // crate::app is mentioned in prose"), None);
    assert_eq!(
        module_of(Path::new("src"), Path::new("src/store/redis/mod.rs")),
        "store"
    );
    assert_eq!(
        module_of(Path::new("src"), Path::new("src/clock.rs")),
        "clock"
    );
}
