//! `replay --plot FILE.svg`: allowed and denied requests over time, one panel per rule (the
//! `MAX_PANELS` rules with the most requests), both rules sets in each panel with `--against`.
//! Time is binned so a panel has at most `MAX_BINS` points.

use std::collections::HashMap;
use std::path::Path;

use plotters::prelude::*;

use super::Side;
use super::tally::{Bin, RuleTally};
use crate::chart::{Plot, builder, legend, mesh, page};
use ratelimit_core::metrics::OVERRIDE_RULE;
use ratelimit_core::wire::time::format_second;

/// Panels drawn at most (rules beyond them are in the report, not the plot).
pub(crate) const MAX_PANELS: usize = 8;
/// Points per line at most.
pub(crate) const MAX_BINS: u64 = 120;

/// Allowed and denied per bin of `width` seconds from `start`, `bins` of them.
fn rebin(seconds: &[Bin], start: u64, width: u64, bins: usize) -> Vec<(u32, u32)> {
    let mut out = vec![(0u32, 0u32); bins];
    for b in seconds {
        if let Some(slot) = out.get_mut(((b.second.saturating_sub(start)) / width) as usize) {
            slot.0 = slot.0.saturating_add(b.allowed);
            slot.1 = slot.1.saturating_add(b.denied);
        }
    }
    out
}

/// Every rule's tally of a side by (domain, rule name).
fn rules_of(side: &Side) -> HashMap<(String, String), &RuleTally> {
    let mut out: HashMap<(String, String), &RuleTally> = side
        .names
        .order
        .iter()
        .filter_map(|&id| Some((side.names.by_id.get(id)?.clone(), side.tally.rules.get(id)?)))
        .collect();
    for (domain, t) in &side.tally.overrides {
        out.insert((domain.clone(), OVERRIDE_RULE.to_owned()), t);
    }
    out
}

/// Draws the panels of `sides` (one or two) into `path`.
pub fn draw(path: &Path, sides: &[&Side]) -> Plot {
    let tallies: Vec<_> = sides.iter().map(|s| rules_of(s)).collect();
    // The busiest rules over both sides.
    let mut requests: HashMap<&(String, String), u64> = HashMap::new();
    for t in &tallies {
        for (name, rule) in t {
            *requests.entry(name).or_default() += rule.requests;
        }
    }
    let mut names: Vec<(&(String, String), u64)> =
        requests.into_iter().filter(|(_, n)| *n > 0).collect();
    names.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    names.truncate(MAX_PANELS);
    let all_bins = tallies
        .iter()
        .flat_map(|t| t.values())
        .flat_map(|r| &r.seconds);
    let start = all_bins.clone().map(|b| b.second).min().unwrap_or(0);
    let end = all_bins.map(|b| b.second).max().unwrap_or(0) + 1;
    let width = (end - start).div_ceil(MAX_BINS).max(1);
    let bins = (end - start).div_ceil(width) as usize;
    let panels = names.len().max(1);
    let root = page(path, (900, 260 * panels as u32))?;
    let areas = root.split_evenly((panels, 1));
    let colors = [
        (RGBColor(44, 160, 44), RGBColor(214, 39, 40)),
        (RGBColor(31, 119, 180), RGBColor(255, 127, 14)),
    ];
    let span_minutes = (bins as u64 * width) as f64 / 60.0;
    for ((name, _), area) in names.iter().zip(&areas) {
        let lines: Vec<(usize, Vec<(u32, u32)>)> = tallies
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let seconds = t.get(*name).map_or(&[][..], |r| &r.seconds[..]);
                (i, rebin(seconds, start, width, bins))
            })
            .collect();
        let top = lines
            .iter()
            .flat_map(|(_, l)| l.iter().map(|(a, d)| (*a).max(*d)))
            .max()
            .unwrap_or(0)
            + 1;
        let caption = format!("{} {}: requests per {} s", name.0, name.1, width);
        let mut chart = builder(area, &caption, 50)
            .build_cartesian_2d(0f64..span_minutes, 0u32..top + top / 5 + 1)?;
        mesh(
            &mut chart,
            &format!("minutes from {}", format_second(start)),
            "requests",
            10,
        )?;
        for (i, line) in &lines {
            let (ok, over) = colors[(*i).min(1)];
            let which = if sides.len() > 1 {
                format!(" ({})", sides[*i].label)
            } else {
                String::new()
            };
            let x = |k: usize| (k as u64 * width) as f64 / 60.0;
            chart
                .draw_series(LineSeries::new(
                    line.iter().enumerate().map(|(k, (a, _))| (x(k), *a)),
                    ok.stroke_width(2),
                ))?
                .label(format!("allowed{which}"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 12, y)], ok.stroke_width(2)));
            chart
                .draw_series(LineSeries::new(
                    line.iter().enumerate().map(|(k, (_, d))| (x(k), *d)),
                    over.stroke_width(2),
                ))?
                .label(format!("denied{which}"))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 12, y)], over.stroke_width(2))
                });
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebinning_sums_seconds_into_bins() {
        let bin = |second, allowed, denied| Bin {
            second,
            allowed,
            denied,
        };
        let seconds = [
            bin(100, 1, 0),
            bin(101, 2, 1),
            bin(105, 0, 4),
            bin(200, 9, 9),
        ];
        assert_eq!(rebin(&seconds, 100, 5, 2), [(3, 1), (0, 4)]);
    }
}
