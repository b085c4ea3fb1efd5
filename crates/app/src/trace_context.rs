//! The trace a call belongs to, read from its headers (gRPC metadata, or the `/json` request's):
//! W3C `traceparent` (with `tracestate`), as Envoy's OpenTelemetry tracer sends it, else B3
//! (`x-b3-traceid`/`x-b3-spanid`/`x-b3-sampled`, or the single `b3`), as its Zipkin tracer does.
//! opentelemetry's own propagators parse them (`TraceContextPropagator`, and
//! opentelemetry-zipkin's B3 `Propagator`); nothing valid found: a new trace, as before.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::codegen::http::HeaderMap;

/// Headers as the propagators read them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Reads the parent span a call's headers name.
#[derive(Debug, Clone, Default)]
pub(crate) struct TraceContext {
    w3c: TraceContextPropagator,
    b3: opentelemetry_zipkin::Propagator,
}

impl TraceContext {
    /// The context whose span is the call's parent: from `traceparent` if it holds a valid one,
    /// else from B3; `None` when neither does.
    pub(crate) fn parent(&self, headers: &HeaderMap) -> Option<Context> {
        let headers = Headers(headers);
        let empty = Context::new();
        [
            &self.w3c as &dyn TextMapPropagator,
            &self.b3 as &dyn TextMapPropagator,
        ]
        .into_iter()
        .map(|p| p.extract_with_context(&empty, &headers))
        .find(|cx| cx.span().span_context().is_valid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceId};
    use tonic::codegen::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_static(v));
        }
        map
    }

    /// (trace id, span id, sampled) of the parent read from `pairs`.
    fn parent(pairs: &[(&'static str, &'static str)]) -> Option<(TraceId, SpanId, bool)> {
        let cx = TraceContext::default().parent(&headers(pairs))?;
        let span = cx.span();
        let sc = span.span_context();
        assert!(sc.is_remote());
        Some((sc.trace_id(), sc.span_id(), sc.is_sampled()))
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    fn ids() -> (TraceId, SpanId) {
        (
            TraceId::from_hex(TRACE).unwrap(),
            SpanId::from_hex(SPAN).unwrap(),
        )
    }

    #[test]
    fn w3c_traceparent_names_the_parent() {
        let (t, s) = ids();
        assert_eq!(
            parent(&[(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            )]),
            Some((t, s, true))
        );
        assert_eq!(
            parent(&[(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
            )]),
            Some((t, s, false)),
            "not sampled upstream"
        );
    }

    #[test]
    fn b3_multiple_and_single_headers_name_the_parent() {
        let (t, s) = ids();
        assert_eq!(
            parent(&[
                ("x-b3-traceid", TRACE),
                ("x-b3-spanid", SPAN),
                ("x-b3-sampled", "1"),
            ]),
            Some((t, s, true))
        );
        assert_eq!(
            parent(&[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1")]),
            Some((t, s, true))
        );
        // A 64-bit B3 trace id is the low half of a 128-bit one.
        let (t64, _, _) = parent(&[
            ("x-b3-traceid", "a3ce929d0e0e4736"),
            ("x-b3-spanid", SPAN),
            ("x-b3-sampled", "1"),
        ])
        .unwrap();
        assert_eq!(
            t64,
            TraceId::from_hex("0000000000000000a3ce929d0e0e4736").unwrap()
        );
    }

    #[test]
    fn traceparent_wins_over_b3_and_garbage_is_no_parent() {
        let (t, s) = ids();
        assert_eq!(
            parent(&[
                (
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                ),
                ("x-b3-traceid", "11111111111111111111111111111111"),
                ("x-b3-spanid", "2222222222222222"),
            ]),
            Some((t, s, true))
        );
        // An invalid traceparent falls back to B3.
        let b3 = parent(&[
            ("traceparent", "00-zz-00f067aa0ba902b7-01"),
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", SPAN),
        ]);
        assert_eq!(b3.map(|(t, s, _)| (t, s)), Some((t, s)));
        for garbage in [
            &[(
                "traceparent",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            )][..],
            &[("traceparent", "not a traceparent")],
            &[("b3", "nonsense")],
            &[("x-b3-traceid", TRACE)],
            &[],
        ] {
            assert_eq!(parent(garbage), None, "{garbage:?}");
        }
    }
}
