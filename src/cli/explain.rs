//! `explain`: which rule each descriptor matches and why, each limit's algorithm and effective
//! numbers, and with `--server` what a running server's live rules match and each limit's current
//! state there (from its admin `GET /explain`). With `--bucket`, each argument is an RLQS bucket
//! (entries in any order): the descriptor it is read as, the rule and pool that govern it, and
//! with `--server` each Envoy stream's share there.

use std::path::Path;

use axum::http::Uri;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use crate::limiter::LimitDefaults;
use crate::policy::parse_descriptor;
use crate::policy::{NodeValue, Outcome, Policy, RuleKind, Step};
use crate::quota::{Governed, map_bucket};
use crate::rules_dir::{SizeCaps, load_rules_dir};

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
        let param = if as_bucket { "bucket" } else { "descriptor" };
        if let Some(server) = server {
            match fetch(server, domain, param, text).await {
                Ok(live) if as_bucket => print_live_bucket(server, &live),
                Ok(live) => print_live(server, &live),
                Err(e) => {
                    eprintln!("error: {server}: {e}");
                    return 1;
                }
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
        Outcome::Unmatched => println!("  => no rule: OK, no limit"),
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
fn print_live_bucket(server: &str, live: &Value) {
    let streams = live["streams"].as_array().cloned().unwrap_or_default();
    println!(
        "  live on {server}: {} ({}), {} stream(s)",
        live["outcome"].as_str().unwrap_or("?"),
        live["rule"].as_str().unwrap_or("no rule"),
        streams.len()
    );
    if let Some(fraction) = live["fraction"].as_f64().filter(|f| *f < 1.0) {
        println!(
            "     this instance hands out {:.0} % of the pool (shared with the other instances \
             through Redis)",
            fraction * 100.0
        );
    }
    for stream in streams {
        println!(
            "     stream {}: demand {:.2}/s, grant {}",
            stream["stream"],
            stream["demand_per_sec"].as_f64().unwrap_or(0.0),
            stream["grant"]
        );
    }
}

/// What `ALLOW_ALL` assignments last (as the server sends them).
const ALLOW_ALL_TTL_SECS: u64 = 3600;

fn print_live(server: &str, live: &Value) {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    match live["outcome"].as_str().unwrap_or("") {
        "rule" => {
            println!("  live on {server}: rule '{}'", s(&live["rule"]));
            for l in live["limits"].as_array().into_iter().flatten() {
                let default = if l["algorithm_is_default"] == Value::Bool(true) {
                    " (server default)"
                } else {
                    ""
                };
                println!(
                    "     {} per {} {}(s), {}{default}: {}",
                    s(&l["requests_per_unit"]),
                    s(&l["unit_multiplier"]),
                    s(&l["unit"]),
                    s(&l["algorithm"]),
                    s(&l["effective"])
                );
                println!(
                    "       now: remaining {}, reset in {}; state: {} (raw {})",
                    s(&l["remaining"]),
                    s(&l["reset_after"]),
                    s(&l["state_meaning"]),
                    s(&l["state"])
                );
            }
        }
        "unlimited" => println!("  live on {server}: rule '{}', unlimited", s(&live["rule"])),
        "no_limit" => println!("  live on {server}: matched an entry with no rate_limit"),
        "unknown_domain" => println!("  live on {server}: domain not configured there"),
        _ => println!("  live on {server}: no rule"),
    }
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

/// `GET /explain` on the server's admin port.
async fn fetch(server: &str, domain: &str, param: &str, value: &str) -> Result<Value, String> {
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
