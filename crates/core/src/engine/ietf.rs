//! The draft-ietf-httpapi-ratelimit-headers-11 fields of one answer (`--rate-limit-headers ietf`):
//! `RateLimit-Policy`, every advertised limit that applied as a quota policy (`"name";q=;w=`),
//! `RateLimit`, each one's service limit (`"name";r=;t=`), and on OVER_LIMIT `Retry-After`, the
//! whole seconds until the request would pass. Pure: the plans and their verdicts in, header
//! values out, written as RFC 9651 structured fields by `sfv` (names quoted and escaped).

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use sfv::{Integer, KeyRef, ListSerializer, StringRef};
use smallvec::SmallVec;

use super::plan::Plan;
use super::response::reset_seconds;
use crate::clock::NANOS_PER_SECOND;
use crate::limiter::NEVER;
use crate::store::Verdict;

pub(super) const POLICY_HEADER: &str = "RateLimit-Policy";
pub(super) const LIMIT_HEADER: &str = "RateLimit";
pub(super) const RETRY_AFTER_HEADER: &str = "Retry-After";

/// One advertised quota policy and where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Item<'a> {
    name: &'a str,
    /// `q`: requests per window.
    quota: u32,
    /// `w`: the window in seconds.
    window: u64,
    /// `r`: what is left.
    remaining: u32,
    /// `t`: seconds until it is available again (out of quota: until the request would pass).
    reset: u64,
}

