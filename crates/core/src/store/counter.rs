//! The identity of one counter: which domain, which descriptor (the entries as they count, a
//! `share_threshold` pattern standing for the values it shares), which limit of the rule, and its
//! algorithm and window. Built once per charge by the engine's plan; every backend derives its
//! key from it, and `/explain` reads the same counter the decisions charge. It borrows the
//! entries where they are (the request, a query, a test's pairs): building one copies nothing.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use crate::clock::Nanos;
use crate::config::Algorithm;
use crate::limiter::LimitParams;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterId<'a> {
    pub domain: &'a str,
    /// (key, value) per descriptor entry, in order, as counted.
    pub entries: Entries<'a>,
    /// The limit's position in the rule's limit list.
    pub slot: usize,
    pub algorithm: Algorithm,
    pub period: Nanos,
}

impl<'a> CounterId<'a> {
    /// The counter of limit `slot` (`params`: its algorithm and window) of a descriptor.
    pub fn new(
        domain: &'a str,
        entries: impl Into<Entries<'a>>,
        slot: usize,
        params: &LimitParams,
    ) -> CounterId<'a> {
        CounterId {
            domain,
            entries: entries.into(),
            slot,
            algorithm: params.algorithm,
            period: params.period,
        }
    }
}

/// A descriptor's entries as a counter counts them, borrowed from wherever they are.
#[derive(Clone, Copy)]
pub struct Entries<'a> {
    source: Source<'a>,
    /// (entry index, pattern): values a `share_threshold` shares, counted as the pattern.
    shared: &'a [(usize, String)],
}

#[derive(Clone, Copy)]
enum Source<'a> {
    Pairs(&'a [(&'a str, &'a str)]),
    Owned(&'a [(String, String)]),
    Request(&'a [Entry]),
}

impl<'a> Entries<'a> {
    /// With the values at these entry indexes counted as these patterns (`share_threshold`).
    pub(crate) fn sharing(self, shared: &'a [(usize, String)]) -> Entries<'a> {
        Entries { shared, ..self }
    }

    /// (key, value) in order, as counted.
    pub(crate) fn iter(&self) -> Iter<'a> {
        Iter {
            entries: *self,
            next: 0,
        }
    }

    /// Calls `f` with each (key, value) in order, as counted: what key derivation uses, with one
    /// branch on where the entries are instead of one per entry.
    pub fn for_each(&self, mut f: impl FnMut(&'a str, &'a str)) {
        if !self.shared.is_empty() {
            self.iter().for_each(|(k, v)| f(k, v));
            return;
        }
        match self.source {
            Source::Pairs(p) => p.iter().for_each(|(k, v)| f(k, v)),
            Source::Owned(p) => p.iter().for_each(|(k, v)| f(k, v)),
            Source::Request(e) => e.iter().for_each(|e| f(&e.key, &e.value)),
        }
    }

    /// Entry `i` as given (before sharing).
    fn raw(&self, i: usize) -> Option<(&'a str, &'a str)> {
        match self.source {
            Source::Pairs(p) => p.get(i).copied(),
            Source::Owned(p) => p.get(i).map(|(k, v)| (k.as_str(), v.as_str())),
            Source::Request(e) => e.get(i).map(|e| (e.key.as_str(), e.value.as_str())),
        }
    }
}

/// The entries of a counter, in order, as counted.
pub(crate) struct Iter<'a> {
    entries: Entries<'a>,
    next: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let i = self.next;
        let (key, value) = self.entries.raw(i)?;
        self.next += 1;
        let value = self
            .entries
            .shared
            .iter()
            .find(|(at, _)| *at == i)
            .map_or(value, |(_, pattern)| pattern.as_str());
        Some((key, value))
    }
}

impl<'a> From<&'a [(&'a str, &'a str)]> for Entries<'a> {
    fn from(pairs: &'a [(&'a str, &'a str)]) -> Self {
        Entries {
            source: Source::Pairs(pairs),
            shared: &[],
        }
    }
}

impl<'a, const N: usize> From<&'a [(&'a str, &'a str); N]> for Entries<'a> {
    fn from(pairs: &'a [(&'a str, &'a str); N]) -> Self {
        Entries::from(&pairs[..])
    }
}

impl<'a> From<&'a [(String, String)]> for Entries<'a> {
    fn from(pairs: &'a [(String, String)]) -> Self {
        Entries {
            source: Source::Owned(pairs),
            shared: &[],
        }
    }
}

impl<'a> From<&'a [Entry]> for Entries<'a> {
    fn from(entries: &'a [Entry]) -> Self {
        Entries {
            source: Source::Request(entries),
            shared: &[],
        }
    }
}

impl PartialEq for Entries<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Entries<'_> {}

impl std::fmt::Debug for Entries<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
