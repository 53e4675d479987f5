//! The runner's threads and the channels between them. The pipeline's own threads (`svc-fetch`,
//! `svc-normalize`, `svc-sink-N`, `svc-ack`, `svc-snapshot`, `svc-signal`, `svc-flush`,
//! `svc-spool-drain`, `svc-checkpoint`, and `svc replay`'s in `replay/`) are spawned in this
//! module, through its `spawn`. Four other modules own worker threads, each started and
//! joined by the object that uses them:
//! `sink` (the batch pool of `sink/pool.rs`: `svc-http-N`, `svc-s3-put-N`; the file sink's
//! writers `svc-file-N`; the fan-out's `svc-fanout-*`), `broker` (`svc-advisory`), `aws`
//! (`svc-aws-creds`, `svc-aws-credproc`) and the carried `nats` client (`nats-client`,
//! `nats-flusher`). docs/architecture.md has the table of every thread and what it owns; this
//! diagram is its one copy.
//!
//! ```text
//!  svc-fetch ──RawBatch──▶ svc-normalize ──PreparedBatch──▶ svc-sink-1..N ──Outcome──▶ svc-ack
//!      │  ▲                                                                        ▲    │
//!      │  └──────────────── credits (one per message, and its bytes) ◀─────────────┼────┘
//!      └──────────────────────────── Register (ack handles) ───────────────────────┘
//!  svc-normalize, per message: input limits -> size policy (input) -> authenticity
//!                              -> envelope -> metadata -> security labels
//!                              -> mission metadata -> size policy -> pre-sink policy
//!                              -> payload encryption -> custody -> size policy (record)
//!                              (src/message/limits.rs, src/message/protection/,
//!                              the governance stages: docs/governance.md)
//!  svc-snapshot: reads the counters every interval; the final snapshot is written at exit
//!  svc-signal:   SIGTERM/SIGINT set the stop flag; SIGUSR1 logs a pipeline dump
//!  svc-flush:    writes queued pull requests and acknowledgements at once when kicked
//!  svc-advisory: (advisories.enabled) counts JetStream consumer advisories; with custody
//!               checkpoints lists each message held at bind the broker gave up on as a gap;
//!               no ack handles
//!  svc-spool-drain: (a `spool` block) delivers the spool to the sink, oldest first
//!  svc-checkpoint: (custody.checkpoints) told by svc-sink-N what became durable and by
//!                  svc-ack what it gave up on (never waited on); signs and stores a
//!                  checkpoint every N records or T seconds, within a second of a gap;
//!                  svc-ack ACKs or TERMs a message given up on once its gap is signed
//!  nats-client:  the broker client's connection: reads, routes deliveries, reconnects
//!  nats-flusher: the broker client's buffered writes (at most every 5 ms) and PINGs
//! ```
//!
//! Ownership:
//! - `svc-fetch` owns the pull subscription. It takes `batch_size` message credits and a
//!   byte allowance before every pull request (`credit.rs`; the request's `max_bytes`), so at
//!   most `max_in_flight_batches x batch_size` messages and `max_in_flight_bytes` payload
//!   bytes exist anywhere in the pipeline, and keeps up to [`PIPELINED_PULL_REQUESTS`]
//!   requests outstanding so the broker is never idle waiting for our next request. A batch
//!   ships when full or when its oldest message has waited `max_batch_wait_ms`. It splits
//!   each delivery into plain data (to the normalizer)
//!   and an ack handle (to `svc-ack`, registered *before* the data leaves, on the same channel
//!   the outcome will later travel, so the registration is always seen first).
//! - `svc-normalize` first settles what one message may not bring (`message::limits`: what
//!   the broker client could not read as sent, headers over their bounds, U+0000 where sinks
//!   store text, a wildcard subject), then checks publisher signatures, builds envelopes,
//!   message metadata, security labels and mission metadata, applies the pre-sink and size
//!   policies, encrypts payloads and seals custody evidence: pure
//!   work, no I/O (the keys are loaded by `run` before any thread starts). A permanent
//!   pre-sink failure becomes a
//!   per-message `Verdict::Rejected` carrying the sanitized DLQ record (when
//!   `dead_letter.enabled`); an encryption key at its message bound, a transient one (NAK).
//! - `svc-sink-N` call `Sink::write_batch` and report one verdict per message (with
//!   `delivery.priority_lanes`, once per lane of the batch, first lane first: `lanes.rs`).
//!   They never see an ack handle. With `dead_letter.enabled`, a permanent sink failure (a failure class
//!   redelivery cannot fix, e.g. `duplicate_exists`, `value_rejected`) becomes a
//!   `Verdict::Rejected` with a DLQ record built from the envelope, exactly like a pre-sink
//!   failure; without a DLQ it stays `Written(Permanent)`: NAKed with backoff, terminated at
//!   `delivery.max_deliveries` (with custody checkpoints a `Verdict::Rejected` without a DLQ
//!   record: terminated only once a stored checkpoint lists it as a gap). A transient failure
//!   is `Verdict::Unwritten` with the message's place: NAKed, and on the consumer's own last
//!   delivery (`max_deliver`) listed as a gap, since the broker drops it then.
//! - `svc-ack` is the ONLY thread that ACKs, NAKs, TERMs or sends in-progress. Invariant: a
//!   message is ACKed only when its verdict says durable, or its DLQ publish was confirmed by
//!   the broker (PubAck) just before. It returns the batch's credits when the batch is settled.
//!
//! With a `spool` block the sink workers write through `FallbackSink` (src/sink/spool/): a
//! batch whose sink has failed transiently for `after_seconds`, and every batch while the
//! spool holds records, is appended and fsynced there and reported durable, so `svc-ack`
//! ACKs it as before. `svc-spool-drain` owns the drain position: it reads the spool, writes
//! to the same sink, and advances the position only after the sink confirmed; it never
//! touches an ack handle. A full spool makes the batch transient (NAK), not a loss. With
//! `custody.checkpoints`, a spooled record is reported `Spooled` (ACKed, not told to
//! `svc-checkpoint` by the sink workers); `svc-spool-drain` tells it once the sink holds it.
//!
//! `svc-flush` exists because the broker client writes a publish only after its flusher's 5 ms
//! floor, and an explicit flush is a PING/PONG round trip whose PONG queues behind every
//! message already on its way to us: `svc-fetch` must not wait for that, so it kicks
//! `svc-flush` (a bounded(1) channel, kicks coalesce), as does `svc-ack` after each batch.
//!
//! Backpressure: every channel is bounded; when the sinks are slow, credits run out and
//! `svc-fetch` stops asking the broker, which keeps the messages. Memory is bounded by
//! `max_in_flight_bytes` (and the message credits), not by the backlog or the message size.
//!
//! The ACK path cannot deadlock behind the data path: `svc-ack` never waits for a data-path
//! thread (returning credits never blocks), so the channel into it always drains. Its capacity
//! (`2 x max_in_flight_batches + 2`) covers the registration and outcome of every full batch
//! in flight; only many short batches can make a sink worker wait on it, briefly.
//!
//! Shutdown: the stop flag makes `svc-fetch` stop pulling; it ships what it holds, makes the
//! broker forget its open pull requests (`UNSUB` of their inbox) and NAKs, once each, what
//! they delivered before that; then it drops its senders; each stage drains and drops its
//! own; `svc-ack` settles every outcome it receives and exits when all senders are gone. One
//! clock runs from the signal: all of that and the final flush fit in
//! `delivery.shutdown_timeout_seconds`; then `run` writes the final snapshot and returns. Work that never
//! reached an outcome stays unacknowledged and is redelivered: correct, not a loss.
//! `svc-spool-drain` stops with the stop flag between its attempts and is waited for within
//! the same timeout; one still in a sink write then (an HTTP retry budget) is left to the
//! process's exit, its records behind the drain position, which `run` makes durable.

