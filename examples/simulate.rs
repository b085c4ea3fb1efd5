//! Drives each algorithm's pure function with the same bursty traffic on a simulated clock and
//! draws what it admits over time: `cargo run --example simulate -- --plot docs/` writes
//! `docs/algorithms-<name>.svg` (one per algorithm) and `docs/algorithms-cumulative.svg`, and
//! prints a summary table in Markdown.
//!
//! Limit: 10 per second, burst (token bucket capacity, leaky bucket queue) 10, leaky max delay 1 s.
//! Traffic: a trickle of 4 requests per second, and every 5 s a burst of 30 requests within 60 ms
//! that straddles a second boundary (where fixed windows reset).

use std::path::PathBuf;

use plotters::prelude::*;
use ratelimit_server::clock::{NANOS_PER_SECOND, Nanos};
use ratelimit_server::config::Algorithm;
use ratelimit_server::limiter::{self, LimitParams, State};
use ratelimit_server::replay::chart::{Plot, builder, legend, mesh, page};

const MS: Nanos = 1_000_000;
/// Simulated span, and the width of one bar of the plots.
const SPAN: Nanos = 20_000 * MS;
const BIN: Nanos = 100 * MS;
/// An epoch-aligned origin, so window edges fall on whole seconds of the plot.
const T0: Nanos = 1_767_225_600 * NANOS_PER_SECOND;

fn params(algorithm: Algorithm) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_unit: 10,
        period: NANOS_PER_SECOND,
        burst: 10,
        max_delay: NANOS_PER_SECOND,
        charge_denied: false,
    }
}

/// Arrival times (offsets from T0), sorted.
fn arrivals() -> Vec<Nanos> {
    let mut t: Vec<Nanos> = (0..SPAN / (250 * MS))
        .map(|k| 125 * MS + k * 250 * MS)
        .collect();
    for burst in 0..4 {
        let start = 970 * MS + burst * 5_000 * MS;
        t.extend((0..30).map(|i| start + i * 2 * MS));
    }
    t.sort_unstable();
    t
}

/// For each arrival: the instant it is answered OK (arrival + delay), or None if denied.
fn run(p: &LimitParams, arrivals: &[Nanos]) -> Vec<Option<Nanos>> {
    let mut state: Option<State> = None;
    arrivals
        .iter()
        .map(|&at| {
            let e = limiter::evaluate(p, state, T0 + at, 1);
            e.allowed.then(|| {
                state = Some(e.state_after);
                at + e.delay
            })
        })
        .collect()
}

fn bins(times: impl Iterator<Item = Nanos>) -> Vec<u32> {
    let mut b = vec![0u32; (SPAN / BIN) as usize];
    for t in times {
        if let Some(slot) = b.get_mut((t / BIN) as usize) {
            *slot += 1;
        }
    }
    b
}

/// Most answers within any interval of `width` (sliding over the answer times).
fn most_within(sorted: &[Nanos], width: Nanos) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..sorted.len() {
        while sorted[hi] - sorted[lo] >= width {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

fn color(a: Algorithm) -> RGBColor {
    match a {
        Algorithm::TokenBucket => RGBColor(31, 119, 180),
        Algorithm::FixedWindow => RGBColor(255, 127, 14),
        Algorithm::SlidingWindow => RGBColor(44, 160, 44),
        Algorithm::LeakyBucket => RGBColor(148, 103, 189),
    }
}

fn plot_one(dir: &std::path::Path, a: Algorithm, offered: &[u32], admitted: &[u32]) -> Plot {
    let path = dir.join(format!("algorithms-{a}.svg"));
    let root = page(&path, (900, 280))?;
    // Room above the tallest bar for the legend.
    let top = offered.iter().copied().max().unwrap_or(1) + 10;
    let mut chart = builder(
        &root,
        &format!("{a}: requests answered OK per 100 ms (10/s, burst 10)"),
        36,
    )
    .build_cartesian_2d(0f64..(SPAN / MS) as f64 / 1000.0, 0u32..top)?;
    mesh(&mut chart, "time (s)", "per 100 ms", 21)?;
    let w = BIN as f64 / 1e9;
    let bar = |(i, &n): (usize, &u32), style: ShapeStyle| {
        let x = i as f64 * w;
        Rectangle::new([(x, 0), (x + w, n)], style)
    };
    chart
        .draw_series(
            offered
                .iter()
                .enumerate()
                .map(|b| bar(b, RGBColor(200, 200, 200).filled())),
        )?
        .label("offered")
        .legend(|(x, y)| {
            Rectangle::new(
                [(x, y - 5), (x + 12, y + 5)],
                RGBColor(200, 200, 200).filled(),
            )
        });
    chart
        .draw_series(
            admitted
                .iter()
                .enumerate()
                .map(|b| bar(b, color(a).filled())),
        )?
        .label("answered OK (at the time of the answer)")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color(a).filled()));
    chart
        .draw_series(LineSeries::new(
            [(0.0, 1), ((SPAN / MS) as f64 / 1000.0, 1)],
            RED.stroke_width(1),
        ))?
        .label("the rate: 1 per 100 ms")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], RED));
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()?;
    Ok(())
}

