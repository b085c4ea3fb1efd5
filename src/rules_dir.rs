//! Reading a rules directory from disk: finds every `*.yaml`/`*.yml` file under it (recursively,
//! following symlinks, skipping dot entries) and reads it. The I/O side of `config`, which owns
//! parsing and validation.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::config::{self, ConfigError, ConfigErrors, DomainConfig};

/// Deepest directory nesting walked below the rules directory.
pub const MAX_DEPTH: usize = 16;

/// Why a rules directory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RulesDirError {
    #[error("{}: cannot read rules directory: {source}", path.display())]
    ReadDir { path: PathBuf, source: io::Error },
    #[error("{}: the rules path is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("{}: cannot read rules file: {source}", path.display())]
    ReadFile { path: PathBuf, source: io::Error },
    #[error("{}: directories nested deeper than {MAX_DEPTH} levels", path.display())]
    TooDeep { path: PathBuf },
}

impl RulesDirError {
    /// The directory or file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            RulesDirError::ReadDir { path, .. }
            | RulesDirError::NotADirectory { path }
            | RulesDirError::ReadFile { path, .. }
            | RulesDirError::TooDeep { path } => path,
        }
    }

    /// The message without the path.
    pub fn detail(&self) -> String {
        let full = self.to_string();
        let prefix = format!("{}: ", self.path().display());
        full.strip_prefix(&prefix).unwrap_or(&full).to_string()
    }
}

impl From<RulesDirError> for ConfigError {
    fn from(e: RulesDirError) -> Self {
        ConfigError {
            file: e.path().to_path_buf(),
            location: None,
            message: e.detail(),
        }
    }
}

/// Lists and reads every rules file under `dir`, sorted by path. Paths are `dir` joined with the
/// relative path (not canonicalised). Entries whose name starts with `.` are skipped, so a
/// Kubernetes ConfigMap mount (`a.yaml -> ..data/a.yaml`, `..data -> ..2026_01_01…`) yields each
/// file once; symlinks are followed, a directory that is its own ancestor is walked once.
pub fn read_rules_dir(dir: &Path) -> Result<Vec<(PathBuf, String)>, RulesDirError> {
    let meta = fs::metadata(dir).map_err(|source| RulesDirError::ReadDir {
        path: dir.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(RulesDirError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let mut paths = Vec::new();
    walk(dir, 0, &mut Vec::new(), &mut paths)?;
    paths.sort();
    paths
        .into_iter()
        .map(|path| match fs::read_to_string(&path) {
            Ok(text) => Ok((path, text)),
            Err(source) => Err(RulesDirError::ReadFile { path, source }),
        })
        .collect()
}

/// Reads and validates every rules file under `dir` (see [`read_rules_dir`] and
/// [`config::parse_files`]); an I/O problem becomes a `ConfigError` without a location.
pub fn load_rules_dir(dir: &Path) -> Result<Vec<DomainConfig>, ConfigErrors> {
    let files = read_rules_dir(dir).map_err(|e| ConfigErrors(vec![e.into()]))?;
    config::parse_files(&files)
}

fn is_rules_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

fn walk(
    dir: &Path,
    depth: usize,
    ancestors: &mut Vec<PathBuf>,
    out: &mut Vec<PathBuf>,
) -> Result<(), RulesDirError> {
    let read_dir_error = |source| RulesDirError::ReadDir {
        path: dir.to_path_buf(),
        source,
    };
    if depth > MAX_DEPTH {
        return Err(RulesDirError::TooDeep {
            path: dir.to_path_buf(),
        });
    }
    let canonical = fs::canonicalize(dir).map_err(read_dir_error)?;
    if ancestors.contains(&canonical) {
        tracing::warn!(path = %dir.display(), "symlink loop in the rules directory; not followed");
        return Ok(());
    }
    ancestors.push(canonical);
    for entry in fs::read_dir(dir).map_err(read_dir_error)? {
        let entry = entry.map_err(read_dir_error)?;
        if entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        match fs::metadata(&path) {
            Ok(m) if m.is_dir() => walk(&path, depth + 1, ancestors, out)?,
            Ok(m) if m.is_file() && is_rules_file(&path) => out.push(path),
            Ok(_) => {}
            // A dangling symlink named like a rules file is an error; any other is ignored.
            Err(source) if is_rules_file(&path) => {
                return Err(RulesDirError::ReadFile { path, source });
            }
            Err(_) => {}
        }
    }
    ancestors.pop();
    Ok(())
}

#[cfg(test)]
mod tests;
