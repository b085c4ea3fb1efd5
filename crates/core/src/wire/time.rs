//! RFC 3339 instants ↔ Unix nanoseconds, UTC, without a date library, both ways, in one place: the
//! record line's `time` (`2026-12-01T05:00:00.123456789Z`, written and read), Envoy's
//! `%START_TIME%` (`2026-12-01T05:00:00.123Z`), whole seconds for reports and logs. Pure.

use crate::clock::{NANOS_PER_SECOND, Nanos};

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian; H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count from 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let part = b.get(at..at + n)?;
    part.iter().try_fold(0u32, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

/// The last instant a replay's clock can hold: `u64::MAX` nanoseconds after 1970
/// (2554-07-21T23:34:33.709551615Z).
pub(crate) const LAST: Nanos = u64::MAX;

/// Why a `time` is not an instant a replay can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeError {
    /// Not `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`.
    NotRfc3339,
    /// Valid RFC 3339, but before 1970 or after `LAST`.
    OutOfRange,
}

impl TimeError {
    /// What is wrong with `field`'s value `text`, for a skipped line's reason.
    pub fn describe(self, field: &str, text: &str) -> String {
        match self {
            TimeError::NotRfc3339 => format!("`{field}` {text:?} is not RFC 3339"),
            TimeError::OutOfRange => format!(
                "`{field}` {text:?} is valid RFC 3339 but outside the instants replay handles, \
                 1970-01-01T00:00:00Z to {} (nanoseconds since 1970 in 64 bits)",
                format_second(LAST / NANOS_PER_SECOND)
            ),
        }
    }
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` (`t` or a space also separate date and time)
/// into Unix nanoseconds. Instants before 1970 or unparseable text give `None`.
pub(crate) fn parse_rfc3339(text: &str) -> Option<Nanos> {
    parse_instant(text).ok()
}

/// As `parse_rfc3339`, saying why a text is not an instant.
pub fn parse_instant(text: &str) -> Result<Nanos, TimeError> {
    let (seconds, fraction) = parse_parts(text).ok_or(TimeError::NotRfc3339)?;
    let seconds = u64::try_from(seconds).map_err(|_| TimeError::OutOfRange)?;
    seconds
        .checked_mul(NANOS_PER_SECOND)
        .and_then(|n| n.checked_add(fraction))
        .ok_or(TimeError::OutOfRange)
}

/// Seconds from 1970 (negative before it) and nanoseconds of a well-formed RFC 3339 text.
fn parse_parts(text: &str) -> Option<(i64, u64)> {
    let b = text.as_bytes();
    let year = digits(b, 0, 4)?;
    let month = digits(b, 5, 2)?;
    let day = digits(b, 8, 2)?;
    let hour = digits(b, 11, 2)?;
    let minute = digits(b, 14, 2)?;
    let second = digits(b, 17, 2)?;
    if b.get(4) != Some(&b'-')
        || b.get(7) != Some(&b'-')
        || !matches!(b.get(10), Some(b'T' | b't' | b' '))
        || b.get(13) != Some(&b':')
        || b.get(16) != Some(&b':')
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut fraction: u64 = 0;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        let mut scale = NANOS_PER_SECOND;
        while let Some(c) = b.get(at).filter(|c| c.is_ascii_digit()) {
            if scale > 1 {
                scale /= 10;
                fraction += u64::from(c - b'0') * scale;
            }
            at += 1;
        }
        if at == start {
            return None;
        }
    }
    let offset: i64 = match *b.get(at)? {
        b'Z' | b'z' if at + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if at + 6 == b.len() && b[at + 3] == b':' => {
            let h = digits(b, at + 1, 2)?;
            let m = digits(b, at + 4, 2)?;
            let seconds = i64::from(h * 3600 + m * 60);
            if sign == b'+' { seconds } else { -seconds }
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(year), month, day);
    let seconds = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second.min(59)) - offset;
    Some((seconds, fraction))
}

/// `n` in exactly `width` decimal digits (leading zeros; higher digits dropped).
fn padded(n: u64, width: usize, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + width, b'0');
    let mut n = n;
    for at in (start..start + width).rev() {
        out[at] = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// Appends `time` as RFC 3339 UTC with nanoseconds: `2026-12-01T05:00:00.123456789Z`, without
/// allocating (the record line's `time`).
pub(crate) fn rfc3339(time: Nanos, out: &mut Vec<u8>) {
    let secs = time / NANOS_PER_SECOND;
    let nanos = time % NANOS_PER_SECOND;
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    padded(year as u64, 4, out);
    out.push(b'-');
    padded(u64::from(month), 2, out);
    out.push(b'-');
    padded(u64::from(day), 2, out);
    out.push(b'T');
    padded(of_day / 3_600, 2, out);
    out.push(b':');
    padded(of_day % 3_600 / 60, 2, out);
    out.push(b':');
    padded(of_day % 60, 2, out);
    out.push(b'.');
    padded(nanos, 9, out);
    out.push(b'Z');
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix second.
pub fn format_second(second: u64) -> String {
    let days = (second / 86_400) as i64;
    let rest = second % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SECOND;

    #[test]
    fn parses_the_record_and_envoy_forms() {
        // 2026-12-01T05:00:00Z = 1 796 101 200 (date -d 2026-12-01T05:00:00Z +%s).
        assert_eq!(
            parse_rfc3339("2026-12-01T05:00:00.123456789Z"),
            Some(1_796_101_200 * S + 123_456_789)
        );
        assert_eq!(
            parse_rfc3339("2026-12-01T05:00:00.123Z"),
            Some(1_796_101_200 * S + 123_000_000)
        );
        assert_eq!(
            parse_rfc3339("2026-12-01T05:00:00Z"),
            Some(1_796_101_200 * S)
        );
        assert_eq!(
            parse_rfc3339("2026-12-01T07:00:00+02:00"),
            Some(1_796_101_200 * S)
        );
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z"),
            Some(1_709_164_800 * S)
        );
        // More than nine fraction digits: the rest is below a nanosecond.
        assert_eq!(
            parse_rfc3339("1970-01-01T00:00:01.0000000019Z"),
            Some(S + 1)
        );
    }

    #[test]
    fn rejects_what_is_not_an_instant() {
        for bad in [
            "",
            "2026-12-01",
            "2026-12-01T05:00:00",
            "2026-13-01T05:00:00Z",
            "2026-12-01T25:00:00Z",
            "2026-12-01T05:00:00.Z",
            "2026-12-01T05:00:00Zjunk",
            "1969-12-31T23:59:59Z",
            "2026-12-01T05:00:00+0200",
            "２026-12-01T05:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn valid_instants_out_of_range_are_told_apart_from_bad_text() {
        assert_eq!(
            parse_instant("9999-12-31T23:59:59Z"),
            Err(TimeError::OutOfRange)
        );
        assert_eq!(
            parse_instant("1969-12-31T23:59:59Z"),
            Err(TimeError::OutOfRange)
        );
        assert_eq!(parse_instant("yesterday"), Err(TimeError::NotRfc3339));
        assert_eq!(parse_instant("2554-07-21T23:34:33.709551615Z"), Ok(LAST));
        assert_eq!(
            parse_instant("2554-07-21T23:34:33.709551616Z"),
            Err(TimeError::OutOfRange)
        );
        let why = TimeError::OutOfRange.describe("time", "9999-12-31T23:59:59Z");
        assert!(
            why.contains("is valid RFC 3339 but outside")
                && why.contains("to 2554-07-21T23:34:33Z"),
            "{why}"
        );
    }

    #[test]
    fn written_instants_read_back_to_the_nanosecond() {
        for time in [0, 1, 1_796_101_200 * S + 123_456_789, LAST] {
            let mut text = Vec::new();
            rfc3339(time, &mut text);
            let text = String::from_utf8(text).unwrap();
            assert_eq!(parse_rfc3339(&text), Some(time), "{text}");
        }
        let mut text = Vec::new();
        rfc3339(1_796_101_200 * S + 5, &mut text);
        assert_eq!(text, b"2026-12-01T05:00:00.000000005Z");
    }

    #[test]
    fn formats_round_trip_whole_seconds() {
        for second in [0, 951_782_400, 1_709_164_800, 1_796_101_200, 4_102_444_799] {
            let text = format_second(second);
            assert_eq!(parse_rfc3339(&text), Some(second * S), "{text}");
        }
        assert_eq!(format_second(1_796_101_200), "2026-12-01T05:00:00Z");
    }
}
