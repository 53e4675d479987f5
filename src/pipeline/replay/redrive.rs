//! `svc dlq redrive`: brings dead letters home. Reads the dead-letter stream's records in
//! order (an ephemeral consumer of its own, as `svc dlq list`), keeps those the filter selects,
//! fetches each one's original from the configured source stream by sequence
//! (`STREAM.MSG.GET`, read-only, bounded, one deadline), settles it through replay's
//! [`Writer`] (the runner's normalizer, the sink, the DLQ as `svc run` would), and removes the
//! dead-letter record only once its message is settled: stored, already present, or refused
//! again and dead-lettered anew (the new record confirmed by the broker first).
//!
//! The records are hostile input: one is read only when it is a `svc.dead-letter.v1` record
//! within [`MAX_RECORD_BYTES`]; the stream read is always the configuration's
//! (`nats.stream`), never the one a record names (a record naming another is kept and
//! reported); the original must be of the incarnation, subject and payload digest the record
//! names and match `nats.subjects`, or the record is kept. An original the stream no longer
//! holds is reported and its record kept, never guessed.
//!
//! Progress is replay's state file (`svc.replay.state.v1`, the range being the dead-letter
//! stream's sequences fixed at the start, the filters in `range.filter`): it moves past a
//! record only once the record is settled (removed or reported as kept), so `--resume` never
//! skips one. A crash between the sink's success and the removal redrives that record again
//! (a keyed sink says "already present"). See docs/replay.md.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::progress::{Display, Progress};
use super::state::StateFile;
use super::{Failed, Finish, Report, Session, Writer};
use crate::broker::dead_letter::{self, DeadLetterPublisher, StoredOriginal, DEAD_LETTER_SCHEMA};
use crate::broker::inspect::{self, Ended, Request, Start};
use crate::config::RuntimeConfig;
use crate::message::envelope::{hex_sha256, now_unix_nanos, RawMessage};
use crate::message::subject::SubjectPattern;
use crate::pipeline::{Normalizer, PreparedBatch};
use crate::text::peer::PeerText;

/// Largest dead-letter record read (a record is a few KiB: its values are bounded).
pub const MAX_RECORD_BYTES: usize = 256 * 1024;
/// Largest `STREAM.MSG.GET` answer for an original (base64 adds a third to the message).
pub const MAX_ORIGINAL_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// Longest original subject a record may name (the broker's own bound is smaller).
const MAX_SUBJECT_BYTES: usize = 4096;

/// Which records a redrive takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// `failure.reason` equals this.
    pub reason: Option<String>,
    /// `failure.stage` equals this (the class of check: `sink`, `security_labels`, ...).
    pub class: Option<String>,
    /// `original.subject` matches this pattern.
    pub subject: Option<SubjectPattern>,
}

impl Filter {
    /// The filter as one text, kept in the state file (a resumed redrive must ask the same).
    pub fn key(&self) -> String {
        format!(
            "reason={} class={} subject={}",
            self.reason.as_deref().unwrap_or("*"),
            self.class.as_deref().unwrap_or("*"),
            self.subject.as_ref().map_or("*".into(), |p| p.to_string())
        )
    }

    fn wants(&self, r: &Record) -> bool {
        self.reason.as_ref().is_none_or(|x| *x == r.reason)
            && self.class.as_ref().is_none_or(|x| *x == r.stage)
            && self.subject.as_ref().is_none_or(|p| p.matches(&r.subject))
    }
}

/// What to redrive and how. `replay.range` names the dead-letter stream, its subject, the
/// `--since` and the filter's [`Filter::key`].
#[derive(Debug, Clone)]
pub struct Options {
    pub replay: super::Options,
    pub dead_letter_stream: String,
    pub filter: Filter,
}

/// What a redrive reads of a record; everything else in it is ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    stage: String,
    reason: String,
    subject: String,
    stream: String,
    incarnation: String,
    sequence: u64,
    consumer_sequence: u64,
    delivery_count: u64,
    /// `original.published_at`: when the broker stored the original. A stream created again
    /// numbers from 1, and its message at the record's sequence was stored at another time.
    published: i128,
    digest: Digest,
}

