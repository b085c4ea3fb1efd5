//! Connection lanes (`--grpc-lanes`, off by default): threads each running a one-thread
//! runtime, and each accepted gRPC connection served on one of them (the one holding the fewest
//! connections; ties in turn) with every call it carries, from
//! its first frame to its close, as Envoy's own workers hold their connections. A call suspended
//! on Redis is woken on the thread that will write its answer, and no worker steals from or wakes
//! another: on the multi-thread runtime those cross-thread wakes cost a call more than the round
//! trip itself (docs/performance.md, "Connection lanes"). The lanes stop when the last holder of
//! [`Lanes`] drops it, cancelling what still runs on them.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// Lanes started in this process, for their numbers.
static LANES_STARTED: AtomicUsize = AtomicUsize::new(0);

/// The lanes' runtimes, how many connections each holds, and a turn counter for ties.
pub(crate) struct Lanes {
    lanes: Vec<(Handle, Arc<AtomicUsize>)>,
    next: AtomicUsize,
    /// Dropped with the lanes: each lane's thread then ends, dropping its runtime.
    _stops: Vec<oneshot::Sender<()>>,
}

/// A connection's place on a lane, held for as long as it is open.
pub(crate) struct Seat(Arc<AtomicUsize>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Lanes {
    /// Starts `count` lanes (at least one), each a thread named `lane-N`.
    pub(crate) fn start(count: usize) -> io::Result<Arc<Lanes>> {
        let count = count.max(1);
        let mut lanes = Vec::with_capacity(count);
        let mut stops = Vec::with_capacity(count);
        for index in 0..count {
            let runtime = Builder::new_current_thread().enable_all().build()?;
            lanes.push((runtime.handle().clone(), Arc::new(AtomicUsize::new(0))));
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            // Distinct across every server of the process (tests run several).
            let id = LANES_STARTED.fetch_add(1, Ordering::Relaxed);
            std::thread::Builder::new()
                .name(format!("lane-{index}"))
                .spawn(move || {
                    ratelimit_core::lane::enter(ratelimit_core::lane::Lane {
                        index: id,
                        runtime: runtime.handle().clone(),
                    });
                    let _ = runtime.block_on(stopped);
                })?;
        }
        Ok(Arc::new(Lanes {
            lanes,
            next: AtomicUsize::new(0),
            _stops: stops,
        }))
    }

    /// The lane the next connection goes to (the one holding the fewest, from the next in turn),
    /// and its seat there, to hold while the connection is open.
    pub(crate) fn place(&self) -> (&Handle, Seat) {
        let count = self.lanes.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let (handle, open) = (0..count)
            .map(|step| &self.lanes[(first + step) % count])
            .min_by_key(|(_, open)| open.load(Ordering::Relaxed))
            .expect("at least one lane");
        open.fetch_add(1, Ordering::Relaxed);
        (handle, Seat(open.clone()))
    }

    /// How many lanes there are.
    pub(crate) fn count(&self) -> usize {
        self.lanes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_goes_to_the_lane_holding_the_fewest() {
        let lanes = Lanes::start(3).expect("lanes");
        let (first, first_seat) = lanes.place();
        let (second, _second_seat) = lanes.place();
        let (third, _third_seat) = lanes.place();
        let ids = [first.id(), second.id(), third.id()];
        assert!(
            ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
            "one each"
        );
        drop(first_seat);
        let (fourth, _fourth_seat) = lanes.place();
        assert_eq!(fourth.id(), ids[0], "the lane whose connection closed");
        let (fifth, _fifth_seat) = lanes.place();
        assert!(ids.contains(&fifth.id()), "ties: any lane");
    }

    #[test]
    fn a_task_on_a_lane_runs_on_the_lane_s_thread() {
        let lanes = Lanes::start(2).expect("lanes");
        let name = std::sync::mpsc::channel();
        let sender = name.0;
        lanes.place().0.spawn(async move {
            let _ = sender.send(std::thread::current().name().map(str::to_owned));
        });
        let name = name.1.recv().expect("the task ran");
        assert_eq!(name.as_deref(), Some("lane-0"));
    }
}
