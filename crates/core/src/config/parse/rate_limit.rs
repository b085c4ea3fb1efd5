//! The `rate_limit` map and the `rate_limits` list of a descriptor: unit, requests_per_unit,
//! unlimited, name, replaces and our extensions (unit_multiplier, algorithm, burst, max_delay,
//! policy, advertise, calendar).

use super::Ctx;
use super::fields::{self, Level};
use crate::calendar::{CalendarUnit, CalendarWindow};
use crate::config::duration::{MAX_DELAY_LIMIT, format_duration, parse_duration};
use crate::config::model::{Algorithm, Limit, PolicyName, RateLimitSpec, Unit};
use crate::config::yaml::{Node, NodeKind};

/// The longest window accepted: 10 years of 365 days, in seconds.
pub(crate) const MAX_PERIOD_SECONDS: u64 = 10 * 365 * 86_400;

/// A `rate_limit:` map.
pub(super) fn single(ctx: &mut Ctx, node: &Node) -> Option<RateLimitSpec> {
    spec(ctx, node, Level::RateLimit)
}

/// A `rate_limits:` list: one or more limits, all must pass.
pub(super) fn list(ctx: &mut Ctx, node: &Node) -> Option<RateLimitSpec> {
    let NodeKind::Seq(items) = &node.kind else {
        ctx.error(
            &node.location,
            format!("'rate_limits' must be a list, found {}", node.describe()),
        );
        return None;
    };
    if items.is_empty() {
        ctx.error(
            &node.location,
            "'rate_limits' must not be empty (remove it, or give at least one limit)",
        );
        return None;
    }
    let mut limits = Vec::new();
    let mut ok = true;
    for item in items {
        match spec(ctx, item, Level::RateLimits) {
            Some(RateLimitSpec::Limited(mut l)) => limits.append(&mut l),
            _ => ok = false,
        }
    }
    ok.then_some(RateLimitSpec::Limited(limits))
}

/// The fields of one limit map, as written.
#[derive(Default)]
struct Raw<'n> {
    unit: Option<(&'n Node, &'n Node)>,
    requests_per_unit: Option<(&'n Node, &'n Node)>,
    unlimited: Option<(&'n Node, &'n Node)>,
    name: Option<&'n Node>,
    replaces: Option<&'n Node>,
    unit_multiplier: Option<(&'n Node, &'n Node)>,
    algorithm: Option<(&'n Node, &'n Node)>,
    burst: Option<(&'n Node, &'n Node)>,
    max_delay: Option<(&'n Node, &'n Node)>,
    policy: Option<(&'n Node, &'n Node)>,
    advertise: Option<(&'n Node, &'n Node)>,
    calendar: Option<(&'n Node, &'n Node)>,
}

