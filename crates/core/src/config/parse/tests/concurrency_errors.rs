//! `concurrency`: parsed, defaulted, and each error at its `file:line:col`.

use std::path::PathBuf;
use std::time::Duration;

use super::assert_error;
use crate::config::{ConcurrencySpec, parse_files};

fn spec_of(text: &str) -> Option<ConcurrencySpec> {
    let configs = parse_files(&[(PathBuf::from("r.yaml"), text.to_owned())]).expect("valid");
    configs[0].descriptors[0].concurrency
}

#[test]
fn concurrency_is_parsed_and_lease_defaults_to_five_minutes() {
    assert_eq!(
        spec_of(
            "domain: d\ndescriptors:\n  - key: k\n    concurrency: {max_in_flight: 3, lease: 250ms}\n"
        ),
        Some(ConcurrencySpec {
            max_in_flight: 3,
            lease: Duration::from_millis(250),
        })
    );
    assert_eq!(
        spec_of("domain: d\ndescriptors:\n  - key: k\n    concurrency:\n      max_in_flight: 1\n"),
        Some(ConcurrencySpec {
            max_in_flight: 1,
            lease: Duration::from_secs(300),
        })
    );
}

#[test]
fn max_in_flight_is_required_and_at_least_one() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    concurrency: {lease: 1m}\n",
        "4:18",
        &["missing required field 'max_in_flight'"],
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    concurrency: {max_in_flight: 0}\n",
        "4:34",
        &["'max_in_flight' must be at least 1"],
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    concurrency: {max_in_flight: 100001}\n",
        "4:34",
        &["at most 100000"],
    );
}

#[test]
fn lease_is_a_duration_within_bounds() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    concurrency: {max_in_flight: 1, lease: 10ms}\n",
        "4:44",
        &["'lease' must be between 100ms and"],
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    concurrency: {max_in_flight: 1, lease: soon}\n",
        "4:44",
        &["'lease'", "not a duration"],
    );
}

#[test]
fn unknown_fields_under_concurrency_are_named() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    concurrency: {max_in_flight: 1, max: 2}\n",
        "4:37",
        &[
            "unknown field 'max' under concurrency",
            "max_in_flight, lease",
        ],
    );
}

#[test]
fn concurrency_stands_alone_on_its_descriptor() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    concurrency: {max_in_flight: 1}\n",
        "5:5",
        &["'concurrency' cannot be given with 'rate_limit'"],
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    concurrency: {max_in_flight: 1}\n",
        "4:5",
        &["'quota_mode' does not apply"],
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    concurrency: {max_in_flight: 1}\n    descriptors:\n      - key: j\n",
        "5:5",
        &["cannot have nested 'descriptors'"],
    );
}