/// The payload digest a record names: the plain SHA-256, or, for a subject whose payloads are
/// encrypted, the keyed digest (`payload.hmac_sha256`) that only the payload key can compute.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Digest {
    Plain(String),
    Keyed(String),
}

/// The longest stream incarnation a record may name (the compact UTC form is 26 bytes).
const MAX_INCARNATION_BYTES: usize = 64;

fn is_hex_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `a == b` for two digests, in time independent of where they first differ.
fn same_digest(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| {
            d | (x.to_ascii_lowercase() ^ y.to_ascii_lowercase())
        }) == 0
}

/// The record in `data`, or why it is not one.
fn parse_record(data: &[u8]) -> Result<Record, &'static str> {
    if data.len() > MAX_RECORD_BYTES {
        return Err("larger than a record can be");
    }
    let v: Value = serde_json::from_slice(data).map_err(|_| "not JSON")?;
    if v["schema"] != DEAD_LETTER_SCHEMA {
        return Err("not of schema svc.dead-letter.v1");
    }
    let text = |v: &Value| v.as_str().map(str::to_string);
    let o = &v["original"];
    let subject = text(&o["subject"])
        .filter(|s| !s.is_empty() && s.len() <= MAX_SUBJECT_BYTES)
        .ok_or("original.subject missing or invalid")?;
    // A record without its original's incarnation and payload digest cannot be told from a
    // forgery naming a message that was delivered: redriving it would deliver that one again.
    let incarnation = text(&o["stream_incarnation"])
        .filter(|s| !s.is_empty() && s.len() <= MAX_INCARNATION_BYTES)
        .ok_or("original.stream_incarnation missing or invalid")?;
    let published = text(&o["published_at"])
        .filter(|t| t.len() <= 64)
        .and_then(|t| crate::text::rfc3339::parse_rfc3339_nanos(&t))
        .ok_or("original.published_at missing or not RFC 3339")?;
    let p = &v["payload"];
    let digest = match (text(&p["sha256"]), text(&p["hmac_sha256"])) {
        (Some(d), None) if is_hex_digest(&d) => Digest::Plain(d),
        (None, Some(d)) if is_hex_digest(&d) => Digest::Keyed(d),
        _ => {
            return Err("not exactly one of payload.sha256 and payload.hmac_sha256 (64 hex digits)")
        }
    };
    let (consumer_sequence, delivery_count) = delivery_of(o)?;
    Ok(Record {
        stage: text(&v["failure"]["stage"]).unwrap_or_default(),
        reason: text(&v["failure"]["reason"]).unwrap_or_default(),
        subject,
        stream: text(&o["stream"]).ok_or("original.stream missing")?,
        incarnation,
        sequence: o["stream_sequence"]
            .as_u64()
            .filter(|s| *s >= 1)
            .ok_or("original.stream_sequence missing or invalid")?,
        consumer_sequence,
        delivery_count,
        published,
        digest,
    })
}

/// How this run settled an original.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Stored, or found stored.
    Stored,
    /// Refused again: its new dead-letter record is written.
    DeadLettered,
}

/// The largest consumer sequence or delivery count a record may name: JSON numbers above
/// 2^53 are not exact in every reader of the stored record.
const MAX_DELIVERY_NUMBER: u64 = 1 << 53;

/// `original.consumer_sequence` and `original.delivery_count`: which delivery was
/// dead-lettered. The redriven record carries them as `svc run` would have, so they must
/// describe a delivery that can have happened: every delivery takes a consumer sequence of
/// its own, so the n-th delivery of a message has a consumer sequence of at least n. They
/// decide nothing else (a publisher on the dead-letter subject can still write any such pair).
fn delivery_of(o: &Value) -> Result<(u64, u64), &'static str> {
    let number = |v: &Value| v.as_u64().filter(|n| (1..=MAX_DELIVERY_NUMBER).contains(n));
    let consumer_sequence = number(&o["consumer_sequence"])
        .ok_or("original.consumer_sequence missing or not from 1 to 2^53")?;
    let delivery_count = number(&o["delivery_count"])
        .ok_or("original.delivery_count missing or not from 1 to 2^53")?;
    if delivery_count > consumer_sequence {
        return Err(
            "original.delivery_count is above original.consumer_sequence: no delivery \
                    of the broker numbers so",
        );
    }
    Ok((consumer_sequence, delivery_count))
}

