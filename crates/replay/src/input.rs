//! Reading the input files: each streamed line by line through one reused buffer (lines longer
//! than `MAX_LINE` are skipped, not buffered), each line decoded into a request each file reuses,
//! and several files merged by time (a k-way merge on the head line of each file). A line that
//! cannot be decoded is reported as `FILE:LINE: reason` and skipped; the run goes on.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use ratelimit_core::clock::Nanos;

/// The longest line read; a longer one is skipped (so memory does not follow the input).
pub(crate) const MAX_LINE: usize = 1 << 20;

/// Turns one input line into a request (reusing `out`) and its time; `None` for a line that
/// stands for no ShouldRateLimit call (an access-log line whose route sends no descriptor).
pub trait Decode {
    fn decode(&self, line: &[u8], out: &mut RateLimitRequest) -> Result<Option<Nanos>, String>;
}

/// Where skipped lines and jumps of the clock are reported: the first `print_max` of each on
/// stderr, then only counted.
#[derive(Debug)]
pub struct Problems {
    pub(crate) skipped: u64,
    /// Lines that decoded to no call (see `Decode`).
    pub(crate) without_call: u64,
    /// Lines that moved the virtual clock forward by more than a day at once.
    pub(crate) time_jumps: u64,
    print_max: u64,
}

impl Problems {
    pub fn new(print_max: u64) -> Self {
        Problems {
            skipped: 0,
            without_call: 0,
            time_jumps: 0,
            print_max,
        }
    }

    /// Says that the line at `file:line` moves the clock from `from` to `to`.
    pub fn jump(&mut self, (file, line): (&str, u64), from: Nanos, to: Nanos) {
        self.time_jumps += 1;
        if self.time_jumps <= self.print_max {
            let ahead = (to - from) / ratelimit_core::clock::NANOS_PER_SECOND;
            let (from, to) = (
                ratelimit_core::wire::time::format_second(
                    from / ratelimit_core::clock::NANOS_PER_SECOND,
                ),
                ratelimit_core::wire::time::format_second(
                    to / ratelimit_core::clock::NANOS_PER_SECOND,
                ),
            );
            eprintln!(
                "{file}:{line}: warning: the time jumps {} ahead, from {from} to {to}; every later \
                 line is decided at {to} or after (the replay's clock never goes back)",
                human_span(ahead)
            );
        } else if self.time_jumps == self.print_max + 1 {
            eprintln!("(more jumps of the time are counted, not printed)");
        }
    }

    fn skip(&mut self, file: &str, line: u64, reason: &str) {
        self.skipped += 1;
        if self.skipped <= self.print_max {
            eprintln!("{file}:{line}: {reason}");
        } else if self.skipped == self.print_max + 1 {
            eprintln!("(more skipped lines are counted, not printed)");
        }
    }
}

/// `seconds` in years or days, as a jump is told.
fn human_span(seconds: u64) -> String {
    const DAY: u64 = 86_400;
    const YEAR: u64 = 365 * DAY;
    if seconds >= 2 * YEAR {
        format!("{} years", seconds / YEAR)
    } else {
        format!("{} days", seconds / DAY)
    }
}

enum Read1 {
    Eof,
    /// A line in the buffer; whether it ended with `\n`.
    Line(bool),
    /// A line longer than `MAX_LINE`, consumed and dropped.
    TooLong,
}

/// Reads one line into `buf` (without the `\n`), dropping lines longer than `MAX_LINE`.
fn read_line(reader: &mut dyn BufRead, buf: &mut Vec<u8>) -> io::Result<Read1> {
    buf.clear();
    let mut too_long = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(match (too_long, buf.is_empty()) {
                (true, _) => Read1::TooLong,
                (false, true) => Read1::Eof,
                (false, false) => Read1::Line(false),
            });
        }
        let (part, used, done) = match memchr::memchr(b'\n', available) {
            Some(at) => (&available[..at], at + 1, true),
            None => (available, available.len(), false),
        };
        if !too_long && buf.len() + part.len() <= MAX_LINE {
            buf.extend_from_slice(part);
        } else {
            too_long = true;
            buf.clear();
        }
        reader.consume(used);
        if done {
            return Ok(if too_long {
                Read1::TooLong
            } else {
                Read1::Line(true)
            });
        }
    }
}

/// One input file and its current (decoded, not yet replayed) line.
struct Source {
    name: String,
    reader: Box<dyn BufRead>,
    buf: Vec<u8>,
    line: u64,
    request: RateLimitRequest,
    time: Nanos,
}

impl Source {
    /// Moves to the next line that decodes; false at the end of the file.
    fn advance(&mut self, decoder: &dyn Decode, problems: &mut Problems) -> io::Result<bool> {
        loop {
            let read = read_line(&mut *self.reader, &mut self.buf)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.name)))?;
            self.line += 1;
            let complete = match read {
                Read1::Eof => return Ok(false),
                Read1::TooLong => {
                    problems.skip(
                        &self.name,
                        self.line,
                        &format!("line longer than {MAX_LINE} bytes"),
                    );
                    continue;
                }
                Read1::Line(complete) => complete,
            };
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match decoder.decode(&self.buf, &mut self.request) {
                Ok(Some(time)) => {
                    self.time = time;
                    return Ok(true);
                }
                Ok(None) => problems.without_call += 1,
                Err(reason) if !complete => problems.skip(
                    &self.name,
                    self.line,
                    &format!("truncated (no newline at the end of the file): {reason}"),
                ),
                Err(reason) => problems.skip(&self.name, self.line, &reason),
            }
        }
    }
}

