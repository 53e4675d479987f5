//! Delivering the spool to its sink, oldest record first: the `svc-spool-drain` thread of a
//! runner with a fallback spool, and `svc spool drain`.
//!
//! Each step reads up to `drain_batch` records after the drain position, writes them to the
//! sink in one batch, and moves the position past them only when the sink confirmed every
//! one (a record the sink refuses for good is kept in a `rejected-*` file first). A crash
//! between the sink's write and the position's fsync makes the next drain deliver those
//! records again: an idempotent sink keeps one copy. A transient failure moves nothing; the
//! thread probes again with a doubling pause.
//!
//! A sink that takes the file sink's records as they are (jsonl) is handed the stored
//! records after a syntax and schema check; any other sink gets the envelopes decoded from
//! them. Either way an intact record that does not pass is quarantined.
//!
//! With custody checkpoints (the runner's drain only), each record the sink reports `Durable`
//! is told to the checkpoint thread after the step, from the record as stored
//! ([`crate::sink::checkpoint::DrainFeed`]); `svc spool drain` tells nothing (the next
//! runner's restart rescan signs what it delivered).

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::codec;
use super::dir::{fail, read_at, Position, SpoolError};
use super::frame::{self, Item};
use super::put::{CheckpointPut, Put};
use super::seal::{OpenError, Opened, Opener, Place};
use super::store::{ReadView, Spool};
use crate::message::envelope::Envelope;
use crate::message::protection::checkpoint::TrustedKeys;
use crate::metrics::Metrics;
use crate::sink::checkpoint::{CheckpointStore, DrainFeed};
use crate::sink::{Sink, WriteOutcome};

/// `spool_mode` gauge values.
pub const MODE_DIRECT: u64 = 0;
pub const MODE_SPOOLING: u64 = 1;
pub const MODE_DRAINING: u64 = 2;

/// First pause after a failed probe.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The read buffer is refilled to this many bytes past the drain position when less than half
/// of it is left: a step works on data still in the CPU's caches, where reading a whole
/// 16 MiB segment at once had every record come back from memory.
const READ_AHEAD: u64 = 2 << 20;

/// What one drain step did.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to deliver now.
    Empty,
    /// The position moved past this many delivered records.
    Delivered(u64),
    /// The sink did not take the batch (transient); nothing moved.
    Refused(String),
}

struct Loaded {
    segment: u64,
    base: u64,
    data: Vec<u8>,
    file: File,
}

pub struct Drainer {
    spool: Arc<Spool>,
    sink: Arc<dyn Sink>,
    metrics: Arc<Metrics>,
    loaded: Option<Loaded>,
    opener: Opener,
    /// The bodies a step decrypted, kept between steps (its allocation is reused).
    opened: Vec<u8>,
    /// `custody.checkpoints` (fallback spool in a runner): told of each record the sink
    /// holds once its step is durable.
    checkpoints: Option<DrainFeed>,
    /// Checkpoint frames reached: put into the target's checkpoint store (`svc spool drain`
    /// of a spool sink, or an edge spool handed to a fallback block) once the records before
    /// each are delivered.
    put: CheckpointPut,
}

/// Where a record ready for the sink is: in the segment's bytes (stored in clear) or in the
/// step's buffer of decrypted bodies.
enum Src {
    Stored(usize, usize),
    Opened(std::ops::Range<usize>),
    /// Decoded to an envelope already.
    Decoded,
}

/// Where a step reads: the segment, the offset its buffer starts at, and whether the buffer
/// ends before the segment's committed end.
#[derive(Debug, Clone, Copy)]
struct At {
    segment: u64,
    base: u64,
    partial: bool,
}

impl At {
    /// The segment offset of `at` in the buffer.
    fn abs(self, at: usize) -> u64 {
        self.base + at as u64
    }
}