/// What becomes of one record of the range.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    /// Not selected by the filter: untouched, not counted.
    Skipped,
    /// Its message is settled: the record goes (not in a dry run).
    Remove,
    /// Kept, and why (reported).
    Keep(String),
}

/// The redrive of one range of the dead-letter stream.
struct Redrive<'a> {
    cfg: &'a RuntimeConfig,
    opts: &'a Options,
    nc: crate::broker::Connection,
    /// The source stream's incarnation now.
    incarnation: Arc<str>,
    subjects: Vec<SubjectPattern>,
    normalizer: Normalizer,
    /// The keyed digest of a subject whose payloads are encrypted (a record's `hmac_sha256`).
    protection: Arc<crate::message::protection::Protection>,
    /// The original sequences whose messages this run settled, and how: a second record of
    /// one original (two forged, or one re-published past the duplicate window) is removed,
    /// neither delivered nor dead-lettered again. One entry per settled record (the range is
    /// the dead-letter stream's, bounded).
    settled: std::collections::HashMap<u64, Settled>,
    writer: Writer,
    ages: crate::metrics::Summary,
    /// When the state file was last written (see [`Redrive::persist_due`]).
    persisted: Instant,
    /// Records sealed (all keys, earlier runs included) up to which the state file already
    /// counts (see [`SEALED_LEASE`]).
    leased: u64,
}

/// The state file is written at most every [`PERSIST_EVERY`], but a record sealed, stored and
/// removed since would never be counted after a kill -9 (it is not read again): so before a
/// record may be sealed beyond what the file counts, the file is written counting this many
/// more under the active key. A crash over-counts by at most this many (the key's bound is
/// reached that much sooner); a clean end writes the exact count.
const SEALED_LEASE: u64 = 64;

/// The state file is written at most this often while records settle, and always at the end,
/// on a signal and on an error. A crash in between costs nothing: what was settled since was
/// removed from the dead-letter stream (not read again) or kept (settled again, the counts being
/// the file's).
const PERSIST_EVERY: Duration = Duration::from_millis(250);

/// Runs one redrive (see the module comment).
pub fn run(cfg: RuntimeConfig, opts: &Options) -> Result<Report, Failed> {
    let session = Session::open(&cfg, opts.replay.timeout)?;
    let nc = session.nc.clone();
    let file = StateFile {
        path: opts.replay.state.clone(),
    };
    if !opts.replay.dry_run {
        removable(&nc, &opts.dead_letter_stream).map_err(super::fatal)?;
    }
    let plan = super::plan(&nc, &opts.dead_letter_stream, &opts.replay, &file)?;
    let report = |finish, counts| Report {
        finish,
        counts,
        first: plan.first,
        last: plan.last,
        dry_run: opts.replay.dry_run,
        sink: cfg.sink.kind(),
    };
    if let Some(st) = plan.settled(&file, opts.replay.dry_run)? {
        session.signals.close();
        return Ok(report(Finish::Done, st.counts));
    }
    session.count_sealed_before(&plan.state);
    let (incarnation, retention) =
        crate::broker::incarnation::read_with_retention(&nc, &cfg.nats.stream)
            .map_err(|e| super::fatal(format!("stream {}: {e}", cfg.nats.stream)))?;
    warn_of_retention(&cfg.nats.stream, &retention);
    let dry_run = opts.replay.dry_run;
    let progress = Arc::new(Progress::default());
    let writer = Writer {
        sink: super::open_sink(&cfg, dry_run, &session.metrics)?,
        dlq: (!dry_run).then(|| DeadLetterPublisher::new(nc.clone(), cfg.dead_letter.clone())),
        dead_letter: cfg.dead_letter.clone(),
        file: (!dry_run).then_some(file),
        state: plan.state.clone(),
        progress: progress.clone(),
        stop: session.stop.clone(),
        redrive_of: None,
        last_dead_letter: None,
        protection: session.protection.clone(),
        lease: 0,
    };
    let mut redrive = Redrive {
        cfg: &cfg,
        opts,
        nc,
        incarnation,
        subjects: cfg
            .nats
            .subjects
            .iter()
            .filter_map(|s| SubjectPattern::parse(s).ok())
            .collect(),
        normalizer: Normalizer::new(&cfg, session.protection.clone(), session.metrics.clone()),
        protection: session.protection.clone(),
        settled: Default::default(),
        writer,
        ages: Default::default(),
        persisted: Instant::now(),
        leased: 0,
    };
    let mut display = Display::new("redrive", plan.first, plan.last, opts.replay.terminal());
    let read = redrive.read(plan.last, &mut display);
    display.finish(&progress);
    session.signals.close();
    let _ = crate::broker::flush(&redrive.nc, Duration::from_secs(2));
    let finish = read.map_err(|error| Failed {
        error,
        counts: redrive.writer.state.counts,
    })?;
    let counts = finished_state(&redrive.writer, finish)?;
    Ok(report(finish, counts))
}

