//! Custody checkpoints on the sink side: the `svc-checkpoint` thread and where each sink keeps
//! its checkpoints ([`CheckpointStore`]). Format and audit: `message::protection::checkpoint`.
//!
//! The sink workers hand the thread, after a batch is durable, each committed record's
//! (stream sequence, checkpoint digest) and each sequence the runner itself gave up on
//! (dead-lettered, refused) through a bounded channel they never wait on ([`Feed`]): delivery
//! is never held back. With a fallback spool, a record the spool took is told by the spool's
//! drain instead, once the sink holds it ([`DrainFeed`]). The thread writes a signed
//! checkpoint every `every_records` records or `every_seconds` seconds, and what is pending
//! when the workers (and the drain) stop. One checkpoint covers one stream incarnation
//! ([`Origin`]): what is pending for several (a stream created again) is written as one
//! checkpoint each, linked in the one chain.
//!
//! Stores: the file, object store and relational sinks keep their own ([`FileStore`],
//! [`ObjectStore`], [`PgStore`], [`MyStore`]; [`store_for`]). With `sink.type: spool` the
//! checkpoints are CHECKPOINT frames in the spool after the records they cover, put into the
//! target's store by `svc spool drain` (checkpoint_spool.rs beside this file, built on this
//! module): the spool holds only the end of the chain ([`CheckpointStore::holds_suffix`]).
//!
//! Start: before any delivery the runner reads its chain back ([`Writer::start`]) and refuses
//! to run when it cannot be read, does not verify, has a hole, or does not reach the head
//! kept outside the sink ([`super::checkpoint_head`]). A store holding a suffix (the spool) is
//! read with its target's store ([`CheckpointStore::target`]), the whole chain checked; when
//! the target cannot be read, the spool's part alone must link and reach the head, and an
//! empty one beside a head file stops the start. Crash story: the thread then (and after
//! the channel overflowed) rescans the store's records of its runner id ([`Writer::rescan`]):
//! every record after the chain's covered range that no checkpoint covers and whose custody
//! seal verifies is pending again (with the spool, its target's records too), so records
//! committed before a kill -9 are covered by the first checkpoint after the restart; a record
//! failing its seal is never signed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};

use crate::document::canonical;
use crate::message::envelope::now_unix_nanos;
use crate::message::protection::checkpoint::{
    self, seal, Body, Signer, TrustedKeys, MAX_CHECKPOINT_BYTES,
};
use crate::message::protection::checkpoint_audit::{RecordRead, StoredRecord};
use crate::message::protection::custody::{public_digest_stored, Custodian, CustodyConfig};
use crate::text::peer::PeerText;

use super::checkpoint_head::{Head, HeadFile};
use crate::text::rfc3339::{format_rfc3339_nanos, parse_rfc3339_nanos};

/// Events the channel holds before the sink workers' sends start failing (then the thread
/// rescans the store instead).
pub const FEED_CAPACITY: usize = 65_536;
/// Largest record file read by a store scan.
pub const MAX_RECORD_FILE_BYTES: u64 = 1 << 30;
/// Most records one read-back (`svc verify-custody`, the runner's rescan) holds in memory
/// (about 150 bytes each); past it the read fails with a clear error.
pub const MAX_AUDIT_RECORDS: usize = 10_000_000;
/// Most checkpoints one read-back holds.
pub const MAX_AUDIT_CHECKPOINTS: usize = 100_000;
/// Most checkpoint text one read-back holds in memory.
pub const MAX_AUDIT_CHECKPOINT_BYTES: usize = 1 << 30;

fn records_bound(n: usize) -> Result<(), String> {
    if n > MAX_AUDIT_RECORDS {
        return Err(format!(
            "more than {MAX_AUDIT_RECORDS} records: past the read-back bound"
        ));
    }
    Ok(())
}

fn checkpoints_bound(total: &mut usize, text: &str) -> Result<(), String> {
    *total += text.len();
    if *total > MAX_AUDIT_CHECKPOINT_BYTES {
        return Err(format!(
            "more than {MAX_AUDIT_CHECKPOINT_BYTES} bytes of checkpoints: past the read-back bound"
        ));
    }
    Ok(())
}

/// Directory below the file sink's output directory holding its checkpoints.
pub const FILE_CHECKPOINT_DIR: &str = ".svc-checkpoints";

/// Where one sink keeps its checkpoints, and how its records are read back.
pub trait CheckpointStore: Send {
    /// Stores one checkpoint durably (returns once it is on stable storage).
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String>;
    /// Every stored checkpoint (any runner), as (place, text), bounded.
    fn checkpoints(&self) -> Result<Vec<(String, String)>, String>;
    /// The stored checkpoints of `runner_id` (the start's and the rescan's read; a store may
    /// give others' too, which the reader skips), bounded as [`CheckpointStore::checkpoints`].
    fn chain(&self, runner_id: &str) -> Result<Vec<(String, String)>, String> {
        let _ = runner_id;
        self.checkpoints()
    }
    /// The text stored under (`runner_id`, `index`), if any: the drain's compare after a put
    /// refused and its check that a checkpoint follows the one before it.
    fn get(&self, runner_id: &str, index: u64) -> Result<Option<String>, String> {
        let wanted = Some((runner_id.to_string(), Some(index)));
        Ok(self
            .chain(runner_id)?
            .into_iter()
            .map(|c| c.1)
            .find(|t| claimed(t) == wanted))
    }
    /// Every stored record, read back as the audit needs it.
    fn records(&self) -> Result<Vec<StoredRecord>, String>;
    /// [`CheckpointStore::records`]; with a custodian (the runner's restart rescan), each
    /// record carrying its runner id is also checked against its custody seal, and one that
    /// fails reads as an error starting with [`SEAL_REFUSED`]. A store that cannot check
    /// seals refuses the rescan (its uncovered records stay "in no checkpoint yet").
    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        match seal {
            None => self.records(),
            Some(_) => Err("this store cannot check custody seals on a rescan".into()),
        }
    }
    /// True when the store holds only the end of a chain: the spool as the sink, whose drain
    /// moves the older checkpoints to its target ([`Writer::start`] takes a suffix that
    /// links and reaches the head file).
    fn holds_suffix(&self) -> bool {
        false
    }
    /// For a store holding a suffix: the store its older checkpoints and its records are
    /// moved to (the spool's target), read by the start and the rescan beside it.
    fn target(&self) -> Option<&dyn CheckpointStore> {
        None
    }
}

/// How a record whose custody seal does not verify reads in a rescan.
pub const SEAL_REFUSED: &str = "custody seal refused";

/// The stream and the stream's incarnation (empty when not known) a sequence is of: one
/// checkpoint covers one origin only.
pub type Origin = (Arc<str>, Arc<str>);

