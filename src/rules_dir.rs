//! TEMPORARY stub, replaced by the real directory loader.
use std::path::Path;

use crate::config::{ConfigErrors, DomainConfig};

pub fn load_rules_dir(dir: &Path) -> Result<Vec<DomainConfig>, ConfigErrors> {
    let _ = dir;
    Ok(Vec::new())
}
