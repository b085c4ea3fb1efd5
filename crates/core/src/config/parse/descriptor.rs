//! Descriptor entries of a rules file: `key`, `value`, the limits, flags and nested descriptors,
//! and the duplicate key/value check at each level.

use std::collections::HashMap;

use super::Ctx;
use super::fields::{self, IntError, Level};
use super::rate_limit;
use crate::config::model::{DescriptorConfig, MAX_DESCRIPTOR_DEPTH, MetaValue};
use crate::config::yaml::{Node, NodeKind, ScalarKind};

/// A `descriptors` list (null or absent means empty) whose entries are at `depth` (1 for the
/// file's top-level list).
pub(super) fn list(ctx: &mut Ctx, node: &Node, depth: usize) -> Vec<DescriptorConfig> {
    let items = match &node.kind {
        NodeKind::Seq(items) => items,
        NodeKind::Scalar(_, ScalarKind::Null) => return Vec::new(),
        _ => {
            ctx.error(
                &node.location,
                format!("'descriptors' must be a list, found {}", node.describe()),
            );
            return Vec::new();
        }
    };
    if depth > MAX_DESCRIPTOR_DEPTH && !items.is_empty() {
        ctx.error(
            &node.location,
            format!(
                "descriptors nested deeper than {MAX_DESCRIPTOR_DEPTH} levels (a rule matches a \
                 request descriptor of exactly its depth, and those have at most \
                 {MAX_DESCRIPTOR_DEPTH} entries)"
            ),
        );
        return Vec::new();
    }
    let mut out = Vec::new();
    // (key, value) -> line of its first definition at this level.
    let mut seen: HashMap<(String, Option<String>), usize> = HashMap::new();
    for item in items {
        let Some(entries) = fields::mapping(ctx, "each entry of 'descriptors'", item) else {
            continue;
        };
        let Some(d) = descriptor(ctx, item, entries, depth) else {
            continue;
        };
        let id = (d.key.clone(), d.value.clone());
        if let Some(first) = seen.get(&id) {
            let what = match &d.value {
                Some(v) => format!("key '{}' and value '{v}'", d.key),
                None => format!("key '{}' and no value", d.key),
            };
            ctx.error(
                &d.location,
                format!(
                    "duplicate descriptor with {what} at this level (first defined at line \
                     {first}, again at line {})",
                    d.location.line
                ),
            );
            continue;
        }
        seen.insert(id, d.location.line);
        out.push(d);
    }
    out
}

/// One descriptor entry; `None` when its key or value is unusable (errors are recorded, and the
/// rest of the entry is still checked).
fn descriptor(
    ctx: &mut Ctx,
    node: &Node,
    entries: &[(Node, Node)],
    depth: usize,
) -> Option<DescriptorConfig> {
    let mut key = None;
    let mut seen_key = false;
    let mut value = None;
    let mut value_ok = true;
    let mut rate_limit_key: Option<&Node> = None;
    let mut rate_limit = None;
    let mut rate_limits_key: Option<&Node> = None;
    let mut shadow_mode = false;
    let mut quota_mode = false;
    let mut detailed_metric = false;
    let mut value_to_metric = false;
    let mut share_threshold: Option<&Node> = None;
    let mut metadata = None;
    let mut descriptors = Vec::new();
    for (k, v) in entries {
        let Some(name) = fields::field_name(ctx, k) else {
            continue;
        };
        match name {
            "key" => {
                seen_key = true;
                key = fields::non_empty_string(ctx, "key", v);
            }
            "value" => {
                value = descriptor_value(ctx, v);
                value_ok = value.is_some();
            }
            "rate_limit" => {
                rate_limit_key = Some(k);
                if let Some(spec) = rate_limit::single(ctx, v) {
                    rate_limit.get_or_insert(spec);
                }
            }
            "rate_limits" => {
                rate_limits_key = Some(k);
                if let Some(spec) = rate_limit::list(ctx, v) {
                    rate_limit.get_or_insert(spec);
                }
            }
            "shadow_mode" => shadow_mode = fields::boolean(ctx, "shadow_mode", v).unwrap_or(false),
            "detailed_metric" => {
                detailed_metric = fields::boolean(ctx, "detailed_metric", v).unwrap_or(false);
            }
            "quota_mode" => quota_mode = fields::boolean(ctx, "quota_mode", v).unwrap_or(false),
            "value_to_metric" => {
                value_to_metric = fields::boolean(ctx, "value_to_metric", v).unwrap_or(false);
            }
            "share_threshold" => {
                if fields::boolean(ctx, "share_threshold", v) == Some(true) {
                    share_threshold = Some(k);
                }
            }
            "metadata" => metadata = metadata_map(ctx, v),
            "descriptors" => descriptors = list(ctx, v, depth + 1),
            other => fields::unexpected_field(ctx, Level::Descriptor, other, k),
        }
    }
    if let (Some(_), Some(second)) = (rate_limit_key, rate_limits_key) {
        ctx.error(
            &second.location,
            "'rate_limit' and 'rate_limits' cannot both be given on one descriptor \
             (put every limit under rate_limits)",
        );
    }
    if !seen_key {
        ctx.error(&node.location, "descriptor is missing required field 'key'");
    }
    if !value_ok {
        return None;
    }
    if let Some(k) = share_threshold
        && !value.as_deref().is_some_and(|v| v.contains('*'))
    {
        ctx.error(
            &k.location,
            format!(
                "share_threshold can only be used with wildcard values (containing '*'), but \
                 found key '{}'{}",
                key.as_deref().unwrap_or(""),
                value
                    .as_deref()
                    .map_or(String::new(), |v| format!(" and value '{v}'"))
            ),
        );
    }
    Some(DescriptorConfig {
        key: key?,
        value,
        rate_limit,
        shadow_mode,
        quota_mode,
        detailed_metric,
        value_to_metric,
        share_threshold: share_threshold.is_some(),
        metadata,
        descriptors,
        location: node.location.clone(),
    })
}

