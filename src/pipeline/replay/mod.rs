//! `svc replay`: delivers a range of the stream again, through the runner's normalizer, into
//! the configured sink (or another), without touching the durable consumer.
//!
//! ```text
//!  svc-replay-read ──RawBatch──▶ svc-normalize ──PreparedBatch──▶ svc-replay-write
//!   (ephemeral push consumer,     (the runner's         (Sink::write_batch, the DLQ,
//!    no acks, flow control,        Normalizer)            the state file after each batch)
//!    --max-rate pacing)
//!  main thread: the progress line until svc-replay-write ends; svc-signal: SIGINT/SIGTERM
//! ```
//!
//! The range is fixed at the start: its last sequence is the smaller of `--end-seq` and the
//! stream's last sequence then (kept in the state file for `--resume`). The reader stops at
//! that sequence, at the first message stored after `--until`, or when the consumer has
//! nothing more pending. A skipped consumer sequence or a silent broker is an error, never
//! the end of the range. Batches are settled in stream order by one writer, and the state file
//! moves past a batch only when every message of it is settled (stored, already present,
//! refused and counted, dead-lettered and confirmed by the broker). See docs/replay.md.

pub mod progress;
pub mod redrive;
pub mod state;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

use super::{PreparedBatch, RawBatch, RunError};
use crate::broker::dead_letter::{DeadLetter, DeadLetterPublisher};
use crate::broker::inspect::{self, Ended, Request, Start};
use crate::config::RuntimeConfig;
use crate::message::envelope::{now_unix_nanos, Envelope, RawMessage};
use crate::message::protection::Protection;
use crate::metrics::Metrics;
use crate::sink::{Sink, WriteOutcome};
use progress::{Display, Progress};
use state::{Counts, RangeKey, State, StateFile};

/// Attempts of one batch's transient sink failures before the replay stops (resumable).
const WRITE_ATTEMPTS: u32 = 8;
/// First wait between those attempts; doubled each time up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// What to replay and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The range and the sink it belongs to (what a state file must match).
    pub range: RangeKey,
    pub state: PathBuf,
    pub resume: bool,
    pub dry_run: bool,
    /// The run removes each record it settles from the stream it reads (a redrive): a
    /// `--resume` may then find the stream's first sequence past `next_seq` after a kill before
    /// the state said so, which is not a purge of the range.
    pub removes_settled: bool,
    /// Messages per second at most.
    pub max_rate: Option<u32>,
    /// Bounds the connect and the wait for each message from the broker.
    pub timeout: Duration,
}

/// How a replay ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Every message of the range is settled.
    Done,
    /// Stopped by SIGINT/SIGTERM; `--resume` continues.
    Interrupted,
}

/// The outcome of a replay.
#[derive(Debug, Clone)]
pub struct Report {
    pub finish: Finish,
    pub counts: Counts,
    /// The range's sequences (`first` is 1 for a time range).
    pub first: u64,
    pub last: u64,
    pub dry_run: bool,
    /// The sink's type.
    pub sink: &'static str,
}

/// A failure that stopped the replay, with the counts settled before it (durable in the
/// state file unless a dry run).
#[derive(Debug)]
pub struct Failed {
    pub error: String,
    pub counts: Counts,
}

impl From<RunError> for Failed {
    fn from(e: RunError) -> Failed {
        Failed {
            error: crate::text::error_chain(&e),
            counts: Counts::default(),
        }
    }
}

/// What a replay or a redrive starts with: the payload protection, the stop flag its signal
/// thread sets, and the broker connection.
struct Session {
    metrics: Arc<Metrics>,
    protection: Arc<Protection>,
    stop: Arc<AtomicBool>,
    monitor: Arc<super::Monitor>,
    signals: signal_hook::iterator::Handle,
    nc: crate::broker::Connection,
}

