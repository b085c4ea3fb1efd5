//! Rules files: the YAML model, strict validation with file:line:column errors, and the result
//! (`DomainConfig`). Pure: takes file names and texts, never touches the file system or the clock.

mod duration;
mod error;
mod model;
mod parse;
mod text;
mod yaml;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use duration::{MAX_DELAY_LIMIT, format_duration, parse_duration};
pub use error::{ConfigError, ConfigErrors};
pub use model::{
    Algorithm, DescriptorConfig, DomainConfig, Limit, Location, MAX_DESCRIPTOR_DEPTH, MetaValue,
    RateLimitSpec, Unit,
};
pub use text::decode;

/// Parses and validates a set of rules files (path, text), one domain each. Returns every error of
/// every file, and a duplicate-domain error across files.
///
/// Errors come grouped by file in input order, each file's in line/column order; a domain already
/// defined by an earlier file is reported on the later file's `domain` line.
pub fn parse_files(files: &[(PathBuf, String)]) -> Result<Vec<DomainConfig>, ConfigErrors> {
    let mut configs = Vec::new();
    let mut errors = Vec::new();
    // domain -> (file, location) of its first definition
    let mut domains: HashMap<String, (&Path, Location)> = HashMap::new();
    for (path, text) in files {
        let mut parsed = parse::parse_file(path, text);
        if let Some((domain, location)) = parsed.domain {
            match domains.get(&domain) {
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