/// What a step gathered from the buffer.
#[derive(Default)]
struct Gathered {
    /// The sink takes the records as stored (`message::record`), not envelopes.
    as_stored: bool,
    envelopes: Vec<Envelope>,
    srcs: Vec<Src>,
    /// Each ready record's frame (`start..end` in the buffer), in `srcs`' order.
    frames: Vec<(usize, usize)>,
    /// When the first frame read was appended (the oldest age gauge).
    first_ms: Option<u64>,
    /// Frames quarantined now.
    dropped: u64,
    /// Checkpoint frames put into the target's store.
    put: u64,
    /// Where the next step reads, in the buffer.
    next: usize,
}

/// Whether a step reads on after a frame.
enum Flow {
    On,
    Stop,
}

/// What one stored record turned out to be.
enum Read {
    Ready(Src),
    /// Intact but unreadable (it does not decrypt here, or does not decode): quarantined.
    Damaged(String),
    /// It cannot be read with this configuration (a key id not configured, or stored in clear
    /// without `allow_unencrypted`): kept where it is.
    Keep(OpenError),
    /// A custody checkpoint frame (`sink.type` = `spool`): its plain body, and whether it
    /// was sealed (bound to its place by the spool's key) or stored in clear.
    Checkpoint {
        plain: Vec<u8>,
        sealed: bool,
    },
}

/// Opens one stored record (`body` of the frame at `start..end` of `data`) and checks it.
/// `(as_stored, keep)`: the sink takes stored records, or the record's place is kept anyway
/// (custody checkpoints compute its digest from it once the sink holds it).
fn read_record(
    opener: &mut Opener,
    place: Place,
    (data, start, end): (&[u8], usize, usize),
    (as_stored, keep): (bool, bool),
    (opened, envelopes): (&mut Vec<u8>, &mut Vec<Envelope>),
) -> Read {
    let body = &data[start + frame::FRAME_OVERHEAD..end];
    let (plain, range) = match opener.open(place, body, opened) {
        Ok(Opened::Clear) => (body, None),
        Ok(Opened::Sealed(r)) => (&opened[r.clone()], Some(r)),
        Err(e) if e.keeps() => return Read::Keep(e),
        Err(e) => return Read::Damaged(e.to_string()),
    };
    if codec::is_checkpoint(plain) {
        let sealed = range.is_some();
        return Read::Checkpoint {
            plain: plain.to_vec(),
            sealed,
        };
    }
    let src = match (as_stored || keep).then(|| codec::file_record(plain)) {
        // The record is a suffix of the plain body.
        Some(Ok(record)) => {
            let skip = plain.len() - record.len();
            match range {
                Some(r) => Src::Opened(r.start + skip..r.end),
                None => Src::Stored(start + frame::FRAME_OVERHEAD + skip, end),
            }
        }
        Some(Err(why)) => return Read::Damaged(why.to_string()),
        None => Src::Decoded,
    };
    if !as_stored {
        match codec::decode(plain) {
            Ok(env) => envelopes.push(env),
            Err(why) => return Read::Damaged(why.to_string()),
        }
    }
    Read::Ready(src)
}

impl Drainer {
    pub fn new(spool: Arc<Spool>, sink: Arc<dyn Sink>, metrics: Arc<Metrics>) -> Drainer {
        let opener = Opener::new(spool.crypt().clone());
        Drainer {
            spool,
            sink,
            metrics,
            loaded: None,
            opener,
            opened: Vec::new(),
            checkpoints: None,
            put: CheckpointPut::new(),
        }
    }

    /// Checkpoint frames this drainer put into the target's store and drained past.
    pub fn checkpoints_put(&self) -> u64 {
        self.put.put
    }

    /// Puts each checkpoint frame into `store` (the target's) once the records before it are
    /// delivered; without one, the drain stops at a checkpoint frame.
    pub fn with_checkpoint_store(mut self, store: Box<dyn CheckpointStore>) -> Drainer {
        self.put.set_store(store);
        self
    }

    /// The keys a checkpoint frame is checked with before it is put (see [`super::put`]):
    /// one stored in clear is put only when it verifies under one of them.
    pub fn with_trusted_keys(mut self, trusted: TrustedKeys) -> Drainer {
        self.put.set_trusted(trusted);
        self
    }

