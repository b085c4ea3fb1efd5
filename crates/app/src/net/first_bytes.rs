//! What a connection's first bytes say its client speaks — the HTTP/2 preface gRPC opens with, an
//! HTTP/1.x request, a TLS handshake, or something else — and whether that is what the listener
//! serves. Pure: bytes in, a reading out.

/// The HTTP/2 connection preface every gRPC client sends first.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// HTTP/1.x request methods, each followed by a space on the wire.
const HTTP1_METHODS: [&[u8]; 9] = [
    b"GET ",
    b"POST ",
    b"PUT ",
    b"HEAD ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
    b"TRACE ",
];

/// A TLS record of type handshake (22), then the record's major version (3 for SSL 3 to TLS 1.3).
const TLS_HANDSHAKE: [u8; 2] = [0x16, 0x03];

/// At most this much of an HTTP/1.x request line is kept for a log line.
const REQUEST_LINE_SHOWN: usize = 120;

/// What the first bytes of a connection say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spoken<'a> {
    /// The HTTP/2 preface, or as much of it as has arrived.
    Http2,
    /// An HTTP/1.x request; its request line, cut at [`REQUEST_LINE_SHOWN`] bytes.
    Http1 { request_line: &'a [u8] },
    /// The first record of a TLS handshake.
    Tls,
    /// Nothing yet, or bytes of no protocol told apart here (they are left to the server to refuse).
    Other,
}

/// Reads `head`, the first bytes a client sent (any number of them, none included).
pub(crate) fn spoken(head: &[u8]) -> Spoken<'_> {
    if head.is_empty() {
        return Spoken::Other;
    }
    let compared = head.len().min(HTTP2_PREFACE.len());
    if head[..compared] == HTTP2_PREFACE[..compared] {
        return Spoken::Http2;
    }
    let compared = head.len().min(TLS_HANDSHAKE.len());
    if head[..compared] == TLS_HANDSHAKE[..compared] {
        return Spoken::Tls;
    }
    if HTTP1_METHODS.iter().any(|method| head.starts_with(method)) {
        let end = memchr::memchr2(b'\r', b'\n', head).unwrap_or(head.len());
        return Spoken::Http1 {
            request_line: &head[..end.min(REQUEST_LINE_SHOWN)],
        };
    }
    Spoken::Other
}

/// A client that speaks another protocol than its listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// HTTP/1.x on a plaintext gRPC listener: an Envoy cluster without HTTP/2, or curl.
    Http1,
    /// A TLS handshake on a plaintext listener.
    TlsOnPlaintext,
    /// HTTP/2 or HTTP/1.x in plaintext on a TLS listener.
    PlaintextOnTls,
}

impl Mismatch {
    /// The value of the `protocol` label it is counted under.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mismatch::Http1 => "http1",
            Mismatch::TlsOnPlaintext => "tls",
            Mismatch::PlaintextOnTls => "plaintext",
        }
    }

    /// What the operator is told: what came, what it does to Envoy's calls, what to change.
    pub(crate) fn warning(self) -> &'static str {
        match self {
            Mismatch::Http1 => {
                "a client sent an HTTP/1.x request to the gRPC listener, which speaks HTTP/2 only \
                 (as gRPC does): give Envoy's rate-limit cluster \
                 HTTP/2: typed_extension_protocol_options: envoy.extensions.upstreams.http.v3.\
                 HttpProtocolOptions: explicit_http_config: http2_protocol_options: {}"
            }
            Mismatch::TlsOnPlaintext => {
                "a client began a TLS handshake on the gRPC listener, which serves plaintext: \
                 serve TLS here (GRPC_SERVER_USE_TLS=true with \
                 GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY) or take the TLS transport_socket off \
                 the client's cluster"
            }
            Mismatch::PlaintextOnTls => {
                "a client spoke plaintext to the gRPC listener, which serves TLS \
                 (GRPC_SERVER_USE_TLS): give the client's cluster a \
                 transport_socket envoy.transport_sockets.tls (an UpstreamTlsContext), or serve \
                 plaintext here"
            }
        }
    }

    /// The HTTP/1.1 response an HTTP/1.x client gets before the connection closes, so curl and
    /// Envoy's stats show a status and a reason instead of a protocol error; `None` for clients
    /// that would not read it.
    pub(crate) fn answer(self, spoken: Spoken<'_>) -> Option<&'static [u8]> {
        match (self, spoken) {
            (Mismatch::Http1, _) => Some(
                b"HTTP/1.1 505 HTTP Version Not Supported\r\n\
                  content-type: text/plain; charset=utf-8\r\n\
                  connection: close\r\n\
                  content-length: 112\r\n\r\n\
                  This is ratelimit-server's gRPC port. gRPC needs HTTP/2 and this request \
                  came as HTTP/1.x: send it with HTTP/2.\n",
            ),
            (Mismatch::PlaintextOnTls, Spoken::Http1 { .. }) => Some(
                b"HTTP/1.1 400 Bad Request\r\n\
                  content-type: text/plain; charset=utf-8\r\n\
                  connection: close\r\n\
                  content-length: 88\r\n\r\n\
                  This is ratelimit-server's gRPC port. It serves TLS and this request \
                  came in plaintext.\n",
            ),
            _ => None,
        }
    }
}