fn plot_cumulative(
    dir: &std::path::Path,
    offered: &[Nanos],
    runs: &[(Algorithm, Vec<Nanos>)],
) -> Plot {
    let path = dir.join("algorithms-cumulative.svg");
    let root = page(&path, (900, 360))?;
    let end = (SPAN / MS) as f64 / 1000.0;
    let mut chart = builder(&root, "All four: requests answered OK so far", 40)
        .build_cartesian_2d(0f64..end, 0usize..offered.len() + 5)?;
    mesh(&mut chart, "time (s)", "requests", 21)?;
    let steps = |times: &[Nanos]| {
        let mut points = vec![(0.0, 0)];
        for (i, &t) in times.iter().enumerate() {
            let x = t as f64 / 1e9;
            points.push((x, i));
            points.push((x, i + 1));
        }
        points.push((end, times.len()));
        points
    };
    chart
        .draw_series(LineSeries::new(
            steps(offered),
            RGBColor(160, 160, 160).stroke_width(2),
        ))?
        .label("offered")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], RGBColor(160, 160, 160)));
    chart
        .draw_series(LineSeries::new(
            [(0.0, 10), (end, 10 + (end * 10.0) as usize)],
            RED.stroke_width(1),
        ))?
        .label("burst + rate × time")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], RED));
    for (a, times) in runs {
        let c = color(*a);
        chart
            .draw_series(LineSeries::new(steps(times), c.stroke_width(2)))?
            .label(a.name())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 12, y)], c.stroke_width(2)));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}

fn main() -> Plot {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--plot" => dir = args.next().map(PathBuf::from),
            other => {
                return Err(
                    format!("unknown argument {other} (usage: simulate [--plot DIR])").into(),
                );
            }
        }
    }
    let offered = arrivals();
    let offered_bins = bins(offered.iter().copied());
    println!(
        "| algorithm | admitted of {} | most in any 100 ms | most in any 1 s | longest wait |",
        offered.len()
    );
    println!("|---|---|---|---|---|");
    let mut runs = Vec::new();
    for a in Algorithm::ALL {
        let answers = run(&params(a), &offered);
        let longest = offered
            .iter()
            .zip(&answers)
            .filter_map(|(at, ans)| ans.map(|t| t - at))
            .max()
            .unwrap_or(0);
        let mut times: Vec<Nanos> = answers.into_iter().flatten().collect();
        times.sort_unstable();
        println!(
            "| {a} | {} | {} | {} | {} ms |",
            times.len(),
            most_within(&times, 100 * MS),
            most_within(&times, 1_000 * MS),
            longest / MS
        );
        if let Some(dir) = &dir {
            plot_one(dir, a, &offered_bins, &bins(times.iter().copied()))?;
        }
        runs.push((a, times));
    }
    if let Some(dir) = &dir {
        plot_cumulative(dir, &offered, &runs)?;
        eprintln!("wrote {}", dir.join("algorithms-*.svg").display());
    }
    Ok(())
}