impl Session {
    /// Counts the records the replay's earlier runs sealed (its state file) against the keys'
    /// bounds, as if this process had sealed them: `--resume` without a rotation stops where
    /// the first run stopped.
    fn count_sealed_before(&self, state: &State) {
        if let Some(encryptor) = &self.protection.encryptor {
            for (key_id, n) in &state.sealed {
                encryptor.count_earlier(key_id, *n);
            }
        }
    }

    fn open(cfg: &RuntimeConfig, timeout: Duration) -> Result<Session, Failed> {
        let metrics = Arc::new(Metrics::default());
        let protection = Arc::new(
            Protection::load(&cfg.payload_encryption, &cfg.authenticity, &cfg.custody)
                .map_err(|e| RunError::Fatal(e.join("; ")))?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let monitor = Arc::new(super::Monitor::new());
        let signals =
            super::signals::spawn(stop.clone(), Arc::new(OnceLock::new()), monitor.clone())?;
        let denials = Arc::new(crate::broker::Denials::default());
        let nc = crate::broker::connect_within(&cfg.nats, metrics.clone(), denials, timeout)
            .map_err(RunError::Broker)?;
        Ok(Session {
            metrics,
            protection,
            stop,
            monitor,
            signals,
            nc,
        })
    }
}

/// A replay seals records under the payload keys as `svc run` does, and the key's budget is the
/// operator's sum over every process that used it (docs/payload-protection.md): so each replay
/// or redrive says, at its end whatever the end, how many it sealed under which key.
impl Drop for Session {
    fn drop(&mut self) {
        let Some(encryptor) = &self.protection.encryptor else {
            return;
        };
        for (key_id, sealed) in encryptor.usage() {
            if sealed > 0 {
                eprintln!(
                    "svc: payload encryption: this replay (with its earlier runs) sealed \
                     {sealed} records under key {key_id}; add them to the key's count \
                     (payload_encrypted_total of the runners) when you decide its rotation"
                );
            }
        }
    }
}

/// The sink a replay writes into; `None` in a dry run. The spool is the runner's: a replay
/// that cannot write stops and is resumed.
fn open_sink(
    cfg: &RuntimeConfig,
    dry_run: bool,
    metrics: &Arc<Metrics>,
) -> Result<Option<Arc<dyn Sink>>, Failed> {
    if dry_run {
        return Ok(None);
    }
    let mut direct = cfg.clone();
    direct.spool = None;
    Ok(Some(super::build_sink(&direct, metrics)?.0))
}

/// Runs one replay (see the module comment).
pub fn run(cfg: RuntimeConfig, opts: &Options) -> Result<Report, Failed> {
    let session = Session::open(&cfg, opts.timeout)?;
    let file = StateFile {
        path: opts.state.clone(),
    };
    let plan = plan(&session.nc, &cfg.nats.stream, opts, &file)?;
    let sink_kind = cfg.sink.kind();
    let report = |finish, counts| Report {
        finish,
        counts,
        first: plan.first,
        last: plan.last,
        dry_run: opts.dry_run,
        sink: sink_kind,
    };
    if let Some(st) = plan.settled(&file, opts.dry_run)? {
        session.signals.close();
        return Ok(report(Finish::Done, st.counts));
    }
    session.count_sealed_before(&plan.state);
    let threads = Threads::start(&cfg, opts, &session, &plan, file)?;
    let (written, read) = threads.wait(&plan, opts.terminal());
    session.signals.close();
    let _ = crate::broker::flush(&session.nc, Duration::from_secs(2));
    if let (Ok((Finish::Done, st)), Ok(Finish::Done)) = (&written, &read) {
        // The whole range is settled: the state says so, and `--resume` has nothing to do.
        let mut st = st.clone();
        st.done = true;
        st.next_seq = st.last_seq.saturating_add(1);
        if !opts.dry_run {
            let file = StateFile {
                path: opts.state.clone(),
            };
            file.write(&st).map_err(|error| Failed {
                error,
                counts: st.counts,
            })?;
        }
    }
    finish(written.map(|(f, st)| (f, st.counts)), read, &report)
}

/// What the writer ends with: how and the state, or why it stopped and the counts settled.
type Written = Result<(Finish, State), (String, Counts)>;

/// The three threads of a replay (see the module comment).
struct Threads {
    read: std::thread::JoinHandle<Result<Finish, String>>,
    normalize: std::thread::JoinHandle<()>,
    write: std::thread::JoinHandle<Written>,
    progress: Arc<Progress>,
}

impl Threads {
    fn start(
        cfg: &RuntimeConfig,
        opts: &Options,
        session: &Session,
        plan: &Plan,
        file: StateFile,
    ) -> Result<Threads, Failed> {
        let sink = open_sink(cfg, opts.dry_run, &session.metrics)?;
        let d = &cfg.delivery;
        // One writer, so a batch is what `sink_workers` batches of the runner are together
        // (they share one commit in the runner too); the channels hold as many messages as its.
        let batch_size = d.batch_size * d.sink_workers.max(1);
        let in_flight = d
            .max_in_flight_batches
            .div_ceil(d.sink_workers.max(1))
            .max(2);
        let (raw_tx, raw_rx) = bounded::<RawBatch>(in_flight);
        let (sizes_tx, sizes_rx) = bounded::<u64>(in_flight + 2);
        let (prepared_tx, prepared_rx) = bounded::<PreparedBatch>(in_flight);
        let reader = Reader {
            nc: session.nc.clone(),
            request: Request {
                stream: cfg.nats.stream.clone(),
                subjects: opts.range.subjects.clone(),
                // Until a batch is settled, a time range starts at its time (a resumed one
                // too); after that at the first sequence not settled.
                start: match opts.range.since {
                    Some(since) if plan.state.counts.read == 0 => Start::Since(since),
                    _ => Start::Sequence(plan.state.next_seq),
                },
                max: u64::MAX,
                timeout: opts.timeout,
            },
            last: plan.last,
            until: opts.range.until,
            consumer: Arc::from(cfg.nats.consumer.as_str()),
            max_rate: opts.max_rate,
            batch_size,
            max_batch_wait: d.max_batch_wait,
            stop: session.stop.clone(),
            raw_tx,
            sizes_tx,
        };
        let read = super::spawn("svc-replay-read", move || reader.run())?;
        let normalizer =
            super::Normalizer::new(cfg, session.protection.clone(), session.metrics.clone());
        let mon = session.monitor.clone();
        let normalize = super::spawn("svc-normalize", move || {
            super::normalize::run(normalizer, raw_rx, prepared_tx, mon)
        })?;
        let progress = Arc::new(Progress::default());
        let writer = Writer {
            sink,
            dlq: (cfg.dead_letter.enabled && !opts.dry_run)
                .then(|| DeadLetterPublisher::new(session.nc.clone(), cfg.dead_letter.clone())),
            dead_letter: cfg.dead_letter.clone(),
            file: (!opts.dry_run).then_some(file),
            state: plan.state.clone(),
            progress: progress.clone(),
            stop: session.stop.clone(),
            redrive_of: None,
            last_dead_letter: None,
            protection: session.protection.clone(),
            lease: 0,
        };
        let write = super::spawn("svc-replay-write", move || {
            writer.run(prepared_rx, sizes_rx)
        })?;
        Ok(Threads {
            read,
            normalize,
            write,
            progress,
        })
    }