/// The redrive's counts at its end; when it read its whole range, its state file is marked
/// done (a later run with the same range has nothing left to do).
fn finished_state(writer: &Writer, finish: Finish) -> Result<super::state::Counts, Failed> {
    let mut st = writer.state.clone();
    if finish == Finish::Done {
        st.done = true;
        st.next_seq = st.last_seq.saturating_add(1);
        if let Some(f) = &writer.file {
            f.write(&st).map_err(|error| Failed {
                error,
                counts: st.counts,
            })?;
        }
    }
    Ok(st.counts)
}

/// A stream that removes acknowledged messages (`workqueue`, and `interest` once every
/// consumer acknowledged) no longer holds a dead letter's original: the runner acknowledged it
/// after dead-lettering it. Said once before the records are read; each record is then
/// reported as "original missing" and kept, as for a purged original.
fn warn_of_retention(stream: &str, retention: &str) {
    let why = match retention {
        "workqueue" => "removes every message once it is acknowledged",
        "interest" => "removes a message once every consumer acknowledged it",
        _ => return,
    };
    eprintln!(
        "svc: redrive: stream {stream} has retention {retention}: it {why}, and the runner \
         acknowledged each dead-lettered message, so its original is most likely gone; such \
         records are reported as original missing and kept (docs/replay.md)"
    );
}

/// Refuses a dead-letter stream that cannot give up a record (`deny_delete`): the redrive
/// would store the first record's message, fail to remove it, and store it again at every
/// `--resume`.
fn removable(nc: &crate::broker::Connection, stream: &str) -> Result<(), String> {
    let timeout = crate::broker::consumer_shape::API_TIMEOUT;
    let info = crate::broker::incarnation::stream_info(nc, stream, timeout)
        .map_err(|e| format!("stream {stream}: {e}"))?;
    if info["config"]["deny_delete"] == true {
        return Err(format!(
            "dead-letter stream {stream} has deny_delete set: a redrive removes each record \
             it settles and cannot; nothing was redriven (allow deletes on the stream, or \
             use --dry-run to look)"
        ));
    }
    Ok(())
}

