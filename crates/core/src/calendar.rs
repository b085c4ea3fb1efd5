//! Calendar windows: a day, a week (Monday 00:00 to Monday 00:00), a month or a year in a named
//! IANA time zone, daylight-saving correct (a day in Berlin lasts 23 hours on the last Sunday of
//! March and 25 on the last Sunday of October; a month is 28 to 31 days). Opt-in per limit
//! (`calendar: {time_zone: Europe/Berlin}` beside `unit: month`); without it a window is the
//! reference's fixed length counted from the epoch (`month` = 30 days). Pure: `now` is passed in;
//! the zone database is jiff's bundled copy, so the answer is the same on every machine and the
//! container image needs no `/usr/share/zoneinfo`.
//!
//! A calendar window travels as a limit's window length (`LimitParams::period`,
//! `CounterId::period`), packed by [`CalendarWindow::period`]: the top bit set (no real window
//! comes near 2^63 ns), a 32-bit hash of the zone's name and the unit. So the fixed and sliding
//! windows ask [`window`] for the window around `now` with no new field, and every instance
//! derives the same store key for it (the name's hash, not an order of loading). A zone is looked
//! up in this process's table of zones named by the rules, filled when they are parsed.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::{OnceLock, PoisonError, RwLock};

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::clock::Nanos;

/// The bit that marks a window length as a calendar window.
const CALENDAR_BIT: u64 = 1 << 63;

/// The calendar units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    Day = 1,
    Week = 2,
    Month = 3,
    Year = 4,
}

impl CalendarUnit {
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }

    fn from_code(code: u64) -> Option<CalendarUnit> {
        match code {
            1 => Some(CalendarUnit::Day),
            2 => Some(CalendarUnit::Week),
            3 => Some(CalendarUnit::Month),
            4 => Some(CalendarUnit::Year),
            _ => None,
        }
    }
}

/// A calendar window as the rules name it: a unit in a time zone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CalendarWindow {
    pub unit: CalendarUnit,
    /// The IANA name as written (`Europe/Berlin`, `UTC`).
    pub time_zone: String,
}

/// The zones the rules named, by the hash of their names.
fn zones() -> &'static RwLock<HashMap<u32, TimeZone>> {
    static ZONES: OnceLock<RwLock<HashMap<u32, TimeZone>>> = OnceLock::new();
    ZONES.get_or_init(RwLock::default)
}

/// A hash of a zone's name that every process computes alike (FNV-1a).
fn name_hash(name: &str) -> u32 {
    let mut h = Fnv(0x811c_9dc5);
    h.write(name.as_bytes());
    h.finish() as u32
}

struct Fnv(u32);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        u64::from(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
    }
}

impl CalendarWindow {
    /// The window named `time_zone` in `unit`, its zone looked up in the bundled database (and
    /// kept for [`window`]). The message names an unknown zone.
    pub fn new(unit: CalendarUnit, time_zone: &str) -> Result<CalendarWindow, String> {
        let zone = TimeZone::get(time_zone).map_err(|_| {
            format!(
                "unknown time zone '{time_zone}' (an IANA name such as Europe/Berlin, \
                 America/New_York or UTC)"
            )
        })?;
        zones()
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name_hash(time_zone), zone);
        Ok(CalendarWindow {
            unit,
            time_zone: time_zone.to_owned(),
        })
    }

    /// The window packed as a window length (see the module's doc).
    pub fn period(&self) -> Nanos {
        CALENDAR_BIT | (u64::from(name_hash(&self.time_zone)) << 8) | self.unit as u64
    }
}

/// Whether a window length is a calendar window's.
#[inline]
pub fn is_calendar(period: Nanos) -> bool {
    period & CALENDAR_BIT != 0
}

/// What a packed calendar window says: its unit and its zone's name hash.
fn unpack(period: Nanos) -> (CalendarUnit, u32) {
    let unit = CalendarUnit::from_code(period & 0xff).unwrap_or(CalendarUnit::Day);
    (unit, (period >> 8) as u32)
}

