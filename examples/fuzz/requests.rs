//! Target `requests`: RateLimitRequests decoded from bytes, into the engine on fixed rules with a
//! frozen clock. It must not panic; it answers INVALID_ARGUMENT (EngineError::Invalid) or a
//! response with one status per descriptor and an overall code that agrees with them; and no key
//! is ever admitted more hits than its limit allows (the clock never moves, so nothing refills).
//! A fresh engine every [`ROUNDS`] requests keeps the limits reachable.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use ratelimit_server::clock::{ManualClock, NANOS_PER_SECOND};
use ratelimit_server::config::parse_files;
use ratelimit_server::engine::{Engine, EngineError, EngineSettings};
use ratelimit_server::policy::Policy;
use ratelimit_server::store::Store;
use ratelimit_server::store::memory::MemoryBackend;

use crate::input::Choices;

pub const RULES: &str = "\
domain: fz
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: b
    value: x
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: c
    descriptors:
      - key: d
        rate_limit: {unit: hour, requests_per_unit: 4, algorithm: sliding_window}
  - key: u
    rate_limit: {unlimited: true}
  - key: o
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: m
    rate_limits:
      - {unit: hour, requests_per_unit: 6}
      - {unit: day, requests_per_unit: 4, algorithm: fixed_window}
";

/// Most hits any key of [`RULES`] may be admitted while the clock stands still, by first key.
fn capacity(first_key: &str) -> Option<u64> {
    match first_key {
        "a" => Some(5),
        "b" => Some(3),
        "c" => Some(4),
        "m" => Some(4),
        "o" => Some(2),
        _ => None,
    }
}

const ROUNDS: u32 = 64;
const DOMAINS: &[&str] = &["fz", "fz", "fz", "", "other"];
const KEYS: &[&str] = &["a", "b", "c", "d", "u", "o", "m", "x"];
const VALUES: &[&str] = &["1", "2", "x", "y", "", "/v1/a"];

pub struct Requests {
    runtime: tokio::runtime::Runtime,
    policy: Policy,
    engine: Arc<Engine<MemoryBackend>>,
    admitted: HashMap<Vec<(String, String)>, u64>,
    rounds: u32,
}

fn engine(policy: &Policy) -> Arc<Engine<MemoryBackend>> {
    let clock = Arc::new(ManualClock::new(1_767_225_610 * NANOS_PER_SECOND));
    let store = Store::new(MemoryBackend::new(10_000));
    Arc::new(Engine::new(
        policy.clone(),
        store,
        clock,
        EngineSettings::default(),
    ))
}

impl Requests {
    pub fn new() -> Requests {
        let configs = parse_files(&[(PathBuf::from("fz.yaml"), RULES.to_owned())])
            .expect("the fuzz rules are valid");
        let policy = Policy::new(&configs);
        Requests {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap(),
            engine: engine(&policy),
            policy,
            admitted: HashMap::new(),
            rounds: 0,
        }
    }

    pub fn check(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.rounds += 1;
        if self.rounds.is_multiple_of(ROUNDS) {
            self.engine = engine(&self.policy);
            self.admitted.clear();
        }
        let request = decode(&mut Choices::new(bytes));
        let engine = self.engine.clone();
        let result = self.runtime.block_on(async move {
            engine
                .should_rate_limit(&request)
                .await
                .map(|r| (request, r))
        });
        let (request, response) = match result {
            Ok(pair) => pair,
            Err(EngineError::Invalid(_)) => return Ok(()),
            Err(e) => {
                return Err(format!(
                    "failed with something other than INVALID_ARGUMENT: {e}"
                ));
            }
        };
        if response.statuses.len() != request.descriptors.len() {
            return Err(format!(
                "{} statuses for {} descriptors",
                response.statuses.len(),
                request.descriptors.len()
            ));
        }
        let over = response
            .statuses
            .iter()
            .any(|s| s.code == Code::OverLimit as i32);
        let want = if over { Code::OverLimit } else { Code::Ok };
        if response.overall_code != want as i32 {
            return Err(format!(
                "overall code {} with statuses {:?}",
                response.overall_code, response.statuses
            ));
        }
        if over {
            return Ok(());
        }
        // Admitted: every descriptor with a limit was charged.
        let request_hits = u64::from(request.hits_addend.max(1));
        for (d, status) in request.descriptors.iter().zip(&response.statuses) {
            if request.domain != "fz" || status.current_limit.is_none() || d.limit.is_some() {
                continue;
            }
            let Some(cap) = d.entries.first().and_then(|e| capacity(&e.key)) else {
                continue;
            };
            let hits = d.hits_addend.map_or(request_hits, |h| h.value);
            let key: Vec<(String, String)> = d
                .entries
                .iter()
                .map(|e| (e.key.clone(), e.value.clone()))
                .collect();
            let total = self.admitted.entry(key.clone()).or_default();
            *total = total.saturating_add(hits);
            if *total > cap {
                return Err(format!("{key:?} admitted {total} hits, limit {cap}"));
            }
        }
        Ok(())
    }
}

/// A request from bytes: mostly the fixture's domain and keys, sometimes junk, sometimes beyond
/// the request bounds.
pub fn decode(c: &mut Choices<'_>) -> RateLimitRequest {
    let domain = c.word(DOMAINS);
    // One oversized value at most per request (beyond MAX_STRING_LEN), so inputs stay small.
    let mut big = 1;
    let descriptors = if c.chance(3) {
        60 + c.below(10)
    } else {
        c.below(5)
    };
    let descriptors = (0..descriptors)
        .map(|_| {
            let entries = if c.chance(3) {
                30 + c.below(6)
            } else {
                c.below(4)
            };
            let entries = (0..entries)
                .map(|_| Entry {
                    key: c.word(KEYS),
                    value: if big > 0 && c.chance(1) {
                        big -= 1;
                        "v".repeat(5000)
                    } else {
                        c.word(VALUES)
                    },
                })
                .collect();
            RateLimitDescriptor {
                entries,
                limit: c.chance(10).then(|| RateLimitOverride {
                    requests_per_unit: c.u16() as u32 % 8,
                    unit: c.below(8) as i32,
                }),
                hits_addend: c.chance(40).then(|| UInt64Value { value: c.u64() }),
                is_negative_hits: c.chance(3),
            }
        })
        .collect();
    let hits_addend = match c.below(8) {
        0 => u32::MAX,
        1 => 2,
        2 => 0,
        _ => 1,
    };
    RateLimitRequest {
        domain,
        descriptors,
        hits_addend,
    }
}
