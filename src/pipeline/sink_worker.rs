//! `svc-sink-N`: calls `Sink::write_batch` and reports one verdict per message to `svc-ack`.
//!
//! A permanent outcome becomes a DLQ verdict here when a DLQ is on (the worker has the
//! envelope the record is built from; `svc-ack` only has ack handles).

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::lanes::write_by_lane;
use super::{AckMsg, Monitor, PreparedBatch, Rejection, Verdict};
use crate::broker::dead_letter::{DeadLetter, DeadLetterConfig};
use crate::config::lanes::PriorityLanes;
use crate::message::envelope::{now_unix_nanos, Envelope};
use crate::message::protection::custody::public_digest;
use crate::metrics::{now_epoch_seconds, Metrics, Summary};
use crate::sink::checkpoint::{Event, Feed};
use crate::sink::{Sink, SinkError, WriteOutcome};
use crate::text::log_budget::LogBudget;

pub struct SinkWorker {
    pub name: String,
    pub rx: Receiver<PreparedBatch>,
    pub tx: Sender<AckMsg>,
    pub sink: Arc<dyn Sink>,
    pub metrics: Arc<Metrics>,
    pub monitor: Arc<Monitor>,
    /// The DLQ settings when `dead_letter.enabled`.
    pub dead_letter: Option<Arc<DeadLetterConfig>>,
    /// `delivery.priority_lanes`: the batch goes to the sink lane by lane.
    pub lanes: Option<Arc<PriorityLanes>>,
    /// Batch failure lines logged lately (a few per window).
    pub failures_logged: RefCell<LogBudget>,
    /// `custody.checkpoints`: where committed records are told (gaps: `svc-ack`).
    pub checkpoints: Option<Arc<Feed>>,
}

/// After the batch is durable: a record written now to the checkpoint thread (never waiting
/// on it). A `Rejected` one (refused before the sink, or a permanent sink failure, dead-lettered
/// or not) is told by `svc-ack` as a gap once it is given up on (its dead letter confirmed, or
/// at `delivery.max_deliveries` without a DLQ; a failed DLQ publish is NAKed, not a gap).
/// `AlreadyDurable` records were told when first written (or are found again by the thread's
/// scan after a restart); `Spooled` ones (the fallback spool) are told by the spool's drain
/// once the sink holds them.
fn tell_checkpoint(feed: &Feed, v: &Verdict, env: Option<&Envelope>) {
    if let (Verdict::Written(WriteOutcome::Durable), Some(env)) = (v, env) {
        if let Some(d) = public_digest(env) {
            let origin = (Arc::clone(&env.stream), Arc::clone(&env.stream_incarnation));
            feed.send(Event::Committed(origin, env.stream_sequence, d));
        }
    }
}

/// Says how many failure lines the budget held back since the last one logged.
fn suppressed_note(suppressed: u64) -> String {
    match suppressed {
        0 => String::new(),
        n => format!(" ({n} more failed batches not logged since the last such line)"),
    }
}

/// One batch as the sink worker holds it: the envelopes for the sink, what the metrics
/// need of each, and one verdict per message (`None` marks a message whose verdict the sink
/// decides, in order).
struct Split {
    envelopes: Vec<Envelope>,
    /// Source time (Unix ns) and subject family of each envelope.
    meta: Vec<(Option<i128>, Option<usize>)>,
    verdicts: Vec<Option<Verdict>>,
}

impl Split {
    fn new(items: Vec<Result<super::Prepared, (Rejection, Option<usize>)>>) -> Split {
        let mut envelopes = Vec::with_capacity(items.len());
        let mut meta = Vec::with_capacity(items.len());
        let mut verdicts: Vec<Option<Verdict>> = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Ok(p) => {
                    meta.push((p.source_unix_nanos, p.family));
                    envelopes.push(p.envelope);
                    verdicts.push(None);
                }
                Err((failure, _)) if failure.retry => verdicts.push(Some(Verdict::Unwritten(
                    SinkError::new("pre-sink", failure.reason),
                    failure.at,
                ))),
                Err((failure, _)) => verdicts.push(Some(Verdict::Rejected(failure))),
            }
        }
        Split {
            envelopes,
            meta,
            verdicts,
        }
    }
}

