//! A statsd-exporter mapping file (`PROMETHEUS_MAPPER_YAML`, as the reference's Prometheus sink
//! and Envoy Gateway's `statsd-exporter` read it): which Prometheus name and labels each of the
//! reference's statsd stats becomes. Pure: parsed from text, then asked per stat name.
//!
//! Read: `mappings` (in file order, the first match wins) with `match`, `match_type` (`glob`, the
//! default, where `*` stands for one dot-free run of characters; or `regex`), `name`, `labels`
//! (values may use `$1`, `${1}` or a named group), `action` (`map`, `drop`) and
//! `match_metric_type` (our stats are all counters); `defaults.match_type`. What only shapes
//! timers and histograms (`timer_type`, `observer_type`, `buckets`, `quantiles`, `ttl`…) is
//! accepted and named in [`Mapper::ignored`]. A stat no mapping matches keeps its statsd name,
//! escaped as statsd-exporter escapes it (`ratelimit_service_rate_limit_web_a_b_total_hits`).
//! Aliases and nesting past 32 levels are refused (`guard`). What a stat name becomes is
//! remembered (up to [`MAX_CACHED`] names), so a scrape runs the patterns once per new stat.

use std::collections::HashMap;
use std::sync::Mutex;

use regex::Regex;
use yaml_rust2::{Yaml, YamlLoader};

/// How a mapping's `match` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MatchType {
    Glob,
    Regex,
}

#[derive(Debug)]
struct Mapping {
    pattern: Regex,
    name: String,
    labels: Vec<(String, String)>,
    drop: bool,
    /// `match_metric_type` other than `counter`: never matches one of our stats.
    counters: bool,
}

/// What becomes of one stat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mapped {
    /// A series of this name and these labels (sorted by name).
    Series {
        name: String,
        labels: Vec<(String, String)>,
    },
    /// `action: drop`.
    Dropped,
}

/// Most stat names whose mapping is remembered; past it, further names are mapped on each call.
pub(crate) const MAX_CACHED: usize = 100_000;

/// A parsed mapping file.
#[derive(Debug)]
pub(crate) struct Mapper {
    mappings: Vec<Mapping>,
    ignored: Vec<String>,
    /// Stat name → what it became.
    cache: Mutex<HashMap<String, Mapped>>,
}

/// Keys of a mapping that only shape timers, histograms or series lifetimes: accepted, unused.
const SHAPING_KEYS: &[&str] = &[
    "timer_type",
    "observer_type",
    "buckets",
    "quantiles",
    "summary_options",
    "histogram_options",
    "native_histogram_options",
    "ttl",
    "help",
    "scale",
    "honor_labels",
];

