//! When each RLQS bucket next needs a tick: a min-heap of deadlines, so that a tick visits only
//! the buckets that are due (an idle stream to abandon, a closed stream's TTL passing, a share
//! the ledger could not cover yet) instead of every bucket every second. Pure: `now` is passed in.
//!
//! One deadline per key. Scheduling a key that already has an earlier (or equal) deadline keeps
//! the earlier one: the visit then finds nothing to do and schedules the real one, so a bucket
//! reported every 5 s costs one heap entry, not one per report. A later deadline replaces an
//! earlier one only through [`Deadlines::remove`]; entries left behind in the heap by a removal or
//! an earlier deadline are skipped when they come up, and the heap is rebuilt when they outnumber
//! the live ones.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;

use crate::clock::Nanos;

/// Heap entries below which stale ones are not worth a rebuild.
const REBUILD_FLOOR: usize = 1024;

struct Entry<K> {
    at: Nanos,
    key: K,
}

impl<K> PartialEq for Entry<K> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl<K> Eq for Entry<K> {}
impl<K> PartialOrd for Entry<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Entry<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.cmp(&other.at)
    }
}

/// The next deadline of each key.
pub struct Deadlines<K> {
    heap: BinaryHeap<Reverse<Entry<K>>>,
    next: HashMap<K, Nanos>,
}

impl<K> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines {
            heap: BinaryHeap::new(),
            next: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> Deadlines<K> {
    pub fn new() -> Deadlines<K> {
        Deadlines::default()
    }

    #[cfg(test)]
    /// Keys with a deadline.
    pub(crate) fn len(&self) -> usize {
        self.next.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.next.is_empty()
    }

    #[cfg(test)]
    /// `key`'s deadline, if it has one.
    pub(crate) fn get(&self, key: &K) -> Option<Nanos> {
        self.next.get(key).copied()
    }

    /// `key` is due at `at`, unless it already is at or before then.
    pub fn schedule(&mut self, key: K, at: Nanos) {
        if self.next.get(&key).is_some_and(|&current| current <= at) {
            return;
        }
        self.next.insert(key.clone(), at);
        self.heap.push(Reverse(Entry { at, key }));
        self.compact();
    }

    /// `key` has no deadline any more.
    pub fn remove(&mut self, key: &K) {
        self.next.remove(key);
    }

    /// Every key due at `now` (deadline at or before it), earliest first; their deadlines are
    /// taken off, so each must be scheduled again if it still needs a visit.
    pub fn due(&mut self, now: Nanos) -> Vec<K> {
        let mut due = Vec::new();
        while self.heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
            let Some(Reverse(entry)) = self.heap.pop() else {
                break;
            };
            if self.next.get(&entry.key) == Some(&entry.at) {
                self.next.remove(&entry.key);
                due.push(entry.key);
            }
        }
        due
    }

    /// Drops the stale entries once they outnumber the live ones.
    fn compact(&mut self) {
        if self.heap.len() <= REBUILD_FLOOR.max(2 * self.next.len()) {
            return;
        }
        self.heap = self
            .next
            .iter()
            .map(|(key, &at)| {
                Reverse(Entry {
                    at,
                    key: key.clone(),
                })
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_due_in_order_once() {
        let mut d = Deadlines::new();
        d.schedule("b", 20);
        d.schedule("a", 10);
        d.schedule("c", 30);
        assert!(d.due(9).is_empty());
        assert_eq!(d.due(20), vec!["a", "b"]);
        assert_eq!(d.due(20), Vec::<&str>::new());
        assert_eq!(d.len(), 1);
        assert_eq!(d.due(100), vec!["c"]);
        assert!(d.is_empty());
    }

    #[test]
    fn an_earlier_deadline_wins_and_a_later_one_waits_for_the_visit() {
        let mut d = Deadlines::new();
        d.schedule("a", 50);
        d.schedule("a", 10);
        assert_eq!(d.get(&"a"), Some(10));
        d.schedule("a", 70);
        assert_eq!(d.get(&"a"), Some(10));
        assert_eq!(d.due(10), vec!["a"]);
        // The stale entry at 50 is skipped.
        assert!(d.due(60).is_empty());
    }

    #[test]
    fn a_removed_key_never_comes_due_even_when_added_again() {
        let mut d = Deadlines::new();
        d.schedule("a", 10);
        d.remove(&"a");
        assert!(d.due(10).is_empty());
        d.schedule("a", 10);
        d.schedule("b", 10);
        d.remove(&"b");
        d.schedule("b", 20);
        assert_eq!(d.due(10), vec!["a"]);
        assert_eq!(d.due(20), vec!["b"]);
    }

    #[test]
    fn stale_entries_are_dropped_when_they_outnumber_the_live_ones() {
        let mut d = Deadlines::new();
        for i in 0..10_000u64 {
            d.schedule(1u64, 1_000_000 - i);
        }
        assert!(d.heap.len() <= 2 * REBUILD_FLOOR);
        assert_eq!(d.due(u64::MAX), vec![1]);
    }
}