impl SinkWorker {
    pub fn run(self) {
        loop {
            self.monitor.activity("waiting for batches");
            let Ok(batch) = self.rx.recv() else { break };
            let id = batch.id;
            let verdicts = self.write(batch);
            // Capacity covers every batch in flight: this send does not block for long.
            if self.tx.send(AckMsg::Outcome { id, verdicts }).is_err() {
                log::error!("{}: svc-ack stopped unexpectedly", self.name);
                break;
            }
        }
        self.monitor.activity("stopped");
    }

    fn write(&self, batch: PreparedBatch) -> Vec<Verdict> {
        let batch_id = batch.id;
        let mut split = Split::new(batch.items);
        if split.envelopes.is_empty() {
            let feed = self.checkpoints.as_deref();
            let verdicts = split.verdicts.into_iter().flatten();
            return verdicts
                .inspect(|v| {
                    feed.inspect(|f| tell_checkpoint(f, v, None));
                })
                .collect();
        }
        let (outcomes, elapsed) = self.write_envelopes(&mut split.envelopes);
        self.on_outcomes(batch_id, &outcomes, elapsed);
        self.on_stored(&outcomes, &split.meta);
        self.settle(split, outcomes)
    }

    /// The sink's outcome of each envelope, one per envelope whatever the sink returned,
    /// and the seconds the write took.
    fn write_envelopes(&self, envelopes: &mut Vec<Envelope>) -> (Vec<WriteOutcome>, f64) {
        self.monitor.activity_owned(format!(
            "writing {} envelopes to sink {}",
            envelopes.len(),
            self.sink.kind()
        ));
        let started = Instant::now();
        let mut outcomes = match &self.lanes {
            Some(lanes) => write_by_lane(&*self.sink, lanes, envelopes, &self.metrics),
            None => self.sink.write_batch(envelopes),
        };
        let elapsed = started.elapsed().as_secs_f64();
        if outcomes.len() != envelopes.len() {
            // A sink bug must never turn into an ACK: treat the whole batch as not durable.
            log::error!(
                "sink {} returned {} outcomes for {} envelopes; treating the batch as not written",
                self.sink.kind(),
                outcomes.len(),
                envelopes.len()
            );
            outcomes = vec![
                WriteOutcome::Transient(SinkError::new(
                    self.sink.kind(),
                    "outcome count mismatch"
                ));
                envelopes.len()
            ];
        }
        (outcomes, elapsed)
    }

    /// Counts the batch's writes and failures; logs a few of the failed batches.
    fn on_outcomes(&self, batch_id: super::BatchId, outcomes: &[WriteOutcome], elapsed: f64) {
        let c = &self.metrics.counters;
        let durable = outcomes.iter().filter(|o| o.is_durable()).count();
        let failed = outcomes.len() - durable;
        Metrics::add(&c.messages_written_total, durable as u64);
        Metrics::add(&c.sink_write_errors_total, failed as u64);
        if durable > 0 {
            self.monitor.mark_write();
            self.metrics
                .gauges
                .last_sink_success_epoch_seconds
                .store(now_epoch_seconds() as u64, Ordering::Relaxed);
        }
        if failed == 0 {
            self.metrics
                .observe(crate::metrics::SummaryMetric::SinkBatchWrite, elapsed);
        } else if let Some(first) = outcomes.iter().find(|o| !o.is_durable()) {
            // A sink that fails every batch of a redelivery loop would log a line per NAK
            // cycle: `sink_write_errors_total` counts them all, the log says a few.
            let admitted = self.failures_logged.borrow_mut().admit(Instant::now());
            if let Some(suppressed) = admitted {
                log::warn!(
                    "{failed} of {} writes in batch {} failed; first: {first}{}",
                    outcomes.len(),
                    batch_id,
                    suppressed_note(suppressed)
                );
            }
        }
    }