impl Redrive<'_> {
    /// Reads the records up to `last` and settles each; `Interrupted` when a signal stopped it.
    fn read(&mut self, last: u64, display: &mut Display) -> Result<Finish, String> {
        let o = &self.opts.replay;
        let next = self.writer.state.next_seq;
        let request = Request {
            stream: self.opts.dead_letter_stream.clone(),
            subjects: vec![self.cfg.dead_letter.subject.clone()],
            start: match o.range.since {
                Some(since) if next <= 1 => Start::Since(since),
                _ => Start::Sequence(next),
            },
            max: u64::MAX,
            timeout: o.timeout,
        };
        let mut pacer = o.max_rate.map(super::progress::Pacer::new);
        let (mut count, mut finish, mut failed) = (0u64, Finish::Done, None);
        let progress = self.writer.progress.clone();
        let nc = self.nc.clone();
        let stop = self.writer.stop.clone();
        let read = inspect::read_while(&nc, &request, "svc dlq redrive", Some(&stop), |raw, _| {
            if self.writer.stop.load(Ordering::SeqCst) {
                finish = Finish::Interrupted;
                return false;
            }
            let seq = raw.stream_sequence;
            if seq > last {
                return false;
            }
            if let Err(e) = self.one(seq, &raw.data) {
                failed = Some(e);
                return false;
            }
            count += 1;
            display.tick(&progress);
            if let Some(p) = &mut pacer {
                p.wait();
            }
            seq < last
        });
        // Whatever ended the read, what was settled is on record before anything is said
        // (the exact count sealed: this process is not dying).
        self.writer.lease = 0;
        self.writer.persist()?;
        let (_, ended) = read.map_err(|e| crate::text::error_chain(&e))?;
        // A signal during a wait for the broker ends the read without a record to see it.
        if ended == Ended::Stopped && self.writer.stop.load(Ordering::SeqCst) {
            finish = Finish::Interrupted;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        match ended {
            Ended::TimedOut { pending } => Err(format!(
                "broker: nothing arrived for {} s while the redrive's consumer still held \
                 {pending} records; the redrive stops at the last settled record (--resume \
                 continues)",
                o.timeout.as_secs()
            )),
            Ended::Gap { expected, got } => Err(format!(
                "broker: delivery {got} arrived where {expected} was expected; the redrive \
                 stops at the last settled record (--resume continues)"
            )),
            _ => Ok(finish),
        }
    }

    /// Settles the record at `seq` of the dead-letter stream, removes it when its message is
    /// settled, and records the progress durably.
    fn one(&mut self, seq: u64, data: &[u8]) -> Result<(), String> {
        let fate = self.fate(seq, data)?;
        let stream = &self.opts.dead_letter_stream;
        match &fate {
            Fate::Remove if self.writer.file.is_some() => {
                let timeout = self.opts.replay.timeout;
                // A removal names the record by sequence alone: only in the stream it was read
                // from (one created again mid-redrive numbers other records from 1).
                let read_from = &self.writer.state.range.incarnation;
                if dead_letter::delete_stored_of(&self.nc, stream, read_from, seq, timeout)
                    .map_err(|e| format!("{e}; the redrive stops (start a new one)"))?
                {
                    self.writer.state.counts.removed += 1;
                }
            }
            Fate::Keep(why) => eprintln!("redrive: dead-letter record {stream} {seq} kept: {why}"),
            Fate::Remove | Fate::Skipped => {}
        }
        self.writer.state.next_seq = seq.saturating_add(1);
        self.persist_due()?;
        let counts = &self.writer.state.counts;
        let p = &self.writer.progress;
        p.messages.store(counts.read, Ordering::Relaxed);
        p.bytes.store(counts.bytes, Ordering::Relaxed);
        p.position.store(seq, Ordering::Relaxed);
        Ok(())
    }

    /// Before a record may be sealed past what the state file counts, writes the file
    /// counting [`SEALED_LEASE`] more ahead.
    fn lease_sealed(&mut self) -> Result<(), String> {
        let Some(encryptor) = &self.protection.encryptor else {
            return Ok(());
        };
        let used: u64 = encryptor.usage().iter().map(|(_, n)| *n).sum();
        if used < self.leased {
            return Ok(());
        }
        self.writer.lease = SEALED_LEASE;
        self.writer.persist()?;
        self.leased = used.saturating_add(SEALED_LEASE);
        self.persisted = Instant::now();
        Ok(())
    }

    /// Writes the state file when [`PERSIST_EVERY`] has passed since the last write: one
    /// fsynced rename per record cost more than the rest of a record's work.
    fn persist_due(&mut self) -> Result<(), String> {
        if self.persisted.elapsed() >= PERSIST_EVERY {
            self.writer.persist()?;
            self.persisted = Instant::now();
        }
        Ok(())
    }

    /// What becomes of the record at `seq`: its original fetched, checked against it and
    /// settled through the writer. Err: the redrive cannot go on (broker, sink, DLQ).
    fn fate(&mut self, seq: u64, data: &[u8]) -> Result<Fate, String> {
        let source = &self.cfg.nats.stream;
        let record = match parse_record(data) {
            Ok(r) => r,
            Err(why) => {
                self.writer.state.counts.kept += 1;
                return Ok(Fate::Keep(format!("not a dead-letter record ({why})")));
            }
        };
        if !self.opts.filter.wants(&record) {
            return Ok(Fate::Skipped);
        }
        let counts = &mut self.writer.state.counts;
        if record.stream != *source {
            counts.read += 1;
            counts.kept += 1;
            return Ok(Fate::Keep(format!(
                "it names stream {}, not the configured stream {source}: nothing read",
                PeerText::new(&record.stream)
            )));
        }
        let (n, inc) = (record.sequence, &record.incarnation);
        if **inc != *self.incarnation {
            counts.read += 1;
            counts.original_missing += 1;
            return Ok(Fate::Keep(format!(
                "original {source} sequence {n} is gone: the stream was created again since \
                 the record (incarnation {} then, {} now)",
                PeerText::new(inc),
                self.incarnation
            )));
        }
        let timeout = self.opts.replay.timeout;
        let fetched =
            dead_letter::fetch_stored(&self.nc, source, n, timeout, MAX_ORIGINAL_ANSWER_BYTES)?;
        let Some(stored) = fetched else {
            counts.read += 1;
            counts.original_missing += 1;
            return Ok(Fate::Keep(format!(
                "original {source} sequence {n} is no longer in the stream"
            )));
        };
        let raw = self.raw_message(&record, stored);
        if let Some(why) = self.foreign(&record, &raw) {
            let counts = &mut self.writer.state.counts;
            counts.read += 1;
            counts.kept += 1;
            return Ok(Fate::Keep(format!("{source} sequence {n} {why}")));
        }
        self.writer.state.counts.bytes += raw.data.len() as u64;
        match self.settled.get(&n) {
            // Its message was settled by an earlier record of this run: stored once is enough.
            Some(Settled::Stored) => {
                let counts = &mut self.writer.state.counts;
                counts.read += 1;
                counts.already_present += 1;
                return Ok(Fate::Remove);
            }
            // Refused again by an earlier record of this run, whose new record stands for it.
            Some(Settled::DeadLettered) => {
                self.writer.state.counts.read += 1;
                eprintln!(
                    "svc: redrive: dead-letter sequence {seq}: original {source} sequence {n} \
                     was refused again and dead-lettered anew by an earlier record of this run; \
                     this second record of it is removed"
                );
                return Ok(Fate::Remove);
            }
            None => {}
        }
        self.settle(seq, &raw)
    }

    /// Why the stored message is not the record's original, if it is not.
    fn foreign(&self, record: &Record, stored: &RawMessage) -> Option<&'static str> {
        if stored.subject != record.subject {
            return Some("holds a message of another subject than the record's");
        }
        if !self.subjects.iter().any(|p| p.matches(&stored.subject)) {
            return Some("holds a message outside nats.subjects");
        }
        if stored.published_unix_nanos != Some(record.published) {
            // Read after the fetch: the stream's incarnation checked at the start does not
            // cover a stream created again since, but its messages' times do.
            return Some(
                "holds a message stored at another time than the record's original (the \
                 stream was created again, or the record is not the runner's)",
            );
        }
        match (&record.digest, self.protection.dlq_payload_digest(stored)) {
            (Digest::Plain(d), None) if same_digest(d, &hex_sha256(&stored.data)) => None,
            (Digest::Keyed(d), Some(keyed)) if same_digest(d, &keyed) => None,
            (Digest::Plain(_), None) => Some("holds a payload whose SHA-256 is not the record's"),
            (Digest::Keyed(_), Some(_)) => Some(
                "holds a payload whose keyed digest is not the record's (another payload, or \
                 the payload key's digest key changed since)",
            ),
            (Digest::Plain(_), Some(_)) => Some(
                "is of a subject whose payloads are encrypted, and the record names a plain \
                 SHA-256, not the keyed digest the runner writes for it",
            ),
            (Digest::Keyed(_), None) => Some(
                "is of a subject whose payloads are not encrypted here, and the record names a \
                 keyed digest (payload_encryption differs from when it was dead-lettered)",
            ),
        }
    }

    /// The original as `svc run` would have read it (the configured durable's name, the
    /// record's consumer sequence and delivery count).
    fn raw_message(&self, record: &Record, stored: StoredOriginal) -> RawMessage {
        let (map, unreadable) = if stored.headers.is_empty() {
            (None, None)
        } else {
            let (map, why) = nats::header::read_headers(&stored.headers);
            (Some(map), why)
        };
        let (headers, header_block) = crate::broker::header_pairs(map, unreadable.is_some());
        RawMessage {
            subject: stored.subject,
            stream: Arc::from(self.cfg.nats.stream.as_str()),
            stream_incarnation: self.incarnation.clone(),
            consumer: Arc::from(self.cfg.nats.consumer.as_str()),
            stream_sequence: record.sequence,
            consumer_sequence: record.consumer_sequence,
            delivery_count: record.delivery_count,
            published_unix_nanos: stored.published_unix_nanos,
            headers,
            data: stored.data,
            unreadable,
            header_block,
        }
    }

    /// Normalizes the original and settles it through the writer; the record goes once the
    /// message is stored, already present, or dead-lettered anew under another sequence.
    fn settle(&mut self, seq: u64, raw: &RawMessage) -> Result<Fate, String> {
        self.lease_sealed()?;
        let item = self
            .normalizer
            .prepare(raw, now_unix_nanos(), None, &mut self.ages)
            .map_err(|r| (r, None));
        let before = self.writer.state.counts;
        self.writer.redrive_of = Some(seq);
        self.writer.last_dead_letter = None;
        self.writer.settle(PreparedBatch {
            id: raw.stream_sequence,
            items: vec![item],
        })?;
        let after = self.writer.state.counts;
        if after.stored > before.stored || after.already_present > before.already_present {
            self.settled.insert(raw.stream_sequence, Settled::Stored);
            return Ok(Fate::Remove);
        }
        if after.dead_lettered > before.dead_lettered {
            return Ok(match self.writer.last_dead_letter {
                Some(s) if s == seq => Fate::Keep(
                    "refused again, and the dead-letter stream answered with this record".into(),
                ),
                _ => {
                    self.settled
                        .insert(raw.stream_sequence, Settled::DeadLettered);
                    Fate::Remove
                }
            });
        }
        Ok(if self.writer.file.is_none() {
            Fate::Skipped
        } else {
            Fate::Keep("refused again and not dead-lettered".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_are_read_only_when_whole_and_bounded() {
        let digest = "ab".repeat(32);
        let good = json!({"schema": DEAD_LETTER_SCHEMA,
            "failure": {"stage": "size_policy", "reason": "payload_too_large"},
            "original": {"subject": "orders.a", "stream": "ORDERS", "stream_sequence": 7,
                         "stream_incarnation": "20261128T000000Z", "consumer_sequence": 3,
                         "delivery_count": 2, "published_at": "2026-11-28T00:00:01.5Z"},
            "payload": {"sha256": digest, "size_bytes": 2}});
        let r = parse_record(good.to_string().as_bytes()).unwrap();
        assert_eq!((r.sequence, r.stream.as_str()), (7, "ORDERS"));
        assert_eq!((r.consumer_sequence, r.delivery_count), (3, 2));
        assert_eq!(r.digest, Digest::Plain(digest.clone()));
        let filter = Filter {
            reason: Some("payload_too_large".into()),
            class: Some("size_policy".into()),
            subject: SubjectPattern::parse("orders.*").ok(),
        };
        assert!(filter.wants(&r));
        let other = Filter {
            class: Some("sink".into()),
            ..Filter::default()
        };
        assert!(!other.wants(&r));
        let mut keyed = good.clone();
        keyed["payload"] = json!({"hmac_sha256": digest, "size_bytes": 2});
        let r = parse_record(keyed.to_string().as_bytes()).unwrap();
        assert_eq!(r.digest, Digest::Keyed(digest.clone()));
        // Each edit makes the record one a redrive must not act on: a forgery without the
        // original's incarnation or payload digest could name any delivered message.
        type Edit = (&'static str, fn(&mut Value), &'static str);
        let edits: [Edit; 16] = [
            (
                "no consumer sequence",
                |v| {
                    v["original"]
                        .as_object_mut()
                        .unwrap()
                        .remove("consumer_sequence");
                },
                "original.consumer_sequence missing",
            ),
            (
                "delivery count 0",
                |v| v["original"]["delivery_count"] = json!(0),
                "original.delivery_count missing",
            ),
            (
                "consumer sequence past 2^53",
                |v| v["original"]["consumer_sequence"] = json!(u64::MAX),
                "original.consumer_sequence missing",
            ),
            (
                "delivery count as text",
                |v| v["original"]["delivery_count"] = json!("2"),
                "original.delivery_count missing",
            ),
            (
                "more deliveries than consumer sequences",
                |v| v["original"]["delivery_count"] = json!(4),
                "above original.consumer_sequence",
            ),
            (
                "seq 0",
                |v| v["original"]["stream_sequence"] = json!(0),
                "original.stream_sequence",
            ),
            (
                "stream",
                |v| v["original"]["stream"] = json!(5),
                "original.stream missing",
            ),
            ("schema", |v| v["schema"] = json!("svc.other"), "schema"),
            (
                "no incarnation",
                |v| {
                    v["original"]
                        .as_object_mut()
                        .unwrap()
                        .remove("stream_incarnation");
                },
                "stream_incarnation",
            ),
            (
                "empty incarnation",
                |v| v["original"]["stream_incarnation"] = json!(""),
                "stream_incarnation",
            ),
            (
                "long incarnation",
                |v| v["original"]["stream_incarnation"] = json!("9".repeat(65)),
                "stream_incarnation",
            ),
            (
                "no time",
                |v| {
                    v["original"]
                        .as_object_mut()
                        .unwrap()
                        .remove("published_at");
                },
                "published_at",
            ),
            (
                "bad time",
                |v| v["original"]["published_at"] = json!("yesterday"),
                "published_at",
            ),
            (
                "no digest",
                |v| {
                    v["payload"].as_object_mut().unwrap().remove("sha256");
                },
                "payload.sha256",
            ),
            (
                "short digest",
                |v| v["payload"]["sha256"] = json!("ab"),
                "payload.sha256",
            ),
            (
                "two digests",
                |v| v["payload"]["hmac_sha256"] = json!("cd".repeat(32)),
                "exactly one",
            ),
        ];
        for (what, edit, why) in edits {
            let mut bad = good.clone();
            edit(&mut bad);
            let e = parse_record(bad.to_string().as_bytes()).unwrap_err();
            assert!(e.contains(why), "{what}: {e}");
        }
        let huge = vec![b' '; MAX_RECORD_BYTES + 1];
        assert!(parse_record(&huge).is_err());
        assert!(Filter::default().key().contains("reason=* class=*"));
    }

    #[test]
    fn digests_compare_whole_and_case_blind() {
        let d = "ab".repeat(32);
        assert!(same_digest(&d, &d.to_uppercase()));
        assert!(!same_digest(&d, &format!("{}ac", &d[..62])));
        assert!(!same_digest(&d, &d[..62]));
    }
}
