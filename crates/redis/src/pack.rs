//! Which waiting compare-and-sets share a script call: consecutive ones, in the order they came,
//! up to [`MAX_GROUPS`] compare-and-sets and [`MAX_KEYS`] keys per call (one with more keys than
//! that goes alone). Bounded so that one script call holds Redis briefly. Pure: sizes in, ranges
//! out.

use std::ops::Range;

/// Most compare-and-sets in one script call.
pub(crate) const MAX_GROUPS: usize = 32;
/// Most keys in one script call (a compare-and-set with more goes alone).
pub(crate) const MAX_KEYS: usize = 256;

/// The script calls for compare-and-sets of `sizes` keys each, in order: each a range of them.
pub(crate) fn calls(sizes: impl IntoIterator<Item = usize>) -> Vec<Range<usize>> {
    let mut calls = Vec::new();
    let (mut start, mut end, mut keys) = (0, 0, 0);
    for size in sizes {
        let groups = end - start;
        if groups > 0 && (groups == MAX_GROUPS || keys + size > MAX_KEYS) {
            calls.push(start..end);
            (start, keys) = (end, 0);
        }
        keys += size;
        end += 1;
    }
    if end > start {
        calls.push(start..end);
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One call of these compare-and-sets.
    fn one(call: Range<usize>) -> Vec<Range<usize>> {
        vec![call]
    }

    #[test]
    fn compare_and_sets_share_calls_in_order_within_the_bounds() {
        assert!(calls([]).is_empty());
        assert_eq!(calls([1]), one(0..1));
        assert_eq!(calls([1, 2, 1]), one(0..3));
        // MAX_GROUPS per call.
        let many = calls(std::iter::repeat_n(1, MAX_GROUPS * 2 + 1));
        assert_eq!(
            many,
            [
                0..MAX_GROUPS,
                MAX_GROUPS..2 * MAX_GROUPS,
                2 * MAX_GROUPS..2 * MAX_GROUPS + 1
            ]
        );
        // MAX_KEYS per call: the one that would pass it starts the next.
        assert_eq!(calls([MAX_KEYS - 1, 1, 1]), [0..2, 2..3]);
        assert_eq!(calls([MAX_KEYS - 1, 2]), [0..1, 1..2]);
    }

    #[test]
    fn a_compare_and_set_over_the_key_bound_goes_alone() {
        assert_eq!(calls([1, MAX_KEYS + 5, 1]), [0..1, 1..2, 2..3]);
        assert_eq!(calls([MAX_KEYS + 5]), one(0..1));
    }

    #[test]
    fn every_compare_and_set_is_in_exactly_one_call() {
        for n in 0..100 {
            let sizes: Vec<usize> = (0..n).map(|i| (i * 37) % 70).collect();
            let ranges = calls(sizes.iter().copied());
            let mut next = 0;
            for r in &ranges {
                assert_eq!(r.start, next);
                assert!(r.end > r.start);
                let keys: usize = sizes[r.clone()].iter().sum();
                assert!(r.len() <= MAX_GROUPS);
                assert!(keys <= MAX_KEYS || r.len() == 1);
                next = r.end;
            }
            assert_eq!(next, n);
        }
    }
}
