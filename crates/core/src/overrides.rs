//! Limits set at run time for one descriptor (the admin port's quota API): an [`Override`] says
//! "this domain's descriptor, exactly these entries, gets this limit until then", on top of the
//! rules and kept across their reloads. [`Overrides`] is one immutable set of them, as the engine
//! holds it beside the live rules (swapped whole, like them); a decision looks a descriptor up
//! only when the set is not empty. Pure: time comes in as `now`, nothing here stores or syncs
//! (the app keeps the set in the process, or in Redis for every instance).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

use crate::clock::{NANOS_PER_SECOND, Nanos};
use crate::config::Unit;

/// The most entries an override's descriptor may have (a rules file nests at most this deep).
pub const MAX_OVERRIDE_ENTRIES: usize = 32;

/// The longest an override may last: a year (a longer one is a rules change).
pub const MAX_OVERRIDE_TTL_SECONDS: u64 = 366 * 86_400;

/// One override: the limit a descriptor gets until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Override {
    pub domain: String,
    /// The descriptor's entries, in order; a request's descriptor must have exactly these.
    pub entries: Vec<(String, String)>,
    pub unit: OverrideUnit,
    pub requests_per_unit: u32,
    /// When it stops applying (ns since the Unix epoch, on the clock of the instance that set it).
    pub expires_at: Nanos,
}

/// A unit as an override names it (the rules' units, by their names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverrideUnit(pub Unit);

impl serde::Serialize for OverrideUnit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name())
    }
}

impl<'de> serde::Deserialize<'de> for OverrideUnit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        parse_unit(&name).map_err(serde::de::Error::custom)
    }
}

/// A unit name (`second` … `year`, any case).
pub fn parse_unit(name: &str) -> Result<OverrideUnit, String> {
    Unit::parse(name).map(OverrideUnit).ok_or_else(|| {
        format!(
            "unknown unit '{name}' (expected one of: {})",
            Unit::ALL.map(Unit::name).join(", ")
        )
    })
}

impl Override {
    /// Whether it still applies at `now`.
    pub fn is_live(&self, now: Nanos) -> bool {
        now < self.expires_at
    }

    /// The window in ns (one unit).
    pub fn period(&self) -> Nanos {
        self.unit.0.seconds() * NANOS_PER_SECOND
    }

    /// Whole seconds left at `now`, rounded up (0 once expired).
    pub fn seconds_left(&self, now: Nanos) -> u64 {
        self.expires_at
            .saturating_sub(now)
            .div_ceil(NANOS_PER_SECOND)
    }

    /// The descriptor as `/explain` writes it: `k=v,k2=v2`.
    pub fn descriptor(&self) -> String {
        describe(&self.entries)
    }
}

/// Entries written as `k=v,k2=v2`.
pub fn describe(entries: &[(String, String)]) -> String {
    let parts: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join(",")
}

/// Checks what a client asks to set: a descriptor (1 to [`MAX_OVERRIDE_ENTRIES`] entries, keys
/// not empty, each string at most `max_len` bytes) and a TTL of 1 s to
/// [`MAX_OVERRIDE_TTL_SECONDS`]. The message says what is wrong.
pub fn check(
    domain: &str,
    entries: &[(String, String)],
    ttl_seconds: Option<u64>,
    max_len: usize,
) -> Result<(), String> {
    if domain.is_empty() {
        return Err("'domain' must not be empty".into());
    }
    if domain.len() > max_len {
        return Err(format!("'domain' is longer than {max_len} bytes"));
    }
    if entries.is_empty() {
        return Err("'entries' must hold at least one {\"key\", \"value\"}".into());
    }
    if entries.len() > MAX_OVERRIDE_ENTRIES {
        return Err(format!(
            "'entries' holds {} entries; at most {MAX_OVERRIDE_ENTRIES}",
            entries.len()
        ));
    }
    for (i, (k, v)) in entries.iter().enumerate() {
        if k.is_empty() {
            return Err(format!("entries[{i}].key must not be empty"));
        }
        if k.len() > max_len || v.len() > max_len {
            return Err(format!("entries[{i}] is longer than {max_len} bytes"));
        }
    }
    if let Some(ttl) = ttl_seconds
        && !(1..=MAX_OVERRIDE_TTL_SECONDS).contains(&ttl)
    {
        return Err(format!(
            "'ttl_seconds' must be 1 to {MAX_OVERRIDE_TTL_SECONDS}, found {ttl}"
        ));
    }
    Ok(())
}