mod ack;
mod confirm;
mod credit;
mod fetch;
mod gap_hold;
mod lanes;
mod monitor;
mod normalize;
pub mod replay;
mod retried;
mod signals;
mod sink_worker;
mod snapshot_writer;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

use crate::broker::advisory::AdvisoryObserver;
use crate::broker::dead_letter::{DeadLetter, DeadLetterPublisher};
use crate::broker::{self, AckHandle, BrokerError};
use crate::config::RuntimeConfig;
use crate::message::envelope::{Envelope, RawMessage};
use crate::message::protection::Protection;
use crate::metrics::{now_epoch_seconds, Metrics};
use crate::sink::{SinkError, WriteOutcome};

pub use lanes::write_by_lane;
pub use monitor::Monitor;
pub use normalize::Normalizer;

/// Pull requests kept outstanding at once (measured: two hide the request round trip).
pub const PIPELINED_PULL_REQUESTS: usize = 2;

/// Identifies a batch between the data path and `svc-ack`.
pub type BatchId = u64;

/// Messages of one pull request, as plain data, with their receive times (Unix ns).
pub struct RawBatch {
    pub id: BatchId,
    pub messages: Vec<(RawMessage, i128)>,
    /// Subject family of each message, matched once by `svc-fetch`.
    pub families: Vec<Option<usize>>,
}

/// A message that can never be delivered: it failed a permanent pre-sink check, or (with a
/// DLQ on) the sink refused it for good. `reason` names the failed field, rule or failure
/// class and never contains the offending value.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub reason: String,
    /// The sanitized DLQ record, built by the normalizer when `dead_letter.enabled`;
    /// `svc-ack` publishes it and ACKs the original only once the broker confirmed it.
    pub dead_letter: Option<DeadLetter>,
    /// Not permanent after all: the message is left unacknowledged (NAK with backoff) and
    /// never dead-lettered (an encryption key at its message bound; see
    /// `docs/payload-protection.md`).
    pub retry: bool,
    /// The message's stream and the stream's incarnation (empty when not known), and its
    /// stream sequence (a custody checkpoint lists it as a runner-caused gap), behind one
    /// pointer.
    pub at: Arc<(crate::sink::checkpoint::Origin, u64)>,
    /// How a custody checkpoint lists it once given up on: told by `svc-ack` when the DLQ
    /// confirmed its record, or at `+TERM`.
    pub gap: GapReason,
}

/// The reason a custody checkpoint gives for a refused message it lists as a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapReason {
    /// A permanent pre-sink failure (authenticity, governance, limits).
    RefusedBeforeSink,
    /// A permanent sink failure, dead-lettered.
    DeadLettered,
    /// A permanent sink failure without a DLQ, terminated (`+TERM`) at
    /// `delivery.max_deliveries`.
    Terminated,
}

impl GapReason {
    /// The reason as the checkpoint writes it.
    pub fn code(self) -> &'static str {
        match self {
            GapReason::RefusedBeforeSink => "refused_before_sink",
            GapReason::DeadLettered => crate::sink::checkpoint::DEAD_LETTERED,
            GapReason::Terminated => "terminated",
        }
    }
}

/// One normalized message ready for the sink, with what the metrics need.
pub struct Prepared {
    pub envelope: Envelope,
    /// Source time used for freshness (event time header, else broker time), Unix ns.
    pub source_unix_nanos: Option<i128>,
    pub family: Option<usize>,
}

pub struct PreparedBatch {
    pub id: BatchId,
    pub items: Vec<Result<Prepared, (Rejection, Option<usize>)>>,
}

/// The fate of one message, decided on the data path and carried out by `svc-ack`.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The sink's outcome, durable or permanent (a transient one is [`Verdict::Unwritten`]).
    Written(WriteOutcome),
    /// Not written this time (a transient sink failure, or a refusal that may pass later: an
    /// encryption key at its message bound), NAKed for redelivery; with its place, since on
    /// the consumer's last delivery the broker drops it and a custody checkpoint lists it as
    /// a gap (`svc-ack`, [`ABANDONED`]).
    Unwritten(SinkError, Arc<(crate::sink::checkpoint::Origin, u64)>),
    Rejected(Rejection),
}

/// The reason a custody checkpoint lists a message with that was NAKed on the consumer's own
/// last delivery (its `max_deliver`): the broker delivers it no more, and nothing stores it
/// (atk55 finding 2).
pub const ABANDONED: &str = "abandoned_at_max_deliver";