/// What a sink worker tells the thread.
#[derive(Debug, Clone)]
pub enum Event {
    Committed(Origin, u64, [u8; 32]),
    Gap(Origin, u64, &'static str),
}

/// The sink workers' side of the channel: never blocks.
#[derive(Debug)]
pub struct Feed {
    tx: Sender<Event>,
    overflowed: Arc<AtomicBool>,
    pub dropped: AtomicU64,
}

impl Feed {
    pub fn send(&self, e: Event) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(e) {
            self.overflowed.store(true, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The fallback spool's drain's side of the channel: a spooled record is reported durable
/// (and ACKed) before it is in the sink, so the sink workers do not tell it; the drain tells
/// it once the sink reported the drained step durable, with the digest computed from the
/// record as stored, as the rescan computes it.
pub struct DrainFeed {
    feed: Arc<Feed>,
    custodian: Custodian,
}

impl DrainFeed {
    pub fn new(feed: Arc<Feed>, custody: &CustodyConfig) -> Result<DrainFeed, String> {
        let custodian = Custodian::load(custody)?;
        Ok(DrainFeed { feed, custodian })
    }

    /// One record the sink now holds, as the spool stored it (the file sink's record text):
    /// told when it is this runner's and its custody seal verifies (as the rescan checks); a
    /// record of another runner is left to that runner's rescan; one failing its seal is
    /// logged and never signed. `place` names it in the log (formatted only then).
    pub fn delivered(&self, record: &[u8], place: impl std::fmt::Display) {
        let read = std::str::from_utf8(record)
            .map_err(|_| "not UTF-8".to_string())
            .and_then(|t| read_record(t, Some(&self.custodian)));
        match read {
            Ok(r) if r.runner_id == self.custodian.runner_id() => {
                let origin: Origin = (Arc::from(r.stream), Arc::from(r.incarnation));
                self.feed
                    .send(Event::Committed(origin, r.sequence, r.digest));
            }
            Ok(_) => {}
            Err(e) => log::error!(
                "custody checkpoints: drained record at {}: {}; never signed",
                PeerText::new(&place.to_string()),
                PeerText::new(&e)
            ),
        }
    }
}

/// The `svc-checkpoint` thread's state.
pub struct Writer {
    store: Box<dyn CheckpointStore>,
    signer: Signer,
    custodian: Custodian,
    head_file: HeadFile,
    runner_id: String,
    sink: String,
    every_records: usize,
    every: Duration,
    rx: Receiver<Event>,
    overflowed: Arc<AtomicBool>,
    /// (index, body digest) of the chain's last checkpoint.
    head: Option<(u64, String)>,
    /// The origin of the chain's last checkpoint.
    last_origin: Option<Origin>,
    /// Highest sequence of each origin the chain signed a record of at start (leaves, not
    /// gaps): a rescan signs only records after it.
    covered_to: BTreeMap<Origin, u64>,
    pending: BTreeMap<Origin, BTreeMap<u64, [u8; 32]>>,
    gaps: BTreeMap<Origin, BTreeMap<u64, &'static str>>,
    /// Records in `pending`, all origins.
    /// Records and gaps pending: a checkpoint is cut at `every_records` of them together, so
    /// a flood of refusals cannot make one too large to read back (atk50a finding 5).
    pending_count: usize,
    /// Gaps signed lately: a message refused again on a later delivery is not listed again.
    signed_gaps: SignedGaps,
    /// When the chain's last checkpoint read at start was cut (Unix ns).
    last_cut: Option<i128>,
    /// Gaps of this runner found again at its start (its dead letters read back), listed by
    /// the first rescan unless the chain signed the sequence (as a gap or a record) or its
    /// record is pending.
    found: Vec<(Origin, u64, &'static str)>,
}

fn origin_of(b: &Body) -> Origin {
    (
        Arc::from(b.stream.as_str()),
        Arc::from(b.stream_incarnation.as_str()),
    )
}

impl Writer {
    pub fn new(
        store: Box<dyn CheckpointStore>,
        custody: &CustodyConfig,
        sink: &str,
    ) -> Result<(Writer, Feed), String> {
        let cfg = &custody.checkpoints;
        let signer = Signer::load(cfg)?;
        let custodian = Custodian::load(custody)?;
        let head_file = HeadFile::new(&cfg.head_file)?;
        let (tx, rx) = bounded(FEED_CAPACITY);
        let overflowed = Arc::new(AtomicBool::new(false));
        let feed = Feed {
            tx,
            overflowed: overflowed.clone(),
            dropped: AtomicU64::new(0),
        };
        let w = Writer {
            store,
            signer,
            custodian,
            head_file,
            runner_id: custody.runner_id.clone(),
            sink: sink.to_string(),
            every_records: cfg.every_records,
            every: Duration::from_secs(cfg.every_seconds),
            rx,
            overflowed,
            head: None,
            last_origin: None,
            covered_to: BTreeMap::new(),
            pending: BTreeMap::new(),
            gaps: BTreeMap::new(),
            pending_count: 0,
            signed_gaps: SignedGaps::default(),
            last_cut: None,
            found: Vec::new(),
        };
        Ok((w, feed))
    }

    fn trusted(&self) -> TrustedKeys {
        let mut trusted = TrustedKeys::default();
        trusted
            .0
            .insert(self.signer.key_id().to_string(), self.signer.public_key());
        trusted
    }

    /// Reads this runner's chain back (before any delivery) and checks it against the head
    /// file. An error (the runner does not start) when the store cannot be read, a stored
    /// checkpoint of this runner (or of no readable runner) does not verify, the chain does
    /// not run 0, 1, 2, ..., or it does not reach the head file's head: the chain is never
    /// restarted at index 0 over an existing one, nor continued from a cut.
    pub fn start(&mut self) -> Result<(), String> {
        let mut read = self
            .store
            .chain(&self.runner_id)
            .map_err(|e| format!("custody checkpoints: cannot read the chain back: {e}"))?;
        let unread = self.read_target(&mut read);
        // The spool and its target read together hold the whole chain: checked as any
        // other store's. The spool's part alone is a suffix (the target not read).
        let suffix =
            self.store.holds_suffix() && (self.store.target().is_none() || unread.is_some());
        let chain = own_chain(read, &self.trusted(), &self.runner_id, suffix)?;
        let stored = self.head_file.read()?;
        if let (Some(e), true, Some(h)) = (&unread, chain.is_empty(), stored.as_ref()) {
            return Err(format!(
                "custody checkpoints: the spool holds no checkpoint of this runner (drained) \
                 and its target's checkpoint store cannot be read ({}): where the chain ends \
                 past the head file's head {} cannot be checked, and no checkpoint is signed \
                 under an index the drain may have put already; start again once the target \
                 can be read",
                PeerText::new(e),
                PeerText::new(&h.arg())
            ));
        }
        if suffix {
            check_suffix_head(&chain, stored.as_ref(), &self.runner_id, &self.head_file)?;
        } else {
            check_head(&chain, stored.as_ref(), &self.runner_id, &self.head_file)?;
        }
        for v in &chain {
            // The gaps it signed: a gap found again at start (a dead letter read back) is not
            // listed twice.
            let o = origin_of(&v.body);
            self.signed_gaps.note(&o, v.body.gaps.iter().map(|g| g.0));
            // Leaves only: a gap is told at once, also while records below it wait in the
            // fallback spool, so a gap's sequence says nothing of what was stored before it
            // (atk47e finding 1).
            let high = v.leaves.iter().map(|l| l.0).max();
            let to = self.covered_to.entry(origin_of(&v.body)).or_default();
            *to = high.unwrap_or_default().max(*to);
        }
        if let Some(last) = chain.last() {
            self.last_cut = parse_rfc3339_nanos(&last.body.created_at);
            self.head = Some((last.body.index, last.digest.clone()));
            self.last_origin = Some(origin_of(&last.body));
            let head = Head::new(&self.runner_id, last.body.index, &last.digest);
            if stored.as_ref() != Some(&head) {
                self.head_file.write(&head)?;
            }
            log::info!(
                "custody checkpoints: chain read back to its head {}",
                PeerText::new(&head.arg())
            );
        } else if let Some(h) = stored.filter(|_| suffix) {
            // Every checkpoint was drained to the target: the chain goes on from the head file.
            self.head = Some((h.index, h.digest.clone()));
            log::info!(
                "custody checkpoints: no checkpoint left in the spool (drained); the chain goes \
                 on from the head file's head {}",
                PeerText::new(&h.arg())
            );
        }
        Ok(())
    }

    /// With a store holding a suffix (the spool as the sink): adds its target's checkpoints
    /// (those not in `read` already) to `read`, so the chain is checked whole and continued
    /// from its real end (a checkpoint drained before the head file was written is found).
    /// Returns why the target could not be read (then only the spool's suffix is checked).
    fn read_target(&self, read: &mut Vec<(String, String)>) -> Option<String> {
        let target = self.store.target()?;
        match target.chain(&self.runner_id) {
            Ok(more) => {
                let seen: BTreeSet<String> = read.iter().map(|c| c.1.clone()).collect();
                read.extend(more.into_iter().filter(|c| !seen.contains(&c.1)));
                None
            }
            Err(e) => {
                log::warn!(
                    "custody checkpoints: the target's checkpoint store cannot be read ({}): \
                     only the spool's part of the chain is checked",
                    PeerText::new(&e)
                );
                Some(e)
            }
        }
    }

    /// Adds the (origin, sequence) of every record a verified checkpoint of this runner
    /// among `checkpoints` covers.
    fn cover(
        &self,
        checkpoints: Vec<(String, String)>,
        trusted: &TrustedKeys,
        covered: &mut BTreeSet<(Origin, u64)>,
    ) {
        for (_, text) in checkpoints {
            if let Ok(v) = checkpoint::verify(&text, trusted) {
                if v.body.runner_id == self.runner_id {
                    let o = origin_of(&v.body);
                    // Leaves only: a sequence listed as a gap (refused before the sink and
                    // NAKed, or whose dead letter failed) may be stored later, and its record
                    // is then signed as any other (atk47e finding 6).
                    covered.extend(v.leaves.iter().map(|l| (o.clone(), l.0)));
                }
            }
        }
    }

    /// Makes pending every record of this runner after the chain's start range that no
    /// checkpoint covers and whose custody seal verifies under the runner's custody key; a
    /// record failing the seal is never signed (logged, counted; the audit reports it as in
    /// no checkpoint).
    pub fn rescan(&mut self) -> Result<(), String> {
        let trusted = self.trusted();
        let mut covered = BTreeSet::new();
        self.cover(self.store.chain(&self.runner_id)?, &trusted, &mut covered);
        let mut records = self.store.scan(Some(&self.custodian))?;
        if let Some(target) = self.store.target() {
            // Records drained to the target after the last checkpoint (a kill -9 before it
            // was cut) are signed as any other store's: read them, seals checked.
            match (
                target.chain(&self.runner_id),
                target.scan(Some(&self.custodian)),
            ) {
                (Ok(cps), Ok(recs)) => {
                    self.cover(cps, &trusted, &mut covered);
                    records.extend(recs);
                }
                (Err(e), _) | (_, Err(e)) => log::warn!(
                    "custody checkpoints: the target's records cannot be read ({}): the \
                     rescan reads the spool's only",
                    PeerText::new(&e)
                ),
            }
        }
        let (mut found, mut refused) = (0usize, 0usize);
        for rec in records {
            match rec.read {
                Ok(r) if r.runner_id == self.runner_id => {
                    let o: Origin = (Arc::from(r.stream), Arc::from(r.incarnation));
                    let seq = r.sequence;
                    let after = self.covered_to.get(&o).is_none_or(|c| seq > *c);
                    let key = (o, seq);
                    if after && !covered.contains(&key) {
                        let (o, seq) = key;
                        if self
                            .pending
                            .entry(o)
                            .or_default()
                            .insert(seq, r.digest)
                            .is_none()
                        {
                            self.pending_count += 1;
                            found += 1;
                        }
                    }
                }
                Err(e) if e.starts_with(SEAL_REFUSED) => {
                    refused += 1;
                    log::error!(
                        "custody checkpoints: {}: {e}; never signed",
                        PeerText::new(&rec.place)
                    );
                }
                _ => {}
            }
        }
        if found > 0 {
            log::info!("custody checkpoints: {found} committed records in no checkpoint yet");
        }
        self.take_found(&covered);
        if refused > 0 {
            log::error!(
                "custody checkpoints: {refused} records of this runner refused by the rescan \
                 (custody seal does not verify)"
            );
        }
        Ok(())
    }

    /// The thread: until every sink worker has gone, then once more for what is pending.
    /// [`Writer::start`] has run before.
    pub fn run(mut self) {
        if let Err(e) = self.rescan() {
            log::error!("custody checkpoints: the rescan of the records failed: {e}");
        }
        let mut due = Instant::now() + self.every;
        loop {
            match self
                .rx
                .recv_timeout(due.saturating_duration_since(Instant::now()))
            {
                Ok(e) => self.take(e),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let now = Instant::now();
            if self.pending_count >= self.every_records || now >= due {
                self.cut();
                due = Instant::now() + self.every;
            }
        }
        self.cut();
    }

    fn take(&mut self, e: Event) {
        match e {
            Event::Committed(o, seq, d) => {
                if self.pending.entry(o).or_default().insert(seq, d).is_none() {
                    self.pending_count += 1;
                }
            }
            Event::Gap(o, seq, why) => self.take_gap(o, seq, why),
        }
    }

    fn take_gap(&mut self, o: Origin, seq: u64, why: &'static str) {
        if self.signed_gaps.holds(&o, seq) {
            return; // a message refused again on a later delivery: listed once
        }
        if self.gaps.entry(o).or_default().insert(seq, why).is_none() {
            self.pending_count += 1;
        }
    }

    /// When the chain's last checkpoint was cut (Unix ns), once [`Writer::start`] read it:
    /// the runner's start reads its dead letters back from about then.
    pub fn last_cut_unix_nanos(&self) -> Option<i128> {
        self.last_cut
    }

    /// Gaps found again at start (before the thread runs; see the field `found`).
    pub fn add_found_gaps(&mut self, gaps: Vec<(Origin, u64, &'static str)>) {
        self.found = gaps;
    }

    /// Lists the found gaps the chain did not sign (as a gap or as a record, `covered`) and
    /// whose record is not pending; once.
    fn take_found(&mut self, covered: &BTreeSet<(Origin, u64)>) {
        let mut listed = 0usize;
        for (o, seq, why) in std::mem::take(&mut self.found) {
            let pending = self.pending.get(&o).is_some_and(|p| p.contains_key(&seq));
            let known = covered.contains(&(o.clone(), seq)) || self.signed_gaps.holds(&o, seq);
            if !pending && !known && !self.gaps.get(&o).is_some_and(|g| g.contains_key(&seq)) {
                self.take_gap(o, seq, why);
                listed += 1;
            }
        }
        if listed > 0 {
            log::info!(
                "custody checkpoints: {listed} gaps of this runner found again (dead letters \
                 read back) and not signed yet: listed in the next checkpoint"
            );
        }
    }

    /// Writes a checkpoint of what is pending (nothing when nothing is), one per origin.
    fn cut(&mut self) {
        if self.overflowed.swap(false, Ordering::Relaxed) {
            while let Ok(e) = self.rx.try_recv() {
                self.take(e);
            }
            if let Err(e) = self.rescan() {
                log::error!("custody checkpoints: rescan after an overflow failed: {e}");
            }
        }
        let origins: BTreeSet<Origin> = self
            .pending
            .keys()
            .chain(self.gaps.keys())
            .cloned()
            .collect();
        for o in origins {
            if !self.cut_origin(&o) {
                return; // kept for the next one
            }
        }
    }

    /// Writes the checkpoint of one origin's pending records and gaps; false when it could
    /// not be stored (they stay pending).
    fn cut_origin(&mut self, o: &Origin) -> bool {
        let none = BTreeMap::new();
        let pending = self.pending.get(o).unwrap_or(&none);
        let leaves: Vec<(u64, [u8; 32])> = pending.iter().map(|(s, d)| (*s, *d)).collect();
        let no_gaps = BTreeMap::new();
        let gaps = self.gaps.get(o).unwrap_or(&no_gaps);
        let seqs = leaves.iter().map(|l| l.0).chain(gaps.keys().copied());
        let first = leaves
            .first()
            .map_or_else(|| seqs.clone().min(), |l| Some(l.0));
        let last = leaves
            .last()
            .map_or_else(|| seqs.clone().max(), |l| Some(l.0));
        let body = Body {
            runner_id: self.runner_id.clone(),
            key_id: self.signer.key_id().to_string(),
            sink: self.sink.clone(),
            index: self.head.as_ref().map_or(0, |(i, _)| i + 1),
            first_sequence: first.unwrap_or(0),
            last_sequence: last.unwrap_or(0),
            count: leaves.len() as u64,
            root: checkpoint::merkle_root(&leaves),
            previous: self.head.as_ref().map(|h| h.1.clone()).unwrap_or_default(),
            gaps: gaps.iter().map(|(s, w)| (*s, w.to_string())).collect(),
            created_at: format_rfc3339_nanos(now_unix_nanos()),
            stream: o.0.to_string(),
            stream_incarnation: o.1.to_string(),
        };
        let bytes = seal(&body, &leaves, &self.signer);
        if let Err(e) = self.store.put(&self.runner_id, body.index, &bytes) {
            log::error!(
                "custody checkpoint {} not written (kept for the next one): {e}",
                body.index
            );
            return false;
        }
        let digest = checkpoint::body_digest(&body.encode());
        let head = Head::new(&self.runner_id, body.index, &digest);
        if self.last_origin.as_ref().is_some_and(|l| l != o) {
            log::warn!(
                "custody checkpoint {}: stream {} incarnation {} starts here (the checkpoint \
                 before it is of stream {} incarnation {}): the stream was created again; its \
                 sequences start a new range of the chain",
                body.index,
                PeerText::new(&o.0),
                PeerText::new(&o.1),
                PeerText::new(self.last_origin.as_ref().map_or("", |l| &l.0)),
                PeerText::new(self.last_origin.as_ref().map_or("", |l| &l.1)),
            );
        }
        // The auditor's copy outside the sink: `svc verify-custody --head RUNNER:INDEX:DIGEST`.
        log::info!(
            "custody checkpoint head {} ({} records, sequences {} to {})",
            PeerText::new(&head.arg()),
            body.count,
            body.first_sequence,
            body.last_sequence
        );
        if let Err(e) = self.head_file.write(&head) {
            log::error!("custody checkpoint {}: {e}", body.index);
        }
        self.head = Some((body.index, digest));
        self.last_origin = Some(o.clone());
        self.pending_count -= leaves.len() + gaps.len();
        self.signed_gaps.note(o, gaps.keys().copied());
        self.pending.remove(o);
        self.gaps.remove(o);
        true
    }
}

/// Gaps signed lately, the newest [`SIGNED_GAPS_KEPT`]: a message refused on every delivery
/// (no DLQ, no `max_deliveries`) is listed in one checkpoint, not in every one after it
/// (atk50a finding 6). Older ones are forgotten; the verifier counts a gap listed twice once.
#[derive(Default)]
struct SignedGaps {
    held: BTreeSet<(Origin, u64)>,
    order: std::collections::VecDeque<(Origin, u64)>,
}

/// Signed gaps remembered.
const SIGNED_GAPS_KEPT: usize = 65_536;

impl SignedGaps {
    fn holds(&self, o: &Origin, seq: u64) -> bool {
        self.held.contains(&(o.clone(), seq))
    }

    fn note(&mut self, o: &Origin, seqs: impl Iterator<Item = u64>) {
        for seq in seqs {
            if self.held.insert((o.clone(), seq)) {
                self.order.push_back((o.clone(), seq));
            }
            if self.order.len() > SIGNED_GAPS_KEPT {
                if let Some(old) = self.order.pop_front() {
                    self.held.remove(&old);
                }
            }
        }
    }
}

/// This runner's checkpoints among the stored ones, verified, in index order, checked to run
/// 0, 1, 2, ... (with `suffix`, from any index: the spool as the sink) with each `previous`
/// the digest before. A stored checkpoint that does not verify is an error unless its
/// (unverified) body names another runner.
fn own_chain(
    read: Vec<(String, String)>,
    trusted: &TrustedKeys,
    runner_id: &str,
    suffix: bool,
) -> Result<Vec<checkpoint::Verified>, String> {
    let mut chain = Vec::new();
    for (place, text) in read {
        match checkpoint::verify(&text, trusted) {
            Ok(v) if v.body.runner_id == runner_id => chain.push(v),
            Ok(_) => {}
            Err(e) => {
                let claimed = claimed_runner(&text);
                if claimed.as_deref().is_some_and(|r| r != runner_id) {
                    continue; // another runner's, under its own key
                }
                return Err(format!(
                    "custody checkpoint {} does not verify under this runner's key ({e}): \
                     the chain cannot be continued; audit it with svc verify-custody \
                     --public-key --head",
                    PeerText::new(&place)
                ));
            }
        }
    }
    chain.sort_by_key(|v| v.body.index);
    let first = match chain.first() {
        Some(f) if suffix => f.body.index,
        _ => 0,
    };
    let mut previous = match chain.first() {
        Some(f) if suffix => f.body.previous.clone(),
        _ => String::new(),
    };
    for (i, v) in chain.iter().enumerate() {
        if v.body.index != first + i as u64 || v.body.previous != previous {
            return Err(format!(
                "custody checkpoints: the chain of runner {} is broken at checkpoint {} \
                 (removed, forked or reordered): it cannot be continued; audit it with svc \
                 verify-custody --public-key --head",
                PeerText::new(runner_id),
                v.body.index
            ));
        }
        previous = v.digest.clone();
    }
    Ok(chain)
}

/// The runner id an unverified checkpoint's body claims, when it can be read.
fn claimed_runner(text: &str) -> Option<String> {
    claimed(text).map(|c| c.0)
}

/// The (runner id, index) an unverified checkpoint's body claims, when it can be read (the
/// runner id alone when the index cannot).
pub fn claimed(text: &str) -> Option<(String, Option<u64>)> {
    let outer: serde_json::Value = serde_json::from_str(text).ok()?;
    let body: serde_json::Value = serde_json::from_str(outer.get("signed")?.as_str()?).ok()?;
    let runner = body.get("runner_id")?.as_str()?.to_string();
    Some((
        runner,
        body.get("index").and_then(serde_json::Value::as_u64),
    ))
}

/// [`check_head`] for a store holding the end of the chain only (the spool as the sink; see
/// [`CheckpointStore::holds_suffix`]): the suffix must hold the head file's head, or begin
/// right after it (a crash between a checkpoint's put and the head file's write, its
/// checkpoint drained since), or be empty (every
/// checkpoint drained to the target). A suffix that ends before the head, or holds another
/// checkpoint there, is refused.
fn check_suffix_head(
    chain: &[checkpoint::Verified],
    stored: Option<&Head>,
    runner_id: &str,
    file: &HeadFile,
) -> Result<(), String> {
    let Some(h) = stored.filter(|h| h.runner_id == runner_id) else {
        return check_head(chain, stored, runner_id, file);
    };
    let Some(first) = chain.first() else {
        return Ok(()); // every checkpoint drained to the target
    };
    let start = first.body.index;
    if h.index < start {
        if start == h.index + 1 && first.body.previous == h.digest {
            return Ok(());
        }
        return Err(format!(
            "custody checkpoints: the spool's chain of runner {} begins at checkpoint {start}, \
             which does not follow the head file {}'s checkpoint {}: it cannot be continued; \
             audit with svc verify-custody --public-key FILE --head {}",
            PeerText::new(runner_id),
            shown_path(&file.path),
            h.index,
            PeerText::new(&h.arg())
        ));
    }
    // The head is in the suffix, or past its end (truncated): as for a whole chain, shifted.
    let at = (h.index - start) as usize;
    let found = match chain.get(at) {
        Some(v) if v.digest == h.digest => return Ok(()),
        Some(v) => format!("holds another checkpoint {} (digest {})", h.index, v.digest),
        None => format!(
            "is TRUNCATED: it ends at checkpoint {}",
            chain.last().map_or(0, |v| v.body.index)
        ),
    };
    Err(format!(
        "custody checkpoints: the spool's chain of runner {} {found}, but the head file {} \
         holds checkpoint {}: it is not continued; audit with svc verify-custody --public-key \
         FILE --head {}",
        PeerText::new(runner_id),
        shown_path(&file.path),
        h.index,
        PeerText::new(&h.arg())
    ))
}

/// The chain read back must reach the head file's head: an error when it is behind
/// (truncated, removed, emptied) or holds another checkpoint at that index.
fn check_head(
    chain: &[checkpoint::Verified],
    stored: Option<&Head>,
    runner_id: &str,
    file: &HeadFile,
) -> Result<(), String> {
    let shown = PeerText::new(&file.path.to_string_lossy()).to_string();
    let Some(h) = stored else {
        if let Some(last) = chain.last() {
            return Err(format!(
                "custody checkpoints: the sink holds a chain of runner {} up to checkpoint {} \
                 but the head file {shown} is missing: a head file lost with the sink cut \
                 back cannot be told apart. Check the chain against the head last logged \
                 (svc verify-custody --public-key FILE --head RUNNER:INDEX:DIGEST), then \
                 write that head to the file (docs/payload-protection.md, \"Chain head\")",
                PeerText::new(runner_id),
                last.body.index
            ));
        }
        return Ok(());
    };
    if h.runner_id != runner_id {
        return Err(format!(
            "custody checkpoints: the head file {shown} is runner {}'s, this runner is {}",
            PeerText::new(&h.runner_id),
            PeerText::new(runner_id)
        ));
    }
    match chain.get(h.index as usize) {
        Some(v) if v.digest == h.digest => Ok(()),
        Some(v) => Err(format!(
            "custody checkpoints: checkpoint {} of runner {} in the sink (digest {}) differs \
             from the head file {shown} (digest {}): the chain was replaced; it is not continued",
            h.index,
            PeerText::new(runner_id),
            v.digest,
            PeerText::new(&h.digest)
        )),
        None => Err(format!(
            "custody checkpoints: the sink's chain of runner {} is TRUNCATED: it ends {} but the \
             head file {shown} holds checkpoint {}; records and checkpoints were removed. It is \
             not continued; audit with svc verify-custody --public-key FILE --head {}",
            PeerText::new(runner_id),
            chain
                .last()
                .map_or("before checkpoint 0".to_string(), |v| format!(
                    "at checkpoint {}",
                    v.body.index
                )),
            h.index,
            PeerText::new(&h.arg())
        )),
    }
}

/// One stored record read back; with `seal`, a record of its runner whose custody seal does
/// not verify reads as [`SEAL_REFUSED`].
fn read_record(t: &str, seal: Option<&Custodian>) -> Result<RecordRead, String> {
    use crate::message::protection::custody::Verdict;
    let doc = canonical::parse(t).map_err(|e| format!("not a JSON record: {e}"))?;
    let read = RecordRead::of(&doc, public_digest_stored(&doc)?)?;
    match seal {
        Some(c) if read.runner_id == c.runner_id() => match c.verify(&doc) {
            Verdict::Intact => Ok(read),
            Verdict::Altered => Err(format!(
                "{SEAL_REFUSED} (sequence {}: ALTERED)",
                read.sequence
            )),
            Verdict::Unverifiable(why) => Err(format!(
                "{SEAL_REFUSED} (sequence {}: {why})",
                read.sequence
            )),
        },
        _ => Ok(read),
    }
}

/// A record file's records: one JSON object, or JSON lines.
pub(crate) fn records_of(
    place: &str,
    text: &str,
    seal: Option<&Custodian>,
    out: &mut Vec<StoredRecord>,
) {
    let one = |place: String, t: &str| StoredRecord {
        place,
        read: read_record(t, seal),
    };
    if serde_json::from_str::<&serde_json::value::RawValue>(text).is_ok() {
        out.push(one(place.to_string(), text));
        return;
    }
    for (i, line) in text.lines().enumerate() {
        if !line.trim().is_empty() {
            out.push(one(format!("{place}:{}", i + 1), line));
        }
    }
}

/// Reads a regular file (never through a link: opened `O_NOFOLLOW` and checked on the open
/// handle) up to `max` bytes; `dir` is the directory `name` is opened in.
fn read_bounded_at(dir: impl AsFd, name: &Path, max: u64) -> Result<String, String> {
    let (file, _) = crate::files::owner::open_regular_at(dir, name).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(max + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read: {e}"))?;
    if text.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(text)
}

/// [`read_bounded_at`] for a path.
fn read_bounded(path: &Path, max: u64) -> Result<String, String> {
    read_bounded_at(rustix::fs::CWD, path, max)
}

/// A path for an error line, escaped.
fn shown_path(p: &Path) -> String {
    PeerText::new(&p.to_string_lossy()).to_string()
}

/// The file sink's checkpoints: `<directory>/.svc-checkpoints/<hex runner id>-<index>.json`,
/// written as records are (temporary name, fsync, link to the final name, which never
/// replaces an existing checkpoint, directory fsync).
#[derive(Debug, Clone)]
pub struct FileStore {
    pub root: PathBuf,
    pub file_mode: u32,
}

impl FileStore {
    fn dir(&self) -> PathBuf {
        self.root.join(FILE_CHECKPOINT_DIR)
    }

    fn walk(
        &self,
        dir: &Path,
        depth: usize,
        seal: Option<&Custodian>,
        out: &mut Vec<StoredRecord>,
    ) -> Result<(), String> {
        let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", shown_path(dir)))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", shown_path(dir)))?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue; // temporary files and the checkpoint directory
            }
            let path = entry.path();
            let place = path
                .strip_prefix(&self.root)
                .unwrap_or(&path)
                .display()
                .to_string();
            let ft = entry.file_type().map_err(|e| format!("{place}: {e}"))?;
            if ft.is_dir() && depth < 32 {
                self.walk(&path, depth + 1, seal, out)?;
            } else if ft.is_file() {
                match read_bounded(&path, MAX_RECORD_FILE_BYTES) {
                    Ok(text) => {
                        records_of(&place, &text, seal, out);
                        records_bound(out.len())?;
                    }
                    Err(e) => out.push(StoredRecord {
                        place,
                        read: Err(e),
                    }),
                }
            }
        }
        Ok(())
    }
}

impl FileStore {
    /// The checkpoint directory, opened without following a link at its name.
    fn open_dir(&self) -> std::io::Result<OwnedFd> {
        let root = rustix::fs::open(
            &self.root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let fd = rustix::fs::openat(
            &root,
            FILE_CHECKPOINT_DIR,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                std::io::Error::other("not a directory (a link or a file at that name): refused")
            }
            e => e.into(),
        })?;
        Ok(fd)
    }
}

/// A put's temporary name for checkpoint `name`: unique between processes and between the
/// threads of one process (the checkpoint thread and a drain's put of the same name: one
/// put's error path never unlinks another's file; atk51b finding 1).
fn temp_name(name: &str) -> String {
    static PUTS: AtomicU64 = AtomicU64::new(0);
    format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        PUTS.fetch_add(1, Ordering::Relaxed)
    )
}

impl CheckpointStore for FileStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.dir();
        let mode = super::file::durable::dir_mode(self.file_mode);
        match fs::DirBuilder::new().mode(mode).create(&dir) {
            Ok(()) => super::file::durable::sync_dir(&self.root).map_err(|e| e.to_string())?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("create {FILE_CHECKPOINT_DIR}: {e}")),
        }
        let name = format!(
            "{}-{index:020}.json",
            crate::text::hex::lower(runner_id.as_bytes())
        );
        let tmp = temp_name(&name);
        let dirfd = self
            .open_dir()
            .map_err(|e| format!("open {FILE_CHECKPOINT_DIR}: {e}"))?;
        let write = || -> std::io::Result<()> {
            let fd = rustix::fs::openat(
                &dirfd,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(self.file_mode),
            )?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(self.file_mode))?;
            let mut f = fs::File::from(fd);
            f.write_all(bytes)?;
            f.sync_all()?;
            // A link, not a rename: an existing checkpoint of that name is never replaced.
            rustix::fs::linkat(
                &dirfd,
                tmp.as_str(),
                &dirfd,
                name.as_str(),
                rustix::fs::AtFlags::empty(),
            )?;
            rustix::fs::unlinkat(&dirfd, tmp.as_str(), rustix::fs::AtFlags::empty())?;
            rustix::fs::fsync(&dirfd)?;
            Ok(())
        };
        write().map_err(|e| {
            let _ = rustix::fs::unlinkat(&dirfd, tmp.as_str(), rustix::fs::AtFlags::empty());
            format!("write {FILE_CHECKPOINT_DIR}/{name}: {e}")
        })
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        let dirfd = match self.open_dir() {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{FILE_CHECKPOINT_DIR}: {e}")),
        };
        let listed = rustix::fs::openat(
            &dirfd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("{FILE_CHECKPOINT_DIR}: {e}"))?;
        let entries = rustix::fs::Dir::read_from(&listed)
            .map_err(|e| format!("{FILE_CHECKPOINT_DIR}: {e}"))?;
        let (mut out, mut total) = (Vec::new(), 0usize);
        for entry in entries {
            let entry = entry.map_err(|e| format!("{FILE_CHECKPOINT_DIR}: {e}"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let place = format!("{FILE_CHECKPOINT_DIR}/{}", PeerText::new(&name));
            // An unreadable one is still a checkpoint the audit must count: refused, not gone.
            let text =
                read_bounded_at(&dirfd, Path::new(&name), MAX_CHECKPOINT_BYTES).unwrap_or_default();
            checkpoints_bound(&mut total, &text)?;
            out.push((place, text));
        }
        out.sort();
        Ok(out)
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.scan(None)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        let mut out = Vec::new();
        self.walk(&self.root, 0, seal, &mut out)?;
        Ok(out)
    }
}

