//! `replay --from-envoy-log --map MAPPING.yaml`: Envoy access-log JSON lines (the `json_format` of
//! docs/record.md) turned into the ShouldRateLimit requests Envoy's ratelimit filter sent for
//! them. The mapping names the filter's domain and the routes' `rate_limits` actions as Envoy's
//! route config writes them; each action reads the log field the documented format writes for
//! it. Like Envoy: the first matching route is used, each `rate_limits` entry gives one
//! descriptor, an action whose input is absent drops its descriptor (or only its entry with
//! `skip_if_absent`), and a request with no descriptor makes no call. Pure: the mapping is parsed
//! from text, lines from bytes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::Value;

use super::input::Decode;
use ratelimit_core::clock::Nanos;
use ratelimit_core::config::yaml::{self, Node, NodeKind, ScalarKind};
use ratelimit_core::wire::time::parse_instant;

/// Log fields the documented `json_format` writes (request headers are written under their
/// lower-case name, dynamic metadata under `FILTER:KEY:…` as `%DYNAMIC_METADATA(…)%` names it).
pub(crate) const TIME_FIELD: &str = "start_time";
pub(crate) const REMOTE_ADDRESS_FIELD: &str = "remote_address";
pub(crate) const PATH_FIELD: &str = "path";

/// One `rate_limits` action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// `remote_address: {}` → (`remote_address`, the client IP).
    RemoteAddress,
    /// `request_headers` → (`descriptor_key`, the header's value).
    RequestHeaders {
        field: String,
        key: String,
        skip_if_absent: bool,
    },
    /// `generic_key` → (`descriptor_key` or `generic_key`, `descriptor_value`).
    GenericKey { key: String, value: String },
    /// `metadata` (dynamic) → (`descriptor_key`, the value at `metadata_key`), or `default_value`.
    Metadata {
        field: String,
        key: String,
        default: Option<String>,
        skip_if_absent: bool,
    },
}

/// How a route matches the request's `:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RouteMatch {
    Prefix(String),
    /// The path without its query string.
    Path(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) matcher: RouteMatch,
    /// One list of actions per `rate_limits` entry.
    pub(crate) rate_limits: Vec<Vec<Action>>,
}

/// A mapping file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub(crate) domain: String,
    /// In order; the first that matches is used.
    pub(crate) routes: Vec<Route>,
}

fn at(node: &Node) -> String {
    format!("{}:{}", node.location.line, node.location.column)
}

