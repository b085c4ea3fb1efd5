//! Tests of the rules directory walker (tempfile trees, ConfigMap-style symlinks) and of the bad
//! fixtures under `tests/fixtures/bad` against their `EXPECTED.txt`.

use std::fs;
use std::path::{Path, PathBuf};

use super::*;

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir");
    }
    fs::write(path, text).expect("write");
}

fn names(files: &[(PathBuf, Vec<u8>)]) -> Vec<PathBuf> {
    files.iter().map(|(p, _)| p.clone()).collect()
}

#[test]
fn walks_nested_dirs_sorted_skipping_dotfiles_and_other_extensions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(&dir.join("b.yaml"), "domain: b\n");
    write(&dir.join("a.yml"), "domain: a\n");
    write(&dir.join("sub/deeper/c.yaml"), "domain: c\n");
    write(&dir.join("sub/readme.md"), "not rules");
    write(&dir.join("d.json"), "{}");
    write(&dir.join("e.yaml.bak"), "domain: e\n");
    write(&dir.join(".hidden.yaml"), "domain: hidden\n");
    write(&dir.join(".git/x.yaml"), "domain: x\n");
    fs::create_dir_all(dir.join("empty")).expect("mkdir");

    let read = read_rules_dir(dir, SizeCaps::default()).expect("read");
    let files = &read.files;
    assert_eq!(
        names(files),
        [
            dir.join("a.yml"),
            dir.join("b.yaml"),
            dir.join("sub/deeper/c.yaml"),
        ]
    );
    assert_eq!(files[2].1, b"domain: c\n");
    // The other files are named, not read (envoyproxy/ratelimit would read them).
    assert_eq!(
        read.not_read,
        [
            dir.join("d.json"),
            dir.join("e.yaml.bak"),
            dir.join("sub/readme.md"),
        ]
    );
    assert_eq!(
        read.warnings(dir),
        [format!(
            "3 file(s) in {} not read, as only *.yaml and *.yml files are rules files here \
             (envoyproxy/ratelimit reads every file): d.json, e.yaml.bak, sub/readme.md; rename a \
             rules file to end in .yaml",
            dir.display()
        )]
    );
}

#[test]
fn a_directory_of_files_none_of_them_rules_says_both_and_names_at_most_ten() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    for i in 0..12 {
        write(&dir.join(format!("rules{i:02}.conf")), "domain: a\n");
    }
    let read = read_rules_dir(dir, SizeCaps::default()).expect("read");
    assert!(read.files.is_empty());
    let warnings = read.warnings(dir);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert_eq!(
        warnings[0],
        format!(
            "no rules files in {}: every request is allowed",
            dir.display()
        )
    );
    assert!(
        warnings[1].starts_with(&format!("12 file(s) in {} not read", dir.display()))
            && warnings[1].contains(": rules00.conf, rules01.conf,")
            && warnings[1].contains(", rules09.conf, and 2 more;")
            && !warnings[1].contains("rules10.conf"),
        "{}",
        warnings[1]
    );
}

#[cfg(unix)]
#[test]
fn configmap_layout_is_loaded_once_under_the_top_level_name() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(&dir.join("..2026_01/a.yaml"), "domain: a\n");
    write(&dir.join("..2026_01/b.yml"), "domain: b\n");
    symlink("..2026_01", dir.join("..data")).expect("symlink");
    symlink("..data/a.yaml", dir.join("a.yaml")).expect("symlink");
    symlink("..data/b.yml", dir.join("b.yml")).expect("symlink");

    let read = read_rules_dir(dir, SizeCaps::default()).expect("read");
    assert_eq!(names(&read.files), [dir.join("a.yaml"), dir.join("b.yml")]);
    assert_eq!(read.not_read, Vec::<PathBuf>::new(), "the dot entries");
    let configs = load_rules_dir(dir, SizeCaps::default()).expect("load");
    let domains: Vec<_> = configs.iter().map(|c| c.domain.as_str()).collect();
    assert_eq!(domains, ["a", "b"]);
    assert_eq!(configs[0].source, dir.join("a.yaml"));
}

