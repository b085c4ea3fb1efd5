//! Which lane the running thread is, if it is one: a thread with a one-thread runtime of its own
//! that holds gRPC connections and their calls (the server's `net::lanes`). Work finished on
//! another thread for several calls of one lane (a Redis pipeline's replies) is handed to the
//! lane once, and the calls woken there, rather than each woken across threads.

use std::cell::RefCell;

use tokio::runtime::Handle;

/// A lane: its number (distinct among the lanes of one server) and its runtime.
#[derive(Clone, Debug)]
pub struct Lane {
    pub index: usize,
    pub runtime: Handle,
}

thread_local! {
    static CURRENT: RefCell<Option<Lane>> = const { RefCell::new(None) };
}

/// Marks the running thread as `lane` for the rest of its life.
pub fn enter(lane: Lane) {
    CURRENT.with(|current| *current.borrow_mut() = Some(lane));
}

/// The lane the running thread is, if any.
pub fn current() -> Option<Lane> {
    CURRENT.with(|current| current.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_no_lane_until_it_enters_one() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let handle = runtime.handle().clone();
        std::thread::spawn(move || {
            assert!(current().is_none());
            enter(Lane {
                index: 3,
                runtime: handle,
            });
            assert_eq!(current().map(|lane| lane.index), Some(3));
        })
        .join()
        .expect("the thread");
        assert!(
            current().is_none(),
            "another thread's lane is not this one's"
        );
    }
}
