//! The messages `svc-ack` NAKed unwritten in this run (a transient failure, or a refusal it
//! retries), with the delivery count of their last NAK (`svc-fetch` keeps one of its own for
//! the deliveries it releases itself, until they are delivered again): when the consumer's `max_deliver` is
//! lowered to that count or below on the running consumer, the broker delivers them no more and
//! says nothing (no `max_deliver` advisory: the message is past the limit before its next
//! delivery; atk56 finding 2). With custody checkpoints `svc-ack` then lists each as a gap
//! ([`super::ABANDONED`]), as it does for a NAK on the last delivery.
//!
//! Bounded: at most [`KEPT`] entries, the oldest forgotten first; an entry leaves when its
//! message is settled or listed. Keyed by stream sequence (one stream per runner); a stream
//! created again under the runner leaves at most stale entries, listed under the old stream.

use std::collections::{HashMap, VecDeque};

use crate::sink::checkpoint::Origin;

/// Entries kept at most.
pub const KEPT: usize = 65_536;

#[derive(Default)]
pub struct Retried {
    /// Stream sequence -> (its place, the delivery count of its last NAK).
    last: HashMap<u64, (Origin, u64)>,
    /// Insertion order, for forgetting the oldest (may name sequences settled since).
    order: VecDeque<u64>,
    /// The consumer's `max_deliver` when last looked at (`None`: unlimited).
    limit: Option<u64>,
}

impl Retried {
    /// Starts from the consumer's `max_deliver` as bound.
    pub fn new(limit: Option<u64>) -> Retried {
        Retried {
            limit,
            ..Retried::default()
        }
    }

    /// The message at `at` was NAKed unwritten on delivery `delivery`.
    pub fn nakked(&mut self, at: &(Origin, u64), delivery: u64) {
        if self.last.insert(at.1, (at.0.clone(), delivery)).is_none() {
            self.order.push_back(at.1);
        }
        while self.last.len() > KEPT {
            match self.order.pop_front() {
                Some(old) => {
                    self.last.remove(&old);
                }
                None => break,
            }
        }
        if self.order.len() > 2 * KEPT {
            let last = &self.last;
            self.order.retain(|s| last.contains_key(s));
        }
    }

    /// The message of stream sequence `seq` was settled (or listed): forgotten.
    pub fn settled(&mut self, seq: u64) {
        if !self.last.is_empty() {
            self.last.remove(&seq);
        }
    }

    /// With the consumer's `max_deliver` now: when it was lowered, the places of the messages
    /// whose last NAK came on a delivery at or past it (forgotten here).
    pub fn lowered(&mut self, now: Option<u64>) -> Vec<(Origin, u64)> {
        let before = std::mem::replace(&mut self.limit, now);
        let Some(limit) = now.filter(|n| before.is_none_or(|b| *n < b)) else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        self.last.retain(|seq, (origin, delivery)| {
            let past = *delivery >= limit;
            if past {
                gone.push((origin.clone(), *seq));
            }
            !past
        });
        gone.sort_by_key(|g| g.1);
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn at(seq: u64) -> (Origin, u64) {
        ((Arc::from("S"), Arc::from("i1")), seq)
    }

    #[test]
    fn a_lowered_limit_names_the_messages_past_it_once() {
        let mut r = Retried::new(Some(10));
        r.nakked(&at(2), 3);
        r.nakked(&at(3), 1);
        r.nakked(&at(4), 5);
        r.settled(4);
        assert!(r.lowered(Some(10)).is_empty(), "unchanged");
        assert!(r.lowered(Some(12)).is_empty(), "raised");
        let gone: Vec<u64> = r.lowered(Some(3)).into_iter().map(|g| g.1).collect();
        assert_eq!(
            gone,
            vec![2],
            "delivery 3 at a limit of 3: no next delivery"
        );
        assert!(r.lowered(Some(3)).is_empty(), "listed once");
        let gone: Vec<u64> = r.lowered(Some(1)).into_iter().map(|g| g.1).collect();
        assert_eq!(gone, vec![3]);
    }

    #[test]
    fn unlimited_then_limited_counts_as_lowered() {
        let mut r = Retried::new(None);
        r.nakked(&at(7), 4);
        assert_eq!(r.lowered(Some(4)).len(), 1);
    }

    #[test]
    fn it_keeps_a_bounded_number_of_entries() {
        let mut r = Retried::new(Some(100));
        for seq in 1..=(KEPT as u64 + 10) {
            r.nakked(&at(seq), 1);
        }
        assert_eq!(r.last.len(), KEPT);
        assert!(!r.last.contains_key(&1), "the oldest forgotten");
        let gone = r.lowered(Some(1));
        assert_eq!(gone.len(), KEPT);
    }
}
