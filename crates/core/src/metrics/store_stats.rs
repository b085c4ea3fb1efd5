//! `ratelimit_store_keys` (gauge) and `ratelimit_store_evictions` (counter), read from the store's
//! own counts at scrape time, so no handler has to copy them into metrics. Both read 0 until a store
//! is attached (and with a remote backend, whose keys expire there).

use std::sync::{Arc, OnceLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, Metric, MetricFamily, MetricType};

use crate::store::StoreStats;

const KEYS: (&str, &str) = (
    "ratelimit_store_keys",
    "Keys held by the memory store (memory backend only: 0 with a remote backend, whose keys \
     expire there)",
);
const EVICTIONS: (&str, &str) = (
    "ratelimit_store_evictions",
    "Live keys evicted because the key bound was reached",
);

/// Where the collector reads the store's counts.
pub(crate) type StatsSource = Arc<dyn Fn() -> StoreStats + Send + Sync>;

pub(super) struct StoreStatsCollector {
    source: Arc<OnceLock<StatsSource>>,
    descs: [Desc; 2],
}

impl StoreStatsCollector {
    /// A collector that reads `source` once it is set.
    pub(super) fn new(source: Arc<OnceLock<StatsSource>>) -> Self {
        let desc = |(name, help): (&str, &str)| {
            Desc::new(name.into(), help.into(), Vec::new(), Default::default())
                .expect("valid metric definition")
        };
        StoreStatsCollector {
            source,
            descs: [desc(KEYS), desc(EVICTIONS)],
        }
    }
}

fn family((name, help): (&str, &str), kind: MetricType, metric: Metric) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.into());
    family.set_help(help.into());
    family.set_field_type(kind);
    family.set_metric(vec![metric]);
    family
}

impl Collector for StoreStatsCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let stats = self.source.get().map(|read| read()).unwrap_or_default();
        let mut keys = Metric::default();
        let mut gauge = Gauge::default();
        gauge.set_value(stats.keys as f64);
        keys.set_gauge(gauge);
        let mut evictions = Metric::default();
        let mut counter = Counter::default();
        counter.set_value(stats.evictions as f64);
        evictions.set_counter(counter);
        vec![
            family(KEYS, MetricType::GAUGE, keys),
            family(EVICTIONS, MetricType::COUNTER, evictions),
        ]
    }
}