    /// Draws the progress until the writer ends, then joins the three. A thread that panicked
    /// is an error of the replay: the normalizer's end also ends the writer's input, which
    /// must not read as the range's end (the batches after it were never settled).
    fn wait(self, plan: &Plan, terminal: bool) -> (Written, Result<Finish, String>) {
        let mut display = Display::new("replay", plan.first, plan.last, terminal);
        while !self.write.is_finished() {
            display.tick(&self.progress);
            std::thread::sleep(Duration::from_millis(200));
        }
        display.finish(&self.progress);
        let written = self
            .write
            .join()
            .unwrap_or_else(|_| Err(("svc-replay-write panicked".into(), plan.state.counts)));
        let read = self
            .read
            .join()
            .unwrap_or_else(|_| Err("svc-replay-read panicked".into()));
        let read = match self.normalize.join() {
            Ok(()) => read,
            Err(_) => Err(
                "svc-normalize panicked: the batches after the last settled one were not \
                 settled (--resume continues)"
                    .into(),
            ),
        };
        (written, read)
    }
}

/// The replay's end from the writer's and the reader's results.
fn finish(
    written: Result<(Finish, Counts), (String, Counts)>,
    read: Result<Finish, String>,
    report: &dyn Fn(Finish, Counts) -> Report,
) -> Result<Report, Failed> {
    match (written, read) {
        (Err((error, counts)), _) | (Ok((_, counts)), Err(error)) => Err(Failed { error, counts }),
        (Ok((Finish::Interrupted, counts)), _) | (Ok((_, counts)), Ok(Finish::Interrupted)) => {
            Ok(report(Finish::Interrupted, counts))
        }
        (Ok((Finish::Done, counts)), Ok(Finish::Done)) => Ok(report(Finish::Done, counts)),
    }
}

fn fatal(e: String) -> Failed {
    Failed {
        error: e,
        counts: Counts::default(),
    }
}

impl Options {
    /// Whether standard error is a terminal (the progress line is redrawn there).
    pub fn terminal(&self) -> bool {
        use std::io::IsTerminal;
        std::io::stderr().is_terminal()
    }
}

/// The range as this run will read it.
struct Plan {
    first: u64,
    last: u64,
    state: State,
    /// The state file's lock ([`StateFile::lock`]), released when the plan is dropped.
    _lock: Option<state::Lock>,
}

impl Plan {
    /// The state of a range with nothing left to settle (written done, unless a dry run), or
    /// `None` when there is work.
    fn settled(&self, file: &StateFile, dry_run: bool) -> Result<Option<State>, Failed> {
        if !self.state.done && self.state.next_seq <= self.last {
            return Ok(None);
        }
        let mut st = self.state.clone();
        st.done = true;
        if !dry_run {
            file.write(&st).map_err(fatal)?;
        }
        Ok(Some(st))
    }
}

/// Fixes the range (or takes it from the state file with `--resume`) and checks the state
/// file: one for another range is refused, an unfinished one is never overwritten.
fn plan(
    nc: &crate::broker::Connection,
    stream: &str,
    opts: &Options,
    file: &StateFile,
) -> Result<Plan, Failed> {
    let shown = file.path.display();
    // Held for the whole run (in the plan); a dry run writes no state and takes none.
    let lock = match opts.dry_run {
        true => None,
        false => Some(file.lock().map_err(fatal)?),
    };
    let stored = file.read().map_err(fatal)?;
    let mut asked = opts.range.clone();
    asked.incarnation = crate::broker::incarnation::read(nc, stream)
        .map_err(|e| fatal(format!("stream {stream}: {e}")))?
        .to_string();
    if let Some(st) = &stored {
        if let Some(what) = state::mismatch(&st.range, &asked) {
            return Err(fatal(format!(
                "replay state {shown} belongs to another replay: {what} differ from when it was \
                 written; give another --state file, or remove this one to start over"
            )));
        }
    }
    let first = opts.range.start_seq.unwrap_or(1);
    match stored {
        Some(st) if opts.resume => {
            // What is left of the range may have been purged since the first run; a run that
            // removes what it settles moved the head itself.
            if !st.done && st.next_seq <= st.last_seq && !opts.removes_settled {
                let (stream_first, _) = inspect::sequences(nc, stream)
                    .map_err(|e| fatal(crate::text::error_chain(&e)))?;
                gone_before(stream, stream_first, Some(st.next_seq), Some(st.last_seq))?;
            }
            Ok(Plan {
                first,
                last: st.last_seq,
                state: st,
                _lock: lock,
            })
        }
        None if opts.resume => Err(fatal(format!(
            "--resume: no replay state at {shown}; start the replay without --resume"
        ))),
        Some(st) if !st.done && !opts.dry_run => Err(fatal(format!(
            "replay state {shown} holds an unfinished replay (next sequence {} of {}); continue \
             it with --resume, or remove the file to start over",
            st.next_seq, st.last_seq
        ))),
        _ => {
            let state = fresh_state(nc, stream, opts, asked)?;
            if !opts.dry_run {
                file.write(&state).map_err(fatal)?;
            }
            Ok(Plan {
                first,
                last: state.last_seq,
                state,
                _lock: lock,
            })
        }
    }
}

/// The state of a new replay of `asked`: the range fixed against what the stream holds now.
fn fresh_state(
    nc: &crate::broker::Connection,
    stream: &str,
    opts: &Options,
    asked: RangeKey,
) -> Result<State, Failed> {
    let first = opts.range.start_seq.unwrap_or(1);
    let (stream_first, stream_last) =
        inspect::sequences(nc, stream).map_err(|e| fatal(crate::text::error_chain(&e)))?;
    if opts.range.start_seq.is_some_and(|s| s > stream_last) {
        return Err(fatal(format!(
            "--start-seq {first} is beyond stream {stream}'s last sequence {stream_last}: \
             nothing to replay"
        )));
    }
    gone_before(
        stream,
        stream_first,
        opts.range.start_seq,
        opts.range.end_seq,
    )?;
    if let Some(since) = opts.range.since.filter(|_| stream_first > 1) {
        gone_since(nc, stream, stream_first, since, opts.timeout)?;
    }
    let last = opts
        .range
        .end_seq
        .map_or(stream_last, |e| e.min(stream_last));
    Ok(State {
        schema: state::SCHEMA.into(),
        range: asked,
        last_seq: last,
        next_seq: first.min(last.saturating_add(1)).max(1),
        done: false,
        counts: Counts::default(),
        sealed: Default::default(),
    })
}

/// A range the stream no longer holds (purged, aged out) is not a replay that read nothing:
/// wholly before the stream's first sequence it is refused; partly, what is gone is said.
fn gone_before(
    stream: &str,
    stream_first: u64,
    start: Option<u64>,
    end: Option<u64>,
) -> Result<(), Failed> {
    let Some(start) = start.filter(|s| *s < stream_first) else {
        return Ok(());
    };
    if end.is_some_and(|e| e < stream_first) {
        return Err(fatal(format!(
            "stream {stream} no longer holds sequences {start} to {} (its first is \
             {stream_first}: purged or aged out): nothing to replay",
            end.unwrap_or(start)
        )));
    }
    eprintln!(
        "svc: replay: stream {stream} no longer holds sequences {start} to {} (purged or aged \
         out); the replay starts at {stream_first}",
        stream_first - 1
    );
    Ok(())
}

/// A `--since` range may begin before what the stream still holds: when its first message
/// was stored after `since`, the purged ones before it may have been in the range, and the
/// replay says so (it cannot tell how many).
fn gone_since(
    nc: &crate::broker::Connection,
    stream: &str,
    stream_first: u64,
    since: i128,
    timeout: Duration,
) -> Result<(), Failed> {
    let first = crate::broker::dead_letter::fetch_stored(
        nc,
        stream,
        stream_first,
        timeout,
        redrive::MAX_ORIGINAL_ANSWER_BYTES,
    )
    .map_err(fatal)?;
    if first
        .and_then(|m| m.published_unix_nanos)
        .is_some_and(|t| t > since)
    {
        eprintln!(
            "svc: replay: stream {stream} no longer holds sequences 1 to {} (purged or aged \
             out); those stored after --since are not replayed",
            stream_first - 1
        );
    }
    Ok(())
}

/// `svc-replay-read`: the range through an ephemeral consumer, in batches.
struct Reader {
    nc: crate::broker::Connection,
    request: Request,
    last: u64,
    until: Option<i128>,
    /// The configured durable's name, which `svc run`'s records carry.
    consumer: Arc<str>,
    max_rate: Option<u32>,
    batch_size: usize,
    max_batch_wait: Duration,
    stop: Arc<AtomicBool>,
    raw_tx: Sender<RawBatch>,
    sizes_tx: Sender<u64>,
}

impl Reader {
    /// Reads to the end of the range; `Interrupted` when a signal stopped it.
    fn run(self) -> Result<Finish, String> {
        let mut pacer = self.max_rate.map(progress::Pacer::new);
        let mut batch: Vec<(RawMessage, i128)> = Vec::with_capacity(self.batch_size);
        let (mut bytes, mut opened) = (0u64, Instant::now());
        let mut finish = Finish::Done;
        let mut closed = false;
        let ship = |batch: &mut Vec<(RawMessage, i128)>, bytes: &mut u64| {
            if batch.is_empty() {
                return true;
            }
            let messages = std::mem::take(batch);
            let id = messages.last().map_or(0, |m| m.0.stream_sequence);
            let families = vec![None; messages.len()];
            self.sizes_tx.send(std::mem::take(bytes)).is_ok()
                && self
                    .raw_tx
                    .send(RawBatch {
                        id,
                        messages,
                        families,
                    })
                    .is_ok()
        };
        let (read, ended) = inspect::read_while(
            &self.nc,
            &self.request,
            "svc replay",
            Some(&self.stop),
            |mut raw, _| {
                if self.stop.load(Ordering::SeqCst) {
                    finish = Finish::Interrupted;
                    return false;
                }
                let seq = raw.stream_sequence;
                let late = self
                    .until
                    .is_some_and(|u| raw.published_unix_nanos.is_some_and(|p| p > u));
                if seq > self.last || late {
                    return false;
                }
                raw.consumer = Arc::clone(&self.consumer);
                if batch.is_empty() {
                    opened = Instant::now();
                }
                bytes += raw.data.len() as u64;
                batch.push((raw, now_unix_nanos()));
                if let Some(p) = &mut pacer {
                    p.wait();
                }
                if (batch.len() >= self.batch_size || opened.elapsed() >= self.max_batch_wait)
                    && !ship(&mut batch, &mut bytes)
                {
                    closed = true;
                    return false;
                }
                seq < self.last
            },
        )
        .map_err(|e| crate::text::error_chain(&e))?;
        if !closed {
            ship(&mut batch, &mut bytes);
        }
        log::debug!("svc-replay-read: {read} messages read");
        self.end(ended, finish)
    }