    /// Tells custody checkpoints of every record a step delivers (`Durable` from the sink).
    pub fn with_checkpoints(mut self, feed: DrainFeed) -> Drainer {
        self.checkpoints = Some(feed);
        self
    }

    /// The runner's drain thread: until `stop`, deliver whenever the spool holds records.
    pub fn run(mut self, stop: &AtomicBool) {
        let max_backoff = self.spool.config().max_backoff;
        let mut backoff = FIRST_BACKOFF;
        let mut failures: u64 = 0;
        while !stop.load(Ordering::Relaxed) {
            if !self.spool.wait_for_records(Duration::from_millis(200)) {
                self.set_mode(MODE_DIRECT);
                continue;
            }
            match self.step() {
                Ok(Step::Delivered(n)) => {
                    if failures > 0 {
                        log::info!(
                            "spool {}: sink {} answers again; draining",
                            self.spool.path().display(),
                            self.sink.kind()
                        );
                    }
                    failures = 0;
                    backoff = FIRST_BACKOFF;
                    let left = self.spool.records();
                    self.set_mode(if left == 0 {
                        MODE_DIRECT
                    } else {
                        MODE_DRAINING
                    });
                    if left == 0 && n > 0 {
                        log::info!(
                            "spool {}: drained; back to direct delivery",
                            self.spool.path().display()
                        );
                    }
                }
                Ok(Step::Empty) => pause(stop, Duration::from_millis(50)),
                Ok(Step::Refused(why)) => {
                    failures += 1;
                    self.set_mode(MODE_SPOOLING);
                    if failures.is_power_of_two() {
                        log::warn!(
                            "spool {}: drain probe {failures} failed: {why}; next in {:.1} s",
                            self.spool.path().display(),
                            backoff.as_secs_f64()
                        );
                    }
                    pause(stop, backoff);
                    backoff = (backoff * 2).min(max_backoff);
                }
                Err(e) => {
                    failures += 1;
                    Metrics::add(&self.metrics.counters.spool_drain_errors_total, 1);
                    log::error!("{e}");
                    pause(stop, backoff);
                    backoff = (backoff * 2).min(max_backoff);
                }
            }
        }
        if let Err(e) = self.spool.persist_position() {
            log::error!("{e}");
        }
    }

    /// `svc spool drain`: delivers until the spool is empty; gives up after `attempts`
    /// transient failures in a row.
    pub fn run_until_empty(&mut self, attempts: u32) -> Result<u64, SpoolError> {
        let mut delivered = 0;
        let mut failures = 0;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let step = match self.step() {
                Ok(s) => s,
                Err(e) => {
                    // What was delivered before the stop is not delivered again.
                    if let Err(p) = self.spool.persist_position() {
                        log::error!("{p}");
                    }
                    return Err(e);
                }
            };
            match step {
                Step::Delivered(n) => {
                    delivered += n;
                    failures = 0;
                    backoff = FIRST_BACKOFF;
                }
                Step::Empty => {
                    self.spool.persist_position()?;
                    return Ok(delivered);
                }
                Step::Refused(why) => {
                    failures += 1;
                    if failures >= attempts {
                        self.spool.persist_position()?;
                        return Err(fail(
                            self.spool.path(),
                            "drain stopped",
                            format!(
                                "sink {} failed {failures} times in a row: {why}; {} records \
                                 remain spooled",
                                self.sink.kind(),
                                self.spool.records()
                            ),
                        ));
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(self.spool.config().max_backoff);
                }
            }
        }
    }

    fn set_mode(&self, mode: u64) {
        self.metrics
            .gauges
            .spool_mode
            .store(mode, Ordering::Relaxed);
    }

    /// Reads the next records and delivers them (see the module comment).
    pub fn step(&mut self) -> Result<Step, SpoolError> {
        let view = match self.view_loaded()? {
            Ok(view) => view,
            Err(step) => return Ok(step),
        };
        // Held apart while the step reads from it and calls `&mut self` methods.
        let loaded = self.loaded.take().expect("loaded above");
        let stepped = self.step_in(&view, &loaded);
        self.loaded = Some(loaded);
        stepped
    }

