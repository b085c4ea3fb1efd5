//! One test per error class of the YAML, top and descriptor levels: the exact `file:line:col`
//! and the key words of the message.

use super::assert_error;

// ---- YAML level ----

#[test]
fn yaml_syntax_error() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: a\n   value: b\n",
        "4:9",
        &["YAML syntax error"],
    );
}

#[test]
fn duplicate_yaml_key() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: a\n    key: b\n",
        "4:5",
        &["duplicate key 'key'", "line 3", "line 4"],
    );
}

#[test]
fn second_yaml_document() {
    assert_error(
        "domain: a\n---\ndomain: b\n",
        "2:1",
        &["exactly one YAML document"],
    );
}

#[test]
fn yaml_anchor() {
    assert_error("domain: &d a\n", "1:12", &["anchors", "not supported"]);
}

#[test]
fn yaml_alias() {
    let text = "domain: a\ndescriptors:\n  - key: k\n    value: *v\n";
    assert_error(text, "4:12", &["YAML syntax error", "unknown anchor"]);
}

#[test]
fn nesting_too_deep() {
    let text = format!("domain: a\nx: {}{}\n", "[".repeat(80), "]".repeat(80));
    assert_error(&text, "2:75", &["deeper than 72 levels"]);
}

/// A rules file whose descriptors nest `depth` levels, the deepest with a limit.
pub(crate) fn nested_descriptors(depth: usize) -> String {
    let mut text = String::from("domain: a\ndescriptors:\n");
    for level in 1..=depth {
        let indent = " ".repeat(2 + 4 * (level - 1));
        text += &format!("{indent}- key: k{level}\n");
        if level < depth {
            text += &format!("{indent}  descriptors:\n");
        } else {
            text += &format!(
                "{indent}  rate_limits:\n{indent}    - {{unit: second, requests_per_unit: 5, \
                 replaces: [{{name: x}}]}}\n"
            );
        }
    }
    text
}

#[test]
fn descriptors_nest_32_levels_and_no_deeper() {
    let configs = crate::config::parse_files(&[("r.yaml".into(), nested_descriptors(32))])
        .expect("32 levels are accepted");
    let mut level = &configs[0].descriptors;
    for _ in 1..32 {
        level = &level[0].descriptors;
    }
    assert_eq!(level[0].key, "k32");
    assert!(level[0].rate_limit.is_some());
    // Level 33's list starts on line 2 + 2 * 32 + 1, indented 2 + 4 * 32.
    assert_error(
        &nested_descriptors(33),
        "67:131",
        &[
            "descriptors nested deeper than 32 levels",
            "at most 32 entries",
        ],
    );
}

// ---- top level ----

#[test]
fn empty_file() {
    assert_error("# nothing here\n", "1:1", &["file is empty", "'domain'"]);
}

#[test]
fn document_is_not_a_mapping() {
    assert_error(
        "- domain: a\n",
        "1:1",
        &["must be a mapping", "found a list"],
    );
    assert_error("hello\n", "1:1", &["must be a mapping", "found a string"]);
}

#[test]
fn missing_domain() {
    assert_error(
        "descriptors: []\n",
        "1:1",
        &["missing required field 'domain'"],
    );
}

#[test]
fn empty_domain() {
    assert_error("domain: \"\"\n", "1:9", &["'domain' must not be empty"]);
}

#[test]
fn domain_not_a_string() {
    assert_error(
        "domain: [a]\n",
        "1:9",
        &["'domain' must be a string", "found a list"],
    );
    assert_error(
        "domain: 5\n",
        "1:9",
        &["'domain' must be a string", "quote it"],
    );
}

#[test]
fn non_string_field_name() {
    assert_error(
        "domain: a\n5: x\n",
        "2:1",
        &["field names must be strings", "'5'"],
    );
}

#[test]
fn unknown_top_level_field() {
    assert_error(
        "domain: a\ndescriptor: []\n",
        "2:1",
        &["unknown field 'descriptor' at the top level (expected one of: domain, descriptors)"],
    );
}

#[test]
fn rate_limit_field_at_top_level() {
    assert_error(
        "domain: a\nrequests_per_unit: 5\n",
        "2:1",
        &["'requests_per_unit' belongs under rate_limit, not at the top level"],
    );
}

#[test]
fn descriptor_field_at_top_level() {
    assert_error(
        "domain: a\nkey: k\n",
        "2:1",
        &["'key' belongs on a descriptor", "top level"],
    );
}

