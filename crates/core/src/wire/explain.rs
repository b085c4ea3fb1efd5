//! The JSON form of the admin port's `GET /explain`, typed once for both sides: the server
//! serializes it (`ratelimit-app`'s `http/explain.rs`) and `explain --server` deserializes it. For
//! a descriptor, [`Explanation`]: the rule it matches on the live rules and, per limit, the state
//! of the counter a decision would charge. For an RLQS bucket, [`BucketExplanation`]: the rule and
//! pool that govern it and each stream's share. Fields may be added, never removed or renamed
//! (users read this JSON); a reader ignores fields it does not know. Plain data: numbers and the
//! words the engine chose, so this module names nothing above it. Pure.

use serde::{Deserialize, Serialize};

/// `/explain?domain=D&descriptor=k=v,…`: what one descriptor meets on the live rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub domain: String,
    /// The descriptor as asked (`k=v,k2=v2`).
    pub descriptor: String,
    /// The instant the counters' states were read at (the engine's clock).
    pub now_unix_ns: u64,
    /// The store the states come from (`memory`, `redis`).
    pub store: String,
    /// How the descriptor met the rules (`outcome`, and what goes with it).
    #[serde(flatten)]
    pub explained: Explained,
}

/// A descriptor's fate on the live rules, told by `outcome`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Explained {
    /// The domain is not configured: allowed, no limit.
    UnknownDomain,
    /// No rule matches the descriptor: allowed, no limit.
    Unmatched,
    /// The descriptor ends on an entry with no `rate_limit`: never limited.
    NoLimit,
    /// The descriptor matches an `unlimited` rule.
    Unlimited { rule: String, shadow_mode: bool },
    /// The descriptor matches a rule with limits (`"outcome": "rule"`).
    #[serde(rename = "rule")]
    Limited {
        rule: String,
        shadow_mode: bool,
        limits: Vec<ExplainedLimit>,
    },
    /// The descriptor matches a concurrency rule: its slots now. (A descriptor of the rule's
    /// entries; a request id and release marker after them are read as the request's.)
    Concurrency {
        rule: String,
        shadow_mode: bool,
        max_in_flight: u32,
        /// How long a lease lasts unreleased, in words (`5m`).
        lease: String,
        /// Slots held now (leases not yet ended).
        in_use: u32,
        /// Slots free now.
        free: u32,
        /// Time until the soonest lease ends, in words (`null` when none is held).
        next_lease_end: Option<String>,
    },
    /// An override set through the quota API applies (`"outcome": "override"`): its one limit
    /// in place of the rule's, until it expires.
    #[serde(rename = "override")]
    Overridden {
        /// The rule the descriptor matches beneath it, if any (its shadow and quota mode apply).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        shadow_mode: bool,
        limits: Vec<ExplainedLimit>,
        /// Whole seconds until the override expires.
        expires_in_seconds: u64,
    },
}

/// One limit of the matched rule: its numbers, and its counter now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExplainedLimit {
    /// The limit's `name` (`null` when it has none).
    pub(crate) name: Option<String>,
    /// The algorithm in force (`token_bucket`, …).
    pub algorithm: String,
    /// Whether that is the server's default (the rule names none).
    pub algorithm_is_default: bool,
    pub requests_per_unit: u32,
    /// The unit as written in rules files (`second`, `minute`, …).
    pub unit: String,
    pub unit_multiplier: u32,
    /// The window (refill period), in words (`1m`).
    pub(crate) window: String,
    pub(crate) burst: u32,
    /// What the numbers mean under the algorithm, in words.
    pub effective: String,
    /// Whole hits that would still pass now.
    pub remaining: u32,
    /// Time until the limit is fully available again, in words, and in nanoseconds.
    pub reset_after: String,
    pub(crate) reset_after_ns: u64,
    /// The counter's stored state (`null`: never charged, or expired).
    pub state: Option<StoredState>,
    /// What that state means, in words.
    pub state_meaning: String,
    /// Leaky bucket only: the longest a request may wait for its turn, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_delay: Option<String>,
}

/// A counter's raw state: the algorithm's two numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredState {
    pub(crate) a: u64,
    pub(crate) b: u64,
}

