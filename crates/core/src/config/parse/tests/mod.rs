//! Tests of rules-file parsing: a full valid file checked field by field, multi-error files,
//! duplicate domains across files, and hostile inputs. Error classes are in
//! `errors.rs` and `rate_limit_errors.rs`.

mod concurrency_errors;
mod errors;
mod rate_limit_errors;

use std::path::PathBuf;

use crate::config::{
    Algorithm, ConfigErrors, DescriptorConfig, Limit, Location, PolicyName, RateLimitSpec, Unit,
    parse_files,
};

/// Parses one file named `r.yaml`; the errors as displayed.
pub(super) fn errors_of(text: &str) -> Vec<String> {
    match parse_files(&[(PathBuf::from("r.yaml"), text.to_string())]) {
        Ok(_) => Vec::new(),
        Err(ConfigErrors(errors)) => errors.iter().map(ToString::to_string).collect(),
    }
}

/// Asserts that `text` has exactly one error, at `position` ("line:col"), containing every word.
pub(super) fn assert_error(text: &str, position: &str, words: &[&str]) {
    let errors = errors_of(text);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    let prefix = format!("r.yaml:{position}: ");
    assert!(
        errors[0].starts_with(&prefix),
        "{} (wanted {prefix})",
        errors[0]
    );
    for w in words {
        assert!(errors[0].contains(w), "{:?} lacks {w:?}", errors[0]);
    }
}

const FULL: &str = r#"# every feature once
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: Minute
      requests_per_unit: 100
      unit_multiplier: 5
      algorithm: fixed_window
      burst: 20
      name: per_key
    shadow_mode: true
    detailed_metric: true
    value_to_metric: true
    descriptors:
      - key: path
        value: "/v1/search*"
        rate_limits:
          - {unit: second, requests_per_unit: 5}
          - unit: day
            requests_per_unit: 0
            name: daily
            replaces: [{name: per_key}]
  - key: tier
    value: 42
    rate_limit:
      unlimited: true
      name: free_pass
      replaces:
        - name: per_key
        - name: daily
  - key: remote_address
"#;

fn limit(unit: Unit, requests_per_unit: u32) -> Limit {
    Limit {
        name: None,
        requests_per_unit,
        unit,
        unit_multiplier: 1,
        algorithm: None,
        burst: None,
        max_delay: None,
        calendar: None,
        replaces: vec![],
        policy: PolicyName::Derived,
    }
}

#[test]
fn full_example_is_parsed_field_by_field() {
    let configs = parse_files(&[(PathBuf::from("edge.yaml"), FULL.to_string())])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(configs.len(), 1);
    let c = &configs[0];
    assert_eq!(c.domain, "edge");
    assert_eq!(c.source, PathBuf::from("edge.yaml"));
    assert_eq!(c.descriptors.len(), 3);

    let api = &c.descriptors[0];
    assert_eq!(api.key, "api_key");
    assert_eq!(api.value, None);
    assert!(api.shadow_mode && api.detailed_metric);
    assert_eq!(api.location, Location { line: 4, column: 5 });
    let per_key = Limit {
        name: Some("per_key".into()),
        unit_multiplier: 5,
        algorithm: Some(Algorithm::FixedWindow),
        burst: Some(20),
        ..limit(Unit::Minute, 100)
    };
    assert_eq!(per_key.period_seconds(), 300);
    assert_eq!(api.rate_limit, Some(RateLimitSpec::Limited(vec![per_key])));

    let path = &api.descriptors[0];
    assert_eq!(
        path,
        &DescriptorConfig {
            key: "path".into(),
            value: Some("/v1/search*".into()),
            rate_limit: Some(RateLimitSpec::Limited(vec![
                limit(Unit::Second, 5),
                Limit {
                    name: Some("daily".into()),
                    replaces: vec!["per_key".into()],
                    ..limit(Unit::Day, 0)
                },
            ])),
            concurrency: None,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: false,
            metadata: None,
            descriptors: vec![],
            location: Location {
                line: 16,
                column: 9
            },
        }
    );

    let tier = &c.descriptors[1];
    assert_eq!(tier.value.as_deref(), Some("42"), "integer value as text");
    assert_eq!(
        tier.rate_limit,
        Some(RateLimitSpec::Unlimited {
            name: Some("free_pass".into()),
            replaces: vec!["per_key".into(), "daily".into()],
        })
    );
    assert!(tier.descriptors.is_empty());

    let whitelist = &c.descriptors[2];
    assert_eq!(whitelist.key, "remote_address");
    assert_eq!((&whitelist.value, &whitelist.rate_limit), (&None, &None));
    assert_eq!(
        whitelist.location,
        Location {
            line: 32,
            column: 5
        }
    );
}

