//! OpenTelemetry tracing: the real server exports a span per ShouldRateLimit over OTLP/gRPC to an
//! in-process collector (opentelemetry-proto's TraceService), with the domain, descriptor count
//! and overall code, the gRPC code of a refused call, and no descriptor values unless asked; a
//! call that carries a W3C `traceparent` or B3 headers gets a span in that trace, child of the
//! span they name; exports counted as taken or lost. The collector serves `envoy_e2e::tracing`
//! too.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::metrics::{count, scrape};
use common::wait::eventually;
use common::{Code, code, request, start_with};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio_stream::wrappers::TcpListenerStream;

/// One received span: its name, attributes as text, status code, and the resource's service name.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) name: String,
    /// Ids in lower-case hex; `parent_span_id` empty for a root span.
    pub(crate) trace_id: String,
    pub(crate) span_id: String,
    pub(crate) parent_span_id: String,
    attributes: HashMap<String, String>,
    error: bool,
    pub(crate) service_name: String,
    /// The resource's other attributes, as text.
    resource: HashMap<String, String>,
}

#[derive(Clone, Default)]
pub(crate) struct Collector {
    pub(crate) spans: Arc<Mutex<Vec<Received>>>,
    api_keys: Arc<Mutex<Vec<String>>>,
    /// Answer every export `UNAVAILABLE`, taking nothing.
    refuse: Arc<AtomicBool>,
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        if self.refuse.load(Ordering::Relaxed) {
            return Err(tonic::Status::unavailable("the collector is full"));
        }
        if let Some(key) = request.metadata().get("api-key") {
            self.api_keys
                .lock()
                .unwrap()
                .push(key.to_str().unwrap().to_owned());
        }
        let mut spans = self.spans.lock().unwrap();
        for resource in &request.get_ref().resource_spans {
            let service_name = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .map(|a| text(a.value.as_ref()))
                .unwrap_or_default();
            let attributes: HashMap<String, String> = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .map(|a| (a.key.clone(), text(a.value.as_ref())))
                .collect();
            for scope in &resource.scope_spans {
                for span in &scope.spans {
                    spans.push(Received {
                        name: span.name.clone(),
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|a| (a.key.clone(), text(a.value.as_ref())))
                            .collect(),
                        error: span.status.as_ref().is_some_and(|s| s.code == 2),
                        service_name: service_name.clone(),
                        resource: attributes.clone(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A collector on a free port, and its endpoint (`http://127.0.0.1:port`).
pub(crate) async fn collector() -> (Collector, String) {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (collector, format!("http://{addr}"))
}

const RULES: &str =
    "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_per_call_with_domain_count_and_code_and_no_values() {
    let (collector, endpoint) = collector().await;
    let mut s = start_with(&[("t.yaml", RULES)], move |settings| {
        settings.tracing.tracing_enabled = true;
        settings.tracing.tracing_service_name = "rls-test".into();
        settings.tracing.tracing_service_namespace = Some("envoy-gateway-system".into());
        settings.tracing.tracing_service_instance_id = Some("envoy-ratelimit-7d9f".into());
        settings.tracing.otel_exporter_otlp_endpoint = endpoint;
        settings.tracing.otel_exporter_otlp_headers = "api-key=s3cret".into();
    })
    .await;
    let ok = s.call(request("t", &[&[("user", "alice-secret")]])).await;
    assert_eq!(code(ok.overall_code), Code::Ok);
    let over = s
        .call(request(
            "t",
            &[&[("user", "alice-secret")], &[("other", "bob")]],
        ))
        .await;
    assert_eq!(code(over.overall_code), Code::OverLimit);
    let refused = s.call_err(request("", &[&[("user", "x")]])).await;
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    // Shutting down flushes the batch processor: every span has arrived when it returns.
    s.server.shutdown().await;

    let spans = collector.spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    for span in &spans {
        assert_eq!(
            span.name,
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        );
        assert_eq!(span.service_name, "rls-test");
        assert_eq!(span.resource["service.namespace"], "envoy-gateway-system");
        assert_eq!(span.resource["service.instance.id"], "envoy-ratelimit-7d9f");
        assert_eq!(span.attributes["rpc.method"], "ShouldRateLimit");
        let all = format!("{:?}", span.attributes);
        assert!(
            !all.contains("alice-secret") && !all.contains("bob"),
            "descriptor values recorded: {all}"
        );
    }
    let a = &spans[0].attributes;
    assert_eq!(a["ratelimit.domain"], "t");
    assert_eq!(a["ratelimit.descriptor_count"], "1");
    assert_eq!(a["ratelimit.overall_code"], "OK");
    assert_eq!(a["rpc.grpc.status_code"], "0");
    assert!(!spans[0].error);
    let b = &spans[1].attributes;
    assert_eq!(b["ratelimit.descriptor_count"], "2");
    assert_eq!(b["ratelimit.overall_code"], "OVER_LIMIT");
    let c = &spans[2].attributes;
    assert_eq!(c["rpc.grpc.status_code"], "3", "INVALID_ARGUMENT");
    assert!(!c.contains_key("ratelimit.overall_code"));
    assert!(spans[2].error);
    assert!(
        collector
            .api_keys
            .lock()
            .unwrap()
            .iter()
            .all(|k| k == "s3cret")
            && !collector.api_keys.lock().unwrap().is_empty(),
        "OTEL_EXPORTER_OTLP_HEADERS sent with each export"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_are_recorded_only_when_asked() {
    let (collector, endpoint) = collector().await;
    let mut s = start_with(&[("t.yaml", RULES)], move |settings| {
        settings.tracing.tracing_enabled = true;
        settings.tracing.tracing_record_values = true;
        settings.tracing.otel_exporter_otlp_endpoint = endpoint;
    })
    .await;
    s.call(request(
        "t",
        &[&[("user", "alice"), ("plan", "free")], &[("k", "v")]],
    ))
    .await;
    s.server.shutdown().await;
    let spans = collector.spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let a = &spans[0].attributes;
    assert_eq!(a["ratelimit.descriptor.0"], "user=alice,plan=free");
    assert_eq!(a["ratelimit.descriptor.1"], "k=v");
    assert_eq!(spans[0].service_name, "RateLimit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_rate_zero_exports_nothing() {
    let (collector, endpoint) = collector().await;
    let mut s = start_with(&[("t.yaml", RULES)], move |settings| {
        settings.tracing.tracing_enabled = true;
        settings.tracing.tracing_sampling_rate = 0.0;
        settings.tracing.otel_exporter_otlp_endpoint = endpoint;
    })
    .await;
    s.call(request("t", &[&[("user", "a")]])).await;
    s.server.shutdown().await;
    assert!(collector.spans.lock().unwrap().is_empty());
}

/// Each export is counted by its outcome: the spans a collector took, and those lost when it
/// refused them (the SDK, built without its internal logs, says nothing of them itself; the
/// server also warns, at most once a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_counted_taken_or_lost() {
    for refuse in [false, true] {
        let (collector, endpoint) = collector().await;
        collector.refuse.store(refuse, Ordering::Relaxed);
        let mut s = start_with(&[("t.yaml", RULES)], move |settings| {
            settings.tracing.tracing_enabled = true;
            settings.tracing.otel_exporter_otlp_endpoint = endpoint;
        })
        .await;
        for user in ["a", "b", "c"] {
            s.call(request("t", &[&[("user", user)]])).await;
        }
        let metrics = s.http("/metrics");
        let (counted, other) = if refuse {
            (
                "ratelimit_tracing_spans_failed_total",
                "ratelimit_tracing_spans_exported_total",
            )
        } else {
            (
                "ratelimit_tracing_spans_exported_total",
                "ratelimit_tracing_spans_failed_total",
            )
        };
        // The batch processor exports on its schedule (every 5 s).
        eventually(counted, || async {
            count(&scrape(&metrics).await, counted) == 3
        })
        .await;
        assert_eq!(count(&scrape(&metrics).await, other), 0);
        assert_eq!(
            collector.spans.lock().unwrap().len(),
            if refuse { 0 } else { 3 }
        );
        s.server.shutdown().await;
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// A call's span joins the trace its metadata names: W3C `traceparent`, or B3 (several headers or
/// the single `b3`), the parent being the span they name; without them it is a root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_names_its_trace_gets_a_child_span_in_it() {
    let (collector, endpoint) = collector().await;
    let mut s = start_with(&[("t.yaml", RULES)], move |settings| {
        settings.tracing.tracing_enabled = true;
        settings.tracing.otel_exporter_otlp_endpoint = endpoint;
    })
    .await;
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let b3_single = format!("{TRACE}-{PARENT}-1");
    let carriers: [&[(&str, &str)]; 4] = [
        &[("traceparent", &traceparent)],
        &[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", PARENT),
            ("x-b3-sampled", "1"),
        ],
        &[("b3", &b3_single)],
        &[],
    ];
    for carrier in carriers {
        let mut call = tonic::Request::new(request("t", &[&[("user", "a")]]));
        for (k, v) in carrier {
            call.metadata_mut().insert(*k, v.parse().unwrap());
        }
        s.client.should_rate_limit(call).await.unwrap();
    }
    s.server.shutdown().await;
    let spans = collector.spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 4, "{spans:#?}");
    for (span, carrier) in spans[..3].iter().zip(["traceparent", "b3 headers", "b3"]) {
        assert_eq!(
            (span.trace_id.as_str(), span.parent_span_id.as_str()),
            (TRACE, PARENT),
            "{carrier}: {span:#?}"
        );
        assert_ne!(span.span_id, PARENT);
    }
    assert_ne!(spans[3].trace_id, TRACE, "{:#?}", spans[3]);
    assert_eq!(spans[3].parent_span_id, "", "a root: {:#?}", spans[3]);
}