// ---- descriptors ----

#[test]
fn descriptors_not_a_list() {
    assert_error(
        "domain: a\ndescriptors:\n  key: a\n",
        "3:3",
        &["'descriptors' must be a list", "found a mapping"],
    );
}

#[test]
fn descriptor_not_a_mapping() {
    assert_error(
        "domain: a\ndescriptors:\n  - a\n",
        "3:5",
        &[
            "each entry of 'descriptors' must be a mapping",
            "found a string",
        ],
    );
}

#[test]
fn missing_key() {
    assert_error(
        "domain: a\ndescriptors:\n  - value: v\n",
        "3:5",
        &["missing required field 'key'"],
    );
}

#[test]
fn empty_key() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: ''\n",
        "3:10",
        &["'key' must not be empty"],
    );
}

#[test]
fn value_not_a_string() {
    let d = "domain: a\ndescriptors:\n  - key: k\n    value: ";
    assert_error(
        &format!("{d}1.5\n"),
        "4:12",
        &["'value' must be a string", "float"],
    );
    assert_error(
        &format!("{d}\n"),
        "4:5",
        &["'value' must be a string", "null"],
    );
    assert_error(
        &format!("{d}{{a: b}}\n"),
        "4:12",
        &["'value' must be a string", "mapping"],
    );
}

#[test]
fn empty_value() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    value: ''\n",
        "4:12",
        &["'value' must not be empty", "omit 'value'"],
    );
}

#[test]
fn unknown_descriptor_field() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    shadow: true\n",
        "4:5",
        &[
            "unknown field 'shadow' on a descriptor (expected one of: key, value, rate_limit, \
             rate_limits, shadow_mode, quota_mode, detailed_metric, value_to_metric, \
             share_threshold, metadata, descriptors, concurrency)",
        ],
    );
}

#[test]
fn rate_limit_field_on_a_descriptor() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    unit: second\n",
        "4:5",
        &["'unit' belongs under rate_limit, not on a descriptor"],
    );
}

#[test]
fn domain_on_a_descriptor() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    domain: b\n",
        "4:5",
        &["'domain' belongs at the top level of the file, not on a descriptor"],
    );
}

#[test]
fn share_threshold_needs_a_wildcard_value() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
        "5:5",
        &[
            "share_threshold can only be used with wildcard values (containing '*')",
            "'k'",
        ],
    );
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    share_threshold: true\n",
        "4:5",
        &["share_threshold can only be used with wildcard values"],
    );
}

#[test]
fn metadata_must_be_a_mapping_and_flags_booleans() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    metadata: [1, 2]\n",
        "4:15",
        &["'metadata' must be a mapping"],
    );
    for field in ["quota_mode", "value_to_metric", "share_threshold"] {
        assert_error(
            &format!("domain: a\ndescriptors:\n  - key: k\n    value: \"v*\"\n    {field}: 3\n"),
            &format!("5:{}", field.len() + 7),
            &[&format!("'{field}' must be a boolean")],
        );
    }
}

#[test]
fn bool_field_given_a_quoted_string() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    shadow_mode: \"true\"\n",
        "4:18",
        &["'shadow_mode' must be a boolean", "found a string"],
    );
}

#[test]
fn duplicate_key_and_value() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
        "5:5",
        &[
            "duplicate descriptor with key 'k' and value 'v'",
            "line 3",
            "line 5",
        ],
    );
}

#[test]
fn duplicate_value_less_key() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n  - key: k\n    value: v\n  - key: k\n",
        "6:5",
        &[
            "duplicate descriptor with key 'k' and no value",
            "line 3",
            "line 6",
        ],
    );
}

#[test]
fn same_key_at_different_levels_is_fine() {
    assert_eq!(
        super::errors_of("domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - key: k\n"),
        Vec::<String>::new()
    );
}

#[test]
fn rate_limit_and_rate_limits_together() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: day, requests_per_unit: 9}]\n",
        "5:5",
        &["'rate_limit' and 'rate_limits' cannot both be given"],
    );
}

#[test]
fn empty_rate_limits() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limits: []\n",
        "4:18",
        &["'rate_limits' must not be empty"],
    );
}

#[test]
fn unlimited_in_rate_limits() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      - unlimited: true\n",
        "5:9",
        &["'unlimited' is not allowed under rate_limits"],
    );
}
