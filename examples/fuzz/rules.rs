//! Target `rules`: bytes into the rules loader (decode + parse + validate), and YAML trees made
//! from the rules vocabulary. It must not panic, every error must name a line and column that exist
//! in the file, and time and memory must stay linear-ish in the input (checked by the harness).

use std::path::PathBuf;

use ratelimit_server::rules_dir::parse_rules;

use crate::input::Choices;

pub const DICTIONARY: &[&[u8]] = &[
    b": ",
    b"- ",
    b"\n",
    b"\n  ",
    b"\n    - ",
    b"&a ",
    b"*a",
    b"{",
    b"}",
    b"[",
    b"]",
    b"'",
    b"\"",
    b"!!str ",
    b"!!int ",
    b"<<: ",
    b"---\n",
    b"...\n",
    b"? ",
    b"|\n  ",
    b">\n  ",
    b"#",
    b"\t",
    b"\r\n",
    b"\xef\xbb\xbf",
    b"%YAML 1.2\n",
    b"domain",
    b"descriptors",
    b"key",
    b"value",
    b"rate_limit",
    b"rate_limits",
    b"unit",
    b"requests_per_unit",
    b"algorithm",
    b"burst",
    b"unlimited",
    b"shadow_mode",
    b"replaces",
    b"name",
    b"detailed_metric",
    b"unit_multiplier",
    b"max_delay",
    b"token_bucket",
    b"leaky_bucket",
    b"sliding_window",
    b"fixed_window",
    b"second",
    b"minute",
    b"hour",
    b"day",
    b"99999999999999999999",
    b"-1",
    b"0",
    b"1.5",
    b"true",
    b"~",
    b"null",
    b"250ms",
    b"0x10",
];

const KEYS: &[&str] = &[
    "domain",
    "descriptors",
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "unit",
    "requests_per_unit",
    "algorithm",
    "burst",
    "unlimited",
    "shadow_mode",
    "replaces",
    "name",
    "detailed_metric",
    "unit_multiplier",
    "max_delay",
];
const SCALARS: &[&str] = &[
    "api",
    "k",
    "v",
    "/v1/*",
    "*",
    "second",
    "minute",
    "hour",
    "day",
    "month",
    "year",
    "5",
    "0",
    "-3",
    "1e3",
    "4294967296",
    "18446744073709551616",
    "true",
    "false",
    "~",
    "token_bucket",
    "leaky_bucket",
    "fixed_window",
    "sliding_window",
    "250ms",
    "1s",
    "61m",
    "''",
    "\"x\"",
];

/// Checks one rules file; `Err` says what went wrong.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let path = PathBuf::from("fuzz.yaml");
    let errors = match parse_rules(vec![(path, bytes.to_vec())]) {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    // Lines as an editor counts them: split on '\n' over the valid UTF-8 prefix.
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    };
    let lines: Vec<&str> = text.split('\n').collect();
    if errors.0.is_empty() {
        return Err("an error result with no error in it".into());
    }
    for e in &errors.0 {
        let Some(at) = &e.location else { continue };
        let Some(line) = at.line.checked_sub(1).and_then(|i| lines.get(i)) else {
            return Err(format!(
                "error names line {} of {}: {e}",
                at.line,
                lines.len()
            ));
        };
        let width = line.chars().count() + 1;
        if at.column == 0 || at.column > width {
            return Err(format!(
                "error names column {} of a {}-column line: {e}",
                at.column, width
            ));
        }
    }
    Ok(())
}

/// A YAML document made from the rules vocabulary: nested maps and lists, flow and block style,
/// anchors and aliases, odd scalars; at most about `budget` nodes.
pub fn generate(c: &mut Choices<'_>) -> Vec<u8> {
    let mut out = String::new();
    let mut budget = 200usize;
    if c.chance(50) {
        out.push_str("domain: ");
        out.push_str(&c.word(SCALARS));
        out.push('\n');
    }
    out.push_str("descriptors:\n");
    list(c, &mut out, 1, &mut budget);
    out.into_bytes()
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn list(c: &mut Choices<'_>, out: &mut String, depth: usize, budget: &mut usize) {
    let n = 1 + c.below(4);
    for _ in 0..n {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        indent(out, depth);
        out.push_str("- ");
        map(c, out, depth + 1, budget, true);
    }
}

fn map(
    c: &mut Choices<'_>,
    out: &mut String,
    depth: usize,
    budget: &mut usize,
    first_inline: bool,
) {
    let n = 1 + c.below(5);
    for i in 0..n {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        if i > 0 || !first_inline {
            indent(out, depth);
        }
        let key = c.word(KEYS);
        out.push_str(&key);
        out.push(':');
        match c.below(8) {
            0 | 1 if depth < 40 => {
                out.push('\n');
                list(c, out, depth + 1, budget);
            }
            2 if depth < 40 => {
                out.push('\n');
                map(c, out, depth + 1, budget, false);
            }
            3 => {
                // Flow style, maybe with an anchor or an alias.
                if c.chance(30) {
                    out.push_str(" &a");
                }
                out.push_str(" {");
                for j in 0..c.below(4) {
                    if j > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&c.word(KEYS));
                    out.push_str(": ");
                    out.push_str(&c.word(SCALARS));
                }
                out.push_str("}\n");
            }
            4 if c.chance(30) => out.push_str(" *a\n"),
            _ => {
                out.push(' ');
                out.push_str(&c.word(SCALARS));
                out.push('\n');
            }
        }
    }
}
