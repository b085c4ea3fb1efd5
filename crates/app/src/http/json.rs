//! `POST /json`: the reference's JSON form of ShouldRateLimit, through the front door. The body is
//! a proto3-JSON RateLimitRequest read by `wire::json` (camelCase or original field names, enums
//! by name or number); the answer is a proto3-JSON RateLimitResponse (zero values omitted) with
//! HTTP 200 for OK, 429 for OVER_LIMIT, 400 for bad input and 500 when the store fails. A
//! `serve --record` line is a valid body: its `v`, `time` and `decision` are accepted and ignored.
//!
//! Before the body is read: a `Content-Type` other than `application/json` is refused with 415
//! (a web page can send `text/plain`, form or multipart bodies cross-site without a preflight, and
//! would spend a victim's quota; `application/json` needs a preflight, which this port never
//! grants), and a `Content-Length` above [`MAX_BODY_BYTES`] with 413, so `Expect: 100-continue`
//! gets its refusal instead of `100 Continue`.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use serde_json::json;

use super::AdminState;
use crate::front::RefusedCall;
use ratelimit_core::engine::EngineError;
use ratelimit_core::store::Backend;
use ratelimit_core::wire::json::{self, response_json};

/// Whether reading a body failed on its length bound.
pub(super) fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

/// The largest `/json` body read: far above any request (`MAX_REQUEST_BYTES` is 64 KiB in
/// protobuf; its JSON, or a record line, is a few times that), and the limit axum applies by
/// default, now checked before reading.
pub(super) const MAX_BODY_BYTES: usize = 2 << 20;

/// Why a body is refused before it is read, if it is: its type is not JSON (415), or it announces
/// more than [`MAX_BODY_BYTES`] (413).
fn refuse_before_reading(headers: &HeaderMap) -> Option<Response> {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(length) = length.filter(|n| *n > MAX_BODY_BYTES as u64) {
        return Some(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body announces {length} bytes; /json reads at most {MAX_BODY_BYTES}"),
        ));
    }
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str());
    let is_json = matches!(content_type, Some(Ok(t)) if is_json_media_type(t));
    if !is_json {
        let got = match content_type {
            None => "none".to_owned(),
            Some(Ok(t)) => format!("'{t}'"),
            Some(Err(_)) => "a value that is not text".to_owned(),
        };
        return Some(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type must be application/json (got {got}): /json refuses other types so \
                 that a web page cannot spend quota from a browser (curl: -H 'Content-Type: \
                 application/json')"
            ),
        ));
    }
    None
}

/// `application/json`, in any case, with or without parameters (`; charset=utf-8`).
pub(super) fn is_json_media_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

pub(super) async fn json<B: Backend>(
    State(admin): AdminState<B>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let front = &admin.front;
    let refuse = |why: RefusedCall, status: StatusCode, message: String| {
        front.refused(why);
        error(status, message)
    };
    if let Some(refused) = refuse_before_reading(&headers) {
        let why = if refused.status() == StatusCode::PAYLOAD_TOO_LARGE {
            RefusedCall::TooLarge
        } else {
            RefusedCall::InvalidArgument
        };
        front.refused(why);
        return refused;
    }
    // A body without a Content-Length (chunked) is bounded as it is read.
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(e) if is_length_limit(&e) => {
            let message = format!("cannot read the body: {e}");
            return refuse(
                RefusedCall::TooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                message,
            );
        }
        Err(e) => {
            let message = format!("cannot read the body: {e}");
            return refuse(RefusedCall::Transport, StatusCode::BAD_REQUEST, message);
        }
    };
    let request = match json::read(&body) {
        Ok(r) => r,
        Err(message) => {
            return refuse(
                RefusedCall::InvalidArgument,
                StatusCode::BAD_REQUEST,
                message,
            );
        }
    };
    match admin.front.decide_in_trace(&request, Some(&headers)).await {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, Json(response_json(&response))).into_response()
        }
        Err(EngineError::Invalid(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ EngineError::Store(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e @ EngineError::Overloaded(_)) => {
            error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    fn refused(pairs: &[(&str, &str)]) -> Option<StatusCode> {
        refuse_before_reading(&headers(pairs)).map(|r| r.status())
    }

    #[test]
    fn only_json_bodies_of_a_bounded_length_are_read() {
        for json in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
        ] {
            assert_eq!(refused(&[("content-type", json)]), None, "{json}");
        }
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "",
        ] {
            assert_eq!(
                refused(&[("content-type", other)]),
                Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{other}"
            );
        }
        assert_eq!(refused(&[]), Some(StatusCode::UNSUPPORTED_MEDIA_TYPE));
        let json = ("content-type", "application/json");
        assert_eq!(refused(&[json, ("content-length", "2097152")]), None);
        for huge in ["2097153", "100000000000"] {
            assert_eq!(
                refused(&[json, ("content-length", huge)]),
                Some(StatusCode::PAYLOAD_TOO_LARGE)
            );
            // The length is checked first: a huge body of another type is 413 too.
            assert_eq!(
                refused(&[("content-length", huge)]),
                Some(StatusCode::PAYLOAD_TOO_LARGE)
            );
        }
    }
}
