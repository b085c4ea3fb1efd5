//! Checks a RateLimitRequest before any work: required fields and size bounds, so no input can
//! panic the server or make it hold unbounded memory.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// Size bounds on one request. Defaults fit any request Envoy builds from real traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBounds {
    pub max_descriptors: usize,
    pub max_entries: usize,
    /// Bytes of the domain, of each key and of each value.
    pub max_string_len: usize,
}

impl Default for RequestBounds {
    fn default() -> Self {
        RequestBounds {
            max_descriptors: 64,
            max_entries: 32,
            max_string_len: 4096,
        }
    }
}

/// Why a request is refused (gRPC INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    #[error("too many descriptors: {count} (at most {max})")]
    TooManyDescriptors { count: usize, max: usize },
    #[error("descriptor {index} has too many entries: {count} (at most {max})")]
    TooManyEntries {
        index: usize,
        count: usize,
        max: usize,
    },
    #[error("{what} is {len} bytes long (at most {max})")]
    TooLong {
        what: String,
        len: usize,
        max: usize,
    },
    #[error("descriptor {index}: limit override has no unit")]
    OverrideWithoutUnit { index: usize },
    #[error("descriptor {index}: is_negative_hits is not supported")]
    NegativeHits { index: usize },
}

impl RequestBounds {
    pub(crate) fn check(&self, request: &RateLimitRequest) -> Result<(), InvalidRequest> {
        let too_long = |what: String, len: usize| InvalidRequest::TooLong {
            what,
            len,
            max: self.max_string_len,
        };
        if request.domain.is_empty() {
            return Err(InvalidRequest::EmptyDomain);
        }
        if request.domain.len() > self.max_string_len {
            return Err(too_long("the domain".into(), request.domain.len()));
        }
        if request.descriptors.is_empty() {
            return Err(InvalidRequest::NoDescriptors);
        }
        if request.descriptors.len() > self.max_descriptors {
            return Err(InvalidRequest::TooManyDescriptors {
                count: request.descriptors.len(),
                max: self.max_descriptors,
            });
        }
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            if descriptor.entries.len() > self.max_entries {
                return Err(InvalidRequest::TooManyEntries {
                    index,
                    count: descriptor.entries.len(),
                    max: self.max_entries,
                });
            }
            for (e, entry) in descriptor.entries.iter().enumerate() {
                if entry.key.len() > self.max_string_len {
                    return Err(too_long(
                        format!("descriptor {index} entry {e} key"),
                        entry.key.len(),
                    ));
                }
                if entry.value.len() > self.max_string_len {
                    return Err(too_long(
                        format!("descriptor {index} entry {e} value"),
                        entry.value.len(),
                    ));
                }
            }
            if descriptor.is_negative_hits {
                return Err(InvalidRequest::NegativeHits { index });
            }
        }
        Ok(())
    }
}
