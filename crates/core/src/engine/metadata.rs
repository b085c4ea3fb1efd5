//! The response's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`), built as the reference builds it:
//! `{domain, descriptors: [{entries: ["k=v", …], limit?, hitsAddend?}], hitsAddend?, metadata?}`,
//! where `metadata` merges the rules' `metadata` of the descriptors that passed (first value
//! wins; mappings merge recursively).

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::value::Kind as V;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use super::plan::{Kind, Plan};
use crate::config::MetaValue;

fn value(kind: V) -> Value {
    Value { kind: Some(kind) }
}

fn string(text: impl Into<String>) -> Value {
    value(V::StringValue(text.into()))
}

fn list(values: Vec<Value>) -> Value {
    value(V::ListValue(ListValue { values }))
}

/// A rules-file `metadata` value as a protobuf Value (numbers as doubles, as YAML → JSON would).
pub(super) fn meta(v: &MetaValue) -> Value {
    match v {
        MetaValue::Null => value(V::NullValue(0)),
        MetaValue::Bool(b) => value(V::BoolValue(*b)),
        MetaValue::Number(text) => text
            .parse::<f64>()
            .map_or_else(|_| string(text.clone()), |n| value(V::NumberValue(n))),
        MetaValue::String(s) => string(s.clone()),
        MetaValue::List(items) => list(items.iter().map(meta).collect()),
        MetaValue::Map(entries) => value(V::StructValue(meta_struct(entries))),
    }
}

fn meta_struct(entries: &[(String, MetaValue)]) -> Struct {
    Struct {
        fields: entries.iter().map(|(k, v)| (k.clone(), meta(v))).collect(),
    }
}

/// Adds `src`'s fields missing from `dest`; where both hold a mapping, merges them the same way.
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match (dest.fields.get_mut(k), &v.kind) {
            (None, _) => {
                dest.fields.insert(k.clone(), v.clone());
            }
            (
                Some(Value {
                    kind: Some(V::StructValue(d)),
                }),
                Some(V::StructValue(s)),
            ) => merge(d, s),
            _ => {}
        }
    }
}

pub(super) fn build(
    request: &RateLimitRequest,
    plans: &[Plan<'_>],
    statuses: &[DescriptorStatus],
) -> Struct {
    let mut fields = std::collections::HashMap::new();
    fields.insert("domain".to_owned(), string(request.domain.clone()));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut f = std::collections::HashMap::new();
            f.insert(
                "entries".to_owned(),
                list(
                    d.entries
                        .iter()
                        .map(|e| string(format!("{}={}", e.key, e.value)))
                        .collect(),
                ),
            );
            if let Some(limit) = &d.limit {
                let unit =
                    RateLimitUnit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
                f.insert(
                    "limit".to_owned(),
                    string(format!(
                        "requests_per_unit:{} unit:{unit}",
                        limit.requests_per_unit
                    )),
                );
            }
            if let Some(h) = &d.hits_addend {
                f.insert(
                    "hitsAddend".to_owned(),
                    value(V::NumberValue(h.value as f64)),
                );
            }
            value(V::StructValue(Struct { fields: f }))
        })
        .collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            value(V::NumberValue(f64::from(request.hits_addend))),
        );
    }
    // Passed: limited (not unlimited, not replaced) and not over the limit.
    let mut merged = Struct::default();
    for (plan, status) in plans.iter().zip(statuses) {
        if status.code == Code::OverLimit as i32 || !matches!(plan.kind, Kind::Limited(_)) {
            continue;
        }
        if let Some(m) = plan.rule.and_then(|r| r.metadata.as_deref()) {
            merge(&mut merged, &meta_struct(m));
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_owned(), value(V::StructValue(merged)));
    }
    Struct { fields }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(fields: &[(&str, Value)]) -> Struct {
        Struct {
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn first_value_wins_and_mappings_merge() {
        let mut dest = s(&[
            ("name", string("service_2")),
            ("nested", value(V::StructValue(s(&[("a", string("1"))])))),
        ]);
        let src = s(&[
            ("name", string("service_3")),
            ("other", string("x")),
            (
                "nested",
                value(V::StructValue(s(&[("a", string("2")), ("b", string("3"))]))),
            ),
        ]);
        merge(&mut dest, &src);
        assert_eq!(
            dest,
            s(&[
                ("name", string("service_2")),
                ("other", string("x")),
                (
                    "nested",
                    value(V::StructValue(s(&[("a", string("1")), ("b", string("3"))])))
                ),
            ])
        );
    }

    #[test]
    fn numbers_become_doubles() {
        assert_eq!(
            meta(&MetaValue::Number("2.5".into())),
            value(V::NumberValue(2.5))
        );
        assert_eq!(
            meta(&MetaValue::Number("0x10".into())),
            string("0x10"),
            "kept as written when it is not a plain number"
        );
    }
}