/// `metadata`: a mapping of anything (returned to Envoy as a protobuf Struct).
fn metadata_map(ctx: &mut Ctx, node: &Node) -> Option<Vec<(String, MetaValue)>> {
    match meta_value(ctx, node)? {
        MetaValue::Map(entries) => Some(entries),
        MetaValue::Null => None,
        _ => {
            ctx.error(
                &node.location,
                format!("'metadata' must be a mapping, found {}", node.describe()),
            );
            None
        }
    }
}

fn meta_value(ctx: &mut Ctx, node: &Node) -> Option<MetaValue> {
    Some(match &node.kind {
        NodeKind::Scalar(_, ScalarKind::Null) => MetaValue::Null,
        NodeKind::Scalar(_, ScalarKind::Bool(b)) => MetaValue::Bool(*b),
        NodeKind::Scalar(text, ScalarKind::Int | ScalarKind::Float) => {
            MetaValue::Number(text.clone())
        }
        NodeKind::Scalar(text, ScalarKind::Str) => MetaValue::String(text.clone()),
        NodeKind::Seq(items) => MetaValue::List(
            items
                .iter()
                .map(|i| meta_value(ctx, i))
                .collect::<Option<_>>()?,
        ),
        NodeKind::Map(entries) => MetaValue::Map(
            entries
                .iter()
                .map(|(k, v)| {
                    let name = fields::field_name(ctx, k)?.to_owned();
                    Some((name, meta_value(ctx, v)?))
                })
                .collect::<Option<_>>()?,
        ),
    })
}

/// A descriptor `value`: a non-empty string, or an integer turned into its decimal text.
fn descriptor_value(ctx: &mut Ctx, node: &Node) -> Option<String> {
    match &node.kind {
        NodeKind::Scalar(text, ScalarKind::Str) if text.is_empty() => {
            ctx.error(
                &node.location,
                "'value' must not be empty (omit 'value' to match any value)",
            );
            None
        }
        NodeKind::Scalar(text, ScalarKind::Str) => Some(text.clone()),
        NodeKind::Scalar(text, ScalarKind::Int) => match fields::int_value(text) {
            Ok(v) => Some(v.to_string()),
            // Decimal digits beyond i128 are still their own decimal text.
            Err(IntError::TooLarge) if !text.contains(['x', 'o']) => {
                Some(text.trim_start_matches('+').to_string())
            }
            Err(e) => {
                ctx.error(&node.location, e.message("value", text));
                None
            }
        },
        _ => fields::string(ctx, "value", node),
    }
}