impl<'n> Raw<'n> {
    /// Sorts a limit map's entries by field, reporting fields that do not belong at `level`.
    fn read(ctx: &mut Ctx, entries: &'n [(Node, Node)], level: Level) -> Raw<'n> {
        let mut raw = Raw::default();
        for (k, v) in entries {
            let Some(name) = fields::field_name(ctx, k) else {
                continue;
            };
            match name {
                "unit" => raw.unit = Some((k, v)),
                "requests_per_unit" => raw.requests_per_unit = Some((k, v)),
                "unlimited" => raw.unlimited = Some((k, v)),
                "name" => raw.name = Some(v),
                "replaces" => raw.replaces = Some(v),
                "unit_multiplier" => raw.unit_multiplier = Some((k, v)),
                "algorithm" => raw.algorithm = Some((k, v)),
                "burst" => raw.burst = Some((k, v)),
                "max_delay" => raw.max_delay = Some((k, v)),
                "policy" => raw.policy = Some((k, v)),
                "advertise" => raw.advertise = Some((k, v)),
                "calendar" => raw.calendar = Some((k, v)),
                other => fields::unexpected_field(ctx, level, other, k),
            }
        }
        raw
    }
}

/// What an `unlimited` field says about the limit.
enum Intent {
    /// `unlimited: true`.
    Unlimited,
    /// A counted limit. `report_missing` is false when a bad `unlimited` left the intent unknown,
    /// so a missing unit or requests_per_unit is not reported on top of it.
    Limited { report_missing: bool },
}

impl Intent {
    fn read(ctx: &mut Ctx, raw: &Raw, level: Level) -> Intent {
        let Some((k, v)) = raw.unlimited else {
            return Intent::Limited {
                report_missing: true,
            };
        };
        let value = fields::boolean(ctx, "unlimited", v);
        if level == Level::RateLimits {
            ctx.error(
                &k.location,
                "'unlimited' is not allowed under rate_limits (use rate_limit: {unlimited: true})",
            );
            return Intent::Limited {
                report_missing: false,
            };
        }
        match value {
            Some(true) => Intent::Unlimited,
            _ => Intent::Limited {
                report_missing: value.is_some(),
            },
        }
    }
}

/// One limit map (`rate_limit:`, or an entry of `rate_limits:`).
fn spec(ctx: &mut Ctx, node: &Node, level: Level) -> Option<RateLimitSpec> {
    let what = match level {
        Level::RateLimits => "each entry of 'rate_limits'",
        _ => "'rate_limit'",
    };
    let entries = fields::mapping(ctx, what, node)?;
    let raw = Raw::read(ctx, entries, level);
    let intent = Intent::read(ctx, &raw, level);
    let name = raw
        .name
        .and_then(|v| fields::non_empty_string(ctx, "name", v));
    // `None` when the list is invalid (already reported).
    let replaces = match raw.replaces {
        Some(v) => replaces(ctx, v, name.as_deref()),
        None => Some(Vec::new()),
    };
    match intent {
        Intent::Unlimited => unlimited(ctx, &raw, name, replaces),
        Intent::Limited { report_missing } => {
            let policy = policy(ctx, &raw);
            let mut limit = limited(ctx, node, &raw, level.place(), report_missing)?;
            limit.name = name;
            limit.replaces = replaces?;
            limit.policy = policy?;
            Some(RateLimitSpec::Limited(vec![limit]))
        }
    }
}

/// `unlimited: true`: only a name and `replaces` may go with it (and `requests_per_unit`, ignored
/// with a warning, as the reference does).
fn unlimited(
    ctx: &mut Ctx,
    raw: &Raw,
    name: Option<String>,
    replaces: Option<Vec<String>>,
) -> Option<RateLimitSpec> {
    let others = [
        (
            raw.unit,
            "should not specify rate limit unit when unlimited",
        ),
        (
            raw.unit_multiplier,
            "should not specify unit_multiplier when unlimited",
        ),
        (raw.algorithm, "should not specify algorithm when unlimited"),
        (raw.burst, "should not specify burst when unlimited"),
        (raw.max_delay, "should not specify max_delay when unlimited"),
        (
            raw.policy,
            "should not specify policy when unlimited (an unlimited rule has no quota to advertise)",
        ),
        (
            raw.advertise,
            "should not specify advertise when unlimited (an unlimited rule is never advertised)",
        ),
        (raw.calendar, "should not specify calendar when unlimited"),
    ];
    if let Some((k, _)) = raw.requests_per_unit {
        // The reference loads it (and ignores the number): so do we, but say so.
        ctx.warning(
            &k.location,
            "requests_per_unit is ignored: the limit is unlimited",
        );
    }
    let mut ok = true;
    for (k, message) in others.into_iter().filter_map(|(f, m)| Some((f?.0, m))) {
        ctx.error(&k.location, message);
        ok = false;
    }
    let replaces = replaces?;
    ok.then_some(RateLimitSpec::Unlimited { name, replaces })
}

/// A counted limit's numbers, unit and algorithm (its name and `replaces` are left empty for the
/// caller). Reports every bad field before giving up.
fn limited(
    ctx: &mut Ctx,
    node: &Node,
    raw: &Raw,
    place: &str,
    report_missing: bool,
) -> Option<Limit> {
    let unit = match raw.unit {
        Some((_, v)) => unit(ctx, v),
        None => {
            if report_missing {
                let message = format!("missing required field 'unit' {place}");
                ctx.error(&node.location, message);
            }
            None
        }
    };
    let requests_per_unit = match raw.requests_per_unit {
        Some((_, v)) => fields::integer(ctx, "requests_per_unit", v, 0, u32::MAX),
        None => {
            if report_missing {
                let message = format!(
                    "missing required field 'requests_per_unit' {place} (write 0 to deny every \
                     request)"
                );
                ctx.error(&node.location, message);
            }
            None
        }
    };
    let unit_multiplier = match raw.unit_multiplier {
        Some((_, v)) => fields::integer(ctx, "unit_multiplier", v, 1, u32::MAX),
        None => Some(1),
    };
    let algorithm = match raw.algorithm {
        Some((_, v)) => algorithm(ctx, v).map(Some),
        None => Some(None),
    };
    let burst = match raw.burst {
        Some((_, v)) => fields::integer(ctx, "burst", v, 1, u32::MAX).map(Some),
        None => Some(None),
    };
    let max_delay = match raw.max_delay {
        Some((k, v)) => max_delay(ctx, k, v, algorithm),
        None => Some(None),
    };
    let calendar = match raw.calendar {
        Some((k, v)) => calendar(ctx, k, v, unit, unit_multiplier, algorithm).map(Some),
        None => Some(None),
    };
    let (unit, unit_multiplier) = (unit?, unit_multiplier?);
    let (requests_per_unit, algorithm, burst, max_delay) =
        (requests_per_unit?, algorithm?, burst?, max_delay?);
    let calendar = calendar?;
    check_window(ctx, node, raw, unit, unit_multiplier)?;
    Some(Limit {
        name: None,
        requests_per_unit,
        unit,
        unit_multiplier,
        algorithm,
        burst,
        max_delay,
        calendar,
        replaces: Vec::new(),
        policy: PolicyName::Derived,
    })
}

/// `policy: <name>` and `advertise: <bool>`: how the limit shows in the IETF fields. A name is an
/// sf-string (printable ASCII); naming a limit that is not advertised is a contradiction.
fn policy(ctx: &mut Ctx, raw: &Raw) -> Option<PolicyName> {
    let advertise = match raw.advertise {
        Some((_, v)) => fields::boolean(ctx, "advertise", v),
        None => Some(true),
    };
    let named = match raw.policy {
        Some((_, v)) => {
            let name = fields::non_empty_string(ctx, "policy", v)?;
            if !PolicyName::valid(&name) {
                ctx.error(
                    &v.location,
                    format!(
                        "'policy' must be printable ASCII (it is sent as a structured-field \
                         string), found {name:?}"
                    ),
                );
                return None;
            }
            Some(name)
        }
        None => None,
    };
    match (named, advertise?) {
        (Some(_), false) => {
            let (k, _) = raw.advertise?;
            ctx.error(
                &k.location,
                "'policy' names the limit in the RateLimit fields, 'advertise: false' keeps it \
                 out of them: write one or the other",
            );
            None
        }
        (Some(name), true) => Some(PolicyName::Named(name)),
        (None, true) => Some(PolicyName::Derived),
        (None, false) => Some(PolicyName::Unadvertised),
    }
}

/// A `unit:` value.
fn unit(ctx: &mut Ctx, value: &Node) -> Option<Unit> {
    let text = fields::string(ctx, "unit", value)?;
    let parsed = Unit::parse(&text);
    if parsed.is_none() {
        ctx.error(
            &value.location,
            format!(
                "invalid rate limit unit '{text}' (expected one of: {})",
                Unit::ALL.map(Unit::name).join(", ")
            ),
        );
    }
    parsed
}

/// An `algorithm:` value.
fn algorithm(ctx: &mut Ctx, value: &Node) -> Option<Algorithm> {
    let text = fields::string(ctx, "algorithm", value)?;
    let parsed = Algorithm::parse(&text);
    if parsed.is_none() {
        ctx.error(
            &value.location,
            format!(
                "invalid algorithm '{text}' (expected one of: {})",
                Algorithm::ALL.map(Algorithm::name).join(", ")
            ),
        );
    }
    parsed
}

/// The window (`unit` × `unit_multiplier`) must be at most [`MAX_PERIOD_SECONDS`].
fn check_window(
    ctx: &mut Ctx,
    node: &Node,
    raw: &Raw,
    unit: Unit,
    unit_multiplier: u32,
) -> Option<()> {
    let period = unit.seconds().checked_mul(u64::from(unit_multiplier));
    if period.is_none_or(|p| p > MAX_PERIOD_SECONDS) {
        let at = raw.unit_multiplier.or(raw.unit).map_or(node, |(_, v)| v);
        ctx.error(
            &at.location,
            format!(
                "window of {unit_multiplier} {unit}(s) is longer than the maximum of 10 years \
                 ({MAX_PERIOD_SECONDS} seconds)"
            ),
        );
        return None;
    }
    Some(())
}

/// `max_delay`: a duration up to an hour, and only beside `algorithm: leaky_bucket` (written out,
/// so a rules file means the same whatever the server's default algorithm). `algorithm` is `None`
/// when it was invalid (already reported), `Some(None)` when not written.
fn max_delay(
    ctx: &mut Ctx,
    key: &Node,
    value: &Node,
    algorithm: Option<Option<Algorithm>>,
) -> Option<Option<std::time::Duration>> {
    let text = fields::string(ctx, "max_delay", value)?;
    let parsed = match parse_duration(&text) {
        Ok(d) if d > MAX_DELAY_LIMIT => {
            ctx.error(
                &value.location,
                format!(
                    "'max_delay' must be at most {}, found {text}",
                    format_duration(MAX_DELAY_LIMIT)
                ),
            );
            return None;
        }
        Ok(d) => d,
        Err(message) => {
            ctx.error(&value.location, format!("'max_delay': {message}"));
            return None;
        }
    };
    let algorithm = algorithm?;
    if algorithm != Some(Algorithm::LeakyBucket) {
        ctx.error(
            &key.location,
            format!(
                "'max_delay' is only valid with algorithm: leaky_bucket (this limit's algorithm \
                 is {})",
                algorithm.map_or("the server default".into(), |a| a.to_string())
            ),
        );
        return None;
    }
    Some(Some(parsed))
}

/// `calendar: {time_zone: <IANA name>}`: the limit's `unit` (day, week, month or year) as a
/// calendar window in that zone. Only for fixed and sliding windows written out (a rules file
/// means the same whatever the server's default algorithm), and with no `unit_multiplier`.
/// `unit`, `unit_multiplier` and `algorithm` are `None` when invalid (already reported).
fn calendar(
    ctx: &mut Ctx,
    key: &Node,
    value: &Node,
    unit: Option<Unit>,
    unit_multiplier: Option<u32>,
    algorithm: Option<Option<Algorithm>>,
) -> Option<CalendarWindow> {
    let entries = fields::mapping(ctx, "'calendar'", value)?;
    let mut zone = None;
    let mut ok = true;
    for (k, v) in entries {
        match fields::field_name(ctx, k) {
            Some("time_zone") => zone = Some(v),
            Some(other) => {
                ctx.error(
                    &k.location,
                    format!("unknown field '{other}' under calendar (expected: time_zone)"),
                );
                ok = false;
            }
            None => ok = false,
        }
    }
    let Some(zone) = zone.filter(|_| ok) else {
        if !ok {
            return None;
        }
        ctx.error(
            &value.location,
            "'calendar' needs 'time_zone' (an IANA name such as Europe/Berlin or UTC)",
        );
        return None;
    };
    let name = fields::string(ctx, "time_zone", zone)?;
    let unit = match unit? {
        Unit::Day => CalendarUnit::Day,
        Unit::Week => CalendarUnit::Week,
        Unit::Month => CalendarUnit::Month,
        Unit::Year => CalendarUnit::Year,
        other => {
            ctx.error(
                &key.location,
                format!(
                    "a calendar window is a day, week, month or year; this limit's unit is {other}"
                ),
            );
            return None;
        }
    };
    if unit_multiplier? != 1 {
        ctx.error(
            &key.location,
            "'calendar' windows are one unit long: remove unit_multiplier",
        );
        return None;
    }
    match algorithm? {
        Some(Algorithm::FixedWindow | Algorithm::SlidingWindow) => {}
        other => {
            ctx.error(
                &key.location,
                format!(
                    "'calendar' is only valid with algorithm: fixed_window or sliding_window                      (this limit's algorithm is {})",
                    other.map_or("the server default".into(), |a| a.to_string())
                ),
            );
            return None;
        }
    }
    match CalendarWindow::new(unit, &name) {
        Ok(window) => ok.then_some(window),
        Err(message) => {
            ctx.error(&zone.location, message);
            None
        }
    }
}

/// A `replaces` list of `{name: <limit name>}` maps.
fn replaces(ctx: &mut Ctx, node: &Node, own_name: Option<&str>) -> Option<Vec<String>> {
    let NodeKind::Seq(items) = &node.kind else {
        ctx.error(
            &node.location,
            format!(
                "'replaces' must be a list of {{name: <limit name>}} entries, found {}",
                node.describe()
            ),
        );
        return None;
    };
    let mut names = Vec::new();
    let mut ok = true;
    for item in items {
        match replaces_entry(ctx, item, own_name) {
            Some(n) => names.push(n),
            None => ok = false,
        }
    }
    ok.then_some(names)
}

fn replaces_entry(ctx: &mut Ctx, item: &Node, own_name: Option<&str>) -> Option<String> {
    let entries = match &item.kind {
        NodeKind::Map(entries) if !entries.is_empty() => entries,
        NodeKind::Map(_) | NodeKind::Scalar(_, crate::config::yaml::ScalarKind::Null) => {
            ctx.error(
                &item.location,
                "should not have an empty replaces entry (expected {name: <limit name>})",
            );
            return None;
        }
        _ => {
            ctx.error(
                &item.location,
                format!(
                    "each replaces entry must be a mapping like {{name: <limit name>}}, found {}",
                    item.describe()
                ),
            );
            return None;
        }
    };
    let mut name = None;
    let mut seen_name = false;
    let mut ok = true;
    for (k, v) in entries {
        let Some(field) = fields::field_name(ctx, k) else {
            ok = false;
            continue;
        };
        if field == "name" {
            seen_name = true;
            name = fields::string(ctx, "name", v);
            if name.as_deref() == Some("") {
                ctx.error(&v.location, "a replaces entry must not have an empty name");
                name = None;
            } else if name.is_some() && name.as_deref() == own_name {
                ctx.error(
                    &v.location,
                    format!(
                        "replaces should not contain the name of its own limit '{}'",
                        own_name.unwrap_or_default()
                    ),
                );
                name = None;
            }
        } else {
            fields::unexpected_field(ctx, Level::Replaces, field, k);
            ok = false;
        }
    }
    if !seen_name {
        ctx.error(&item.location, "a replaces entry is missing 'name'");
    }
    name.filter(|_| ok)
}
