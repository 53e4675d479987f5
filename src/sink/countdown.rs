//! A count of work items left and a wait for the last: a sink worker that hands a batch's items
//! to shared threads (the object store's puts, the HTTP sink's requests) sleeps until every item
//! is completed, woken once, by whoever completes the last.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

pub struct Countdown {
    pending: AtomicUsize,
    done: Mutex<bool>,
    done_cv: Condvar,
}

impl Countdown {
    /// `items` left to complete; with none, [`Countdown::wait`] returns at once.
    pub fn new(items: usize) -> Countdown {
        Countdown {
            pending: AtomicUsize::new(items),
            done: Mutex::new(items == 0),
            done_cv: Condvar::new(),
        }
    }

    /// One item completed; the last one wakes the waiter.
    pub fn complete_one(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.done_cv.notify_all();
        }
    }

    /// Sleeps until every item is completed.
    pub fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = self.done_cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_waiter_wakes_when_the_last_item_completes() {
        assert!(
            {
                Countdown::new(0).wait();
                true
            },
            "nothing to wait for"
        );
        let c = Arc::new(Countdown::new(3));
        let helpers: Vec<_> = (0..3)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || c.complete_one())
            })
            .collect();
        c.wait();
        for h in helpers {
            h.join().unwrap();
        }
    }
}
