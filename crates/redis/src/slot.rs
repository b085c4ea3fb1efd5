//! Redis Cluster's slot of a key: CRC16 (XMODEM) of the key, or of its hash tag (the text between
//! the first `{` and the next `}`, when not empty), modulo 16384.

/// Slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// The part of `key` that decides its slot.
fn hashed_part(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(0) | None => key,
        Some(len) => &key[open + 1..open + 1 + len],
    }
}

/// The cluster slot of `key`.
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hashed_part(key)) % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty tag, or an unclosed one, hashes the whole key.
        assert_eq!(
            slot(b"foo{}{bar}"),
            crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % SLOTS
        );
        assert_eq!(
            slot(b"foo{bar"),
            crc16::State::<crc16::XMODEM>::calculate(b"foo{bar") % SLOTS
        );
    }
}