    /// [`Drainer::step`] over the loaded buffer: gathers the step's records, then delivers
    /// them and moves the position.
    fn step_in(&mut self, view: &ReadView, loaded: &Loaded) -> Result<Step, SpoolError> {
        let end = (view.len - loaded.base) as usize;
        let data = &loaded.data[..end.min(loaded.data.len())];
        let at = At {
            segment: view.segment,
            base: loaded.base,
            // The buffer may end inside a record that is whole on disk.
            partial: loaded.base + (data.len() as u64) < view.len,
        };
        let from = (view.from - loaded.base) as usize;
        let gathered = self.gather(at, data, from)?;
        self.deliver(at, data, gathered)
    }

    /// Reads up to `drain_batch` records from `from`: each ready for the sink, quarantined,
    /// or a checkpoint frame put; stops where the step must end.
    fn gather(&mut self, at: At, data: &[u8], from: usize) -> Result<Gathered, SpoolError> {
        let limit = self.spool.config().drain_batch;
        self.opened.clear();
        let mut g = Gathered {
            // A sink that takes stored records gets them as they are; any other gets envelopes.
            as_stored: self.sink.takes_stored_records(),
            next: from,
            ..Gathered::default()
        };
        for item in frame::items(data, from) {
            if g.frames.len() >= limit {
                break;
            }
            let flow = match item {
                // Moved out of the way by the operator (`svc spool set-aside`).
                Item::Record { end, body, .. } if super::aside::is_set_aside(body) => {
                    g.next = end;
                    Flow::On
                }
                Item::Record { start, end, .. } => {
                    self.take_record(at, (data, start, end), &mut g)?
                }
                Item::Corrupt { start, .. } | Item::Tail { start }
                    if at.partial && !super::scan::ready(data, item, false) =>
                {
                    self.judge_later(at, data, (start, from), item, &mut g)?;
                    Flow::Stop
                }
                // Damage found now (not by the opening scan, which did not count it) was
                // counted as a waiting record: it is dropped, so the count follows the disk.
                Item::Corrupt { start, end } => {
                    g.next = end;
                    g.dropped += u64::from(self.keep_damage(
                        at.segment,
                        at.abs(start),
                        &data[start..end],
                    )?);
                    Flow::On
                }
                Item::Tail { start } => {
                    // Committed bytes always end on a frame boundary: this is damage.
                    g.next = data.len();
                    g.dropped +=
                        u64::from(self.keep_damage(at.segment, at.abs(start), &data[start..])?);
                    Flow::On
                }
            };
            if let Flow::Stop = flow {
                break;
            }
        }
        Ok(g)
    }

    /// One record frame at `start..end`: ready for the sink, quarantined, a checkpoint frame
    /// put (or the step's end before it), or the record the drain must keep.
    fn take_record(
        &mut self,
        at: At,
        (data, start, end): (&[u8], usize, usize),
        g: &mut Gathered,
    ) -> Result<Flow, SpoolError> {
        let place = Place {
            segment: at.segment,
            offset: at.abs(start),
        };
        let sinks = (&mut self.opened, &mut g.envelopes);
        let want = (g.as_stored, self.checkpoints.is_some());
        match read_record(&mut self.opener, place, (data, start, end), want, sinks) {
            Read::Ready(src) => {
                let body = &data[start + frame::FRAME_OVERHEAD..end];
                g.first_ms = g.first_ms.or(codec::appended_unix_ms(body));
                g.frames.push((start, end));
                g.srcs.push(src);
            }
            Read::Damaged(why) => {
                self.keep_unreadable(place, &data[start..end], &why)?;
                g.dropped += 1;
            }
            Read::Keep(why) if g.frames.is_empty() && g.dropped == 0 => {
                return Err(self.kept_error(place, &why));
            }
            // After the step's records are durable in the target: the next step.
            Read::Checkpoint { .. } if !g.frames.is_empty() => return Ok(Flow::Stop),
            Read::Checkpoint { plain, sealed } => {
                match self.put.put(&self.spool, place, (&plain, sealed))? {
                    Put::Stored => g.put += 1,
                    Put::Refused(why) => {
                        self.keep_unreadable(place, &data[start..end], &why)?;
                        g.dropped += 1;
                    }
                }
            }
            // Delivered up to it; the next step stops at it.
            Read::Keep(_) => return Ok(Flow::Stop),
        }
        g.next = end;
        Ok(Flow::On)
    }