#[cfg(unix)]
#[test]
fn symlinked_dirs_are_followed_and_loops_walked_once() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().expect("tempdir");
    let outside = tmp.path().join("outside");
    let dir = tmp.path().join("rules");
    write(&outside.join("o.yaml"), "domain: o\n");
    write(&dir.join("sub/r.yaml"), "domain: r\n");
    symlink(&outside, dir.join("linked")).expect("symlink");
    symlink("..", dir.join("sub/loop")).expect("symlink");

    let files = read_rules_dir(&dir, SizeCaps::default())
        .expect("read")
        .files;
    assert_eq!(
        names(&files),
        [dir.join("linked/o.yaml"), dir.join("sub/r.yaml")]
    );
}

#[test]
fn missing_dir_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("nope");
    let err = read_rules_dir(&missing, SizeCaps::default()).expect_err("missing dir");
    assert!(matches!(err, RulesDirError::ReadDir { .. }), "{err:?}");
    assert_eq!(err.path(), missing);
    assert!(err.to_string().starts_with(&format!(
        "{}: cannot read rules directory",
        missing.display()
    )));

    let Err(ConfigErrors(errors)) = load_rules_dir(&missing, SizeCaps::default()) else {
        panic!("loaded a missing dir")
    };
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, missing);
    assert_eq!(errors[0].location, None);
    assert!(
        errors[0]
            .message
            .starts_with("cannot read rules directory: ")
    );
}

#[test]
fn a_file_is_not_a_rules_dir() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("a.yaml");
    write(&file, "domain: a\n");
    let err = read_rules_dir(&file, SizeCaps::default()).expect_err("file");
    assert!(
        matches!(err, RulesDirError::NotADirectory { .. }),
        "{err:?}"
    );
}

#[test]
fn a_file_that_is_not_utf8_is_an_error_at_its_first_invalid_byte() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write(&tmp.path().join("a.yaml"), "domain: a\n");
    let bad = tmp.path().join("bad.yaml");
    fs::write(&bad, b"domain: bad\n# \xc3\xa9\xff\n").expect("write");
    let Err(ConfigErrors(errors)) = load_rules_dir(tmp.path(), SizeCaps::default()) else {
        panic!("loaded a binary file")
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0].to_string(),
        format!(
            "{}:2:4: not valid UTF-8 (byte 0xFF): a rules file must be UTF-8 text",
            bad.display()
        )
    );
}

#[test]
fn a_file_over_the_size_cap_is_refused_before_it_is_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let text = |domain: &str| format!("domain: {domain}\ndescriptors: []\n");
    write(&tmp.path().join("a.yaml"), &text("a"));
    write(&tmp.path().join("b.yaml"), &text("b"));
    let text = text("a");
    let size = text.len() as u64;
    let fits = SizeCaps {
        max_file_bytes: size,
        max_total_bytes: 2 * size,
    };
    assert_eq!(
        load_rules_dir(tmp.path(), fits).expect("at the caps").len(),
        2
    );

    let small = SizeCaps {
        max_file_bytes: size - 1,
        ..fits
    };
    let Err(ConfigErrors(errors)) = load_rules_dir(tmp.path(), small) else {
        panic!("loaded a file over the cap")
    };
    assert_eq!(
        errors[0].to_string(),
        format!(
            "{}: the file is {size} bytes, over the {}-byte cap per rules file \
             (MAX_FILE_BYTES, --max-file-bytes)",
            tmp.path().join("a.yaml").display(),
            size - 1
        )
    );

    let total = SizeCaps {
        max_total_bytes: 2 * size - 1,
        ..fits
    };
    let err = read_rules_dir(tmp.path(), total).expect_err("over the total");
    assert!(
        matches!(err, RulesDirError::TotalTooLarge { .. }),
        "{err:?}"
    );
    assert_eq!(err.path(), tmp.path().join("b.yaml"));
    assert!(err.to_string().contains("MAX_TOTAL_BYTES"), "{err}");
}

#[test]
fn an_empty_directory_loads_no_rules() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert_eq!(load_rules_dir(tmp.path(), SizeCaps::default()), Ok(vec![]));
    let read = read_rules_dir(tmp.path(), SizeCaps::default()).expect("read");
    assert_eq!(
        read.warnings(tmp.path()),
        [format!(
            "no rules files in {}: every request is allowed",
            tmp.path().display()
        )]
    );
}

