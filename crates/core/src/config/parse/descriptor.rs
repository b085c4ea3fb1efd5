//! Descriptor entries of a rules file: `key`, `value`, the limits, flags and nested descriptors,
//! and the duplicate key/value check at each level.

use std::collections::HashMap;

use super::Ctx;
use super::fields::{self, Level};
use super::{concurrency, rate_limit};
use crate::config::model::{
    ConcurrencySpec, DescriptorConfig, MAX_DESCRIPTOR_DEPTH, MetaValue, RateLimitSpec,
};
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
    let fields = DescriptorFields::read(ctx, entries, depth);
    fields.check_limits_and_key(ctx, node);
    if !fields.value_ok {
        return None;
    }
    fields.check_share_threshold(ctx);
    fields.check_concurrency(ctx);
    Some(DescriptorConfig {
        key: fields.key?,
        value: fields.value,
        rate_limit: fields.rate_limit,
        concurrency: fields.concurrency,
        shadow_mode: fields.shadow_mode,
        quota_mode: fields.quota_mode,
        detailed_metric: fields.detailed_metric,
        value_to_metric: fields.value_to_metric,
        share_threshold: fields.share_threshold.is_some(),
        metadata: fields.metadata,
        descriptors: fields.descriptors,
        location: node.location.clone(),
    })
}

/// A descriptor's fields as read, each checked on its own; what depends on several is checked
/// after.
#[derive(Default)]
struct DescriptorFields<'a> {
    key: Option<String>,
    seen_key: bool,
    value: Option<String>,
    value_ok: bool,
    rate_limit_key: Option<&'a Node>,
    rate_limit: Option<RateLimitSpec>,
    rate_limits_key: Option<&'a Node>,
    concurrency_key: Option<&'a Node>,
    concurrency: Option<ConcurrencySpec>,
    /// The `quota_mode: true` key, where an error about it is placed.
    quota_mode_key: Option<&'a Node>,
    /// The `descriptors` key, where an error about it is placed.
    descriptors_key: Option<&'a Node>,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    /// The `share_threshold: true` key, where an error about it is placed.
    share_threshold: Option<&'a Node>,
    metadata: Option<Vec<(String, MetaValue)>>,
    descriptors: Vec<DescriptorConfig>,
}

impl<'a> DescriptorFields<'a> {
    fn read(ctx: &mut Ctx, entries: &'a [(Node, Node)], depth: usize) -> DescriptorFields<'a> {
        let mut f = DescriptorFields {
            value_ok: true,
            ..DescriptorFields::default()
        };
        for (k, v) in entries {
            let Some(name) = fields::field_name(ctx, k) else {
                continue;
            };
            let flag = |ctx: &mut Ctx| fields::boolean(ctx, name, v).unwrap_or(false);
            match name {
                "key" => {
                    f.seen_key = true;
                    f.key = fields::non_empty_string(ctx, "key", v);
                }
                "value" => {
                    f.value = descriptor_value(ctx, v);
                    f.value_ok = f.value.is_some();
                }
                "rate_limit" => {
                    f.rate_limit_key = Some(k);
                    if let Some(spec) = rate_limit::single(ctx, v) {
                        f.rate_limit.get_or_insert(spec);
                    }
                }
                "rate_limits" => {
                    f.rate_limits_key = Some(k);
                    if let Some(spec) = rate_limit::list(ctx, v) {
                        f.rate_limit.get_or_insert(spec);
                    }
                }
                "concurrency" => {
                    f.concurrency_key = Some(k);
                    f.concurrency = concurrency::spec(ctx, v);
                }
                "shadow_mode" => f.shadow_mode = flag(ctx),
                "detailed_metric" => f.detailed_metric = flag(ctx),
                "quota_mode" => {
                    f.quota_mode = flag(ctx);
                    f.quota_mode_key = f.quota_mode.then_some(k);
                }
                "value_to_metric" => f.value_to_metric = flag(ctx),
                "share_threshold" => {
                    if fields::boolean(ctx, "share_threshold", v) == Some(true) {
                        f.share_threshold = Some(k);
                    }
                }
                "metadata" => f.metadata = metadata_map(ctx, v),
                "descriptors" => {
                    f.descriptors_key = Some(k);
                    f.descriptors = list(ctx, v, depth + 1);
                }
                other => fields::unexpected_field(ctx, Level::Descriptor, other, k),
            }
        }
        f
    }

    /// One of `rate_limit` and `rate_limits`, and a `key`.
    fn check_limits_and_key(&self, ctx: &mut Ctx, node: &Node) {
        if let (Some(_), Some(second)) = (self.rate_limit_key, self.rate_limits_key) {
            ctx.error(
                &second.location,
                "'rate_limit' and 'rate_limits' cannot both be given on one descriptor \
                 (put every limit under rate_limits)",
            );
        }
        if !self.seen_key {
            ctx.error(&node.location, "descriptor is missing required field 'key'");
        }
    }

    /// `concurrency` alone: no rate limit beside it, no `quota_mode`, and no nested descriptors
    /// (the entries a request adds after a concurrency rule's are its request id and the release
    /// marker, not rules).
    fn check_concurrency(&self, ctx: &mut Ctx) {
        let Some(at) = self.concurrency_key else {
            return;
        };
        if self.rate_limit_key.or(self.rate_limits_key).is_some() {
            ctx.error(
                &at.location,
                "'concurrency' cannot be given with 'rate_limit' or 'rate_limits' on one \
                 descriptor (a rate and a concurrency limit on one key: put the rate on a \
                 sibling descriptor that Envoy sends in its own rate_limits entry)",
            );
        }
        if let Some(q) = self.quota_mode_key {
            ctx.error(
                &q.location,
                "'quota_mode' does not apply to a 'concurrency' descriptor",
            );
        }
        if let Some(d) = self
            .descriptors_key
            .filter(|_| !self.descriptors.is_empty())
        {
            ctx.error(
                &d.location,
                "a 'concurrency' descriptor cannot have nested 'descriptors': the entries after \
                 it in a request are the request id and the release marker",
            );
        }
    }

    /// `share_threshold` only with a wildcard value.
    fn check_share_threshold(&self, ctx: &mut Ctx) {
        if let Some(k) = self.share_threshold
            && !self.value.as_deref().is_some_and(|v| v.contains('*'))
        {
            ctx.error(
                &k.location,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but \
                     found key '{}'{}",
                    self.key.as_deref().unwrap_or(""),
                    self.value
                        .as_deref()
                        .map_or(String::new(), |v| format!(" and value '{v}'"))
                ),
            );
        }
    }
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

/// A descriptor `value`: a non-empty string, or an integer or a boolean as written (`value: 0123`
/// is "0123", `value: true` is "true"): the reference's YAML library gives a string field the
/// scalar's text, and a header's value is matched as text.
fn descriptor_value(ctx: &mut Ctx, node: &Node) -> Option<String> {
    match &node.kind {
        NodeKind::Scalar(text, ScalarKind::Str) if text.is_empty() => {
            ctx.error(
                &node.location,
                "'value' must not be empty (omit 'value' to match any value)",
            );
            None
        }
        NodeKind::Scalar(text, ScalarKind::Str | ScalarKind::Int | ScalarKind::Bool(_)) => {
            Some(text.clone())
        }
        _ => fields::string(ctx, "value", node),
    }
}
