//! Inputs: a byte reader that turns fuzz bytes into choices (so every input, generated or mutated,
//! is a byte string that can be saved and replayed), and the mutator.

use rand::Rng;
use rand::rngs::StdRng;

/// Largest input the mutator makes.
pub const MAX_INPUT: usize = 64 * 1024;

/// Reads choices from bytes; past the end every read is 0.
pub struct Choices<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Choices { data, pos: 0 }
    }

    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { self.u16() as usize % n }
    }

    /// True with probability about `percent`%.
    pub fn chance(&mut self, percent: u8) -> bool {
        self.byte() % 100 < percent
    }

    pub fn pick<'v, T>(&mut self, values: &'v [T]) -> &'v T {
        &values[self.below(values.len())]
    }

    /// One of `vocabulary` mostly, else a short string of raw bytes (lossy UTF-8).
    pub fn word(&mut self, vocabulary: &[&str]) -> String {
        if self.chance(85) {
            (*self.pick(vocabulary)).to_owned()
        } else {
            let len = self.below(12);
            let bytes: Vec<u8> = (0..len).map(|_| self.byte()).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    pub fn u64(&mut self) -> u64 {
        match self.below(6) {
            0 => 0,
            1 => 1,
            2 => u64::from(self.byte() % 8),
            3 => u64::from(u32::MAX) + u64::from(self.byte()),
            4 => u64::MAX - u64::from(self.byte()),
            _ => u64::from(self.u16()),
        }
    }
}

/// Applies 1 to 8 random edits to `input`: bit flips, byte sets, inserted random or dictionary
/// bytes, deletions, duplicated ranges, and splices from `other`.
pub fn mutate(rng: &mut StdRng, input: &[u8], other: &[u8], dictionary: &[&[u8]]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.random_range(1..=8) {
        let len = out.len();
        let at = if len == 0 {
            0
        } else {
            rng.random_range(0..=len)
        };
        match rng.random_range(0..7) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                out[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                out[i] = rng.random();
            }
            2 => {
                let n = rng.random_range(1..=8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                out.splice(at..at, bytes);
            }
            3 if !dictionary.is_empty() => {
                let token = dictionary[rng.random_range(0..dictionary.len())];
                out.splice(at..at, token.iter().copied());
            }
            4 if len > 0 => {
                let start = rng.random_range(0..len);
                let end = (start + rng.random_range(1..=32)).min(len);
                out.drain(start..end);
            }
            5 if len > 0 => {
                let start = rng.random_range(0..len);
                let end = (start + rng.random_range(1..=64)).min(len);
                let copy = out[start..end].to_vec();
                out.splice(at..at, copy);
            }
            _ if !other.is_empty() => {
                let start = rng.random_range(0..other.len());
                let end = (start + rng.random_range(1..=128)).min(other.len());
                out.splice(at..at, other[start..end].iter().copied());
            }
            _ => {}
        }
    }
    out.truncate(MAX_INPUT);
    out
}