    /// Damage or a tail the buffer may cut: judged only with more of the segment read (what
    /// follows may be a record the buffer cuts). The next step starts here and reads more
    /// first, up to the most the reader holds; damage at the start of a buffer that full is cut
    /// into pieces as the opening scan cuts it.
    fn judge_later(
        &self,
        at: At,
        data: &[u8],
        (start, from): (usize, usize),
        item: Item<'_>,
        g: &mut Gathered,
    ) -> Result<(), SpoolError> {
        g.next = start;
        if start == from && data.len() - start >= super::scan::MAX_HELD {
            let intact = match item {
                Item::Corrupt { end, .. } => end,
                _ => data.len(),
            };
            let end = super::scan::damage_piece_end(&data[start..], intact - start);
            g.next = start + end;
            let bytes = &data[start..g.next];
            g.dropped += u64::from(self.keep_damage(at.segment, at.abs(start), bytes)?);
        }
        Ok(())
    }

    /// Hands the gathered records to the sink, keeps what it refused for good, tells custody
    /// checkpoints, and moves the position past the step.
    fn deliver(&mut self, at: At, data: &[u8], g: Gathered) -> Result<Step, SpoolError> {
        let to = Position {
            segment: at.segment,
            offset: at.abs(g.next),
        };
        // Checkpoint frames put (in the target's store now) leave the waiting frames as
        // quarantined ones do: not counted as delivered records.
        let dropped = g.dropped + g.put;
        if g.frames.is_empty() {
            self.spool.commit(to, 0, dropped)?;
            self.put.put += g.put;
            return Ok(Step::Delivered(0));
        }
        if let Some(ms) = g.first_ms {
            self.spool.set_oldest(ms);
        }
        let outcomes = self.write(data, &g.srcs, &g.envelopes, g.as_stored);
        if outcomes.len() != g.frames.len() {
            return Ok(Step::Refused("outcome count mismatch".into()));
        }
        let told = (at.segment, at.base, &g.frames[..]);
        if let Some(WriteOutcome::Transient(e)) = outcomes
            .iter()
            .find(|o| matches!(o, WriteOutcome::Transient(_)))
        {
            // The records the sink took are in it now: told here, as the step that repeats
            // them finds them `AlreadyDurable`, which is never told (atk47e finding 5).
            self.tell_checkpoints(data, &g.srcs, &outcomes, told);
            return Ok(Step::Refused(crate::text::error_chain(e)));
        }
        let refused = self.keep_refusals(at.segment, at.base, data, &g.frames, &outcomes)?;
        self.tell_checkpoints(data, &g.srcs, &outcomes, told);
        let delivered = g.frames.len() as u64 - refused;
        if refused == 0 {
            self.spool.commit(to, delivered, dropped)?;
        } else {
            self.spool
                .commit_rejection(to, delivered, refused + dropped)?;
        }
        self.put.put += g.put;
        Ok(Step::Delivered(delivered))
    }

    /// Where the next step reads, with the read buffer holding enough of it; the step's
    /// result when there is nothing to read (or a drained segment was passed).
    fn view_loaded(&mut self) -> Result<Result<ReadView, Step>, SpoolError> {
        let Some(view) = self.spool.read_view() else {
            return Ok(Err(Step::Empty));
        };
        if view.from >= view.len {
            if view.sealed {
                // Every record of this segment is delivered: move on (removes it).
                self.loaded = None;
                let next = Position {
                    segment: view.segment + 1,
                    offset: 0,
                };
                self.spool.commit(next, 0, 0)?;
                return Ok(Err(Step::Delivered(0)));
            }
            return Ok(Err(Step::Empty));
        }
        self.load(
            &view,
            view.len.min(view.from.saturating_add(READ_AHEAD / 2)),
        )?;
        if self.next_is_cut(&view) {
            // Enough to judge the damage or hold the frame (never the whole segment).
            let need = view.from.saturating_add(super::scan::MAX_HELD as u64);
            self.load(&view, view.len.min(need))?;
        }
        Ok(Ok(view))
    }

