//! Targets `json` and `explain`: bodies for `POST /json` and query strings for `GET /explain`,
//! through the admin router itself. They must not panic; /json answers 200, 429 or 400 (the memory
//! store never fails) with a JSON body, one status per descriptor when it decided; /explain answers
//! 200 with JSON naming an outcome, or 400.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use ratelimit_server::clock::{ManualClock, NANOS_PER_SECOND};
use ratelimit_server::config::parse_files;
use ratelimit_server::engine::{Engine, EngineSettings};
use ratelimit_server::front::FrontDoor;
use ratelimit_server::http::{Admin, router};
use ratelimit_server::metrics::Metrics;
use ratelimit_server::policy::Policy;
use ratelimit_server::status::{LoadReport, ServerStatus};
use ratelimit_server::store::Store;
use ratelimit_server::store::memory::MemoryBackend;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::input::Choices;
use crate::requests::{RULES, decode};

pub const JSON_DICTIONARY: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"\"domain\"",
    b"\"descriptors\"",
    b"\"entries\"",
    b"\"key\"",
    b"\"value\"",
    b"\"hitsAddend\"",
    b"\"hits_addend\"",
    b"\"limit\"",
    b"\"requestsPerUnit\"",
    b"\"unit\"",
    b"\"SECOND\"",
    b"\"isNegativeHits\"",
    b"true",
    b"null",
    b"-1",
    b"1e400",
    b"18446744073709551616",
    b"\"4294967296\"",
    b"0.5",
    b"\\u0000",
    b"\\ud800",
];

pub const QUERY_DICTIONARY: &[&[u8]] = &[
    b"domain=",
    b"descriptor=",
    b"&",
    b"=",
    b",",
    b"%",
    b"%2C",
    b"%3D",
    b"%00",
    b"%ff",
    b"+",
    b"fz",
    b"a=1",
    b"c=1,d=2",
    b"m=x",
    b"u=",
    b"domain[]=",
    b"descriptor=a=1&descriptor=b=x",
];

/// axum's default request body limit, answered 413.
const BODY_LIMIT: usize = 2 << 20;

pub struct AdminTarget {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
}

impl AdminTarget {
    pub fn new() -> AdminTarget {
        let configs = parse_files(&[(PathBuf::from("fz.yaml"), RULES.to_owned())]).unwrap();
        let metrics = Arc::new(Metrics::new(100));
        let clock = Arc::new(ManualClock::new(1_767_225_610 * NANOS_PER_SECOND));
        let engine = Engine::new(
            Policy::new(&configs),
            Store::new(MemoryBackend::new(10_000)),
            clock,
            EngineSettings::default(),
        )
        .with_metrics(metrics.clone());
        let engine = Arc::new(engine);
        let front = Arc::new(FrontDoor::new(engine.clone(), None, None));
        let status = Arc::new(ServerStatus::new(LoadReport::default()));
        let admin = Arc::new(Admin::new(engine, front, metrics, status));
        AdminTarget {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap(),
            router: router(admin),
        }
    }

    fn send(&self, request: Request<Body>) -> (StatusCode, Vec<u8>) {
        let router = self.router.clone();
        self.runtime.block_on(async move {
            let response = router.oneshot(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, body.to_vec())
        })
    }

    pub fn check_json(&self, body: &[u8]) -> Result<(), String> {
        let request = Request::post("/json")
            .header("content-type", "application/json")
            .body(Body::from(body.to_vec()))
            .unwrap();
        let (status, out) = self.send(request);
        if status == StatusCode::PAYLOAD_TOO_LARGE && body.len() > BODY_LIMIT {
            return Ok(());
        }
        let value: Value = serde_json::from_slice(&out)
            .map_err(|e| format!("{status}: the answer is not JSON ({e})"))?;
        match status {
            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
                let sent: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
                let asked = sent
                    .get("descriptors")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let got = value["statuses"].as_array().map_or(0, Vec::len);
                if asked != got {
                    return Err(format!("{got} statuses for {asked} descriptors: {value}"));
                }
                Ok(())
            }
            StatusCode::BAD_REQUEST if value.get("error").is_some() => Ok(()),
            other => Err(format!("answered {other}: {value}")),
        }
    }

    pub fn check_explain(&self, query: &[u8]) -> Result<(), String> {
        // Bytes a URI cannot hold are percent-encoded, as a client would send them.
        let mut uri = String::from("/explain?");
        for &b in query {
            if b.is_ascii_graphic() && b != b'#' {
                uri.push(b as char);
            } else {
                uri.push_str(&format!("%{b:02X}"));
            }
        }
        let Ok(request) = Request::get(uri.as_str()).body(Body::empty()) else {
            return Ok(()); // not a URI any client could send
        };
        let (status, out) = self.send(request);
        match status {
            StatusCode::OK => {
                let value: Value = serde_json::from_slice(&out)
                    .map_err(|e| format!("200 with a body that is not JSON ({e})"))?;
                if value["outcome"].as_str().is_none() {
                    return Err(format!("200 without an outcome: {value}"));
                }
                Ok(())
            }
            StatusCode::BAD_REQUEST => Ok(()),
            other => Err(format!(
                "answered {other}: {}",
                String::from_utf8_lossy(&out)
            )),
        }
    }
}

/// A /json body from bytes: a request of the `requests` target in proto3 JSON, with numbers
/// sometimes as strings, sometimes out of range, and sometimes an unknown field.
pub fn generate_json(c: &mut Choices<'_>) -> Vec<u8> {
    let request = decode(c);
    let number = |c: &mut Choices<'_>, n: u64| -> Value {
        match c.below(6) {
            0 => json!(n.to_string()),
            1 => json!(-1),
            2 => json!(1.5),
            _ => json!(n),
        }
    };
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|d| {
            let mut v = json!({
                "entries": d.entries.iter().map(|e| json!({"key": e.key, "value": e.value})).collect::<Vec<_>>(),
            });
            if let Some(h) = d.hits_addend {
                v["hitsAddend"] = number(c, h.value);
            }
            if let Some(l) = d.limit {
                v["limit"] = json!({"requestsPerUnit": l.requests_per_unit, "unit": l.unit});
            }
            if d.is_negative_hits {
                v["isNegativeHits"] = json!(true);
            }
            v
        })
        .collect();
    let mut body = json!({"domain": request.domain, "descriptors": descriptors});
    if request.hits_addend != 1 {
        body["hits_addend"] = number(c, u64::from(request.hits_addend));
    }
    if c.chance(5) {
        body["unknown"] = json!(1);
    }
    serde_json::to_vec(&body).unwrap()
}

/// An /explain query from bytes.
pub fn generate_query(c: &mut Choices<'_>) -> Vec<u8> {
    let request = decode(c);
    let descriptor = request
        .descriptors
        .first()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let mut q = String::new();
    if c.chance(90) {
        q.push_str(&format!("domain={}", request.domain));
    }
    if c.chance(90) {
        q.push_str(&format!("&descriptor={descriptor}"));
    }
    q.into_bytes()
}
