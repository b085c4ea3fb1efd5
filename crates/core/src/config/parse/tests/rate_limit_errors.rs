//! One test per error class of `rate_limit`, `rate_limits` and `replaces`: the exact
//! `file:line:col` and the key words of the message.

use super::assert_error;

const RL: &str = "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n";

/// A file whose only descriptor has a rate_limit with these lines (6 spaces of indent added);
/// its first line is line 5, and its fields start at column 7.
fn rl(lines: &[&str]) -> String {
    let body: String = lines.iter().map(|l| format!("      {l}\n")).collect();
    format!("{RL}{body}")
}

#[test]
fn rate_limit_not_a_mapping() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: 5\n",
        "4:17",
        &["'rate_limit' must be a mapping", "found an integer"],
    );
}

#[test]
fn unknown_rate_limit_field() {
    assert_error(
        &rl(&[
            "unit: second",
            "request_per_unit: 5",
            "requests_per_unit: 5",
        ]),
        "6:7",
        &[
            "unknown field 'request_per_unit' under rate_limit (expected one of: unit, \
             requests_per_unit, unlimited, name, replaces, unit_multiplier, algorithm, burst, \
             max_delay, policy, advertise, calendar)",
        ],
    );
}

#[test]
fn descriptor_field_under_rate_limit() {
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "shadow_mode: true"]),
        "7:7",
        &[
            "'shadow_mode' belongs on a descriptor",
            "not under rate_limit",
        ],
    );
}

#[test]
fn missing_unit() {
    assert_error(
        &rl(&["requests_per_unit: 5"]),
        "5:7",
        &["missing required field 'unit' under rate_limit"],
    );
}

#[test]
fn invalid_unit() {
    assert_error(
        &rl(&["unit: fortnight", "requests_per_unit: 5"]),
        "5:13",
        &[
            "invalid rate limit unit 'fortnight'",
            "second, minute, hour, day, week, month, year",
        ],
    );
}

#[test]
fn unit_not_a_string() {
    assert_error(
        &rl(&["unit: [second]", "requests_per_unit: 5"]),
        "5:13",
        &["'unit' must be a string"],
    );
}

#[test]
fn missing_requests_per_unit() {
    assert_error(
        &rl(&["unit: second"]),
        "5:7",
        &[
            "missing required field 'requests_per_unit' under rate_limit",
            "write 0",
        ],
    );
}

#[test]
fn requests_per_unit_out_of_range() {
    let neg = rl(&["unit: second", "requests_per_unit: -1"]);
    assert_error(
        &neg,
        "6:26",
        &["'requests_per_unit' must be at least 0, found -1"],
    );
    let big = rl(&["unit: second", "requests_per_unit: 4294967296"]);
    assert_error(
        &big,
        "6:26",
        &["'requests_per_unit' must be at most 4294967295"],
    );
    let max = rl(&["unit: second", "requests_per_unit: 4294967295"]);
    assert_eq!(super::errors_of(&max), Vec::<String>::new());
}

#[test]
fn requests_per_unit_not_an_integer() {
    let float = rl(&["unit: second", "requests_per_unit: 1.5"]);
    assert_error(
        &float,
        "6:26",
        &["'requests_per_unit' must be an integer, found a float"],
    );
    let string = rl(&["unit: second", "requests_per_unit: '5'"]);
    assert_error(
        &string,
        "6:26",
        &["'requests_per_unit' must be an integer, found a string"],
    );
}

#[test]
fn unlimited_with_unit() {
    assert_error(
        &rl(&["unlimited: true", "unit: second"]),
        "6:7",
        &["should not specify rate limit unit when unlimited"],
    );
}

#[test]
fn unlimited_with_requests_per_unit_loads_with_a_warning() {
    let configs = crate::config::parse_files(&[(
        "r.yaml".into(),
        rl(&["unlimited: true", "requests_per_unit: 5"]),
    )])
    .expect("loads, as in the reference");
    assert_eq!(
        configs[0].warnings,
        ["r.yaml:6:7: requests_per_unit is ignored: the limit is unlimited"]
    );
    assert!(matches!(
        configs[0].descriptors[0].rate_limit,
        Some(crate::config::RateLimitSpec::Unlimited { .. })
    ));
}

