//! `explain`: which rule each descriptor matches and why, each limit's algorithm and effective
//! numbers, and with `--server` what a running server's live rules match and each limit's current
//! state there (from its admin `GET /explain`). With `--bucket`, each argument is an RLQS bucket
//! (entries in any order): the descriptor it is read as, the rule and pool that govern it, and
//! with `--server` each Envoy stream's share there. The server's answer is read in its typed form
//! (`wire::explain`), the one the server writes.

use std::path::Path;

use axum::http::Uri;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::de::DeserializeOwned;

use crate::limiter::LimitDefaults;
use crate::policy::parse_descriptor;
use crate::policy::{NodeValue, Outcome, Policy, RuleKind, Step};
use crate::quota::{Governed, map_bucket};
use crate::rules_dir::{SizeCaps, load_rules_dir};
use crate::wire::explain::{BucketExplanation, Explained, ExplainedLimit, Explanation};

fn describe_value(value: &NodeValue) -> String {
    match value {
        NodeValue::Exact(v) => format!("value '{v}'"),
        NodeValue::Wildcard(p) => format!("wildcard '{}'", p.as_str()),
        NodeValue::Any => "any value".into(),
    }
}

pub(super) async fn explain(
    dir: &Path,
    domain: &str,
    server: Option<&str>,
    defaults: &LimitDefaults,
    descriptors: &[String],
    as_bucket: bool,
) -> i32 {
    let configs = match load_rules_dir(dir, SizeCaps::default()) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return 1;
        }
    };
    let policy = Policy::new(&configs);
    let rules = policy.domain(domain);
    if rules.is_none() {
        println!("domain '{domain}' is not configured: every descriptor is allowed (OK, no limit)");
    }
    for text in descriptors {
        let entries = match parse_descriptor(text) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("error: {e}");
                return 2;
            }
        };
        if as_bucket {
            println!("bucket {text}:");
            offline_bucket(&policy, domain, &entries, defaults);
        } else if let Some(rules) = rules {
            println!("descriptor {text}:");
            offline(rules, &entries, defaults);
        }
        if let Some(server) = server {
            let shown = if as_bucket {
                fetch(server, domain, "bucket", text)
                    .await
                    .map(|live| print_live_bucket(server, &live))
            } else {
                fetch(server, domain, "descriptor", text)
                    .await
                    .map(|live| print_live(server, &live))
            };
            if let Err(e) = shown {
                eprintln!("error: {server}: {e}");
                return 1;
            }
        }
    }
    0
}

fn offline(rules: &crate::policy::DomainRules, entries: &[(String, String)], d: &LimitDefaults) {
    let pairs = entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let outcome = rules.walk(pairs, |step| match step {
        Step::Matched { index, node } => println!(
            "  entry {index} ({}={}) matched key '{}' {} at line {}",
            entries[index].0,
            entries[index].1,
            node.key,
            describe_value(&node.value),
            node.location.line
        ),
        Step::NoCandidate { index } => println!(
            "  entry {index} ({}={}): no rule at this level has key '{}' with a matching value",
            entries[index].0, entries[index].1, entries[index].0
        ),
        Step::TooLong { index } => println!(
            "  entry {index}: the matched rule has no nested descriptors, so a longer descriptor matches nothing"
        ),
    });
    match outcome {
        Outcome::Rule(rule) => {
            let shadow = if rule.shadow_mode {
                " (shadow mode)"
            } else {
                ""
            };
            println!("  => rule '{}'{shadow}", rule.path);
            match &rule.kind {
                RuleKind::Unlimited { .. } => println!("     unlimited"),
                RuleKind::Concurrency(c) => println!(
                    "     at most {} in flight, each slot leased for {} (the entries after the rule's: the request id, then the release marker)",
                    c.max_in_flight,
                    crate::config::format_duration(c.lease)
                ),
                RuleKind::Limited(limits) => {
                    for rl in limits {
                        let l = &rl.limit;
                        let params = rl.params(d);
                        println!(
                            "     {} per {} {}(s), {}{}{}: {}",
                            l.requests_per_unit,
                            l.unit_multiplier,
                            l.unit,
                            params.algorithm,
                            if l.algorithm.is_none() {
                                " (server default)"
                            } else {
                                ""
                            },
                            l.name
                                .as_ref()
                                .map(|n| format!(", name '{n}'"))
                                .unwrap_or_default(),
                            params.describe()
                        );
                    }
                }
            }
        }
        Outcome::NoLimitOnNode => {
            println!("  => matched an entry with no rate_limit: never limited")
        }
        Outcome::Unmatched => {
            println!("  => no rule: OK, no limit");
            let pairs: Vec<(&str, &str)> = entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if let Some((order, rule)) = rules.reordered(&pairs) {
                let reordered: Vec<String> = order
                    .iter()
                    .map(|&i| format!("{}={}", pairs[i].0, pairs[i].1))
                    .collect();
                println!(
                    "     in another order, {}, it would match rule '{}': Envoy sends the entries in the order of the route's rate_limits actions, which must nest as the rules do",
                    reordered.join(","),
                    rule.path
                );
            }
        }
    }
}

