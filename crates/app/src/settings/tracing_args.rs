//! Tracing settings: the reference's TRACING_* and the OpenTelemetry OTLP exporter's standard
//! OTEL_EXPORTER_OTLP_* variables, each also a flag. Each value is checked as it is parsed, so a
//! bad one stops the start with an error naming the setting; the endpoint and the headers, which
//! may hold secrets, are checked once tracing is on (`config`), where the error can leave them out.

use clap::{ArgAction, Args};

use super::SettingError;
use crate::telemetry::TracingConfig;

/// The OTLP transport: only gRPC is built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
}

pub(super) fn parse_protocol(text: &str) -> Result<OtlpProtocol, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "grpc" => Ok(OtlpProtocol::Grpc),
        "http/protobuf" | "http/json" | "http" => Err(format!(
            "'{text}' is not supported: spans are exported over OTLP/gRPC only (use grpc and the \
             collector's gRPC port, 4317 by default)"
        )),
        _ => Err(format!("'{text}' is not an OTLP protocol (expected grpc)")),
    }
}

/// An `http://` or `https://` URL with a host, as the OTLP/gRPC exporter needs.
pub(super) fn parse_endpoint(text: &str) -> Result<String, String> {
    let text = text.trim();
    // As messages show it: a password in the URL is never repeated.
    let shown = ratelimit_core::redact::credentials(text);
    let uri: tonic::codegen::http::Uri = text
        .parse()
        .map_err(|e| format!("'{shown}' is not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(text.to_owned()),
        _ => Err(format!(
            "'{shown}' must be an http:// or https:// URL with a host (e.g. http://collector:4317)"
        )),
    }
}

/// `key1=value1,key2=value2`, values percent-decoded, as the OpenTelemetry specification writes
/// OTEL_EXPORTER_OTLP_HEADERS.
pub(super) fn parse_headers(text: &str) -> Result<Headers, String> {
    let mut headers = Vec::new();
    for (n, pair) in text
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .enumerate()
    {
        // A header's value is often a token: messages name the header, never its value.
        let (name, value) = pair.split_once('=').ok_or_else(|| {
            format!(
                "header #{} is not key=value (its text is not repeated: it may be a secret)",
                n + 1
            )
        })?;
        let name = name.trim();
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|e| format!("the value of '{name}' is not UTF-8: {e}"))?;
        let valid_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid_name {
            return Err(format!("'{name}' is not a header name"));
        }
        if value.chars().any(|c| c.is_control()) {
            return Err(format!("the value of '{name}' has a control character"));
        }
        headers.push((name.to_owned(), value.into_owned()));
    }
    Ok(Headers(headers))
}

/// Parsed OTEL_EXPORTER_OTLP_HEADERS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Headers(pub Vec<(String, String)>);

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{text}' is not a sampling rate between 0 and 1")),
    }
}

/// OpenTelemetry tracing of ShouldRateLimit calls.
#[derive(Debug, Clone, Args)]
pub struct TracingArgs {
    /// Export an OpenTelemetry span per ShouldRateLimit call over OTLP/gRPC (the reference's
    /// TRACING_ENABLED).
    #[arg(long, env = "TRACING_ENABLED", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub tracing_enabled: bool,
    /// The spans' `service.name`.
    #[arg(long, env = "TRACING_SERVICE_NAME", default_value = "RateLimit")]
    pub tracing_service_name: String,
    /// The spans' `service.namespace` (Envoy Gateway sets its namespace).
    #[arg(long, env = "TRACING_SERVICE_NAMESPACE")]
    pub tracing_service_namespace: Option<String>,
    /// The spans' `service.instance.id` (Envoy Gateway sets the pod's name).
    #[arg(long, env = "TRACING_SERVICE_INSTANCE_ID")]
    pub tracing_service_instance_id: Option<String>,
    /// Share of traces sampled, 0 to 1 (a call whose parent is sampled is sampled too).
    #[arg(long, env = "TRACING_SAMPLING_RATE", default_value_t = 1.0, value_parser = parse_rate)]
    pub tracing_sampling_rate: f64,
    /// Also record each descriptor's entries (`key=value`) on the span; off by default, as
    /// values are often user identifiers.
    #[arg(long, env = "TRACING_RECORD_VALUES", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub tracing_record_values: bool,
    /// The collector's OTLP/gRPC endpoint. Checked in `config`, not by clap, whose errors
    /// repeat the value (a URL may carry a password).
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        default_value = "http://localhost:4317",
        hide_env_values = true
    )]
    pub otel_exporter_otlp_endpoint: String,
    /// The OTLP transport: `grpc` (the only one built in).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL", default_value = "grpc", value_parser = parse_protocol)]
    pub otel_exporter_otlp_protocol: OtlpProtocol,
    /// Headers sent with each export: `key1=value1,key2=value2` (values percent-encoded).
    /// Checked in `config`, not by clap, whose errors repeat the value (often a token).
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_HEADERS",
        default_value = "",
        hide_env_values = true
    )]
    pub otel_exporter_otlp_headers: String,
}

