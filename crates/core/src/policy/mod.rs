//! The live rules as a matching tree, and the matching itself, exactly as envoyproxy/ratelimit
//! matches: per level an exact `key`+`value` wins, else the first wildcard pattern in file order,
//! else the value-less `key`; no backtracking; a rule applies only when the descriptor ends at its
//! depth. Pure: built from validated `DomainConfig`s, no I/O, no clock.

mod order;
mod pattern;
mod reordered;
mod too_long;

use std::collections::HashMap;

pub use pattern::Pattern;

use crate::config::{
    ConcurrencySpec, DescriptorConfig, DomainConfig, Limit, Location, MetaValue, PolicyName,
    RateLimitSpec,
};
use crate::limiter::{LimitDefaults, LimitParams};

/// One limit of a rule. The rules say nothing of the server's defaults (`--default-algorithm`,
/// `--default-max-delay`), so the numbers the limiter uses are resolved per call with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleLimit {
    pub limit: Limit,
    /// The quota policy it is advertised as in the IETF `RateLimit-Policy`/`RateLimit` fields
    /// (printable ASCII, unquoted), or `None` for an internal limit (`advertise: false`).
    pub policy: Option<String>,
}

impl RuleLimit {
    /// The limiter's numbers for this limit under the server's defaults.
    pub fn params(&self, defaults: &LimitDefaults) -> LimitParams {
        LimitParams::from_limit(&self.limit, defaults)
    }
}

/// What a matched descriptor entry does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleKind {
    Unlimited {
        name: Option<String>,
        replaces: Vec<String>,
    },
    /// All limits must pass; never empty.
    Limited(Vec<RuleLimit>),
    /// `concurrency`: at most `max_in_flight` requests of a key at once. The descriptor a request
    /// sends has the rule's entries, then the request id, then (for the stream-done call that
    /// gives the slot back) the release marker.
    Concurrency(ConcurrencySpec),
}

/// A descriptor entry that carries a `rate_limit` (or `rate_limits`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Dense index of the rule in its `Policy` (0..rule_count), for per-rule tables such as metrics.
    pub id: usize,
    /// The rule's place in the tree as the reference names it in stats: `key_value.key2`, with the
    /// pattern for wildcard entries.
    pub path: String,
    pub kind: RuleKind,
    pub shadow_mode: bool,
    /// `quota_mode`: over the limit, it denies only when every quota descriptor is over.
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// Per entry (by position): `value_to_metric` on the node that entry matches.
    pub(crate) value_to_metric: Vec<bool>,
    /// Per entry (by position): the node's segment of `path` (`key`, `key_value`, `key_pattern`).
    pub(crate) segments: Vec<String>,
    /// Entries (by position) matched by a `share_threshold` wildcard, with the pattern that stands
    /// for their value in the counter's key, so every value it matches shares one counter.
    pub(crate) shared: Vec<(usize, String)>,
    /// `metadata` of the rule's descriptor, for the response's dynamic metadata.
    pub(crate) metadata: Option<Vec<(String, MetaValue)>>,
}

impl Rule {
    /// How many entries the rule's own path has (a concurrency rule's requests add theirs after).
    pub fn depth(&self) -> usize {
        self.segments.len()
    }

    /// Names of the limits this rule replaces when matched.
    pub(crate) fn replaces(&self) -> impl Iterator<Item = &str> {
        let (unlimited, limited): (&[String], &[RuleLimit]) = match &self.kind {
            RuleKind::Unlimited { replaces, .. } => (replaces, &[]),
            RuleKind::Limited(limits) => (&[], limits),
            RuleKind::Concurrency(_) => (&[], &[]),
        };
        unlimited
            .iter()
            .chain(limited.iter().flat_map(|l| l.limit.replaces.iter()))
            .map(String::as_str)
    }
}

/// How a node's value matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeValue {
    Exact(String),
    Wildcard(Pattern),
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub key: String,
    pub value: NodeValue,
    pub(crate) rule: Option<Rule>,
    pub location: Location,
    children: Level,
}

/// The nodes of one level that have one key, for matching: by exact value, the wildcards in file
/// order, and the value-less one (indexes into `Level::nodes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct KeyNodes {
    exact: FastMap<String, usize>,
    wildcards: Vec<usize>,
    any: Option<usize>,
}

/// The policy's lookup tables: built from the rules only, so a fast seeded hash is safe here even
/// though the keys looked up come from clients (a lookup cannot degrade a table).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The entries of one level, indexed for matching: one lookup of the entry's key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Level {
    nodes: Vec<Node>,
    by_key: FastMap<String, KeyNodes>,
}