/// Name of the PostgreSQL sink's checkpoint table, in the schema of its events table.
pub const PG_CHECKPOINT_TABLE: &str = "svc_custody_checkpoints";

/// The PostgreSQL sink's checkpoints: one row per checkpoint in [`PG_CHECKPOINT_TABLE`]
/// (created by `svc init-db`), committed with `synchronous_commit` on.
pub struct PgStore {
    sink: super::relational::RelationalSink,
    cfg: super::relational::config::RelationalConfig,
}

impl PgStore {
    pub fn new(cfg: &super::relational::config::RelationalConfig) -> Result<PgStore, String> {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let sink = super::relational::RelationalSink::new(cfg.clone(), metrics)
            .map_err(|e| e.to_string())?;
        Ok(PgStore {
            sink,
            cfg: cfg.clone(),
        })
    }

    fn table(&self) -> String {
        match &self.cfg.table.schema {
            Some(s) => format!("\"{s}\".\"{PG_CHECKPOINT_TABLE}\""),
            None => format!("\"{PG_CHECKPOINT_TABLE}\""),
        }
    }

    /// The DDL of the checkpoint table (idempotent).
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    runner_id text NOT NULL,\n    \
             checkpoint_index bigint NOT NULL,\n    checkpoint text NOT NULL,\n    \
             stored_at timestamptz NOT NULL DEFAULT now(),\n    \
             PRIMARY KEY (runner_id, checkpoint_index)\n);\n",
            self.table()
        )
    }

    /// Creates the checkpoint table (`svc init-db`).
    pub fn create_table(&self) -> Result<(), String> {
        let ddl = self.ddl();
        self.sink
            .with_session("create the checkpoint table in", |c| {
                c.simple(&ddl).map(|_| ())
            })
            .map_err(|e| e.to_string())
    }
}

