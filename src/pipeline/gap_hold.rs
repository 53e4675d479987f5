//! Sign first, settle last, within a budget: `svc-ack` acknowledges (after its dead letter) or
//! terminates a message it gives up on only once a stored custody checkpoint lists its gap
//! (`Feed::gap_signed`), so a kill -9 never leaves a settled message no checkpoint lists. The
//! message is NAKed until then; it counts against the consumer's `max_ack_pending` meanwhile.
//! While the checkpoint store cannot take a checkpoint (the sink's own store down beside the
//! sink, behind a fallback spool: atk53b finding 1) the held messages would fill that limit
//! and stall good messages too, and checkpoints must never hold delivery back: so at most
//! [`Hold::budget`] messages are held at a time, and past it, while the store fails, a message
//! is settled unsigned,
//! counted (`checkpoint_gaps_settled_unsigned_total`) and logged with its sequence, the log
//! then its only evidence. Every delivery held is counted (`checkpoint_gap_waits_total`).
//! Nor is a message held while the thread reads the store back at its start or after an
//! overflow (no checkpoint is cut then, for as long as the read takes: atk53b finding 4), nor
//! on the consumer's own last delivery (`max_deliver`: a NAK then is never answered, atk53b
//! finding 6): settled unsigned, counted; its gap is told all the same and listed by the next
//! cut, so only a kill -9 before that cut loses it. Both limits are the consumer's as the
//! broker last reported them (`broker::consumer_limits`: read at bind, then by the consumer
//! watch every few seconds), since an operator may change them on the running consumer (atk54).

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

use super::ABANDONED;
use crate::broker::consumer_limits::ConsumerLimits;
use crate::metrics::Metrics;
use crate::sink::checkpoint::{Event, Feed, Origin};

/// Messages held at most without a consumer limit to go by.
pub const DEFAULT_BUDGET: usize = 1024;

/// Tells the gap of a message the broker delivers no more because it was not written on the
/// consumer's last delivery (`max_deliver`): [`ABANDONED`], listed by the next cut (a gap told
/// already keeps its first reason), counted as settled unsigned since no later delivery can
/// wait for the checkpoint. False, and nothing told, when a stored checkpoint lists it already.
pub fn tell_abandoned(feed: &Feed, metrics: &Metrics, origin: Origin, seq: u64) -> bool {
    if feed.gap_signed(&origin, seq) {
        return false;
    }
    feed.send(Event::Gap(origin, seq, ABANDONED));
    Metrics::add(&metrics.counters.checkpoint_gaps_settled_unsigned_total, 1);
    true
}

/// What to do with a message given up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Its gap is signed (or no checkpoints are kept): settle it.
    Now,
    /// Not signed yet: NAK it, it comes back.
    Wait,
    /// Not signed, and the hold is full: settle it unsigned.
    Unsigned,
    /// Not signed, on the consumer's last delivery (its `max_deliver`): settle it unsigned.
    Last,
    /// Not signed, and the checkpoint thread reads the store back (no cut until it is done,
    /// which can take minutes): settle it unsigned; its gap is listed right after the read
    /// unless a kill -9 comes first.
    Rescanning,
}

/// The messages given up on that wait for their checkpoint.
pub struct Hold {
    held: RefCell<HashSet<(Origin, u64)>>,
    /// [`Feed::signed_epoch`] when the held were last checked for signed gaps: checked again
    /// only once a checkpoint was stored since, not on every refusal at the budget (a flood
    /// of refusals would cost one look-up per held message each).
    pruned_at: std::cell::Cell<u64>,
    /// The consumer's `max_ack_pending` (the budget) and `max_deliver` (the last delivery) as
    /// the broker last reported them: read on each decision, since they may change on the
    /// running consumer (the consumer watch updates them: atk54).
    limits: Arc<ConsumerLimits>,
}

impl Hold {
    /// A hold going by the consumer's `limits`, kept current by the consumer watch.
    pub fn new(limits: Arc<ConsumerLimits>) -> Hold {
        Hold {
            held: RefCell::new(HashSet::new()),
            pruned_at: std::cell::Cell::new(0),
            limits,
        }
    }

    /// The consumer's `max_deliver` now, when it has one: a NAK of that delivery is never
    /// answered (atk53b finding 6), so waiting gains nothing and the message is settled then
    /// (counted).
    pub fn last_delivery(&self) -> Option<u64> {
        self.limits.max_deliver()
    }

    /// The most messages held at a time while the store fails: half the consumer's
    /// `max_ack_pending` now (none for a limit of 1: the hold never takes the only slot,
    /// atk55 finding 1), else [`DEFAULT_BUDGET`]; the other half stays for messages that can
    /// be delivered.
    pub fn budget(&self) -> usize {
        self.limits.max_ack_pending().map_or(DEFAULT_BUDGET, |m| {
            usize::try_from(m / 2).unwrap_or(usize::MAX)
        })
    }

    /// Whether the message at `at` is held (its dead letter confirmed in this run: not
    /// published again on each redelivery, atk53c finding 3).
    pub fn holds(&self, at: &(Origin, u64)) -> bool {
        self.held.borrow().contains(at)
    }

    /// Decides for the message at `at`, on its delivery `delivery` (see the module comment).
    pub fn decide(&self, feed: &Feed, at: &(Origin, u64), delivery: u64) -> Settle {
        let mut held = self.held.borrow_mut();
        if feed.gap_signed(&at.0, at.1) {
            held.remove(at);
            return Settle::Now;
        }
        if self.last_delivery().is_some_and(|last| delivery >= last) {
            held.remove(at);
            return Settle::Last;
        }
        if feed.rescanning() {
            held.remove(at);
            return Settle::Rescanning;
        }
        // One reading of the consumer's limit for the whole decision (the watch may change it).
        let budget = self.budget();
        if held.contains(at) {
            // Held past the budget (taken while the store looked healthy, its put then
            // hanging, or the consumer's limit lowered since): the excess goes while the
            // store fails (atk54 findings 2, 4).
            if held.len() > budget && feed.store_failing() {
                held.remove(at);
                return Settle::Unsigned;
            }
            return Settle::Wait;
        }
        if held.len() >= budget && self.pruned_at.get() != feed.signed_epoch() {
            // Those signed since (a message the broker stopped delivering leaves its entry).
            self.pruned_at.set(feed.signed_epoch());
            held.retain(|k| !feed.gap_signed(&k.0, k.1));
        }
        // Past the budget only while the store fails: a healthy one cuts within a second, and
        // a publisher's flood of refusals must not open the window (atk53c finding 4).
        if held.len() >= budget && feed.store_failing() {
            return Settle::Unsigned;
        }
        held.insert(at.clone());
        Settle::Wait
    }
}
