//! Encoded lines waiting for the writer: one buffer the answering threads append whole lines to
//! (a short lock around a copy) and the writer takes whole, swapping in an empty one, every drain.
//! Bounded in lines and in bytes: a line that does not fit is refused, never waited for.
//! Closed when the writer stops, after which every line is refused. No I/O.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Why a line was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The bound in lines or bytes is reached: the writer is behind.
    Full,
    /// The writer has stopped (shutdown).
    Closed,
}

/// Lines taken from the buffer, for the writer.
#[derive(Debug, Default)]
pub struct Lines {
    /// Whole lines, each ending in `\n`.
    pub bytes: Vec<u8>,
    pub count: u64,
}

#[derive(Debug, Default)]
struct Buffer {
    lines: Lines,
    closed: bool,
}

#[derive(Debug)]
pub struct Pending {
    buffer: Mutex<Buffer>,
    max_lines: u64,
    max_bytes: usize,
}

/// A buffer handed back bigger than this is shrunk, so one burst does not keep its memory.
const KEEP_CAPACITY: usize = 1 << 20;

impl Pending {
    pub fn new(max_lines: usize, max_bytes: usize) -> Pending {
        Pending {
            buffer: Mutex::default(),
            max_lines: max_lines.max(1) as u64,
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // Appends and swaps leave the buffer whole at every step, so a poisoned lock is still
        // consistent.
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one encoded line (with its `\n`), unless the buffer is full or closed.
    pub fn push(&self, line: &[u8]) -> Result<(), Refused> {
        let mut buffer = self.lock();
        if buffer.closed {
            return Err(Refused::Closed);
        }
        let lines = &mut buffer.lines;
        if lines.count >= self.max_lines || lines.bytes.len() + line.len() > self.max_bytes {
            return Err(Refused::Full);
        }
        lines.bytes.extend_from_slice(line);
        lines.count += 1;
        Ok(())
    }

    /// Takes every line buffered so far into `into` (which must be empty; its allocation becomes
    /// the buffer's), and with `close` refuses every later line.
    pub fn take(&self, into: &mut Lines, close: bool) {
        into.bytes.clear();
        into.count = 0;
        if into.bytes.capacity() > KEEP_CAPACITY {
            into.bytes.shrink_to(KEEP_CAPACITY);
        }
        let mut buffer = self.lock();
        std::mem::swap(&mut buffer.lines, into);
        buffer.closed |= close;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_taken_whole_in_order_and_the_bounds_refuse_without_waiting() {
        let pending = Pending::new(3, 10);
        assert_eq!(pending.push(b"a\n"), Ok(()));
        assert_eq!(pending.push(b"bbbbbb\n"), Ok(()));
        // 9 bytes held: a 2-byte line would pass the byte bound.
        assert_eq!(pending.push(b"c\n"), Err(Refused::Full));
        assert_eq!(pending.push(b"\n"), Ok(()));
        // 3 lines held: the line bound.
        assert_eq!(pending.push(b""), Err(Refused::Full));
        let mut taken = Lines::default();
        pending.take(&mut taken, false);
        assert_eq!(
            (taken.bytes.as_slice(), taken.count),
            (&b"a\nbbbbbb\n\n"[..], 3)
        );
        // Room again; what was taken is not taken twice.
        assert_eq!(pending.push(b"d\n"), Ok(()));
        pending.take(&mut taken, true);
        assert_eq!((taken.bytes.as_slice(), taken.count), (&b"d\n"[..], 1));
        assert_eq!(pending.push(b"e\n"), Err(Refused::Closed));
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
        let mut taken = Lines::default();
        pending.take(&mut taken, false);
        assert_eq!(taken.bytes.len(), 4 << 20);
        // Handed back on the next take: shrunk before it becomes the buffer.
        pending.take(&mut taken, false);
        pending.take(&mut taken, false);
        assert!(taken.bytes.capacity() <= KEEP_CAPACITY);
    }
}