impl CheckpointStore for PgStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        let sql = format!(
            "INSERT INTO {} (runner_id, checkpoint_index, checkpoint) VALUES ($1, $2, $3)",
            self.table()
        );
        let text = std::str::from_utf8(bytes).map_err(|_| "checkpoint is not UTF-8")?;
        let idx = index.to_string();
        self.sink
            .with_session("write a checkpoint to", |c| {
                c.query(&sql, &[Some(runner_id), Some(&idx), Some(text)])
                    .map(|_| ())
            })
            .map_err(|e| e.to_string())
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints(None)
    }

    fn chain(&self, runner_id: &str) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints(Some(runner_id))
    }

    fn get(&self, runner_id: &str, index: u64) -> Result<Option<String>, String> {
        let sql = format!(
            "SELECT left(checkpoint, {MAX_CHECKPOINT_BYTES} + 1) FROM {} WHERE runner_id = $1 \
             AND checkpoint_index = $2::bigint",
            self.table()
        );
        let idx = index.to_string();
        let res = self
            .sink
            .with_session("read a checkpoint of", |c| {
                c.query(&sql, &[Some(runner_id), Some(&idx)])
            })
            .map_err(|e| e.to_string())?;
        Ok(res
            .rows
            .into_iter()
            .next()
            .map(|r| r.into_iter().next().flatten().unwrap_or_default()))
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.scan(None)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        let mut out = Vec::new();
        for t in self.cfg.tables() {
            let table = t.sql();
            let list = format!(
                "SELECT e.idempotency_key, octet_length(row_to_json(e)::text)::text FROM \
                 {table} e WHERE $1::text IS NULL OR e.idempotency_key > $1 ORDER BY \
                 e.idempotency_key LIMIT {SQL_LIST_ROWS}"
            );
            let fetch = format!(
                "SELECT e.idempotency_key, row_to_json(e)::text FROM {table} e WHERE \
                 e.idempotency_key IN (SELECT k.v->>0 FROM jsonb_array_elements($1::jsonb) k(v))"
            );
            let mut each = |k: &[String], text: Result<String, String>| {
                let place = format!("{t} row {}", PeerText::new(&k[0]));
                match text {
                    Ok(text) => records_of(&place, &text, seal, &mut out),
                    Err(e) => out.push(StoredRecord {
                        place,
                        read: Err(e),
                    }),
                }
                records_bound(out.len())
            };
            self.paged(
                "read the records of",
                (MAX_AUDIT_RECORDS, PG_MAX_ROW_BYTES),
                (&list, &|after| vec![after.first().cloned()]),
                &fetch,
                &mut each,
            )?;
        }
        Ok(out)
    }
}

