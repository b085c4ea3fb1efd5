//! Exports the live policy's per-rule series as the five `ratelimit_service_rate_limit_*` counter
//! families, read from the live series table at scrape time: a series exists exactly while its
//! rule is live and has been hit. Labels: `domain`, `rule` (the rule's stats key), both sanitized
//! as the reference sanitizes its stat names (`:`, `|` and the dots of IPv4 addresses made `_`),
//! and the reference's `key1`, `key2` (the rule's first two dot-separated parts; `key2` absent for
//! a one-level key), so queries written for the reference's Prometheus names work unchanged.

use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};

use super::rules::{PolicyMetrics, Row};
use super::series::FAMILIES;

pub(super) struct RuleFamilies {
    live: Arc<ArcSwap<PolicyMetrics>>,
    descs: Vec<Desc>,
}

impl RuleFamilies {
    pub(super) fn new(live: Arc<ArcSwap<PolicyMetrics>>) -> Self {
        let descs = FAMILIES
            .iter()
            .map(|(name, help)| {
                Desc::new(
                    (*name).into(),
                    (*help).into(),
                    vec!["domain".into(), "rule".into(), "key1".into(), "key2".into()],
                    Default::default(),
                )
                .expect("valid metric definition")
            })
            .collect();
        RuleFamilies { live, descs }
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_owned());
    pair.set_value(value.to_owned());
    pair
}

/// A series' labels: domain and rule, then the reference's key1 and key2 (the first two parts of
/// the rule's key, split at dots as its statsd-exporter mapping splits the stat name). The rule's
/// key is sanitized already, so the dots of an address split nothing: `remote_address_10_0_0_1`
/// is one part, as in the reference.
fn labels_of(domain: &str, rule: &str) -> Vec<LabelPair> {
    let mut parts = rule.splitn(3, '.');
    let mut labels = vec![label("domain", domain), label("rule", rule)];
    if let Some(key1) = parts.next() {
        labels.push(label("key1", key1));
    }
    if let Some(key2) = parts.next().filter(|k| !k.is_empty()) {
        labels.push(label("key2", key2));
    }
    labels
}

/// Rows sorted by labels, with rows of equal labels added up (a detailed label can spell another
/// rule's path, and two rules' keys, or two domains, can sanitize alike, `a:b` and `a|b`: the
/// reference counts those as one stat, and Prometheus must not see one series twice).
fn merged(mut rows: Vec<Row<'_>>) -> Vec<Row<'_>> {
    rows.sort_unstable_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let mut out: Vec<Row<'_>> = Vec::with_capacity(rows.len());
    for row in rows {
        match out.last_mut() {
            Some(last) if last.0 == row.0 && last.1 == row.1 => {
                for (sum, v) in last.2.iter_mut().zip(row.2) {
                    *sum = sum.saturating_add(v);
                }
            }
            _ => out.push(row),
        }
    }
    out
}

impl Collector for RuleFamilies {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let table = self.live.load_full();
        let hit = table.hit_series();
        let mut rows = Vec::new();
        table.rows(&hit, &mut rows);
        let rows = merged(rows);
        let labels: Vec<Vec<LabelPair>> = rows
            .iter()
            .map(|(domain, rule, _)| labels_of(domain, rule))
            .collect();
        FAMILIES
            .iter()
            .enumerate()
            .map(|(i, (name, help))| {
                let mut family = MetricFamily::default();
                family.set_name((*name).into());
                family.set_help((*help).into());
                family.set_field_type(MetricType::COUNTER);
                family.set_metric(
                    rows.iter()
                        .zip(&labels)
                        .map(|((_, _, values), labels)| {
                            let mut counter = Counter::default();
                            counter.set_value(values[i] as f64);
                            let mut metric = Metric::from_label(labels.clone());
                            metric.set_counter(counter);
                            metric
                        })
                        .collect(),
                );
                family
            })
            .collect()
    }
}
