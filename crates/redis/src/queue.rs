//! One Redis decision in flight per key and instance: requests whose keys are in a call wait, in
//! arrival order per key, and go together in the next call (a batch). Pure bookkeeping, no I/O,
//! no clock: the store sends the calls and reports when one is done.
//!
//! A request may start when each of its keys is idle and it is first in each key's queue; a batch
//! grows from its first request by taking, key by key, the next waiting request that is first in
//! every one of its own keys' queues (so no request overtakes an earlier one on any key) and shares
//! the batch's group. A request of no group (its keys span Redis Cluster slots) always goes alone.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use smallvec::SmallVec;

/// Most requests decided in one call.
pub(crate) const MAX_BATCH_REQUESTS: usize = 512;
/// Most distinct keys in one call.
pub(crate) const MAX_BATCH_KEYS: usize = 64;

/// Which requests may share a call: those of one group (on a cluster, one slot). `None`: only
/// alone.
pub(crate) type Group = Option<u16>;

/// A request's place: a ticket to cancel it by while it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Ticket(u64);

/// Requests to decide in one call, in arrival order, and the keys they hold busy.
#[derive(Debug)]
pub(crate) struct Batch<K, P> {
    pub(crate) requests: Vec<P>,
    pub(crate) keys: Vec<K>,
}

/// What became of an arriving request.
#[derive(Debug)]
pub(crate) enum Arrival<K, P> {
    /// Its keys were idle: it starts now, alone (its keys are now busy).
    Start(Batch<K, P>),
    /// It waits for a call on one of its keys to finish.
    Queued(Ticket),
}

#[derive(Debug, Default)]
struct Lane {
    /// A call holding this key is in flight.
    busy: bool,
    /// Waiting requests holding this key, oldest first.
    queue: VecDeque<Ticket>,
}

#[derive(Debug)]
struct Waiting<K, P> {
    keys: SmallVec<[K; 4]>,
    group: Group,
    request: P,
}

/// The keys in flight and the requests waiting for them.
#[derive(Debug)]
pub(crate) struct Queues<K, P> {
    lanes: HashMap<K, Lane, foldhash::fast::RandomState>,
    waiting: HashMap<Ticket, Waiting<K, P>, foldhash::fast::RandomState>,
    next: u64,
}

impl<K: Clone + Eq + Hash, P> Default for Queues<K, P> {
    fn default() -> Self {
        Queues {
            lanes: HashMap::default(),
            waiting: HashMap::default(),
            next: 0,
        }
    }
}

impl<K: Clone + Eq + Hash, P> Queues<K, P> {
    /// A request on `keys` (distinct) arrives.
    pub(crate) fn arrive(
        &mut self,
        keys: SmallVec<[K; 4]>,
        group: Group,
        request: P,
    ) -> Arrival<K, P> {
        let idle = keys.iter().all(|k| {
            self.lanes
                .get(k)
                .is_none_or(|l| !l.busy && l.queue.is_empty())
        });
        if idle {
            for k in &keys {
                self.lanes.entry(k.clone()).or_default().busy = true;
            }
            return Arrival::Start(Batch {
                requests: vec![request],
                keys: keys.into_vec(),
            });
        }
        let ticket = Ticket(self.next);
        self.next += 1;
        for k in &keys {
            self.lanes
                .entry(k.clone())
                .or_default()
                .queue
                .push_back(ticket);
        }
        self.waiting.insert(
            ticket,
            Waiting {
                keys,
                group,
                request,
            },
        );
        Arrival::Queued(ticket)
    }

    /// The call holding `keys` is done: they are idle again. Returns the batches that can start
    /// now (their keys are busy from here on).
    pub(crate) fn finish(&mut self, keys: &[K]) -> Vec<Batch<K, P>> {
        for k in keys {
            if let Some(lane) = self.lanes.get_mut(k) {
                lane.busy = false;
            }
        }
        self.start_from(keys.to_vec())
    }

    /// A waiting request gave up. Returns it (`None` if it had already started) and the batches
    /// its leaving lets start.
    pub(crate) fn cancel(&mut self, ticket: Ticket) -> (Option<P>, Vec<Batch<K, P>>) {
        let Some(w) = self.waiting.remove(&ticket) else {
            return (None, Vec::new());
        };
        for k in &w.keys {
            if let Some(lane) = self.lanes.get_mut(k)
                && let Some(i) = lane.queue.iter().position(|t| *t == ticket)
            {
                lane.queue.remove(i);
            }
        }
        let keys = w.keys.to_vec();
        (Some(w.request), self.start_from(keys))
    }

