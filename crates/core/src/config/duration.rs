//! Durations as written in rules files and flags: an integer and a unit, `250ms`, `2s`, `1m`, `1h`.

use std::time::Duration;

/// The longest `max_delay` accepted: holding a gRPC call longer than this is never what is meant.
pub const MAX_DELAY_LIMIT: Duration = Duration::from_secs(3_600);

/// Parses `<integer><unit>` with unit `ms`, `s`, `m` or `h` (`0` alone is also accepted).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = || format!("'{text}' is not a duration (write e.g. 250ms, 2s, 1m or 1h)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits.parse().map_err(|_| bad())?;
    let millis = match unit {
        "ms" => Some(value),
        "s" => value.checked_mul(1_000),
        "m" => value.checked_mul(60_000),
        "h" => value.checked_mul(3_600_000),
        _ => return Err(bad()),
    };
    millis.map(Duration::from_millis).ok_or_else(bad)
}

/// The shortest exact spelling of a duration for messages: `250ms`, `2s`, `1m`, or nanoseconds.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        "0s".into()
    } else if nanos.is_multiple_of(60_000_000_000) {
        format!("{}m", nanos / 60_000_000_000)
    } else if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_four_units_and_zero() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        // The bounds the docs give in hours (`lease` up to 24h, `max_delay` up to 1h) can be
        // written so: `24h` was refused, and only `1440m` taken.
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "ms",
            "2",
            "1.5s",
            "-1s",
            "2 s",
            "2d",
            "s2",
            "99999999999999999999m",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["250ms", "2s", "1m", "0s"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
        assert_eq!(format_duration(Duration::from_nanos(1_500)), "1500ns");
        assert_eq!(format_duration(Duration::from_micros(2)), "2us");
    }
}