#[cfg(unix)]
#[test]
fn dangling_symlinks_fail_only_when_named_like_rules() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    symlink("nowhere", dir.join("gone.txt")).expect("symlink");
    assert_eq!(
        read_rules_dir(dir, SizeCaps::default()).expect("read"),
        RulesDir::default()
    );
    symlink("nowhere", dir.join("gone.yaml")).expect("symlink");
    let err = read_rules_dir(dir, SizeCaps::default()).expect_err("dangling rules file");
    assert_eq!(err.path(), dir.join("gone.yaml"));
}

#[test]
fn nesting_is_capped() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let deep: PathBuf = (0..=MAX_DEPTH + 1).map(|i| format!("d{i}")).collect();
    write(&tmp.path().join(&deep).join("a.yaml"), "domain: a\n");
    let err = read_rules_dir(tmp.path(), SizeCaps::default()).expect_err("too deep");
    assert!(matches!(err, RulesDirError::TooDeep { .. }), "{err:?}");
}

#[test]
fn load_reports_parse_errors_with_the_joined_path() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write(&tmp.path().join("x/a.yaml"), "domain: a\nfoo: 1\n");
    let Err(errors) = load_rules_dir(tmp.path(), SizeCaps::default()) else {
        panic!("bad file loaded")
    };
    let path = tmp.path().join("x/a.yaml");
    assert_eq!(
        errors.to_string(),
        format!(
            "{}:2:1: unknown field 'foo' at the top level (expected one of: domain, descriptors)",
            path.display()
        )
    );
}

/// `tests/fixtures/bad/EXPECTED.txt` lists, for each bad fixture, the one error that checking the
/// whole directory reports (`<file>:<line>:<col>\t<substring>`); keep the two in step.
#[test]
fn bad_fixtures_match_expected_txt() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bad");
    let expected = fs::read_to_string(dir.join("EXPECTED.txt")).expect("EXPECTED.txt");
    let Err(ConfigErrors(errors)) = load_rules_dir(&dir, SizeCaps::default()) else {
        panic!("bad fixtures loaded")
    };
    let actual: Vec<String> = errors
        .iter()
        .map(|e| {
            let shown = e.to_string();
            let prefix = format!("{}", dir.display());
            shown
                .strip_prefix(&prefix)
                .map(|s| s.trim_start_matches('/').to_string())
                .unwrap_or(shown)
        })
        .collect();
    let lines: Vec<&str> = expected.lines().collect();
    assert_eq!(actual.len(), lines.len(), "{actual:#?}");
    for (got, line) in actual.iter().zip(&lines) {
        let (position, substring) = line.split_once('\t').expect("a tab");
        assert!(
            got.starts_with(&format!("{position}: ")) && got.contains(substring),
            "got {got:?}\nwant {line:?}"
        );
    }
    let fixtures = read_rules_dir(&dir, SizeCaps::default())
        .expect("read")
        .files
        .len();
    assert_eq!(
        fixtures,
        lines.len() + 1,
        "every fixture but duplicate_domain_a errs"
    );
}

#[test]
fn only_an_unreadable_lost_and_found_is_skipped() {
    let denied = |dir: &Path| RulesDirError::ReadDir {
        path: dir.to_path_buf(),
        source: io::Error::from(io::ErrorKind::PermissionDenied),
    };
    let lost = Path::new("/rules/lost+found");
    assert!(fsck_leftovers(lost, &denied(lost)));
    // Another directory that cannot be read may hold rules: still an error.
    let other = Path::new("/rules/team-a");
    assert!(!fsck_leftovers(other, &denied(other)));
    // Not for want of permission, or deeper down: an error.
    let gone = RulesDirError::ReadDir {
        path: lost.to_path_buf(),
        source: io::Error::from(io::ErrorKind::NotFound),
    };
    assert!(!fsck_leftovers(lost, &gone));
    let inner = Path::new("/rules/lost+found/x");
    assert!(!fsck_leftovers(lost, &denied(inner)));
}
