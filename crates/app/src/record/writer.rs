//! The record file: appends batches of whole lines, rotates `FILE` → `FILE.<n>` at
//! `--record-max-bytes` (`rotated`: no kept file is ever renamed), and survives write errors. A
//! write that stops part way (a full disk, a file size limit) is cut back to the last whole line it
//! wrote, so the file never holds half a line: the whole lines count as written, the rest of the
//! batch as dropped (`write_error`). The error is logged once a minute per kind, and writing is
//! retried (the file reopened, and a partial last line left by an earlier process or a failed cut
//! removed) after a pause. Runs on the writer thread only.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::metrics::{DropReason, RecordMetrics};
use super::rotated::Rotated;

/// How long writing pauses after an error before the file is reopened.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The same kind of error is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Where and how big: plain data, part of [`RecordConfig`](super::RecordConfig).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    pub path: PathBuf,
    /// Rotate before a batch would take the file past this size.
    pub max_bytes: u64,
    /// Rotated files kept (`FILE.<n>`, the highest `n` the newest).
    pub max_files: u32,
}

pub(crate) struct RecordFile {
    spec: FileSpec,
    metrics: RecordMetrics,
    /// `None` after an error, until `retry_at`.
    file: Option<Open>,
    retry_at: Instant,
    /// The rotated files, read from the directory at the first rotation.
    rotated: Option<Rotated>,
    /// Per error kind: when it was last logged, and how many errors since.
    logged: HashMap<io::ErrorKind, (Instant, u64)>,
}

struct Open {
    file: File,
    size: u64,
    /// Only regular files rotate and are cut back (not `/dev/full`, a FIFO or a terminal).
    rotates: bool,
}

/// Opens (creates) `path` for appending; a regular file that ends in a partial line is cut back
/// to its last whole line first (how many bytes were cut is returned).
fn open(path: &Path) -> io::Result<(Open, u64)> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let meta = file.metadata()?;
    let mut open = Open {
        size: meta.len(),
        rotates: meta.is_file(),
        file,
    };
    let cut = if open.rotates && open.size > 0 {
        cut_partial_tail(path, &mut open)?
    } else {
        0
    };
    Ok((open, cut))
}

/// Cuts a last line without its `\n` off the file (reading back from the end); returns the
/// bytes cut.
fn cut_partial_tail(path: &Path, open: &mut Open) -> io::Result<u64> {
    const STEP: u64 = 64 << 10;
    let mut reader = File::open(path)?;
    let mut end = open.size;
    let mut buf = vec![0u8; STEP as usize];
    let mut first = true;
    while end > 0 {
        let start = end.saturating_sub(STEP);
        let chunk = &mut buf[..(end - start) as usize];
        reader.seek(SeekFrom::Start(start))?;
        reader.read_exact(chunk)?;
        if first && chunk.last() == Some(&b'\n') {
            return Ok(0);
        }
        first = false;
        if let Some(at) = memchr::memrchr(b'\n', chunk) {
            end = start + at as u64 + 1;
            break;
        }
        end = start;
    }
    let cut = open.size - end;
    if cut > 0 {
        open.file.set_len(end)?;
        open.size = end;
    }
    Ok(cut)
}

