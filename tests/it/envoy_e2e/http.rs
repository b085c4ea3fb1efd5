//! A minimal HTTP/1.1 client for the tests: one GET per connection to 127.0.0.1, optionally from a
//! chosen loopback source address (127.0.0.2, 127.0.0.3, ... are distinct client IPs to Envoy).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper::header::HeaderMap;
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;

/// Longest a single request may take, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Response {
    /// A header's value as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A header's value as a number; panics (with the whole response) if absent or not a number.
    pub fn number(&self, name: &str) -> u64 {
        self.header(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no numeric `{name}` header in {self:#?}"))
    }

    /// The x-ratelimit-* headers Envoy added, as (limit, remaining, reset).
    pub fn ratelimit_headers(&self) -> (String, u64, u64) {
        let limit = self
            .header("x-ratelimit-limit")
            .unwrap_or_else(|| panic!("no x-ratelimit-limit in {self:#?}"))
            .to_owned();
        (
            limit,
            self.number("x-ratelimit-remaining"),
            self.number("x-ratelimit-reset"),
        )
    }

    /// Whether any x-ratelimit-* header is present.
    pub fn has_ratelimit_headers(&self) -> bool {
        self.headers
            .keys()
            .any(|k| k.as_str().starts_with("x-ratelimit-"))
    }
}

/// GET `path` from 127.0.0.1:`port`, from 127.0.0.1.
pub async fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<Response, String> {
    get_from(IpAddr::V4(Ipv4Addr::LOCALHOST), port, path, headers).await
}

/// GET `path` from 127.0.0.1:`port`, with the connection's source address bound to `source`.
pub async fn get_from(
    source: IpAddr,
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Response, String> {
    tokio::time::timeout(REQUEST_TIMEOUT, send(source, port, path, headers))
        .await
        .map_err(|_| format!("GET {path}: no answer within {REQUEST_TIMEOUT:?}"))?
}

async fn send(
    source: IpAddr,
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Response, String> {
    let socket = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .bind(SocketAddr::new(source, 0))
        .map_err(|e| format!("bind {source}: {e}"))?;
    let target = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let stream = socket
        .connect(target)
        .await
        .map_err(|e| format!("connect {target}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = Request::get(path).header("host", format!("127.0.0.1:{port}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("GET {path}: {e}"))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