/// The window around `now` (start inclusive, end exclusive): for a calendar window, its start
/// and end in its zone; for any other, the epoch-aligned window of `period` (as the reference).
#[inline]
pub fn window(period: Nanos, now: Nanos) -> (Nanos, Nanos) {
    if !is_calendar(period) {
        let period = period.max(1);
        let start = now - now % period;
        return (start, start.saturating_add(period));
    }
    calendar_window(period, now)
}

/// The window after the one that ends at `end` (for the sliding window's expiry).
pub fn next_end(period: Nanos, end: Nanos) -> Nanos {
    if !is_calendar(period) {
        return end.saturating_add(period.max(1));
    }
    calendar_window(period, end).1
}

fn calendar_window(period: Nanos, now: Nanos) -> (Nanos, Nanos) {
    let (unit, hash) = unpack(period);
    let zone = zones()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&hash)
        .cloned()
        .unwrap_or(TimeZone::UTC);
    bounds(unit, &zone, now).unwrap_or((now, now.saturating_add(1)))
}

/// The start and end of the `unit` around `now` in `zone`.
fn bounds(unit: CalendarUnit, zone: &TimeZone, now: Nanos) -> Option<(Nanos, Nanos)> {
    let at = Timestamp::from_nanosecond(i128::from(now)).ok()?;
    let date = at.to_zoned_datetime(zone.clone()).date();
    let (first, next): (Date, Date) = match unit {
        CalendarUnit::Day => (date, date.tomorrow().ok()?),
        CalendarUnit::Week => {
            let monday = date
                .checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days())
                .ok()?;
            (monday, monday.checked_add(7.days()).ok()?)
        }
        CalendarUnit::Month => {
            let first = date.first_of_month();
            (first, first.checked_add(1.month()).ok()?)
        }
        CalendarUnit::Year => {
            let first = date.first_of_year();
            (first, first.checked_add(1.year()).ok()?)
        }
    };
    let instant = |d: Date| -> Option<Nanos> {
        let ns = d
            .to_zoned_datetime(zone.clone())
            .ok()?
            .timestamp()
            .as_nanosecond();
        u64::try_from(ns).ok()
    };
    Some((instant(first)?, instant(next)?))
}

/// A window's nominal length: a calendar window's unit as the reference counts it (a day 86,400 s,
/// a week 7 days, a month 30 days, a year 365 days), any other window as it is. For what needs
/// one rate rather than the calendar (an RLQS pool).
pub fn nominal(period: Nanos) -> Nanos {
    if !is_calendar(period) {
        return period;
    }
    let days = match unpack(period).0 {
        CalendarUnit::Day => 1,
        CalendarUnit::Week => 7,
        CalendarUnit::Month => 30,
        CalendarUnit::Year => 365,
    };
    days * 86_400 * crate::clock::NANOS_PER_SECOND
}

