//! `svc-normalize`: raw deliveries in, envelopes (or pre-sink verdicts) out. No I/O.
//!
//! Per message: the envelope (`normalize`), then the message metadata (`message_metadata`:
//! priority, classification, labels), then the security label profile (`security_labels`).
//! A metadata or profile failure is a permanent pre-sink failure: the message does not reach
//! the sink; its verdict carries a value-free reason and, when a DLQ is configured, the
//! sanitized DLQ record for `svc-ack` to publish. Other messages of the batch are unaffected.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::{Monitor, Prepared, PreparedBatch, RawBatch, Rejection};
use crate::broker::dead_letter::{DeadLetter, DeadLetterConfig, Failure};
use crate::config::RuntimeConfig;
use crate::message::envelope::{normalize, now_unix_nanos, EnvelopeConfig, RawMessage};
use crate::message::labels::{self, SecurityLabelsConfig};
use crate::message::metadata::MessageMetadataConfig;
use crate::metrics::{Metrics, Summary};

/// Everything needed to turn one delivery into an envelope.
pub struct Normalizer {
    envelope: EnvelopeConfig,
    message_metadata: MessageMetadataConfig,
    security_labels: SecurityLabelsConfig,
    dead_letter: DeadLetterConfig,
    metrics: Arc<Metrics>,
}

impl Normalizer {
    pub fn new(cfg: &RuntimeConfig, metrics: Arc<Metrics>) -> Normalizer {
        Normalizer {
            envelope: cfg.envelope.clone(),
            message_metadata: cfg.message_metadata.clone(),
            security_labels: cfg.security_labels.clone(),
            dead_letter: cfg.dead_letter.clone(),
            metrics,
        }
    }

    /// Builds the envelope of one message and records its freshness (the age into `ages`,
    /// which the caller hands to the metrics once per batch).
    pub fn prepare(
        &self,
        raw: &RawMessage,
        received_unix_nanos: i128,
        family: Option<usize>,
        ages: &mut Summary,
    ) -> Result<Prepared, Rejection> {
        let (mut envelope, fresh) = normalize(raw, received_unix_nanos, &self.envelope);
        let c = &self.metrics.counters;
        if let Some(age) = fresh.age_seconds {
            ages.observe(age);
        }
        for (flag, counter) in [
            (fresh.stale, &c.events_stale_at_receive_total),
            (
                fresh.missing_publisher_timestamp,
                &c.events_missing_publisher_timestamp_total,
            ),
            (
                fresh.malformed_timestamp,
                &c.events_malformed_timestamp_total,
            ),
            (fresh.clock_skew, &c.events_source_clock_skew_total),
        ] {
            if flag {
                Metrics::add(counter, 1);
            }
        }
        let meta = self
            .message_metadata
            .resolve(raw)
            .map_err(|e| self.reject(raw, Failure::from(&e)))?;
        if !meta.fell_back.is_empty() {
            let fields: Vec<&str> = meta.fell_back.iter().map(|f| f.as_str()).collect();
            log::warn!(
                "stream sequence {}: invalid message_metadata header for {} replaced by the \
                 rule or default value (on_invalid = use_default)",
                raw.stream_sequence,
                fields.join(", ")
            );
        }
        let profile = self
            .security_labels
            .resolve(raw, &meta)
            .map_err(|r| self.reject(raw, Failure::from(&r)))?;
        meta.apply_to(&mut envelope);
        labels::apply_to(&mut envelope, profile);
        Ok(Prepared {
            family,
            envelope,
            source_unix_nanos: fresh.source_unix_nanos,
        })
    }

    /// The verdict of a permanent pre-sink failure, with its DLQ record when a DLQ is on.
    fn reject(&self, raw: &RawMessage, failure: Failure) -> Rejection {
        Rejection {
            dead_letter: self
                .dead_letter
                .enabled
                .then(|| DeadLetter::build(raw, &failure, now_unix_nanos(), &self.dead_letter)),
            reason: failure.message,
        }
    }
}

pub fn run(
    normalizer: Normalizer,
    rx: Receiver<RawBatch>,
    tx: Sender<PreparedBatch>,
    monitor: Arc<Monitor>,
) {
    loop {
        monitor.activity("waiting for batches");
        let Ok(batch) = rx.recv() else { break };
        monitor.activity("normalizing");
        let mut ages = Summary::default();
        let items = batch
            .messages
            .iter()
            .zip(&batch.families)
            .map(|((raw, received), family)| {
                normalizer
                    .prepare(raw, *received, *family, &mut ages)
                    .map_err(|f| (f, *family))
            })
            .collect::<Vec<_>>();
        normalizer
            .metrics
            .observe_all("event_age_at_receive_seconds", &ages);
        let prepared = items.iter().filter(|i| i.is_ok()).count() as u64;
        Metrics::add(
            &normalizer.metrics.counters.messages_prepared_total,
            prepared,
        );
        monitor.activity("handing batch to sink workers");
        if tx
            .send(PreparedBatch {
                id: batch.id,
                items,
            })
            .is_err()
        {
            log::error!("sink workers stopped unexpectedly; svc-normalize exits");
            break;
        }
    }
    monitor.activity("stopped");
}
