//! The fuzz targets' checks (examples/fuzz) over every input of the seed corpus, which holds the
//! inputs of every crash found so far (`regression-*`): a fixed crash stays fixed under
//! `cargo test`, without the time-budgeted run.

use crate::{admin, record, requests, rules};
use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no seeds", dir.display());
    files
}

fn replay(target: &str, mut check: impl FnMut(&[u8]) -> Result<(), String>) {
    for (path, bytes) in corpus(target) {
        if let Err(why) = check(&bytes) {
            panic!("{}: {why}", path.display());
        }
    }
}

#[test]
fn the_rules_corpus_passes() {
    let regressions = corpus("rules")
        .iter()
        .filter(|(p, _)| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("regression-")
        })
        .count();
    assert!(regressions >= 2, "the rules crashes are in the corpus");
    replay("rules", rules::check);
}

#[test]
fn the_requests_corpus_passes() {
    let mut target = requests::Requests::new();
    replay("requests", |b| target.check(b));
}

#[test]
fn the_json_corpus_passes() {
    let target = admin::AdminTarget::new();
    replay("json", |b| target.check_json(b));
}

#[test]
fn the_explain_corpus_passes() {
    let target = admin::AdminTarget::new();
    replay("explain", |b| target.check_explain(b));
}

#[test]
fn the_record_corpus_passes() {
    replay("record", record::check);
}
