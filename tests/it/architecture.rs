//! What the compiler cannot check of `docs/architecture.md`'s rules, checked on the source text.
//! The crates are the layers and their manifests point the dependencies down (the compiler holds
//! that); inside a crate, modules are layered too (a module names only modules of lower layers,
//! `crate::…`, grouped imports `use crate::{a, b}` included), the pure modules name no runtime,
//! network, file system or thread, and the modules that decide never read the wall clock. A failure
//! names the file, the line and the offending text.

use std::fs;
use std::path::{Path, PathBuf};

/// Per crate (its directory under `crates/`), its modules' layers, lowest first. A module may name
/// modules of lower layers only (not its own layer's others). Names a crate imports from the
/// crates below it (`use ratelimit_core::{clock, …}` at its root) are below every layer.
const CRATES: &[(&str, &[&[&str]])] = &[
    (
        "core",
        &[
            &["clock", "testing", "redact"],
            &["calendar"],
            &["config", "wire"],
            &["limiter", "lease"],
            &["policy", "rules_dir"],
            &["store", "quota", "overrides"],
            &["metrics"],
            &["engine"],
        ],
    ),
    (
        "remote",
        &[
            &["breaker", "every", "mode", "names", "speaks"],
            &["metrics", "outage"],
            &["remote"],
            &["over_limit_cache", "shards"],
            &["guarded"],
        ],
    ),
    (
        "redis",
        &[
            &["refusal"],
            &[
                "slot",
                "key",
                "queue",
                "batch",
                "pack",
                "io",
                "retry",
                "conn",
                "conditional",
                "test_redis",
            ],
            &[
                "cas", "seen", "pending", "settings", "masters", "greeting", "speaks",
            ],
            &["dispatch"],
            &["calls"],
            &["writer", "demand", "lease", "mode", "version", "eviction"],
            &["attempts", "spread"],
            &["backend"],
            &["connect", "admin"],
        ],
    ),
    (
        "replay",
        &[
            &["chart", "envoy_log", "tally"],
            &["input", "report", "plot"],
        ],
    ),
    (
        "app",
        &[
            &["trace_context"],
            &["status", "health", "telemetry", "statsd"],
            &["record"],
            &["front"],
            &["service", "http", "reload", "rlqs"],
            &["net"],
            &["xds"],
            &["settings", "reference_env"],
            &["server", "logging"],
        ],
    ),
];

/// Pure (crate, module): no runtime, I/O or threads (the clock module is the one reader of wall
/// time).
const PURE: &[(&str, &str)] = &[
    ("core", "calendar"),
    ("core", "config"),
    ("core", "limiter"),
    ("core", "lease"),
    ("core", "policy"),
    ("core", "quota"),
    ("core", "overrides"),
    ("core", "redact"),
    ("core", "wire"),
    ("remote", "breaker"),
    ("remote", "outage"),
    ("remote", "over_limit_cache"),
    ("remote", "shards"),
    ("redis", "batch"),
    ("redis", "queue"),
    ("redis", "pack"),
    ("redis", "slot"),
    ("redis", "key"),
    ("replay", "tally"),
];

/// The clock is held to the same rule but for time itself: it reads the wall clock and waits on
/// tokio's timer (its manual clock wakes waiters with a tokio `Notify`), so it may name `tokio`.
const CLOCK: (&str, &str) = ("core", "clock");
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
/// transport and the Redis connections still read it (through `clock::monotonic`) for timeouts.
const CLOCK_FREE: &[(&str, &str)] = &[
    ("core", "calendar"),
    ("core", "config"),
    ("core", "limiter"),
    ("core", "policy"),
    ("core", "quota"),
    ("core", "overrides"),
    ("core", "engine"),
    ("core", "redact"),
    ("core", "wire"),
    ("remote", "breaker"),
    ("remote", "outage"),
    ("remote", "over_limit_cache"),
    ("remote", "shards"),
    ("redis", "batch"),
    ("redis", "queue"),
    ("redis", "pack"),
];

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

/// The top-level module a file of a crate's `src/` belongs to (`src/store/memory/mod.rs` →
/// `store`; `src/lib.rs` → `lib`).
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

fn layer_of(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|layer| layer.contains(&module))
}

/// The code of a line, without a trailing `//` comment; whole comment lines are skipped.
fn code(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return None;
    }
    Some(line.split(" // ").next().unwrap_or(line))
}

/// Every module of this crate a stretch of code names: `crate::name`, and each name of a grouped
/// import `use crate::{a, b::c, d}` (or `super::{…}` at a module's root).
fn crate_paths(code: &str) -> Vec<&str> {
    let ident_end = |rest: &str| {
        rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len())
    };
    let mut out = Vec::new();
    for (at, m) in code.match_indices("crate::") {
        // Not the tail of another identifier (`ratelimit_crate::`) or a `$crate::` in a macro.
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
        {
            continue;
        }
        let rest = &code[at + m.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                let item = item.trim();
                let name = &item[..ident_end(item)];
                if !name.is_empty() && name != "self" {
                    out.push(name);
                }
            }
        } else {
            out.push(&rest[..ident_end(rest)]);
        }
    }
    out
}

