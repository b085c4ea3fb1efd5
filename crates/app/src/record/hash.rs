//! `--record-hash-values`: the key (`RECORD_HASH_KEY`, 32 hex digits) and the keyed hash of a
//! descriptor value (SipHash-2-4, 128 bits, written as 32 hex digits).

use std::fmt;
use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher24};

/// A 128-bit SipHash key.
#[derive(Clone, PartialEq, Eq)]
pub struct HashKey([u8; 16]);

impl fmt::Debug for HashKey {
    // The key is a secret: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(..)")
    }
}

impl ratelimit_core::wire::record::HashValue for HashKey {
    fn write_hex(&self, value: &str, out: &mut Vec<u8>) {
        HashKey::write_hex(self, value, out);
    }
}

impl HashKey {
    /// Exactly 32 hex digits (16 bytes); anything shorter, longer or not hex is refused.
    pub fn parse(text: &str) -> Result<HashKey, String> {
        let text = text.trim();
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "must be 32 hex digits (a 128-bit key, e.g. from `openssl rand -hex 16`), not {} characters{}",
                text.len(),
                if text.bytes().all(|b| b.is_ascii_hexdigit()) {
                    ""
                } else {
                    " with non-hex ones"
                }
            ));
        }
        let mut key = [0u8; 16];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|e| format!("not hex: {e}"))?;
        }
        Ok(HashKey(key))
    }

    /// The keyed hash of `value`, as 32 lowercase hex digits.
    pub fn hash_hex(&self, value: &str) -> String {
        let mut out = Vec::with_capacity(32);
        self.write_hex(value, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Appends the keyed hash of `value` to `out`, as 32 lowercase hex digits.
    pub fn write_hex(&self, value: &str, out: &mut Vec<u8>) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut h = SipHasher24::new_with_key(&self.0);
        h.write(value.as_bytes());
        let hash = h.finish128().as_u128();
        out.extend(
            (0..32)
                .rev()
                .map(|i| HEX[((hash >> (4 * i)) & 0xf) as usize]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_be_32_hex_digits() {
        assert!(HashKey::parse(&"0f".repeat(16)).is_ok());
        assert!(HashKey::parse(&format!(" {} ", "0F".repeat(16))).is_ok());
        for bad in [
            "",
            "abc",
            &"0f".repeat(15),
            &"0f".repeat(17),
            &"zz".repeat(16),
        ] {
            let error = HashKey::parse(bad).unwrap_err();
            assert!(error.contains("32 hex digits"), "{bad}: {error}");
        }
        assert_eq!(
            format!("{:?}", HashKey::parse(&"0f".repeat(16))),
            "Ok(HashKey(..))"
        );
    }

    #[test]
    fn hashes_are_keyed_stable_and_32_hex_digits() {
        let a = HashKey::parse(&"01".repeat(16)).unwrap();
        let b = HashKey::parse(&"02".repeat(16)).unwrap();
        let h = a.hash_hex("10.0.0.7");
        assert_eq!(h.len(), 32);
        assert!(
            h.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(h, a.hash_hex("10.0.0.7"));
        // The hex digits are the hash's, most significant first, as `{:032x}` writes them.
        let mut direct = SipHasher24::new_with_key(&a.0);
        direct.write(b"10.0.0.7");
        assert_eq!(h, format!("{:032x}", direct.finish128().as_u128()));
        assert_ne!(h, a.hash_hex("10.0.0.8"));
        assert_ne!(h, b.hash_hex("10.0.0.7"));
    }
}