/// What `svc-ack` receives, in order per batch: the registration, then the outcome.
pub enum AckMsg {
    Register {
        id: BatchId,
        handles: Vec<AckHandle>,
        /// The stream and incarnation of the batch's deliveries of the current generation
        /// (an incarnation read again advances the generation): where a gap told for one of
        /// them goes ([`ack::AckWorker`]'s give-up at a stop).
        origin: crate::sink::checkpoint::Origin,
        families: Vec<Option<usize>>,
        /// Byte credits the batch's messages hold, given back when it is settled.
        bytes: usize,
    },
    Outcome {
        id: BatchId,
        verdicts: Vec<Verdict>,
    },
}

/// Why `svc run` stopped with an error.
#[derive(Debug)]
pub enum RunError {
    Broker(BrokerError),
    Sink(SinkError),
    /// Something the runner cannot continue without (thread spawn, signal setup).
    Fatal(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Broker(e) => write!(f, "{e}"),
            RunError::Sink(e) => write!(f, "{e}"),
            RunError::Fatal(e) => write!(f, "{e}"),
        }
    }
}

/// A broker or sink error's own cause is this error's cause: `Display` shows the inner error's
/// text, `source` goes on from there, so [`crate::text::error_chain`] prints each once.
impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Broker(e) => e.source(),
            RunError::Sink(e) => e.source(),
            RunError::Fatal(_) => None,
        }
    }
}

/// Runs the pipeline until SIGTERM/SIGINT (Ok) or a fatal error.
pub fn run(cfg: RuntimeConfig) -> Result<(), RunError> {
    crate::allocator::keep_large_buffers_returnable();
    let started_at = now_epoch_seconds();
    let start = Startup::begin(&cfg)?;
    let (metrics, stop, monitor) = (start.metrics, start.stop, start.monitor);
    let (sink, drainer, edge_spool) = build_sink(&cfg, &metrics)?;
    let (checkpoint_feed, checkpoint_writer) =
        start_checkpoints(&cfg, (edge_spool, drainer.as_ref()), &metrics)?;
    let drainer = drain_checkpoints(&cfg, drainer, checkpoint_feed.as_ref())?;
    let denials = Arc::new(broker::Denials::default());
    let nc =
        broker::connect(&cfg.nats, metrics.clone(), denials.clone()).map_err(RunError::Broker)?;
    let consumer = bind(&nc, &cfg, &denials, sink.kind())?;
    let checkpoint_done = spawn_checkpoints(checkpoint_writer)?;
    let d = &cfg.delivery;
    let request_bytes = check_consumer_limits(&nc, d, &consumer)?;
    let credits = Arc::new(credit::CreditPool::new(credit::Credit::new(
        d.max_in_flight_batches * d.batch_size,
        d.max_in_flight_bytes,
    )));
    let (raw_tx, raw_rx) = bounded::<RawBatch>(d.max_in_flight_batches);
    let (prepared_tx, prepared_rx) = bounded::<PreparedBatch>(d.max_in_flight_batches);
    let (ack_tx, ack_rx) = bounded::<AckMsg>(2 * d.max_in_flight_batches + 2);
    watch_pipeline(&monitor, &credits, &raw_rx, &prepared_rx, &ack_rx);

    let drain_stop = Arc::new(AtomicBool::new(false));
    let drain_thread = spawn_drain(drainer, &drain_stop)?;
    let snapshot = snapshot_writer::SnapshotWriter::new(&cfg.metrics, metrics.clone(), started_at);
    let snapshot_thread = snapshot.spawn(stop.clone())?;
    let (flush_kick, flush_thread) = spawn_flush(nc.clone())?;
    let generation = Arc::new(broker::AckGeneration::default());
    let shared = Shared {
        nc,
        metrics,
        monitor,
        credits,
        stop,
        stop_at: start.stop_at,
        generation,
    };
    let (give_up, gave_up) = bounded::<()>(1);
    let ack_done = shared.start_ack(
        &cfg,
        &consumer,
        (ack_rx, gave_up),
        flush_kick.clone(),
        checkpoint_feed.clone(),
    )?;
    let feed = checkpoint_feed.clone();
    spawn_sink_workers(&cfg, &sink, &prepared_rx, &ack_tx, &shared, feed)?;
    drop(prepared_rx);
    let advisories = start_advisories(&cfg, &shared, &consumer, checkpoint_feed.clone());
    let normalizer = Normalizer::new(&cfg, start.protection, shared.metrics.clone());
    let mon = shared.monitor.clone();
    spawn("svc-normalize", move || {
        normalize::run(normalizer, raw_rx, prepared_tx, mon)
    })?;

    let ends = FetchEnds {
        raw_tx,
        ack_tx,
        flush_kick,
        denials: denials.clone(),
        checkpoints: checkpoint_feed,
    };
    // With checkpoints, the last cut's share of the shutdown clock.
    let cut_reserve = match &checkpoint_done {
        Some(_) => (d.shutdown_timeout / 4).min(LAST_CUT_RESERVE),
        None => Duration::ZERO,
    };
    let fatal = shared.run_fetch(&cfg, consumer, request_bytes, ends)?;
    let ending = Ending {
        stopping: shared.stopping(drain_stop, d.shutdown_timeout, (give_up, cut_reserve)),
        ack_done,
        flush_thread,
        advisories,
        drain_thread,
        checkpoint_done,
        snapshot_thread,
        snapshot,
        signal_handle: start.signal_handle,
        denials,
    };
    ending.on_fetch_end(fatal)
}

/// The counters, flags and keys of a run, and the signal thread that sets the stop flag:
/// all ready before the runner touches the sink or the broker.
struct Startup {
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    monitor: Arc<Monitor>,
    protection: Arc<Protection>,
    stop_at: Arc<OnceLock<Instant>>,
    signal_handle: signal_hook::iterator::Handle,
}

