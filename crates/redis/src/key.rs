//! The Redis backend's keys, text every instance computes alike for the same counter, across
//! processes and restarts, with no secret.
//!
//! Format: `<prefix><domain>|<k>=<v>|<k>=<v>…|<slot>.<algorithm code>.<period>` — e.g.
//! `rl:edge|remote_address=10.0.0.1|0.0.60s`.
//!
//! - Domain, keys and values are percent-encoded: `%`, `|`, `=`, `{`, `}` and every byte that is
//!   not printable ASCII (space and non-ASCII included) become `%XX`. So the text is ASCII and
//!   parses back one way only: (`a`, `b_c`) and (`a_b`, `c`) never meet, as they do in the
//!   reference's `key_value` joining.
//! - No Redis Cluster hash tag (a key holds no `{`: the prefix may not either): a cluster hashes
//!   each key whole, so the counters of one domain spread over every master.
//! - The tail names which limit of the rule (`slot`), its algorithm (the stable codes of
//!   `Algorithm`: 0 token bucket, 1 fixed window, 2 sliding window, 3 leaky bucket) and its window
//!   (`60s`, or `…ns` for a period that is not whole seconds). Limit values (requests per unit,
//!   burst) are not in the key, so editing a limit keeps the counter, as in the memory store.
//! - Length is bounded: a domain longer than [`MAX_DOMAIN`] bytes (encoded) keeps its head and gets
//!   a hash of the whole (`~<16 hex>`); entries that would take the key past [`MAX_KEY`] bytes keep
//!   a readable head and end in `|~<32 hex>`, a 128-bit SipHash (fixed keys) of the full entries
//!   text. An entry always holds a `=`, so a hashed tail never reads as an entry.

use std::fmt::Write;
use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};
use smallvec::SmallVec;

use ratelimit_core::clock::NANOS_PER_SECOND;
use ratelimit_core::store::memory::{MemoryKey, StoreKey};
use ratelimit_core::store::{Charge, CounterId};

/// Longest key before its entries are hashed.
pub(crate) const MAX_KEY: usize = 256;
/// Longest encoded domain kept whole.
pub(crate) const MAX_DOMAIN: usize = 64;

/// A key in a shared store. Cheap to clone. Its digest is taken once, when it is made: it is the
/// key's id in a memory store, its seen-cache shard and entry, and what the maps keyed by it hash
/// (eight bytes, not the text, several times per decision).
#[derive(Clone)]
pub struct TextKey {
    text: std::sync::Arc<str>,
    digest: u128,
}

impl TextKey {
    fn new(text: String) -> TextKey {
        let digest = hash128(text.as_bytes());
        TextKey {
            text: text.into(),
            digest,
        }
    }

    /// A key as Redis holds it (read back from a scan).
    pub(crate) fn from_text(text: String) -> TextKey {
        TextKey::new(text)
    }

    /// The key as Redis holds it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.text.len()
    }

    /// A 128-bit digest of the key (for a memory store holding text keys).
    pub(crate) fn digest(&self) -> u128 {
        self.digest
    }
}

impl PartialEq for TextKey {
    fn eq(&self, other: &TextKey) -> bool {
        self.digest == other.digest && self.text == other.text
    }
}

impl Eq for TextKey {}

/// Equal keys have equal texts, so equal digests.
impl std::hash::Hash for TextKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.digest as u64);
    }
}

impl std::fmt::Debug for TextKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TextKey").field(&self.text).finish()
    }
}

/// A text key names a memory key: its digest (for the failure mode that decides locally).
impl MemoryKey for TextKey {
    fn id(&self) -> StoreKey {
        StoreKey(self.digest())
    }
}

/// The distinct keys of some requests' charges, in order of first appearance.
pub(crate) fn distinct<'a>(
    charges: impl IntoIterator<Item = &'a Charge<TextKey>>,
) -> SmallVec<[TextKey; 4]> {
    let mut keys: SmallVec<[TextKey; 4]> = SmallVec::new();
    for c in charges {
        if !keys.contains(&c.key) {
            keys.push(c.key.clone());
        }
    }
    keys
}

/// Builds text keys under one prefix (`CACHE_KEY_PREFIX`).
#[derive(Debug, Clone, Default)]
pub(crate) struct TextKeyBuilder {
    prefix: String,
}

