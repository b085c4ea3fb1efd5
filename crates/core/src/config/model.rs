//! The validated rules model: what a rules file means once parsed and checked. Pure data, no I/O.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::calendar::CalendarWindow;

/// A time unit of a limit, as in envoyproxy/ratelimit. Month is 30 days and year 365 days, as there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub(crate) const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Length of one unit in seconds (the reference's values: month = 30 d, year = 365 d).
    pub(crate) fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// Parses a unit name case-insensitively (`second`, `MINUTE`, …).
    pub(crate) fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }

    /// Lower-case name as written in rules files.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The algorithm that decides a limit. The discriminants are written into store keys (memory and
/// Redis), so they are explicit and stable: never renumber, only append (a test pins them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Algorithm {
    /// GCRA token bucket: `requests_per_unit` per window refill, capacity `burst`.
    #[default]
    TokenBucket = 0,
    /// The reference's epoch-aligned fixed window counter.
    FixedWindow = 1,
    /// Two-window weighted counter: the previous window's count, weighted by how much of it is
    /// still inside the sliding window, plus the current count.
    SlidingWindow = 2,
    /// A queue of `burst` requests drained at the rate: admitted requests are answered when their
    /// turn comes (delayed, at most `max_delay`), so they leave evenly spaced.
    LeakyBucket = 3,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::LeakyBucket,
    ];

    pub fn parse(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The stable number of the algorithm in store keys.
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One limit: `requests_per_unit` per `unit_multiplier` × `unit`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Limit {
    /// `rate_limit.name`: reported as `current_limit.name`, the target of `replaces`.
    pub name: Option<String>,
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// Our extension: the window is `unit_multiplier` units long (default 1).
    pub unit_multiplier: u32,
    /// Our extension: the algorithm; `None` means the server's default (`--default-algorithm`).
    pub algorithm: Option<Algorithm>,
    /// Our extension: token bucket capacity / leaky bucket queue length (default
    /// `requests_per_unit`).
    pub(crate) burst: Option<u32>,
    /// Our extension, leaky bucket only: the longest a request may wait for its turn (default:
    /// the server's `--default-max-delay`).
    pub(crate) max_delay: Option<Duration>,
    /// Our extension, fixed and sliding windows only: the window is a calendar `unit` in a time
    /// zone (`calendar: {time_zone: Europe/Berlin}`) instead of a length from the epoch.
    pub calendar: Option<CalendarWindow>,
    /// Names of limits this one replaces when both match in one request.
    pub replaces: Vec<String>,
    /// Our extension: how the limit shows in the IETF `RateLimit-Policy` and `RateLimit` response
    /// fields (`--rate-limit-headers ietf`): `policy: <name>`, or `advertise: false`.
    pub policy: PolicyName,
}

/// The name a limit's quota policy is advertised under in the IETF fields, or none.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum PolicyName {
    /// Not written: the limit's `name`, else the rule's path.
    #[default]
    Derived,
    /// `policy: <name>`: printable ASCII, checked when the rules are read.
    Named(String),
    /// `advertise: false`: an internal limit, never shown to clients.
    Unadvertised,
}

impl PolicyName {
    /// Whether `name` can be a policy name as written: non-empty printable ASCII (an sf-string
    /// of RFC 8941 holds nothing else).
    pub fn valid(name: &str) -> bool {
        !name.is_empty() && name.bytes().all(|b| (0x20..=0x7e).contains(&b))
    }
}

impl Limit {
    /// The window (refill period) in seconds: unit × multiplier.
    pub(crate) fn period_seconds(&self) -> u64 {
        self.unit.seconds() * u64::from(self.unit_multiplier)
    }

    /// Token-bucket capacity / queue length: `burst`, or `requests_per_unit` when unset.
    pub fn effective_burst(&self) -> u32 {
        self.burst.unwrap_or(self.requests_per_unit)
    }
}

/// What a descriptor entry's `rate_limit` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitSpec {
    /// `unlimited: true`: matched, never limited, remaining reported as u32::MAX.
    Unlimited {
        name: Option<String>,
        replaces: Vec<String>,
    },
    /// One or more limits; all must pass.
    Limited(Vec<Limit>),
}

/// What a descriptor entry's `concurrency` says: at most `max_in_flight` requests of one key at
/// once, each holding its slot until its stream-done call gives it back or `lease` has passed
/// (a lost release frees its slot then). See docs/algorithms.md, "concurrency".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConcurrencySpec {
    pub max_in_flight: u32,
    pub lease: Duration,
}

/// Where a node was written: file, 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

/// Deepest nesting of descriptors in a rules file: the most entries a request's descriptor may
/// have by default (`MAX_ENTRIES`), since a rule matches a descriptor of exactly its depth.
pub(crate) const MAX_DESCRIPTOR_DEPTH: usize = 32;

/// A `metadata` value as written (any YAML): returned to Envoy in the response's dynamic
/// metadata. Numbers keep their text (the model stays `Eq`); they become doubles on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaValue {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    List(Vec<MetaValue>),
    Map(Vec<(String, MetaValue)>),
}

/// One descriptor entry of the rules tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorConfig {
    pub key: String,
    /// `None` matches any value; a value with `*` is a wildcard pattern.
    pub value: Option<String>,
    pub rate_limit: Option<RateLimitSpec>,
    /// `concurrency`: a limit on requests in flight instead of a rate (never with `rate_limit`).
    pub concurrency: Option<ConcurrencySpec>,
    pub shadow_mode: bool,
    /// `quota_mode`: over its limit, this descriptor denies the request only when every quota
    /// descriptor of the request is over (the reference's rule).
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// `value_to_metric`: the request's value at this level goes into the rule's metric label.
    pub(crate) value_to_metric: bool,
    /// `share_threshold` (wildcard values only): every value the pattern matches shares one
    /// counter.
    pub(crate) share_threshold: bool,
    /// `metadata`: a mapping returned in the response's dynamic metadata when this descriptor
    /// passes (`RESPONSE_DYNAMIC_METADATA`).
    pub metadata: Option<Vec<(String, MetaValue)>>,
    pub descriptors: Vec<DescriptorConfig>,
    pub(crate) location: Location,
}

/// One rules file: one domain and its descriptor tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainConfig {
    pub domain: String,
    pub descriptors: Vec<DescriptorConfig>,
    /// The file it came from, for messages.
    pub source: PathBuf,
    /// Accepted as the reference accepts it, but worth a log line (`file:line:column: message`).
    pub warnings: Vec<String>,
}