impl TracingArgs {
    /// What to trace with, when tracing is on; a bad endpoint or header is an error naming the
    /// setting, and never repeating a password or a header's value.
    pub fn config(&self) -> Result<Option<TracingConfig>, SettingError> {
        if !self.tracing_enabled {
            return Ok(None);
        }
        let endpoint =
            parse_endpoint(&self.otel_exporter_otlp_endpoint).map_err(|message| SettingError {
                setting: "OTEL_EXPORTER_OTLP_ENDPOINT",
                message,
            })?;
        let headers =
            parse_headers(&self.otel_exporter_otlp_headers).map_err(|message| SettingError {
                setting: "OTEL_EXPORTER_OTLP_HEADERS",
                message,
            })?;
        Ok(Some(TracingConfig {
            service_name: self.tracing_service_name.clone(),
            service_namespace: self
                .tracing_service_namespace
                .clone()
                .filter(|n| !n.is_empty()),
            service_instance_id: self
                .tracing_service_instance_id
                .clone()
                .filter(|n| !n.is_empty()),
            sampling_rate: self.tracing_sampling_rate,
            endpoint,
            headers: headers.0,
            record_values: self.tracing_record_values,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked() {
        assert_eq!(parse_protocol("grpc"), Ok(OtlpProtocol::Grpc));
        assert!(
            parse_protocol("http/protobuf")
                .unwrap_err()
                .contains("not supported")
        );
        assert!(parse_protocol("udp").is_err());
        assert_eq!(
            parse_endpoint("http://collector:4317").as_deref(),
            Ok("http://collector:4317")
        );
        assert!(parse_endpoint("collector:4317").is_err());
        assert!(parse_endpoint("ftp://c").is_err());
        assert_eq!(
            parse_headers("api-key=a%20b, x-tenant=t1").unwrap().0,
            [
                ("api-key".to_owned(), "a b".to_owned()),
                ("x-tenant".to_owned(), "t1".to_owned())
            ]
        );
        assert_eq!(parse_headers("").unwrap(), Headers::default());
        assert!(parse_headers("novalue").is_err());
        assert!(parse_headers("bad name=v").is_err());
        assert_eq!(parse_rate("0.25"), Ok(0.25));
        assert!(parse_rate("2").is_err() && parse_rate("x").is_err());
    }

    #[test]
    fn a_bad_value_is_an_error_naming_the_setting() {
        use clap::Parser;
        #[derive(Parser, Debug)]
        struct Wrapper {
            #[command(flatten)]
            tracing: TracingArgs,
        }
        for (flag, value, name) in [
            ("--tracing-sampling-rate", "1.5", "TRACING_SAMPLING_RATE"),
            (
                "--otel-exporter-otlp-protocol",
                "http/protobuf",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
        ] {
            let e = Wrapper::try_parse_from(["x", flag, value]).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
        // Checked once tracing is on, naming the setting and not repeating the secret.
        for (flag, value, name) in [
            (
                "--otel-exporter-otlp-endpoint",
                "ftp://u:s3cret@collector",
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                "--otel-exporter-otlp-headers",
                "authorization Bearer s3cret",
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
        ] {
            let w = Wrapper::try_parse_from(["x", "--tracing-enabled", flag, value]).unwrap();
            let e = w.tracing.config().unwrap_err();
            assert_eq!(e.setting, name);
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
        let w = Wrapper::try_parse_from(["x", "--tracing-enabled"]).unwrap();
        let config = w.tracing.config().unwrap().unwrap();
        assert_eq!(config.endpoint, "http://localhost:4317");
        assert_eq!((config.sampling_rate, config.record_values), (1.0, false));
        assert_eq!(config.service_name, "RateLimit");
        let off = Wrapper::try_parse_from(["x"]).unwrap();
        assert!(off.tracing.config().unwrap().is_none());
    }
}
