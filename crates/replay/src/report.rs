//! The replay's report as data (`Report`, serialised as the documented JSON) and as an aligned
//! text table. Pure: built from the tallies and rule names, rendered to a `String`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use super::tally::{DiffTally, RuleDiff, RuleTally, Tally, top};
use super::{RuleNames, Run};
use ratelimit_core::clock::{NANOS_PER_SECOND, Nanos};
use ratelimit_core::metrics::OVERRIDE_RULE;
use ratelimit_core::wire::time::format_second;

/// Version of the JSON report's layout (fields are only ever added within a version).
pub(crate) const REPORT_FORMAT: u32 = 1;

#[derive(Debug, Serialize)]
pub struct Report {
    pub(crate) format: u32,
    pub(crate) lines: Lines,
    /// Virtual time of the first and last replayed line (null for no lines).
    pub(crate) time: Option<Span>,
    /// The `--config` run, then the `--against` run if any.
    pub(crate) runs: Vec<RunReport>,
    /// With `--against`: what changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) diff: Option<DiffReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Lines {
    pub(crate) replayed: u64,
    pub(crate) skipped: u64,
    pub(crate) without_call: u64,
    /// Lines that moved the virtual clock forward by more than a day at once.
    pub(crate) time_jumps: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Span {
    pub(crate) first: String,
    pub(crate) last: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    pub(crate) config: String,
    pub(crate) totals: TotalsReport,
    pub(crate) rules: Vec<RuleReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct TotalsReport {
    pub(crate) requests: u64,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) refused: u64,
    pub(crate) unmatched_descriptors: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct RuleReport {
    pub(crate) domain: String,
    pub(crate) rule: String,
    pub(crate) requests: u64,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) near_limit: u64,
    pub(crate) shadow: u64,
    pub(crate) busiest_minute: Option<Minute>,
    pub(crate) top_denied: Vec<KeyCount>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Minute {
    pub(crate) start: String,
    pub(crate) requests: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct KeyCount {
    pub(crate) key: String,
    pub(crate) requests: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct DiffReport {
    pub(crate) requests_ok_to_over: u64,
    pub(crate) requests_over_to_ok: u64,
    pub(crate) rules: Vec<RuleDiffReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct RuleDiffReport {
    pub(crate) domain: String,
    pub(crate) rule: String,
    /// `kept` (in both rules sets), `added` (only in --against), `removed` (only in --config).
    pub(crate) change: &'static str,
    pub(crate) denied_before: u64,
    pub(crate) denied_after: u64,
    pub(crate) newly_denied: u64,
    pub(crate) freed: u64,
    pub(crate) newly_limited_keys: Vec<KeyCount>,
    pub(crate) freed_keys: Vec<KeyCount>,
}

fn keys(list: Vec<(&str, u64)>) -> Vec<KeyCount> {
    list.into_iter()
        .map(|(k, n)| KeyCount {
            key: k.to_owned(),
            requests: n,
        })
        .collect()
}

fn rule_report(domain: &str, rule: &str, t: &RuleTally, top_n: usize) -> RuleReport {
    RuleReport {
        domain: domain.to_owned(),
        rule: rule.to_owned(),
        requests: t.requests,
        allowed: t.allowed,
        denied: t.denied,
        near_limit: t.near,
        shadow: t.shadow,
        busiest_minute: t.busiest_minute().map(|(m, n)| Minute {
            start: format_second(m),
            requests: n,
        }),
        top_denied: keys(t.top_denied(top_n)),
    }
}

/// Every rule of the rules set in order, then the override rows of the domains that had any.
fn rules_of(names: &RuleNames, tally: &Tally) -> Vec<(String, String, RuleTally)> {
    let mut out: Vec<(String, String, RuleTally)> = names
        .order
        .iter()
        .filter_map(|&id| {
            let (d, p) = names.by_id.get(id)?;
            Some((d.clone(), p.clone(), tally.rules.get(id)?.clone()))
        })
        .collect();
    let mut overrides: Vec<_> = tally.overrides.iter().collect();
    overrides.sort_by(|a, b| a.0.cmp(b.0));
    for (domain, t) in overrides {
        out.push((domain.clone(), OVERRIDE_RULE.to_owned(), t.clone()));
    }
    out
}

fn run_report(label: &str, names: &RuleNames, tally: &Tally, top_n: usize) -> RunReport {
    RunReport {
        config: label.to_owned(),
        totals: TotalsReport {
            requests: tally.totals.requests,
            allowed: tally.totals.allowed,
            denied: tally.totals.denied,
            refused: tally.totals.refused,
            unmatched_descriptors: tally.totals.unmatched,
        },
        rules: rules_of(names, tally)
            .iter()
            .map(|(d, p, t)| rule_report(d, p, t, top_n))
            .collect(),
    }
}

/// One rules set's tally and names, for `build`.
pub struct RunInput<'a> {
    pub(crate) label: &'a str,
    pub(crate) names: &'a RuleNames,
    pub(crate) tally: &'a Tally,
}

fn instant(t: Nanos) -> String {
    format_second(t / NANOS_PER_SECOND)
}

/// The report of a replay: `before` alone, or `before` against `after` with their `diff`.
pub fn build(
    run: &Run,
    before: RunInput<'_>,
    after: Option<(RunInput<'_>, &DiffTally)>,
    top_n: usize,
) -> Report {
    let mut runs = vec![run_report(before.label, before.names, before.tally, top_n)];
    let diff = after.map(|(after, diff)| {
        runs.push(run_report(after.label, after.names, after.tally, top_n));
        diff_report(&before, &after, diff, top_n)
    });
    Report {
        format: REPORT_FORMAT,
        lines: Lines {
            replayed: run.lines_replayed,
            skipped: run.lines_skipped,
            without_call: run.lines_without_call,
            time_jumps: run.time_jumps,
        },
        time: run.first.zip(run.last).map(|(f, l)| Span {
            first: instant(f),
            last: instant(l),
        }),
        runs,
        diff,
    }
}

fn diff_report(
    before: &RunInput<'_>,
    after: &RunInput<'_>,
    diff: &DiffTally,
    top_n: usize,
) -> DiffReport {
    let rows_before = rules_of(before.names, before.tally);
    let rows_after = rules_of(after.names, after.tally);
    let find = |rows: &[(String, String, RuleTally)], d: &str, p: &str| {
        rows.iter()
            .find(|(rd, rp, _)| rd == d && rp == p)
            .map(|(_, _, t)| t.denied)
    };
    // In order: the --config rules, then rules only in --against, then any other changed name.
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    let names = rows_before
        .iter()
        .chain(&rows_after)
        .map(|(d, p, _)| (d.clone(), p.clone()))
        .chain(diff.rules.keys().cloned());
    for name in names {
        if seen.insert(name.clone()) {
            order.push(name);
        }
    }
    let empty = RuleDiff::default();
    let rules = order
        .into_iter()
        .filter_map(|(d, p)| {
            let b = find(&rows_before, &d, &p);
            let a = find(&rows_after, &d, &p);
            let change = match (b, a) {
                (Some(_), None) => "removed",
                (None, Some(_)) => "added",
                _ => "kept",
            };
            let row = diff.rules.get(&(d.clone(), p.clone())).unwrap_or(&empty);
            let (b, a) = (b.unwrap_or(0), a.unwrap_or(0));
            // Unchanged rules nothing hit are noise; added and removed ones are always shown.
            if change == "kept" && b == 0 && a == 0 && *row == empty {
                return None;
            }
            Some(RuleDiffReport {
                domain: d,
                rule: p,
                change,
                denied_before: b,
                denied_after: a,
                newly_denied: row.newly_denied,
                freed: row.freed,
                newly_limited_keys: keys(top(&row.newly_limited_keys, top_n)),
                freed_keys: keys(top(&row.freed_keys, top_n)),
            })
        })
        .collect();
    DiffReport {
        requests_ok_to_over: diff.ok_to_over,
        requests_over_to_ok: diff.over_to_ok,
        rules,
    }
}

/// Left-aligned first columns, right-aligned numbers, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>], text_columns: usize) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = w - cell.chars().count();
            if i < text_columns {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            } else {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn key_list(keys: &[KeyCount]) -> String {
    keys.iter()
        .map(|k| format!("{} ({})", k.key, k.requests))
        .collect::<Vec<_>>()
        .join(", ")
}

fn run_text(out: &mut String, run: &RunReport) {
    let t = &run.totals;
    let _ = writeln!(
        out,
        "{}: {} requests, {} allowed, {} denied, {} refused; {} descriptors matched no rule",
        run.config, t.requests, t.allowed, t.denied, t.refused, t.unmatched_descriptors
    );
    let rows: Vec<Vec<String>> = run
        .rules
        .iter()
        .map(|r| {
            vec![
                r.domain.clone(),
                r.rule.clone(),
                r.requests.to_string(),
                r.allowed.to_string(),
                r.denied.to_string(),
                r.near_limit.to_string(),
                r.shadow.to_string(),
                r.busiest_minute
                    .as_ref()
                    .map_or("-".into(), |m| format!("{} ({})", m.start, m.requests)),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "domain",
            "rule",
            "requests",
            "allowed",
            "denied",
            "near limit",
            "shadow",
            "busiest minute (requests)",
        ],
        &rows,
        2,
    ));
    let denied: Vec<&RuleReport> = run
        .rules
        .iter()
        .filter(|r| !r.top_denied.is_empty())
        .collect();
    if !denied.is_empty() {
        out.push_str("most denied keys:\n");
        for r in denied {
            let _ = writeln!(
                out,
                "  {} {}: {}",
                r.domain,
                r.rule,
                key_list(&r.top_denied)
            );
        }
    }
}

/// The report as text: one table per rules set, then the differences.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "replayed {} lines ({} skipped, {} without a call",
        report.lines.replayed, report.lines.skipped, report.lines.without_call
    );
    match report.lines.time_jumps {
        0 => out.push(')'),
        1 => out.push_str(", 1 time jump)"),
        n => {
            let _ = write!(out, ", {n} time jumps)");
        }
    }
    match &report.time {
        Some(span) => {
            let _ = writeln!(out, ", {} to {}", span.first, span.last);
        }
        None => out.push('\n'),
    }
    for run in &report.runs {
        out.push('\n');
        run_text(&mut out, run);
    }
    if let Some(diff) = &report.diff {
        let _ = writeln!(
            out,
            "\nchanges ({} → {}): {} requests OK → OVER_LIMIT, {} OVER_LIMIT → OK",
            report.runs[0].config,
            report.runs.get(1).map_or("", |r| r.config.as_str()),
            diff.requests_ok_to_over,
            diff.requests_over_to_ok
        );
        let rows: Vec<Vec<String>> = diff
            .rules
            .iter()
            .map(|r| {
                vec![
                    r.domain.clone(),
                    r.rule.clone(),
                    r.change.to_owned(),
                    format!("{} → {}", r.denied_before, r.denied_after),
                    r.newly_denied.to_string(),
                    r.freed.to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "domain",
                "rule",
                "change",
                "denied before → after",
                "newly denied",
                "freed",
            ],
            &rows,
            3,
        ));
        for r in &diff.rules {
            if !r.newly_limited_keys.is_empty() {
                let _ = writeln!(
                    out,
                    "  {} {}: newly limited {}",
                    r.domain,
                    r.rule,
                    key_list(&r.newly_limited_keys)
                );
            }
            if !r.freed_keys.is_empty() {
                let _ = writeln!(
                    out,
                    "  {} {}: freed {}",
                    r.domain,
                    r.rule,
                    key_list(&r.freed_keys)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_text_left_and_numbers_right() {
        let t = table(
            &["rule", "n"],
            &[
                vec!["a".into(), "1000".into()],
                vec!["longer".into(), "7".into()],
            ],
            1,
        );
        assert_eq!(t, "rule       n\na       1000\nlonger     7\n");
    }
}
