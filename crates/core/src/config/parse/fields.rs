//! Field tables per level of a rules file and typed readers of YAML nodes; every reader records
//! an error naming the field and returns `None` when the node has the wrong shape.

use super::Ctx;
use crate::config::yaml::{Node, NodeKind, ScalarKind};

pub(super) const TOP_FIELDS: &[&str] = &["domain", "descriptors"];
pub(super) const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "descriptors",
    "concurrency",
];
pub(super) const RATE_LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "unit_multiplier",
    "algorithm",
    "burst",
    "max_delay",
    "policy",
    "advertise",
    "calendar",
];
pub(super) const REPLACES_FIELDS: &[&str] = &["name"];
pub(super) const CONCURRENCY_FIELDS: &[&str] = &["max_in_flight", "lease"];

/// A level of the rules format, for field checks and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    Top,
    Descriptor,
    RateLimit,
    RateLimits,
    Replaces,
    Concurrency,
}

impl Level {
    pub(super) fn fields(self) -> &'static [&'static str] {
        match self {
            Level::Top => TOP_FIELDS,
            Level::Descriptor => DESCRIPTOR_FIELDS,
            Level::RateLimit | Level::RateLimits => RATE_LIMIT_FIELDS,
            Level::Replaces => REPLACES_FIELDS,
            Level::Concurrency => CONCURRENCY_FIELDS,
        }
    }

    /// "at the top level", "on a descriptor", "under rate_limit", …
    pub(super) fn place(self) -> &'static str {
        match self {
            Level::Top => "at the top level",
            Level::Descriptor => "on a descriptor",
            Level::RateLimit => "under rate_limit",
            Level::RateLimits => "under rate_limits",
            Level::Replaces => "in a replaces entry",
            Level::Concurrency => "under concurrency",
        }
    }
}

/// Reports a field that is not allowed at `level`: unsupported, misplaced or unknown.
pub(super) fn unexpected_field(ctx: &mut Ctx, level: Level, name: &str, key: &Node) {
    let place = level.place();
    let message = if name == "domain" {
        format!("'domain' belongs at the top level of the file, not {place}")
    } else if DESCRIPTOR_FIELDS.contains(&name) {
        format!("'{name}' belongs on a descriptor (an entry of 'descriptors'), not {place}")
    } else if RATE_LIMIT_FIELDS.contains(&name) {
        format!("'{name}' belongs under rate_limit, not {place}")
    } else {
        format!(
            "unknown field '{name}' {place} (expected one of: {})",
            level.fields().join(", ")
        )
    };
    ctx.error(&key.location, message);
}

/// The entries of a mapping node, or an error "`what` must be a mapping".
pub(super) fn mapping<'n>(ctx: &mut Ctx, what: &str, node: &'n Node) -> Option<&'n [(Node, Node)]> {
    match &node.kind {
        NodeKind::Map(entries) => Some(entries),
        _ => {
            ctx.error(
                &node.location,
                format!("{what} must be a mapping, found {}", node.describe()),
            );
            None
        }
    }
}

/// The name of a mapping key, which must be a string.
pub(super) fn field_name<'n>(ctx: &mut Ctx, key: &'n Node) -> Option<&'n str> {
    match &key.kind {
        NodeKind::Scalar(text, ScalarKind::Str) => Some(text),
        NodeKind::Scalar(text, _) => {
            ctx.error(
                &key.location,
                format!(
                    "field names must be strings, found {} '{text}'",
                    key.describe()
                ),
            );
            None
        }
        _ => None,
    }
}

/// A string field.
pub(super) fn string(ctx: &mut Ctx, field: &str, node: &Node) -> Option<String> {
    match &node.kind {
        NodeKind::Scalar(text, ScalarKind::Str) => Some(text.clone()),
        NodeKind::Scalar(text, ScalarKind::Int | ScalarKind::Float | ScalarKind::Bool(_)) => {
            ctx.error(
                &node.location,
                format!(
                    "'{field}' must be a string, found {} (quote it: \"{text}\")",
                    node.describe()
                ),
            );
            None
        }
        _ => {
            ctx.error(
                &node.location,
                format!("'{field}' must be a string, found {}", node.describe()),
            );
            None
        }
    }
}

/// A string field that must not be empty.
pub(super) fn non_empty_string(ctx: &mut Ctx, field: &str, node: &Node) -> Option<String> {
    let s = string(ctx, field, node)?;
    if s.is_empty() {
        ctx.error(&node.location, format!("'{field}' must not be empty"));
        return None;
    }
    Some(s)
}

/// A boolean field (`true`/`false`; a quoted "true" is a string).
pub(super) fn boolean(ctx: &mut Ctx, field: &str, node: &Node) -> Option<bool> {
    match &node.kind {
        NodeKind::Scalar(_, ScalarKind::Bool(b)) => Some(*b),
        _ => {
            ctx.error(
                &node.location,
                format!(
                    "'{field}' must be a boolean (true or false), found {}",
                    node.describe()
                ),
            );
            None
        }
    }
}

/// Why an integer scalar has no usable value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IntError {
    /// Decimal with a leading zero: octal in YAML 1.1, decimal in YAML 1.2.
    Ambiguous,
    TooLarge,
}

impl IntError {
    pub(super) fn message(self, field: &str, text: &str) -> String {
        match self {
            IntError::Ambiguous => format!(
                "'{field}' value '{text}' is ambiguous (a leading zero means octal in YAML 1.1 \
                 and decimal in YAML 1.2); write it without leading zeros, or quote it"
            ),
            IntError::TooLarge => format!("'{field}' value '{text}' is too large"),
        }
    }
}

/// The value of an integer scalar's text (as classified by the YAML layer).
pub(super) fn int_value(text: &str) -> Result<i128, IntError> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let parsed = if let Some(hex) = unsigned.strip_prefix("0x") {
        i128::from_str_radix(hex, 16)
    } else if let Some(oct) = unsigned.strip_prefix("0o") {
        i128::from_str_radix(oct, 8)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') {
        return Err(IntError::Ambiguous);
    } else {
        unsigned.parse::<i128>()
    };
    match parsed {
        Ok(v) if negative => Ok(-v),
        Ok(v) => Ok(v),
        Err(_) => Err(IntError::TooLarge),
    }
}

/// An integer field within `min..=max`.
pub(super) fn integer(ctx: &mut Ctx, field: &str, node: &Node, min: u32, max: u32) -> Option<u32> {
    let NodeKind::Scalar(text, ScalarKind::Int) = &node.kind else {
        ctx.error(
            &node.location,
            format!("'{field}' must be an integer, found {}", node.describe()),
        );
        return None;
    };
    let value = match int_value(text) {
        Ok(v) => v,
        Err(IntError::TooLarge) if text.starts_with('-') => i128::MIN,
        Err(IntError::TooLarge) => i128::MAX,
        Err(e) => {
            ctx.error(&node.location, e.message(field, text));
            return None;
        }
    };
    if value < i128::from(min) {
        ctx.error(
            &node.location,
            format!("'{field}' must be at least {min}, found {text}"),
        );
        return None;
    }
    if value > i128::from(max) {
        ctx.error(
            &node.location,
            format!("'{field}' must be at most {max}, found {text}"),
        );
        return None;
    }
    u32::try_from(value).ok()
}