    /// How the read ended, said as the replay's finish or its error.
    fn end(&self, ended: Ended, mut finish: Finish) -> Result<Finish, String> {
        // A signal during a wait for the broker ends the read without a message to see it.
        if ended == Ended::Stopped && self.stop.load(Ordering::SeqCst) {
            finish = Finish::Interrupted;
        }
        match ended {
            Ended::TimedOut { pending } => Err(format!(
                "broker: nothing arrived for {} s while the replay consumer still held {pending} \
                 messages; the replay stops at the last settled batch (--resume continues)",
                self.request.timeout.as_secs()
            )),
            Ended::Gap { expected, got } => Err(format!(
                "broker: delivery {got} arrived where {expected} was expected (deliveries were \
                 dropped); the replay stops at the last settled batch (--resume continues)"
            )),
            _ => Ok(finish),
        }
    }
}

/// `svc-replay-write`: settles each batch in order and records the progress durably.
struct Writer {
    /// `None` in a dry run.
    sink: Option<Arc<dyn Sink>>,
    dlq: Option<DeadLetterPublisher>,
    dead_letter: crate::broker::dead_letter::DeadLetterConfig,
    file: Option<StateFile>,
    state: State,
    progress: Arc<Progress>,
    stop: Arc<AtomicBool>,
    /// `svc dlq redrive`: the sequence of the dead-letter record being redriven.
    redrive_of: Option<u64>,
    /// The dead-letter stream's sequence of the last record this writer published.
    last_dead_letter: Option<u64>,
    /// Whose per-key counts of sealed records go into the state file.
    protection: Arc<Protection>,
    /// Records the state file counts as sealed under the active key beyond those sealed so
    /// far (`svc dlq redrive`'s lease, see `redrive::SEALED_LEASE`; 0 for a replay).
    lease: u64,
}

impl Writer {
    fn run(mut self, rx: Receiver<PreparedBatch>, sizes: Receiver<u64>) -> Written {
        let mut finish = Finish::Done;
        for batch in rx {
            let bytes = sizes.recv().unwrap_or(0);
            let last_seq = batch.id;
            if let Err(e) = self.settle(batch) {
                return Err((e, self.state.counts));
            }
            self.state.counts.bytes += bytes;
            self.state.next_seq = last_seq.saturating_add(1);
            self.persist().map_err(|e| (e, self.state.counts))?;
            self.progress
                .messages
                .store(self.state.counts.read, Ordering::Relaxed);
            self.progress
                .bytes
                .store(self.state.counts.bytes, Ordering::Relaxed);
            self.progress.position.store(last_seq, Ordering::Relaxed);
        }
        if self.stop.load(Ordering::SeqCst) {
            finish = Finish::Interrupted;
        }
        // Not marked done here: only the reader knows whether the range ended or it failed.
        Ok((finish, self.state))
    }