/// Whether a client that spoke `spoken` is at the wrong listener; `tls`: the listener serves TLS.
/// What is not told apart (`Spoken::Other`) is never a mismatch: the server refuses it as before.
pub(crate) fn mismatch(spoken: Spoken<'_>, tls: bool) -> Option<Mismatch> {
    match (spoken, tls) {
        (Spoken::Http1 { .. }, false) => Some(Mismatch::Http1),
        (Spoken::Tls, false) => Some(Mismatch::TlsOnPlaintext),
        (Spoken::Http1 { .. } | Spoken::Http2, true) => Some(Mismatch::PlaintextOnTls),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http2_preface_or_its_start_is_http2() {
        assert_eq!(spoken(HTTP2_PREFACE), Spoken::Http2);
        assert_eq!(spoken(b"PRI * HTT"), Spoken::Http2);
        let mut with_settings = HTTP2_PREFACE.to_vec();
        with_settings.extend_from_slice(&[0, 0, 18, 4, 0, 0, 0, 0, 0]);
        assert_eq!(spoken(&with_settings), Spoken::Http2);
    }

    #[test]
    fn an_http1_request_is_read_with_its_request_line() {
        let request =
            b"POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1\r\n\
                        host: ratelimit\r\n\r\n";
        assert_eq!(
            spoken(request),
            Spoken::Http1 {
                request_line:
                    b"POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1"
            }
        );
        assert!(
            matches!(spoken(b"GET / HTTP/1.0\n"), Spoken::Http1 { request_line } if request_line == b"GET / HTTP/1.0")
        );
        let long = [b"GET /".as_slice(), &[b'a'; 500]].concat();
        assert!(
            matches!(spoken(&long), Spoken::Http1 { request_line } if request_line.len() == REQUEST_LINE_SHOWN)
        );
    }

    #[test]
    fn a_tls_client_hello_is_tls() {
        assert_eq!(spoken(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]), Spoken::Tls);
        assert_eq!(spoken(&[0x16]), Spoken::Tls);
    }

    #[test]
    fn anything_else_is_other() {
        assert_eq!(spoken(b""), Spoken::Other);
        assert_eq!(spoken(b"PRI * HTTP/1.1"), Spoken::Other);
        assert_eq!(spoken(b"GETTING"), Spoken::Other);
        assert_eq!(spoken(b"\x00\x00\x12\x04"), Spoken::Other);
        assert_eq!(spoken(&[0x16, 0x01]), Spoken::Other);
        assert_eq!(spoken(b"SSH-2.0-OpenSSH_9.2\r\n"), Spoken::Other);
    }

    #[test]
    fn mismatches_depend_on_the_listener() {
        let http1 = Spoken::Http1 {
            request_line: b"GET / HTTP/1.1",
        };
        assert_eq!(mismatch(http1, false), Some(Mismatch::Http1));
        assert_eq!(mismatch(Spoken::Tls, false), Some(Mismatch::TlsOnPlaintext));
        assert_eq!(mismatch(Spoken::Http2, false), None);
        assert_eq!(mismatch(Spoken::Other, false), None);
        assert_eq!(mismatch(http1, true), Some(Mismatch::PlaintextOnTls));
        assert_eq!(
            mismatch(Spoken::Http2, true),
            Some(Mismatch::PlaintextOnTls)
        );
        assert_eq!(mismatch(Spoken::Tls, true), None);
        assert_eq!(mismatch(Spoken::Other, true), None);
    }

    #[test]
    fn answers_are_whole_http1_responses() {
        let http1 = Spoken::Http1 {
            request_line: b"GET / HTTP/1.1",
        };
        for (mismatch, spoken) in [(Mismatch::Http1, http1), (Mismatch::PlaintextOnTls, http1)] {
            let answer = std::str::from_utf8(mismatch.answer(spoken).unwrap()).unwrap();
            let (head, body) = answer.split_once("\r\n\r\n").unwrap();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(body.len(), length, "{answer}");
        }
        assert_eq!(Mismatch::PlaintextOnTls.answer(Spoken::Http2), None);
        assert_eq!(Mismatch::TlsOnPlaintext.answer(Spoken::Tls), None);
    }
}