/// `/explain?domain=D&bucket=k=v,…`: how an RLQS bucket is read and what each stream holds of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BucketExplanation {
    pub domain: String,
    /// The bucket as asked (`k=v,k2=v2`, entries in any order).
    pub bucket: String,
    /// The descriptor the bucket is read as (entries in the rules tree's order).
    pub descriptor: String,
    /// What governs the bucket (`outcome`, and what goes with it).
    #[serde(flatten)]
    pub governed: BucketGoverned,
    /// This instance's part of the pool (1 unless instances share it through a shared store); absent when
    /// no stream reported the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Each stream that reported the bucket, and its share.
    pub streams: Vec<StreamShare>,
}

/// What governs a bucket, told by `outcome`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum BucketGoverned {
    /// No rule (`why`: `UnknownDomain`, `NoRule`, `TooLarge`): allow all.
    AllowAll { why: String },
    /// An `unlimited` rule: allow all.
    Unlimited { rule: String },
    /// A limited rule in shadow mode: allowed, but counted.
    Shadow { rule: String, pool: BucketPool },
    /// A limited rule: its pool shared among the streams.
    Shared { rule: String, pool: BucketPool },
}

impl BucketGoverned {
    /// The `outcome` the JSON carries.
    pub fn outcome(&self) -> &'static str {
        match self {
            BucketGoverned::AllowAll { .. } => "allow_all",
            BucketGoverned::Unlimited { .. } => "unlimited",
            BucketGoverned::Shadow { .. } => "shadow",
            BucketGoverned::Shared { .. } => "shared",
        }
    }

    /// The governing rule's path, if a rule governs.
    pub fn rule(&self) -> Option<&str> {
        match self {
            BucketGoverned::AllowAll { .. } => None,
            BucketGoverned::Unlimited { rule }
            | BucketGoverned::Shadow { rule, .. }
            | BucketGoverned::Shared { rule, .. } => Some(rule),
        }
    }
}

/// A rule's limits as one token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketPool {
    pub tokens: u32,
    pub period_secs: u64,
    pub burst: u32,
    pub fill_interval_secs: u64,
}

/// One stream's part of a bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamShare {
    pub stream: u64,
    pub demand_per_sec: f64,
    /// `null` until the stream's first assignment.
    pub grant: Option<StreamGrant>,
}