    fn persist(&mut self) -> Result<(), String> {
        if let Some(encryptor) = &self.protection.encryptor {
            let active = encryptor.config().active_key_id.as_str();
            self.state.sealed = encryptor
                .usage()
                .into_iter()
                .map(|(k, n)| {
                    (
                        k,
                        n.saturating_add(if k == active { self.lease } else { 0 }),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| (k.to_string(), n))
                .collect();
        }
        match &self.file {
            Some(f) => f.write(&self.state),
            None => Ok(()),
        }
    }

    /// Every message of the batch stored, already present, refused or dead-lettered.
    fn settle(&mut self, batch: PreparedBatch) -> Result<(), String> {
        let mut envelopes = Vec::with_capacity(batch.items.len());
        for item in batch.items {
            self.state.counts.read += 1;
            match item {
                Ok(p) => envelopes.push(p.envelope),
                Err((rejection, _)) if rejection.retry => {
                    return Err(format!(
                        "a message of the batch ending at stream sequence {} cannot be prepared \
                         now ({}); fix it and continue with --resume",
                        batch.id, rejection.reason
                    ))
                }
                Err((rejection, _)) => {
                    self.state.counts.refused_governance += 1;
                    if let Some(dl) = rejection.dead_letter {
                        self.dead_letter(dl)?;
                    }
                }
            }
        }
        let Some(sink) = self.sink.clone() else {
            // A dry run: what would be stored.
            self.state.counts.stored += envelopes.len() as u64;
            return Ok(());
        };
        self.write(&sink, envelopes)
    }

    /// Writes the envelopes, again and again for those the sink failed transiently (up to
    /// [`WRITE_ATTEMPTS`] with a growing wait); a permanent refusal is dead-lettered.
    fn write(&mut self, sink: &Arc<dyn Sink>, mut envelopes: Vec<Envelope>) -> Result<(), String> {
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1..=WRITE_ATTEMPTS {
            let outcomes = sink.write_batch(&envelopes);
            if outcomes.len() != envelopes.len() {
                return Err(format!(
                    "sink {} returned {} outcomes for {} records",
                    sink.kind(),
                    outcomes.len(),
                    envelopes.len()
                ));
            }
            let mut again = Vec::new();
            let mut first_failure = None;
            for (outcome, env) in outcomes.into_iter().zip(envelopes) {
                match outcome {
                    // A replay never writes through the spool (`direct.spool = None`).
                    WriteOutcome::Durable | WriteOutcome::Spooled => self.state.counts.stored += 1,
                    WriteOutcome::AlreadyDurable => self.state.counts.already_present += 1,
                    WriteOutcome::Permanent(e) => {
                        self.state.counts.refused_sink += 1;
                        if self.dlq.is_some() {
                            let cfg = &self.dead_letter;
                            self.dead_letter(DeadLetter::build_for_sink(
                                &env,
                                (e.sink, e.class),
                                now_unix_nanos(),
                                cfg,
                            ))?;
                        }
                    }
                    WriteOutcome::Transient(e) => {
                        first_failure.get_or_insert(crate::text::error_chain(&e));
                        again.push(env);
                    }
                }
            }
            envelopes = again;
            let Some(failure) = first_failure else {
                return Ok(());
            };
            if attempt == WRITE_ATTEMPTS || self.stop.load(Ordering::SeqCst) {
                return Err(format!(
                    "sink {}: {} records not written after {attempt} attempts: {failure}; \
                     --resume continues from the last settled batch",
                    sink.kind(),
                    envelopes.len()
                ));
            }
            log::warn!(
                "sink {}: {} records not written (attempt {attempt} of {WRITE_ATTEMPTS}): \
                 {failure}",
                sink.kind(),
                envelopes.len()
            );
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        Ok(())
    }

    /// Publishes a refusal's record, marked as replayed, and waits for the broker's PubAck.
    fn dead_letter(&mut self, dl: DeadLetter) -> Result<(), String> {
        let Some(dlq) = &self.dlq else {
            return Ok(());
        };
        let dl = match self.redrive_of {
            Some(seq) => dl.replayed().redriven(seq),
            None => dl.replayed(),
        };
        let ack = dlq
            .publish(&dl)
            .map_err(|e| format!("dead-letter queue: {e}; --resume continues"))?;
        self.last_dead_letter = Some(ack.sequence);
        self.state.counts.dead_lettered += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        let state = State {
            schema: state::SCHEMA.into(),
            range: RangeKey {
                config: "/etc/svc.json".into(),
                stream: "S".into(),
                subjects: vec!["o.>".into()],
                sink: "configured".into(),
                start_seq: None,
                end_seq: None,
                since: None,
                until: None,
                filter: None,
                incarnation: "20261129T000000Z".into(),
                shape: "ab".repeat(32),
            },
            last_seq: 10,
            next_seq: 1,
            done: false,
            counts: Counts::default(),
            sealed: Default::default(),
        };
        Plan {
            first: 1,
            last: 10,
            state,
            _lock: None,
        }
    }

    /// The normalizer's panic ends the writer's input as the range's end would (the channel
    /// closes) and the reader's sends fail quietly: the replay must end in an error, not Done
    /// (which would mark the whole range settled in the state file).
    #[test]
    fn a_normalizer_panic_is_an_error_not_the_end_of_the_range() {
        let plan = plan();
        let st = plan.state.clone();
        let threads = Threads {
            read: std::thread::spawn(|| Ok(Finish::Done)),
            normalize: std::thread::spawn(|| panic!("a message the normalizer did not expect")),
            write: std::thread::spawn(move || Ok((Finish::Done, st))),
            progress: Arc::new(Progress::default()),
        };
        let (written, read) = threads.wait(&plan, false);
        assert!(matches!(written, Ok((Finish::Done, _))));
        let e = read.as_ref().unwrap_err();
        assert!(e.starts_with("svc-normalize panicked"), "{e}");
        let report = |finish, counts| Report {
            finish,
            counts,
            first: 1,
            last: 10,
            dry_run: false,
            sink: "file",
        };
        let ended = finish(written.map(|(f, st)| (f, st.counts)), read, &report);
        assert!(ended.is_err(), "the replay ends in an error");
    }
}
