//! The reference's statsd stat names for our counters, read off a gathered registry: per rule
//! `ratelimit.service.rate_limit.<domain>.<key>.total_hits` (`.over_limit`, `.near_limit`,
//! `.within_limit`, `.shadow_mode`), per domain `ratelimit.service.rate_limit.<domain>.
//! domain_not_found` (and ours, in the same scheme, `.no_rule`), and
//! `ratelimit.service.config_load_success`, `_error`, `global_shadow_mode`. Pure: both the statsd
//! sink and the mapped Prometheus exposition (`PROMETHEUS_MAPPER_YAML`) start from these.
//!
//! The names are made of the series' `domain` and `rule` labels, which the metrics already
//! sanitize as the reference sanitizes its stat names (`ratelimit_core::metrics::
//! sanitize_stat_name`: `:`, `|` and the dots of IPv4 addresses made `_`), so they are not
//! sanitized again here (the address rule is not idempotent: `1.2.3.4.5.6.7` sanitizes to
//! `1_2_3_4.5.6.7`, and again to `1_2_3_4_5_6_7`). The reference sanitizes `<domain>.<key>` as
//! one text, ours its two parts apart: the names differ only for an address-looking run that
//! spans the dot between the two (a domain ending in `.10.0`, say, and a key starting `0.1`).

use prometheus::proto::MetricFamily;

/// Which series of a family a stat is named after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Per {
    /// `<prefix>.<domain>.<rule>.<stat>`.
    Rule,
    /// `<prefix>.<domain>.<stat>`.
    Domain,
    /// The stat's own name.
    Server,
}

/// A counter family's statsd name, and what it is per.
fn statsd_name(family: &str) -> Option<(&'static str, Per)> {
    Some(match family {
        "ratelimit_service_rate_limit_total_hits" => ("total_hits", Per::Rule),
        "ratelimit_service_rate_limit_over_limit" => ("over_limit", Per::Rule),
        "ratelimit_service_rate_limit_near_limit" => ("near_limit", Per::Rule),
        "ratelimit_service_rate_limit_within_limit" => ("within_limit", Per::Rule),
        "ratelimit_service_rate_limit_shadow_mode" => ("shadow_mode", Per::Rule),
        "ratelimit_service_rate_limit_domain_not_found" => ("domain_not_found", Per::Domain),
        "ratelimit_service_rate_limit_no_rule" => ("no_rule", Per::Domain),
        "ratelimit_service_config_load_success" => {
            ("ratelimit.service.config_load_success", Per::Server)
        }
        "ratelimit_service_config_load_error" => {
            ("ratelimit.service.config_load_error", Per::Server)
        }
        "ratelimit_service_global_shadow_mode" => {
            ("ratelimit.service.global_shadow_mode", Per::Server)
        }
        _ => return None,
    })
}

/// Whether a family is one of those the reference sends as statsd stats.
pub(crate) fn has_statsd_name(family: &str) -> bool {
    statsd_name(family).is_some()
}

/// A label as part of a statsd line: `:` and `|` (statsd's separators) and line ends become `_`.
/// The labels come sanitized (no `:` or `|` left): a guard of the line format.
pub(super) fn clean(part: &str) -> String {
    part.replace([':', '|', '\n'], "_")
}

/// Every counter of `families` that the reference sends, as (statsd name, value), in the
/// families' order.
pub(crate) fn stats(families: &[MetricFamily]) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for family in families {
        let Some((stat, per)) = statsd_name(family.name()) else {
            continue;
        };
        for metric in family.get_metric() {
            let label = |name: &str| {
                metric
                    .get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map(|l| l.value().to_owned())
            };
            let name = match per {
                Per::Rule => {
                    let (Some(domain), Some(rule)) = (label("domain"), label("rule")) else {
                        continue;
                    };
                    format!(
                        "ratelimit.service.rate_limit.{}.{}.{stat}",
                        clean(&domain),
                        clean(&rule)
                    )
                }
                Per::Domain => {
                    let Some(domain) = label("domain") else {
                        continue;
                    };
                    format!("ratelimit.service.rate_limit.{}.{stat}", clean(&domain))
                }
                Per::Server => stat.to_owned(),
            };
            out.push((name, metric.get_counter().value()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_in_names_are_replaced() {
        assert_eq!(clean("path_/a:b|c"), "path_/a_b_c");
    }
}