/// Largest row text a PostgreSQL read-back fetches (a statement's result is bounded by the
/// client, `wire::MAX_RESULT_BYTES`); a longer one is named unreadable.
const PG_MAX_ROW_BYTES: u64 = (super::relational::wire::MAX_RESULT_BYTES - (64 << 10)) as u64;

impl PgStore {
    /// The checkpoints of every runner, or of `runner` only, paged by key ([`paged_rows`]).
    fn read_checkpoints(&self, runner: Option<&str>) -> Result<Vec<(String, String)>, String> {
        let t = self.table();
        let list = format!(
            "SELECT runner_id, checkpoint_index::text, octet_length(checkpoint)::text FROM {t} \
             WHERE ($3::text IS NULL OR runner_id = $3) AND ($1::text IS NULL OR \
             (runner_id, checkpoint_index) > ($1, $2::bigint)) ORDER BY runner_id, \
             checkpoint_index LIMIT {SQL_LIST_ROWS}"
        );
        let fetch = format!(
            "SELECT t.runner_id, t.checkpoint_index::text, t.checkpoint FROM {t} t JOIN \
             jsonb_array_elements($1::jsonb) k(v) ON t.runner_id = k.v->>0 AND \
             t.checkpoint_index = (k.v->>1)::bigint"
        );
        let (mut out, mut total) = (Vec::new(), 0usize);
        let mut each = |k: &[String], text: Result<String, String>| {
            let place = format!(
                "{PG_CHECKPOINT_TABLE} row ({}, {})",
                PeerText::new(&k[0]),
                PeerText::new(&k[1])
            );
            // An unreadable one is still a checkpoint the audit must count: refused, not gone.
            let text = text.unwrap_or_default();
            checkpoints_bound(&mut total, &text)?;
            out.push((place, text));
            Ok(())
        };
        let params = |after: &[String]| {
            vec![
                after.first().cloned(),
                after.get(1).cloned(),
                runner.map(str::to_string),
            ]
        };
        self.paged(
            "read the checkpoints of",
            (
                MAX_AUDIT_CHECKPOINTS,
                MAX_CHECKPOINT_BYTES.min(PG_MAX_ROW_BYTES),
            ),
            (&list, &params),
            &fetch,
            &mut each,
        )?;
        Ok(out)
    }

