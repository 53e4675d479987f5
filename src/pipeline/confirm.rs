//! Confirmed acknowledgements (`delivery.ack_confirmation`), kept by `svc-ack`.
//!
//! Every ACK is sent as a request answered on one inbox ([`ConfirmInbox`]); the broker answers
//! with an empty message once it has processed the ACK. Until that answer the message is not
//! counted as acknowledged (`messages_acked_total` grows on the answer) and its batch's credits
//! stay taken, so no more ACKs wait for answers than the runner may hold messages, whatever
//! the broker does. Sending never waits for an answer: a batch's ACKs are all in flight at once.
//!
//! An ACK unanswered after `ack_confirmation_timeout_ms` is sent again, and again after twice
//! that, four times, up to 16 times that between sends: an ACK lost on the wire, or a
//! connection cut between the ACK and its answer, is seen and repaired instead of becoming a
//! redelivery, and a broker that answers nothing (or 503, a consumer gone) costs a bounded
//! rate of resends. An ACK whose send failed (the client's buffer full while disconnected) is
//! waited for and sent again the same way. One unanswered for the consumer's ack wait is given
//! up (counted and logged): by then the broker has redelivered the message, and the sink's
//! keys recognise it.
//!
//! Memory: one entry per ACK waiting, at most the credits; answered ACKs leave the schedule of
//! resends as soon as it holds more than twice the ACKs waiting (plus a little).
//! A handle of an older [`crate::broker::AckGeneration`] is never sent again (see `ack.rs`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::credit::Credit;
use super::BatchId;
use crate::broker::confirm_inbox::{Answer, ConfirmInbox};
use crate::broker::{AckHandle, Connection};
use crate::metrics::{Metrics, Summary};
use crate::text::log_budget::LogBudget;

/// One ACK waiting for its answer.
struct Waiting {
    handle: AckHandle,
    family: Option<usize>,
    batch: BatchId,
    first_sent: Instant,
    /// Sends so far (the first included).
    sends: u32,
}

/// The longest wait between two sends of one ACK, in `ack_confirmation_timeout_ms`.
const MAX_RESEND_FACTOR: u32 = 16;

/// The credits of a settled batch, given back when its last ACK is answered or given up.
struct Held {
    unanswered: usize,
    credit: Credit,
}

pub struct Confirmations {
    inbox: ConfirmInbox,
    next_token: u64,
    waiting: HashMap<u64, Waiting>,
    /// `(when to send again, token)`, soonest first; answered tokens are skipped when met.
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    held: HashMap<BatchId, Held>,
    resend_after: Duration,
    give_up_after: Duration,
    metrics: Arc<Metrics>,
    /// Answers that confirmed nothing, and ACKs given up: logged a few per window.
    odd_logged: LogBudget,
}

impl Confirmations {
    /// `capacity`: the most messages the runner holds (its message credits).
    pub fn open(
        nc: &Connection,
        capacity: usize,
        resend_after: Duration,
        ack_wait: Duration,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Confirmations> {
        Ok(Confirmations {
            // Room for every ACK's answer twice over (a resent ACK may be answered twice).
            inbox: ConfirmInbox::open(nc, 2 * capacity + 64)?,
            next_token: 0,
            waiting: HashMap::new(),
            due: BinaryHeap::new(),
            held: HashMap::new(),
            resend_after,
            give_up_after: ack_wait.max(resend_after),
            metrics,
            odd_logged: LogBudget::default(),
        })
    }

    pub fn receiver(&self) -> &crossbeam_channel::Receiver<nats::Message> {
        self.inbox.receiver()
    }

    /// How long an ACK waits for its answer before it is sent again.
    pub fn resend_after(&self) -> Duration {
        self.resend_after
    }

    /// True while an ACK waits for its answer.
    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Sends `+ACK` for `handle` of `batch` as a request; its answer is awaited, and the ACK
    /// is sent again on schedule whether this send succeeded or not.
    pub fn send(
        &mut self,
        nc: &Connection,
        handle: &AckHandle,
        family: Option<usize>,
        batch: BatchId,
    ) {
        let token = self.next_token;
        self.next_token += 1;
        if let Err(e) = self.inbox.send_ack(nc, handle, token) {
            log::debug!(
                "broker: acknowledgement of stream sequence {} not sent now ({e}); sent again \
                 at its time",
                handle.stream_sequence
            );
        }
        let now = Instant::now();
        self.waiting.insert(
            token,
            Waiting {
                handle: handle.clone(),
                family,
                batch,
                first_sent: now,
                sends: 1,
            },
        );
        self.schedule(now + self.resend_after, token);
    }

    /// When the next resend is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.peek().map(|Reverse((at, _))| *at)
    }

