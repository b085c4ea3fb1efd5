//! Rules-file validation: walks one file's YAML node tree into a `DomainConfig`, collecting every
//! error of the file with its line and column. Pure: text in, model or errors out.

mod concurrency;
mod descriptor;
mod fields;
mod rate_limit;
#[cfg(test)]
mod tests;

use std::path::Path;

use super::error::ConfigError;
use super::model::{DomainConfig, Location};
use super::yaml::{self, NodeKind, ScalarKind};
use fields::Level;

/// Collects the errors of one file.
pub(super) struct Ctx<'a> {
    file: &'a Path,
    errors: Vec<ConfigError>,
    warnings: Vec<String>,
}

impl Ctx<'_> {
    /// Something the reference accepts and so do we, but that deserves a log line.
    pub(super) fn warning(&mut self, location: &Location, message: impl Into<String>) {
        let e = ConfigError {
            file: self.file.to_path_buf(),
            location: Some(location.clone()),
            message: message.into(),
        };
        self.warnings.push(e.to_string());
    }

    pub(super) fn error(&mut self, location: &Location, message: impl Into<String>) {
        self.errors.push(ConfigError {
            file: self.file.to_path_buf(),
            location: Some(location.clone()),
            message: message.into(),
        });
    }
}

/// The outcome of parsing one file.
pub(crate) struct ParsedFile {
    /// The validated config, when the file has no error.
    pub config: Option<DomainConfig>,
    /// The domain and where it is written, when it could be read (even if other fields are bad),
    /// so duplicate domains across files are still reported.
    pub domain: Option<(String, Location)>,
    /// Every error of the file, in line/column order.
    pub errors: Vec<ConfigError>,
}

/// Parses and validates one rules file.
pub(crate) fn parse_file(file: &Path, text: &str) -> ParsedFile {
    let mut ctx = Ctx {
        file,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let doc = yaml::parse(text);
    for e in &doc.errors {
        ctx.error(&e.location, e.message.clone());
    }
    let start = Location { line: 1, column: 1 };
    let (domain, descriptors) = match &doc.root {
        None if !doc.errors.is_empty() => (None, Vec::new()),
        None => {
            ctx.error(&start, EMPTY_FILE);
            (None, Vec::new())
        }
        Some(root) => match &root.kind {
            NodeKind::Scalar(_, ScalarKind::Null) => {
                ctx.error(&start, EMPTY_FILE);
                (None, Vec::new())
            }
            NodeKind::Map(entries) => top_level(&mut ctx, root, entries),
            _ => {
                ctx.error(
                    &root.location,
                    format!(
                        "a rules file must be a mapping with 'domain' and 'descriptors', found {}",
                        root.describe()
                    ),
                );
                (None, Vec::new())
            }
        },
    };
    let warnings = ctx.warnings;
    let mut errors = ctx.errors;
    errors.sort_by_key(|e| e.location.as_ref().map(|l| (l.line, l.column)));
    let config = match &domain {
        Some((name, _)) if errors.is_empty() => Some(DomainConfig {
            domain: name.clone(),
            descriptors,
            source: file.to_path_buf(),
            warnings,
        }),
        _ => None,
    };
    ParsedFile {
        config,
        domain,
        errors,
    }
}

const EMPTY_FILE: &str =
    "the file is empty: a rules file must be a mapping with 'domain' and 'descriptors'";

fn top_level(
    ctx: &mut Ctx,
    root: &yaml::Node,
    entries: &[(yaml::Node, yaml::Node)],
) -> (
    Option<(String, Location)>,
    Vec<super::model::DescriptorConfig>,
) {
    let mut domain = None;
    let mut seen_domain = false;
    let mut descriptors = Vec::new();
    for (key, value) in entries {
        let Some(name) = fields::field_name(ctx, key) else {
            continue;
        };
        match name {
            "domain" => {
                seen_domain = true;
                domain = fields::non_empty_string(ctx, "domain", value)
                    .map(|d| (d, value.location.clone()));
            }
            "descriptors" => descriptors = descriptor::list(ctx, value, 1),
            other => fields::unexpected_field(ctx, Level::Top, other, key),
        }
    }
    if !seen_domain {
        ctx.error(&root.location, "missing required field 'domain'");
    }
    (domain, descriptors)
}