/// A calendar window in words (`month in Europe/Berlin`), for `/explain`; `None` for another.
pub fn describe(period: Nanos) -> Option<String> {
    if !is_calendar(period) {
        return None;
    }
    let (unit, hash) = unpack(period);
    let zones = zones().read().unwrap_or_else(PoisonError::into_inner);
    let name = zones
        .get(&hash)
        .and_then(|z| z.iana_name().map(str::to_owned))
        .unwrap_or_else(|| "UTC".into());
    Some(format!("calendar {} in {name}", unit.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NANOS_PER_SECOND as S;

    /// The instant of an RFC 3339 text, in ns.
    fn at(text: &str) -> Nanos {
        let t: Timestamp = text.parse().unwrap();
        u64::try_from(t.as_nanosecond()).unwrap()
    }

    fn berlin(unit: CalendarUnit) -> Nanos {
        CalendarWindow::new(unit, "Europe/Berlin").unwrap().period()
    }

    #[test]
    fn a_month_in_berlin_ends_at_midnight_there_at_a_months_end() {
        let p = berlin(CalendarUnit::Month);
        // 2026-01-31 23:59:59 in Berlin (UTC+1) is still January; a second later it is February.
        let (start, end) = window(p, at("2026-01-31T22:59:59Z"));
        assert_eq!(start, at("2025-12-31T23:00:00Z"));
        assert_eq!(end, at("2026-01-31T23:00:00Z"));
        let (start, end) = window(p, end);
        assert_eq!(
            (start, end),
            (at("2026-01-31T23:00:00Z"), at("2026-02-28T23:00:00Z"))
        );
        assert_eq!(
            next_end(p, at("2026-01-31T23:00:00Z")),
            at("2026-02-28T23:00:00Z")
        );
    }

    #[test]
    fn a_leap_day_belongs_to_february_and_its_own_day() {
        let month = berlin(CalendarUnit::Month);
        let (start, end) = window(month, at("2028-02-29T12:00:00Z"));
        assert_eq!(
            (start, end),
            (at("2028-01-31T23:00:00Z"), at("2028-02-29T23:00:00Z"))
        );
        assert_eq!((end - start) / S, 29 * 86_400);
        let day = berlin(CalendarUnit::Day);
        assert_eq!(
            window(day, at("2028-02-29T12:00:00Z")),
            (at("2028-02-28T23:00:00Z"), at("2028-02-29T23:00:00Z"))
        );
        let year = berlin(CalendarUnit::Year);
        let (start, end) = window(year, at("2028-06-01T00:00:00Z"));
        assert_eq!((end - start) / S, 366 * 86_400);
    }

    #[test]
    fn days_across_both_daylight_saving_changes_last_23_and_25_hours() {
        let day = berlin(CalendarUnit::Day);
        // Last Sunday of March 2026: clocks go 02:00 → 03:00.
        let (start, end) = window(day, at("2026-03-29T10:00:00Z"));
        assert_eq!(start, at("2026-03-28T23:00:00Z"));
        assert_eq!(end, at("2026-03-29T22:00:00Z"));
        assert_eq!((end - start) / S, 23 * 3_600);
        // Last Sunday of October 2026: clocks go 03:00 → 02:00.
        let (start, end) = window(day, at("2026-10-25T10:00:00Z"));
        assert_eq!(start, at("2026-10-24T22:00:00Z"));
        assert_eq!(end, at("2026-10-25T23:00:00Z"));
        assert_eq!((end - start) / S, 25 * 3_600);
        // The month holding the spring change is an hour short of 31 days.
        let month = berlin(CalendarUnit::Month);
        let (start, end) = window(month, at("2026-03-15T00:00:00Z"));
        assert_eq!((end - start) / S, 31 * 86_400 - 3_600);
    }

    #[test]
    fn weeks_run_monday_to_monday_and_plain_windows_stay_epoch_aligned() {
        let week = berlin(CalendarUnit::Week);
        // Thursday 2026-01-01: the week began on Monday 2025-12-29 in Berlin.
        assert_eq!(
            window(week, at("2026-01-01T12:00:00Z")),
            (at("2025-12-28T23:00:00Z"), at("2026-01-04T23:00:00Z"))
        );
        assert_eq!(window(60 * S, 61 * S), (60 * S, 120 * S));
        assert_eq!(next_end(60 * S, 120 * S), 180 * S);
        assert!(!is_calendar(10 * 365 * 86_400 * S));
        assert_eq!(
            describe(week).as_deref(),
            Some("calendar week in Europe/Berlin")
        );
        assert_eq!(describe(60 * S), None);
        assert_eq!(nominal(week), 7 * 86_400 * S);
        assert_eq!(nominal(60 * S), 60 * S);
    }

    #[test]
    fn zones_are_named_by_iana_names_only_and_pack_alike_everywhere() {
        assert!(CalendarWindow::new(CalendarUnit::Day, "Europe/Berln").is_err());
        assert!(CalendarWindow::new(CalendarUnit::Day, "").is_err());
        let utc = CalendarWindow::new(CalendarUnit::Day, "UTC").unwrap();
        assert_eq!(
            window(utc.period(), at("2026-05-05T05:00:00Z")).0,
            at("2026-05-05T00:00:00Z")
        );
        // The packing is a pure function of the name and unit (the store key depends on it).
        assert_eq!(
            berlin(CalendarUnit::Month),
            0x8000_0000_0000_0000 | (u64::from(name_hash("Europe/Berlin")) << 8) | 3
        );
    }
}
