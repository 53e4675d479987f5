//! `svc-normalize`: raw deliveries in, envelopes (or pre-sink verdicts) out. No I/O.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::{Monitor, PreSinkFailure, Prepared, PreparedBatch, RawBatch};
use crate::config::RuntimeConfig;
use crate::envelope::{normalize, parse_rfc3339_nanos, EnvelopeConfig, RawMessage};
use crate::metrics::Metrics;

/// Everything needed to turn one delivery into an envelope. Later stages of preparation
/// (message metadata, security labels) hang off this struct.
pub struct Normalizer {
    envelope: EnvelopeConfig,
    metrics: Arc<Metrics>,
}

impl Normalizer {
    pub fn new(cfg: &RuntimeConfig, metrics: Arc<Metrics>) -> Normalizer {
        Normalizer {
            envelope: cfg.envelope.clone(),
            metrics,
        }
    }

    /// Builds the envelope of one message and records its freshness.
    pub fn prepare(
        &self,
        raw: &RawMessage,
        received_unix_nanos: i128,
    ) -> Result<Prepared, PreSinkFailure> {
        let (envelope, fresh) = normalize(raw, received_unix_nanos, &self.envelope);
        let c = &self.metrics.counters;
        if let Some(age) = fresh.age_seconds {
            self.metrics.observe("event_age_at_receive_seconds", age);
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
        let source_unix_nanos = envelope
            .metadata
            .event_time
            .as_deref()
            .and_then(parse_rfc3339_nanos)
            .or(raw.published_unix_nanos);
        Ok(Prepared {
            family: self.metrics.family_of(&envelope.subject),
            envelope,
            source_unix_nanos,
        })
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
        let items = batch
            .messages
            .iter()
            .map(|(raw, received)| {
                normalizer
                    .prepare(raw, *received)
                    .map_err(|f| (f, normalizer.metrics.family_of(&raw.subject)))
            })
            .collect::<Vec<_>>();
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