fn text(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Real(r) => Some(r.clone()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn match_type(y: &Yaml, at: &str) -> Result<Option<MatchType>, String> {
    match y {
        Yaml::BadValue => Ok(None),
        y => match text(y).as_deref() {
            Some("glob") | Some("") => Ok(Some(MatchType::Glob)),
            Some("regex") => Ok(Some(MatchType::Regex)),
            _ => Err(format!("{at}: match_type must be glob or regex")),
        },
    }
}

/// A glob as a regex: `*` is one dot-free run of characters, captured.
fn glob(pattern: &str) -> String {
    let parts: Vec<String> = pattern.split('*').map(regex::escape).collect();
    format!("^{}$", parts.join("([^.]*)"))
}

/// A Prometheus name or label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A stat name made a valid Prometheus name, as statsd-exporter escapes one: every other character
/// becomes `_`, and a leading digit gets a `_` before it.
pub(crate) fn escape(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

impl Mapper {
    /// Parses a mapping file's text; the error names the mapping and the field.
    pub(crate) fn parse(source: &str) -> Result<Mapper, String> {
        super::guard::check(source)?;
        let docs = YamlLoader::load_from_str(source).map_err(|e| e.to_string())?;
        let Some(doc) = docs.first() else {
            return Ok(Mapper::new(Vec::new(), Vec::new()));
        };
        let default_type =
            match_type(&doc["defaults"]["match_type"], "defaults")?.unwrap_or(MatchType::Glob);
        let mut ignored = Vec::new();
        let list = match &doc["mappings"] {
            Yaml::Array(list) => list.as_slice(),
            Yaml::BadValue | Yaml::Null => &[],
            _ => return Err("mappings must be a list".into()),
        };
        let mut mappings = Vec::with_capacity(list.len());
        for (i, m) in list.iter().enumerate() {
            let at = format!("mappings[{i}]");
            let Yaml::Hash(fields) = m else {
                return Err(format!("{at}: a mapping is a map"));
            };
            for key in fields.keys().filter_map(text) {
                if SHAPING_KEYS.contains(&key.as_str()) && !ignored.contains(&key) {
                    ignored.push(key);
                }
            }
            let Some(pattern) = text(&m["match"]).filter(|p| !p.is_empty()) else {
                return Err(format!("{at}: match is required"));
            };
            let kind = match_type(&m["match_type"], &at)?.unwrap_or(default_type);
            let regex = match kind {
                MatchType::Glob => glob(&pattern),
                MatchType::Regex => pattern.clone(),
            };
            let pattern = Regex::new(&regex).map_err(|e| format!("{at}: match: {e}"))?;
            let drop = match text(&m["action"]).as_deref() {
                None | Some("map") => false,
                Some("drop") => true,
                Some(other) => return Err(format!("{at}: action {other:?} is not map or drop")),
            };
            let name = text(&m["name"]).unwrap_or_default();
            if !drop && name.is_empty() {
                return Err(format!("{at}: name is required"));
            }
            let counters = match text(&m["match_metric_type"]).as_deref() {
                None | Some("counter") => true,
                Some("gauge") | Some("observer") | Some("timer") | Some("histogram")
                | Some("summary") => false,
                Some(other) => return Err(format!("{at}: match_metric_type {other:?} is unknown")),
            };
            let mut labels = Vec::new();
            match &m["labels"] {
                Yaml::Hash(h) => {
                    for (k, v) in h {
                        let (Some(k), Some(v)) = (text(k), text(v)) else {
                            return Err(format!("{at}: labels are name: value"));
                        };
                        if !is_name(&k) {
                            return Err(format!("{at}: label name {k:?} is not a valid name"));
                        }
                        labels.push((k, v));
                    }
                }
                Yaml::BadValue | Yaml::Null => {}
                _ => return Err(format!("{at}: labels must be a map")),
            }
            labels.sort();
            mappings.push(Mapping {
                pattern,
                name,
                labels,
                drop,
                counters,
            });
        }
        Ok(Mapper::new(mappings, ignored))
    }

    fn new(mappings: Vec<Mapping>, ignored: Vec<String>) -> Mapper {
        Mapper {
            mappings,
            ignored,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The mapping keys read but not used (they shape timers and histograms, which we do not send).
    pub(crate) fn ignored(&self) -> &[String] {
        &self.ignored
    }

    /// What the counter `stat` becomes: the first mapping that matches, else its escaped name.
    pub(crate) fn map(&self, stat: &str) -> Mapped {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mapped) = cache.get(stat) {
            return mapped.clone();
        }
        let mapped = self.resolve(stat);
        if cache.len() < MAX_CACHED {
            cache.insert(stat.to_owned(), mapped.clone());
        }
        mapped
    }

    /// How many stat names are remembered.
    #[cfg(test)]
    pub(crate) fn cached(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.len())
    }

    /// [`Mapper::map`] without the cache.
    fn resolve(&self, stat: &str) -> Mapped {
        for m in self.mappings.iter().filter(|m| m.counters) {
            let Some(caps) = m.pattern.captures(stat) else {
                continue;
            };
            if m.drop {
                return Mapped::Dropped;
            }
            let expand = |template: &str| {
                let mut out = String::new();
                caps.expand(template, &mut out);
                out
            };
            return Mapped::Series {
                name: escape(&expand(&m.name)),
                labels: m
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .filter(|(_, v)| !v.is_empty())
                    .collect(),
            };
        }
        Mapped::Series {
            name: escape(stat),
            labels: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of Envoy Gateway's statsd-exporter mapping (and the reference's default one).
    const GATEWAY: &str = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.near_limit"
    name: "ratelimit_service_rate_limit_near_limit"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit.service.rate_limit.*.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit\\.service\\.rate_limit\\.(.*)\\.(.*)\\.(.*)(\\..*)\\.over_limit"
    match_type: regex
    name: "ratelimit_service_rate_limit_over_limit"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit.service.config_load_success"
    name: "ratelimit_service_config_load_success"
    match_metric_type: counter
  - match: "ratelimit.go.*"
    action: drop
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    match_metric_type: observer
"#;

    fn series(name: &str, labels: &[(&str, &str)]) -> Mapped {
        Mapped::Series {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        }
    }

    #[test]
    fn globs_capture_one_dot_free_part_each_and_the_first_match_wins() {
        let m = Mapper::parse(GATEWAY).unwrap();
        assert_eq!(
            m.map("ratelimit.service.rate_limit.web.user.total_hits"),
            series(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "web"), ("key1", "user")]
            )
        );
        assert_eq!(
            m.map("ratelimit.service.rate_limit.web.plan_free.path.total_hits"),
            series(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "web"), ("key1", "plan_free"), ("key2", "path")]
            )
        );
        assert_eq!(
            m.map("ratelimit.service.config_load_success"),
            series("ratelimit_service_config_load_success", &[])
        );
        assert_eq!(m.ignored(), ["timer_type"]);
    }

    #[test]
    fn regexes_expand_their_groups_and_drop_drops() {
        let m = Mapper::parse(GATEWAY).unwrap();
        assert_eq!(
            m.map("ratelimit.service.rate_limit.web.a.b.c.over_limit"),
            series(
                "ratelimit_service_rate_limit_over_limit",
                &[("domain", "web"), ("key1", "a"), ("key2", "b")]
            )
        );
        assert_eq!(m.map("ratelimit.go.heap"), Mapped::Dropped);
    }

    #[test]
    fn what_no_mapping_matches_keeps_its_name_escaped() {
        let m = Mapper::parse(GATEWAY).unwrap();
        // Two levels and over_limit: only the regex (three levels or more) names over_limit.
        assert_eq!(
            m.map("ratelimit.service.rate_limit.web.a.b.over_limit"),
            series("ratelimit_service_rate_limit_web_a_b_over_limit", &[])
        );
        // A mapping for observers never takes a counter.
        assert_eq!(
            m.map("ratelimit_server.ShouldRateLimit.response_time"),
            series("ratelimit_server_ShouldRateLimit_response_time", &[])
        );
        assert_eq!(escape("9.x-y"), "_9_x_y");
    }

    #[test]
    fn an_alias_bomb_is_refused_before_it_is_loaded() {
        let bomb = super::super::guard::tests::alias_bomb();
        let err = Mapper::parse(&bomb).unwrap_err();
        assert!(err.contains("aliases (*name) are not supported"), "{err}");
    }

    #[test]
    fn a_stat_is_mapped_once_and_remembered() {
        let m = Mapper::parse(GATEWAY).unwrap();
        let stat = "ratelimit.service.rate_limit.web.user.total_hits";
        let first = m.map(stat);
        assert_eq!(m.cached(), 1);
        assert_eq!(m.map(stat), first);
        assert_eq!(m.map("ratelimit.go.heap"), Mapped::Dropped);
        assert_eq!(m.cached(), 2);
    }

    #[test]
    fn a_broken_file_is_refused_naming_the_mapping_and_field() {
        let err = |text: &str| Mapper::parse(text).unwrap_err();
        assert_eq!(
            err("mappings:\n  - name: x\n"),
            "mappings[0]: match is required"
        );
        assert!(
            err("mappings:\n  - match: \"a(\"\n    match_type: regex\n    name: x\n")
                .starts_with("mappings[0]: match: ")
        );
        assert_eq!(
            err("mappings:\n  - match: a\n    name: x\n    labels: {\"bad-name\": v}\n"),
            "mappings[0]: label name \"bad-name\" is not a valid name"
        );
        assert_eq!(
            err("mappings:\n  - match: a\n    name: x\n    action: keep\n"),
            "mappings[0]: action \"keep\" is not map or drop"
        );
        assert_eq!(
            err("defaults: {match_type: fuzzy}\n"),
            "defaults: match_type must be glob or regex"
        );
        assert!(Mapper::parse("mappings: [").is_err());
        assert!(
            Mapper::parse("")
                .unwrap()
                .map("a.b")
                .eq(&series("a_b", &[]))
        );
    }
}
