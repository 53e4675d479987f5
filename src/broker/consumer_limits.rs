//! The bound consumer's `max_ack_pending` and `max_deliver` as the broker last reported them:
//! read at bind, then again by each consumer info the consumer watch (`consumer_watch.rs`,
//! in `svc-fetch`) fetches, and read by `svc-ack`'s checkpoint hold on each decision
//! (`pipeline/gap_hold.rs`: its budget is half `max_ack_pending`, and it settles on the
//! `max_deliver`th delivery). An operator (or a hostile broker) may change either on the
//! running consumer: taken once at bind, a lowered `max_ack_pending` let the hold fill the
//! consumer and a lowered `max_deliver` left a message given up on NAKed and never terminated
//! (atk54). A change is logged at info once.

use std::sync::atomic::{AtomicU64, Ordering};

/// The two limits as read from one consumer config: positive values, else `None` (no limit,
/// or unknown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_ack_pending: Option<u64>,
    pub max_deliver: Option<u64>,
}

impl Limits {
    /// The limits of the broker's consumer config JSON (`config` of a consumer info); a
    /// value that is absent, not an integer, or not positive counts as no limit.
    pub fn of(config: &serde_json::Value) -> Limits {
        let positive = |name: &str| {
            config
                .get(name)
                .and_then(serde_json::Value::as_i64)
                .and_then(|n| u64::try_from(n).ok())
                .filter(|n| *n > 0)
        };
        Limits {
            max_ack_pending: positive("max_ack_pending"),
            max_deliver: positive("max_deliver"),
        }
    }
}

/// The bound consumer's current limits, shared (`Arc`) between the thread that reads them
/// from the broker and the one that acts on them. 0 stands for none.
#[derive(Debug, Default)]
pub struct ConsumerLimits {
    max_ack_pending: AtomicU64,
    max_deliver: AtomicU64,
}

impl ConsumerLimits {
    /// The limits found at bind.
    pub fn new(at_bind: Limits) -> ConsumerLimits {
        ConsumerLimits {
            max_ack_pending: AtomicU64::new(at_bind.max_ack_pending.unwrap_or(0)),
            max_deliver: AtomicU64::new(at_bind.max_deliver.unwrap_or(0)),
        }
    }

    /// The consumer's `max_ack_pending`, when limited.
    pub fn max_ack_pending(&self) -> Option<u64> {
        Some(self.max_ack_pending.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }

    /// The consumer's `max_deliver`, when limited.
    pub fn max_deliver(&self) -> Option<u64> {
        Some(self.max_deliver.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }

    /// Both, as now known.
    pub fn current(&self) -> Limits {
        Limits {
            max_ack_pending: self.max_ack_pending(),
            max_deliver: self.max_deliver(),
        }
    }

    /// Takes the limits the broker reports now for consumer `name` (`stream/consumer`); each
    /// one changed is logged at info, once. Returns whether any changed.
    pub fn update(&self, name: &str, now: Limits) -> bool {
        let ack_pending = swap(&self.max_ack_pending, now.max_ack_pending);
        if let Some(before) = ack_pending {
            log::info!(
                "broker: consumer {name} max_ack_pending {} -> {}: the checkpoint hold's \
                 budget follows",
                shown(before),
                shown(now.max_ack_pending)
            );
        }
        let deliver = swap(&self.max_deliver, now.max_deliver);
        if let Some(before) = deliver {
            log::info!(
                "broker: consumer {name} max_deliver {} -> {}: the checkpoint hold settles \
                 a message given up on at that delivery",
                shown(before),
                shown(now.max_deliver)
            );
        }
        ack_pending.is_some() || deliver.is_some()
    }
}

/// Stores `now` (none as 0) in `slot`; the value before when it differs.
fn swap(slot: &AtomicU64, now: Option<u64>) -> Option<Option<u64>> {
    let before = slot.swap(now.unwrap_or(0), Ordering::Relaxed);
    let before = Some(before).filter(|n| *n > 0);
    (before != now).then_some(before)
}

/// A limit for a message: its value, or `unlimited`.
fn shown(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_string(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_read_as_at_bind_and_changes_are_taken() {
        let config = serde_json::json!({"max_ack_pending": 1000, "max_deliver": -1});
        let at_bind = Limits::of(&config);
        assert_eq!(
            at_bind,
            Limits {
                max_ack_pending: Some(1000),
                max_deliver: None
            }
        );
        for odd in [
            serde_json::json!({}),
            serde_json::json!({"max_ack_pending": 0, "max_deliver": 0}),
            serde_json::json!({"max_ack_pending": "16", "max_deliver": 2.5}),
        ] {
            assert_eq!(Limits::of(&odd), Limits::default(), "{odd}");
        }
        let shared = std::sync::Arc::new(ConsumerLimits::new(at_bind));
        assert_eq!(shared.current(), at_bind);
        assert!(!shared.update("ORDERS/svc", at_bind));
        let lowered = Limits {
            max_ack_pending: Some(16),
            max_deliver: Some(2),
        };
        assert!(shared.update("ORDERS/svc", lowered));
        assert_eq!(shared.max_ack_pending(), Some(16));
        assert_eq!(shared.max_deliver(), Some(2));
        assert!(!shared.update("ORDERS/svc", lowered));
        assert!(shared.update("ORDERS/svc", Limits::default()));
        assert_eq!(shared.current(), Limits::default());
    }
}