/// Whether `code` names `what` as a path (`tokio::`, `use tokio;`, `std::fs::read`).
fn names(code: &str, what: &str) -> bool {
    code.match_indices(what).any(|(at, _)| {
        let before_ok = !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        let after = &code[at + what.len()..];
        before_ok
            && (after.starts_with("::")
                || after.starts_with(';')
                || after.starts_with(',')
                || after.starts_with('}'))
    })
}

/// A file's text as statements: a `use` spread over several lines is joined into one, so a
/// grouped import is read whole. Each comes with the line it starts on.
fn statements(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let Some(code) = code(line) else { continue };
        if let Some((start, mut joined)) = open.take() {
            joined.push(' ');
            joined.push_str(code.trim());
            if code.contains(';') {
                out.push((start, joined));
            } else {
                open = Some((start, joined));
            }
            continue;
        }
        let trimmed = code.trim_start();
        let is_use = trimmed.starts_with("use ") || trimmed.starts_with("pub use ");
        if is_use && !code.contains(';') {
            open = Some((n + 1, code.to_owned()));
        } else {
            out.push((n + 1, code.to_owned()));
        }
    }
    out.extend(open);
    out
}

fn violations() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut found = Vec::new();
    for (krate, layers) in CRATES {
        let src = root.join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        for file in &files {
            let module = module_of(&src, file);
            // The crate root, and a crate-wide test module, may name any module of their crate.
            if module == "lib" || module == "tests" {
                continue;
            }
            let Some(layer) = layer_of(layers, &module) else {
                found.push(format!(
                    "{}: module `{module}` of crate `{krate}` has no layer in tests/it/architecture.rs (and docs/architecture.md)",
                    file.display()
                ));
                continue;
            };
            let here = (*krate, module.as_str());
            let text = fs::read_to_string(file).unwrap();
            for (n, statement) in statements(&text) {
                let at = format!("{}:{n}", file.display());
                for used in crate_paths(&statement) {
                    if used == module {
                        continue;
                    }
                    match layer_of(layers, used) {
                        Some(l) if l < layer => {}
                        Some(_) => found.push(format!(
                            "{at}: `{module}` names `crate::{used}`, which is not below it: {}",
                            statement.trim()
                        )),
                        None => {}
                    }
                }
                if PURE.contains(&here) || here == CLOCK {
                    for what in IMPURE {
                        if here == CLOCK && CLOCK_MAY_NAME.contains(what) {
                            continue;
                        }
                        if names(&statement, what) {
                            found.push(format!(
                                "{at}: pure module `{module}` names `{what}`: {}",
                                statement.trim()
                            ));
                        }
                    }
                }
                if CLOCK_FREE.contains(&here) && !file.ends_with("tests.rs") {
                    for read in CLOCK_READS {
                        if statement.contains(read) {
                            found.push(format!(
                                "{at}: `{module}` reads the wall clock (`{read}`) instead of taking a `Clock` or a time: {}",
                                statement.trim()
                            ));
                        }
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
fn every_crate_under_crates_has_its_layers_here() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut dirs: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut known: Vec<&str> = CRATES.iter().map(|(k, _)| *k).collect();
    known.sort();
    assert_eq!(dirs, known);
}

#[test]
fn the_checker_sees_what_it_checks() {
    assert_eq!(
        crate_paths("use crate::store::{Backend, Store}; let x = crate::clock::now;"),
        ["store", "clock"]
    );
    assert_eq!(
        crate_paths("use crate::{engine::Engine, metrics, self};"),
        ["engine", "metrics"]
    );
    assert!(crate_paths("$crate::foo::bar and other_crate::x").is_empty());
    assert!(names("use tokio::sync::watch;", "tokio"));
    assert!(names("use std::{fs, net};", "fs") || names("    std::fs::read(path)", "std::fs"));
    assert!(!names("let my_tokio::x = 1;", "tokio"));
    assert_eq!(code("    // crate::app is mentioned in prose"), None);
    let joined = statements("use crate::{\n    config,\n    engine::Engine,\n};\nfn f() {}\n");
    assert_eq!(joined[0].0, 1);
    assert_eq!(crate_paths(&joined[0].1), ["config", "engine"]);
    assert_eq!(
        module_of(Path::new("src"), Path::new("src/store/memory/mod.rs")),
        "store"
    );
    assert_eq!(
        module_of(Path::new("src"), Path::new("src/clock.rs")),
        "clock"
    );
}