    /// Per family and freshness of what is durable now; the permanent failures.
    fn on_stored(&self, outcomes: &[WriteOutcome], meta: &[(Option<i128>, Option<usize>)]) {
        let now = now_unix_nanos();
        let mut ages = Summary::default();
        for (outcome, (source, family)) in outcomes.iter().zip(meta) {
            if outcome.is_durable() {
                self.metrics
                    .add_family(*family, crate::metrics::FamilyMetric::Written, 1);
                if let Some(s) = source {
                    ages.observe(((now - s) as f64 / 1e9).max(0.0));
                }
            }
        }
        self.metrics
            .observe_all(crate::metrics::SummaryMetric::EventAgeAtStore, &ages);

        let permanent = outcomes
            .iter()
            .filter(|o| matches!(o, WriteOutcome::Permanent(_)))
            .count();
        let c = &self.metrics.counters;
        Metrics::add(&c.sink_permanent_failures_total, permanent as u64);
    }

    /// One verdict per message in batch order: the sink's outcomes fill the places the
    /// normalizer left open; each is told to the checkpoint thread.
    fn settle(&self, split: Split, outcomes: Vec<WriteOutcome>) -> Vec<Verdict> {
        let mut outcomes = outcomes.into_iter().zip(split.envelopes.iter());
        let feed = self.checkpoints.as_deref();
        split
            .verdicts
            .into_iter()
            .map(|v| match v {
                Some(v) => {
                    feed.inspect(|f| tell_checkpoint(f, &v, None));
                    v
                }
                None => {
                    let (outcome, env) = outcomes.next().expect("one per envelope");
                    let v = self.verdict(outcome, env);
                    feed.inspect(|f| tell_checkpoint(f, &v, Some(env)));
                    v
                }
            })
            .collect()
    }

    /// With a DLQ, a permanent failure is dead-lettered (then ACKed) instead of redelivered.
    /// A permanent sink failure is a [`Rejection`] when `svc-ack` must do more than NAK or
    /// terminate it: publish its dead letter, or, with custody checkpoints, terminate it only
    /// once a checkpoint lists it as a gap (it needs the message's stream and sequence). A
    /// transient one is [`Verdict::Unwritten`], with its place for the same reason.
    fn verdict(&self, outcome: WriteOutcome, env: &Envelope) -> Verdict {
        let place = || {
            Arc::new((
                (Arc::clone(&env.stream), Arc::clone(&env.stream_incarnation)),
                env.stream_sequence,
            ))
        };
        let e = match outcome {
            WriteOutcome::Permanent(e) => e,
            WriteOutcome::Transient(e) => return Verdict::Unwritten(e, place()),
            durable => return Verdict::Written(durable),
        };
        if self.dead_letter.is_none() && self.checkpoints.is_none() {
            return Verdict::Written(WriteOutcome::Permanent(e));
        }
        let at = place();
        let Some(cfg) = &self.dead_letter else {
            return Verdict::Rejected(Rejection {
                reason: format!("{}: {}", e.class.code(), crate::text::error_chain(&e)),
                dead_letter: None,
                retry: false,
                at,
                gap: super::GapReason::Terminated,
            });
        };
        Verdict::Rejected(Rejection {
            reason: format!(
                "sink {}: permanent write failure ({})",
                e.sink,
                e.class.code()
            ),
            dead_letter: Some(DeadLetter::build_for_sink(
                env,
                (e.sink, e.class),
                now_unix_nanos(),
                cfg,
            )),
            retry: false,
            at,
            gap: super::GapReason::DeadLettered,
        })
    }
}