fn get<'n>(node: &'n Node, key: &str) -> Option<&'n Node> {
    match &node.kind {
        NodeKind::Map(entries) => entries
            .iter()
            .find(|(k, _)| matches!(&k.kind, NodeKind::Scalar(t, _) if t == key))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn keys(node: &Node) -> Vec<(&str, &Node)> {
    match &node.kind {
        NodeKind::Map(entries) => entries
            .iter()
            .filter_map(|(k, v)| match &k.kind {
                NodeKind::Scalar(t, _) => Some((t.as_str(), v)),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn text<'n>(node: &'n Node, what: &str) -> Result<&'n str, String> {
    match &node.kind {
        NodeKind::Scalar(t, ScalarKind::Str | ScalarKind::Int) => Ok(t),
        _ => Err(format!(
            "{}: {what} must be a string, not {}",
            at(node),
            node.describe()
        )),
    }
}

fn flag(node: Option<&Node>, what: &str) -> Result<bool, String> {
    match node.map(|n| (n, &n.kind)) {
        None => Ok(false),
        Some((_, NodeKind::Scalar(_, ScalarKind::Bool(b)))) => Ok(*b),
        Some((n, _)) => Err(format!("{}: {what} must be true or false", at(n))),
    }
}

fn list<'n>(node: &'n Node, what: &str) -> Result<&'n [Node], String> {
    match &node.kind {
        NodeKind::Seq(items) => Ok(items),
        _ => Err(format!(
            "{}: {what} must be a list, not {}",
            at(node),
            node.describe()
        )),
    }
}

fn only(node: &Node, allowed: &[&str], what: &str) -> Result<(), String> {
    if !matches!(node.kind, NodeKind::Map(_)) {
        return Err(format!(
            "{}: {what} must be a mapping, not {}",
            at(node),
            node.describe()
        ));
    }
    for (k, v) in keys(node) {
        if !allowed.contains(&k) {
            return Err(format!(
                "{}: unknown setting `{k}` in {what} (known: {})",
                at(v),
                allowed.join(", ")
            ));
        }
    }
    Ok(())
}

/// One entry of a route's `actions`, as Envoy's config writes it.
fn action(node: &Node) -> Result<Action, String> {
    let entries = keys(node);
    let &[(name, body)] = entries.as_slice() else {
        return Err(format!(
            "{}: an action is a mapping with one key, such as `remote_address: {{}}`",
            at(node)
        ));
    };
    match name {
        "remote_address" => Ok(Action::RemoteAddress),
        "request_headers" => {
            only(
                body,
                &["header_name", "descriptor_key", "skip_if_absent"],
                name,
            )?;
            Ok(Action::RequestHeaders {
                field: required(body, name, "header_name")?.to_ascii_lowercase(),
                key: required(body, name, "descriptor_key")?,
                skip_if_absent: flag(get(body, "skip_if_absent"), "skip_if_absent")?,
            })
        }
        "generic_key" => {
            only(body, &["descriptor_key", "descriptor_value"], name)?;
            Ok(Action::GenericKey {
                key: match get(body, "descriptor_key") {
                    Some(k) => text(k, "descriptor_key")?.to_owned(),
                    None => "generic_key".to_owned(),
                },
                value: required(body, name, "descriptor_value")?,
            })
        }
        "metadata" => metadata_action(body),
        other => Err(format!(
            "{}: action `{other}` is not supported by replay (supported: remote_address, request_headers, generic_key, metadata)",
            at(node)
        )),
    }
}

/// The text of `key`, which action `name`'s `body` must have.
fn required(body: &Node, name: &str, key: &str) -> Result<String, String> {
    get(body, key)
        .ok_or_else(|| format!("{}: {name} needs `{key}`", at(body)))
        .and_then(|n| text(n, key))
        .map(str::to_owned)
}

/// A `metadata` action: dynamic metadata only, read from the access log's field of its key path.
fn metadata_action(body: &Node) -> Result<Action, String> {
    only(
        body,
        &[
            "descriptor_key",
            "metadata_key",
            "default_value",
            "source",
            "skip_if_absent",
        ],
        "metadata",
    )?;
    match get(body, "source").map(|s| (s, text(s, "source"))) {
        None | Some((_, Ok("DYNAMIC"))) => {}
        Some((s, _)) => {
            return Err(format!(
                "{}: only `source: DYNAMIC` metadata is in the access log",
                at(s)
            ));
        }
    }
    Ok(Action::Metadata {
        field: metadata_field(body)?,
        key: required(body, "metadata", "descriptor_key")?,
        default: get(body, "default_value")
            .map(|d| text(d, "default_value").map(str::to_owned))
            .transpose()?,
        skip_if_absent: flag(get(body, "skip_if_absent"), "skip_if_absent")?,
    })
}

/// `metadata_key` as the access log's field: `key`, then `:step` for each step of its `path`.
fn metadata_field(body: &Node) -> Result<String, String> {
    let meta = get(body, "metadata_key")
        .ok_or_else(|| format!("{}: metadata needs `metadata_key`", at(body)))?;
    only(meta, &["key", "path"], "metadata_key")?;
    let mut field = get(meta, "key")
        .ok_or_else(|| format!("{}: metadata_key needs `key`", at(meta)))
        .and_then(|k| text(k, "key"))?
        .to_owned();
    if let Some(path) = get(meta, "path") {
        for step in list(path, "path")? {
            only(step, &["key"], "a path step")?;
            let key =
                get(step, "key").ok_or_else(|| format!("{}: a path step needs `key`", at(step)))?;
            field.push(':');
            field.push_str(text(key, "key")?);
        }
    }
    Ok(field)
}

fn rate_limits(node: &Node) -> Result<Vec<Vec<Action>>, String> {
    list(node, "rate_limits")?
        .iter()
        .map(|entry| {
            only(entry, &["actions"], "a rate_limits entry")?;
            let actions = get(entry, "actions")
                .ok_or_else(|| format!("{}: a rate_limits entry needs `actions`", at(entry)))?;
            list(actions, "actions")?.iter().map(action).collect()
        })
        .collect()
}

impl Mapping {
    /// Parses a mapping; errors name `line:column` and the setting.
    pub fn parse(text_: &str) -> Result<Mapping, String> {
        let doc = yaml::parse(text_);
        if let Some(e) = doc.errors.first() {
            return Err(format!(
                "{}:{}: {}",
                e.location.line, e.location.column, e.message
            ));
        }
        let root = doc.root.ok_or("1:1: the mapping is empty")?;
        only(&root, &["domain", "rate_limits", "routes"], "the mapping")?;
        let domain = get(&root, "domain")
            .ok_or_else(|| {
                format!(
                    "{}: the mapping needs `domain` (the ratelimit filter's)",
                    at(&root)
                )
            })
            .and_then(|d| text(d, "domain"))?
            .to_owned();
        let routes = match (get(&root, "rate_limits"), get(&root, "routes")) {
            (Some(r), None) => vec![Route {
                matcher: RouteMatch::Prefix("/".into()),
                rate_limits: rate_limits(r)?,
            }],
            (None, Some(routes)) => list(routes, "routes")?
                .iter()
                .map(|route| {
                    only(route, &["match", "rate_limits"], "a route")?;
                    let m = get(route, "match")
                        .ok_or_else(|| format!("{}: a route needs `match`", at(route)))?;
                    only(m, &["prefix", "path"], "match")?;
                    let matcher = match (get(m, "prefix"), get(m, "path")) {
                        (Some(p), None) => RouteMatch::Prefix(text(p, "prefix")?.to_owned()),
                        (None, Some(p)) => RouteMatch::Path(text(p, "path")?.to_owned()),
                        _ => return Err(format!("{}: match needs one of `prefix`, `path`", at(m))),
                    };
                    Ok(Route {
                        matcher,
                        rate_limits: get(route, "rate_limits")
                            .map_or(Ok(Vec::new()), rate_limits)?,
                    })
                })
                .collect::<Result<_, String>>()?,
            _ => {
                return Err(format!(
                    "{}: the mapping needs either `rate_limits` (every request) or `routes`",
                    at(&root)
                ));
            }
        };
        Ok(Mapping { domain, routes })
    }

    /// Reads and parses a mapping file; errors start with `FILE:`.
    pub fn load(path: &Path) -> Result<Mapping, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Mapping::parse(&text).map_err(|e| format!("{}:{e}", path.display()))
    }

    fn route(&self, path: &str) -> Option<&Route> {
        let without_query = path.split_once('?').map_or(path, |(p, _)| p);
        self.routes.iter().find(|r| match &r.matcher {
            RouteMatch::Prefix(p) => path.starts_with(p.as_str()),
            RouteMatch::Path(p) => without_query == p,
        })
    }
}

