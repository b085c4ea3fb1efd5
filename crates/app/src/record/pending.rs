//! Decisions waiting for the writer: one buffer the answering threads append records to (a short
//! lock around writing one `frame`) and the writer takes whole, swapping in an empty one, every
//! drain. Bounded in records and in bytes: a record that does not fit is refused, never waited
//! for. Closed when the writer stops, after which every record is refused. No I/O.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Why a record was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotQueued {
    /// The bound in records or bytes is reached: the writer is behind.
    Full,
    /// The writer has stopped (shutdown).
    Closed,
}

/// Records taken from the buffer, for the writer.
#[derive(Debug, Default)]
pub(super) struct Records {
    /// Whole records, one after the other.
    pub(crate) bytes: Vec<u8>,
    pub(crate) count: u64,
}

#[derive(Debug, Default)]
struct Buffer {
    records: Records,
    closed: bool,
}

#[derive(Debug)]
pub(super) struct Pending {
    buffer: Mutex<Buffer>,
    max_records: u64,
    max_bytes: usize,
}

/// A buffer handed back bigger than this is shrunk, so one burst does not keep its memory.
const KEEP_CAPACITY: usize = 1 << 20;

impl Pending {
    pub(super) fn new(max_records: usize, max_bytes: usize) -> Pending {
        Pending {
            buffer: Mutex::default(),
            max_records: max_records.max(1) as u64,
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // Appends and swaps leave the buffer whole at every step, so a poisoned lock is still
        // consistent.
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one record, written by `write`, unless the buffer is full or closed (a record that
    /// takes the buffer past its byte bound is taken back).
    pub(super) fn push_with(&self, write: impl FnOnce(&mut Vec<u8>)) -> Result<(), NotQueued> {
        let mut buffer = self.lock();
        if buffer.closed {
            return Err(NotQueued::Closed);
        }
        let records = &mut buffer.records;
        if records.count >= self.max_records {
            return Err(NotQueued::Full);
        }
        let start = records.bytes.len();
        write(&mut records.bytes);
        if records.bytes.len() > self.max_bytes {
            records.bytes.truncate(start);
            return Err(NotQueued::Full);
        }
        records.count += 1;
        Ok(())
    }

    /// Appends `record` as it is.
    #[cfg(test)]
    pub(super) fn push(&self, record: &[u8]) -> Result<(), NotQueued> {
        self.push_with(|out| out.extend_from_slice(record))
    }

    /// Takes every record buffered so far into `into` (which must be empty; its allocation becomes
    /// the buffer's), and with `close` refuses every later record.
    pub(super) fn take(&self, into: &mut Records, close: bool) {
        into.bytes.clear();
        into.count = 0;
        if into.bytes.capacity() > KEEP_CAPACITY {
            into.bytes.shrink_to(KEEP_CAPACITY);
        }
        let mut buffer = self.lock();
        std::mem::swap(&mut buffer.records, into);
        buffer.closed |= close;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_taken_whole_in_order_and_the_bounds_refuse_without_waiting() {
        let pending = Pending::new(3, 10);
        assert_eq!(pending.push(b"a\n"), Ok(()));
        assert_eq!(pending.push(b"bbbbbb\n"), Ok(()));
        // 9 bytes held: a 2-byte record would pass the byte bound.
        assert_eq!(pending.push(b"c\n"), Err(NotQueued::Full));
        assert_eq!(pending.push(b"\n"), Ok(()));
        // 3 records held: the record bound.
        assert_eq!(pending.push(b""), Err(NotQueued::Full));
        let mut taken = Records::default();
        pending.take(&mut taken, false);
        assert_eq!(
            (taken.bytes.as_slice(), taken.count),
            (&b"a\nbbbbbb\n\n"[..], 3)
        );
        // Room again; what was taken is not taken twice.
        assert_eq!(pending.push(b"d\n"), Ok(()));
        pending.take(&mut taken, true);
        assert_eq!((taken.bytes.as_slice(), taken.count), (&b"d\n"[..], 1));
        assert_eq!(pending.push(b"e\n"), Err(NotQueued::Closed));
        pending.take(&mut taken, true);
        assert_eq!(taken.count, 0);
    }

    #[test]
    fn a_burst_does_not_keep_its_memory() {
        let pending = Pending::new(usize::MAX, usize::MAX);
        let line = vec![b'x'; 4096];
        for _ in 0..1024 {
            pending.push(&line).unwrap();
        }
        let mut taken = Records::default();
        pending.take(&mut taken, false);
        assert_eq!(taken.bytes.len(), 4 << 20);
        // Handed back on the next take: shrunk before it becomes the buffer.
        pending.take(&mut taken, false);
        pending.take(&mut taken, false);
        assert!(taken.bytes.capacity() <= KEEP_CAPACITY);
    }
}
