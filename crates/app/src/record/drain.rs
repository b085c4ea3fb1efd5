//! The writer thread: every [`DRAIN_EVERY`] it takes the pending decisions whole, turns each frame
//! into its JSON line (hashing values when asked), and appends the lines to the record file in
//! pieces of about [`WRITE_EVERY_BYTES`] (so the lines of a large batch never sit in memory all at
//! once), cut at line ends where the file rotates; on stop it takes what is left, closes the
//! buffer, and syncs the file. It never wakes anyone: the answering threads only write frames into
//! the buffer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::metrics::DropReason;
use super::pending::{Pending, Records};
use super::writer::RecordFile;
use super::{Hashing, frame};
use ratelimit_core::wire::record::{Values, encode};

/// How often the writer takes the pending lines. It sleeps between drains instead of being
/// woken per line, so a decision never has to wake it (no futex on the answering thread) and lines
/// are written in batches, not one `write` per decision. Lines reach the file within this.
pub(super) const DRAIN_EVERY: Duration = Duration::from_millis(5);

/// Lines are written out once this many bytes of them are ready: the lines buffer holds at most
/// this and one line, however large the batch (a burst of 60 KB requests at the pending buffer's
/// 64 MiB bound would otherwise be as large again in lines).
pub(super) const WRITE_EVERY_BYTES: usize = 1 << 20;

/// A lines buffer grown past this (one very long line) is shrunk after its batch.
const KEEP_LINES_CAPACITY: usize = 2 * WRITE_EVERY_BYTES;

pub(super) struct Drain {
    pub(crate) pending: Arc<Pending>,
    pub(crate) file: RecordFile,
    pub(crate) hashing: Option<Hashing>,
    pub(crate) stop: Arc<AtomicBool>,
}

impl Drain {
    pub(super) fn run(mut self) {
        let mut records = Records::default();
        let mut lines = Records::default();
        let mut request = RateLimitRequest::default();
        loop {
            std::thread::sleep(DRAIN_EVERY);
            // Read before taking: once it is seen, this take is the last and closes the buffer.
            let stopping = self.stop.load(Ordering::SeqCst);
            self.pending.take(&mut records, stopping);
            self.write_lines(&records, &mut request, &mut lines);
            if stopping {
                break;
            }
        }
        self.file.sync();
    }

    /// Turns the frames in `records` into JSON lines and writes them, a piece of about
    /// [`WRITE_EVERY_BYTES`] at a time (`lines` is the reused buffer).
    fn write_lines(
        &mut self,
        records: &Records,
        request: &mut RateLimitRequest,
        lines: &mut Records,
    ) {
        lines.bytes.clear();
        lines.count = 0;
        let mut encoded = 0;
        let file = &mut self.file;
        let hashing = self.hashing.as_mut().map(Hashing::current);
        let read = frame::read_all(&records.bytes, request, |decided| {
            match &hashing {
                None => encode(decided, &Values::Clear, &mut lines.bytes),
                Some((key, named)) => {
                    let is_named = |domain: &str, k: &str, v: &str| {
                        named
                            .get(domain)
                            .and_then(|keys| keys.get(k))
                            .is_some_and(|values| values.contains(v))
                    };
                    let values = Values::Hashed {
                        key: *key,
                        named: &is_named,
                    };
                    encode(decided, &values, &mut lines.bytes);
                }
            }
            lines.count += 1;
            encoded += 1;
            if lines.bytes.len() >= WRITE_EVERY_BYTES {
                write_cut(file, lines);
                lines.bytes.clear();
                lines.count = 0;
            }
        });
        write_cut(file, lines);
        lines.bytes.clear();
        lines.count = 0;
        if lines.bytes.capacity() > KEEP_LINES_CAPACITY {
            lines.bytes.shrink_to(KEEP_LINES_CAPACITY);
        }
        if let Err(left) = read {
            // Only a bug writes a frame that does not read back; its decisions are counted.
            tracing::error!(left, "the record writer could not read pending decisions");
            self.file
                .metrics()
                .count_drop(DropReason::WriteError, records.count - encoded);
        }
    }
}

/// Writes `lines`, cut at the last line end that still fits the current file before it rotates
/// (a line longer than a whole file goes alone), so no file passes its bound but by one line.
fn write_cut(file: &mut RecordFile, lines: &Records) {
    let mut rest = lines.bytes.as_slice();
    let mut count = lines.count;
    while !rest.is_empty() {
        let room = usize::try_from(file.room()).unwrap_or(usize::MAX);
        let cut = if rest.len() <= room {
            rest.len()
        } else {
            match memchr::memrchr(b'\n', &rest[..room]) {
                Some(end) => end + 1,
                None => memchr::memchr(b'\n', rest).map_or(rest.len(), |end| end + 1),
            }
        };
        let (piece, after) = rest.split_at(cut);
        let pieces_lines = if after.is_empty() {
            count
        } else {
            memchr::memchr_iter(b'\n', piece).count() as u64
        };
        file.write(piece, pieces_lines);
        count -= pieces_lines;
        rest = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::metrics::RecordMetrics;
    use crate::record::writer::FileSpec;

    use crate::record::rotated::numbered;

    #[test]
    fn a_batch_is_cut_at_line_ends_where_the_file_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = RecordMetrics::register(&prometheus::Registry::new());
        let spec = FileSpec {
            path: dir.path().join("rec.jsonl"),
            max_bytes: 25,
            max_files: 5,
        };
        let mut file = RecordFile::open(spec.clone(), metrics.clone()).unwrap();
        // Lines of 10, 10, 10, 40 (longer than a file) and 3 bytes.
        let mut lines = Records::default();
        for line in ["aaaaaaaaa\n", "bbbbbbbbb\n", "ccccccccc\n"] {
            lines.bytes.extend_from_slice(line.as_bytes());
        }
        lines.bytes.extend_from_slice(&[b'd'; 39]);
        lines.bytes.extend_from_slice(b"\nee\n");
        lines.count = 5;
        write_cut(&mut file, &lines);
        assert_eq!(metrics.lines.get(), 5);
        let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap();
        // The numbers count up: FILE.1 is the oldest.
        assert_eq!(read(numbered(&spec.path, 1)), "aaaaaaaaa\nbbbbbbbbb\n");
        assert_eq!(read(numbered(&spec.path, 2)), "ccccccccc\n");
        assert_eq!(
            read(numbered(&spec.path, 3)),
            format!("{}\n", "d".repeat(39))
        );
        assert_eq!(read(spec.path.clone()), "ee\n");
    }
}
