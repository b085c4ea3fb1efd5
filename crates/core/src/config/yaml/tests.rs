//! Tests of the marked YAML tree: positions, scalar kinds, and the YAML-level errors.

use super::*;

fn loc(line: usize, column: usize) -> Location {
    Location { line, column }
}

fn root(text: &str) -> Node {
    let doc = parse(text);
    assert_eq!(doc.errors, vec![], "unexpected errors for {text:?}");
    doc.root.expect("a root node")
}

fn single_error(text: &str) -> YamlError {
    let doc = parse(text);
    assert_eq!(doc.errors.len(), 1, "{:?}", doc.errors);
    doc.errors[0].clone()
}

fn map(node: &Node) -> &[(Node, Node)] {
    match &node.kind {
        NodeKind::Map(e) => e,
        other => panic!("not a map: {other:?}"),
    }
}

#[test]
fn block_mappings_and_sequences_carry_1_based_positions() {
    let r = root("domain: a\ndescriptors:\n  - key: k\n    value: 'x'\n");
    assert_eq!(r.location, loc(1, 1));
    let top = map(&r);
    assert_eq!(top[0].0.location, loc(1, 1));
    assert_eq!(top[0].1.location, loc(1, 9));
    let NodeKind::Seq(items) = &top[1].1.kind else {
        panic!("not a seq")
    };
    assert_eq!(top[1].1.location, loc(3, 3));
    assert_eq!(
        items[0].location,
        loc(3, 5),
        "a block mapping starts at its first key"
    );
    let entry = map(&items[0]);
    assert_eq!(entry[1].0.location, loc(4, 5));
    assert_eq!(
        entry[1].1.kind,
        NodeKind::Scalar("x".into(), ScalarKind::Str)
    );
}

#[test]
fn flow_collections_start_at_their_bracket() {
    let r = root("a: [1, {b: c}]\n");
    let NodeKind::Seq(items) = &map(&r)[0].1.kind else {
        panic!("not a seq")
    };
    assert_eq!(map(&r)[0].1.location, loc(1, 4));
    assert_eq!(items[1].location, loc(1, 8));
}

#[test]
fn scalar_kinds_follow_style_and_tags() {
    let cases = [
        ("1", ScalarKind::Int),
        ("-12", ScalarKind::Int),
        ("0x1F", ScalarKind::Int),
        ("'1'", ScalarKind::Str),
        ("\"1\"", ScalarKind::Str),
        ("!!str 1", ScalarKind::Str),
        ("1.5", ScalarKind::Float),
        ("1e3", ScalarKind::Float),
        (".inf", ScalarKind::Float),
        ("!!float 1", ScalarKind::Float),
        ("true", ScalarKind::Bool(true)),
        ("False", ScalarKind::Bool(false)),
        ("'true'", ScalarKind::Str),
        ("yes", ScalarKind::Str),
        ("~", ScalarKind::Null),
        ("null", ScalarKind::Null),
        ("", ScalarKind::Null),
        ("foo*", ScalarKind::Str),
        ("1.2.3", ScalarKind::Str),
        ("|\n  text", ScalarKind::Str),
    ];
    for (text, kind) in cases {
        let r = root(&format!("a: {text}\n"));
        let NodeKind::Scalar(_, k) = &map(&r)[0].1.kind else {
            panic!("not a scalar: {text}")
        };
        assert_eq!(*k, kind, "{text}");
    }
}

#[test]
fn empty_value_points_at_its_key() {
    let r = root("a: 1\nb:\nc: 2\n");
    assert_eq!(map(&r)[1].1.location, loc(2, 1));
}

#[test]
fn duplicate_key_names_both_lines_and_keeps_the_first() {
    let doc = parse("a: 1\nb: 2\na: 3\n");
    assert_eq!(doc.errors.len(), 1);
    assert_eq!(doc.errors[0].location, loc(3, 1));
    assert!(doc.errors[0].message.contains("duplicate key 'a'"));
    assert!(doc.errors[0].message.contains("line 1"));
    assert!(doc.errors[0].message.contains("line 3"));
    let r = doc.root.expect("root");
    assert_eq!(map(&r).len(), 2);
    assert_eq!(
        map(&r)[0].1.kind,
        NodeKind::Scalar("1".into(), ScalarKind::Int)
    );
}

