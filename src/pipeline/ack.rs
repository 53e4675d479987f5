//! `svc-ack`: the only thread that acknowledges. It holds every in-flight batch's ack handles,
//! settles each batch when its outcome arrives, keeps long batches alive with in-progress
//! acks, and returns the batch's credits (messages and bytes) to the pool `svc-fetch` draws from.
//!
//! Invariant: `AckVerb::Ack` is sent only for a message whose verdict is durable, or whose
//! DLQ record the broker confirmed (stored in a stream) just before.
//!
//! Within a batch the durable and transient verdicts are carried out first, the pre-sink
//! rejections (which may need a DLQ publish, a broker round trip) last: a bad message never
//! delays the good messages of its batch. After the first failed DLQ publish of a batch the
//! remaining rejections of that batch are NAKed without trying again, so a broken DLQ costs
//! at most one publish timeout per batch.
//!
//! Invariant: no verb is sent for a handle of an older [`broker::AckGeneration`] than the
//! current one (delivered before the consumer, and perhaps its stream, was created again): its
//! ack subject would settle the new consumer's message of the same stream sequence. Such
//! handles are dropped, counted, and logged once when no batch holds any more of them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::confirm::Confirmations;
use super::credit::{Credit, CreditPool};

use super::gap_hold::{tell_abandoned, Hold, Settle};
use super::retried::Retried;
use super::{AckMsg, BatchId, GapReason, Monitor, Rejection, Verdict, ABANDONED};
use crate::backoff::Backoff;
use crate::broker::dead_letter::{DeadLetterPublisher, PubAck};
use crate::broker::{self, AckHandle, AckVerb, Connection};
use crate::metrics::Metrics;
use crate::sink::WriteOutcome;
use crate::text::error_chain;
use crate::text::peer::PeerText;

pub struct AckWorker {
    pub nc: Connection,
    pub rx: Receiver<AckMsg>,
    /// The stop's deadline is near with batches still at the sink ([`Self::give_up`]).
    pub give_up: Receiver<()>,
    pub credits: Arc<CreditPool>,
    /// Wakes `svc-flush` so a settled batch's acknowledgements are written at once.
    pub flush_kick: Sender<()>,
    pub metrics: Arc<Metrics>,
    pub monitor: Arc<Monitor>,
    pub nak_backoff: Backoff,
    pub max_deliveries: Option<u64>,
    /// The DLQ publisher when `dead_letter.enabled`.
    pub dlq: Option<DeadLetterPublisher>,
    /// A batch older than this (since fetch or its last in-progress ack) gets in-progress acks.
    pub progress_after: Duration,
    /// The generation of current deliveries, advanced by `svc-fetch`.
    pub generation: Arc<broker::AckGeneration>,
    /// `delivery.ack_confirmation`: ACKs sent as requests and awaited.
    pub confirmations: Option<Confirmations>,
    /// `custody.checkpoints`: a refused message is a gap once given up on here.
    pub checkpoints: Option<Arc<crate::sink::checkpoint::Feed>>,
    /// The messages given up on that wait for their checkpoint (`gap_hold.rs`).
    pub hold: Hold,
    /// With custody checkpoints, the messages NAKed unwritten, for a `max_deliver` lowered
    /// under them (`retried.rs`).
    pub retried: Retried,
}

struct InFlight {
    handles: Vec<AckHandle>,
    origin: crate::sink::checkpoint::Origin,
    families: Vec<Option<usize>>,
    bytes: usize,
    last_progress: Instant,
}

