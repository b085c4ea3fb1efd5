//! Reading a rules directory from disk: finds every `*.yaml`/`*.yml` file under it (recursively,
//! following symlinks, skipping dot entries and an unreadable `lost+found`) and reads it, within size caps checked before
//! reading, and names the other files found, which are not read. The I/O side of `config`, which
//! owns decoding, parsing and validation.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::config::{self, ConfigError, ConfigErrors, DomainConfig};

/// Deepest directory nesting walked below the rules directory.
pub(crate) const MAX_DEPTH: usize = 16;

/// How many bytes of rules files are read: per file and for the whole directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeCaps {
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

impl Default for SizeCaps {
    fn default() -> Self {
        SizeCaps {
            max_file_bytes: 8 << 20,
            max_total_bytes: 32 << 20,
        }
    }
}

/// Every rules file (path, bytes), sorted by path.
pub type RulesFiles = Vec<(PathBuf, Vec<u8>)>;

/// How many of the files not read a warning names.
const NOT_READ_NAMED: usize = 10;

/// A rules directory as read: its rules files, and the other files found where they are looked
/// for (neither dot entries nor `*.yaml`/`*.yml`), which are not read. envoyproxy/ratelimit reads
/// every file there, so a rules file carried over under another name (`ratelimit.conf`, a
/// ConfigMap key without an extension) is one of these.
#[derive(Debug, Default, PartialEq)]
pub struct RulesDir {
    /// The rules files (path, bytes), sorted by path.
    pub files: RulesFiles,
    /// The files not read, sorted by path.
    pub not_read: Vec<PathBuf>,
}

impl RulesDir {
    /// What a load of `dir` says beyond the rules' own warnings (logged on load, printed by
    /// `check` and `replay`): that it holds no rules file, and which files in it are not read.
    pub fn warnings(&self, dir: &Path) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.files.is_empty() {
            warnings.push(format!(
                "no rules files in {}: every request is allowed",
                dir.display()
            ));
        }
        if !self.not_read.is_empty() {
            let mut named: Vec<String> = self
                .not_read
                .iter()
                .take(NOT_READ_NAMED)
                .map(|p| p.strip_prefix(dir).unwrap_or(p).display().to_string())
                .collect();
            if self.not_read.len() > NOT_READ_NAMED {
                named.push(format!("and {} more", self.not_read.len() - NOT_READ_NAMED));
            }
            warnings.push(format!(
                "{} file(s) in {} not read, as only *.yaml and *.yml files are rules files here \
                 (envoyproxy/ratelimit reads every file): {}; rename a rules file to end in .yaml",
                self.not_read.len(),
                dir.display(),
                named.join(", ")
            ));
        }
        warnings
    }
}

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
    #[error(
        "{}: the file is {size} bytes, over the {limit}-byte cap per rules file \
         (MAX_FILE_BYTES, --max-file-bytes)",
        path.display()
    )]
    FileTooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error(
        "{}: with this file the rules files add up to {total} bytes, over the {limit}-byte cap \
         (MAX_TOTAL_BYTES, --max-total-bytes)",
        path.display()
    )]
    TotalTooLarge {
        path: PathBuf,
        total: u64,
        limit: u64,
    },
}

impl RulesDirError {
    /// The directory or file the error is about.
    pub(crate) fn path(&self) -> &Path {
        match self {
            RulesDirError::ReadDir { path, .. }
            | RulesDirError::NotADirectory { path }
            | RulesDirError::ReadFile { path, .. }
            | RulesDirError::TooDeep { path }
            | RulesDirError::FileTooLarge { path, .. }
            | RulesDirError::TotalTooLarge { path, .. } => path,
        }
    }