    /// [`paged_rows`] on one session: `list` is run with the parameters `params` gives for
    /// the last key listed (empty: from the start), `fetch` with the keys as a JSON array.
    #[allow(clippy::type_complexity)]
    fn paged(
        &self,
        what: &str,
        bounds: (usize, u64),
        (list, params): (&str, &dyn Fn(&[String]) -> Vec<Option<String>>),
        fetch: &str,
        each: &mut dyn FnMut(&[String], Result<String, String>) -> Result<(), String>,
    ) -> Result<(), String> {
        self.sink
            .with_session(what, |c| {
                paged_rows(
                    c,
                    bounds,
                    &|c, after| {
                        let p = params(after.unwrap_or_default());
                        let p: Vec<Option<&str>> = p.iter().map(Option::as_deref).collect();
                        c.query(list, &p).map(|r| r.rows)
                    },
                    &|c, keys| {
                        let keys = serde_json::to_string(keys).unwrap_or_default();
                        c.query(fetch, &[Some(&keys)]).map(|r| r.rows)
                    },
                    each,
                )
            })
            .map_err(|e| e.to_string())
    }
}

/// Keys listed per statement by a relational read-back (MySQL and PostgreSQL).
const SQL_LIST_ROWS: usize = 10_000;
/// Texts fetched per statement by a relational read-back (bytes, and rows): well under the
/// clients' bounds (100,000 rows, 16 MiB for one statement).
const SQL_FETCH_BYTES: u64 = 8 << 20;
const SQL_FETCH_ROWS: usize = 1_000;

/// Rows of one statement's result.
type Rows = Vec<Vec<Option<String>>>;
type DbError = super::relational::error::DbError;

/// Every row of a table in key order, paged on session `c`: `list` gives (key columns...,
/// length) after the given last key (`None`: from the start), at most [`SQL_LIST_ROWS`] rows;
/// `fetch` gives (key columns..., text) of the given keys. Calls `each(key, text)` in key
/// order; a text longer than `max` is given as `Err`. At most `most` rows.
#[allow(clippy::type_complexity)]
fn paged_rows<C>(
    c: &mut C,
    (most, max): (usize, u64),
    list: &dyn Fn(&mut C, Option<&[String]>) -> Result<Rows, DbError>,
    fetch: &dyn Fn(&mut C, &[Vec<String>]) -> Result<Rows, DbError>,
    each: &mut dyn FnMut(&[String], Result<String, String>) -> Result<(), String>,
) -> Result<(), DbError> {
    let mut after: Option<Vec<String>> = None;
    let mut seen = 0usize;
    loop {
        let listed = list(c, after.as_deref())?;
        let done = listed.len() < SQL_LIST_ROWS;
        let rows: Vec<(Vec<String>, u64)> = listed
            .into_iter()
            .map(|r| {
                let mut r: Vec<String> = r.into_iter().map(Option::unwrap_or_default).collect();
                let len = r.pop().and_then(|l| l.parse().ok()).unwrap_or(u64::MAX);
                (r, len)
            })
            .collect();
        seen += rows.len();
        if seen > most {
            return Err(DbError::Protocol(format!(
                "more than {most} rows: past the read-back bound"
            )));
        }
        after = rows.last().map(|r| r.0.clone());
        fetch_groups(c, &rows, max, fetch, each)?;
        if done {
            return Ok(());
        }
    }
}