/// A log field's value as text: strings as they are, numbers and booleans written out; null,
/// missing and empty values are absent.
fn field<'v>(fields: &'v HashMap<Cow<'_, str>, Value>, name: &str) -> Option<Cow<'v, str>> {
    match fields.get(name)? {
        Value::String(s) if !s.is_empty() => Some(Cow::Borrowed(s)),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        Value::Bool(b) => Some(Cow::Owned(b.to_string())),
        _ => None,
    }
}

impl Decode for Mapping {
    fn decode(&self, line: &[u8], out: &mut RateLimitRequest) -> Result<Option<Nanos>, String> {
        let fields: HashMap<Cow<'_, str>, Value> =
            serde_json::from_slice(line).map_err(|e| e.to_string())?;
        let time = field(&fields, TIME_FIELD).ok_or_else(|| format!("no `{TIME_FIELD}`"))?;
        let time = parse_instant(&time).map_err(|e| e.describe(TIME_FIELD, &time))?;
        let path = field(&fields, PATH_FIELD).unwrap_or(Cow::Borrowed("/"));
        let Some(route) = self.route(&path) else {
            return Ok(None);
        };
        out.domain.clone_from(&self.domain);
        out.hits_addend = 0;
        out.descriptors.clear();
        'entries: for actions in &route.rate_limits {
            let mut entries = Vec::with_capacity(actions.len());
            for a in actions {
                let (key, value) = match a {
                    Action::RemoteAddress => match field(&fields, REMOTE_ADDRESS_FIELD) {
                        Some(v) => ("remote_address", v),
                        None => continue 'entries,
                    },
                    Action::RequestHeaders {
                        field: f,
                        key,
                        skip_if_absent,
                    } => match field(&fields, f) {
                        Some(v) => (key.as_str(), v),
                        None if *skip_if_absent => continue,
                        None => continue 'entries,
                    },
                    Action::GenericKey { key, value } => {
                        (key.as_str(), Cow::Borrowed(value.as_str()))
                    }
                    Action::Metadata {
                        field: f,
                        key,
                        default,
                        skip_if_absent,
                    } => {
                        match field(&fields, f).or_else(|| default.as_deref().map(Cow::Borrowed)) {
                            Some(v) => (key.as_str(), v),
                            None if *skip_if_absent => continue,
                            None => continue 'entries,
                        }
                    }
                };
                entries.push(Entry {
                    key: key.to_owned(),
                    value: value.into_owned(),
                });
            }
            if !entries.is_empty() {
                out.descriptors.push(RateLimitDescriptor {
                    entries,
                    ..Default::default()
                });
            }
        }
        Ok((!out.descriptors.is_empty()).then_some(time))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PER_ROUTE: &str = "domain: per-route
routes:
  - match: { path: /healthz }
  - match: { prefix: /v1/search }
    rate_limits:
      - actions:
          - generic_key: { descriptor_value: global }
      - actions:
          - request_headers: { header_name: X-Api-Key, descriptor_key: api_key }
          - generic_key: { descriptor_key: path, descriptor_value: /v1/search }
  - match: { prefix: / }
    rate_limits:
      - actions:
          - remote_address: {}
          - request_headers: { header_name: x-tenant, descriptor_key: tenant, skip_if_absent: true }
      - actions:
          - metadata:
              descriptor_key: user
              source: DYNAMIC
              metadata_key:
                key: envoy.filters.http.jwt_authn
                path: [{ key: jwt_payload }, { key: sub }]
";

