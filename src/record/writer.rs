//! The record file: appends batches of lines, rotates `FILE` → `FILE.1` … `FILE.N` at
//! `--record-max-bytes`, and survives write errors: the lines of a failed batch are counted as
//! dropped (`write_error`), the error is logged once a minute per kind, and writing is retried
//! (the file reopened) after a pause. Runs on the writer thread only.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::metrics::{DropReason, RecordMetrics};

/// How long writing pauses after an error before the file is reopened.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The same kind of error is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Where and how big.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    pub path: PathBuf,
    /// Rotate before a batch would take the file past this size.
    pub max_bytes: u64,
    /// Rotated files kept (`FILE.1` newest … `FILE.N` oldest).
    pub max_files: u32,
}

pub struct RecordFile {
    spec: FileSpec,
    metrics: RecordMetrics,
    /// `None` after an error, until `retry_at`.
    file: Option<Open>,
    retry_at: Instant,
    /// Per error kind: when it was last logged, and how many errors since.
    logged: HashMap<io::ErrorKind, (Instant, u64)>,
}

struct Open {
    file: File,
    size: u64,
    /// Only regular files rotate (not `/dev/full`, a FIFO or a terminal).
    rotates: bool,
}

fn open(path: &Path) -> io::Result<Open> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let meta = file.metadata()?;
    Ok(Open {
        size: meta.len(),
        rotates: meta.is_file(),
        file,
    })
}

fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

impl RecordFile {
    /// Opens (creates) the file now, so that a path that cannot be written stops the start.
    pub fn open(spec: FileSpec, metrics: RecordMetrics) -> io::Result<RecordFile> {
        let file = open(&spec.path)?;
        Ok(RecordFile {
            spec,
            metrics,
            file: Some(file),
            retry_at: crate::clock::monotonic(),
            logged: HashMap::new(),
        })
    }

    pub fn metrics(&self) -> &RecordMetrics {
        &self.metrics
    }

    /// Writes `batch` (`lines` whole lines), rotating first when it would take the file past the
    /// size bound; a batch that fails is counted as dropped.
    pub fn write(&mut self, batch: &[u8], lines: u64) {
        if batch.is_empty() {
            return;
        }
        if self.file.is_none() {
            if crate::clock::monotonic() < self.retry_at {
                self.metrics.count_drop(DropReason::WriteError, lines);
                return;
            }
            match open(&self.spec.path) {
                Ok(file) => {
                    tracing::info!(path = %self.spec.path.display(), "recording again");
                    self.file = Some(file);
                }
                Err(e) => {
                    self.failed(e, "cannot reopen the record file", lines);
                    return;
                }
            }
        }
        if let Some(open) = &self.file
            && open.rotates
            && open.size > 0
            && open.size + batch.len() as u64 > self.spec.max_bytes
        {
            self.rotate();
        }
        let Some(open) = &mut self.file else {
            self.metrics.count_drop(DropReason::WriteError, lines);
            return;
        };
        match open.file.write_all(batch) {
            Ok(()) => {
                open.size += batch.len() as u64;
                self.metrics.lines.inc_by(lines);
                self.metrics.bytes.inc_by(batch.len() as u64);
            }
            Err(e) => self.failed(e, "cannot write the record file", lines),
        }
    }

    /// Shifts `FILE.k` → `FILE.k+1` (the oldest is replaced), `FILE` → `FILE.1`, and opens a
    /// new `FILE`. A failed rename keeps writing where it can; nothing already written is lost
    /// but the oldest file.
    fn rotate(&mut self) {
        let path = &self.spec.path;
        let n = self.spec.max_files;
        let mut renamed = Ok(());
        for k in (1..n).rev() {
            let from = numbered(path, k);
            if from.exists() {
                renamed = renamed.and(std::fs::rename(&from, numbered(path, k + 1)));
            }
        }
        renamed = renamed.and(std::fs::rename(path, numbered(path, 1)));
        if let Err(e) = renamed {
            let message = "cannot rotate the record file (writing on to it)";
            self.log(&e, message);
            return;
        }
        self.metrics.rotations.inc();
        match open(path) {
            Ok(file) => self.file = Some(file),
            Err(e) => self.failed(e, "cannot open a new record file after rotating", 0),
        }
    }