    /// The message without the path.
    pub(crate) fn detail(&self) -> String {
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

/// Lists and reads every rules file under `dir`, sorted by path, and lists the files that are not
/// rules files. Paths are `dir` joined with the relative path (not canonicalised). Entries whose
/// name starts with `.` are skipped, so a Kubernetes ConfigMap mount (`a.yaml -> ..data/a.yaml`,
/// `..data -> ..2026_01_01…`) yields each file once; symlinks are followed, a directory that is its
/// own ancestor is walked once. A file's size is checked against `caps` before it is read (and the
/// read stops past the cap, should the file grow meanwhile).
pub fn read_rules_dir(dir: &Path, caps: SizeCaps) -> Result<RulesDir, RulesDirError> {
    let meta = fs::metadata(dir).map_err(|source| RulesDirError::ReadDir {
        path: dir.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(RulesDirError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let mut found = Found::default();
    walk(dir, 0, &mut Vec::new(), &mut found)?;
    found.rules.sort();
    found.not_read.sort();
    let mut total = 0u64;
    let mut files = Vec::with_capacity(found.rules.len());
    for path in found.rules {
        let bytes = read_capped(&path, caps, total)?;
        total += bytes.len() as u64;
        files.push((path, bytes));
    }
    Ok(RulesDir {
        files,
        not_read: found.not_read,
    })
}

/// Reads one file whose size (from its metadata, before reading) fits `caps` given `total` bytes
/// read so far.
fn read_capped(path: &Path, caps: SizeCaps, total: u64) -> Result<Vec<u8>, RulesDirError> {
    let limit = caps
        .max_file_bytes
        .min(caps.max_total_bytes.saturating_sub(total));
    read_file_capped(path, limit).map_err(|e| match e {
        CappedReadError::Io(source) => RulesDirError::ReadFile {
            path: path.to_path_buf(),
            source,
        },
        CappedReadError::TooLarge { size, .. } if size > caps.max_file_bytes => {
            RulesDirError::FileTooLarge {
                path: path.to_path_buf(),
                size,
                limit: caps.max_file_bytes,
            }
        }
        CappedReadError::TooLarge { size, .. } => RulesDirError::TotalTooLarge {
            path: path.to_path_buf(),
            total: total + size,
            limit: caps.max_total_bytes,
        },
    })
}

/// Why [`read_file_capped`] read nothing.
#[derive(Debug, thiserror::Error)]
pub enum CappedReadError {
    #[error("{0}")]
    Io(io::Error),
    /// `size` is the file's length (or, should it grow while read, what was read: `limit + 1`).
    #[error("the file is {size} bytes, over the {limit}-byte cap")]
    TooLarge { size: u64, limit: u64 },
}

/// The one way the server reads a YAML file (rules files, `PROMETHEUS_MAPPER_YAML`): its size is
/// checked against `limit` before reading, and the read stops one byte past `limit` should the
/// file grow meanwhile, so no file makes the server hold more than `limit + 1` bytes of it.
pub fn read_file_capped(path: &Path, limit: u64) -> Result<Vec<u8>, CappedReadError> {
    let file = fs::File::open(path).map_err(CappedReadError::Io)?;
    let size = file.metadata().map_err(CappedReadError::Io)?.len();
    if size > limit {
        return Err(CappedReadError::TooLarge { size, limit });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(CappedReadError::Io)?;
    let read = bytes.len() as u64;
    if read > limit {
        return Err(CappedReadError::TooLarge { size: read, limit });
    }
    Ok(bytes)
}

/// Decodes and validates files read by [`read_rules_dir`] (see [`config::parse_files`]); a file
/// that is not UTF-8 is an error at its first invalid byte. Errors come in file order. Each text
/// is dropped as soon as it is parsed.
pub fn parse_rules(files: RulesFiles) -> Result<Vec<DomainConfig>, ConfigErrors> {
    parse_rules_merging(files, false)
}

/// Same, merging a domain's files when `merge_domains` (`MERGE_DOMAIN_CONFIG`).
pub fn parse_rules_merging(
    files: RulesFiles,
    merge_domains: bool,
) -> Result<Vec<DomainConfig>, ConfigErrors> {
    let order: Vec<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
    let mut texts = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    for (path, bytes) in files {
        match config::decode(bytes) {
            Ok(text) => texts.push((path, text)),
            Err((location, message)) => errors.push(ConfigError {
                file: path,
                location: Some(location),
                message,
            }),
        }
    }
    let parsed = config::parse_files_merging(&texts, merge_domains);
    drop(texts);
    match parsed {
        Ok(configs) if errors.is_empty() => {
            for warning in configs.iter().flat_map(|c| &c.warnings) {
                tracing::warn!("{warning}");
            }
            Ok(configs)
        }
        Ok(_) => Err(ConfigErrors(errors)),
        Err(ConfigErrors(more)) => {
            errors.extend(more);
            // Stable: each file's errors keep their line order.
            errors.sort_by_key(|e| order.iter().position(|p| *p == e.file));
            Err(ConfigErrors(errors))
        }
    }
}

/// Reads and validates every rules file under `dir` within `caps`; an I/O problem becomes a
/// `ConfigError` without a location.
pub fn load_rules_dir(dir: &Path, caps: SizeCaps) -> Result<Vec<DomainConfig>, ConfigErrors> {
    load_rules_dir_saying(dir, caps, false, |_| {})
}

/// [`load_rules_dir`], merging a domain's files when `merge_domains`, and handing each of the
/// directory's warnings ([`RulesDir::warnings`]) to `warn` before the rules are parsed.
pub fn load_rules_dir_saying(
    dir: &Path,
    caps: SizeCaps,
    merge_domains: bool,
    mut warn: impl FnMut(&str),
) -> Result<Vec<DomainConfig>, ConfigErrors> {
    let read = read_rules_dir(dir, caps).map_err(|e| ConfigErrors(vec![e.into()]))?;
    for warning in read.warnings(dir) {
        warn(&warning);
    }
    parse_rules_merging(read.files, merge_domains)
}

fn is_rules_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

/// Whether `e`, from walking `dir`, is a volume's `lost+found` that only root may read: an ext
/// filesystem mounted as the rules directory has one at its root, and a server not run as root
/// (the image's user) would otherwise refuse every load for it. Any other unreadable directory
/// stays an error: it may hold rules.
fn fsck_leftovers(dir: &Path, e: &RulesDirError) -> bool {
    matches!(e, RulesDirError::ReadDir { path, source }
        if path == dir
            && source.kind() == io::ErrorKind::PermissionDenied
            && dir.file_name().is_some_and(|n| n == "lost+found"))
}

/// What a walk found: the rules files, and the other files.
#[derive(Default)]
struct Found {
    rules: Vec<PathBuf>,
    not_read: Vec<PathBuf>,
}

fn walk(
    dir: &Path,
    depth: usize,
    ancestors: &mut Vec<PathBuf>,
    out: &mut Found,
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
    let entries = fs::read_dir(dir).map_err(read_dir_error)?;
    ancestors.push(canonical);
    for entry in entries {
        let entry = entry.map_err(read_dir_error)?;
        if entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        match fs::metadata(&path) {
            Ok(m) if m.is_dir() => match walk(&path, depth + 1, ancestors, out) {
                Err(e) if fsck_leftovers(&path, &e) => {
                    tracing::debug!(path = %path.display(), "lost+found cannot be read; skipped");
                }
                walked => walked?,
            },
            Ok(m) if m.is_file() && is_rules_file(&path) => out.rules.push(path),
            Ok(m) if m.is_file() => out.not_read.push(path),
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
