//! The `rule` label of a `detailed_metric` series: the request's entries as `key_value` joined by
//! `.`, sanitized as the reference sanitizes a stats key (`:`, `|` and the dots of IPv4 addresses
//! made `_`, see [`super::stat_name`]), bounded in length so request values cannot make
//! `/metrics` arbitrarily large. A label longer than `MAX_LABEL_LEN` bytes keeps a prefix and ends
//! in `~` and 16 hex digits of a hash of the whole (sanitized) label, so distinct labels stay
//! distinct series.

use std::hash::Hasher;

use siphasher::sip::SipHasher13;

use super::stat_name::Sanitizer;

/// The longest `rule` label a detailed series gets, in bytes.
pub(crate) const MAX_LABEL_LEN: usize = 256;
/// `~` and 16 hex digits.
const HASH_SUFFIX_LEN: usize = 17;

/// The bounded label of a descriptor's `(key, value)` entries. Reads every byte (for the hash) but
/// copies at most about `MAX_LABEL_LEN` of them.
#[cfg(test)]
pub(crate) fn detailed_label<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    bounded_label(entries.into_iter().map(|(k, v)| (k, Some(v))))
}

/// The same, from pieces `key` (alone) or `key` and a value (`key_value`): a stat name's part,
/// sanitized as the reference's.
pub(crate) fn bounded_label<'a>(
    pieces: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> String {
    bounded(pieces, Some(Sanitizer::default()))
}

/// The same, not sanitized: client text shown in a log as it came, bounded.
pub(crate) fn bounded_text<'a>(
    pieces: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> String {
    bounded(pieces, None)
}

fn bounded<'a>(
    pieces: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    mut sanitizer: Option<Sanitizer>,
) -> String {
    let mut label: Vec<u8> = Vec::new();
    // Fixed keys: a value keeps its label across restarts, so dashboards keep the series. The
    // hash is of the sanitized text, not the raw one: the reference counts values that sanitize
    // alike (`a:b`, `a|b`) as one stat, so they are one series here, short (equal labels) or
    // long (equal prefixes and hashes), where a hash of the raw text would make two series of
    // one stat; labels that differ still differ in their hash. A long label that sanitizing
    // leaves as it was keeps the hash it had before (the same bytes are hashed).
    let mut hasher = SipHasher13::new();
    let mut full_len = 0;
    let mut out = |bytes: &[u8]| {
        hasher.write(bytes);
        full_len += bytes.len();
        let room = (MAX_LABEL_LEN + 1).saturating_sub(label.len());
        label.extend_from_slice(&bytes[..bytes.len().min(room)]);
    };
    let mut push = |piece: &str| match &mut sanitizer {
        Some(sanitizer) => sanitizer.push(piece.as_bytes(), &mut out),
        None => out(piece.as_bytes()),
    };
    for (index, (key, value)) in pieces.into_iter().enumerate() {
        if index > 0 {
            push(".");
        }
        push(key);
        if let Some(value) = value {
            push("_");
            push(value);
        }
    }
    if let Some(sanitizer) = &mut sanitizer {
        sanitizer.finish(&mut out);
    }
    if full_len > MAX_LABEL_LEN {
        // Cut at a character's first byte (UTF-8 continuation bytes are 0b10xx_xxxx).
        let mut cut = MAX_LABEL_LEN - HASH_SUFFIX_LEN;
        while label[cut] & 0xc0 == 0x80 {
            cut -= 1;
        }
        label.truncate(cut);
        label.extend_from_slice(format!("~{:016x}", hasher.finish()).as_bytes());
    }
    // UTF-8 pieces, ASCII bytes replaced by ASCII bytes, cut at a character boundary.
    String::from_utf8(label).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_labels_are_the_entries_as_the_reference_names_them() {
        assert_eq!(
            detailed_label([("tenant", "a"), ("path", "/x")]),
            "tenant_a.path_/x"
        );
        let exactly = "v".repeat(MAX_LABEL_LEN - 2);
        assert_eq!(
            detailed_label([("k", exactly.as_str())]).len(),
            MAX_LABEL_LEN
        );
    }

    #[test]
    fn long_labels_are_bounded_and_distinct_values_stay_distinct() {
        let a = format!("{}a", "x".repeat(4095));
        let b = format!("{}b", "x".repeat(4095));
        let (la, lb) = (
            detailed_label([("k", a.as_str())]),
            detailed_label([("k", b.as_str())]),
        );
        assert!(
            la.len() <= MAX_LABEL_LEN && lb.len() <= MAX_LABEL_LEN,
            "{la}"
        );
        assert!(la.starts_with("k_xxx"), "{la}");
        assert_ne!(la, lb, "same prefix, different values");
        assert_eq!(la, detailed_label([("k", a.as_str())]), "stable");
        // Many entries: still bounded, and the split into entries counts.
        let many: Vec<(&str, &str)> = (0..32).map(|_| ("key", a.as_str())).collect();
        assert!(detailed_label(many).len() <= MAX_LABEL_LEN);
        assert_ne!(
            detailed_label([("k", a.as_str()), ("k", b.as_str())]),
            detailed_label([("k", b.as_str()), ("k", a.as_str())])
        );
    }

    #[test]
    fn labels_are_sanitized_as_the_reference_sanitizes_stats_keys() {
        assert_eq!(
            detailed_label([("remote_address", "10.0.0.1")]),
            "remote_address_10_0_0_1"
        );
        assert_eq!(
            detailed_label([("remote_address", "2001:db8::1")]),
            "remote_address_2001_db8__1"
        );
        assert_eq!(
            detailed_label([("host", "api.example.com")]),
            "host_api.example.com"
        );
        // The whole key is sanitized, not each entry: an address may run across entries.
        assert_eq!(detailed_label([("k", "1.2"), ("3.4", "x")]), "k_1_2_3_4_x");
        assert_eq!(bounded_label([("a:b", None)]), "a_b");
        // For logs: as it came.
        assert_eq!(bounded_text([("a:b", Some("10.0.0.1"))]), "a:b_10.0.0.1");
    }

    #[test]
    fn values_that_sanitize_alike_get_one_label_long_or_not() {
        assert_eq!(
            detailed_label([("k", "a:b")]),
            detailed_label([("k", "a|b")])
        );
        let (a, b) = (
            format!("{}a:b", "x".repeat(4095)),
            format!("{}a|b", "x".repeat(4095)),
        );
        let la = detailed_label([("k", a.as_str())]);
        assert_eq!(
            la,
            detailed_label([("k", b.as_str())]),
            "the hash is of the sanitized text"
        );
        assert_ne!(la, detailed_label([("k", "x".repeat(4096).as_str())]));
    }

    #[test]
    fn a_long_label_that_needs_no_sanitizing_keeps_its_hash() {
        // The hash of the text as one piece: what the label was before sanitizing came in.
        let value = "v".repeat(1000);
        let mut hasher = SipHasher13::new();
        hasher.write(format!("k_{value}").as_bytes());
        assert!(
            detailed_label([("k", value.as_str())])
                .ends_with(&format!("~{:016x}", hasher.finish()))
        );
    }

    #[test]
    fn the_cut_never_splits_a_character() {
        for pad in 0..4 {
            let value = format!("{}{}", "x".repeat(pad), "é".repeat(300));
            let label = detailed_label([("k", value.as_str())]);
            assert!(label.len() <= MAX_LABEL_LEN);
            assert!(label.ends_with(|c: char| c.is_ascii_hexdigit()), "{label}");
        }
    }
}