impl Startup {
    fn begin(cfg: &RuntimeConfig) -> Result<Startup, RunError> {
        let lane_names = cfg.delivery.priority_lanes.iter().flat_map(|l| &l.lanes);
        let metrics = Arc::new(
            Metrics::new(cfg.metrics.subject_families.clone())
                .with_lanes(lane_names.map(|l| l.name.clone()).collect()),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let monitor = Arc::new(Monitor::new());

        // Keys first: a missing or unreadable key stops the runner before it touches the broker.
        let protection = Arc::new(
            Protection::load(&cfg.payload_encryption, &cfg.authenticity, &cfg.custody)
                .map_err(|e| RunError::Fatal(e.join("; ")))?,
        );
        let stop_at = Arc::new(OnceLock::new());
        let signal_handle = signals::spawn(stop.clone(), stop_at.clone(), monitor.clone())?;
        Ok(Startup {
            metrics,
            stop,
            monitor,
            protection,
            stop_at,
            signal_handle,
        })
    }
}

/// What the long-lived threads share, held by `run` while it starts them.
struct Shared {
    nc: broker::Connection,
    metrics: Arc<Metrics>,
    monitor: Arc<Monitor>,
    credits: Arc<credit::CreditPool>,
    stop: Arc<AtomicBool>,
    stop_at: Arc<OnceLock<Instant>>,
    generation: Arc<broker::AckGeneration>,
}

/// What `svc-fetch` alone sends on (its senders end the pipeline when it drops them), and
/// the denials it stops on.
struct FetchEnds {
    raw_tx: crossbeam_channel::Sender<RawBatch>,
    ack_tx: crossbeam_channel::Sender<AckMsg>,
    flush_kick: crossbeam_channel::Sender<()>,
    denials: Arc<broker::Denials>,
    checkpoints: Option<Arc<crate::sink::checkpoint::Feed>>,
}

impl Shared {
    /// Starts `svc-ack`; the receiver says when it has settled everything and ended.
    fn start_ack(
        &self,
        cfg: &RuntimeConfig,
        consumer: &broker::Consumer,
        (rx, give_up): (
            crossbeam_channel::Receiver<AckMsg>,
            crossbeam_channel::Receiver<()>,
        ),
        flush_kick: crossbeam_channel::Sender<()>,
        checkpoints: Option<Arc<crate::sink::checkpoint::Feed>>,
    ) -> Result<crossbeam_channel::Receiver<()>, RunError> {
        let d = &cfg.delivery;
        let ack = ack::AckWorker {
            nc: self.nc.clone(),
            rx,
            give_up,
            credits: self.credits.clone(),
            flush_kick,
            metrics: self.metrics.clone(),
            monitor: self.monitor.clone(),
            nak_backoff: d.nak_backoff,
            max_deliveries: d.max_deliveries,
            dlq: cfg.dead_letter.enabled.then(|| {
                let publisher = DeadLetterPublisher::new(self.nc.clone(), cfg.dead_letter.clone());
                publisher.log_stream_check();
                publisher
            }),
            progress_after: consumer.ack_wait.mul_f64(d.in_progress_fraction),
            generation: Arc::clone(&self.generation),
            confirmations: open_confirmations(&self.nc, d, consumer, &self.metrics)?,
            checkpoints,
            hold: gap_hold::Hold::new(Arc::clone(&consumer.limits)),
            retried: retried::Retried::new(consumer.limits.max_deliver()),
        };
        if let (Some(_), Some(last)) = (&ack.checkpoints, ack.hold.last_delivery()) {
            log::warn!(
                "consumer {}/{} delivers a message at most {last} times (max_deliver): a \
                 message given up on at that delivery is settled before a custody checkpoint \
                 lists its gap (no later delivery would come), so a kill -9 in the second \
                 before the checkpoint loses the gap; keep max_deliver well above \
                 delivery.max_deliveries (counted: checkpoint_gaps_settled_unsigned_total); \
                 a message not written on that delivery is dropped by the broker, listed as \
                 a gap ({ABANDONED}) by the next checkpoint",
                consumer.stream,
                consumer.name
            );
        }
        let (ack_done_tx, ack_done_rx) = bounded::<()>(1);
        spawn("svc-ack", move || {
            ack.run();
            let _ = ack_done_tx.send(());
        })?;
        Ok(ack_done_rx)
    }

    /// Runs `svc-fetch` until it ends: `Some` says why it failed.
    fn run_fetch(
        &self,
        cfg: &RuntimeConfig,
        consumer: broker::Consumer,
        request_bytes: usize,
        ends: FetchEnds,
    ) -> Result<Option<String>, RunError> {
        let fetcher = self.fetcher(cfg, consumer, request_bytes, ends);
        let fetch_thread = spawn("svc-fetch", move || fetcher.run())?;
        Ok(match fetch_thread.join() {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some("svc-fetch panicked".to_string()),
        })
    }

    /// `svc-fetch`, owning the consumer's pull subscription.
    fn fetcher(
        &self,
        cfg: &RuntimeConfig,
        consumer: broker::Consumer,
        request_bytes: usize,
        ends: FetchEnds,
    ) -> fetch::Fetcher {
        let d = &cfg.delivery;
        fetch::Fetcher {
            nc: self.nc.clone(),
            subjects: cfg
                .nats
                .subjects
                .iter()
                .filter_map(|s| crate::message::subject::SubjectPattern::parse(s).ok())
                .collect(),
            batch_size: d.batch_size,
            request_messages: fetch::request_messages(d.batch_size, request_bytes),
            expiry: d.fetch_expiry,
            max_batch_wait: d.max_batch_wait,
            credits: self.credits.clone(),
            request_bytes,
            flush_kick: ends.flush_kick,
            raw_tx: ends.raw_tx,
            ack_tx: ends.ack_tx,
            stop: self.stop.clone(),
            stop_at: self.stop_at.clone(),
            shutdown_timeout: d.shutdown_timeout,
            denials: ends.denials,
            metrics: self.metrics.clone(),
            monitor: self.monitor.clone(),
            watch: broker::consumer_watch::ConsumerWatch::new(
                self.nc.clone(),
                &consumer.stream,
                &consumer.name,
                Arc::clone(&consumer.limits),
                &cfg.nats.subjects,
            ),
            stream: consumer.stream.clone(),
            incarnation: Arc::clone(&consumer.incarnation),
            generation: Arc::clone(&self.generation),
            checkpoints: ends.checkpoints,
            released: std::cell::RefCell::new(retried::Retried::new(consumer.limits.max_deliver())),
            limits: Arc::clone(&consumer.limits),
            sub: consumer.subscription,
        }
    }