/// Fetches the texts of listed rows in groups of at most [`SQL_FETCH_BYTES`] and
/// [`SQL_FETCH_ROWS`]; a row longer than `max` is not fetched (`Err`).
#[allow(clippy::type_complexity)]
fn fetch_groups<C>(
    c: &mut C,
    rows: &[(Vec<String>, u64)],
    max: u64,
    fetch: &dyn Fn(&mut C, &[Vec<String>]) -> Result<Rows, DbError>,
    each: &mut dyn FnMut(&[String], Result<String, String>) -> Result<(), String>,
) -> Result<(), DbError> {
    let mut i = 0;
    while i < rows.len() {
        let (mut j, mut bytes) = (i, 0u64);
        while j < rows.len() && j - i < SQL_FETCH_ROWS && rows[j].1 <= max {
            if j > i && bytes + rows[j].1 > SQL_FETCH_BYTES {
                break;
            }
            bytes += rows[j].1;
            j += 1;
        }
        if j == i {
            // Longer than `max`: named, never read.
            each(&rows[i].0, Err(format!("larger than {max} bytes"))).map_err(DbError::Protocol)?;
            i += 1;
            continue;
        }
        let keys: Vec<Vec<String>> = rows[i..j].iter().map(|r| r.0.clone()).collect();
        let mut texts: BTreeMap<Vec<String>, String> = BTreeMap::new();
        for r in fetch(c, &keys)? {
            let mut r: Vec<String> = r.into_iter().map(Option::unwrap_or_default).collect();
            let text = r.pop().unwrap_or_default();
            texts.insert(r, text);
        }
        for k in &keys {
            // A row deleted between the listing and the fetch is gone: not reported.
            if let Some(t) = texts.remove(k) {
                each(k, Ok(t)).map_err(DbError::Protocol)?;
            }
        }
        i = j;
    }
    Ok(())
}

/// The MySQL/MariaDB sink's checkpoints: one row per checkpoint in [`PG_CHECKPOINT_TABLE`]
/// (the same name and columns as PostgreSQL's, created by `svc init-db`) in the events table's
/// database, each INSERT committed (autocommit) before it returns. Reads are paged by key so
/// no statement passes the client's bounds (100,000 rows, 16 MiB): keys and lengths first,
/// then the texts in groups of at most [`SQL_FETCH_BYTES`] ([`paged_rows`]).
pub struct MyStore {
    sink: super::relational::my_sink::MySqlSink,
    cfg: super::relational::config::RelationalConfig,
}

/// Largest row text a MySQL read-back fetches (a statement's result is bounded by the
/// client, `mysql::conn::MAX_RESULT_BYTES`); a longer one is named unreadable.
const MY_MAX_ROW_BYTES: u64 =
    (super::relational::mysql::conn::MAX_RESULT_BYTES - (64 << 10)) as u64;

impl MyStore {
    pub fn new(cfg: &super::relational::config::RelationalConfig) -> Result<MyStore, String> {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let sink = super::relational::my_sink::MySqlSink::new(cfg.clone(), metrics)
            .map_err(|e| e.to_string())?;
        Ok(MyStore {
            sink,
            cfg: cfg.clone(),
        })
    }

    fn table(&self) -> String {
        match &self.cfg.table.schema {
            Some(s) => format!("`{s}`.`{PG_CHECKPOINT_TABLE}`"),
            None => format!("`{PG_CHECKPOINT_TABLE}`"),
        }
    }

    /// The DDL of the checkpoint table (idempotent).
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    runner_id VARCHAR(255) NOT NULL,\n    \
             checkpoint_index BIGINT UNSIGNED NOT NULL,\n    checkpoint LONGTEXT NOT NULL,\n    \
             stored_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),\n    \
             PRIMARY KEY (runner_id, checkpoint_index)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 \
             COLLATE=utf8mb4_bin;\n",
            self.table()
        )
    }

    /// Creates the checkpoint table (`svc init-db`).
    pub fn create_table(&self) -> Result<(), String> {
        let ddl = self.ddl();
        self.sink
            .with_session("create the checkpoint table in", |c| {
                c.query(ddl.trim_end().trim_end_matches(';')).map(|_| ())
            })
            .map_err(|e| e.to_string())
    }

    /// [`paged_rows`] on one session: `list` and `fetch` give the statements.
    #[allow(clippy::type_complexity)]
    fn paged(
        &self,
        what: &str,
        most: usize,
        max: u64,
        list: &dyn Fn(&super::relational::mysql::Connection, Option<&[String]>) -> String,
        fetch: &dyn Fn(&super::relational::mysql::Connection, &[Vec<String>]) -> String,
        each: &mut dyn FnMut(&[String], Result<String, String>) -> Result<(), String>,
    ) -> Result<(), String> {
        self.sink
            .with_session(what, |c| {
                paged_rows(
                    c,
                    (most, max),
                    &|c, after| {
                        let sql = list(c, after);
                        c.query(&sql).map(|r| r.rows)
                    },
                    &|c, keys| {
                        let sql = fetch(c, keys);
                        c.query(&sql).map(|r| r.rows)
                    },
                    each,
                )
            })
            .map_err(|e| e.to_string())
    }
}

impl CheckpointStore for MyStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "checkpoint is not UTF-8")?;
        let table = self.table();
        self.sink
            .with_session("write a checkpoint to", |c| {
                let sql = format!(
                    "INSERT INTO {table} (runner_id, checkpoint_index, checkpoint) VALUES \
                     ({}, {index}, {})",
                    c.quote(runner_id),
                    c.quote(text)
                );
                c.query(&sql).map(|_| ())
            })
            .map_err(|e| e.to_string())
    }

    fn get(&self, runner_id: &str, index: u64) -> Result<Option<String>, String> {
        let table = self.table();
        let max = MAX_CHECKPOINT_BYTES.min(MY_MAX_ROW_BYTES);
        let res = self
            .sink
            .with_session("read a checkpoint of", |c| {
                // One longer than the bound reads as empty (it matches no checkpoint).
                let sql = format!(
                    "SELECT IF(LENGTH(checkpoint) <= {max}, checkpoint, '') FROM {table} \
                     WHERE runner_id = {} AND checkpoint_index = {index}",
                    c.quote(runner_id)
                );
                c.query(&sql)
            })
            .map_err(|e| e.to_string())?;
        Ok(res
            .rows
            .into_iter()
            .next()
            .map(|r| r.into_iter().next().flatten().unwrap_or_default()))
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        let t = self.table();
        let list = |c: &super::relational::mysql::Connection, after: Option<&[String]>| {
            let from = match after {
                Some([r, i]) => format!(
                    "WHERE (runner_id, checkpoint_index) > ({}, {i})",
                    c.quote(r)
                ),
                _ => String::new(),
            };
            format!(
                "SELECT runner_id, CAST(checkpoint_index AS CHAR), LENGTH(checkpoint) FROM {t} \
                 {from} ORDER BY runner_id, checkpoint_index LIMIT {SQL_LIST_ROWS}"
            )
        };
        let fetch = |c: &super::relational::mysql::Connection, keys: &[Vec<String>]| {
            let keys: Vec<String> = keys
                .iter()
                .map(|k| format!("({}, {})", c.quote(&k[0]), k[1].parse::<u64>().unwrap_or(0)))
                .collect();
            format!(
                "SELECT runner_id, CAST(checkpoint_index AS CHAR), checkpoint FROM {t} WHERE \
                 (runner_id, checkpoint_index) IN ({})",
                keys.join(", ")
            )
        };
        let (mut out, mut total) = (Vec::new(), 0usize);
        let mut each = |k: &[String], text: Result<String, String>| {
            let place = format!(
                "{PG_CHECKPOINT_TABLE} row ({}, {})",
                PeerText::new(&k[0]),
                PeerText::new(&k[1])
            );
            // An unreadable one is still a checkpoint the audit must count: refused, not gone.
            let text = text.unwrap_or_default();
            checkpoints_bound(&mut total, &text)?;
            out.push((place, text));
            Ok(())
        };
        self.paged(
            "read the checkpoints of",
            MAX_AUDIT_CHECKPOINTS,
            MAX_CHECKPOINT_BYTES.min(MY_MAX_ROW_BYTES),
            &list,
            &fetch,
            &mut each,
        )?;
        Ok(out)
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.scan(None)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        use super::relational::my_sink::custody_export_sql;
        let mut out = Vec::new();
        for t in self.cfg.tables() {
            // `SELECT JSON_OBJECT(...) FROM <table> ORDER BY ...`: the row as the export shows it.
            let export = custody_export_sql(t);
            let (object, rest) = export
                .split_once(" FROM ")
                .ok_or("the export statement has no FROM")?;
            let table = rest.split(" ORDER BY ").next().unwrap_or(rest).to_string();
            let object = object.trim_start_matches("SELECT ").to_string();
            let list = |c: &super::relational::mysql::Connection, after: Option<&[String]>| {
                let from = match after {
                    Some([k]) => format!("WHERE idempotency_key > {}", c.quote(k)),
                    _ => String::new(),
                };
                format!(
                    "SELECT idempotency_key, LENGTH({object}) FROM {table} {from} ORDER BY \
                     idempotency_key LIMIT {SQL_LIST_ROWS}"
                )
            };
            let fetch = |c: &super::relational::mysql::Connection, keys: &[Vec<String>]| {
                let keys: Vec<String> = keys.iter().map(|k| c.quote(&k[0])).collect();
                format!(
                    "SELECT idempotency_key, {object} FROM {table} WHERE idempotency_key IN ({})",
                    keys.join(", ")
                )
            };
            let mut each = |k: &[String], text: Result<String, String>| {
                let place = format!("{t} row {}", PeerText::new(&k[0]));
                match text {
                    Ok(text) => records_of(&place, &text, seal, &mut out),
                    Err(e) => out.push(StoredRecord {
                        place,
                        read: Err(e),
                    }),
                }
                records_bound(out.len())
            };
            self.paged(
                "read the records of",
                MAX_AUDIT_RECORDS,
                MY_MAX_ROW_BYTES,
                &list,
                &fetch,
                &mut each,
            )?;
        }
        Ok(out)
    }
}

