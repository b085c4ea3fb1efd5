//! The Rate Limit Quota Service's logic, transport-free and pure (time is passed in): which rule
//! governs an RLQS bucket ([`bucket`]), what one rule allows as a pool of tokens ([`pool`]), and
//! how a pool is split among the Envoys that report the bucket ([`shares`]). The gRPC stream
//! around it lives in `ratelimit-app`.

pub mod bucket;
pub mod pool;
pub mod shares;

pub use bucket::{Governed, Mapping, Unruled, map_bucket};
pub use pool::Pool;
pub use shares::{Grant, Shares, StreamId, TokenGrant};