    fn descriptors(m: &Mapping, line: &str) -> Option<Vec<Vec<(String, String)>>> {
        let mut r = RateLimitRequest::default();
        let time = m.decode(line.as_bytes(), &mut r).expect("valid line")?;
        assert_eq!(
            time,
            1_796_101_200 * ratelimit_core::clock::NANOS_PER_SECOND + 5_000_000
        );
        assert_eq!(r.domain, m.domain);
        Some(
            r.descriptors
                .iter()
                .map(|d| {
                    d.entries
                        .iter()
                        .map(|e| (e.key.clone(), e.value.clone()))
                        .collect()
                })
                .collect(),
        )
    }

    fn pairs(list: &[&[(&str, &str)]]) -> Vec<Vec<(String, String)>> {
        list.iter()
            .map(|d| {
                d.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            })
            .collect()
    }

    const T: &str = "\"start_time\":\"2026-12-01T05:00:00.005Z\"";

    #[test]
    fn builds_the_descriptors_envoy_would_per_route() {
        let m = Mapping::parse(PER_ROUTE).expect("valid mapping");
        // With the key: both descriptors of the search route, in rate_limits order.
        let line = format!(
            "{{{T},\"path\":\"/v1/search?q=1\",\"x-api-key\":\"k1\",\"remote_address\":\"10.0.0.1\"}}"
        );
        assert_eq!(
            descriptors(&m, &line),
            Some(pairs(&[
                &[("generic_key", "global")],
                &[("api_key", "k1"), ("path", "/v1/search")]
            ]))
        );
        // Without it (null, as Envoy logs an absent header): that descriptor is dropped.
        let line = format!("{{{T},\"path\":\"/v1/search\",\"x-api-key\":null}}");
        assert_eq!(
            descriptors(&m, &line),
            Some(pairs(&[&[("generic_key", "global")]]))
        );
        // The path route without rate_limits: no call.
        let line = format!("{{{T},\"path\":\"/healthz\",\"remote_address\":\"10.0.0.1\"}}");
        assert_eq!(descriptors(&m, &line), None);
        // Other paths: skip_if_absent keeps the descriptor without its entry; the JWT subject.
        let line = format!(
            "{{{T},\"path\":\"/x\",\"remote_address\":\"10.0.0.2\",\"envoy.filters.http.jwt_authn:jwt_payload:sub\":\"alice\"}}"
        );
        assert_eq!(
            descriptors(&m, &line),
            Some(pairs(&[
                &[("remote_address", "10.0.0.2")],
                &[("user", "alice")]
            ]))
        );
        let line =
            format!("{{{T},\"path\":\"/x\",\"remote_address\":\"10.0.0.2\",\"x-tenant\":\"t\"}}");
        assert_eq!(
            descriptors(&m, &line),
            Some(pairs(&[&[("remote_address", "10.0.0.2"), ("tenant", "t")]]))
        );
        // Neither input: no descriptor, no call.
        let line = format!("{{{T},\"path\":\"/x\"}}");
        assert_eq!(descriptors(&m, &line), None);
    }

    #[test]
    fn bad_lines_and_mappings_say_why() {
        let m = Mapping::parse(PER_ROUTE).expect("valid mapping");
        let mut r = RateLimitRequest::default();
        assert!(
            m.decode(b"{\"path\":\"/\"}", &mut r)
                .unwrap_err()
                .contains("start_time")
        );
        assert!(m.decode(b"[1]", &mut r).is_err());
        let bad = |text: &str| Mapping::parse(text).unwrap_err();
        assert!(bad("rate_limits: []\n").contains("needs `domain`"));
        assert!(bad("domain: d\n").contains("either"));
        let e = bad("domain: d\nrate_limits:\n  - actions:\n      - header_value_match: {}\n");
        assert!(
            e.starts_with("4:") && e.contains("header_value_match"),
            "{e}"
        );
        let e = bad(
            "domain: d\nrate_limits:\n  - actions:\n      - request_headers: {header_name: a}\n",
        );
        assert!(e.contains("descriptor_key"), "{e}");
        let e = bad("domain: d\nrate_limits:\n  - actions: []\n    stage: 1\n");
        assert!(
            e.starts_with("4:") && e.contains("unknown setting `stage`"),
            "{e}"
        );
    }
}
