//! `svc-ack`: the only thread that acknowledges. It holds every in-flight batch's ack handles,
//! settles each batch when its outcome arrives, keeps long batches alive with in-progress
//! acks, and returns the batch's credit to `svc-fetch`.
//!
//! Invariant: `AckVerb::Ack` is sent only for a message whose verdict is durable.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{AckMsg, BatchId, Monitor, Verdict};
use crate::backoff::Backoff;
use crate::broker::{self, AckHandle, AckVerb, Connection};
use crate::metrics::Metrics;
use crate::sink::WriteOutcome;

pub struct AckWorker {
    pub nc: Connection,
    pub rx: Receiver<AckMsg>,
    pub credit: Sender<()>,
    pub metrics: Arc<Metrics>,
    pub monitor: Arc<Monitor>,
    pub nak_backoff: Backoff,
    pub max_deliveries: Option<u64>,
    /// A batch older than this (since fetch or its last in-progress ack) gets in-progress acks.
    pub progress_after: Duration,
}

struct InFlight {
    handles: Vec<AckHandle>,
    families: Vec<Option<usize>>,
    last_progress: Instant,
}

impl AckWorker {
    pub fn run(self) {
        let mut in_flight: HashMap<BatchId, InFlight> = HashMap::new();
        let tick =
            (self.progress_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            self.monitor.activity("waiting for outcomes");
            match self.rx.recv_timeout(tick) {
                Ok(AckMsg::Register {
                    id,
                    handles,
                    families,
                }) => {
                    self.monitor
                        .batch_started(id, handles.len(), max_delivery(&handles));
                    in_flight.insert(
                        id,
                        InFlight {
                            handles,
                            families,
                            last_progress: Instant::now(),
                        },
                    );
                }
                Ok(AckMsg::Outcome { id, verdicts }) => match in_flight.remove(&id) {
                    Some(batch) => {
                        self.monitor.activity("settling batch");
                        self.settle(batch, verdicts);
                        self.monitor.batch_settled(id);
                        let _ = self.credit.send(());
                    }
                    None => log::error!("outcome for unknown batch {id}: nothing acknowledged"),
                },
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.keep_alive(&mut in_flight);
        }
        if !in_flight.is_empty() {
            log::warn!(
                "{} batches ended without an outcome; left unacknowledged for redelivery",
                in_flight.len()
            );
        }
        self.monitor.activity("stopped");
    }

    /// Carries out one verdict per message.
    fn settle(&self, batch: InFlight, verdicts: Vec<Verdict>) {
        let c = &self.metrics.counters;
        if verdicts.len() != batch.handles.len() {
            log::error!(
                "verdict count {} does not match batch size {}; nothing acknowledged",
                verdicts.len(),
                batch.handles.len()
            );
            return;
        }
        for ((handle, verdict), family) in batch.handles.iter().zip(verdicts).zip(batch.families) {
            let verb = match verdict {
                Verdict::Written(WriteOutcome::Durable | WriteOutcome::AlreadyDurable) => {
                    AckVerb::Ack
                }
                Verdict::Written(WriteOutcome::Transient(e)) => {
                    log::debug!(
                        "stream sequence {}: not written, will retry: {e}",
                        handle.stream_sequence
                    );
                    AckVerb::Nak(self.nak_backoff.delay(handle.delivery_count as u32))
                }
                Verdict::Written(WriteOutcome::Permanent(e)) => {
                    self.permanent(handle, family, &e.to_string())
                }
                Verdict::Rejected(f) => self.permanent(handle, family, &f.reason),
            };
            match broker::send_ack(&self.nc, handle, verb) {
                Ok(()) => {
                    let counter = match verb {
                        AckVerb::Ack => {
                            self.metrics.add_family(family, "messages_acked_total", 1);
                            &c.messages_acked_total
                        }
                        AckVerb::Nak(_) => &c.messages_nacked_total,
                        AckVerb::Term => &c.messages_terminated_total,
                        AckVerb::InProgress => &c.messages_in_progress_total,
                    };
                    Metrics::add(counter, 1);
                }
                // The broker redelivers after AckWait: the write was idempotent by key.
                Err(e) => log::warn!(
                    "broker: acknowledgement of stream sequence {} not sent: {e}",
                    handle.stream_sequence
                ),
            }
        }
        self.monitor.mark_ack();
    }

    /// A message that retrying will not fix: counted, logged without payload, and left to the
    /// broker's redelivery limits (NAK with backoff) or terminated at `max_deliveries`.
    fn permanent(&self, handle: &AckHandle, family: Option<usize>, reason: &str) -> AckVerb {
        Metrics::add(&self.metrics.counters.messages_failed_total, 1);
        self.metrics.add_family(family, "messages_failed_total", 1);
        let limit_reached = self
            .max_deliveries
            .is_some_and(|max| handle.delivery_count >= max);
        if limit_reached {
            log::error!(
                "stream sequence {} failed permanently on delivery {} ({reason}); terminated \
                 (delivery.max_deliveries reached)",
                handle.stream_sequence,
                handle.delivery_count
            );
            AckVerb::Term
        } else {
            log::warn!(
                "stream sequence {} failed permanently on delivery {} ({reason}); not acknowledged",
                handle.stream_sequence,
                handle.delivery_count
            );
            AckVerb::Nak(self.nak_backoff.delay(handle.delivery_count as u32))
        }
    }

    /// Sends in-progress acks for batches held longer than `progress_after`.
    fn keep_alive(&self, in_flight: &mut HashMap<BatchId, InFlight>) {
        let now = Instant::now();
        for batch in in_flight.values_mut() {
            if now.duration_since(batch.last_progress) < self.progress_after {
                continue;
            }
            for h in &batch.handles {
                if broker::send_ack(&self.nc, h, AckVerb::InProgress).is_ok() {
                    Metrics::add(&self.metrics.counters.messages_in_progress_total, 1);
                }
            }
            batch.last_progress = now;
        }
    }
}

fn max_delivery(handles: &[AckHandle]) -> u64 {
    handles.iter().map(|h| h.delivery_count).max().unwrap_or(0)
}