    /// Hands a step's records to the sink: as stored (from the segment's bytes or the
    /// decrypted bodies) to a sink that takes stored records, else the decoded envelopes.
    fn write(
        &self,
        data: &[u8],
        srcs: &[Src],
        envelopes: &[Envelope],
        as_stored: bool,
    ) -> Vec<WriteOutcome> {
        if !as_stored {
            return self.sink.write_batch(envelopes);
        }
        let records: Vec<&[u8]> = srcs
            .iter()
            .filter_map(|s| match s {
                Src::Stored(a, b) => Some(&data[*a..*b]),
                Src::Opened(r) => Some(&self.opened[r.clone()]),
                Src::Decoded => None,
            })
            .collect();
        self.sink.write_stored_records(&records)
    }

    /// Tells custody checkpoints of each record the sink now holds (`Durable`, in a step the
    /// sink took whole or in part; an `AlreadyDurable` one was told when first written, by a
    /// sink worker or by an earlier step, or is found by the restart rescan).
    fn tell_checkpoints(
        &self,
        data: &[u8],
        srcs: &[Src],
        outcomes: &[WriteOutcome],
        (segment, base, frames): (u64, u64, &[(usize, usize)]),
    ) {
        let Some(feed) = &self.checkpoints else {
            return;
        };
        for ((src, outcome), (start, _)) in srcs.iter().zip(outcomes).zip(frames) {
            let record = match src {
                Src::Stored(a, b) => &data[*a..*b],
                Src::Opened(r) => &self.opened[r.clone()],
                Src::Decoded => continue,
            };
            if *outcome == WriteOutcome::Durable {
                let offset = base + *start as u64;
                feed.delivered(record, Place { segment, offset });
            }
        }
    }

    /// Keeps every record the sink refused for good, each in its own file named by its own
    /// offset: a step repeated after a crash (from an older durable position, so holding other
    /// records) finds the same name with the same bytes and counts it as kept, never a second
    /// copy. Returns how many were refused; an error stops the step.
    fn keep_refusals(
        &self,
        segment: u64,
        base: u64,
        data: &[u8],
        frames: &[(usize, usize)],
        outcomes: &[WriteOutcome],
    ) -> Result<u64, SpoolError> {
        let mut refused_count = 0;
        for (outcome, &(start, end)) in outcomes.iter().zip(frames) {
            if let WriteOutcome::Permanent(e) = outcome {
                let offset = base + start as u64;
                log::error!(
                    "spool {}: sink refused the record at segment {segment} offset {offset} for \
                     good: {}; kept in {}",
                    self.spool.path().display(),
                    crate::text::error_chain(e),
                    super::dir::rejected_name(segment, offset)
                );
                self.spool
                    .reject(segment, offset, &data[start..end])
                    .map_err(|e| {
                        fail(
                            self.spool.path(),
                            "drain stuck",
                            format!(
                                "records the sink refused for good could not be kept ({e}); \
                                 the drain retries this step and moves no further until they \
                                 are"
                            ),
                        )
                    })?;
                refused_count += 1;
            }
        }
        Ok(refused_count)
    }

    /// The drain stops at a record it must keep (a key id not configured, or stored in clear
    /// without `allow_unencrypted`): named by its place and key id, never a key.
    fn kept_error(&self, place: Place, why: &OpenError) -> SpoolError {
        fail(
            self.spool.path(),
            "drain stuck",
            format!(
                "the record at segment {} offset {} is {why}; it is kept where it is, and the \
                 drain moves no further until the configuration can read it; {}",
                place.segment,
                place.offset,
                super::scan::set_aside_hint(place.segment, place.offset)
            ),
        )
    }

