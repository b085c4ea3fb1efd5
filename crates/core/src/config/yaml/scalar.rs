//! Scalar typing for the YAML tree: YAML 1.2 core-schema resolution of plain scalars and the
//! few standard tags we accept (`!!str`, `!!int`, `!!float`, `!!bool`, `!!null`, `!!map`, `!!seq`).

use yaml_rust2::parser::Tag;
use yaml_rust2::scanner::TScalarStyle;

use super::{Location, ScalarKind, YamlError};

const CORE: &str = "tag:yaml.org,2002:";

fn tag_name(tag: &Tag) -> String {
    if tag.handle == CORE {
        format!("!!{}", tag.suffix)
    } else {
        format!("{}{}", tag.handle, tag.suffix)
    }
}

pub(super) fn check_collection_tag(
    tag: Option<&Tag>,
    expected: &str,
    location: Location,
) -> Result<(), YamlError> {
    match tag {
        None => Ok(()),
        Some(t) if t.handle == CORE && t.suffix == expected => Ok(()),
        Some(t) => Err(YamlError {
            location,
            message: format!("unsupported YAML tag '{}'", tag_name(t)),
        }),
    }
}

/// Resolves a scalar's kind from its style, tag and text.
pub(super) fn resolve(
    text: &str,
    style: TScalarStyle,
    tag: Option<&Tag>,
) -> Result<ScalarKind, String> {
    let plain = if style == TScalarStyle::Plain {
        plain_kind(text)
    } else {
        ScalarKind::Str
    };
    let Some(tag) = tag else { return Ok(plain) };
    let wanted = match (tag.handle.as_str(), tag.suffix.as_str()) {
        (CORE, "str") => return Ok(ScalarKind::Str),
        (CORE, "int") => "int",
        (CORE, "float") => "float",
        (CORE, "bool") => "bool",
        (CORE, "null") => "null",
        _ => return Err(format!("unsupported YAML tag '{}'", tag_name(tag))),
    };
    let kind = plain_kind(text);
    let ok = matches!(
        (wanted, kind),
        ("int", ScalarKind::Int)
            | ("float", ScalarKind::Float | ScalarKind::Int)
            | ("bool", ScalarKind::Bool(_))
            | ("null", ScalarKind::Null)
    );
    if !ok {
        return Err(format!("'{text}' is not a valid !!{wanted}"));
    }
    Ok(if wanted == "float" {
        ScalarKind::Float
    } else {
        kind
    })
}

/// YAML 1.2 core schema resolution of a plain scalar.
fn plain_kind(t: &str) -> ScalarKind {
    match t {
        "" | "~" | "null" | "Null" | "NULL" => return ScalarKind::Null,
        "true" | "True" | "TRUE" => return ScalarKind::Bool(true),
        "false" | "False" | "FALSE" => return ScalarKind::Bool(false),
        _ => {}
    }
    let digits = |s: &str, radix: u32| !s.is_empty() && s.chars().all(|c| c.is_digit(radix));
    let unsigned = t.strip_prefix(['-', '+']).unwrap_or(t);
    if digits(unsigned, 10)
        || t.strip_prefix("0x").is_some_and(|h| digits(h, 16))
        || t.strip_prefix("0o").is_some_and(|o| digits(o, 8))
    {
        return ScalarKind::Int;
    }
    if is_float(unsigned) {
        return ScalarKind::Float;
    }
    ScalarKind::Str
}

fn is_float(t: &str) -> bool {
    if matches!(t, ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mantissa, None),
    };
    let all_digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    let mantissa_ok = all_digits(int)
        && frac.is_none_or(all_digits)
        && (!int.is_empty() || frac.is_some_and(|f| !f.is_empty()));
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && all_digits(e)
    });
    mantissa_ok && exponent_ok && (frac.is_some() || exponent.is_some())
}
