//! The forms a request takes outside the process, each read and written in one place: the JSON
//! form of RateLimitRequest and RateLimitResponse (`POST /json`, [`json`]), the record line
//! (`serve --record`, `replay`; [`record`]), and RFC 3339 instants ([`time`]). Pure: bytes in,
//! values out.

pub mod json;
pub mod record;
pub mod time;
