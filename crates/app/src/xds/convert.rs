//! `RateLimitConfig` resources (protobuf, from xDS) → rules documents (YAML text) that the rules
//! validator reads as it reads files, and its errors back to the resource and field they are
//! about. Pure: bytes in, text or messages out.
//!
//! Rendering rather than building the model directly keeps one validator for both sources: an
//! xDS resource is accepted exactly when the same rules written in a file would be. Every field
//! is rendered on its own line, and the line's field path (`descriptors[0].rate_limit.unit`) is
//! kept, so an error's line names the field.

use std::fmt::Write as _;
use std::path::PathBuf;

use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;

use ratelimit_core::config::{ConfigError, ConfigErrors};

/// The type URL of the resources the rules come in.
pub(super) const TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Deepest descriptor nesting rendered; deeper is refused before rendering (the validator would
/// refuse it too, past its own depth limit).
const MAX_DEPTH: usize = 64;

/// One resource as a rules document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Document {
    /// `xds:RateLimitConfig/<name>`: the "file" of the validator's messages.
    pub(crate) path: PathBuf,
    pub(crate) text: String,
    /// The resource's name, as the management server gave it.
    pub(crate) name: String,
    /// Per line (0-based), the field path written on it.
    fields: Vec<String>,
}

/// The field a 1-based line of `doc` holds, when the line is in the document.
fn field_at(doc: &Document, line: usize) -> Option<&str> {
    line.checked_sub(1)
        .and_then(|i| doc.fields.get(i))
        .map(String::as_str)
}

/// A YAML double-quoted scalar (JSON's escapes are YAML's).
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// A protobuf `Value` as JSON (a YAML flow node); non-finite numbers become null.
fn json(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::ListValue(l)) => serde_json::Value::Array(l.values.iter().map(json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}

fn struct_json(s: &Struct) -> serde_json::Value {
    let mut fields: Vec<_> = s.fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    serde_json::Value::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.clone(), json(v)))
            .collect(),
    )
}

/// Writes lines, remembering each line's field path.
#[derive(Default)]
struct Writer {
    text: String,
    fields: Vec<String>,
}

impl Writer {
    fn line(&mut self, indent: usize, text: &str, field: String) {
        let _ = writeln!(self.text, "{:indent$}{text}", "");
        self.fields.push(field);
    }
}

/// The unit as the rules files spell it; an unknown number keeps its number (and is refused).
fn unit_name(unit: i32) -> String {
    match RateLimitUnit::try_from(unit) {
        Ok(u) => u.as_str_name().to_owned(),
        Err(_) => unit.to_string(),
    }
}

fn policy(w: &mut Writer, indent: usize, path: &str, p: &RateLimitPolicy) {
    let field = |name: &str| format!("{path}.{name}");
    // The reference's loader: an unlimited limit has no unit (UNKNOWN, the default, is none).
    if !(p.unlimited && p.unit == RateLimitUnit::Unknown as i32) {
        let line = format!("unit: {}", quoted(&unit_name(p.unit)));
        w.line(indent, &line, field("unit"));
    }
    if !(p.unlimited && p.requests_per_unit == 0) {
        let line = format!("requests_per_unit: {}", p.requests_per_unit);
        w.line(indent, &line, field("requests_per_unit"));
    }
    if p.unlimited {
        w.line(indent, "unlimited: true", field("unlimited"));
    }
    if !p.name.is_empty() {
        w.line(indent, &format!("name: {}", quoted(&p.name)), field("name"));
    }
    if !p.replaces.is_empty() {
        w.line(indent, "replaces:", field("replaces"));
        for (i, r) in p.replaces.iter().enumerate() {
            let line = format!("- name: {}", quoted(&r.name));
            w.line(indent + 2, &line, format!("{path}.replaces[{i}].name"));
        }
    }
}

fn descriptors(w: &mut Writer, indent: usize, path: &str, list: &[RateLimitDescriptor]) {
    for (i, d) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let field = |name: &str| format!("{at}.{name}");
        w.line(indent, &format!("- key: {}", quoted(&d.key)), field("key"));
        let inner = indent + 2;
        // Protobuf has no absent string: an empty value is the reference's "any value".
        if !d.value.is_empty() {
            let line = format!("value: {}", quoted(&d.value));
            w.line(inner, &line, field("value"));
        }
        if let Some(p) = &d.rate_limit {
            w.line(inner, "rate_limit:", field("rate_limit"));
            policy(w, inner + 2, &field("rate_limit"), p);
        }
        for (set, name) in [
            (d.shadow_mode, "shadow_mode"),
            (d.detailed_metric, "detailed_metric"),
            (d.quota_mode, "quota_mode"),
        ] {
            if set {
                w.line(inner, &format!("{name}: true"), field(name));
            }
        }
        if let Some(m) = &d.metadata {
            let line = format!("metadata: {}", struct_json(m));
            w.line(inner, &line, field("metadata"));
        }
        if !d.descriptors.is_empty() {
            w.line(inner, "descriptors:", field("descriptors"));
            descriptors(w, inner + 2, &field("descriptors"), &d.descriptors);
        }
    }
}