#[test]
fn unlimited_not_a_bool() {
    assert_error(
        &rl(&["unlimited: yes"]),
        "5:18",
        &["'unlimited' must be a boolean"],
    );
}

#[test]
fn empty_replaces_entry() {
    assert_error(
        &rl(&["unlimited: true", "replaces: [{}]"]),
        "6:18",
        &["should not have an empty replaces entry"],
    );
}

#[test]
fn empty_replaces_name() {
    assert_error(
        &rl(&["unlimited: true", "replaces:", "  - name: ''"]),
        "7:17",
        &["a replaces entry must not have an empty name"],
    );
}

#[test]
fn replaces_entry_not_a_mapping() {
    assert_error(
        &rl(&["unlimited: true", "replaces: [other]"]),
        "6:18",
        &[
            "each replaces entry must be a mapping like {name: <limit name>}",
            "found a string",
        ],
    );
}

#[test]
fn replaces_names_itself() {
    assert_error(
        &rl(&[
            "unit: second",
            "requests_per_unit: 5",
            "name: me",
            "replaces: [{name: me}]",
        ]),
        "8:25",
        &["replaces should not contain the name of its own limit 'me'"],
    );
}

#[test]
fn unknown_field_in_replaces_entry() {
    assert_error(
        &rl(&["unlimited: true", "replaces: [{name: x, unit: second}]"]),
        "6:28",
        &["'unit' belongs under rate_limit, not in a replaces entry"],
    );
}

#[test]
fn unit_multiplier_zero() {
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "unit_multiplier: 0"]),
        "7:24",
        &["'unit_multiplier' must be at least 1, found 0"],
    );
}

#[test]
fn window_longer_than_ten_years() {
    assert_error(
        &rl(&["unit: year", "requests_per_unit: 5", "unit_multiplier: 11"]),
        "7:24",
        &["window of 11 year(s)", "maximum of 10 years"],
    );
    let ten = rl(&["unit: year", "requests_per_unit: 5", "unit_multiplier: 10"]);
    assert_eq!(super::errors_of(&ten), Vec::<String>::new());
}

#[test]
fn invalid_algorithm() {
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "algorithm: leaky"]),
        "7:18",
        &[
            "invalid algorithm 'leaky' (expected one of: token_bucket, fixed_window, \
             sliding_window, leaky_bucket)",
        ],
    );
}

#[test]
fn burst_zero() {
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "burst: 0"]),
        "7:14",
        &["'burst' must be at least 1, found 0"],
    );
}

#[test]
fn missing_fields_in_a_rate_limits_entry() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second}\n",
        "5:9",
        &["missing required field 'requests_per_unit' under rate_limits"],
    );
}

#[test]
fn max_delay_without_leaky_bucket() {
    assert_error(
        &rl(&[
            "unit: second",
            "requests_per_unit: 5",
            "algorithm: token_bucket",
            "max_delay: 500ms",
        ]),
        "8:7",
        &[
            "'max_delay' is only valid with algorithm: leaky_bucket",
            "is token_bucket",
        ],
    );
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "max_delay: 500ms"]),
        "7:7",
        &[
            "only valid with algorithm: leaky_bucket",
            "the server default",
        ],
    );
}

#[test]
fn max_delay_not_a_duration() {
    assert_error(
        &rl(&[
            "unit: second",
            "requests_per_unit: 5",
            "algorithm: leaky_bucket",
            "max_delay: 2d",
        ]),
        "8:18",
        &["'max_delay': '2d' is not a duration (write e.g. 250ms, 2s, 1m or 1h)"],
    );
}

#[test]
fn max_delay_longer_than_an_hour() {
    assert_error(
        &rl(&[
            "unit: second",
            "requests_per_unit: 5",
            "algorithm: leaky_bucket",
            "max_delay: 61m",
        ]),
        "8:18",
        &["'max_delay' must be at most 60m, found 61m"],
    );
}

