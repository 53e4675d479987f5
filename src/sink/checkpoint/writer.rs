//! The `svc-checkpoint` thread's state ([`Writer`]): the chain read back and checked at start,
//! the records and gaps pending, a checkpoint cut every `every_records` or `every_seconds`, the
//! rescan after a restart or an overflowed channel.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError};

use super::feed::{Event, Feed, Origin, PutWatch, SignedGaps};
use super::{claimed_runner, shown_path, CheckpointStore, FEED_CAPACITY, SEAL_REFUSED};
use crate::message::envelope::now_unix_nanos;
use crate::message::protection::checkpoint::{self, seal, Body, Signer, TrustedKeys};
use crate::message::protection::custody::{Custodian, CustodyConfig};
use crate::metrics::Metrics;
use crate::text::peer::PeerText;

use super::drained::DrainedHead;
use super::head::{Head, HeadFile, KeptGap, MAX_KEPT_GAPS};
use crate::text::rfc3339::format_rfc3339_nanos;
/// How long a gap listed waits at most for its checkpoint (the `+TERM` of a message given up
/// on without a DLQ waits for it): at most one checkpoint per this long for gaps.
pub const GAP_WAIT: Duration = Duration::from_secs(1);

/// After a cut the store refused, the next try waits this long, whatever is pending: a store
/// that is down is not asked again (and the refusal logged again) on every record.
const RETRY_WAIT: Duration = Duration::from_secs(1);

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
    /// Gaps signed lately, shared with [`Feed::gap_signed`]: a message refused again on a
    /// later delivery is not listed again, and `svc-ack` terminates one only once it is here.
    signed_gaps: Arc<SignedGaps>,
    /// Shared with [`Feed::rescanning`].
    rescanning: Arc<AtomicBool>,
    /// Shared with [`Feed::store_failing`]: the last checkpoint could not be stored.
    failing: Arc<AtomicBool>,
    /// Shared with [`Feed::store_failing`]: the put under way.
    put: Arc<PutWatch>,
    /// Shared with the feed: gaps told while the channel was full.
    spilled: Arc<super::feed::Spilled>,
    /// Shared with [`Feed::end_now`].
    ending: Arc<AtomicBool>,
    /// Counts the gaps a stop could not keep (`checkpoint_gaps_unlisted_total`).
    metrics: Arc<Metrics>,
    /// Gaps the last stop kept beside the head file are pending: the file goes once a cut
    /// stored them ([`Writer::at_stop`]).
    kept_on_file: bool,
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
        metrics: Arc<Metrics>,
    ) -> Result<(Writer, Feed), String> {
        let cfg = &custody.checkpoints;
        let signer = Signer::load(cfg)?;
        let custodian = Custodian::load(custody)?;
        let head_file = HeadFile::new(&cfg.head_file)?;
        let (tx, rx) = bounded(FEED_CAPACITY);
        let overflowed = Arc::new(AtomicBool::new(false));
        let signed_gaps = Arc::new(SignedGaps::default());
        let rescanning = Arc::new(AtomicBool::new(true));
        let failing = Arc::new(AtomicBool::new(false));
        let put = Arc::new(PutWatch::new());
        let spilled = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let ending = Arc::new(AtomicBool::new(false));
        let feed = Feed {
            tx,
            overflowed: overflowed.clone(),
            metrics: Arc::clone(&metrics),
            spilled: Arc::clone(&spilled),
            ending: Arc::clone(&ending),
            signed_gaps: Arc::clone(&signed_gaps),
            rescanning: Arc::clone(&rescanning),
            failing: Arc::clone(&failing),
            put: Arc::clone(&put),
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
            signed_gaps,
            rescanning,
            failing,
            put,
            spilled,
            ending,
            kept_on_file: false,
            metrics,
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
        let mut chain = own_chain(read, &self.trusted(), &self.runner_id, suffix)?;
        let stored = self.head_file.read()?;
        if let Some(e) = &unread {
            self.check_drained(&mut chain, e, stored.as_ref())?;
        }
        if suffix {
            check_suffix_head(&chain, stored.as_ref(), &self.runner_id, &self.head_file)?;
        } else {
            check_head(&chain, stored.as_ref(), &self.runner_id, &self.head_file)?;
        }
        // A first start (for a spool sink with its target down too: a drained head would be
        // in the chain by now, or refused: atk54 finding 3).
        if chain.is_empty() && stored.is_none() {
            self.head_file.write(&Head::none_yet(&self.runner_id))?;
        }
        for v in &chain {
            // The gaps it signed: a gap found again at start (a dead letter read back) is not
            // listed twice.
            let o = origin_of(&v.body);
            self.signed_gaps
                .note(&o, v.body.gaps.iter().map(|g| (g.0, g.1.as_str())));
            // Leaves only: a gap is told at once, also while records below it wait in the
            // fallback spool, so a gap's sequence says nothing of what was stored before it
            // (atk47e finding 1).
            let high = v.leaves.iter().map(|l| l.0).max();
            let to = self.covered_to.entry(origin_of(&v.body)).or_default();
            *to = high.unwrap_or_default().max(*to);
        }
        if let Some(last) = chain.last() {
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
        } else if let Some(h) = stored.filter(|h| suffix && !h.is_none_yet()) {
            // Every checkpoint was drained to the target: the chain goes on from the head file.
            self.head = Some((h.index, h.digest.clone()));
            log::info!(
                "custody checkpoints: no checkpoint left in the spool (drained); the chain goes \
                 on from the head file's head {}",
                PeerText::new(&h.arg())
            );
        }
        self.take_kept_gaps()
    }

    /// The gaps the last stop kept beside the head file ([`Writer::at_stop`]): pending again,
    /// listed by the first cut (one the chain lists already is not listed twice).
    fn take_kept_gaps(&mut self) -> Result<(), String> {
        let kept = self.head_file.read_gaps(&self.runner_id).map_err(|e| {
            format!(
                "{e}; to start without it, move it aside (its gaps are then listed by no \
                 checkpoint: keep it as their record)"
            )
        })?;
        let mut taken = 0;
        for (stream, incarnation, seq, why) in kept.iter() {
            let Some(why) = super::feed::gap_reason(why).filter(|_| *seq > 0) else {
                return Err(format!(
                    "custody checkpoints' kept gaps beside {}: sequence {seq} of stream {} with \
                     reason {}: not a gap this runner lists; to start without it, move it \
                     aside (keep it as the record of its gaps)",
                    PeerText::new(&self.head_file.path.to_string_lossy()),
                    PeerText::new(stream),
                    PeerText::new(why)
                ));
            };
            let origin = (Arc::from(stream.as_str()), Arc::from(incarnation.as_str()));
            taken += usize::from(self.take_gap(origin, *seq, why));
        }
        self.kept_on_file = !kept.is_empty();
        if !kept.is_empty() {
            log::info!(
                "custody checkpoints: {} gaps kept at the last stop, {taken} of them not listed \
                 by the chain yet: listed by the next checkpoint",
                kept.len()
            );
        }
        Ok(())
    }

    /// Removes the gaps kept at the last stop, once a stored checkpoint lists them.
    fn forget_kept_gaps(&mut self) {
        if !std::mem::take(&mut self.kept_on_file) {
            return;
        }
        if let Err(e) = self.head_file.remove_gaps() {
            log::warn!("{e}; its gaps are listed already and are not listed twice");
        }
    }

    /// At the stop, before the last cut: the gaps pending (what waits in the channel taken
    /// first) are kept beside the head file before the put, so a put that outlasts the
    /// stop's clock (a locked table: the process ends under it) loses none of them (atk60);
    /// [`Writer::at_stop`] removes the file once that cut is stored.
    fn before_last_cut(&mut self) {
        self.take_waiting();
        if !self.gaps.is_empty() {
            self.keep_gaps(false);
        }
    }

    /// At the stop, after the last cut: the gaps no stored checkpoint lists (the store failed)
    /// are kept beside the head file for the next start; the records pending are found again
    /// by the next start's rescan (atk56 finding 4: a told, uncut gap was lost). Once
    /// everything is stored, what was kept is removed.
    fn at_stop(&mut self, stored: bool) {
        if stored || self.gaps.is_empty() {
            return self.forget_kept_gaps();
        }
        self.keep_gaps(true);
    }

    /// Writes the gaps pending to `<head_file>.gaps`, at most [`MAX_KEPT_GAPS`]. `failed`: the
    /// last cut could not store them, so what is not kept is listed nowhere (logged, counted).
    fn keep_gaps(&mut self, failed: bool) {
        let mut gaps: Vec<KeptGap> = Vec::new();
        for (o, listed) in &self.gaps {
            for (seq, why) in listed {
                gaps.push((o.0.to_string(), o.1.to_string(), *seq, why.to_string()));
            }
        }
        if gaps.len() > MAX_KEPT_GAPS {
            if failed {
                let lost = &gaps[MAX_KEPT_GAPS..];
                log::error!(
                    "custody checkpoints: {} gaps past the {MAX_KEPT_GAPS} kept at this stop are \
                     listed nowhere (sequences {} to {})",
                    lost.len(),
                    lost[0].2,
                    lost[lost.len() - 1].2
                );
                let unlisted = &self.metrics.counters.checkpoint_gaps_unlisted_total;
                Metrics::add(unlisted, lost.len() as u64);
            }
            gaps.truncate(MAX_KEPT_GAPS);
        }
        let count = gaps.len();
        match self.head_file.write_gaps(&self.runner_id, gaps) {
            Ok(()) => {
                self.kept_on_file = true;
                if failed {
                    log::warn!(
                        "custody checkpoints: the last checkpoint could not be stored; its \
                         {count} gaps are kept beside the head file and listed by the next \
                         start's first checkpoint"
                    );
                }
            }
            Err(e) if !failed => {
                log::warn!("{e}; the stop's last checkpoint is to list its {count} gaps")
            }
            Err(e) => {
                let unlisted = &self.metrics.counters.checkpoint_gaps_unlisted_total;
                Metrics::add(unlisted, count as u64);
                log::error!(
                    "custody checkpoints: the last checkpoint could not be stored, and {e}: \
                     {count} gaps told in this run are listed nowhere (their sequences were \
                     logged when told)"
                );
            }
        }
    }

    /// The target cannot be read (`unread` says why): the spool's `chain` must hold or follow
    /// the drained head (`super::drained`); with no checkpoint left in the spool, the drained
    /// head (verified) becomes the chain read back, checked against the head file as any
    /// suffix. Without a drained head (never drained, or drained by a version before it) the
    /// spool's chain must begin at checkpoint 0, and an empty one beside a head file stops the
    /// start: where the chain ends cannot be checked.
    fn check_drained(
        &self,
        chain: &mut Vec<checkpoint::Verified>,
        unread: &str,
        stored: Option<&Head>,
    ) -> Result<(), String> {
        let recorded = self.store.drained_head(&self.runner_id).map_err(|e| {
            format!("custody checkpoints: the spool's drained head cannot be read: {e}")
        })?;
        let recorded = match recorded {
            DrainedHead::Vouched(r) => r,
            DrainedHead::Unvouched(file)
                if chain.is_empty() && stored.is_none_or(|h| h.is_none_yet()) =>
            {
                // A drain put checkpoints into the target, the spool holds none, and no head
                // file says where the chain ended (a config renamed or moved: the head file
                // is named after it): a start here would sign a second checkpoint 0, a fork
                // (atk53a finding 3).
                return Err(format!(
                    "custody checkpoints: the spool holds no checkpoint of this runner, its \
                     drain put checkpoints into the target ({} is there, though a spool that \
                     may keep frames in clear cannot vouch for it), no head file is found, and \
                     the target's checkpoint store cannot be read ({}): the chain's end cannot \
                     be found, and a chain begun again at checkpoint 0 would fork it; start \
                     again once the target can be read, or with the head file \
                     (custody.checkpoints.head_file)",
                    PeerText::new(&file),
                    PeerText::new(unread)
                ));
            }
            DrainedHead::None | DrainedHead::Unvouched(_) => {
                if chain.is_empty() && stored.is_some_and(Head::may_hold_checkpoint_0) {
                    return Err(first_put_unseen(&self.runner_id, unread));
                }
                // A none-yet head file says nothing was cut (atk53c finding 1).
                let cut = stored.filter(|h| !h.is_none_yet());
                return super::drained::check_without(chain, unread, cut);
            }
        };
        let v = super::drained::check(chain, &recorded, &self.trusted(), &self.runner_id)?;
        if chain.is_empty() {
            log::info!(
                "custody checkpoints: no checkpoint left in the spool (drained); the drain put \
                 checkpoint {} into the target last",
                v.body.index
            );
            chain.push(v);
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
        self.rescanning.store(true, Ordering::Relaxed);
        let done = self.read_back();
        self.rescanning.store(false, Ordering::Relaxed);
        done
    }

    /// [`Writer::rescan`]'s read.
    fn read_back(&mut self) -> Result<(), String> {
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
        if refused > 0 {
            log::error!(
                "custody checkpoints: {refused} records of this runner refused by the rescan \
                 (custody seal does not verify)"
            );
        }
        Ok(())
    }

    /// The thread: until every sink worker has gone, then once more for what is pending. A
    /// checkpoint is cut at `every_records` records and gaps, every `every_seconds`, and
    /// within [`GAP_WAIT`] of a gap listed: `svc-ack` terminates a message given up on without
    /// a DLQ only once a stored checkpoint lists it (sign first, terminate last). After a cut
    /// the store refused, the next waits [`RETRY_WAIT`]. [`Writer::start`] has run before.
    pub fn run(mut self) {
        if let Err(e) = self.rescan() {
            log::error!("custody checkpoints: the rescan of the records failed: {e}");
        }
        let mut due = Instant::now() + self.every;
        // Gaps kept at the last stop are cut within a second, as any gap told.
        let mut gap_due = (!self.gaps.is_empty()).then(|| Instant::now() + GAP_WAIT);
        let mut retry_at: Option<Instant> = None;
        loop {
            // A backlog of `every_records` waits only for the retry after a failed cut, not
            // for the next event or `every_seconds` (none may come: the store back, nothing
            // cut for an hour).
            let next = if self.pending_count >= self.every_records {
                Instant::now()
            } else {
                gap_due.map_or(due, |g| g.min(due))
            };
            let next = retry_at.map_or(next, |r| r.max(next));
            match self
                .rx
                .recv_timeout(next.saturating_duration_since(Instant::now()))
            {
                Ok(e) => {
                    if self.take(e) && gap_due.is_none() {
                        gap_due = Some(Instant::now() + GAP_WAIT);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if self.ending.load(Ordering::SeqCst) {
                break;
            }
            let now = Instant::now();
            let gap_waits = gap_due.is_some_and(|g| now >= g);
            let due_now = self.pending_count >= self.every_records || now >= due || gap_waits;
            if due_now && retry_at.is_none_or(|r| now >= r) {
                let stored = self.cut();
                if stored {
                    self.forget_kept_gaps();
                }
                retry_at = (!stored).then(|| Instant::now() + RETRY_WAIT);
                due = Instant::now() + self.every;
                gap_due = (!self.gaps.is_empty()).then(|| Instant::now() + GAP_WAIT);
            }
        }
        self.before_last_cut();
        let stored = self.cut();
        self.at_stop(stored);
    }

    /// Takes one event; true when it listed a new gap.
    fn take(&mut self, e: Event) -> bool {
        match e {
            Event::Committed(o, seq, d) => {
                if self.pending.entry(o).or_default().insert(seq, d).is_none() {
                    self.pending_count += 1;
                }
                false
            }
            Event::Gap(o, seq, why) => self.take_gap(o, seq, why),
            Event::End => false,
        }
    }

    /// Lists `seq` as a gap (the first reason kept); true when it was not listed yet.
    fn take_gap(&mut self, o: Origin, seq: u64, why: &'static str) -> bool {
        if self.signed_gaps.holds(&o, seq) {
            return false; // a message refused again on a later delivery: listed once
        }
        match self.gaps.entry(o).or_default().entry(seq) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(why);
                self.pending_count += 1;
                true
            }
            std::collections::btree_map::Entry::Occupied(_) => false,
        }
    }

    /// Writes a checkpoint of what is pending (nothing when nothing is), one per origin; false
    /// when the store refused one (it and the origins after it stay pending).
    fn cut(&mut self) -> bool {
        if self.overflowed.swap(false, Ordering::Relaxed) {
            while let Ok(e) = self.rx.try_recv() {
                self.take(e);
            }
            if let Err(e) = self.rescan() {
                log::error!("custody checkpoints: rescan after an overflow failed: {e}");
            }
        }
        for (o, seq, why) in Feed::take_spilled(&self.spilled) {
            self.take_gap(o, seq, why);
        }
        let origins: BTreeSet<Origin> = self
            .pending
            .keys()
            .chain(self.gaps.keys())
            .cloned()
            .collect();
        origins.iter().all(|o| self.cut_backlog(o))
    }

    /// Writes checkpoints of one origin until nothing of it is pending, each of at most
    /// `every_records` entries: a backlog built while the store failed (records committed
    /// meanwhile, a publisher's flood of refusals) is never one checkpoint larger than a
    /// reader takes (atk57 finding 1: 493,051 gaps made one of 25 MB, and no start could read
    /// the chain back). False when one could not be stored (the rest stays pending).
    /// Between two checkpoints the channel is read (what a backlog of thousands of puts
    /// takes is minutes): a gap told meanwhile goes into the next one, first, so a message
    /// held for it is settled then, not after the whole backlog (atk58: refusals held until
    /// the backlog ended filled `max_ack_pending`, and the told-again copies filled the
    /// channel and the spill).
    /// What was pending when the cut began is cut whole; what arrives meanwhile only as far
    /// as it fills those checkpoints (its gaps first), and its gaps always: new records are
    /// left for the next cut, so a steady flow is not cut into checkpoints smaller than
    /// `every_records`.
    fn cut_backlog(&mut self, o: &Origin) -> bool {
        let mut left = self.pending_of(o);
        loop {
            let before = self.pending_of(o);
            if !self.cut_origin(o) {
                return false;
            }
            left = left.saturating_sub(before.saturating_sub(self.pending_of(o)));
            self.take_waiting();
            let more = left > 0 || self.gaps.contains_key(o);
            if !more || self.pending_of(o) == 0 {
                return true;
            }
        }
    }

    /// Records and gaps of `o` pending.
    fn pending_of(&self, o: &Origin) -> usize {
        self.pending.get(o).map_or(0, BTreeMap::len) + self.gaps.get(o).map_or(0, BTreeMap::len)
    }

    /// Takes what waits in the channel now, and the gaps kept aside while it was full.
    fn take_waiting(&mut self) {
        for _ in 0..FEED_CAPACITY {
            match self.rx.try_recv() {
                Ok(e) => {
                    self.take(e);
                }
                Err(_) => break,
            }
        }
        for (o, seq, why) in Feed::take_spilled(&self.spilled) {
            self.take_gap(o, seq, why);
        }
    }

    /// Writes the checkpoint of one origin's pending records and gaps; false when it could
    /// not be stored (they stay pending).
    fn cut_origin(&mut self, o: &Origin) -> bool {
        // At most `every_records` entries, gaps first (a message may wait for its gap; a
        // record never waits for its leaf), each in sequence order.
        let room = self.every_records.max(1);
        let no_gaps = BTreeMap::new();
        let gaps: Vec<(u64, &'static str)> = (self.gaps.get(o).unwrap_or(&no_gaps).iter())
            .take(room)
            .map(|(s, w)| (*s, *w))
            .collect();
        let none = BTreeMap::new();
        let pending = self.pending.get(o).unwrap_or(&none);
        let leaves: Vec<(u64, [u8; 32])> = (pending.iter())
            .take(room - gaps.len())
            .map(|(s, d)| (*s, *d))
            .collect();
        let seqs = leaves.iter().map(|l| l.0).chain(gaps.iter().map(|g| g.0));
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
        if self.head.is_none() {
            // Before checkpoint 0's put, the head file says it may exist (atk54 finding 5).
            if let Err(e) = self
                .head_file
                .write(&Head::first_put_begun(&self.runner_id))
            {
                log::error!("custody checkpoint 0 not written (kept for the next one): {e}");
                self.failing.store(true, Ordering::Relaxed);
                return false;
            }
        }
        self.put.begin();
        if let Err(e) = self.store.put(&self.runner_id, body.index, &bytes) {
            let taken = self.take_stored(o, body.index, &e);
            self.failing.store(!taken, Ordering::Relaxed);
            self.put.end();
            return taken;
        }
        self.failing.store(false, Ordering::Relaxed);
        self.put.end();
        let digest = checkpoint::body_digest(&body.encode());
        let covered: Vec<u64> = leaves.iter().map(|l| l.0).collect();
        self.held(o, &body, digest, &covered);
        true
    }

    /// A checkpoint of origin `o` the store holds (put now, or found there after a failed
    /// put): its head logged (the auditor's copy outside the sink: `svc verify-custody --head
    /// RUNNER:INDEX:DIGEST`) and written to the head file, the records it covers (`covered`)
    /// and the gaps it lists off the pending, its gaps remembered as signed.
    fn held(&mut self, o: &Origin, body: &Body, digest: String, covered: &[u64]) {
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
        let mut gone = 0;
        if let Some(p) = self.pending.get_mut(o) {
            gone += covered.iter().filter(|s| p.remove(s).is_some()).count();
        }
        if let Some(g) = self.gaps.get_mut(o) {
            gone += body
                .gaps
                .iter()
                .filter(|x| g.remove(&x.0).is_some())
                .count();
        }
        self.pending_count -= gone;
        self.pending.retain(|_, p| !p.is_empty());
        self.gaps.retain(|_, g| !g.is_empty());
        self.signed_gaps
            .note(o, body.gaps.iter().map(|g| (g.0, g.1.as_str())));
    }

    /// A put failed (`e`): the store may hold checkpoint `index` all the same (committed, its
    /// answer lost: atk53b finding 2; every later cut of that index was refused as a duplicate,
    /// for the rest of the run). One of this runner's, verified, continuing the chain's head,
    /// of origin `o`, is taken as written: what it covers and lists leaves the pending, and the
    /// rest waits for the next cut. True when so taken.
    fn take_stored(&mut self, o: &Origin, index: u64, e: &str) -> bool {
        let stored = self.store.get(&self.runner_id, index).ok().flatten();
        let taken = stored.and_then(|text| checkpoint::verify(&text, &self.trusted()).ok());
        let head = self.head.as_ref().map(|h| h.1.clone()).unwrap_or_default();
        let Some(v) = taken.filter(|v| {
            v.body.runner_id == self.runner_id
                && v.body.index == index
                && v.body.previous == head
                && origin_of(&v.body) == *o
        }) else {
            log::error!("custody checkpoint {index} not written (kept for the next one): {e}");
            return false;
        };
        log::warn!(
            "custody checkpoint {index}: the store refused it ({e}) but holds this runner's \
             checkpoint {index} continuing the chain (an earlier attempt whose answer was \
             lost): taken as written"
        );
        let covered: Vec<u64> = v.leaves.iter().map(|l| l.0).collect();
        self.held(o, &v.body, v.digest, &covered);
        true
    }
}

/// The start's refusal when the head file says checkpoint 0's put had begun, the spool holds
/// no checkpoint and records no drained head, and the target cannot be read (`unread`):
/// checkpoint 0 may have been put and drained since (a kill -9 inside the first put, then a
/// drain, then its drained-head file removed: atk54 finding 5).
fn first_put_unseen(runner_id: &str, unread: &str) -> String {
    format!(
        "custody checkpoints: the head file says checkpoint 0 of runner {} was being put when \
         the runner last stopped, the spool holds no checkpoint of it and records no drained \
         head it can vouch for, and the target's checkpoint store cannot be read ({}): \
         checkpoint 0 may be in the target already, and another checkpoint 0 would fork the \
         chain; start again once the target can be read",
        PeerText::new(runner_id),
        PeerText::new(unread)
    )
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
    if h.is_none_yet() {
        // Nothing cut, or checkpoint 0 cut before a kill -9 kept it from the file (atk53c
        // finding 2): a suffix from checkpoint 0 of at most that one extends it.
        let from_zero = chain
            .first()
            .is_none_or(|f| f.body.index == 0 && f.body.previous.is_empty());
        if from_zero && chain.len() <= 1 {
            return Ok(());
        }
        return Err(format!(
            "custody checkpoints: the spool's chain of runner {} (checkpoints {} to {}) is not \
             one the head file {} saw: it says no checkpoint was cut yet; audit with svc \
             verify-custody --public-key FILE --head RUNNER:INDEX:DIGEST, then write that head \
             to the file",
            PeerText::new(runner_id),
            chain.first().map_or(0, |v| v.body.index),
            chain.last().map_or(0, |v| v.body.index),
            shown_path(&file.path)
        ));
    }
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
    if h.is_none_yet() {
        // Written at the first start: checkpoint 0 may have been put before a kill -9 kept
        // its head from the file; more than that is a chain the file never saw.
        return match chain.get(1) {
            None => Ok(()),
            Some(_) => Err(format!(
                "custody checkpoints: the sink holds a chain of runner {} up to checkpoint {} \
                 but the head file {shown} says no checkpoint was cut yet: a head file put \
                 back from before the chain cannot be told from a chain cut back. Check the \
                 chain against the head last logged (svc verify-custody --public-key FILE \
                 --head RUNNER:INDEX:DIGEST), then write that head to the file \
                 (docs/payload-protection.md, \"Chain head\")",
                PeerText::new(runner_id),
                chain.last().map_or(0, |v| v.body.index)
            )),
        };
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

#[cfg(test)]
#[path = "suffix_tests.rs"]
mod suffix_tests;