fn hash128(bytes: &[u8]) -> u128 {
    // Fixed keys: the same text hashes alike in every process. (Not a secret: this only shortens
    // long keys; an attacker who crafts a collision shares a counter with themselves.)
    let mut h = SipHasher13::new_with_keys(0x7261_7465_6c69_6d69, 0x7420_7365_7276_6572);
    h.write(bytes);
    h.finish128().as_u128()
}

/// Appends `s` percent-encoded: runs of plain bytes copied whole (a key is built per decision).
fn encode(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..].iter().take_while(|&&b| plain(b)).count();
        // A run of plain bytes is ASCII, so it starts and ends on char boundaries.
        if let Some(text) = s.get(i..i + run) {
            out.push_str(text);
        }
        i += run;
        if let Some(&b) = bytes.get(i) {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
            i += 1;
        }
    }
}

/// Whether `b` stands for itself in a key (else it is written `%XX`).
fn plain(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'%' | b'|' | b'=' | b'{' | b'}')
}

/// Appends `s` with the characters a Redis glob pattern gives a meaning escaped.
fn glob_escape(out: &mut String, s: &str) {
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Undoes [`encode`]; `None` for text it could not have written.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A counter key read back ([`TextKeyBuilder::parse_counter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedKey {
    /// The entries as counted; `None` when the key holds their hash (a long descriptor).
    pub(crate) entries: Option<Vec<(String, String)>>,
    /// Which limit of the rule.
    pub(crate) slot: usize,
    /// The algorithm's stable code.
    pub(crate) algorithm: u8,
    /// The window, ns.
    pub(crate) period: u64,
}

/// The longest head of `s` of at most `max` bytes (ASCII text, so any cut is a char boundary).
fn head(s: &str, max: usize) -> &str {
    &s[..s.len().min(max)]
}

/// Appends `domain`, encoded; past [`MAX_DOMAIN`], its head and a hash of the whole.
fn push_domain(key: &mut String, domain: &str) {
    let start = key.len();
    encode(key, domain);
    if key.len() - start > MAX_DOMAIN {
        let name = key.split_off(start);
        let digest = hash128(name.as_bytes()) as u64;
        let _ = write!(key, "{}~{digest:016x}", head(&name, MAX_DOMAIN - 17));
    }
}

/// Appends one entry, `|k=v`, encoded.
fn push_entry(body: &mut String, k: &str, v: &str) {
    body.push('|');
    encode(body, k);
    body.push('=');
    encode(body, v);
}

/// Appends `body` to `key` leaving room for a tail of `tail` bytes within [`MAX_KEY`]: whole,
/// or its head and `|~` + 32 hex digits of a hash of the whole.
fn push_body(key: &mut String, body: &str, tail: usize) {
    if key.len() + body.len() + tail > MAX_KEY {
        let room = MAX_KEY.saturating_sub(key.len() + tail + 34);
        let digest = hash128(body.as_bytes());
        key.push_str(head(body, room));
        let _ = write!(key, "|~{digest:032x}");
    } else {
        key.push_str(body);
    }
}

impl TextKeyBuilder {
    /// `prefix` must not contain `{` or `}` (a hash tag would put every key in one cluster slot);
    /// the settings refuse one that does.
    pub(crate) fn new(prefix: impl Into<String>) -> Self {
        TextKeyBuilder {
            prefix: prefix.into(),
        }
    }

    /// The key of a counter.
    pub(crate) fn key(&self, id: &CounterId<'_>) -> TextKey {
        // Written straight into one string (one is built per decision); the rare key that comes
        // out too long has its entries taken out again and bounded.
        let mut key = String::with_capacity(128);
        key.push_str(&self.prefix);
        push_domain(&mut key, id.domain);
        let body = key.len();
        id.entries.for_each(|k, v| push_entry(&mut key, k, v));
        let tail = key.len();
        let mut decimal = itoa::Buffer::new();
        key.push('|');
        key.push_str(decimal.format(id.slot));
        key.push('.');
        key.push_str(decimal.format(id.algorithm.code()));
        key.push('.');
        if id.period.is_multiple_of(NANOS_PER_SECOND) {
            key.push_str(decimal.format(id.period / NANOS_PER_SECOND));
            key.push('s');
        } else {
            key.push_str(decimal.format(id.period));
            key.push_str("ns");
        }
        if key.len() > MAX_KEY {
            let tail = key.split_off(tail);
            let entries = key.split_off(body);
            push_body(&mut key, &entries, tail.len());
            key.push_str(&tail);
        }
        TextKey::new(key)
    }

    /// The key of an RLQS bucket's demand hash (every instance's published demand):
    /// `<prefix>%rlqs|<domain>|<k>=<v>…` with the entries in the order given (sorted by the
    /// caller), encoded and bounded as counter keys are. No counter key starts so: an encoded
    /// domain never holds a bare `%` followed by `r`.
    pub(crate) fn quota_key(&self, domain: &str, entries: &[(String, String)]) -> TextKey {
        let mut key = String::with_capacity(64);
        key.push_str(&self.prefix);
        key.push_str("%rlqs|");
        push_domain(&mut key, domain);
        let mut body = String::new();
        for (k, v) in entries {
            push_entry(&mut body, k, v);
        }
        push_body(&mut key, &body, 0);
        TextKey::new(key)
    }

    /// What every counter key of `domain` starts with: the prefix and the encoded domain (its
    /// head and hash when long), as [`TextKeyBuilder::key`] writes them.
    fn domain_head(&self, domain: &str) -> String {
        let mut key = self.prefix.clone();
        push_domain(&mut key, domain);
        key
    }

    /// A `SCAN … MATCH` pattern for the counter keys of `domain` whose entries start with
    /// `start`: whole entries, the last one's value (or, with no value, its key) a prefix.
    pub(crate) fn counters_pattern(
        &self,
        domain: &str,
        start: &[(String, Option<String>)],
    ) -> String {
        let mut pattern = String::new();
        glob_escape(&mut pattern, &self.domain_head(domain));
        for (i, (k, v)) in start.iter().enumerate() {
            let mut part = String::from("|");
            encode(&mut part, k);
            if let Some(v) = v {
                part.push('=');
                encode(&mut part, v);
            } else if i + 1 < start.len() {
                part.push('=');
            }
            glob_escape(&mut pattern, &part);
        }
        pattern.push_str(if start.is_empty() { "|*" } else { "*" });
        pattern
    }

    /// A counter key of `domain` read back: its entries (`None` when they were hashed, being
    /// long), which limit of the rule, its algorithm code and window. `None` for a key that is
    /// not one of `domain`'s counters.
    pub(crate) fn parse_counter(&self, domain: &str, key: &str) -> Option<ParsedKey> {
        let rest = key.strip_prefix(self.domain_head(domain).as_str())?;
        let rest = rest.strip_prefix('|')?;
        let (body, tail) = match rest.rsplit_once('|') {
            Some((body, tail)) => (Some(body), tail),
            None => (None, rest),
        };
        let mut parts = tail.splitn(3, '.');
        let slot = parts.next()?.parse().ok()?;
        let algorithm = parts.next()?.parse().ok()?;
        let window = parts.next()?;
        let period = match window.strip_suffix("ns") {
            Some(ns) => ns.parse().ok()?,
            None => window
                .strip_suffix('s')?
                .parse::<u64>()
                .ok()?
                .checked_mul(NANOS_PER_SECOND)?,
        };
        let entries = match body {
            None => Some(Vec::new()),
            Some(body) => body
                .split('|')
                .map(|entry| {
                    let (k, v) = entry.split_once('=')?;
                    Some((decode(k)?, decode(v)?))
                })
                .collect(),
        };
        Some(ParsedKey {
            entries,
            slot,
            algorithm,
            period,
        })
    }

    /// The key of an override set through the quota API: `{<prefix>%overrides}|<domain>|<k>=<v>…`,
    /// encoded and bounded as counter keys are. The hash tag keeps every override, and their
    /// index ([`TextKeyBuilder::overrides_key`]), in one cluster slot, so they are read in one
    /// call.
    pub(crate) fn override_key(&self, domain: &str, entries: &[(String, String)]) -> TextKey {
        let body = self.quota_key(domain, entries);
        let rlqs = format!("{}%rlqs|", self.prefix);
        let tail = body
            .as_str()
            .strip_prefix(rlqs.as_str())
            .unwrap_or_default();
        TextKey::new(format!("{}|{tail}", self.overrides_key().as_str()))
    }

    /// The set of the overrides' keys: `{<prefix>%overrides}`.
    pub(crate) fn overrides_key(&self) -> TextKey {
        TextKey::new(format!("{{{}%overrides}}", self.prefix))
    }

    /// The count of the overrides' changes, incremented with each (so an instance reads the set
    /// again only when it moved): `{<prefix>%overrides}%version`, in the set's slot; no override's
    /// key is so (theirs go on with `|`).
    pub(crate) fn overrides_version_key(&self) -> TextKey {
        TextKey::new(format!("{{{}%overrides}}%version", self.prefix))
    }

    /// The key of the hash of RLQS instances alive (each one's last beat).
    pub(crate) fn instances_key(&self) -> TextKey {
        TextKey::new(format!("{}%instances", self.prefix))
    }

    /// The counter every instance increments after it changed a demand in the RLQS buckets'
    /// hashes: `<prefix>%rlqs-moves` (no bucket key is so: theirs go on with `|`).
    pub(crate) fn quota_moves_key(&self) -> TextKey {
        TextKey::new(format!("{}%rlqs-moves", self.prefix))
    }

    /// The key the breaker's probe writes for a second (`cas::write_probe`): `<prefix>%probe`.
    pub(crate) fn write_probe_key(&self) -> String {
        format!("{}%probe", self.prefix)
    }

    /// The key the probe of a conditional `SET` writes and deletes (`cas::conditional_set_probe`):
    /// `<prefix>%conditional-set-probe`.
    pub(crate) fn probe_key(&self) -> String {
        format!("{}%conditional-set-probe", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::limiter::LimitParams;

    /// The key of limit `slot` of a descriptor.
    fn key_of<'e>(
        b: &TextKeyBuilder,
        domain: &'e str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        slot: usize,
        params: &LimitParams,
    ) -> TextKey {
        let entries: Vec<(&str, &str)> = entries.into_iter().collect();
        b.key(&CounterId::new(domain, &entries[..], slot, params))
    }
    use ratelimit_core::config::Algorithm;

    fn params(algorithm: Algorithm, period_s: u64) -> LimitParams {
        LimitParams {
            algorithm,
            requests_per_unit: 10,
            period: period_s * NANOS_PER_SECOND,
            burst: 10,
            max_delay: 0,
            charge_denied: false,
        }
    }

    #[test]
    fn quota_keys_are_apart_from_counter_keys_and_bounded() {
        let b = TextKeyBuilder::new("rl:");
        let entries = vec![
            ("api_key".to_owned(), "k|1".to_owned()),
            ("name".to_owned(), "per-api-key".to_owned()),
        ];
        assert_eq!(
            b.quota_key("rlqs", &entries).as_str(),
            "rl:%rlqs|rlqs|api_key=k%7C1|name=per-api-key"
        );
        assert_eq!(b.instances_key().as_str(), "rl:%instances");
        assert_eq!(b.quota_moves_key().as_str(), "rl:%rlqs-moves");
        let long = vec![("k".to_owned(), "v".repeat(3000))];
        let key = b.quota_key(&"d".repeat(500), &long);
        assert!(key.as_str().len() <= MAX_KEY, "{}", key.as_str());
        assert_ne!(key, b.quota_key(&"d".repeat(500), &[]));
    }

    #[test]
    fn counter_keys_read_back_and_match_their_domain_pattern() {
        let b = TextKeyBuilder::new("r*l:");
        let p = params(Algorithm::FixedWindow, 60);
        let key = key_of(&b, "edge", [("tenant", "a|b"), ("user", "ü")], 1, &p);
        let parsed = b
            .parse_counter("edge", key.as_str())
            .expect("a counter of edge");
        assert_eq!(
            parsed,
            ParsedKey {
                entries: Some(vec![
                    ("tenant".into(), "a|b".into()),
                    ("user".into(), "ü".into())
                ]),
                slot: 1,
                algorithm: Algorithm::FixedWindow.code(),
                period: 60 * NANOS_PER_SECOND,
            }
        );
        assert_eq!(b.parse_counter("edg", key.as_str()), None);
        assert_eq!(b.parse_counter("edge", "r*l:edge"), None);
        let long = key_of(&b, "edge", [("k", &*"v".repeat(400))], 0, &p);
        assert_eq!(
            b.parse_counter("edge", long.as_str()).unwrap().entries,
            None
        );
        let start = |parts: &[(&str, Option<&str>)]| -> Vec<(String, Option<String>)> {
            parts
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned)))
                .collect()
        };
        assert_eq!(b.counters_pattern("edge", &[]), "r\\*l:edge|*");
        assert_eq!(
            b.counters_pattern("edge", &start(&[("tenant", Some("a|")), ("us", None)])),
            "r\\*l:edge|tenant=a%7C|us*"
        );
        assert_eq!(
            b.override_key("edge", &[("k".into(), "v".into())]).as_str(),
            "{r*l:%overrides}|edge|k=v"
        );
    }

    #[test]
    fn algorithm_codes_are_stable() {
        // Written into every store key: changing one orphans every counter of that algorithm.
        let codes: Vec<(u8, &str)> = Algorithm::ALL
            .iter()
            .map(|a| (a.code(), a.name()))
            .collect();
        assert_eq!(
            codes,
            [
                (0, "token_bucket"),
                (1, "fixed_window"),
                (2, "sliding_window"),
                (3, "leaky_bucket")
            ]
        );
    }

    #[test]
    fn the_format_is_readable_and_deterministic() {
        let b = TextKeyBuilder::new("rl:");
        let p = params(Algorithm::FixedWindow, 60);
        let k = key_of(&b, "edge", [("remote_address", "10.0.0.1")], 0, &p);
        assert_eq!(k.as_str(), "rl:edge|remote_address=10.0.0.1|0.1.60s");
        assert_eq!(
            k,
            key_of(
                &TextKeyBuilder::new("rl:"),
                "edge",
                [("remote_address", "10.0.0.1")],
                0,
                &p
            )
        );
        let odd = LimitParams {
            period: 1500,
            ..params(Algorithm::LeakyBucket, 1)
        };
        assert_eq!(
            key_of(&b, "d", [("k", "")], 2, &odd).as_str(),
            "rl:d|k=|2.3.1500ns"
        );
    }

    #[test]
    fn keys_are_unambiguous() {
        let b = TextKeyBuilder::new("");
        let p = params(Algorithm::TokenBucket, 1);
        let k = |d: &str, e: &[(&str, &str)]| key_of(&b, d, e.iter().copied(), 0, &p);
        assert_ne!(k("d", &[("a", "b_c")]), k("d", &[("a_b", "c")]));
        assert_ne!(k("d", &[("a", "b=c")]), k("d", &[("a=b", "c")]));
        assert_ne!(k("d", &[("a", "b|c=d")]), k("d", &[("a", "b"), ("c", "d")]));
        assert_ne!(k("d|x=", &[("a", "b")]), k("d", &[("x", ""), ("a", "b")]));
        assert_eq!(
            k("d{x}", &[("k", "é %")]).as_str(),
            "d%7Bx%7D|k=%C3%A9%20%25|0.0.1s"
        );
        assert!(
            !k("{d}", &[("{k}", "{v}")]).as_str().contains(['{', '}']),
            "no hash tag: a cluster hashes the whole key"
        );
        assert_ne!(
            key_of(&b, "d", [("a", "b")], 0, &p),
            key_of(&b, "d", [("a", "b")], 1, &p)
        );
        assert_ne!(
            key_of(&b, "d", [("a", "b")], 0, &p),
            key_of(&b, "d", [("a", "b")], 0, &params(Algorithm::TokenBucket, 2))
        );
    }

    #[test]
    fn long_keys_are_bounded_keep_a_readable_head_and_stay_distinct() {
        let b = TextKeyBuilder::new("prefix:");
        let p = params(Algorithm::SlidingWindow, 3600);
        let long = "x".repeat(4096);
        let k1 = key_of(&b, "api", [("user", long.as_str())], 0, &p);
        let k2 = key_of(&b, "api", [("user", &long[1..])], 0, &p);
        assert!(k1.as_str().len() <= MAX_KEY, "{}", k1.as_str().len());
        assert!(k1.as_str().starts_with("prefix:api|user=xxxx"));
        assert!(k1.as_str().ends_with("|0.2.3600s"));
        assert!(k1.as_str().contains("|~"));
        assert_ne!(k1, k2);
        let domain = "d".repeat(1000);
        let k3 = key_of(&b, &domain, [("a", "b")], 0, &p);
        let k4 = key_of(&b, &domain[1..], [("a", "b")], 0, &p);
        assert!(k3.as_str().len() <= MAX_KEY);
        assert_ne!(k3, k4);
        let domain_end = k3.as_str().find('|').unwrap();
        assert!(domain_end <= MAX_DOMAIN + "prefix:".len());
    }
}
