//! Builders of `RateLimitRequest`s, shared by the unit tests, the integration tests, the examples
//! and the benchmarks so that there is one way to write a request in code. Names no other module.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// A descriptor of `(key, value)` entries, in order, with no limit override or hits.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request for `domain` with one descriptor per entry list (`hits_addend` 0, which means 1).
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_keeps_descriptors_and_entries_in_order() {
        let r = request("d", &[&[("a", "1"), ("b", "2")], &[]]);
        assert_eq!(r.domain, "d");
        assert_eq!(r.descriptors.len(), 2);
        let entries: Vec<_> = r.descriptors[0]
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(entries, [("a", "1"), ("b", "2")]);
        assert!(r.descriptors[1].entries.is_empty());
        assert_eq!(r.hits_addend, 0);
    }
}
