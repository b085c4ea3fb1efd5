//! The metrics page under a `PROMETHEUS_MAPPER_YAML` mapping: the families the reference sends as
//! statsd stats (per rule, config loads) are replaced by what the mapping makes of those stats,
//! as the reference's Prometheus sink shows them; every other family (ours, `process_*`) stays.
//! A mapped family whose name one of ours has takes its place. Pure.

use std::collections::BTreeMap;

use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};

use super::mapper::{Mapped, Mapper};
use super::names::{has_statsd_name, stats};

const HELP: &str = "The reference's statsd stat, named by PROMETHEUS_MAPPER_YAML";

/// `families` as the mapping shows them.
pub(crate) fn mapped(families: Vec<MetricFamily>, mapper: &Mapper) -> Vec<MetricFamily> {
    // name → labels → value; samples that land on one series are added up.
    let mut series: BTreeMap<String, BTreeMap<Vec<(String, String)>, f64>> = BTreeMap::new();
    for (stat, value) in stats(&families) {
        if let Mapped::Series { name, labels } = mapper.map(&stat) {
            *series.entry(name).or_default().entry(labels).or_default() += value;
        }
    }
    let mut out: Vec<MetricFamily> = families
        .into_iter()
        .filter(|f| !has_statsd_name(f.name()) && !series.contains_key(f.name()))
        .collect();
    for (name, samples) in series {
        let mut family = MetricFamily::default();
        family.set_name(name);
        family.set_help(HELP.into());
        family.set_field_type(MetricType::COUNTER);
        family.set_metric(
            samples
                .into_iter()
                .map(|(labels, value)| {
                    let mut metric = Metric::from_label(
                        labels
                            .into_iter()
                            .map(|(k, v)| {
                                let mut pair = LabelPair::default();
                                pair.set_name(k);
                                pair.set_value(v);
                                pair
                            })
                            .collect(),
                    );
                    let mut counter = Counter::default();
                    counter.set_value(value);
                    metric.set_counter(counter);
                    metric
                })
                .collect(),
        );
        out.push(family);
    }
    out.sort_by(|a, b| a.name().cmp(b.name()));
    out
}