    /// Requests waiting.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Keys with a call in flight or a request waiting (0 once all is done).
    #[cfg(test)]
    fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Starts what can start from the heads of `keys`' queues; forgets idle, empty lanes.
    fn start_from(&mut self, mut keys: Vec<K>) -> Vec<Batch<K, P>> {
        let mut batches = Vec::new();
        while let Some(k) = keys.pop() {
            let Some(lane) = self.lanes.get(&k) else {
                continue;
            };
            if lane.busy {
                continue;
            }
            let Some(&head) = lane.queue.front() else {
                self.lanes.remove(&k);
                continue;
            };
            if self.ready(head, &[]) {
                let batch = self.form(head);
                batches.push(batch);
            }
        }
        batches
    }

    /// Whether waiting request `ticket` is first in each of its keys' queues, and each of its
    /// keys is idle or one of `taken` (held by the batch being formed).
    fn ready(&self, ticket: Ticket, taken: &[K]) -> bool {
        let Some(w) = self.waiting.get(&ticket) else {
            return false;
        };
        w.keys.iter().all(|k| {
            self.lanes
                .get(k)
                .is_some_and(|l| l.queue.front() == Some(&ticket) && (!l.busy || taken.contains(k)))
        })
    }

    /// Takes a ready request out of the queues, marking its keys busy; returns its keys not yet
    /// in `taken`.
    fn take(&mut self, ticket: Ticket, taken: &mut Vec<K>) -> (Group, P) {
        let w = self
            .waiting
            .remove(&ticket)
            .expect("a ready request is waiting");
        for k in &w.keys {
            let lane = self.lanes.get_mut(k).expect("a waiting request's lane");
            lane.queue.pop_front();
            lane.busy = true;
            if !taken.contains(k) {
                taken.push(k.clone());
            }
        }
        (w.group, w.request)
    }