impl AckWorker {
    pub fn run(mut self) {
        let mut in_flight: HashMap<BatchId, InFlight> = HashMap::new();
        // Handles of older generations dropped and not yet logged.
        let mut dropped = 0;
        let tick =
            (self.progress_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let answers = self
            .confirmations
            .as_ref()
            .map_or_else(crossbeam_channel::never, |c| c.receiver().clone());
        loop {
            self.monitor.activity("waiting for outcomes");
            crossbeam_channel::select! {
                recv(self.rx) -> msg => match msg {
                    Ok(msg) => dropped += self.on_message(msg, &mut in_flight),
                    Err(_) => break,
                },
                recv(answers) -> msg => {
                    if let Ok(msg) = msg {
                        self.on_answer(&msg);
                    }
                }
                recv(self.give_up) -> _ => {
                    self.give_up(&in_flight);
                    break;
                }
                default(self.wait(tick)) => {}
            }
            self.resend_due();
            self.keep_alive(&mut in_flight);
            self.on_limit();
            if dropped > 0 && !self.holds_stale(&in_flight) {
                log_dropped(std::mem::take(&mut dropped));
            }
        }
        self.finish_confirmations(&answers);
        if dropped > 0 {
            log_dropped(dropped);
        }
        if !in_flight.is_empty() {
            log::warn!(
                "{} batches ended without an outcome; left unacknowledged for redelivery (a \
                 message on the consumer's last delivery is delivered no more)",
                in_flight.len()
            );
        }
        self.monitor.activity("stopped");
    }

    /// A batch registered or its outcome; returns the handles of older generations dropped.
    fn on_message(&mut self, msg: AckMsg, in_flight: &mut HashMap<BatchId, InFlight>) -> u64 {
        match msg {
            AckMsg::Register {
                id,
                handles,
                origin,
                families,
                bytes,
            } => {
                self.monitor
                    .batch_started(id, handles.len(), max_delivery(&handles));
                in_flight.insert(
                    id,
                    InFlight {
                        handles,
                        origin,
                        families,
                        bytes,
                        last_progress: Instant::now(),
                    },
                );
                0
            }
            AckMsg::Outcome { id, verdicts } => {
                let Some(batch) = in_flight.remove(&id) else {
                    log::error!("outcome for unknown batch {id}: nothing acknowledged");
                    return 0;
                };
                self.monitor.activity("settling batch");
                let held = Credit::new(batch.handles.len(), batch.bytes);
                let (dropped, awaiting) = self.settle(id, batch, verdicts);
                self.monitor.batch_settled(id);
                // Settled or not, these messages no longer occupy the pipeline; with
                // confirmations, once the broker answered for their ACKs.
                match self.confirmations.as_mut() {
                    Some(c) => self.credits.give_all(c.hold(id, awaiting, held)),
                    None => self.credits.give(held),
                }
                let _ = self.flush_kick.try_send(());
                dropped
            }
        }
    }

    /// How long to wait for the next event: `tick`, or less when a resend is due sooner.
    fn wait(&self, tick: Duration) -> Duration {
        let due = self.confirmations.as_ref().and_then(|c| c.next_due());
        due.map_or(tick, |at| {
            at.saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), tick)
        })
    }

    /// The stop's deadline is near and batches are still at the sink: they stay
    /// unacknowledged, and one on the consumer's last delivery (`max_deliver`) the broker
    /// delivers no more. With custody checkpoints each such message's gap is told now and the
    /// checkpoint thread cuts and ends at once ([`crate::sink::checkpoint::Feed::end_now`]):
    /// before, the stop ended with those listed nowhere and no last checkpoint (atk59). One
    /// the stuck write still stores before the exit is then stored and listed, as the audit
    /// shows it.
    fn give_up(&self, in_flight: &HashMap<BatchId, InFlight>) {
        let Some(feed) = &self.checkpoints else {
            return;
        };
        let current = self.generation.current();
        let last = self.hold.last_delivery();
        for batch in in_flight.values() {
            let given_up = batch
                .handles
                .iter()
                .filter(|h| h.generation == current && last.is_some_and(|l| h.delivery_count >= l));
            for h in given_up {
                if tell_abandoned(feed, &self.metrics, batch.origin.clone(), h.stream_sequence) {
                    log::warn!(
                        "stream {} sequence {}: still at the sink at the stop's deadline, on the \
                         consumer's last delivery ({}, its max_deliver): the broker delivers it \
                         no more; the last custody checkpoint lists it as a gap ({ABANDONED})",
                        PeerText::new(&batch.origin.0),
                        h.stream_sequence,
                        last.unwrap_or_default()
                    );
                }
            }
        }
        feed.end_now();
    }

    /// One message on the confirmations' inbox.
    fn on_answer(&mut self, msg: &nats::Message) {
        if let Some(c) = self.confirmations.as_mut() {
            self.credits.give_all(c.answered(msg));
        }
    }

    /// Sends again the ACKs whose answers are overdue.
    fn resend_due(&mut self) {
        let current = self.generation.current();
        if let Some(c) = self.confirmations.as_mut() {
            let freed = c.resend_due(&self.nc, current);
            self.credits.give_all(freed);
            let _ = self.flush_kick.try_send(());
        }
    }

    /// After the last outcome: waits a short while for the answers still due (one resend),
    /// then gives the rest up; the broker redelivers what they did not settle.
    fn finish_confirmations(&mut self, answers: &crossbeam_channel::Receiver<nats::Message>) {
        let Some(resend_after) = self.confirmations.as_ref().map(|c| c.resend_after()) else {
            return;
        };
        self.monitor.activity("waiting for ack confirmations");
        let until = Instant::now() + 2 * resend_after;
        while self.confirmations.as_ref().is_some_and(|c| c.is_waiting()) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if let Ok(msg) = answers.recv_timeout(left.min(resend_after / 4)) {
                self.on_answer(&msg);
            }
            self.resend_due();
        }
        if let Some(c) = self.confirmations.as_mut() {
            let freed = c.give_up_all();
            self.credits.give_all(freed);
        }
    }

    /// True while a batch in flight holds a handle of an older generation.
    fn holds_stale(&self, in_flight: &HashMap<BatchId, InFlight>) -> bool {
        let current = self.generation.current();
        in_flight
            .values()
            .any(|b| b.handles.iter().any(|h| h.generation != current))
    }

    /// Carries out one verdict per message of the current generation; returns how many
    /// handles of an older one were dropped, and how many ACKs await the broker's answer.
    fn settle(&mut self, id: BatchId, batch: InFlight, verdicts: Vec<Verdict>) -> (u64, usize) {
        if verdicts.len() != batch.handles.len() {
            log::error!(
                "verdict count {} does not match batch size {}; nothing acknowledged",
                verdicts.len(),
                batch.handles.len()
            );
            return (0, 0);
        }
        let current = self.generation.current();
        let (current_ones, stale): (Vec<_>, Vec<_>) = batch
            .handles
            .iter()
            .zip(verdicts)
            .zip(batch.families)
            .partition(|((h, _), _)| h.generation == current);
        let (rejected, others): (Vec<_>, Vec<_>) = current_ones
            .into_iter()
            .partition(|((_, v), _)| matches!(v, Verdict::Rejected(_)));
        let mut dlq_failed = false;
        let mut sent = Sent::default();
        let mut awaiting = 0;
        for ((handle, verdict), family) in others.into_iter().chain(rejected) {
            let verb = self.decide(handle, verdict, family, &mut dlq_failed);
            if verb == AckVerb::Ack {
                if let Some(c) = self.confirmations.as_mut() {
                    // Counted as acknowledged when the broker answers.
                    c.send(&self.nc, handle, family, id);
                    awaiting += 1;
                    continue;
                }
            }
            match broker::send_ack(&self.nc, handle, verb) {
                Ok(()) => {
                    if verb == AckVerb::Ack {
                        self.metrics
                            .add_family(family, crate::metrics::FamilyMetric::Acked, 1);
                    }
                    sent.count(verb);
                }
                // The broker redelivers after AckWait: the write was idempotent by key.
                Err(e) => log::warn!(
                    "broker: acknowledgement of stream sequence {} not sent: {e}",
                    handle.stream_sequence
                ),
            }
        }
        sent.publish(&self.metrics.counters);
        self.monitor.mark_ack();
        (stale.len() as u64, awaiting)
    }

    /// The verb for one message of a batch, with the bookkeeping of its place: a NAK of a
    /// message not written is one the broker may deliver no more ([`Self::abandoned`]); a
    /// settled one leaves [`Retried`].
    fn decide(
        &mut self,
        handle: &AckHandle,
        verdict: Verdict,
        family: Option<usize>,
        dlq_failed: &mut bool,
    ) -> AckVerb {
        let at = match &verdict {
            Verdict::Unwritten(_, at) => Some(Arc::clone(at)),
            Verdict::Rejected(f) => Some(Arc::clone(&f.at)),
            Verdict::Written(_) => None,
        };
        let verb = match verdict {
            Verdict::Written(
                WriteOutcome::Durable | WriteOutcome::AlreadyDurable | WriteOutcome::Spooled,
            ) => AckVerb::Ack,
            Verdict::Written(WriteOutcome::Transient(e)) | Verdict::Unwritten(e, _) => {
                log::debug!(
                    "stream sequence {}: not written, will retry: {}",
                    handle.stream_sequence,
                    error_chain(&e)
                );
                AckVerb::Nak(self.nak_backoff.delay(handle.delivery_count as u32))
            }
            Verdict::Written(WriteOutcome::Permanent(e)) => {
                let reason = format!("{}: {}", e.class.code(), error_chain(&e));
                self.permanent(handle, family, &reason, None)
            }
            Verdict::Rejected(f) => self.rejected(handle, family, &f, dlq_failed),
        };
        match (verb, &at) {
            (AckVerb::Nak(_), Some(at)) => self.abandoned(handle, at),
            (AckVerb::Ack | AckVerb::Term, _) => self.retried.settled(handle.stream_sequence),
            _ => {}
        }
        verb
    }

    /// A message that retrying will not fix: counted, logged without payload, and left to the
    /// broker's redelivery limits (NAK with backoff) or terminated at `max_deliveries`; with
    /// custody checkpoints (`at` is the message's place) only once a stored checkpoint lists
    /// it as a gap ([`Feed::gap_signed`]: sign first, terminate last), NAKed until then.
    ///
    /// Bounded and visible: the NAK delay grows with the delivery count, and the warning is
    /// logged on deliveries 1, 2, 4, 8, ... only (a message redelivered for a day logs about
    /// a dozen lines, not thousands); `messages_failed_total` counts every delivery.
    ///
    /// [`Feed::gap_signed`]: crate::sink::checkpoint::Feed::gap_signed
    fn permanent(
        &self,
        handle: &AckHandle,
        family: Option<usize>,
        reason: &str,
        at: Option<&(crate::sink::checkpoint::Origin, u64)>,
    ) -> AckVerb {
        Metrics::add(&self.metrics.counters.messages_failed_total, 1);
        self.metrics
            .add_family(family, crate::metrics::FamilyMetric::Failed, 1);
        let limit_reached =
            crate::config::terminated_at(self.max_deliveries, handle.delivery_count);
        if limit_reached && self.signed(at, handle.delivery_count) {
            log::error!(
                "stream sequence {} failed permanently on delivery {} ({reason}); terminated \
                 (delivery.max_deliveries reached)",
                handle.stream_sequence,
                handle.delivery_count
            );
            return AckVerb::Term;
        }
        if handle.delivery_count.is_power_of_two() {
            let until = match (limit_reached, self.max_deliveries) {
                (true, _) => " until a stored custody checkpoint lists it as a gap, then \
                              terminated"
                    .to_string(),
                (false, Some(max)) => format!(" until delivery {max}"),
                (false, None) => {
                    " (no delivery.max_deliveries and no dead_letter: without end)".to_string()
                }
            };
            log::warn!(
                "stream sequence {} failed permanently on delivery {} ({reason}); not \
                 acknowledged, redelivered with backoff{until}; logged again on delivery {}",
                handle.stream_sequence,
                handle.delivery_count,
                handle.delivery_count * 2
            );
        }
        AckVerb::Nak(self.nak_backoff.delay(handle.delivery_count as u32))
    }

    /// A permanent pre-sink failure. With a DLQ: publish the record, and ACK only once the
    /// broker confirmed it; a failed publish leaves the message unacknowledged (NAK with
    /// backoff, never TERM: the record is not stored anywhere yet). Without a DLQ: see
    /// [`Self::permanent`].
    fn rejected(
        &self,
        handle: &AckHandle,
        family: Option<usize>,
        failure: &Rejection,
        dlq_failed: &mut bool,
    ) -> AckVerb {
        let (Some(dlq), Some(record)) = (&self.dlq, &failure.dead_letter) else {
            let terminal = failure.gap != GapReason::Terminated
                || crate::config::terminated_at(self.max_deliveries, handle.delivery_count);
            if terminal {
                self.tell_gap(failure);
            }
            return self.permanent(handle, family, &failure.reason, Some(&failure.at));
        };
        let c = &self.metrics.counters;
        Metrics::add(&c.messages_failed_total, 1);
        self.metrics
            .add_family(family, crate::metrics::FamilyMetric::Failed, 1);
        let retry = AckVerb::Nak(self.nak_backoff.delay(handle.delivery_count as u32));
        if *dlq_failed {
            log::warn!(
                "stream sequence {}: permanent pre-sink failure ({}); dlq publish skipped after \
                 an earlier failure in this batch; not acknowledged",
                handle.stream_sequence,
                failure.reason
            );
            return retry;
        }
        if let Some(ack) = self.confirmed_before(&failure.at, handle.delivery_count) {
            let signed = self
                .checkpoints
                .as_ref()
                .is_some_and(|f| f.gap_signed(&failure.at.0, failure.at.1));
            if !signed {
                // Told again while it waits: the thread remembers the newest 65,536 signed
                // gaps, and one pushed out by a flood of others would never read as signed
                // (atk57 finding 3); and when it is settled unsigned (a rescan, the budget,
                // the last delivery), since a tell dropped before would leave it listed
                // nowhere (atk58). A gap pending or remembered is not listed twice.
                self.tell_gap(failure);
            }
            return if ack { AckVerb::Ack } else { retry };
        }
        self.monitor.activity("publishing to the dead-letter queue");
        match dlq.publish(record) {
            Ok(ack) => self.dead_lettered(handle, family, failure, &ack, retry),
            Err(e) => {
                *dlq_failed = true;
                Metrics::add(&c.dlq_publish_errors_total, 1);
                log::error!(
                    "stream sequence {}: permanent pre-sink failure ({}); {e}; not acknowledged",
                    handle.stream_sequence,
                    failure.reason
                );
                retry
            }
        }
    }

    /// A refused message's dead letter was stored (`ack`): counted once, its gap told, and
    /// acknowledged once a stored checkpoint lists it (else `retry`: it comes back).
    fn dead_lettered(
        &self,
        handle: &AckHandle,
        family: Option<usize>,
        failure: &Rejection,
        ack: &PubAck,
        retry: AckVerb,
    ) -> AckVerb {
        // With checkpoints the message comes back until its gap is signed, and its
        // dead letter is published again (the stream drops the copy): counted once.
        if !(ack.duplicate && self.checkpoints.is_some()) {
            Metrics::add(&self.metrics.counters.messages_dlq_total, 1);
            self.metrics
                .add_family(family, crate::metrics::FamilyMetric::Dlq, 1);
            log::warn!(
                "stream sequence {}: permanent pre-sink failure ({}); dead-lettered as \
                 {} sequence {}{}",
                handle.stream_sequence,
                failure.reason,
                PeerText::new(&ack.stream),
                ack.sequence,
                if ack.duplicate {
                    " (already there from an earlier delivery)"
                } else {
                    ""
                }
            );
        }
        self.tell_gap(failure);
        if self.signed(Some(&failure.at), handle.delivery_count) {
            AckVerb::Ack
        } else {
            log::debug!(
                "stream sequence {}: dead-lettered; acknowledged once a custody \
                 checkpoint lists it as a gap",
                handle.stream_sequence
            );
            retry
        }
    }

    /// With custody checkpoints, for a message whose dead letter was confirmed before: held
    /// for its checkpoint in this run (not published on each redelivery: atk53c finding 3), or
    /// listed as `dead_lettered` by a stored checkpoint (its gap is told only once the dead
    /// letter is confirmed; before a restart: published again it was a second copy past the
    /// duplicate window, atk54 finding 6). `Some(true)`: acknowledge it; `Some(false)`: it
    /// waits for its checkpoint; `None`: publish its dead letter.
    fn confirmed_before(
        &self,
        at: &(crate::sink::checkpoint::Origin, u64),
        delivery: u64,
    ) -> Option<bool> {
        let feed = self.checkpoints.as_ref()?;
        if self.hold.holds(at) {
            return Some(self.signed(Some(at), delivery));
        }
        feed.gap_dead_lettered(&at.0, at.1).then_some(true)
    }

    /// A refused message is a runner-caused gap of the custody checkpoints, told once it is
    /// given up on: with a DLQ once its dead letter was confirmed (a failed publish is NAKed
    /// and no gap yet); without one, refused before the sink, when it is refused (NAKed until
    /// `+TERM`; one stored later after all is signed as well); a permanent sink failure
    /// without one at `delivery.max_deliveries`. Its `+ACK` or `+TERM` waits until a stored
    /// checkpoint lists it ([`Self::signed`]).
    fn tell_gap(&self, f: &Rejection) {
        if let (false, Some(feed)) = (f.retry, &self.checkpoints) {
            feed.send(crate::sink::checkpoint::Event::Gap(
                f.at.0.clone(),
                f.at.1,
                f.gap.code(),
            ));
        }
    }

    /// Sign first, settle last: true without custody checkpoints, or once a stored checkpoint
    /// lists `at` as a gap; false while it waits (NAKed, counted); true again, unsigned, when
    /// the hold is full (counted and logged: `gap_hold.rs`). A message given up on is
    /// acknowledged (its dead letter confirmed) or terminated only then, so a kill -9 finds it
    /// either listed or still the broker's to deliver again; nothing is read back at the start.
    fn signed(&self, at: Option<&(crate::sink::checkpoint::Origin, u64)>, delivery: u64) -> bool {
        let (Some(feed), Some(at)) = (&self.checkpoints, at) else {
            return true;
        };
        let c = &self.metrics.counters;
        match self.hold.decide(feed, at, delivery) {
            Settle::Now => true,
            Settle::Last | Settle::Rescanning => {
                // Warned of once at the start (`Shared::start_ack`), or the thread is reading
                // the store back (its log says so).
                Metrics::add(&c.checkpoint_gaps_settled_unsigned_total, 1);
                true
            }
            Settle::Wait => {
                Metrics::add(&c.checkpoint_gap_waits_total, 1);
                false
            }
            Settle::Unsigned => {
                Metrics::add(&c.checkpoint_gaps_settled_unsigned_total, 1);
                log::warn!(
                    "stream {} sequence {}: given up on and settled before a custody \
                     checkpoint listed it as a gap: {} messages wait for one already (the \
                     checkpoint store is failing); this line is its only record",
                    PeerText::new(&at.0 .0),
                    at.1,
                    self.hold.budget()
                );
                true
            }
        }
    }

    /// A NAK on the consumer's own last delivery (its `max_deliver`, as the broker last
    /// reported it) is never answered: the broker delivers the message no more and nothing
    /// stores it. With custody checkpoints its gap is told ([`ABANDONED`]; a gap told
    /// already keeps its first reason) and listed by the next cut, so the audit does not call
    /// the chain complete without it (atk55 finding 2); counted as settled unsigned, since
    /// there is no later delivery to hold it for.
    fn abandoned(&mut self, handle: &AckHandle, at: &(crate::sink::checkpoint::Origin, u64)) {
        let Some(feed) = &self.checkpoints else {
            return;
        };
        let last = match self.hold.last_delivery() {
            Some(last) if handle.delivery_count >= last => last,
            _ => {
                // Comes back, unless the limit is lowered under it meanwhile (`on_limit`).
                self.retried.nakked(at, handle.delivery_count);
                return;
            }
        };
        self.retried.settled(at.1);
        if !tell_abandoned(feed, &self.metrics, at.0.clone(), at.1) {
            return;
        }
        log::warn!(
            "stream {} sequence {}: not delivered on the consumer's last delivery ({last}, its \
             max_deliver): the broker delivers it no more; the next custody checkpoint lists \
             it as a gap (for its refusal when refused, else {ABANDONED})",
            PeerText::new(&at.0 .0),
            at.1
        );
    }

    /// With custody checkpoints: when the consumer's `max_deliver` was lowered (the watch
    /// read it), each message NAKed unwritten on a delivery at or past the new limit is one the
    /// broker delivers no more, and no advisory says so: listed as a gap ([`ABANDONED`];
    /// atk56 finding 2).
    fn on_limit(&mut self) {
        let Some(feed) = &self.checkpoints else {
            return;
        };
        let limit = self.hold.last_delivery();
        for (origin, seq) in self.retried.lowered(limit) {
            if !tell_abandoned(feed, &self.metrics, origin.clone(), seq) {
                continue;
            }
            log::warn!(
                "stream {} sequence {seq}: NAKed unwritten on a delivery at or past the \
                 consumer's max_deliver, lowered to {}: the broker delivers it no more; the \
                 next custody checkpoint lists it as a gap ({ABANDONED})",
                PeerText::new(&origin.0),
                limit.unwrap_or_default()
            );
        }
    }

    /// Sends in-progress acks for batches held longer than `progress_after`.
    fn keep_alive(&self, in_flight: &mut HashMap<BatchId, InFlight>) {
        let now = Instant::now();
        let current = self.generation.current();
        for batch in in_flight.values_mut() {
            if now.duration_since(batch.last_progress) < self.progress_after {
                continue;
            }
            for h in batch.handles.iter().filter(|h| h.generation == current) {
                if broker::send_ack(&self.nc, h, AckVerb::InProgress).is_ok() {
                    Metrics::add(&self.metrics.counters.messages_in_progress_total, 1);
                }
            }
            batch.last_progress = now;
        }
    }
}

