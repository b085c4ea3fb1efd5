//! The forms a request takes outside the process, each read and written in one place: the JSON
//! form of RateLimitRequest and RateLimitResponse (`POST /json`, [`json`]), the record line
//! (`serve --record`, `replay`; [`record`]), RFC 3339 instants ([`time`]), and the admin port's
//! `/explain` answer, written by the server and read by `explain --server` ([`explain`]). Pure:
//! bytes in, values out.

pub mod explain;
pub mod json;
pub mod record;
pub mod time;