impl Level {
    /// `above` is what the entries above this level say: (value_to_metric, share_threshold
    /// pattern, segment) per entry.
    fn build(
        configs: &[DescriptorConfig],
        parent_path: &str,
        above: &[(bool, Option<String>, String)],
        next_id: &mut usize,
    ) -> Level {
        let mut level = Level::default();
        for config in configs {
            let mut path_flags = above.to_vec();
            let (value, segment) = match &config.value {
                None => (NodeValue::Any, config.key.clone()),
                Some(v) if Pattern::is_pattern(v) => (
                    NodeValue::Wildcard(Pattern::new(v)),
                    format!("{}_{v}", config.key),
                ),
                Some(v) => (NodeValue::Exact(v.clone()), format!("{}_{v}", config.key)),
            };
            path_flags.push((
                config.value_to_metric,
                config
                    .value
                    .as_ref()
                    .filter(|v| config.share_threshold && Pattern::is_pattern(v))
                    .cloned(),
                segment.clone(),
            ));
            let path = if parent_path.is_empty() {
                segment
            } else {
                format!("{parent_path}.{segment}")
            };
            let index = level.nodes.len();
            let by_key = level.by_key.entry(config.key.clone()).or_default();
            match &value {
                NodeValue::Exact(v) => {
                    by_key.exact.insert(v.clone(), index);
                }
                NodeValue::Wildcard(_) => by_key.wildcards.push(index),
                NodeValue::Any => by_key.any = Some(index),
            }
            let kind = match (&config.rate_limit, &config.concurrency) {
                (Some(spec), _) => Some(compile(spec, &path)),
                (None, Some(spec)) => Some(RuleKind::Concurrency(*spec)),
                (None, None) => None,
            };
            let rule = kind.map(|kind| {
                *next_id += 1;
                Rule {
                    id: *next_id - 1,
                    path: path.clone(),
                    kind,
                    shadow_mode: config.shadow_mode,
                    quota_mode: config.quota_mode,
                    detailed_metric: config.detailed_metric,
                    value_to_metric: path_flags.iter().map(|(v, _, _)| *v).collect(),
                    segments: path_flags.iter().map(|(_, _, s)| s.clone()).collect(),
                    shared: path_flags
                        .iter()
                        .enumerate()
                        .filter_map(|(i, (_, p, _))| Some((i, p.clone()?)))
                        .collect(),
                    metadata: config.metadata.clone(),
                }
            });
            level.nodes.push(Node {
                key: config.key.clone(),
                value,
                rule,
                location: config.location.clone(),
                children: Level::build(&config.descriptors, &path, &path_flags, next_id),
            });
        }
        level
    }

    /// The candidate for one entry: exact, else first wildcard in file order, else value-less key.
    fn candidate(&self, key: &str, value: &str) -> Option<&Node> {
        let nodes = self.by_key.get(key)?;
        let wildcard = || {
            nodes
                .wildcards
                .iter()
                .copied()
                .find(|&i| match &self.nodes[i].value {
                    NodeValue::Wildcard(p) => p.matches(value),
                    _ => false,
                })
        };
        let exact = match nodes.exact.is_empty() {
            true => None,
            false => nodes.exact.get(value).copied(),
        };
        exact
            .or_else(wildcard)
            .or(nodes.any)
            .map(|i| &self.nodes[i])
    }
}

fn compile(spec: &RateLimitSpec, path: &str) -> RuleKind {
    match spec {
        RateLimitSpec::Unlimited { name, replaces } => RuleKind::Unlimited {
            name: name.clone(),
            replaces: replaces.clone(),
        },
        RateLimitSpec::Limited(limits) => RuleKind::Limited(
            limits
                .iter()
                .enumerate()
                .map(|(slot, limit)| RuleLimit {
                    limit: limit.clone(),
                    policy: policy_name(limit, path, slot, limits.len()),
                })
                .collect(),
        ),
    }
}

/// The name a limit is advertised under: `policy:` as written, else its `name`, else the rule's
/// path (with `#<n>`, counted from 1, when the rule has several limits); bytes outside printable
/// ASCII, which an sf-string cannot hold, are percent-encoded (as is `%`).
fn policy_name(limit: &Limit, path: &str, slot: usize, limits: usize) -> Option<String> {
    let derived = match &limit.policy {
        PolicyName::Unadvertised => return None,
        PolicyName::Named(name) => return Some(name.clone()),
        PolicyName::Derived => match &limit.name {
            Some(name) => name.clone(),
            None if limits > 1 => format!("{path}#{}", slot + 1),
            None => path.to_owned(),
        },
    };
    let mut name = String::with_capacity(derived.len());
    for b in derived.bytes() {
        if b == b'%' || !(0x20..=0x7e).contains(&b) {
            name.push_str(&format!("%{b:02X}"));
        } else {
            name.push(char::from(b));
        }
    }
    Some(name)
}

/// Parses a descriptor written as `k=v,k2=v2` (the CLI's and `/explain`'s form) into entries. A
/// value may be empty (`k=`); a missing `=` is an error.
pub fn parse_descriptor(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("'{pair}' is not key=value (in descriptor '{text}')"))
        })
        .collect()
}

