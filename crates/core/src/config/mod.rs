//! Rules files: the YAML model, strict validation with file:line:column errors, and the result
//! (`DomainConfig`). Pure: takes file names and texts, never touches the file system or the clock.

mod duration;
mod error;
mod model;
mod parse;
mod text;
pub mod yaml;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use duration::{MAX_DELAY_LIMIT, format_duration, parse_duration};
pub use error::{ConfigError, ConfigErrors};
pub use model::{Algorithm, DomainConfig, Limit, MetaValue, PolicyName, RateLimitSpec, Unit};
pub use model::{ConcurrencySpec, DescriptorConfig, Location};
pub use text::decode;

/// Adds `more`'s descriptors (from another file of the same domain) to `into`; a key and value
/// already at the top level of `into` is an error on `more`'s descriptor.
fn merge(into: &mut DomainConfig, more: DomainConfig, errors: &mut Vec<ConfigError>) {
    for d in more.descriptors {
        if let Some(first) = into
            .descriptors
            .iter()
            .find(|e| e.key == d.key && e.value == d.value)
        {
            errors.push(ConfigError {
                file: more.source.clone(),
                location: Some(d.location.clone()),
                message: format!(
                    "duplicate descriptor with key '{}'{} in domain '{}': already defined in {}:{}",
                    d.key,
                    d.value
                        .as_deref()
                        .map_or(String::new(), |v| format!(" and value '{v}'")),
                    into.domain,
                    into.source.display(),
                    first.location.line
                ),
            });
        } else {
            into.descriptors.push(d);
        }
    }
    into.warnings.extend(more.warnings);
}

/// Parses and validates a set of rules files (path, text), one domain each. Returns every error of
/// every file, and a duplicate-domain error across files.
///
/// Errors come grouped by file in input order, each file's in line/column order; a domain already
/// defined by an earlier file is reported on the later file's `domain` line.
pub fn parse_files(files: &[(PathBuf, String)]) -> Result<Vec<DomainConfig>, ConfigErrors> {
    parse_files_merging(files, false)
}

/// Same; with `merge_domains` (the reference's `MERGE_DOMAIN_CONFIG`) a domain in several files
/// is one domain with the descriptors of all of them, and a descriptor with the same key and
/// value in two of them is an error.
pub fn parse_files_merging(
    files: &[(PathBuf, String)],
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, ConfigErrors> {
    let mut configs: Vec<DomainConfig> = Vec::new();
    let mut errors = Vec::new();
    // domain -> (file, location) of its first definition
    let mut domains: HashMap<String, (&Path, Location)> = HashMap::new();
    for (path, text) in files {
        let mut parsed = parse::parse_file(path, text);
        if let Some((domain, location)) = parsed.domain {
            match domains.get(&domain) {
                Some(_) if merge_domains => {
                    if let Some(config) = parsed.config.take()
                        && let Some(into) = configs.iter_mut().find(|c| c.domain == domain)
                    {
                        merge(into, config, &mut parsed.errors);
                    }
                }
                Some((first, at)) => {
                    parsed.errors.push(ConfigError {
                        file: path.clone(),
                        location: Some(location),
                        message: format!(
                            "duplicate domain '{domain}': already defined in {}:{}:{}",
                            first.display(),
                            at.line,
                            at.column
                        ),
                    });
                    parsed
                        .errors
                        .sort_by_key(|e| e.location.as_ref().map(|l| (l.line, l.column)));
                    parsed.config = None;
                }
                None => {
                    domains.insert(domain, (path, location));
                }
            }
        }
        errors.append(&mut parsed.errors);
        configs.extend(parsed.config);
    }
    if errors.is_empty() {
        Ok(configs)
    } else {
        Err(ConfigErrors(errors))
    }
}