/// The fields of an answer whose limits are `plans` (the descriptors' plans in order) with one
/// verdict per planned limit, in plan order; `over`: the answer is OVER_LIMIT. A limit is left out
/// of the policies when it is not advertised (`advertise: false`) or its rule is in shadow mode; a
/// policy named twice (two descriptors on one rule) is shown once, with the least remaining.
/// `Retry-After` covers every enforced limit that denied, advertised or not; it is left out when no
/// wait would let the request pass (it asks for more hits than a limit holds).
pub(super) fn headers(plans: &[Plan<'_>], verdicts: &[Verdict], over: bool) -> Vec<HeaderValue> {
    let mut items: SmallVec<[Item<'_>; 4]> = SmallVec::new();
    let mut retry_after: Option<u64> = None;
    let mut next = 0;
    for plan in plans {
        let limits = plan.limits();
        let mine = verdicts.get(next..next + limits.len()).unwrap_or(&[]);
        next += limits.len();
        if plan.shadow_mode {
            continue;
        }
        for (limit, verdict) in limits.iter().zip(mine) {
            let wait = (!verdict.allowed && verdict.retry_after != NEVER)
                .then(|| verdict.retry_after.div_ceil(NANOS_PER_SECOND));
            if let Some(wait) = wait {
                retry_after = Some(retry_after.map_or(wait, |r| r.max(wait)));
            }
            let Some(name) = limit.policy else {
                continue;
            };
            let item = Item {
                name,
                quota: limit.requests_per_unit,
                window: limit.params.period / NANOS_PER_SECOND,
                remaining: if verdict.allowed {
                    verdict.outlook.remaining
                } else {
                    0
                },
                reset: wait.unwrap_or_else(|| reset_seconds(verdict.outlook.reset_after)),
            };
            match items.iter_mut().find(|i| i.name == name) {
                Some(seen) if item.remaining < seen.remaining => {
                    (seen.remaining, seen.reset) = (item.remaining, item.reset);
                }
                Some(_) => {}
                None => items.push(item),
            }
        }
    }
    let mut headers = Vec::with_capacity(3);
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    };
    let (policies, limits) = fields(&items);
    if let Some(policies) = policies {
        headers.push(header(POLICY_HEADER, policies));
    }
    if let Some(limits) = limits {
        headers.push(header(LIMIT_HEADER, limits));
    }
    if over && let Some(seconds) = retry_after {
        headers.push(header(RETRY_AFTER_HEADER, seconds.to_string()));
    }
    headers
}

/// An integer as an sf-integer (at most 15 digits: larger values are capped, never reached by
/// a window of at most 10 years or a u32 count).
fn integer(value: u64) -> Integer {
    i64::try_from(value)
        .ok()
        .and_then(|v| Integer::try_from(v).ok())
        .unwrap_or(Integer::MAX)
}

/// The `RateLimit-Policy` and `RateLimit` lists (None when empty). A name that is not an sf-string
/// cannot occur (rules are checked, derived names encoded) and is skipped if it does.
fn fields(items: &[Item<'_>]) -> (Option<String>, Option<String>) {
    let (q, w, r, t) = (
        KeyRef::constant("q"),
        KeyRef::constant("w"),
        KeyRef::constant("r"),
        KeyRef::constant("t"),
    );
    let mut policies = ListSerializer::new();
    let mut limits = ListSerializer::new();
    for item in items {
        let Ok(name) = StringRef::from_str(item.name) else {
            continue;
        };
        policies
            .bare_item(name)
            .parameter(q, integer(u64::from(item.quota)))
            .parameter(w, integer(item.window));
        limits
            .bare_item(name)
            .parameter(r, integer(u64::from(item.remaining)))
            .parameter(t, integer(item.reset));
    }
    (policies.finish(), limits.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;
    use crate::config::{Algorithm, Unit};
    use crate::engine::plan::{Kind, PlannedLimit};
    use crate::limiter::{LimitParams, Outlook};

    fn limit(policy: Option<&'static str>, rpu: u32, period_s: u64) -> PlannedLimit<'static> {
        PlannedLimit {
            name: "",
            requests_per_unit: rpu,
            unit: Unit::Second,
            params: LimitParams {
                algorithm: Algorithm::FixedWindow,
                requests_per_unit: rpu,
                period: period_s * S,
                burst: rpu,
                max_delay: 0,
                charge_denied: false,
            },
            slot: 0,
            policy,
        }
    }

    fn plan(limits: Vec<PlannedLimit<'static>>) -> Plan<'static> {
        let mut plan = Plan::new(1, false);
        plan.kind = Kind::Limited(limits.into_iter().collect());
        plan
    }

    fn verdict(allowed: bool, remaining: u32, reset_s: u64, retry: u64) -> Verdict {
        Verdict {
            allowed,
            outlook: Outlook {
                remaining,
                reset_after: reset_s * S,
            },
            remaining_before: remaining,
            charged: allowed,
            delay: 0,
            retry_after: retry,
        }
    }

    fn text(headers: &[HeaderValue]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    }

    #[test]
    fn every_advertised_limit_is_a_policy_with_its_service_limit() {
        let plans = [
            plan(vec![
                limit(Some("burst"), 10, 1),
                limit(Some("daily"), 1000, 86_400),
            ]),
            plan(vec![limit(None, 5, 60)]),
        ];
        let verdicts = [
            verdict(true, 9, 1, 0),
            verdict(true, 999, 86_400, 0),
            verdict(true, 4, 60, 0),
        ];
        assert_eq!(
            text(&headers(&plans, &verdicts, false)),
            [
                (
                    "RateLimit-Policy".into(),
                    r#""burst";q=10;w=1, "daily";q=1000;w=86400"#.into()
                ),
                (
                    "RateLimit".into(),
                    r#""burst";r=9;t=1, "daily";r=999;t=86400"#.into()
                ),
            ]
        );
    }

    #[test]
    fn over_the_limit_the_wait_is_t_and_retry_after_is_the_longest_wait() {
        let plans = [
            plan(vec![limit(Some("a"), 2, 60)]),
            plan(vec![limit(None, 1, 3600)]),
        ];
        // "a" is out for 1.2 s, the internal limit for 30.5 s: Retry-After covers both.
        let verdicts = [
            verdict(false, 0, 60, 1_200_000_000),
            verdict(false, 0, 3600, 30_500_000_000),
        ];
        assert_eq!(
            text(&headers(&plans, &verdicts, true)),
            [
                ("RateLimit-Policy".into(), r#""a";q=2;w=60"#.into()),
                ("RateLimit".into(), r#""a";r=0;t=2"#.into()),
                ("Retry-After".into(), "31".into()),
            ]
        );
        // A request that can never pass gets no Retry-After.
        let verdicts = [verdict(false, 0, 60, NEVER), verdict(true, 1, 3600, 0)];
        let h = text(&headers(&plans, &verdicts, true));
        assert!(h.iter().all(|(k, _)| k != "Retry-After"), "{h:?}");
        assert_eq!(h[1].1, r#""a";r=0;t=60"#);
    }

    #[test]
    fn names_are_quoted_and_escaped_and_repeated_policies_shown_once() {
        let plans = [
            plan(vec![limit(Some(r#"a "quoted" \ name"#), 3, 60)]),
            plan(vec![limit(Some(r#"a "quoted" \ name"#), 3, 60)]),
        ];
        let verdicts = [verdict(true, 2, 60, 0), verdict(true, 1, 60, 0)];
        let h = text(&headers(&plans, &verdicts, false));
        assert_eq!(h[0].1, r#""a \"quoted\" \\ name";q=3;w=60"#);
        assert_eq!(h[1].1, r#""a \"quoted\" \\ name";r=1;t=60"#);
        // What we write parses back as the draft's lists of strings with integer parameters.
        let parsed: sfv::List = sfv::Parser::new(&h[1].1).parse().unwrap();
        let sfv::ListEntry::Item(item) = &parsed[0] else {
            panic!("{parsed:?}")
        };
        assert_eq!(
            item.bare_item.as_string().map(|s| s.as_str()),
            Some(r#"a "quoted" \ name"#)
        );
    }

    #[test]
    fn shadow_rules_and_unadvertised_limits_are_not_shown() {
        let mut shadow = plan(vec![limit(Some("shadowed"), 1, 1)]);
        shadow.shadow_mode = true;
        let plans = [shadow, plan(vec![limit(None, 1, 1)])];
        let verdicts = [verdict(false, 0, 1, S), verdict(true, 0, 1, 0)];
        assert!(headers(&plans, &verdicts, false).is_empty());
    }
}
