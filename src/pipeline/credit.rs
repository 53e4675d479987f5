//! Credits: the bound on everything the runner holds, in messages and in payload bytes.
//!
//! The pool starts with `max_in_flight_batches x batch_size` message credits and
//! `max_in_flight_bytes` byte credits. `svc-fetch` takes `batch_size` message credits and a
//! pull request's byte allowance before each pull request (the most that request can bring:
//! the broker honours the request's `max_bytes`); it gives back the unused part when a request
//! ends. `svc-ack` gives back a batch's messages and their bytes when it settles the batch. So
//! at no time can more messages or payload bytes be requested, held, written or waiting for
//! acknowledgement than the pool's capacity, whatever the backlog and whatever the message
//! size, and batches may be cut short (by `max_batch_wait_ms`) without loosening the bound.
//!
//! One message larger than a request's allowance (a byte bound below the broker's largest
//! message) is charged in full when it arrives: the pool goes into debt and no request is
//! sent until that message is settled, so it flows alone.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// An amount of credit: messages and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Credit {
    pub messages: usize,
    pub bytes: usize,
}

impl Credit {
    pub fn new(messages: usize, bytes: usize) -> Credit {
        Credit { messages, bytes }
    }
}

/// What is free now. Bytes may be negative: a message larger than its request's allowance
/// was charged in full (see the module comment).
#[derive(Debug, Clone, Copy)]
struct Available {
    messages: usize,
    bytes: i64,
}

pub struct CreditPool {
    available: Mutex<Available>,
    returned: Condvar,
    capacity: Credit,
}

fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl CreditPool {
    pub fn new(capacity: Credit) -> CreditPool {
        CreditPool {
            available: Mutex::new(Available {
                messages: capacity.messages,
                bytes: signed(capacity.bytes),
            }),
            returned: Condvar::new(),
            capacity,
        }
    }

    /// Takes `n` if it is available within `wait`; false otherwise (nothing taken).
    pub fn take(&self, n: Credit, wait: Duration) -> bool {
        let enough = |a: &Available| a.messages >= n.messages && a.bytes >= signed(n.bytes);
        let guard = self.available.lock().unwrap_or_else(|e| e.into_inner());
        let (mut available, _) = self
            .returned
            .wait_timeout_while(guard, wait, |a| !enough(a))
            .unwrap_or_else(|e| e.into_inner());
        if enough(&available) {
            available.messages -= n.messages;
            available.bytes -= signed(n.bytes);
            true
        } else {
            false
        }
    }

    /// Charges `bytes` beyond what was taken, without waiting (a delivery larger than its
    /// request's allowance): the pool may go into debt.
    pub fn charge_bytes(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut available = self.available.lock().unwrap_or_else(|e| e.into_inner());
        available.bytes = available.bytes.saturating_sub(signed(bytes));
    }

    /// Gives `n` back.
    pub fn give(&self, n: Credit) {
        if n == Credit::default() {
            return;
        }
        let mut available = self.available.lock().unwrap_or_else(|e| e.into_inner());
        available.messages = (available.messages + n.messages).min(self.capacity.messages);
        available.bytes = available
            .bytes
            .saturating_add(signed(n.bytes))
            .min(signed(self.capacity.bytes));
        self.returned.notify_all();
    }

    /// Free message credits.
    /// Gives back every credit of `credits` (e.g. the batches a confirmation completed).
    pub fn give_all(&self, credits: impl IntoIterator<Item = Credit>) {
        for c in credits {
            self.give(c);
        }
    }

    pub fn available_messages(&self) -> usize {
        self.available
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .messages
    }

    /// Free byte credits (0 while in debt).
    pub fn available_bytes(&self) -> usize {
        let bytes = self
            .available
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bytes;
        usize::try_from(bytes).unwrap_or(0)
    }

    pub fn capacity(&self) -> Credit {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn take_waits_for_enough_credits() {
        let pool = Arc::new(CreditPool::new(Credit::new(10, 1000)));
        assert!(pool.take(Credit::new(8, 100), Duration::ZERO));
        assert!(
            !pool.take(Credit::new(8, 100), Duration::from_millis(10)),
            "only 2 messages left"
        );
        let p = pool.clone();
        let giver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            p.give(Credit::new(8, 100));
        });
        assert!(
            pool.take(Credit::new(8, 100), Duration::from_secs(5)),
            "woken by give"
        );
        giver.join().unwrap();
        assert_eq!(pool.available_messages(), 2);
        pool.give(Credit::new(100, 100_000));
        assert_eq!(pool.available_messages(), 10, "never above capacity");
        assert_eq!(pool.available_bytes(), 1000, "never above capacity");
    }

    #[test]
    fn bytes_bound_requests_whatever_the_message_count() {
        let pool = CreditPool::new(Credit::new(1000, 1000));
        assert!(pool.take(Credit::new(1, 600), Duration::ZERO));
        assert!(
            !pool.take(Credit::new(1, 600), Duration::from_millis(10)),
            "messages are free but bytes are not"
        );
        assert_eq!(
            pool.available_messages(),
            999,
            "a refused take takes nothing"
        );
    }

    #[test]
    fn a_message_over_its_allowance_puts_the_pool_in_debt_until_settled() {
        let pool = CreditPool::new(Credit::new(10, 1000));
        assert!(pool.take(Credit::new(1, 1000), Duration::ZERO));
        // The delivery was 5000 bytes: 4000 more than the request's allowance.
        pool.charge_bytes(4000);
        assert_eq!(pool.available_bytes(), 0);
        pool.give(Credit::new(0, 1000));
        assert!(
            !pool.take(Credit::new(1, 1), Duration::ZERO),
            "still in debt: nothing more is requested while the large message is held"
        );
        pool.give(Credit::new(1, 4000));
        assert_eq!(pool.available_bytes(), 1000);
        assert!(pool.take(Credit::new(1, 1000), Duration::ZERO));
    }
}