    /// The shutdown clock, once svc-fetch has ended.
    fn stopping(
        self,
        drain_stop: Arc<AtomicBool>,
        timeout: std::time::Duration,
        (give_up, cut_reserve): (crossbeam_channel::Sender<()>, Duration),
    ) -> Stopping {
        Stopping {
            nc: self.nc,
            stop: self.stop,
            stop_at: self.stop_at,
            drain_stop,
            timeout,
            give_up,
            cut_reserve,
        }
    }
}

/// What `run` waits for and closes after svc-fetch ended, in this order.
struct Ending {
    stopping: Stopping,
    ack_done: crossbeam_channel::Receiver<()>,
    flush_thread: thread::JoinHandle<()>,
    advisories: Option<AdvisoryObserver>,
    drain_thread: Option<DrainThread>,
    checkpoint_done: Option<crossbeam_channel::Receiver<()>>,
    snapshot_thread: thread::JoinHandle<()>,
    snapshot: snapshot_writer::SnapshotWriter,
    signal_handle: signal_hook::iterator::Handle,
    denials: Arc<broker::Denials>,
}

impl Ending {
    /// Drains the pipeline, stops the side threads within the shutdown clock, writes the
    /// final snapshot; `fatal` is why svc-fetch stopped, if it failed.
    fn on_fetch_end(self, fatal: Option<String>) -> Result<(), RunError> {
        let stopping = self.stopping;
        stopping.drain_pipeline(&self.ack_done, self.flush_thread);
        if let Some(observer) = self.advisories {
            observer.join();
        }
        if let Some((done, spool)) = self.drain_thread {
            stop_drain(&done, &spool, stopping.deadline());
        }
        if let Some(done) = self.checkpoint_done {
            // The sink workers are gone: the thread writes what is pending and ends.
            let left = stopping
                .deadline()
                .saturating_duration_since(Instant::now());
            if done.recv_timeout(left).is_err() {
                log::warn!("custody checkpoints: the last checkpoint was not written in time");
            }
        }
        let _ = self.snapshot_thread.join();
        self.snapshot.write_now();
        self.signal_handle.close();
        // The final flush waited for the broker's PONG, so a violation by the last
        // acknowledgements of a clean stop has arrived by now: a clean exit would hide it.
        let fatal = fatal.or_else(|| {
            self.denials
                .first()
                .map(|d| broker::permissions::runner_error(&d))
        });
        match fatal {
            None => Ok(()),
            Some(e) => Err(RunError::Fatal(e)),
        }
    }
}

/// `custody.checkpoints`: the key is read and the chain read back and checked against the
/// head file, before the broker is connected. Returns the sink workers' feed and the writer,
/// whose thread [`spawn_checkpoints`] starts once the runner is bound.
#[allow(clippy::type_complexity)]
fn start_checkpoints(
    cfg: &RuntimeConfig,
    (edge_spool, fallback): (Option<Arc<crate::sink::spool::Spool>>, Option<&SpoolDrain>),
    metrics: &Arc<Metrics>,
) -> Result<
    (
        Option<Arc<crate::sink::checkpoint::Feed>>,
        Option<crate::sink::checkpoint::Writer>,
    ),
    RunError,
> {
    let c = &cfg.custody;
    if !(c.enabled && c.checkpoints.enabled) {
        return Ok((None, None));
    }
    // `svc validate` refuses these first (config::mod).
    if let Some(why) = crate::sink::checkpoint::unavailable(&cfg.sink) {
        return Err(RunError::Fatal(format!("custody.checkpoints: {why}")));
    }
    if let Some((_, spool)) = fallback {
        // An edge spool handed to this configuration is drained first (atk51b finding 1).
        crate::sink::checkpoint::spool::refuse_handed_frames(spool).map_err(RunError::Fatal)?;
    }
    // The spool as the sink keeps its checkpoints as frames in the spool it appends to.
    let store: Box<dyn crate::sink::checkpoint::CheckpointStore> = match edge_spool {
        Some(spool) => {
            let store = crate::sink::checkpoint::spool::SpoolStore::new(spool);
            match &cfg.sink {
                // The target's store too: the start and the rescan read what was drained.
                crate::sink::SinkConfig::Spool(s) => Box::new(store.with_target(
                    crate::sink::checkpoint::store_for(&s.target).map_err(RunError::Fatal)?,
                )),
                _ => Box::new(store),
            }
        }
        None => crate::sink::checkpoint::store_for(&cfg.sink).map_err(RunError::Fatal)?,
    };
    let (mut writer, feed) =
        crate::sink::checkpoint::Writer::new(store, c, cfg.sink.kind(), Arc::clone(metrics))
            .map_err(RunError::Fatal)?;
    // The chain is read back and checked against the head file before any delivery: a sink
    // cut back, emptied or unreadable stops the runner here.
    writer.start().map_err(RunError::Fatal)?;
    Ok((Some(Arc::new(feed)), Some(writer)))
}

/// Starts the `svc-checkpoint` thread (it rescans the records first, off the delivery path).
/// Returns the channel that says the thread ended.
fn spawn_checkpoints(
    writer: Option<crate::sink::checkpoint::Writer>,
) -> Result<Option<crossbeam_channel::Receiver<()>>, RunError> {
    let Some(writer) = writer else {
        return Ok(None);
    };
    let (done_tx, done_rx) = bounded::<()>(1);
    spawn("svc-checkpoint", move || {
        writer.run();
        let _ = done_tx.send(());
    })?;
    Ok(Some(done_rx))
}

/// With a fallback spool and `custody.checkpoints`: the drain tells the checkpoint thread of
/// each record once the sink holds it (the sink workers report a spooled record `Spooled`,
/// which they do not tell).
fn drain_checkpoints(
    cfg: &RuntimeConfig,
    drainer: Option<SpoolDrain>,
    feed: Option<&Arc<crate::sink::checkpoint::Feed>>,
) -> Result<Option<SpoolDrain>, RunError> {
    match (drainer, feed) {
        (Some((d, spool)), Some(feed)) => {
            let feed = crate::sink::checkpoint::DrainFeed::new(feed.clone(), &cfg.custody)
                .map_err(RunError::Fatal)?;
            Ok(Some((d.with_checkpoints(feed), spool)))
        }
        (drainer, _) => Ok(drainer),
    }
}

/// The spool's drainer and the spool, when a `spool` block wraps the sink.
type SpoolDrain = (
    crate::sink::spool::drain::Drainer,
    Arc<crate::sink::spool::Spool>,
);

/// The configured sink, wrapped in the fallback spool when a `spool` block is set; with
/// `sink.type` = `spool`, its open spool too (custody checkpoints are kept in it).
#[allow(clippy::type_complexity)]
fn build_sink(
    cfg: &RuntimeConfig,
    metrics: &Arc<Metrics>,
) -> Result<
    (
        Arc<dyn crate::sink::Sink>,
        Option<SpoolDrain>,
        Option<Arc<crate::sink::spool::Spool>>,
    ),
    RunError,
> {
    use crate::sink::spool::{drain::Drainer, fallback::FallbackSink, Spool};
    if let crate::sink::SinkConfig::Spool(c) = &cfg.sink {
        let spool = Spool::open(&c.spool, metrics.clone())
            .map_err(|e| RunError::Sink(SinkError::new("spool", e.to_string())))?;
        let spool = Arc::new(spool);
        let sink = Arc::new(crate::sink::spool::fallback::SpoolSink::new(spool.clone()));
        return Ok((sink, None, Some(spool)));
    }
    let sink = cfg.sink.build(metrics.clone()).map_err(RunError::Sink)?;
    let Some(spool_cfg) = &cfg.spool else {
        return Ok((sink, None, None));
    };
    let spool = Spool::open(spool_cfg, metrics.clone())
        .map_err(|e| RunError::Sink(SinkError::new("spool", e.to_string())))?;
    let spool = Arc::new(spool);
    log::info!(
        "spool {}: {} records waiting; spooling after {} s of sink failures",
        spool.path().display(),
        spool.records(),
        spool_cfg.after.as_secs_f64()
    );
    let mut drainer = Drainer::new(spool.clone(), sink.clone(), metrics.clone());
    // Checkpoint frames (an edge spool handed to this configuration) go into the sink's
    // checkpoint store when it keeps one (atk50b finding 6).
    if crate::sink::checkpoint::unavailable(&cfg.sink).is_none() {
        let store = crate::sink::checkpoint::store_for(&cfg.sink).map_err(RunError::Fatal)?;
        drainer = drainer.with_checkpoint_store(store);
        // Checked with this configuration's own key before each put (sink::spool::put).
        let own = &cfg.custody.checkpoints;
        if cfg.custody.enabled && own.enabled {
            let trusted = crate::message::protection::checkpoint::TrustedKeys::own(own)
                .map_err(RunError::Fatal)?;
            drainer = drainer.with_trusted_keys(trusted);
        }
    }
    let wrapped: Arc<dyn crate::sink::Sink> =
        Arc::new(FallbackSink::new(sink, spool.clone(), metrics.clone()));
    Ok((wrapped, Some((drainer, spool)), None))
}

/// Binds the durable consumer and logs what the runner will do with it.
fn bind(
    nc: &broker::Connection,
    cfg: &RuntimeConfig,
    denials: &broker::Denials,
    sink_kind: &str,
) -> Result<broker::Consumer, RunError> {
    // A denied request only times out: the violation the broker reported is the real cause.
    let consumer = broker::bind_consumer(nc, &cfg.nats).map_err(|e| match denials.first() {
        Some(denied) => RunError::Fatal(broker::permissions::runner_error(&denied)),
        None => RunError::Broker(e),
    })?;
    log::info!(
        "bound to consumer {}/{} (ack wait {} s); sink {sink_kind}; batch {} x {} in flight, {} \
         sink workers",
        consumer.stream,
        consumer.name,
        consumer.ack_wait.as_secs_f64(),
        cfg.delivery.batch_size,
        cfg.delivery.max_in_flight_batches,
        cfg.delivery.sink_workers
    );
    Ok(consumer)
}

/// The byte allowance of one pull request, after checking that the consumer's request limits
/// take the requests svc-fetch will make (else the broker refuses every one), and warning
/// when its MaxAckPending leaves part of the pipeline idle.
fn check_consumer_limits(
    nc: &broker::Connection,
    d: &crate::config::DeliveryConfig,
    consumer: &broker::Consumer,
) -> Result<usize, RunError> {
    let request_bytes = fetch::request_allowance(
        d.max_in_flight_bytes,
        d.max_in_flight_batches,
        broker::max_payload(nc),
    );
    let asked = broker::consumer_shape::RequestShape {
        batch: d.batch_size,
        expires: d.fetch_expiry,
        max_bytes: request_bytes,
        open_requests: PIPELINED_PULL_REQUESTS,
    };
    broker::consumer_shape::check_request_limits(&consumer.config, asked).map_err(|why| {
        RunError::Fatal(format!(
            "broker: consumer {}/{}: {why}",
            consumer.stream, consumer.name
        ))
    })?;
    let in_flight = d.max_in_flight_batches * d.batch_size;
    if let Some(max) = consumer
        .limits
        .max_ack_pending()
        .filter(|m| *m < in_flight as u64)
    {
        // Not an error (several runners may share a consumer on purpose), but the broker
        // stops delivering at its limit, so part of the configured pipeline stays idle.
        log::warn!(
            "consumer {}/{} allows {max} unacknowledged messages (max_ack_pending), fewer than \
             this runner may hold in flight ({} x {} = {in_flight}); deliveries pause at the \
             broker's limit. Raise max_ack_pending to at least {in_flight} per runner.",
            consumer.stream,
            consumer.name,
            d.max_in_flight_batches,
            d.batch_size
        );
    }
    Ok(request_bytes)
}

/// What the SIGUSR1 dump shows of the credits and the channels.
fn watch_pipeline(
    monitor: &Monitor,
    credits: &Arc<credit::CreditPool>,
    raw: &crossbeam_channel::Receiver<RawBatch>,
    prepared: &crossbeam_channel::Receiver<PreparedBatch>,
    ack: &crossbeam_channel::Receiver<AckMsg>,
) {
    let pool = credits.clone();
    monitor.watch_fn("credits (free messages)", move || {
        (pool.available_messages(), Some(pool.capacity().messages))
    });
    let pool = credits.clone();
    monitor.watch_fn("credits (free payload bytes)", move || {
        (pool.available_bytes(), Some(pool.capacity().bytes))
    });
    monitor.watch("svc-fetch -> svc-normalize", raw);
    monitor.watch("svc-normalize -> svc-sink", prepared);
    monitor.watch("-> svc-ack", ack);
}

/// `svc-spool-drain`'s end (a message when it returns) and its spool.
type DrainThread = (
    crossbeam_channel::Receiver<()>,
    Arc<crate::sink::spool::Spool>,
);

/// Starts `svc-spool-drain` when there is a spool.
fn spawn_drain(
    drainer: Option<SpoolDrain>,
    drain_stop: &Arc<AtomicBool>,
) -> Result<Option<DrainThread>, RunError> {
    let Some((d, spool)) = drainer else {
        return Ok(None);
    };
    let flag = drain_stop.clone();
    let (done_tx, done_rx) = bounded::<()>(1);
    spawn("svc-spool-drain", move || {
        d.run(&flag);
        let _ = done_tx.send(());
    })?;
    Ok(Some((done_rx, spool)))
}

/// Starts `svc-flush`, which flushes the connection each time it is kicked; it ends when
/// svc-fetch and svc-ack have dropped their kick senders.
fn spawn_flush(
    nc: broker::Connection,
) -> Result<(crossbeam_channel::Sender<()>, thread::JoinHandle<()>), RunError> {
    let (flush_kick, flush_rx) = bounded::<()>(1);
    let thread = spawn("svc-flush", move || {
        let mut failures: u32 = 0;
        while flush_rx.recv().is_ok() {
            match broker::flush(&nc, std::time::Duration::from_secs(2)) {
                Ok(()) => failures = 0,
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures % 100 == 0 {
                        log::debug!("broker: flush failed ({failures}x): {e}");
                    }
                }
            }
        }
    })?;
    Ok((flush_kick, thread))
}