    fn failed(&mut self, error: io::Error, message: &str, lines: u64) {
        self.metrics.count_drop(DropReason::WriteError, lines);
        self.log(&error, message);
        self.file = None;
        self.retry_at = crate::clock::monotonic() + RETRY_AFTER;
    }

    /// Logs an error at most once per [`LOG_EVERY`] per kind, saying how many were not logged.
    fn log(&mut self, error: &io::Error, message: &str) {
        let now = crate::clock::monotonic();
        let (last, since) = self.logged.entry(error.kind()).or_insert((now, 0));
        if *since > 0 && now.duration_since(*last) < LOG_EVERY {
            *since += 1;
            return;
        }
        tracing::error!(
            path = %self.spec.path.display(),
            error = %error,
            errors_since_last_log = *since,
            "{message}; decisions are still answered, lines are dropped and counted \
             (ratelimit_record_dropped_total{{reason=\"write_error\"}}) and writing is retried"
        );
        *last = now;
        *since = 1;
    }

    /// Bytes the current file takes before it rotates (`u64::MAX` when it never does), so the
    /// writer can cut its batches there.
    pub fn room(&self) -> u64 {
        match &self.file {
            Some(open) if open.rotates => self.spec.max_bytes.saturating_sub(open.size),
            _ => u64::MAX,
        }
    }

    /// Flushes what the OS holds to the disk (at shutdown).
    pub fn sync(&mut self) {
        if let Some(open) = &mut self.file {
            let _ = open.file.flush();
            let _ = open.file.sync_data();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path, max_bytes: u64, max_files: u32) -> FileSpec {
        FileSpec {
            path: dir.join("rec.jsonl"),
            max_bytes,
            max_files,
        }
    }

    fn count_lines(path: &Path) -> usize {
        std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
    }

    #[test]
    fn rotates_at_the_bound_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = RecordMetrics::register(&prometheus::Registry::new());
        let spec = spec(dir.path(), 100, 2);
        let mut file = RecordFile::open(spec.clone(), metrics.clone()).unwrap();
        let line = [b'x'; 39].iter().chain(b"\n").copied().collect::<Vec<u8>>();
        // 40-byte lines, 100-byte files: two lines each.
        for _ in 0..10 {
            file.write(&line, 1);
        }
        assert_eq!(metrics.lines.get(), 10);
        assert_eq!(metrics.rotations.get(), 4);
        assert_eq!(count_lines(&spec.path), 2);
        assert_eq!(count_lines(&numbered(&spec.path, 1)), 2);
        assert_eq!(count_lines(&numbered(&spec.path, 2)), 2);
        assert!(!numbered(&spec.path, 3).exists());
        for f in [spec.path.clone(), numbered(&spec.path, 1)] {
            assert!(std::fs::metadata(f).unwrap().len() <= 100);
        }
    }

    #[test]
    fn a_full_device_drops_and_counts_without_rotating_it() {
        if !Path::new("/dev/full").exists() {
            return;
        }
        let metrics = RecordMetrics::register(&prometheus::Registry::new());
        let spec = FileSpec {
            path: PathBuf::from("/dev/full"),
            max_bytes: 1,
            max_files: 1,
        };
        let mut file = RecordFile::open(spec, metrics.clone()).unwrap();
        file.write(b"a\nb\n", 2);
        // Within the retry pause: dropped without a write.
        file.write(b"c\n", 1);
        assert_eq!(metrics.dropped(DropReason::WriteError), 3);
        assert_eq!(metrics.lines.get(), 0);
        assert_eq!(metrics.rotations.get(), 0);
        assert!(Path::new("/dev/full").exists());
    }
}
