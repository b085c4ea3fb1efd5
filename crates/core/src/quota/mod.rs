//! The Rate Limit Quota Service's logic, transport-free and pure (time is passed in): which rule
//! governs an RLQS bucket (`bucket`), what one rule allows as a pool of tokens (`pool`), and
//! how a pool is split among the Envoys that report the bucket (`shares`), and which part of it
//! one server instance hands out when instances share the bucket through a shared store ([`fraction`]), and
//! when each bucket next needs a tick (`deadlines`).
//! The gRPC stream and the exchange between instances around it live in `ratelimit-app`.

mod bucket;
mod deadlines;
pub mod fraction;
mod pool;
mod shares;

pub use bucket::Unruled;
pub use bucket::{Governed, MAX_BUCKET_BYTES, MAX_BUCKET_ENTRIES, Mapping, canonical, map_bucket};
pub use deadlines::Deadlines;
pub use pool::Pool;
pub use shares::{ASSIGNMENT_TTL_SECS, Grant, Reported, Shares, StreamId, TokenGrant};

/// What the server holds for one RLQS bucket: the rule it was read on, this instance's fraction of
/// the pool (1 unless instances share it through a shared store) and, per stream, its grant (if any) and
/// its demand in requests per second (`/explain?bucket=…`). Plain data: the app's RLQS table fills
/// it, `/explain` reads it.
#[derive(Debug, Clone)]
pub struct BucketView {
    pub mapping: Mapping,
    pub fraction: f64,
    pub grants: Vec<(StreamId, Option<Grant>, f64)>,
}

/// Where `/explain` looks a bucket up (the RLQS service's table).
pub trait BucketLookup: Send + Sync {
    /// The bucket of `domain` with these entries (any order), if a stream reported it.
    fn view(&self, domain: &str, entries: &[(String, String)]) -> Option<BucketView>;
}
