//! A descriptor's `concurrency`: `max_in_flight` (required) and `lease` (how long a slot is held
//! at most when its release never comes; default 5m), each checked with its line.

use std::time::Duration;

use super::Ctx;
use super::fields::{self, Level};
use crate::config::duration::{format_duration, parse_duration};
use crate::config::model::ConcurrencySpec;
use crate::config::yaml::Node;

/// The most requests one concurrency key may have in flight: a key's leases are kept one by one
/// (in memory and in Redis), so this bounds what one key costs.
pub(crate) const MAX_IN_FLIGHT: u32 = 100_000;
/// `lease` when not written.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(300);
/// The shortest lease: leases are kept to the millisecond (Redis scores them in ms).
const MIN_LEASE: Duration = Duration::from_millis(100);
/// The longest lease: a lost release holds its slot this long, so a day is already generous.
const MAX_LEASE: Duration = Duration::from_secs(86_400);

/// `concurrency: {max_in_flight: N, lease: 5m}`; `None` after recording its errors.
pub(super) fn spec(ctx: &mut Ctx, node: &Node) -> Option<ConcurrencySpec> {
    let entries = fields::mapping(ctx, "'concurrency'", node)?;
    let mut max_in_flight = None;
    let mut lease = Some(DEFAULT_LEASE);
    let mut seen_max = false;
    for (k, v) in entries {
        let Some(name) = fields::field_name(ctx, k) else {
            continue;
        };
        match name {
            "max_in_flight" => {
                seen_max = true;
                max_in_flight = fields::integer(ctx, "max_in_flight", v, 1, MAX_IN_FLIGHT);
            }
            "lease" => lease = lease_value(ctx, v),
            other => fields::unexpected_field(ctx, Level::Concurrency, other, k),
        }
    }
    if !seen_max {
        ctx.error(
            &node.location,
            "'concurrency' is missing required field 'max_in_flight'",
        );
    }
    Some(ConcurrencySpec {
        max_in_flight: max_in_flight?,
        lease: lease?,
    })
}

fn lease_value(ctx: &mut Ctx, value: &Node) -> Option<Duration> {
    let text = fields::string(ctx, "lease", value)?;
    match parse_duration(&text) {
        Ok(d) if (MIN_LEASE..=MAX_LEASE).contains(&d) => Some(d),
        Ok(_) => {
            ctx.error(
                &value.location,
                format!(
                    "'lease' must be between {} and {}, found {text}",
                    format_duration(MIN_LEASE),
                    format_duration(MAX_LEASE)
                ),
            );
            None
        }
        Err(message) => {
            ctx.error(&value.location, format!("'lease': {message}"));
            None
        }
    }
}