#[test]
fn max_delay_when_unlimited() {
    assert_error(
        &rl(&["unlimited: true", "max_delay: 1s"]),
        "6:7",
        &["should not specify max_delay when unlimited"],
    );
}

#[test]
fn max_delay_with_an_invalid_algorithm_reports_only_the_algorithm() {
    assert_error(
        &rl(&[
            "unit: second",
            "requests_per_unit: 5",
            "algorithm: leaky",
            "max_delay: 1s",
        ]),
        "7:18",
        &["invalid algorithm 'leaky'"],
    );
}

#[test]
fn policy_must_be_a_printable_ascii_string() {
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "policy: \"café\""]),
        "7:15",
        &[
            "'policy' must be printable ASCII",
            "structured-field string",
        ],
    );
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "policy: 5"]),
        "7:15",
        &["'policy' must be a string"],
    );
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "policy: \"\""]),
        "7:15",
        &["'policy' must not be empty"],
    );
}

#[test]
fn advertise_is_a_boolean_and_not_with_a_policy_name() {
    assert_error(
        &rl(&["unit: second", "requests_per_unit: 5", "advertise: no"]),
        "7:18",
        &["'advertise' must be a boolean"],
    );
    assert_error(
        &rl(&[
            "unit: second",
            "requests_per_unit: 5",
            "policy: burst",
            "advertise: false",
        ]),
        "8:7",
        &["write one or the other"],
    );
}

#[test]
fn policy_and_advertise_are_not_for_unlimited() {
    assert_error(
        &rl(&["unlimited: true", "policy: free"]),
        "6:7",
        &["should not specify policy when unlimited"],
    );
    assert_error(
        &rl(&["unlimited: true", "advertise: false"]),
        "6:7",
        &["should not specify advertise when unlimited"],
    );
}

#[test]
fn calendar_with_an_unknown_time_zone() {
    assert_error(
        &rl(&[
            "unit: month",
            "requests_per_unit: 5",
            "algorithm: fixed_window",
            "calendar: {time_zone: Europe/Berln}",
        ]),
        "8:29",
        &["unknown time zone 'Europe/Berln'", "IANA name"],
    );
}

#[test]
fn calendar_needs_a_calendar_unit_a_window_algorithm_and_no_multiplier() {
    assert_error(
        &rl(&[
            "unit: hour",
            "requests_per_unit: 5",
            "algorithm: fixed_window",
            "calendar: {time_zone: UTC}",
        ]),
        "8:7",
        &[
            "a calendar window is a day, week, month or year",
            "unit is hour",
        ],
    );
    assert_error(
        &rl(&[
            "unit: day",
            "requests_per_unit: 5",
            "calendar: {time_zone: UTC}",
        ]),
        "7:7",
        &[
            "only valid with algorithm: fixed_window or sliding_window",
            "server default",
        ],
    );
    assert_error(
        &rl(&[
            "unit: day",
            "requests_per_unit: 5",
            "algorithm: token_bucket",
            "calendar: {time_zone: UTC}",
        ]),
        "8:7",
        &[
            "only valid with algorithm: fixed_window or sliding_window",
            "token_bucket",
        ],
    );
    assert_error(
        &rl(&[
            "unit: day",
            "unit_multiplier: 2",
            "requests_per_unit: 5",
            "algorithm: sliding_window",
            "calendar: {time_zone: UTC}",
        ]),
        "9:7",
        &["one unit long"],
    );
    assert_error(
        &rl(&[
            "unit: day",
            "requests_per_unit: 5",
            "algorithm: sliding_window",
            "calendar: {zone: UTC}",
        ]),
        "8:18",
        &["unknown field 'zone' under calendar"],
    );
    assert_error(
        &rl(&["unlimited: true", "calendar: {time_zone: UTC}"]),
        "6:7",
        &["should not specify calendar when unlimited"],
    );
}