    /// A batch grown from ready request `first`: key by key, the next waiting request of the
    /// same group that is ready (given the batch's keys) joins, within the batch bounds.
    fn form(&mut self, first: Ticket) -> Batch<K, P> {
        let mut keys = Vec::new();
        let (group, request) = self.take(first, &mut keys);
        let mut requests = vec![(first, request)];
        let mut i = 0;
        while group.is_some() && i < keys.len() && requests.len() < MAX_BATCH_REQUESTS {
            let key = keys[i].clone();
            while requests.len() < MAX_BATCH_REQUESTS {
                let Some(&next) = self.lanes.get(&key).and_then(|l| l.queue.front()) else {
                    break;
                };
                let fits = self.waiting.get(&next).is_some_and(|w| {
                    w.group == group
                        && keys.len() + w.keys.iter().filter(|k| !keys.contains(k)).count()
                            <= MAX_BATCH_KEYS
                });
                if !fits || !self.ready(next, &keys) {
                    break;
                }
                let (_, request) = self.take(next, &mut keys);
                requests.push((next, request));
            }
            i += 1;
        }
        requests.sort_by_key(|(t, _)| *t);
        Batch {
            requests: requests.into_iter().map(|(_, r)| r).collect(),
            keys,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Q = Queues<&'static str, u32>;

    fn keys(k: &[&'static str]) -> SmallVec<[&'static str; 4]> {
        k.iter().copied().collect()
    }

    fn started(a: Arrival<&'static str, u32>) -> Vec<u32> {
        match a {
            Arrival::Start(b) => b.requests,
            Arrival::Queued(_) => panic!("expected a start"),
        }
    }

    fn ticket(a: Arrival<&'static str, u32>) -> Ticket {
        match a {
            Arrival::Queued(t) => t,
            Arrival::Start(_) => panic!("expected to wait"),
        }
    }

    fn requests(batches: &[Batch<&'static str, u32>]) -> Vec<Vec<u32>> {
        batches.iter().map(|b| b.requests.clone()).collect()
    }

    #[test]
    fn requests_on_a_busy_key_wait_and_go_together_in_arrival_order() {
        let mut q = Q::default();
        assert_eq!(started(q.arrive(keys(&["a"]), Some(0), 1)), [1]);
        for r in 2..=5 {
            ticket(q.arrive(keys(&["a"]), Some(0), r));
        }
        // Another key is not held up.
        assert_eq!(started(q.arrive(keys(&["b"]), Some(0), 9)), [9]);
        let next = q.finish(&["a"]);
        assert_eq!(requests(&next), [vec![2, 3, 4, 5]]);
        assert_eq!(next[0].keys, ["a"]);
        assert!(q.finish(&["a"]).is_empty());
        assert!(q.finish(&["b"]).is_empty());
        assert_eq!(q.lanes(), 0, "nothing left behind");
    }

    #[test]
    fn a_request_never_overtakes_an_earlier_one_on_any_of_its_keys() {
        let mut q = Q::default();
        started(q.arrive(keys(&["a"]), Some(0), 1));
        // 2 needs a (busy) and b; 3 needs only b, but came after 2 on b.
        ticket(q.arrive(keys(&["a", "b"]), Some(0), 2));
        ticket(q.arrive(keys(&["b"]), Some(0), 3));
        let next = q.finish(&["a"]);
        assert_eq!(requests(&next), [vec![2, 3]], "2 first, 3 joins it on b");
        let mut keys = next[0].keys.clone();
        keys.sort_unstable();
        assert_eq!(keys, ["a", "b"]);
    }

    #[test]
    fn a_request_whose_keys_span_slots_goes_alone() {
        let mut q = Q::default();
        started(q.arrive(keys(&["a"]), Some(0), 1));
        ticket(q.arrive(keys(&["a", "c"]), None, 2));
        ticket(q.arrive(keys(&["a"]), Some(0), 3));
        let next = q.finish(&["a"]);
        assert_eq!(requests(&next), [vec![2]]);
        let next = q.finish(&["a", "c"]);
        assert_eq!(requests(&next), [vec![3]]);
        // Different groups do not share a call either.
        ticket(q.arrive(keys(&["a"]), Some(5), 4));
        let next = q.finish(&["a"]);
        assert_eq!(requests(&next), [vec![4]]);
    }

    #[test]
    fn a_cancelled_request_leaves_its_queues_and_unblocks_what_waited_behind_it() {
        let mut q = Q::default();
        started(q.arrive(keys(&["a"]), Some(0), 1));
        let t2 = ticket(q.arrive(keys(&["a", "b"]), Some(0), 2));
        // b is idle but 3 waits behind 2 there.
        let t3 = ticket(q.arrive(keys(&["b"]), Some(0), 3));
        let (gone, next) = q.cancel(t2);
        assert_eq!(gone, Some(2));
        assert_eq!(requests(&next), [vec![3]], "3 starts once 2 left");
        assert_eq!(q.cancel(t3).0, None, "already started");
        assert!(q.finish(&["b"]).is_empty());
        assert!(q.finish(&["a"]).is_empty());
        assert_eq!(q.lanes(), 0);
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn batches_are_bounded_in_requests_and_keys() {
        let mut q = Queues::<String, usize>::default();
        let one = |k: &str| -> SmallVec<[String; 4]> { [k.to_owned()].into_iter().collect() };
        assert!(matches!(
            q.arrive(one("hot"), Some(0), 0),
            Arrival::Start(_)
        ));
        for r in 1..=MAX_BATCH_REQUESTS + 10 {
            q.arrive(one("hot"), Some(0), r);
        }
        let next = q.finish(&["hot".to_owned()]);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].requests.len(), MAX_BATCH_REQUESTS);
        let next = q.finish(&["hot".to_owned()]);
        assert_eq!(next[0].requests.len(), 10);
        // Requests on hot plus a key of their own: the batch stops at MAX_BATCH_KEYS keys.
        q.finish(&["hot".to_owned()]);
        assert!(matches!(
            q.arrive(one("hot"), Some(0), 0),
            Arrival::Start(_)
        ));
        for r in 1..=100 {
            let keys: SmallVec<[String; 4]> =
                ["hot".to_owned(), format!("k{r}")].into_iter().collect();
            q.arrive(keys, Some(0), r);
        }
        let next = q.finish(&["hot".to_owned()]);
        assert_eq!(next[0].keys.len(), MAX_BATCH_KEYS);
        assert_eq!(next[0].requests.len(), MAX_BATCH_KEYS - 1);
    }

    #[test]
    fn requests_of_a_batch_keep_arrival_order_across_keys() {
        let mut q = Q::default();
        started(q.arrive(keys(&["a", "b"]), Some(0), 1));
        ticket(q.arrive(keys(&["b"]), Some(0), 2));
        ticket(q.arrive(keys(&["a", "b"]), Some(0), 3));
        ticket(q.arrive(keys(&["a"]), Some(0), 4));
        let next = q.finish(&["a", "b"]);
        assert_eq!(requests(&next), [vec![2, 3, 4]]);
    }

    #[test]
    fn requests_on_disjoint_keys_go_in_calls_of_their_own() {
        let mut q = Q::default();
        started(q.arrive(keys(&["a", "b"]), Some(0), 1));
        ticket(q.arrive(keys(&["b"]), Some(0), 2));
        ticket(q.arrive(keys(&["a"]), Some(0), 3));
        ticket(q.arrive(keys(&["b"]), Some(0), 4));
        let mut next = requests(&q.finish(&["a", "b"]));
        next.sort();
        assert_eq!(next, [vec![2, 4], vec![3]], "two calls side by side");
    }
}