    /// Quarantines an intact record that does not open or decode here, logged by its place.
    fn keep_unreadable(&self, place: Place, bytes: &[u8], why: &str) -> Result<(), SpoolError> {
        log::error!(
            "spool {}: record at segment {} offset {} is intact but unreadable ({why}); \
             quarantined",
            self.spool.path().display(),
            place.segment,
            place.offset
        );
        self.keep_damage(place.segment, place.offset, bytes)
            .map(|_| ())
    }

    /// Quarantines damage the drain found (see [`Spool::quarantine`]); damage that cannot be
    /// kept stops the step, as a refused record that cannot be kept does.
    fn keep_damage(&self, segment: u64, offset: u64, bytes: &[u8]) -> Result<bool, SpoolError> {
        self.spool.quarantine(segment, offset, bytes).map_err(|e| {
            fail(
                self.spool.path(),
                "drain stuck",
                format!(
                    "damaged bytes could not be quarantined ({e}); the drain retries this \
                     step and moves no further until they are"
                ),
            )
        })
    }

    /// True when the buffer holds less than the whole segment and the next item in it is no
    /// intact record: a record longer than the read-ahead, or damage, which is judged only
    /// with more of the segment read (see `scan::ready`).
    fn next_is_cut(&self, view: &ReadView) -> bool {
        let Some(l) = &self.loaded else { return false };
        let from = (view.from - l.base) as usize;
        l.base + (l.data.len() as u64) < view.len
            && (from >= l.data.len() || !matches!(frame::next(&l.data, from), Item::Record { .. }))
    }

    /// Makes the read buffer hold the segment's bytes from `view.from` to at least `need`
    /// (at most `view.len`); a refill reads up to `READ_AHEAD` past the position.
    fn load(&mut self, view: &ReadView, need: u64) -> Result<(), SpoolError> {
        let path = self.spool.path().to_path_buf();
        let reusable = self
            .loaded
            .as_ref()
            .is_some_and(|l| l.segment == view.segment && l.base <= view.from);
        if !reusable {
            let file = self.spool.open_segment(view.segment)?;
            self.loaded = Some(Loaded {
                segment: view.segment,
                base: view.from,
                data: Vec::new(),
                file,
            });
        }
        let l = self.loaded.as_mut().expect("set above");
        let have = l.base + l.data.len() as u64;
        if have >= need {
            return Ok(());
        }
        // Drop what was delivered before reading on: the buffer stays about READ_AHEAD long.
        let cut = ((view.from - l.base) as usize).min(l.data.len());
        l.data.drain(..cut);
        l.base += cut as u64;
        let until = need.max(view.len.min(view.from.saturating_add(READ_AHEAD)));
        let more =
            read_at(&l.file, have, until - have).map_err(|e| fail(&path, "read segment", e))?;
        let on_disk = have + more.len() as u64;
        if on_disk < until && on_disk < view.len {
            // The spool wrote and synced `view.len` bytes: something else shortened the file.
            // Stepping on would find the same too-short bytes forever (it once spun a core,
            // silently); an error is counted and logged, with the drain's backoff, and a
            // restart's recovery reads the segment as it is now.
            self.loaded = None;
            return Err(fail(
                &path,
                "read segment",
                format!(
                    "segment {} holds {on_disk} bytes on disk but the spool wrote {}: it was \
                     shortened by something else; not drained past offset {have} until svc \
                     restarts (recovery reads it again, and quarantines what is damaged)",
                    view.segment, view.len
                ),
            ));
        }
        if l.data.is_empty() {
            l.data = more;
        } else {
            l.data.extend_from_slice(&more);
        }
        Ok(())
    }
}

/// Sleeps up to `d`, waking early when `stop` is set.
fn pause(stop: &AtomicBool, d: Duration) {
    let step = Duration::from_millis(50);
    let mut left = d;
    while !left.is_zero() && !stop.load(Ordering::Relaxed) {
        let s = left.min(step);
        std::thread::sleep(s);
        left -= s;
    }
}