/// Overrides by descriptor: one immutable set (build a new one to change it).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// By the hash of (domain, entries); a bucket holds the rare collisions.
    by_hash: HashMap<u64, Vec<Override>, foldhash::fast::FixedState>,
    len: usize,
}

/// The hash a descriptor is found by, from its parts as a request carries them (nothing
/// allocated).
fn hash_of<'e>(domain: &str, entries: impl IntoIterator<Item = (&'e str, &'e str)>) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(0x6f76_6572_7269_6465).build_hasher();
    domain.hash(&mut h);
    for (k, v) in entries {
        k.hash(&mut h);
        v.hash(&mut h);
    }
    h.finish()
}

impl Overrides {
    /// The set of `overrides` (a later one for the same descriptor wins).
    pub fn new(overrides: impl IntoIterator<Item = Override>) -> Overrides {
        let mut set = Overrides::default();
        for o in overrides {
            set.insert(o);
        }
        set
    }

    fn insert(&mut self, o: Override) {
        let hash = hash_of(
            &o.domain,
            o.entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
        let bucket = self.by_hash.entry(hash).or_default();
        match bucket
            .iter_mut()
            .find(|e| e.domain == o.domain && e.entries == o.entries)
        {
            Some(existing) => *existing = o,
            None => {
                bucket.push(o);
                self.len += 1;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The override of a descriptor that applies at `now`, if any.
    pub fn find<'e, I>(&self, domain: &str, entries: I, now: Nanos) -> Option<&Override>
    where
        I: IntoIterator<Item = (&'e str, &'e str)> + Clone,
    {
        let bucket = self.by_hash.get(&hash_of(domain, entries.clone()))?;
        bucket.iter().find(|o| {
            o.is_live(now) && o.domain == domain && {
                let mut given = entries.clone().into_iter();
                o.entries
                    .iter()
                    .all(|(k, v)| given.next().is_some_and(|(gk, gv)| gk == k && gv == v))
                    && given.next().is_none()
            }
        })
    }

    /// Whether the set holds an override (live or not) for exactly this descriptor.
    pub fn holds(&self, domain: &str, entries: &[(String, String)]) -> bool {
        let hash = hash_of(
            domain,
            entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
        self.by_hash.get(&hash).is_some_and(|bucket| {
            bucket
                .iter()
                .any(|o| o.domain == domain && o.entries == entries)
        })
    }

    /// This set with `o` added (replacing the descriptor's earlier one).
    pub fn with(&self, o: Override) -> Overrides {
        let mut set = self.clone();
        set.insert(o);
        set
    }

    /// This set without the descriptor's override; `None` when it had none.
    pub fn without(&self, domain: &str, entries: &[(String, String)]) -> Option<Overrides> {
        let kept: Vec<Override> = self
            .iter()
            .filter(|o| !(o.domain == domain && o.entries == entries))
            .cloned()
            .collect();
        (kept.len() < self.len).then(|| Overrides::new(kept))
    }

    /// This set without what has expired at `now`; `None` when nothing has (found without a copy:
    /// it is asked at every tick of the overrides' upkeep).
    pub fn without_expired(&self, now: Nanos) -> Option<Overrides> {
        if self.iter().all(|o| o.is_live(now)) {
            return None;
        }
        let kept: Vec<Override> = self.iter().filter(|o| o.is_live(now)).cloned().collect();
        (kept.len() < self.len).then(|| Overrides::new(kept))
    }

    /// Every override (live or not), in no set order.
    pub fn iter(&self) -> impl Iterator<Item = &Override> {
        self.by_hash.values().flatten()
    }

    /// The overrides of `domain` (every domain with `None`) live at `now`, by domain then
    /// descriptor.
    pub fn listed(&self, domain: Option<&str>, now: Nanos) -> Vec<&Override> {
        let mut list: Vec<&Override> = self
            .iter()
            .filter(|o| o.is_live(now) && domain.is_none_or(|d| o.domain == d))
            .collect();
        list.sort_by(|a, b| (&a.domain, &a.entries).cmp(&(&b.domain, &b.entries)));
        list
    }
}

/// Two sets are equal when they hold the same overrides.
impl PartialEq for Overrides {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.listed(None, 0) == other.listed(None, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(domain: &str, entries: &[(&str, &str)], rpu: u32, expires_at: Nanos) -> Override {
        Override {
            domain: domain.into(),
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            unit: OverrideUnit(Unit::Minute),
            requests_per_unit: rpu,
            expires_at,
        }
    }

    #[test]
    fn a_descriptor_finds_its_own_override_only_while_it_lives() {
        let set = Overrides::new([
            o("d", &[("tenant", "a")], 5, 100),
            o("d", &[("tenant", "a"), ("user", "u")], 6, 100),
            o("e", &[("tenant", "a")], 7, 100),
        ]);
        assert_eq!(set.len(), 3);
        let find = |d: &str, e: &[(&'static str, &'static str)], now| {
            set.find(d, e.iter().copied(), now)
                .map(|o| o.requests_per_unit)
        };
        assert_eq!(find("d", &[("tenant", "a")], 99), Some(5));
        assert_eq!(find("d", &[("tenant", "a"), ("user", "u")], 0), Some(6));
        assert_eq!(find("e", &[("tenant", "a")], 0), Some(7));
        assert_eq!(find("d", &[("tenant", "b")], 0), None);
        assert_eq!(find("d", &[("user", "u"), ("tenant", "a")], 0), None);
        assert_eq!(find("d", &[("tenant", "a")], 100), None, "expired");
    }

    #[test]
    fn setting_again_replaces_and_removing_says_whether_there_was_one() {
        let set = Overrides::new([o("d", &[("k", "v")], 5, 100)]);
        let set = set.with(o("d", &[("k", "v")], 9, 200));
        assert_eq!(set.len(), 1);
        assert_eq!(
            set.find("d", [("k", "v")], 150)
                .map(|o| o.requests_per_unit),
            Some(9)
        );
        let entries = vec![("k".to_owned(), "v".to_owned())];
        let empty = set.without("d", &entries).expect("there was one");
        assert!(empty.is_empty());
        assert!(empty.without("d", &entries).is_none());
    }

    #[test]
    fn expired_overrides_are_dropped_and_lists_are_ordered() {
        let set = Overrides::new([
            o("d", &[("k", "b")], 1, 50),
            o("d", &[("k", "a")], 2, 100),
            o("c", &[("k", "z")], 3, 100),
        ]);
        let listed: Vec<u32> = set
            .listed(None, 0)
            .iter()
            .map(|o| o.requests_per_unit)
            .collect();
        assert_eq!(listed, [3, 2, 1]);
        assert_eq!(set.listed(Some("d"), 60).len(), 1);
        let kept = set.without_expired(60).expect("one expired");
        assert_eq!(kept.len(), 2);
        assert!(kept.without_expired(60).is_none());
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let e = |k: &str| vec![(k.to_owned(), "v".to_owned())];
        assert!(check("d", &e("k"), Some(60), 10).is_ok());
        assert!(
            check("", &e("k"), Some(60), 10)
                .unwrap_err()
                .contains("domain")
        );
        assert!(
            check("d", &[], Some(60), 10)
                .unwrap_err()
                .contains("entries")
        );
        assert!(
            check("d", &e(""), Some(60), 10)
                .unwrap_err()
                .contains("key")
        );
        assert!(
            check("d", &e("k"), Some(0), 10)
                .unwrap_err()
                .contains("ttl")
        );
        assert!(check("d", &e("k"), Some(u64::MAX), 10).is_err());
        assert!(check("d", &e("a-very-long-key"), None, 10).is_err());
        assert!(parse_unit("MINUTE").is_ok());
        assert!(parse_unit("fortnight").unwrap_err().contains("fortnight"));
    }
}