/// Starts the `svc-sink-N` workers.
fn spawn_sink_workers(
    cfg: &RuntimeConfig,
    sink: &Arc<dyn crate::sink::Sink>,
    prepared: &crossbeam_channel::Receiver<PreparedBatch>,
    ack: &crossbeam_channel::Sender<AckMsg>,
    shared: &Shared,
    checkpoints: Option<Arc<crate::sink::checkpoint::Feed>>,
) -> Result<(), RunError> {
    let dead_letter = cfg
        .dead_letter
        .enabled
        .then(|| Arc::new(cfg.dead_letter.clone()));
    for n in 1..=cfg.delivery.sink_workers {
        let worker = sink_worker::SinkWorker {
            name: format!("svc-sink-{n}"),
            rx: prepared.clone(),
            tx: ack.clone(),
            sink: sink.clone(),
            metrics: shared.metrics.clone(),
            monitor: shared.monitor.clone(),
            dead_letter: dead_letter.clone(),
            lanes: cfg.delivery.priority_lanes.clone().map(Arc::new),
            failures_logged: Default::default(),
            checkpoints: checkpoints.clone(),
        };
        spawn(&worker.name.clone(), move || worker.run())?;
    }
    Ok(())
}

/// The inbox and state of confirmed acknowledgements when `delivery.ack_confirmation` is on.
fn open_confirmations(
    nc: &broker::Connection,
    d: &crate::config::DeliveryConfig,
    consumer: &broker::Consumer,
    metrics: &Arc<Metrics>,
) -> Result<Option<confirm::Confirmations>, RunError> {
    let Some(resend_after) = d.ack_confirmation else {
        return Ok(None);
    };
    let capacity = d.max_in_flight_batches * d.batch_size;
    confirm::Confirmations::open(
        nc,
        capacity,
        resend_after,
        consumer.ack_wait,
        metrics.clone(),
    )
    .map(Some)
    .map_err(|e| {
        RunError::Fatal(format!(
            "broker: subscribing the inbox for ack confirmations failed: {e}"
        ))
    })
}

