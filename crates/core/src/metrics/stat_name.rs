//! Stat names as envoyproxy/ratelimit sanitizes them (`utils.SanitizeStatName`, applied to every
//! rule's stats key and to the domain of `domain_not_found`): `:` and `|` (statsd's separators)
//! become `_`, then the dots of every IPv4-looking run become `_`, the runs being the matches of
//! the Go regexp `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` as `ReplaceAllStringFunc` finds them:
//! leftmost first, not overlapping, the scan going on after each match (`\d` is ASCII in Go).
//! So a request from `10.0.0.1` is `remote_address_10_0_0_1`, one name part and not four.
//!
//! Every change is one ASCII byte for another, so a name keeps its length and stays UTF-8. No
//! regex: a match is at most 15 bytes, so [`Sanitizer`] decides each one with a 15-byte window
//! and can sanitize a text given in pieces (a label that is never copied whole).

use std::borrow::Cow;

/// The longest match: `ddd.ddd.ddd.ddd`.
const IPV4_MAX: usize = 15;

fn in_run(b: u8) -> bool {
    b.is_ascii_digit() || b == b'.'
}

/// The length of the match of `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` at the start of `text`, as
/// Go's backtracking-equivalent leftmost-first semantics take it. The first three numbers must
/// each be followed by a dot, so each is the whole run of digits before it (1 to 3 of them: a
/// fourth digit where the dot should be fails the match at this start); the last one is greedy,
/// up to 3 digits.
fn ipv4_at(text: &[u8]) -> Option<usize> {
    let mut at = 0;
    for number in 0..4 {
        let start = at;
        while at < text.len() && at - start < 3 && text[at].is_ascii_digit() {
            at += 1;
        }
        if at == start {
            return None;
        }
        if number < 3 {
            if text.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
    }
    Some(at)
}

/// Sanitizes a text given in pieces, passing on the sanitized bytes in order. Bytes that are not
/// digits or dots go on at once (`:` and `|` as `_`); a run of digits and dots is held back, at
/// most [`IPV4_MAX`] bytes of it, until whether a match starts at its first byte is decided.
#[derive(Debug, Default)]
pub(crate) struct Sanitizer {
    held: [u8; IPV4_MAX],
    len: usize,
}

impl Sanitizer {
    /// The next piece of the text.
    pub(crate) fn push(&mut self, mut text: &[u8], out: &mut impl FnMut(&[u8])) {
        while let Some(&first) = text.first() {
            let same = text
                .iter()
                .position(|&b| in_run(b) != in_run(first))
                .unwrap_or(text.len());
            let (now, rest) = text.split_at(same);
            if in_run(first) {
                for &b in now {
                    if self.len == IPV4_MAX {
                        self.step(out);
                    }
                    self.held[self.len] = b;
                    self.len += 1;
                }
            } else {
                // A byte outside any run ends the held one: no match goes past it.
                self.flush(out);
                for part in now.split_inclusive(|&b| b == b':' || b == b'|') {
                    match part.split_last() {
                        Some((b':' | b'|', before)) => {
                            out(before);
                            out(b"_");
                        }
                        _ => out(part),
                    }
                }
            }
            text = rest;
        }
    }

    /// The end of the text.
    pub(crate) fn finish(&mut self, out: &mut impl FnMut(&[u8])) {
        self.flush(out);
    }

    fn flush(&mut self, out: &mut impl FnMut(&[u8])) {
        while self.len > 0 {
            self.step(out);
        }
    }

    /// Decides the first held byte: the start of a match (passed on with its dots as `_`, the
    /// scan going on after it), or not (passed on as it is). Called with the window full, or at
    /// the end of the run: either way, all a match there could take is held.
    fn step(&mut self, out: &mut impl FnMut(&[u8])) {
        let held = &self.held[..self.len];
        let taken = match ipv4_at(held) {
            Some(len) => {
                let mut matched = [0; IPV4_MAX];
                for (to, &b) in matched.iter_mut().zip(held) {
                    *to = if b == b'.' { b'_' } else { b };
                }
                out(&matched[..len]);
                len
            }
            None => {
                out(&held[..1]);
                1
            }
        };
        self.held.copy_within(taken..self.len, 0);
        self.len -= taken;
    }
}

/// `name` as the reference names a stat after it (see the module's doc); borrowed when nothing
/// changes.
pub fn sanitize_stat_name(name: &str) -> Cow<'_, str> {
    let bytes = name.as_bytes();
    let changes = bytes.contains(&b':')
        || bytes.contains(&b'|')
        || (0..bytes.len()).any(|at| bytes[at].is_ascii_digit() && ipv4_at(&bytes[at..]).is_some());
    if !changes {
        return Cow::Borrowed(name);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut sanitizer = Sanitizer::default();
    let mut push = |b: &[u8]| out.extend_from_slice(b);
    sanitizer.push(bytes, &mut push);
    sanitizer.finish(&mut push);
    // ASCII bytes replaced by ASCII bytes: still UTF-8.
    Cow::Owned(
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn separators_and_the_dots_of_ipv4_addresses_become_underscores() {
        for (name, want) in [
            ("a:b|c", "a_b_c"),
            ("remote_address_10.0.0.1", "remote_address_10_0_0_1"),
            // IPv6: only the colons.
            ("2001:db8::1", "2001_db8__1"),
            (
                "remote_address_::ffff:10.0.0.1",
                "remote_address___ffff_10_0_0_1",
            ),
            // Dots of anything else stay: they split the name into parts, as in the reference.
            ("api.example.com", "api.example.com"),
            ("tenant_a.path_/x", "tenant_a.path_/x"),
            ("v1.2.3", "v1.2.3"),
            ("", ""),
        ] {
            assert_eq!(sanitize_stat_name(name), want, "{name}");
        }
        assert!(matches!(
            sanitize_stat_name("api.example.com"),
            Cow::Borrowed(_)
        ));
    }

    /// What Go's `ReplaceAllStringFunc` makes of the edges of the regexp.
    #[test]
    fn runs_are_matched_leftmost_first_without_overlap() {
        for (name, want) in [
            // Four numbers from the leftmost start: `1.2.3.4`, leaving `.5`.
            ("1.2.3.4.5", "1_2_3_4.5"),
            // After a match the scan goes on past it: `5.6.7.8` is the next one.
            ("1.2.3.4.5.6.7.8", "1_2_3_4.5_6_7_8"),
            ("1.2.3.4.5.6.7", "1_2_3_4.5.6.7"),
            // No match can start at `1` (four digits before the dot); one starts at `2`.
            ("1234.1.1.1", "1234_1_1_1"),
            // A middle number of four digits: no match anywhere that reaches past it.
            ("1.2345.1.1.1", "1.2345_1_1_1"),
            // The last number takes at most three digits, the rest stays.
            ("10.0.0.1234", "10_0_0_1234"),
            ("10.0.0.1.", "10_0_0_1."),
            ("x10.0.0.1y", "x10_0_0_1y"),
            ("..1.2.3.4..", "..1_2_3_4.."),
            // A colon or bar is no digit: it ends a run (whether replaced first or not).
            ("1.2:3.4", "1.2_3.4"),
            ("10.0.0.1:8080", "10_0_0_1_8080"),
            // Not ASCII digits: `\d` is ASCII in Go.
            ("١.٢.٣.٤", "١.٢.٣.٤"),
            ("é1.2.3.4é", "é1_2_3_4é"),
        ] {
            assert_eq!(sanitize_stat_name(name), want, "{name}");
        }
    }

    fn by_regex(name: &str) -> String {
        // The reference's regexp with `\d` spelled as Go reads it (ASCII digits); Rust's regex
        // and Go's find leftmost-first, non-overlapping matches alike.
        let ipv4 = regex::Regex::new(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}").unwrap();
        let replaced = name.replace([':', '|'], "_");
        ipv4.replace_all(&replaced, |c: &regex::Captures<'_>| c[0].replace('.', "_"))
            .into_owned()
    }

    proptest! {
        /// Whatever the text and however it comes in pieces, the regexp's answer.
        #[test]
        fn the_same_as_the_regexp(
            name in "[0-9.:|a]{0,40}|[0-9.]{0,60}|[0-9]{1,4}(\\.[0-9]{1,4}){0,9}",
            cuts in proptest::collection::vec(0usize..60, 0..6),
        ) {
            let want = by_regex(&name);
            prop_assert_eq!(&*sanitize_stat_name(&name), want.as_str());
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c <= name.len()).collect();
            cuts.sort_unstable();
            let mut out = Vec::new();
            let mut push = |b: &[u8]| out.extend_from_slice(b);
            let mut sanitizer = Sanitizer::default();
            let mut from = 0;
            for cut in cuts.into_iter().chain([name.len()]) {
                sanitizer.push(&name.as_bytes()[from..cut], &mut push);
                from = cut;
            }
            sanitizer.finish(&mut push);
            prop_assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }
}