/// One domain's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRules {
    pub name: String,
    root: Level,
    /// Its rules' path keys, for descriptors that would match in another order.
    key_sets: reordered::KeySets,
    /// Its rules without nested descriptors, for descriptors longer than such a rule's path.
    leaf_paths: too_long::LeafPaths,
}

/// One step of a match, for `explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<'p> {
    /// Entry `index` matched `node`.
    Matched { index: usize, node: &'p Node },
    /// No entry at this level matches entry `index`.
    NoCandidate { index: usize },
    /// The descriptor is longer than the matched branch.
    TooLong { index: usize },
}

/// Why a descriptor got (or did not get) a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<'p> {
    /// The last entry matched a node with a rule.
    Rule(&'p Rule),
    /// The last entry matched a node with no `rate_limit`: whitelisted.
    NoLimitOnNode,
    /// Some entry had no candidate, or the descriptor was longer than the tree.
    Unmatched,
}

impl DomainRules {
    /// Matches a descriptor's `(key, value)` entries. `trace` sees every step (pass `|_| {}`).
    pub fn walk<'p, 'e>(
        &'p self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        mut trace: impl FnMut(Step<'p>),
    ) -> Outcome<'p> {
        let mut level = &self.root;
        let mut matched: Option<&'p Node> = None;
        for (index, (key, value)) in entries.into_iter().enumerate() {
            if let Some(Node {
                rule:
                    Some(
                        rule @ Rule {
                            kind: RuleKind::Concurrency(_),
                            ..
                        },
                    ),
                ..
            }) = matched
            {
                // The entries after a concurrency rule's are the request's id and release marker:
                // the engine reads them (a concurrency node has no children).
                return Outcome::Rule(rule);
            }
            if matched.is_some() && level.nodes.is_empty() {
                trace(Step::TooLong { index });
                return Outcome::Unmatched;
            }
            match level.candidate(key, value) {
                Some(node) => {
                    trace(Step::Matched { index, node });
                    matched = Some(node);
                    level = &node.children;
                }
                None => {
                    trace(Step::NoCandidate { index });
                    return Outcome::Unmatched;
                }
            }
        }
        match matched {
            Some(Node { rule: Some(r), .. }) => Outcome::Rule(r),
            Some(_) => Outcome::NoLimitOnNode,
            None => Outcome::Unmatched,
        }
    }

    /// The rule for a descriptor, if any (the hot path).
    pub(crate) fn rule_for<'e>(
        &self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&Rule> {
        match self.walk(entries, |_| {}) {
            Outcome::Rule(rule) => Some(rule),
            _ => None,
        }
    }

    /// Every rule of the domain with its path, depth first in file order.
    pub fn rules(&self) -> Vec<&Rule> {
        fn collect<'p>(level: &'p Level, out: &mut Vec<&'p Rule>) {
            for node in &level.nodes {
                out.extend(node.rule.as_ref());
                collect(&node.children, out);
            }
        }
        let mut out = Vec::new();
        collect(&self.root, &mut out);
        out
    }

    /// Every `(key, value)` the domain's entries name exactly (not wildcards, not value-less
    /// keys), at any depth: values that are no secret (`serve --record-hash-values` keeps them).
    pub fn named_values(&self) -> Vec<(&str, &str)> {
        fn collect<'p>(level: &'p Level, out: &mut Vec<(&'p str, &'p str)>) {
            for node in &level.nodes {
                if let NodeValue::Exact(value) = &node.value {
                    out.push((node.key.as_str(), value.as_str()));
                }
                collect(&node.children, out);
            }
        }
        let mut out = Vec::new();
        collect(&self.root, &mut out);
        out
    }
}

/// All domains' rules: one immutable snapshot, swapped whole on reload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    domains: FastMap<String, DomainRules>,
    rule_count: usize,
}

impl Policy {
    /// Builds the matching trees. The configs must be validated (one file per domain).
    pub fn new(configs: &[DomainConfig]) -> Policy {
        let mut next_id = 0;
        let domains = configs
            .iter()
            .map(|c| {
                let root = Level::build(&c.descriptors, "", &[], &mut next_id);
                let key_sets = reordered::KeySets::of(&root);
                let leaf_paths = too_long::LeafPaths::of(&root);
                (
                    c.domain.clone(),
                    DomainRules {
                        name: c.domain.clone(),
                        root,
                        key_sets,
                        leaf_paths,
                    },
                )
            })
            .collect();
        Policy {
            domains,
            rule_count: next_id,
        }
    }

    /// Number of rules; rule ids are `0..rule_count()`.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    pub fn domain(&self, name: &str) -> Option<&DomainRules> {
        self.domains.get(name)
    }

    /// Domains sorted by name.
    pub fn domains(&self) -> Vec<&DomainRules> {
        let mut all: Vec<_> = self.domains.values().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

#[cfg(test)]
mod tests;