/// The input files merged by time: `next_request` gives the earliest head line of all files (ties in
/// file order; within a file, file order).
pub struct Merged<'d> {
    sources: Vec<Source>,
    heap: BinaryHeap<Reverse<(Nanos, usize)>>,
    /// The source whose line `next_request` returned last, to advance on the next call.
    current: Option<usize>,
    decoder: &'d dyn Decode,
    pub(crate) problems: Problems,
    /// Lines decoded and handed out.
    pub(crate) lines_replayed: u64,
}

impl<'d> Merged<'d> {
    /// Opens every file (`-` is standard input) and reads its first line.
    pub fn open(
        paths: &[impl AsRef<Path>],
        decoder: &'d dyn Decode,
        problems: Problems,
    ) -> io::Result<Self> {
        let mut merged = Merged {
            sources: Vec::with_capacity(paths.len()),
            heap: BinaryHeap::with_capacity(paths.len()),
            current: None,
            decoder,
            problems,
            lines_replayed: 0,
        };
        for path in paths {
            let path = path.as_ref();
            let name = path.display().to_string();
            let reader: Box<dyn Read> = if path == Path::new("-") {
                Box::new(io::stdin())
            } else {
                Box::new(
                    File::open(path)
                        .map_err(|e| io::Error::new(e.kind(), format!("{name}: {e}")))?,
                )
            };
            merged.add(name, Box::new(BufReader::with_capacity(256 << 10, reader)))?;
        }
        Ok(merged)
    }

    /// Adds an already open input.
    pub fn add(&mut self, name: String, reader: Box<dyn BufRead>) -> io::Result<()> {
        let mut source = Source {
            name,
            reader,
            buf: Vec::new(),
            line: 0,
            request: RateLimitRequest::default(),
            time: 0,
        };
        if source.advance(self.decoder, &mut self.problems)? {
            self.heap.push(Reverse((source.time, self.sources.len())));
        }
        self.sources.push(source);
        Ok(())
    }

    /// Reports that the line `next_request` returned last moves the clock from `from` to `to`.
    pub fn jumped(&mut self, from: Nanos, to: Nanos) {
        if let Some(source) = self.current.and_then(|i| self.sources.get(i)) {
            self.problems
                .jump((source.name.as_str(), source.line), from, to);
        }
    }

    /// The request of the line `next_request` returned last.
    pub fn current_request(&self) -> Option<&RateLimitRequest> {
        self.current
            .and_then(|i| self.sources.get(i))
            .map(|s| &s.request)
    }

    /// The next line in time order: its time and request.
    pub fn next_request(&mut self) -> io::Result<Option<(Nanos, &RateLimitRequest)>> {
        if let Some(i) = self.current.take() {
            let source = &mut self.sources[i];
            if source.advance(self.decoder, &mut self.problems)? {
                self.heap.push(Reverse((source.time, i)));
            }
        }
        let Some(Reverse((time, i))) = self.heap.pop() else {
            return Ok(None);
        };
        self.current = Some(i);
        self.lines_replayed += 1;
        Ok(Some((time, &self.sources[i].request)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines `TIME DOMAIN`; anything else is an error.
    struct Plain;
    impl Decode for Plain {
        fn decode(&self, line: &[u8], out: &mut RateLimitRequest) -> Result<Option<Nanos>, String> {
            let text = std::str::from_utf8(line).map_err(|e| e.to_string())?;
            if text == "none" {
                return Ok(None);
            }
            let (time, domain) = text.split_once(' ').ok_or("no space")?;
            out.domain = domain.to_owned();
            time.parse().map(Some).map_err(|_| "bad time".to_owned())
        }
    }

    fn drain(m: &mut Merged<'_>) -> Vec<(Nanos, String)> {
        let mut out = Vec::new();
        while let Some((t, r)) = m.next_request().expect("read") {
            out.push((t, r.domain.clone()));
        }
        out
    }

    fn reader(text: &str) -> Box<dyn BufRead> {
        Box::new(io::Cursor::new(text.as_bytes().to_vec()))
    }

    #[test]
    fn files_merge_by_time_and_bad_lines_are_skipped() {
        let mut m = Merged::open(&[] as &[&Path], &Plain, Problems::new(0)).expect("open");
        m.add("a".into(), reader("1 a1\n5 a5\nnonsense\n9 a9\n"))
            .unwrap();
        m.add("b".into(), reader("2 b2\n\nnone\n3 b3\n10 b10\n11 trunc"))
            .unwrap();
        m.add("c".into(), reader("")).unwrap();
        let got = drain(&mut m);
        let domains: Vec<&str> = got.iter().map(|(_, d)| d.as_str()).collect();
        assert_eq!(domains, ["a1", "b2", "b3", "a5", "a9", "b10", "trunc"]);
        assert_eq!(m.problems.skipped, 1);
        assert_eq!(m.problems.without_call, 1);
        assert_eq!(m.lines_replayed, 7);
    }

    #[test]
    fn a_truncated_last_line_and_an_overlong_line_are_skipped() {
        let mut m = Merged::open(&[] as &[&Path], &Plain, Problems::new(0)).expect("open");
        let long = format!("1 {}\n2 ok\n3 x", "y".repeat(MAX_LINE));
        m.add("f".into(), reader(&long)).unwrap();
        m.add("g".into(), reader("4 fine\n5")).unwrap();
        let got = drain(&mut m);
        assert_eq!(
            got,
            [
                (2, "ok".to_owned()),
                (3, "x".to_owned()),
                (4, "fine".to_owned())
            ]
        );
        assert_eq!(m.problems.skipped, 2);
    }
}