/// Writes `batch` at the end of `open`. On an error part way, what was written is cut back to
/// the last whole line. Returns the bytes of whole lines now in the file, and the error.
fn write_whole_lines(open: &mut Open, batch: &[u8]) -> (usize, Option<io::Error>) {
    let mut written = 0;
    let error = loop {
        if written == batch.len() {
            break None;
        }
        match open.file.write(&batch[written..]) {
            Ok(0) => break Some(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Some(e),
        }
    };
    let Some(error) = error else {
        open.size += written as u64;
        return (written, None);
    };
    let whole = memchr::memrchr(b'\n', &batch[..written]).map_or(0, |at| at + 1);
    if whole < written && open.rotates {
        // A failed cut leaves the partial line to the next open, which cuts it then.
        if let Err(e) = open.file.set_len(open.size + whole as u64) {
            tracing::debug!(error = %e, "cannot cut a partial record line");
        }
    }
    open.size += whole as u64;
    (whole, Some(error))
}

impl RecordFile {
    /// Opens (creates) the file now, so that a path that cannot be written stops the start.
    pub(crate) fn open(spec: FileSpec, metrics: RecordMetrics) -> io::Result<RecordFile> {
        let (file, cut) = open(&spec.path)?;
        if cut > 0 {
            tracing::warn!(
                path = %spec.path.display(),
                bytes = cut,
                "the record file ended in a partial line (a write cut short before this start); \
                 it was cut back to its last whole line"
            );
        }
        Ok(RecordFile {
            spec,
            metrics,
            file: Some(file),
            retry_at: ratelimit_core::clock::monotonic(),
            rotated: None,
            logged: HashMap::new(),
        })
    }

    pub(crate) fn metrics(&self) -> &RecordMetrics {
        &self.metrics
    }

    /// Writes `batch` (`lines` whole lines), rotating first when it would take the file past the
    /// size bound. Only whole lines reach the file: after a failed write, the lines that made it
    /// count as written and the rest as dropped.
    pub(crate) fn write(&mut self, batch: &[u8], lines: u64) {
        if batch.is_empty() {
            return;
        }
        if self.file.is_none() {
            if ratelimit_core::clock::monotonic() < self.retry_at {
                self.metrics.count_drop(DropReason::WriteError, lines);
                return;
            }
            match open(&self.spec.path) {
                Ok((file, cut)) => {
                    tracing::info!(path = %self.spec.path.display(), cut_bytes = cut, "recording again");
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
        let (whole, error) = write_whole_lines(open, batch);
        let written_lines = if whole == batch.len() {
            lines
        } else {
            (memchr::memchr_iter(b'\n', &batch[..whole]).count() as u64).min(lines)
        };
        self.metrics.lines.inc_by(written_lines);
        self.metrics.bytes.inc_by(whole as u64);
        if let Some(e) = error {
            self.failed(e, "cannot write the record file", lines - written_lines);
        }
    }

    /// Renames `FILE` to the next `FILE.<n>`, deletes the oldest beyond `--record-max-files`,
    /// and opens a new `FILE`. A failed rename keeps writing where it can; nothing already
    /// written is lost but the oldest file.
    fn rotate(&mut self) {
        let rotated = match self.rotated.take() {
            Some(r) => Ok(r),
            None => Rotated::scan(&self.spec.path),
        };
        let mut rotated = match rotated {
            Ok(r) => r,
            Err(e) => {
                self.log(
                    &e,
                    "cannot list the rotated record files (writing on to the file)",
                );
                return;
            }
        };
        let result = rotated.rotate(self.spec.max_files);
        self.rotated = Some(rotated);
        match result {
            Err(e) => {
                self.log(&e, "cannot rotate the record file (writing on to it)");
                return;
            }
            Ok(Some(e)) => self.log(&e, "cannot delete the oldest rotated record file"),
            Ok(None) => {}
        }
        self.metrics.rotations.inc();
        match open(&self.spec.path) {
            Ok((file, _)) => self.file = Some(file),
            Err(e) => self.failed(e, "cannot open a new record file after rotating", 0),
        }
    }

    fn failed(&mut self, error: io::Error, message: &str, lines: u64) {
        self.metrics.count_drop(DropReason::WriteError, lines);
        self.log(&error, message);
        self.file = None;
        self.retry_at = ratelimit_core::clock::monotonic() + RETRY_AFTER;
    }

    /// Logs an error at most once per [`LOG_EVERY`] per kind, saying how many were not logged.
    fn log(&mut self, error: &io::Error, message: &str) {
        let now = ratelimit_core::clock::monotonic();
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
    pub(crate) fn room(&self) -> u64 {
        match &self.file {
            Some(open) if open.rotates => self.spec.max_bytes.saturating_sub(open.size),
            _ => u64::MAX,
        }
    }

    /// Flushes what the OS holds to the disk (at shutdown).
    pub(crate) fn sync(&mut self) {
        if let Some(open) = &mut self.file {
            let _ = open.file.flush();
            let _ = open.file.sync_data();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::rotated::numbered;
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
        // FILE.1 … FILE.4 were made, the newest last; the two oldest are gone.
        assert_eq!(count_lines(&spec.path), 2);
        assert_eq!(count_lines(&numbered(&spec.path, 4)), 2);
        assert_eq!(count_lines(&numbered(&spec.path, 3)), 2);
        for gone in [1, 2, 5] {
            assert!(!numbered(&spec.path, gone).exists(), "FILE.{gone}");
        }
        for f in [spec.path.clone(), numbered(&spec.path, 4)] {
            assert!(std::fs::metadata(f).unwrap().len() <= 100);
        }
    }

    #[test]
    fn a_rotation_renames_no_kept_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let metrics = RecordMetrics::register(&prometheus::Registry::new());
        let spec = spec(dir.path(), 100, 1000);
        let mut file = RecordFile::open(spec.clone(), metrics.clone()).unwrap();
        let line = [b'x'; 99].iter().chain(b"\n").copied().collect::<Vec<u8>>();
        file.write(&line, 1);
        file.write(&line, 1);
        let inode = |n| std::fs::metadata(numbered(&spec.path, n)).unwrap().ino();
        for _ in 0..1500 {
            file.write(&line, 1);
        }
        assert_eq!(metrics.rotations.get(), 1501);
        // FILE.1 … FILE.501 were deleted as the oldest; FILE.502 … FILE.1501 are kept, each
        // where its rotation put it.
        assert!(!numbered(&spec.path, 1).exists() && !numbered(&spec.path, 501).exists());
        assert!(numbered(&spec.path, 502).exists() && numbered(&spec.path, 1501).exists());
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, 1001, "FILE and 1000 rotated files");
        // One more rotation: FILE.502 goes, FILE.1502 comes, the others stay as they are.
        let kept = inode(1000);
        file.write(&line, 1);
        assert_eq!(inode(1000), kept, "a kept file was renamed");
        assert!(!numbered(&spec.path, 502).exists() && numbered(&spec.path, 1502).exists());
    }

    #[test]
    fn a_partial_last_line_is_cut_when_the_file_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = RecordMetrics::register(&prometheus::Registry::new());
        let spec = spec(dir.path(), 1 << 20, 2);
        let long = "y".repeat(200_000);
        std::fs::write(&spec.path, format!("{{\"a\":1}}\n{{\"b\":{long}")).unwrap();
        let mut file = RecordFile::open(spec.clone(), metrics.clone()).unwrap();
        file.write(b"{\"c\":3}\n", 1);
        assert_eq!(
            std::fs::read_to_string(&spec.path).unwrap(),
            "{\"a\":1}\n{\"c\":3}\n"
        );
        // A file of whole lines, or an empty one, is left as it is.
        drop(file);
        let _ = RecordFile::open(spec.clone(), metrics.clone()).unwrap();
        assert_eq!(count_lines(&spec.path), 2);
        std::fs::write(&spec.path, "no line end at all").unwrap();
        let _ = RecordFile::open(spec.clone(), metrics).unwrap();
        assert_eq!(std::fs::read_to_string(&spec.path).unwrap(), "");
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