    fn schedule(&mut self, at: Instant, token: u64) {
        self.due.push(Reverse((at, token)));
        // Answered ACKs linger in the schedule until their time: drop them before it grows
        // past the ACKs still waiting.
        if self.due.len() > 2 * self.waiting.len() + 64 {
            let waiting = &self.waiting;
            self.due.retain(|Reverse((_, t))| waiting.contains_key(t));
        }
    }

    /// Holds a settled batch's credits until its `sent` confirmed ACKs are answered; gives
    /// them back at once when none was sent.
    pub fn hold(&mut self, batch: BatchId, sent: usize, credit: Credit) -> Option<Credit> {
        if sent == 0 {
            return Some(credit);
        }
        self.held.insert(
            batch,
            Held {
                unanswered: sent,
                credit,
            },
        );
        None
    }

    /// One message on the inbox; returns the credits of a batch it completed.
    pub fn answered(&mut self, msg: &nats::Message) -> Option<Credit> {
        let token = match self.inbox.answer(msg) {
            Answer::Confirmed(token) => token,
            Answer::NotConfirmed(token, what) => {
                self.note_odd(&format!(
                    "broker: answer to acknowledgement {token} confirms nothing ({what}); \
                     sent again at its time"
                ));
                return None;
            }
            Answer::Foreign => return None,
        };
        // A second answer to a resent ACK names a token no longer waiting.
        let waiting = self.waiting.remove(&token)?;
        let c = &self.metrics.counters;
        Metrics::add(&c.messages_acked_total, 1);
        Metrics::add(&c.ack_confirmations_total, 1);
        self.metrics
            .add_family(waiting.family, crate::metrics::FamilyMetric::Acked, 1);
        let mut latency = Summary::default();
        latency.observe(waiting.first_sent.elapsed().as_secs_f64());
        self.metrics
            .observe_all(crate::metrics::SummaryMetric::AckConfirmation, &latency);
        self.release(waiting.batch)
    }

    /// Sends again every ACK whose answer is overdue, and gives up those unanswered for the
    /// ack wait or of an older generation; returns the credits of batches that completed.
    pub fn resend_due(&mut self, nc: &Connection, current_generation: u64) -> Vec<Credit> {
        let now = Instant::now();
        let mut freed = Vec::new();
        while let Some(&Reverse((at, token))) = self.due.peek() {
            if at > now {
                break;
            }
            self.due.pop();
            let Some(w) = self.waiting.get_mut(&token) else {
                continue;
            };
            let expired = now.duration_since(w.first_sent) >= self.give_up_after;
            if expired || w.handle.generation != current_generation {
                freed.extend(self.give_up(token, expired));
                continue;
            }
            match self.inbox.send_ack(nc, &w.handle, token) {
                Ok(()) => Metrics::add(&self.metrics.counters.acks_resent_total, 1),
                Err(e) => log::debug!("broker: acknowledgement not sent again: {e}"),
            }
            w.sends += 1;
            let factor = 1u32 << (w.sends - 1).min(MAX_RESEND_FACTOR.trailing_zeros());
            self.schedule(now + self.resend_after * factor, token);
        }
        freed
    }

    /// Gives up every ACK still waiting (the runner stops); returns the credits held.
    pub fn give_up_all(&mut self) -> Vec<Credit> {
        let tokens: Vec<u64> = self.waiting.keys().copied().collect();
        let n = tokens.len();
        let freed = tokens
            .into_iter()
            .filter_map(|t| self.give_up(t, false))
            .collect();
        if n > 0 {
            log::warn!(
                "broker: {n} acknowledgements were not confirmed before the stop; the broker \
                 redelivers what they did not settle, and the sink's keys recognise it"
            );
        }
        freed
    }

    fn give_up(&mut self, token: u64, expired: bool) -> Option<Credit> {
        let w = self.waiting.remove(&token)?;
        Metrics::add(&self.metrics.counters.ack_confirmations_abandoned_total, 1);
        if expired {
            self.note_odd(&format!(
                "broker: acknowledgement of stream sequence {} unconfirmed for {:.1} s (the \
                 ack wait); given up: the broker redelivers the message if the ACK was lost",
                w.handle.stream_sequence,
                self.give_up_after.as_secs_f64()
            ));
        }
        self.release(w.batch)
    }

    fn release(&mut self, batch: BatchId) -> Option<Credit> {
        let held = self.held.get_mut(&batch)?;
        held.unanswered -= 1;
        if held.unanswered > 0 {
            return None;
        }
        self.held.remove(&batch).map(|h| h.credit)
    }

    fn note_odd(&mut self, line: &str) {
        if let Some(suppressed) = self.odd_logged.admit(Instant::now()) {
            match suppressed {
                0 => log::warn!("{line}"),
                n => log::warn!("{line} ({n} more such lines not logged)"),
            }
        }
    }
}