/// What a stream was assigned: `{"token_bucket": {…}}` or `"deny_all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamGrant {
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_secs: u64,
    },
    DenyAll,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn limited() -> Explanation {
        Explanation {
            domain: "edge".into(),
            descriptor: "user=u1".into(),
            now_unix_ns: 7,
            store: "memory".into(),
            explained: Explained::Limited {
                rule: "user".into(),
                shadow_mode: false,
                limits: vec![ExplainedLimit {
                    name: None,
                    algorithm: "leaky_bucket".into(),
                    algorithm_is_default: false,
                    requests_per_unit: 10,
                    unit: "second".into(),
                    unit_multiplier: 1,
                    window: "1s".into(),
                    burst: 4,
                    effective: "drain 1 every 100ms".into(),
                    remaining: 2,
                    reset_after: "100ms".into(),
                    reset_after_ns: 100_000_000,
                    state: Some(StoredState { a: 1, b: 2 }),
                    state_meaning: "queue empty in 100ms".into(),
                    max_delay: Some("250ms".into()),
                }],
            },
        }
    }

    /// The names users read: a rename or a lost field fails here.
    #[test]
    fn a_descriptors_explanation_keeps_its_json_names() {
        let value = serde_json::to_value(limited()).unwrap();
        assert_eq!(
            value,
            json!({
                "domain": "edge", "descriptor": "user=u1", "now_unix_ns": 7, "store": "memory",
                "outcome": "rule", "rule": "user", "shadow_mode": false,
                "limits": [{
                    "name": null, "algorithm": "leaky_bucket", "algorithm_is_default": false,
                    "requests_per_unit": 10, "unit": "second", "unit_multiplier": 1,
                    "window": "1s", "burst": 4, "effective": "drain 1 every 100ms",
                    "remaining": 2, "reset_after": "100ms", "reset_after_ns": 100_000_000u64,
                    "state": {"a": 1, "b": 2}, "state_meaning": "queue empty in 100ms",
                    "max_delay": "250ms",
                }],
            })
        );
        let back: Explanation = serde_json::from_value(value).unwrap();
        assert_eq!(back, limited());
    }

    #[test]
    fn outcomes_without_a_rule_carry_only_the_outcome() {
        for (explained, outcome) in [
            (Explained::UnknownDomain, "unknown_domain"),
            (Explained::Unmatched, "unmatched"),
            (Explained::NoLimit, "no_limit"),
        ] {
            let explanation = Explanation {
                explained,
                ..limited()
            };
            let value = serde_json::to_value(&explanation).unwrap();
            assert_eq!(value["outcome"], outcome);
            assert_eq!(value.as_object().unwrap().len(), 5, "{value}");
            assert_eq!(
                serde_json::from_value::<Explanation>(value).unwrap(),
                explanation
            );
        }
        let unlimited = json!({
            "domain": "edge", "descriptor": "k=v", "now_unix_ns": 1, "store": "redis",
            "outcome": "unlimited", "rule": "k", "shadow_mode": true,
            "a_field_of_a_newer_server": [],
        });
        let read: Explanation = serde_json::from_value(unlimited).unwrap();
        assert_eq!(
            read.explained,
            Explained::Unlimited {
                rule: "k".into(),
                shadow_mode: true
            }
        );
    }

    #[test]
    fn a_buckets_explanation_keeps_its_json_names() {
        let explanation = BucketExplanation {
            domain: "q".into(),
            bucket: "api_key=k1,name=n".into(),
            descriptor: "name=n,api_key=k1".into(),
            governed: BucketGoverned::Shared {
                rule: "name_n.api_key".into(),
                pool: BucketPool {
                    tokens: 10,
                    period_secs: 60,
                    burst: 10,
                    fill_interval_secs: 6,
                },
            },
            fraction: Some(0.5),
            streams: vec![
                StreamShare {
                    stream: 3,
                    demand_per_sec: 0.25,
                    grant: Some(StreamGrant::TokenBucket {
                        max_tokens: 9,
                        tokens_per_fill: 1,
                        fill_interval_secs: 6,
                    }),
                },
                StreamShare {
                    stream: 4,
                    demand_per_sec: 0.0,
                    grant: Some(StreamGrant::DenyAll),
                },
                StreamShare {
                    stream: 5,
                    demand_per_sec: 0.0,
                    grant: None,
                },
            ],
        };
        let value = serde_json::to_value(&explanation).unwrap();
        assert_eq!(value["outcome"], explanation.governed.outcome());
        assert_eq!(
            value,
            json!({
                "domain": "q", "bucket": "api_key=k1,name=n", "descriptor": "name=n,api_key=k1",
                "outcome": "shared", "rule": "name_n.api_key",
                "pool": {"tokens": 10, "period_secs": 60, "burst": 10, "fill_interval_secs": 6},
                "fraction": 0.5,
                "streams": [
                    {"stream": 3, "demand_per_sec": 0.25, "grant": {"token_bucket": {
                        "max_tokens": 9, "tokens_per_fill": 1, "fill_interval_secs": 6}}},
                    {"stream": 4, "demand_per_sec": 0.0, "grant": "deny_all"},
                    {"stream": 5, "demand_per_sec": 0.0, "grant": null},
                ],
            })
        );
        assert_eq!(
            serde_json::from_value::<BucketExplanation>(value).unwrap(),
            explanation
        );
        let allow_all = json!({
            "domain": "q", "bucket": "x=1", "descriptor": "x=1",
            "outcome": "allow_all", "why": "NoRule", "streams": [],
        });
        let read: BucketExplanation = serde_json::from_value(allow_all).unwrap();
        assert_eq!(
            (read.governed.outcome(), read.governed.rule()),
            ("allow_all", None)
        );
        assert_eq!(
            read.governed,
            BucketGoverned::AllowAll {
                why: "NoRule".into()
            }
        );
        assert_eq!(read.fraction, None);
    }
}