/// The advisory observer when `advisories.enabled` (aggregate counters only: it has no
/// handle on any acknowledgement), or with custody checkpoints (`abandoned`: each message the
/// broker gives up on at `max_deliver` is listed as a gap); delivery goes on without it if it
/// cannot start. Subscribed before the first pull: a delivery left in flight by a crash is
/// given up on at the restart's first pulls (atk56 finding 3).
fn start_advisories(
    cfg: &RuntimeConfig,
    shared: &Shared,
    consumer: &broker::Consumer,
    checkpoints: Option<Arc<crate::sink::checkpoint::Feed>>,
) -> Option<AdvisoryObserver> {
    let abandoned = checkpoints.map(|f| tell_abandoned(f, consumer, shared.metrics.clone()));
    if !cfg.advisories.enabled && abandoned.is_none() {
        return None;
    }
    let lists_gaps = abandoned.is_some();
    let watch = broker::advisory::Watch {
        count: cfg.advisories.enabled,
        on_abandoned: abandoned,
    };
    let started = AdvisoryObserver::start(
        &shared.nc,
        &consumer.stream,
        &consumer.name,
        watch,
        shared.metrics.clone(),
        shared.stop.clone(),
    );
    match started {
        Ok(o) => Some(o),
        Err(e) if lists_gaps => {
            log::error!(
                "advisory observer not started: {e}; delivery continues, but a message left in \
                 flight on its last delivery before this run (a kill -9), which the broker \
                 gives up on at the consumer's max_deliver, is listed as a custody gap nowhere"
            );
            None
        }
        Err(e) => {
            log::warn!("advisory observer not started: {e}; delivery continues without it");
            None
        }
    }
}

