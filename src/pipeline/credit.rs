//! Message credits: the bound on everything the runner holds.
//!
//! The pool starts with `max_in_flight_batches x batch_size` credits, one per message.
//! `svc-fetch` takes `batch_size` credits before each pull request (the most that request can
//! bring); it gives back the unused part when a request ends short. `svc-ack` gives back one
//! credit per message when it settles a batch. So at no time can more messages be requested,
//! held, written or waiting for acknowledgement than the pool's capacity, whatever the
//! backlog, and batches may be cut short (by `max_batch_wait_ms`) without loosening the bound.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

pub struct CreditPool {
    available: Mutex<usize>,
    returned: Condvar,
    capacity: usize,
}

impl CreditPool {
    pub fn new(capacity: usize) -> CreditPool {
        CreditPool {
            available: Mutex::new(capacity),
            returned: Condvar::new(),
            capacity,
        }
    }

    /// Takes `n` credits if they are available within `wait`; false otherwise.
    pub fn take(&self, n: usize, wait: Duration) -> bool {
        let guard = self.available.lock().unwrap_or_else(|e| e.into_inner());
        let (mut available, _) = self
            .returned
            .wait_timeout_while(guard, wait, |a| *a < n)
            .unwrap_or_else(|e| e.into_inner());
        if *available >= n {
            *available -= n;
            true
        } else {
            false
        }
    }

    /// Gives `n` credits back.
    pub fn give(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut available = self.available.lock().unwrap_or_else(|e| e.into_inner());
        *available = (*available + n).min(self.capacity);
        self.returned.notify_all();
    }

    pub fn available(&self) -> usize {
        *self.available.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn take_waits_for_enough_credits() {
        let pool = Arc::new(CreditPool::new(10));
        assert!(pool.take(8, Duration::ZERO));
        assert!(!pool.take(8, Duration::from_millis(10)), "only 2 left");
        let p = pool.clone();
        let giver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            p.give(8);
        });
        assert!(pool.take(8, Duration::from_secs(5)), "woken by give");
        giver.join().unwrap();
        assert_eq!(pool.available(), 2);
        pool.give(100);
        assert_eq!(pool.available(), 10, "never above capacity");
    }
}
