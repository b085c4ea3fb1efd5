//! The memory backend's keys: a keyed 128-bit SipHash of a counter's identity (domain, descriptor
//! entries, which limit, algorithm, window), so a key is 16 bytes whatever the descriptor's size,
//! building one allocates nothing, and nobody can craft collisions without the per-process secret.
//! (At 128 bits, a collision among 10⁹ live keys has a probability below 10⁻²⁰.)

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::store::CounterId;

/// The identity of one counter / bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreKey(pub u128);

/// Builds keys with one secret.
#[derive(Debug, Clone, Copy)]
pub struct KeyBuilder {
    k0: u64,
    k1: u64,
}

impl KeyBuilder {
    pub fn new(k0: u64, k1: u64) -> Self {
        KeyBuilder { k0, k1 }
    }

    /// A builder with a random secret.
    pub(crate) fn random() -> Self {
        use std::hash::{BuildHasher, RandomState};
        let seed = RandomState::new();
        KeyBuilder::new(seed.hash_one(0u8), seed.hash_one(1u8))
    }

    /// The key of a counter.
    pub fn key(&self, id: &CounterId<'_>) -> StoreKey {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        write_str(&mut h, id.domain);
        id.entries.for_each(|key, value| {
            write_str(&mut h, key);
            write_str(&mut h, value);
        });
        h.write_u64(id.slot as u64);
        h.write_u8(id.algorithm as u8);
        h.write_u64(id.period);
        StoreKey(h.finish128().as_u128())
    }
}

impl KeyBuilder {
    /// A keyed 128-bit digest of `text` (a concurrency lease's request id).
    pub(crate) fn digest(&self, text: &str) -> u128 {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        write_str(&mut h, text);
        h.finish128().as_u128()
    }
}

/// Length-prefixed, so ("ab","c") and ("a","bc") never collide as they do in the reference's
/// `key_value` joining.
fn write_str(h: &mut SipHasher13, s: &str) {
    h.write_u64(s.len() as u64);
    h.write(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitParams;

    /// The key of limit `slot` of a descriptor.
    fn key_of<'e>(
        b: &KeyBuilder,
        domain: &'e str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        slot: usize,
        params: &LimitParams,
    ) -> StoreKey {
        let entries: Vec<(&str, &str)> = entries.into_iter().collect();
        b.key(&CounterId::new(domain, &entries[..], slot, params))
    }
    use crate::config::Algorithm;

    fn params(algorithm: Algorithm, period: u64, rpu: u32) -> LimitParams {
        LimitParams {
            algorithm,
            requests_per_unit: rpu,
            period,
            burst: rpu,
            max_delay: 0,
            charge_denied: false,
        }
    }

    #[test]
    fn keys_separate_what_must_be_separate() {
        let b = KeyBuilder::new(1, 2);
        let p = params(Algorithm::TokenBucket, 60, 10);
        let base = key_of(&b, "d", [("a", "b_c")], 0, &p);
        assert_ne!(base, key_of(&b, "d", [("a_b", "c")], 0, &p));
        assert_ne!(base, key_of(&b, "e", [("a", "b_c")], 0, &p));
        assert_ne!(base, key_of(&b, "d", [("a", "b_c")], 1, &p));
        assert_ne!(
            base,
            key_of(
                &b,
                "d",
                [("a", "b_c")],
                0,
                &params(Algorithm::FixedWindow, 60, 10)
            )
        );
        assert_ne!(
            base,
            key_of(
                &b,
                "d",
                [("a", "b_c")],
                0,
                &params(Algorithm::TokenBucket, 1, 10)
            )
        );
        assert_ne!(
            base,
            key_of(&KeyBuilder::new(3, 4), "d", [("a", "b_c")], 0, &p)
        );
    }

    #[test]
    fn a_changed_limit_value_keeps_the_key() {
        let b = KeyBuilder::new(1, 2);
        let old = key_of(
            &b,
            "d",
            [("k", "v")],
            0,
            &params(Algorithm::TokenBucket, 60, 10),
        );
        let new = key_of(
            &b,
            "d",
            [("k", "v")],
            0,
            &params(Algorithm::TokenBucket, 60, 99),
        );
        assert_eq!(old, new);
    }
}
