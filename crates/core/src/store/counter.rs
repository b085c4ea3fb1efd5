//! The identity of one counter: which domain, which descriptor (the entries as they count, a
//! `share_threshold` pattern standing for the values it shares), which limit of the rule, and its
//! algorithm and window. Built once per charge by the engine's plan; every backend derives its
//! key from it, and `/explain` reads the same counter the decisions charge.

use smallvec::SmallVec;

use crate::clock::Nanos;
use crate::config::Algorithm;
use crate::limiter::LimitParams;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterId<'a> {
    pub domain: &'a str,
    /// (key, value) per descriptor entry, in order, as counted.
    pub entries: SmallVec<[(&'a str, &'a str); 4]>,
    /// The limit's position in the rule's limit list.
    pub slot: usize,
    pub algorithm: Algorithm,
    pub period: Nanos,
}

impl<'a> CounterId<'a> {
    /// The counter of limit `slot` (`params`: its algorithm and window) of a descriptor.
    pub fn new(
        domain: &'a str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
        slot: usize,
        params: &LimitParams,
    ) -> CounterId<'a> {
        CounterId {
            domain,
            entries: entries.into_iter().collect(),
            slot,
            algorithm: params.algorithm,
            period: params.period,
        }
    }
}