/// The verbs one batch's settlement sent, added to the shared counters once per batch.
#[derive(Default)]
struct Sent {
    acked: u64,
    nacked: u64,
    terminated: u64,
    in_progress: u64,
}

impl Sent {
    fn count(&mut self, verb: AckVerb) {
        match verb {
            AckVerb::Ack => self.acked += 1,
            AckVerb::Nak(_) => self.nacked += 1,
            AckVerb::Term => self.terminated += 1,
            AckVerb::InProgress => self.in_progress += 1,
        }
    }

    fn publish(&self, c: &crate::metrics::Counters) {
        Metrics::add(&c.messages_acked_total, self.acked);
        Metrics::add(&c.messages_nacked_total, self.nacked);
        Metrics::add(&c.messages_terminated_total, self.terminated);
        Metrics::add(&c.messages_in_progress_total, self.in_progress);
    }
}

/// Says once, for all the batches in flight then, why their handles were not settled.
fn log_dropped(count: u64) {
    log::warn!(
        "broker: {count} deliveries made before the consumer was created again (with its \
         stream, when \"stream ... was created again\" is logged) were not acknowledged: their \
         ack subjects would settle the new consumer's messages of the same stream sequences; \
         the old consumer and its pending messages are gone, and what the new one holds is \
         delivered anew"
    );
}

fn max_delivery(handles: &[AckHandle]) -> u64 {
    handles.iter().map(|h| h.delivery_count).max().unwrap_or(0)
}