fn depth(list: &[RateLimitDescriptor]) -> usize {
    let mut deepest = 0;
    let mut level: Vec<&RateLimitDescriptor> = list.iter().collect();
    while !level.is_empty() && deepest <= MAX_DEPTH {
        deepest += 1;
        level = level.iter().flat_map(|d| &d.descriptors).collect();
    }
    deepest
}

/// One resource's rules as a document.
pub(super) fn render(config: &RateLimitConfig) -> Document {
    let mut w = Writer::default();
    w.line(
        0,
        &format!("domain: {}", quoted(&config.domain)),
        "domain".into(),
    );
    if config.descriptors.is_empty() {
        w.line(0, "descriptors: []", "descriptors".into());
    } else {
        w.line(0, "descriptors:", "descriptors".into());
        descriptors(&mut w, 2, "descriptors", &config.descriptors);
    }
    Document {
        path: PathBuf::from(format!("xds:RateLimitConfig/{}", config.name)),
        text: w.text,
        name: config.name.clone(),
        fields: w.fields,
    }
}

/// A response's resources as documents, or why one cannot be read (a message per resource,
/// naming it by position and, when known, name).
pub(super) fn decode(resources: &[Any]) -> Result<Vec<Document>, Vec<String>> {
    let mut documents = Vec::with_capacity(resources.len());
    let mut errors = Vec::new();
    for (i, any) in resources.iter().enumerate() {
        if any.type_url != TYPE_URL {
            errors.push(format!(
                "resource #{i}: type '{}' is not {TYPE_URL}",
                any.type_url
            ));
            continue;
        }
        let config = match RateLimitConfig::decode(any.value.as_slice()) {
            Ok(c) => c,
            Err(e) => {
                // prost names every enclosing field; the innermost cause is the news.
                let text = e.to_string();
                let cause = text.rsplit(": ").next().unwrap_or(&text);
                errors.push(format!("resource #{i}: not a RateLimitConfig: {cause}"));
                continue;
            }
        };
        if depth(&config.descriptors) > MAX_DEPTH {
            errors.push(format!(
                "RateLimitConfig '{}': descriptors nested deeper than {MAX_DEPTH} levels",
                config.name
            ));
            continue;
        }
        documents.push(render(&config));
    }
    if errors.is_empty() {
        Ok(documents)
    } else {
        Err(errors)
    }
}

/// One validation error, told in terms of the resource and field: `RateLimitConfig 'name'
/// (domain 'd'): descriptors[0].rate_limit.unit: invalid rate limit unit …`.
fn describe(error: &ConfigError, documents: &[Document]) -> String {
    let Some(doc) = documents.iter().find(|d| d.path == error.file) else {
        return error.to_string();
    };
    let field = error
        .location
        .as_ref()
        .and_then(|l| field_at(doc, l.line))
        .map(|f| {
            // "missing …" is reported on the mapping: the field's parent.
            if error.message.contains("missing") {
                f.rsplit_once('.').map_or("", |(parent, _)| parent)
            } else {
                f
            }
        })
        .filter(|f| !f.is_empty());
    let message = shorten(&error.message, documents);
    match field {
        Some(f) => format!("RateLimitConfig '{}': {f}: {message}", doc.name),
        None => format!("RateLimitConfig '{}': {message}", doc.name),
    }
}

/// A message that names another document's path and line names its resource instead.
fn shorten(message: &str, documents: &[Document]) -> String {
    let mut out = message.to_owned();
    for doc in documents {
        // The validator writes `<path>:<line>:<column>`: the path must be followed by its `:`
        // (so one resource's name that prefixes another's is not taken for it).
        let path = format!("{}:", doc.path.display());
        if let Some(start) = out.find(&path) {
            let rest = &out[start + path.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == ':'))
                .unwrap_or(rest.len());
            let named = format!("RateLimitConfig '{}'", doc.name);
            out.replace_range(start..start + path.len() + end, &named);
        }
    }
    out
}

/// Every validation error as [`describe`] tells it.
pub(super) fn describe_all(errors: &ConfigErrors, documents: &[Document]) -> Vec<String> {
    errors.0.iter().map(|e| describe(e, documents)).collect()
}

/// The documents as the reloader takes them.
pub(super) fn texts(documents: &[Document]) -> Vec<(PathBuf, String)> {
    documents
        .iter()
        .map(|d| (d.path.clone(), d.text.clone()))
        .collect()
}

#[cfg(test)]
mod tests;