/// With custody checkpoints: a message the broker gave up on (its `max_deliver` advisory) is
/// told as a gap ([`ABANDONED`]) of the stream as bound, when the consumer held it at bind
/// ([`broker::inherited`]: an advisory anyone may forge is believed only for those, each once,
/// no more than were held; atk57). The rest, delivered to this run, are told by `svc-ack` or
/// `svc-fetch` where they NAK them. A gap told already keeps its first reason; one signed
/// already is not listed again. Logged within a budget: a publisher able to write on the
/// advisory subject must not flood the log.
fn tell_abandoned(
    feed: Arc<crate::sink::checkpoint::Feed>,
    consumer: &broker::Consumer,
    metrics: Arc<Metrics>,
) -> broker::advisory::OnAbandoned {
    let origin: crate::sink::checkpoint::Origin = (
        Arc::from(consumer.stream.as_str()),
        Arc::clone(&consumer.incarnation),
    );
    let believed = std::sync::Mutex::new(broker::inherited::Believed::new(consumer.inherited));
    let budget = std::sync::Mutex::new(crate::text::log_budget::LogBudget::default());
    Box::new(move |seq| {
        if !believed.lock().is_ok_and(|mut b| b.admit(seq)) {
            log::debug!("svc-advisory: a max_deliver advisory for a sequence the consumer did not hold at bind, or past their number, ignored");
            return;
        }
        if !gap_hold::tell_abandoned(&feed, &metrics, origin.clone(), seq) {
            return;
        }
        let admitted = budget.lock().map_or(None, |mut b| b.admit(Instant::now()));
        if let Some(suppressed) = admitted {
            log::warn!(
                "stream {} sequence {seq}: left in flight unacknowledged before this run and \
                 delivered no more by the broker (the consumer's max_deliver advisory); the \
                 next custody checkpoint lists it as a gap ({ABANDONED}){}",
                crate::text::peer::PeerText::new(&origin.0),
                if suppressed > 0 {
                    format!(" ({suppressed} more such lines not logged)")
                } else {
                    String::new()
                }
            );
        }
    })
}

/// The stop after svc-fetch ended: one clock from the stop signal (or from svc-fetch's end),
/// within which the release of open pull requests, the drain and the final flush all fit
/// (`shutdown_timeout_seconds`).
struct Stopping {
    nc: broker::Connection,
    stop: Arc<AtomicBool>,
    stop_at: Arc<OnceLock<Instant>>,
    drain_stop: Arc<AtomicBool>,
    timeout: std::time::Duration,
    /// Tells `svc-ack` the drain gave up on the batches still at the sink.
    give_up: crossbeam_channel::Sender<()>,
    /// With custody checkpoints, the end of the clock kept for the last cut
    /// ([`LAST_CUT_RESERVE`]).
    cut_reserve: Duration,
}

/// The most of the shutdown clock kept, with custody checkpoints, for the last checkpoint
/// after a drain that gave up on batches still at the sink (a quarter of the clock at most).
const LAST_CUT_RESERVE: Duration = Duration::from_secs(1);

impl Stopping {
    fn deadline(&self) -> Instant {
        *self.stop_at.get_or_init(Instant::now) + self.timeout
    }

    /// Stops every stage, waits for svc-ack to settle what reaches it, then flushes the
    /// acknowledgements, all before the deadline.
    fn drain_pipeline(
        &self,
        ack_done: &crossbeam_channel::Receiver<()>,
        flush_thread: thread::JoinHandle<()>,
    ) {
        let deadline = self.deadline();
        self.stop.store(true, Ordering::SeqCst);
        // The drain stops now too, between its attempts; a sink write it is in is bounded
        // by stop_drain.
        self.drain_stop.store(true, Ordering::SeqCst);
        // The final flush's least time is kept inside the budget, not added past it.
        let drain_until = deadline
            .checked_sub(fetch::MIN_FINAL_FLUSH + self.cut_reserve)
            .unwrap_or(deadline);
        match ack_done.recv_timeout(drain_until.saturating_duration_since(Instant::now())) {
            Ok(()) => {
                log::info!("pipeline drained; the acknowledgement of every settled message sent");
                // Both kick senders are gone now, so svc-flush has ended or is ending.
                let _ = flush_thread.join();
            }
            Err(_) => {
                log::warn!(
                    "shutdown timeout ({} s) reached with batches in flight; they stay \
                     unacknowledged and will be redelivered (one on the consumer's last \
                     delivery is not: with custody checkpoints its gap is listed)",
                    self.timeout.as_secs_f64()
                );
                let _ = self.give_up.try_send(());
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if let Err(e) = broker::flush(&self.nc, left.max(fetch::MIN_FINAL_FLUSH)) {
            log::warn!("broker: final flush of acknowledgements failed: {e}");
        }
    }
}

/// Waits for `svc-spool-drain` until the shutdown deadline. It may finish the sink write it
/// is in (a sink's in-call retries can outlast `shutdown_timeout_seconds`, as the HTTP sink's
/// retry budget does); past the deadline it is left to the process's exit: what it has not
/// confirmed stays behind the drain position, made durable here, and is delivered after a
/// restart (at least once, as after a crash).
fn stop_drain(
    done: &crossbeam_channel::Receiver<()>,
    spool: &crate::sink::spool::Spool,
    deadline: std::time::Instant,
) {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if done.recv_timeout(left).is_ok() {
        return;
    }
    log::warn!(
        "spool {}: shutdown timeout reached with the drain in a sink write; the records it \
         has not confirmed stay spooled and are delivered after a restart",
        spool.path().display()
    );
    if let Err(e) = spool.persist_position() {
        log::error!("{e}");
    }
}

/// Spawns a named thread; failure to spawn is fatal for the runner.
fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<thread::JoinHandle<T>, RunError> {
    thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .map_err(|e| RunError::Fatal(format!("cannot start thread {name}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gap_reason_told_can_be_read_back() {
        let told = [
            GapReason::RefusedBeforeSink,
            GapReason::DeadLettered,
            GapReason::Terminated,
        ];
        for code in told.map(GapReason::code).into_iter().chain([ABANDONED]) {
            assert_eq!(crate::sink::checkpoint::gap_reason(code), Some(code));
        }
        assert_eq!(crate::sink::checkpoint::gap_reason("other"), None);
    }

    #[test]
    fn a_run_error_prints_its_sinks_cause_once() {
        let disk = std::io::Error::other("disk full");
        let e = RunError::Sink(SinkError::new("file", "write a.json").caused_by(disk));
        assert_eq!(
            crate::text::error_chain(&e),
            "sink file: write a.json: disk full"
        );
        let e = RunError::Fatal("cannot install signal handlers".into());
        assert_eq!(
            crate::text::error_chain(&e),
            "cannot install signal handlers"
        );
    }
}