/// Most objects an object-store audit lists.
pub const MAX_LISTED_OBJECTS: usize = 10_000_000;

/// The object store's checkpoints: `<prefix>/_svc-custody/checkpoints/<hex runner id>-<index>.json`
/// (a reserved segment no `key_prefix` may start with), each one PUT (durable when the store
/// answers 2xx).
pub struct ObjectStore {
    sink: super::object_store::ObjectStoreSink,
}

impl ObjectStore {
    pub fn new(
        cfg: &super::object_store::config::ObjectStoreConfig,
    ) -> Result<ObjectStore, String> {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let sink = super::object_store::ObjectStoreSink::new(cfg.clone(), metrics)
            .map_err(|e| e.to_string())?;
        Ok(ObjectStore { sink })
    }

    fn below_prefix(&self, rest: &str) -> String {
        match self.sink.config().prefix.as_deref() {
            Some(p) => format!("{p}/{rest}"),
            None => rest.to_string(),
        }
    }

    fn checkpoint_dir(&self) -> String {
        use super::object_store::config::CUSTODY_NAMESPACE;
        self.below_prefix(&format!("{CUSTODY_NAMESPACE}/checkpoints/"))
    }
}

impl CheckpointStore for ObjectStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        let key = format!(
            "{}{}-{index:020}.json",
            self.checkpoint_dir(),
            crate::text::hex::lower(runner_id.as_bytes())
        );
        // Conditional: an existing checkpoint is never replaced (a store that ignores
        // If-None-Match is refused by `svc test-sink`'s probe; docs/payload-protection.md).
        let headers = [
            ("content-type".to_string(), "application/json".to_string()),
            ("if-none-match".to_string(), "*".to_string()),
        ];
        match self.sink.client().put_object(&key, bytes, &headers) {
            Ok(_) => Ok(()),
            Err(e) if e.is_precondition_failed() => Err(format!(
                "put {key}: a checkpoint exists under that key already; it is never overwritten"
            )),
            Err(e) => Err(format!("put {key}: {e}")),
        }
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        let client = self.sink.client();
        let (mut out, mut total) = (Vec::new(), 0usize);
        for key in client.list_keys(&self.checkpoint_dir(), MAX_AUDIT_CHECKPOINTS)? {
            let text = match client.get_object(&key, MAX_CHECKPOINT_BYTES + 1) {
                Ok(Some(r)) => String::from_utf8(r.body).unwrap_or_default(),
                Ok(None) => continue,
                Err(e) => return Err(format!("get {key}: {e}")),
            };
            checkpoints_bound(&mut total, &text)?;
            out.push((key, text));
        }
        Ok(out)
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.scan(None)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        use super::object_store::config::{CHECK_NAMESPACE, CUSTODY_NAMESPACE};
        let cfg = self.sink.config();
        let client = self.sink.client();
        let root = self.below_prefix("");
        let reserved = [CHECK_NAMESPACE, CUSTODY_NAMESPACE].map(|s| self.below_prefix(s));
        let mut out = Vec::new();
        for key in client.list_keys(&root, MAX_LISTED_OBJECTS)? {
            let sidecar = cfg.metadata_mode == super::object_store::config::MetadataMode::Sidecar
                && key.ends_with(&cfg.sidecar_suffix);
            if sidecar || reserved.iter().any(|r| key.starts_with(r.as_str())) {
                continue;
            }
            let place = crate::text::peer::PeerText::new(&key).to_string();
            match client.get_object(&key, cfg.max_object_bytes) {
                Ok(Some(r)) => match String::from_utf8(r.body) {
                    Ok(text) => {
                        records_of(&place, &text, seal, &mut out);
                        records_bound(out.len())?;
                    }
                    Err(_) => out.push(StoredRecord {
                        place,
                        read: Err("not UTF-8 JSON (compressed?)".into()),
                    }),
                },
                Ok(None) => {}
                Err(e) => out.push(StoredRecord {
                    place,
                    read: Err(format!("cannot read: {e}")),
                }),
            }
        }
        Ok(out)
    }
}

/// Why `custody.checkpoints` cannot be kept with this sink (it has no checkpoint store);
/// `svc validate` and the runner's start refuse it with this reason. A fallback `spool` block
/// beside a sink with a store is kept: the spool's drain tells the checkpoint thread of each
/// record once the sink holds it.
pub fn unavailable(sink: &super::SinkConfig) -> Option<String> {
    match sink {
        super::SinkConfig::File(_)
        | super::SinkConfig::ObjectStore(_)
        | super::SinkConfig::RelationalDb(_) => None,
        // Kept as frames in the spool, put into the target's store by `svc spool drain`.
        super::SinkConfig::Spool(s) => match s.target.as_ref() {
            super::SinkConfig::File(_)
            | super::SinkConfig::ObjectStore(_)
            | super::SinkConfig::RelationalDb(_) => None,
            other => Some(format!(
                "sink type spool keeps its checkpoints in the spool until svc spool drain puts \
                 them into its target's checkpoint store, and its target type {} has none: \
                 a spool sink with checkpoints requires a target that keeps checkpoints (file, \
                 object store, relational)",
                other.kind()
            )),
        },
        other => Some(format!(
            "not available for sink type {}: it has no checkpoint store (file, object store \
             and relational sinks only)",
            other.kind(),
        )),
    }
}

/// The store of a configured sink, or why checkpoints are not available for it.
pub fn store_for(sink: &super::SinkConfig) -> Result<Box<dyn CheckpointStore>, String> {
    use super::relational::config::Engine;
    if let Some(why) = unavailable(sink) {
        return Err(format!("custody.checkpoints: {why}"));
    }
    match sink {
        super::SinkConfig::File(f) => Ok(Box::new(FileStore {
            root: f.directory.clone(),
            file_mode: f.file_mode,
        })),
        super::SinkConfig::RelationalDb(r) if r.engine == Engine::PostgreSql => {
            Ok(Box::new(PgStore::new(r)?))
        }
        super::SinkConfig::RelationalDb(r) => Ok(Box::new(MyStore::new(r)?)),
        super::SinkConfig::ObjectStore(o) => Ok(Box::new(ObjectStore::new(o)?)),
        super::SinkConfig::Spool(_) => Err(
            "custody.checkpoints: the spool sink's store is built on its open spool \
             (checkpoint_spool.rs)"
                .into(),
        ),
        other => Err(format!(
            "custody.checkpoints: not available for sink type {}",
            other.kind()
        )),
    }
}

#[cfg(test)]
#[path = "checkpoint_suffix_tests.rs"]
mod suffix_tests;
