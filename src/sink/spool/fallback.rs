//! The two sinks the spool gives: [`FallbackSink`], between the sink workers and the real
//! sink, and [`SpoolSink`] (`sink.type` = `spool`), which only appends.
//!
//! Fallback order rule: while the spool holds records, every batch is appended behind them
//! (the drain delivers oldest first), so the sink sees the stream's order. Only when the
//! spool is empty does a batch go to the sink directly; a batch whose transient failure has
//! lasted `after_seconds` goes to the spool instead of back to the broker. Permanent
//! failures are never spooled: they stay with the pipeline's DLQ path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::drain::MODE_SPOOLING;
use super::store::{AppendError, Spool};
use crate::message::envelope::Envelope;
use crate::metrics::Metrics;
use crate::sink::{Sink, SinkError, WriteOutcome};

/// Whether the spool refuses batches now (full, or a failing disk): logged once when an
/// outage of the spool begins (warn) and once when it takes batches again (info), not on every
/// batch the broker redelivers; `spool_full_refusals_total` and `messages_nacked_total` count
/// every refused batch.
#[derive(Default)]
struct Refusing(AtomicBool);

impl Refusing {
    /// Notes an append's result, logging a change.
    fn note(&self, path: &std::path::Path, result: &Result<(), AppendError>, left: &str) {
        match result {
            Err(e) if !self.0.swap(true, Ordering::Relaxed) => log::warn!(
                "{e}; {left} (logged once until the spool takes batches again; \
                 spool_full_refusals_total and messages_nacked_total count the refusals)"
            ),
            Err(_) => {}
            Ok(()) => self.ended(path),
        }
    }

    /// The spool took a batch, or is empty and the sink takes batches directly again.
    fn ended(&self, path: &std::path::Path) {
        if self.0.swap(false, Ordering::Relaxed) {
            log::info!("spool {}: takes batches again", path.display());
        }
    }
}

/// The outcome of every envelope of a batch given to the spool: `ok` when appended
/// (`Spooled` for the fallback spool, whose drain tells custody checkpoints; `Durable` for
/// the spool as the sink).
fn spooled(n: usize, result: Result<(), AppendError>, ok: WriteOutcome) -> Vec<WriteOutcome> {
    match result {
        Ok(()) => vec![ok; n],
        Err(e) => vec![WriteOutcome::Transient(SinkError::new("spool", e.to_string())); n],
    }
}

const LEFT_TO_BROKER: &str = "the batch is left to the broker (redelivered later)";

/// A sink with a spool behind it (the top-level `spool` block).
pub struct FallbackSink {
    inner: Arc<dyn Sink>,
    spool: Arc<Spool>,
    metrics: Arc<Metrics>,
    /// When the current run of transient failures began.
    failing_since: Mutex<Option<Instant>>,
    refusing: Refusing,
}

impl FallbackSink {
    pub fn new(inner: Arc<dyn Sink>, spool: Arc<Spool>, metrics: Arc<Metrics>) -> FallbackSink {
        FallbackSink {
            inner,
            spool,
            metrics,
            failing_since: Mutex::new(None),
            refusing: Refusing::default(),
        }
    }

    fn to_spool<'a>(
        &self,
        envelopes: impl IntoIterator<Item = &'a Envelope>,
    ) -> Result<(), AppendError> {
        let result = self.spool.append(envelopes);
        self.refusing
            .note(self.spool.path(), &result, LEFT_TO_BROKER);
        if result.is_ok() {
            // The drain thread sets draining/direct as it makes progress.
            let _ = self.metrics.gauges.spool_mode.compare_exchange(
                super::drain::MODE_DIRECT,
                MODE_SPOOLING,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        result
    }
}

impl Sink for FallbackSink {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        if self.spool.records() > 0 {
            return spooled(batch.len(), self.to_spool(batch), WriteOutcome::Spooled);
        }
        let mut outcomes = self.inner.write_batch(batch);
        let transient: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| matches!(o, WriteOutcome::Transient(_)))
            .map(|(i, _)| i)
            .collect();
        let mut since = self.failing_since.lock().unwrap_or_else(|p| p.into_inner());
        if transient.is_empty() || outcomes.len() != batch.len() {
            *since = None;
            if transient.is_empty() {
                self.refusing.ended(self.spool.path());
            }
            return outcomes;
        }
        let started = *since.get_or_insert_with(Instant::now);
        drop(since);
        if started.elapsed() < self.spool.config().after {
            return outcomes;
        }
        // A refusal is logged once per outage of the spool by `to_spool`.
        if self.to_spool(transient.iter().map(|&i| &batch[i])).is_ok() {
            log::info!(
                "sink {} failing for {:.0} s: {} messages committed to the spool {}",
                self.inner.kind(),
                started.elapsed().as_secs_f64(),
                transient.len(),
                self.spool.path().display()
            );
            for i in transient {
                outcomes[i] = WriteOutcome::Spooled;
            }
        }
        outcomes
    }

    fn check(&self) -> Result<String, SinkError> {
        self.inner.check()
    }
}

/// `sink.type` = `spool`: every batch is appended; `svc spool drain` delivers later.
pub struct SpoolSink {
    spool: Arc<Spool>,
    refusing: Refusing,
}

impl SpoolSink {
    pub fn new(spool: Arc<Spool>) -> SpoolSink {
        SpoolSink {
            spool,
            refusing: Refusing::default(),
        }
    }
}

impl Sink for SpoolSink {
    fn kind(&self) -> &'static str {
        "spool"
    }

    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        let result = self.spool.append(batch);
        self.refusing
            .note(self.spool.path(), &result, LEFT_TO_BROKER);
        spooled(batch.len(), result, WriteOutcome::Durable)
    }

    fn check(&self) -> Result<String, SinkError> {
        Ok(format!(
            "spool {} open and locked, {} records waiting",
            self.spool.path().display(),
            self.spool.records()
        ))
    }
}