#[test]
fn every_algorithm_and_max_delay_are_parsed() {
    let text = "\
domain: algos
descriptors:
  - key: s
    rate_limit: {unit: minute, requests_per_unit: 100, unit_multiplier: 5, algorithm: sliding_window}
  - key: l
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky_bucket, burst: 20, max_delay: 250ms}
  - key: d
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky_bucket}
";
    let configs = parse_files(&[(PathBuf::from("a.yaml"), text.to_string())])
        .unwrap_or_else(|e| panic!("{e}"));
    let limits: Vec<Limit> = configs[0]
        .descriptors
        .iter()
        .map(|d| match &d.rate_limit {
            Some(RateLimitSpec::Limited(l)) => l[0].clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(limits[0].algorithm, Some(Algorithm::SlidingWindow));
    assert_eq!(limits[0].period_seconds(), 300);
    assert_eq!(limits[1].algorithm, Some(Algorithm::LeakyBucket));
    assert_eq!(
        (limits[1].burst, limits[1].max_delay),
        (Some(20), Some(std::time::Duration::from_millis(250)))
    );
    assert_eq!(limits[2].max_delay, None, "the server default applies");
}

#[test]
fn minimal_files_are_valid() {
    for text in [
        "domain: a\n",
        "domain: a\ndescriptors:\n",
        "domain: a\ndescriptors: []\n",
        "\u{feff}domain: a\r\ndescriptors:\r\n  - key: k\r\n",
        "---\ndomain: a\n...\n",
    ] {
        assert_eq!(errors_of(text), Vec::<String>::new(), "{text:?}");
    }
}

#[test]
fn every_error_of_a_file_is_reported_in_order() {
    let text = "\
domain: multi
descriptors:
  - key: a
    rate_limit:
      unit: fortnight
      request_per_unit: 5
  - key: b
  - key: a
    unit: second
  - value: x
";
    let errors = errors_of(text);
    let expected = [
        ("r.yaml:5:7: ", "missing required field 'requests_per_unit'"),
        ("r.yaml:5:13: ", "invalid rate limit unit 'fortnight'"),
        (
            "r.yaml:6:7: ",
            "unknown field 'request_per_unit' under rate_limit",
        ),
        (
            "r.yaml:8:5: ",
            "key 'a' and no value at this level (first defined at line 3",
        ),
        (
            "r.yaml:9:5: ",
            "'unit' belongs under rate_limit, not on a descriptor",
        ),
        ("r.yaml:10:5: ", "missing required field 'key'"),
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (e, (prefix, words)) in errors.iter().zip(expected) {
        assert!(
            e.starts_with(prefix) && e.contains(words),
            "{e} vs {prefix}{words}"
        );
    }
}

#[test]
fn duplicate_domain_is_reported_on_the_later_file() {
    let files = [
        (PathBuf::from("a.yaml"), "domain: shared\n".to_string()),
        (PathBuf::from("b.yaml"), "domain: other\n".to_string()),
        (PathBuf::from("c.yaml"), "# c\ndomain: shared\n".to_string()),
    ];
    let Err(ConfigErrors(errors)) = parse_files(&files) else {
        panic!("duplicate domain accepted")
    };
    assert_eq!(errors.len(), 1);
    assert_eq!(
        errors[0].to_string(),
        "c.yaml:2:9: duplicate domain 'shared': already defined in a.yaml:1:9"
    );
}

#[test]
fn errors_of_several_files_come_in_input_order() {
    let files = [
        (PathBuf::from("z.yaml"), "domain: z\nfoo: 1\n".to_string()),
        (PathBuf::from("a.yaml"), "domain: ''\n".to_string()),
    ];
    let Err(ConfigErrors(errors)) = parse_files(&files) else {
        panic!("accepted")
    };
    let files: Vec<_> = errors.iter().map(|e| e.file.clone()).collect();
    assert_eq!(files, [PathBuf::from("z.yaml"), PathBuf::from("a.yaml")]);
}

#[test]
fn no_files_is_an_empty_config() {
    assert_eq!(parse_files(&[]), Ok(vec![]));
}

#[test]
fn hostile_inputs_give_errors_not_panics() {
    let deep_descriptors = format!(
        "domain: d\n{}",
        (0..40)
            .map(|i| format!("{0}descriptors:\n{0}- key: k\n", "  ".repeat(i)))
            .collect::<String>()
    );
    let inputs = [
        String::new(),
        "just a scalar".into(),
        "- a\n- b\n".into(),
        "42".into(),
        "{".into(),
        "\u{0}\u{1}garbage: [".into(),
        "domain: [".repeat(1000),
        deep_descriptors,
        "domain: d\ndescriptors: {key: a}\n".into(),
        "domain: d\ndescriptors:\n  - 1\n  - [a]\n  - ~\n".into(),
        "? a\n".into(),
        "domain: d\n1: x\nnull: y\n".into(),
    ];
    for text in inputs {
        assert!(!errors_of(&text).is_empty(), "{text:?} accepted");
    }
}

#[test]
fn reference_descriptor_fields_are_parsed() {
    let text = r#"
domain: a
descriptors:
  - key: files
    value: "shared/*"
    share_threshold: true
    quota_mode: true
    value_to_metric: true
    metadata:
      name: service_1
      weight: 2.5
      tags: [x, 1, true, ~]
      nested: {a: {b: c}}
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;
    let configs = parse_files(&[(PathBuf::from("r.yaml"), text.to_string())]).expect("valid");
    let d = &configs[0].descriptors[0];
    assert!(d.share_threshold && d.quota_mode && d.value_to_metric);
    use crate::config::MetaValue as M;
    assert_eq!(
        d.metadata,
        Some(vec![
            ("name".into(), M::String("service_1".into())),
            ("weight".into(), M::Number("2.5".into())),
            (
                "tags".into(),
                M::List(vec![
                    M::String("x".into()),
                    M::Number("1".into()),
                    M::Bool(true),
                    M::Null
                ])
            ),
            (
                "nested".into(),
                M::Map(vec![(
                    "a".into(),
                    M::Map(vec![("b".into(), M::String("c".into()))])
                )])
            ),
        ])
    );
    assert!(configs[0].warnings.is_empty());
}

#[test]
fn merge_domain_config_joins_files_and_rejects_the_same_descriptor_twice() {
    let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let files = [
        (PathBuf::from("a.yaml"), a.to_string()),
        (PathBuf::from("b.yaml"), b.to_string()),
    ];
    assert!(
        parse_files(&files).is_err(),
        "one file per domain by default"
    );
    let merged = crate::config::parse_files_merging(&files, true).expect("merged");
    assert_eq!(merged.len(), 1);
    let keys: Vec<&str> = merged[0]
        .descriptors
        .iter()
        .map(|d| d.key.as_str())
        .collect();
    assert_eq!(keys, ["a", "b"]);
    let again = [
        (PathBuf::from("a.yaml"), a.to_string()),
        (PathBuf::from("a2.yaml"), a.to_string()),
    ];
    let Err(ConfigErrors(errors)) = crate::config::parse_files_merging(&again, true) else {
        panic!("the same descriptor in two files")
    };
    assert_eq!(
        errors[0].to_string(),
        "a2.yaml:3:5: duplicate descriptor with key 'a' in domain 'd': already defined in a.yaml:3"
    );
}

#[test]
fn policy_names_a_limit_and_advertise_false_hides_it() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 5, policy: \"burst \\\"1\\\"\"}\n      - {unit: day, requests_per_unit: 100, advertise: false}\n      - {unit: hour, requests_per_unit: 50, advertise: true}\n";
    let configs = parse_files(&[(PathBuf::from("p.yaml"), text.to_string())])
        .unwrap_or_else(|e| panic!("{e}"));
    let Some(RateLimitSpec::Limited(limits)) = &configs[0].descriptors[0].rate_limit else {
        panic!("{configs:?}")
    };
    let policies: Vec<&PolicyName> = limits.iter().map(|l| &l.policy).collect();
    assert_eq!(
        policies,
        [
            &PolicyName::Named("burst \"1\"".into()),
            &PolicyName::Unadvertised,
            &PolicyName::Derived
        ]
    );
}

#[test]
fn a_calendar_window_names_its_unit_in_a_time_zone() {
    let text = "domain: billing\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: month\n      requests_per_unit: 1000\n      algorithm: fixed_window\n      calendar: {time_zone: Europe/Berlin}\n";
    let configs = parse_files(&[(PathBuf::from("r.yaml"), text.to_string())]).unwrap();
    let Some(RateLimitSpec::Limited(limits)) = &configs[0].descriptors[0].rate_limit else {
        panic!("a limit");
    };
    let calendar = limits[0].calendar.as_ref().expect("a calendar window");
    assert_eq!(
        (calendar.unit.name(), calendar.time_zone.as_str()),
        ("month", "Europe/Berlin")
    );
}

#[test]
fn an_integer_or_boolean_value_is_its_text_as_the_references_yaml_gives_it() {
    let text = "domain: a\ndescriptors:\n  - key: internal\n    value: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: beta\n    value: False\n  - key: code\n    value: 0123\n  - key: code\n    value: +5\n  - key: code\n    value: 0x1F\n";
    let configs = parse_files(&[(PathBuf::from("r.yaml"), text.to_string())]).unwrap();
    let values: Vec<_> = configs[0]
        .descriptors
        .iter()
        .map(|d| d.value.as_deref())
        .collect();
    assert_eq!(
        values,
        [
            Some("true"),
            Some("False"),
            Some("0123"),
            Some("+5"),
            Some("0x1F")
        ]
    );
}