#[test]
fn syntax_error_has_its_position() {
    let e = single_error("a: b\n  c: d\n");
    assert_eq!(e.location, loc(2, 4));
    assert!(
        e.message.starts_with("YAML syntax error: "),
        "{}",
        e.message
    );
    assert!(parse("a: b\n  c: d\n").root.is_none());
}

#[test]
fn second_document_is_rejected() {
    let e = single_error("- a\n---\n- b\n");
    assert_eq!(e.location, loc(2, 1));
    assert!(e.message.contains("exactly one YAML document"));
}

#[test]
fn anchors_and_aliases_are_rejected() {
    let doc = parse("a: &x 1\nb: *x\n");
    assert!(doc.root.is_none());
    let messages: Vec<_> = doc
        .errors
        .iter()
        .map(|e| (e.location.clone(), e.message.as_str()))
        .collect();
    assert_eq!(
        messages,
        [
            (
                loc(1, 7),
                "YAML anchors (&name) are not supported in rules files"
            ),
            (
                loc(2, 4),
                "YAML aliases (*name) are not supported in rules files"
            ),
        ]
    );
    // An anchored block mapping is reported where the mapping starts.
    let e = single_error("- &m\n  a: 1\n");
    assert_eq!(e.location, loc(2, 3));
    assert!(e.message.contains("anchors"));
    // An alias to no anchor is a syntax error.
    let e = single_error("a: 1\nb: *x\n");
    assert!(e.message.contains("YAML syntax error"), "{}", e.message);
}

#[test]
fn unsupported_tags_are_rejected() {
    let e = single_error("a: !custom 1\n");
    assert!(e.message.contains("unsupported YAML tag '!custom'"));
    let e = single_error("a: !!int abc\n");
    assert!(e.message.contains("not a valid !!int"));
}

#[test]
fn complex_keys_are_rejected() {
    let e = single_error("? [a]\n: b\n");
    assert_eq!(e.location, loc(1, 3));
    assert!(e.message.contains("mapping key"));
}

#[test]
fn nesting_is_capped() {
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    let e = single_error(&deep);
    assert_eq!(e.location, loc(1, MAX_DEPTH + 1));
    assert!(e.message.contains(&format!("deeper than {MAX_DEPTH}")));
    // Exactly MAX_DEPTH levels are fine.
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse(&ok).errors.is_empty());
    // Very deep input neither overflows the stack nor is read to the end.
    let huge = "[".repeat(200_000);
    assert!(!parse(&huge).errors.is_empty());
    let block: String = (0..200).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
    assert!(single_error(&block).message.contains("deeper than"));
}

#[test]
fn empty_and_comment_only_streams_have_no_root() {
    for text in ["", "# only a comment\n", "\n\n"] {
        let doc = parse(text);
        assert!(doc.root.is_none() && doc.errors.is_empty(), "{text:?}");
    }
}

mod fuzz {
    use super::super::parse;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn never_panics(text in "[a-z0-9:\\-\\[\\]{}, \n\t'\"&*!?|>#~.]{0,64}") {
            let _ = parse(&text);
        }
    }
}

/// A syntax error at the end of a file without a final newline is on its last line (the fuzz
/// corpus keeps the input: fuzz/corpus/rules/regression-crash-46acc…).
#[test]
fn an_error_at_the_end_of_a_file_without_a_newline_is_on_its_last_line() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minute\n      requests_per_unit";
    let e = single_error(text);
    assert_eq!(e.location, loc(6, 24), "{e:?}");
    let e = single_error("domain: d\nkey");
    assert_eq!(e.location.line, 2, "{e:?}");
}

/// YAML breaks lines at a lone carriage return, which an editor shows inside the line: lines are
/// counted at `\n` only (fuzz/corpus/rules/regression-crash-b6e29…).
#[test]
fn a_lone_carriage_return_does_not_shift_the_lines_after_it() {
    let r = root("domain: a\nname: 'x\r  y'\ndescriptors:\n  - key: k\n");
    let entries = map(&r);
    assert_eq!(entries[2].0.location, loc(3, 1));
    let e = single_error("a: 'x\r  y'\nb: c: d\n");
    assert_eq!(e.location.line, 2, "{e:?}");
}

#[test]
fn columns_count_characters_after_multibyte_text() {
    let r = root("domain: é\nkey: 'ü'\n");
    assert_eq!(map(&r)[1].1.location, loc(2, 6));
}
