//! The deliveries a consumer held unacknowledged when this runner bound it: left in flight by
//! a run that ended without settling them (a kill -9, a lost connection), or held by another
//! runner of the same durable. One of them on its last delivery (`max_deliver`) is dropped by
//! the broker at a later pull, and nothing this runner does sees it: no delivery comes, no
//! NAK of ours went out (atk56 finding 3). The broker says so only in its `MAX_DELIVERIES`
//! advisory, and anyone allowed to publish on the advisory subject can send one (atk57 flooded
//! the checkpoints with forged gaps). So an advisory is believed only for a sequence the
//! consumer held at bind: above its ack floor, at or below the last sequence it had delivered,
//! each sequence once, and no more of them than it held unacknowledged then
//! (`num_ack_pending`). A forged advisory can then add at most that many gaps, each for a
//! sequence the consumer really delivered, and never grow memory or a checkpoint past them.

use std::collections::HashSet;

use serde_json::Value;

/// The consumer's state at bind, from `$JS.API.CONSUMER.INFO` (all zero when unreadable: then
/// nothing is believed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inherited {
    /// Every stream sequence at or below it was settled at bind (`ack_floor.stream_seq`).
    pub floor: u64,
    /// The last stream sequence the consumer had delivered (`delivered.stream_seq`).
    pub delivered: u64,
    /// How many deliveries awaited an acknowledgement (`num_ack_pending`).
    pub pending: u64,
}

impl Inherited {
    /// Reads the consumer info reply's `ack_floor`, `delivered` and `num_ack_pending`; a
    /// field missing or not a whole number counts as 0.
    pub fn of(info: &Value) -> Inherited {
        let seq = |name: &str| {
            info.get(name)
                .and_then(|v| v.get("stream_seq"))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        let pending = info.get("num_ack_pending").and_then(Value::as_u64);
        Inherited {
            floor: seq("ack_floor"),
            delivered: seq("delivered"),
            pending: pending.unwrap_or(0),
        }
    }

    /// Whether the consumer may have held `seq` unacknowledged at bind.
    fn may_hold(&self, seq: u64) -> bool {
        self.floor < seq && seq <= self.delivered
    }
}

/// Advisories believed at most, whatever `num_ack_pending` a broker reports (atk59: a hostile
/// broker's huge count bounded the set by nothing else).
pub const MAX_BELIEVED: u64 = 65_536;

/// The `max_deliver` advisories believed so far ([`Inherited`]).
#[derive(Debug)]
pub struct Believed {
    at_bind: Inherited,
    told: HashSet<u64>,
}

impl Believed {
    pub fn new(at_bind: Inherited) -> Believed {
        Believed {
            at_bind,
            told: HashSet::new(),
        }
    }

    /// True the first time an advisory names `seq` and the consumer held it at bind, while
    /// fewer than the deliveries it held then (and than [`MAX_BELIEVED`]) were believed.
    pub fn admit(&mut self, seq: u64) -> bool {
        let room = (self.told.len() as u64) < self.at_bind.pending.min(MAX_BELIEVED);
        self.at_bind.may_hold(seq) && room && self.told.insert(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advisory_is_believed_once_for_a_sequence_held_at_bind_and_no_more_than_were_held() {
        let info = serde_json::json!({"ack_floor": {"consumer_seq": 4, "stream_seq": 10},
            "delivered": {"consumer_seq": 9, "stream_seq": 20}, "num_ack_pending": 2});
        let at_bind = Inherited::of(&info);
        assert_eq!(
            at_bind,
            Inherited {
                floor: 10,
                delivered: 20,
                pending: 2
            }
        );
        let mut b = Believed::new(at_bind);
        assert!(!b.admit(10), "at the floor: settled");
        assert!(!b.admit(21), "never delivered");
        assert!(!b.admit(0));
        assert!(b.admit(11));
        assert!(!b.admit(11), "once");
        assert!(b.admit(20));
        assert!(!b.admit(15), "no more than the two held at bind");
        let huge = Inherited {
            floor: 0,
            delivered: u64::MAX,
            pending: u64::MAX,
        };
        let mut b = Believed::new(huge);
        assert_eq!((1..=100_000).filter(|s| b.admit(*s)).count(), 65_536);
    }

    #[test]
    fn an_unreadable_state_believes_nothing() {
        for info in [
            serde_json::json!({}),
            serde_json::json!({"ack_floor": {"stream_seq": "1"}, "delivered": {"stream_seq": -5},
                "num_ack_pending": 3}),
            serde_json::json!({"ack_floor": {"stream_seq": 1}, "delivered": {"stream_seq": 9}}),
        ] {
            let mut b = Believed::new(Inherited::of(&info));
            assert!((0..12).all(|s| !b.admit(s)), "{info}");
        }
    }
}