/// An RLQS bucket read on the rules files.
fn offline_bucket(policy: &Policy, domain: &str, entries: &[(String, String)], d: &LimitDefaults) {
    let mapping = map_bucket(policy, domain, entries, d, false);
    let descriptor: Vec<String> = mapping
        .descriptor
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("  read as descriptor {}", descriptor.join(","));
    match &mapping.governed {
        Governed::AllowAll(why) => {
            println!("  => no rule ({why:?}): ALLOW_ALL for {ALLOW_ALL_TTL_SECS} s")
        }
        Governed::Unlimited { path, .. } => {
            println!("  => rule '{path}', unlimited: ALLOW_ALL for {ALLOW_ALL_TTL_SECS} s")
        }
        Governed::Limited {
            path, shadow, pool, ..
        } => {
            let shadow = if *shadow {
                " (shadow mode: ALLOW_ALL, counted)"
            } else {
                ""
            };
            println!(
                "  => rule '{path}'{shadow}: a pool of {} per {} s, burst {}, shared among the Envoys \
                 that report the bucket as token buckets refilled over {} s",
                pool.tokens,
                pool.period_secs,
                pool.burst,
                pool.fill_interval_secs()
            );
        }
    }
}

/// A bucket's shares on a running server.
fn print_live_bucket(server: &str, live: &BucketExplanation) {
    println!(
        "  live on {server}: {} ({}), {} stream(s)",
        live.governed.outcome(),
        live.governed.rule().unwrap_or("no rule"),
        live.streams.len()
    );
    if let Some(fraction) = live.fraction.filter(|f| *f < 1.0) {
        println!(
            "     this instance hands out {:.0} % of the pool (shared with the other instances \
             through Redis)",
            fraction * 100.0
        );
    }
    for stream in &live.streams {
        // The grant as the server sent it (`null` before the stream's first assignment).
        let grant = serde_json::to_string(&stream.grant).unwrap_or_default();
        println!(
            "     stream {}: demand {:.2}/s, grant {grant}",
            stream.stream, stream.demand_per_sec
        );
    }
}

/// What `ALLOW_ALL` assignments last (as the server sends them).
const ALLOW_ALL_TTL_SECS: u64 = 3600;

fn print_live(server: &str, live: &Explanation) {
    match &live.explained {
        Explained::Limited { rule, limits, .. } => {
            println!("  live on {server}: rule '{rule}'");
            for l in limits {
                print_live_limit(l);
            }
        }
        Explained::Overridden {
            rule,
            limits,
            expires_in_seconds,
            ..
        } => {
            let under = rule
                .as_deref()
                .map_or(String::new(), |r| format!(" (over rule '{r}')"));
            println!("  live on {server}: an override{under}, for {expires_in_seconds}s more");
            for l in limits {
                print_live_limit(l);
            }
        }
        Explained::Unlimited { rule, .. } => {
            println!("  live on {server}: rule '{rule}', unlimited")
        }
        Explained::Concurrency {
            rule,
            max_in_flight,
            in_use,
            free,
            next_lease_end,
            ..
        } => {
            println!(
                "  live on {server}: rule '{rule}', concurrency: {in_use} of {max_in_flight} slots in use, {free} free{}",
                next_lease_end.as_ref().map_or(String::new(), |t| format!(
                    ", the soonest lease ends in {t}"
                ))
            )
        }
        Explained::NoLimit => println!("  live on {server}: matched an entry with no rate_limit"),
        Explained::UnknownDomain => println!("  live on {server}: domain not configured there"),
        Explained::Unmatched => println!("  live on {server}: no rule"),
    }
}

fn print_live_limit(l: &ExplainedLimit) {
    let default = if l.algorithm_is_default {
        " (server default)"
    } else {
        ""
    };
    println!(
        "     {} per {} {}(s), {}{default}: {}",
        l.requests_per_unit, l.unit_multiplier, l.unit, l.algorithm, l.effective
    );
    let raw = match &l.state {
        Some(state) => serde_json::to_string(state).unwrap_or_default(),
        None => "-".into(),
    };
    println!(
        "       now: remaining {}, reset in {}; state: {} (raw {raw})",
        l.remaining, l.reset_after, l.state_meaning
    );
}

/// What a query value keeps unencoded: RFC 3986's unreserved characters.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn encode(text: &str) -> String {
    utf8_percent_encode(text, QUERY_VALUE).to_string()
}

/// The `/explain` address on a server given as `host:port` or `http://host:port[/]`.
fn explain_uri(server: &str, domain: &str, param: &str, value: &str) -> Result<Uri, String> {
    let base = super::server_url(server.trim_end_matches('/'));
    let text = format!(
        "{base}/explain?domain={}&{param}={}",
        encode(domain),
        encode(value)
    );
    text.parse()
        .map_err(|e| format!("not an address ({e}); give host:port or http://host:port"))
}

/// `GET /explain` on the server's admin port, read as `T` (its typed form, `wire::explain`).
async fn fetch<T: DeserializeOwned>(
    server: &str,
    domain: &str,
    param: &str,
    value: &str,
) -> Result<T, String> {
    let uri = explain_uri(server, domain, param, value)?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client
        .get(uri)
        .await
        .map_err(|e| format!("cannot reach: {}", super::error_chain(&e)))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| super::error_chain(&e))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    serde_json::from_slice(&body).map_err(|e| format!("bad JSON from /explain: {e}"))
}

#[cfg(test)]
mod tests {
    use super::{encode, explain_uri};

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("a=b,c=/v1 x"), "a%3Db%2Cc%3D%2Fv1%20x");
        assert_eq!(encode("é"), "%C3%A9");
        assert_eq!(encode("A-z.0_9~"), "A-z.0_9~");
    }

    #[test]
    fn a_server_is_host_port_or_an_http_address() {
        for server in [
            "127.0.0.1:8080",
            "http://127.0.0.1:8080",
            "http://127.0.0.1:8080/",
        ] {
            assert_eq!(
                explain_uri(server, "edge", "descriptor", "k=v")
                    .unwrap()
                    .to_string(),
                "http://127.0.0.1:8080/explain?domain=edge&descriptor=k%3Dv",
                "{server}"
            );
        }
        assert!(explain_uri("not an address", "d", "descriptor", "k=v").is_err());
    }
}
