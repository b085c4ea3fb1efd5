//! The `rule` label of a `detailed_metric` series: the request's entries as `key_value` joined by
//! `.` (as the reference names them), bounded in length so request values cannot make `/metrics`
//! arbitrarily large. A label longer than `MAX_LABEL_LEN` bytes keeps a prefix and ends in `~` and
//! 16 hex digits of a hash of the whole label, so distinct values stay distinct series.

use std::hash::Hasher;

use siphasher::sip::SipHasher13;

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

/// The same, from pieces `key` (alone) or `key` and a value (`key_value`).
pub(crate) fn bounded_label<'a>(
    pieces: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> String {
    let mut label = String::new();
    // Fixed keys: a value keeps its label across restarts, so dashboards keep the series.
    let mut hasher = SipHasher13::new();
    let mut full_len = 0;
    let mut push = |piece: &str| {
        hasher.write(piece.as_bytes());
        full_len += piece.len();
        if label.len() <= MAX_LABEL_LEN {
            label.push_str(piece);
        }
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
    if full_len <= MAX_LABEL_LEN {
        return label;
    }
    let mut cut = MAX_LABEL_LEN - HASH_SUFFIX_LEN;
    while !label.is_char_boundary(cut) {
        cut -= 1;
    }
    label.truncate(cut);
    label.push_str(&format!("~{:016x}", hasher.finish()));
    label
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
    fn the_cut_never_splits_a_character() {
        for pad in 0..4 {
            let value = format!("{}{}", "x".repeat(pad), "é".repeat(300));
            let label = detailed_label([("k", value.as_str())]);
            assert!(label.len() <= MAX_LABEL_LEN);
            assert!(label.ends_with(|c: char| c.is_ascii_hexdigit()), "{label}");
        }
    }
}
