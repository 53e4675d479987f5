//! The spool: append-only segments in one locked directory, a durable drain position, and the
//! counts the metrics and `svc spool status` show.
//!
//! Invariant: a record counts as appended only after its segment file was fsynced (and the
//! directory too when the segment is new); a record is behind the drain position only after
//! the sink confirmed it; a segment is removed only once the position is past it, and the
//! removal is fsynced before anything else depends on it.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::config::SpoolConfig;
use super::dir::{self, Position, SpoolError};
use super::scan::{self, Segment};
use super::seal::{Crypt, MetaTrust, Place};
use super::{codec, frame, meta};
use crate::message::envelope::Envelope;
use crate::metrics::{now_epoch_seconds, Metrics};

/// What `append` could not do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendError {
    /// `max_bytes` or `max_records` would be passed: nothing was written.
    Full(String),
    /// The write or its fsync failed (a full disk, an I/O error): nothing counts as written.
    Failed(String),
}

impl std::fmt::Display for AppendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppendError::Full(m) | AppendError::Failed(m) => f.write_str(m),
        }
    }
}

struct State {
    /// Sorted by id; the last one is appended to.
    segments: Vec<Segment>,
    active: Option<File>,
    position: Position,
    records: u64,
    /// Bytes of every segment file, drained parts included (what the disk holds).
    bytes: u64,
    /// Append time (Unix ms) of the oldest record not yet drained, when known.
    oldest_ms: Option<u64>,
    next_id: u64,
    /// The position last made durable, and when.
    persisted: Position,
    persisted_at: Instant,
}

/// Longest time the durable drain position lags behind the drain (each fsync of the position
/// costs about as much as the sink's own batch fsync; measured in benches/spool.rs).
const POSITION_INTERVAL: Duration = Duration::from_millis(200);

/// A spool directory held by this process.
pub struct Spool {
    path: PathBuf,
    dir: OwnedFd,
    _lock: OwnedFd,
    cfg: SpoolConfig,
    state: Mutex<State>,
    appended: Condvar,
    metrics: Arc<Metrics>,
    crypt: Arc<Crypt>,
}

/// The drain's view of where to read next.
pub struct ReadView {
    pub segment: u64,
    pub from: u64,
    pub len: u64,
    /// No more appends will come to this segment.
    pub sealed: bool,
}

/// The meta a spool reads with: encryption began at the latest at the lowest segment that
/// holds a sealed record, whatever the meta file says (one that kept its first sealed segment
/// while segment ids started again must not let a record in clear through a segment written
/// under the key).
fn effective(m: meta::Meta, seals: bool, first_sealed_seen: Option<u64>) -> meta::Meta {
    match first_sealed_seen {
        Some(seen) if seals => meta::Meta {
            first_sealed: m.first_sealed.min(seen),
            ..m
        },
        _ => m,
    }
}

/// Once no segment before the first sealed one is left (the records in clear of a migrated
/// spool have drained), no record in clear is ever read again: the mark goes to 0, so a
/// segment put back below it later (with the position rewritten) is not read in clear.
fn close_clear(m: meta::Meta, seals: bool, segments: &[Segment]) -> meta::Meta {
    let clear_left = segments.iter().any(|s| s.id < m.first_sealed);
    if seals && m.first_sealed != meta::NONE && !clear_left {
        meta::Meta {
            first_sealed: 0,
            ..m
        }
    } else {
        m
    }
}

/// Reads and verifies the meta file (see [`Crypt::verify_meta`]) and binds it for recovery;
/// one not authenticated beside a key is bound as a spool in clear would be, and judged by
/// [`accept_unsigned`] once recovery has counted the records.
fn load_meta(
    dir: &OwnedFd,
    path: &Path,
    crypt: &mut Crypt,
) -> Result<(Option<meta::Stored>, Option<MetaTrust>), SpoolError> {
    let Some(stored) = meta::read(dir, path)? else {
        return Ok((None, None));
    };
    let trust = crypt
        .verify_meta(&stored)
        .map_err(|e| dir::fail(path, meta::NAME, e))?;
    let m = stored.meta();
    crypt.bind(match trust {
        MetaTrust::Unsigned => meta::Meta {
            first_sealed: meta::NONE,
            ..m
        },
        _ => m,
    });
    Ok((Some(stored), Some(trust)))
}

/// A meta file without a tag beside a key (written before meta was authenticated, or by a run
/// without a key) is taken, and rewritten authenticated, only when it can let no record in
/// clear be read that the spool did not write: when the spool holds no record in clear, or no
/// sealed record (a spool written in clear that is now given a key). Records in clear beside
/// sealed ones under such a file are what a rewritten meta plus a planted segment look like:
/// refused, naming the file, the reason and the way on.
fn accept_unsigned(path: &Path, found: &scan::Found) -> Result<(), SpoolError> {
    let (Some((segment, offset)), Some(_)) = (found.first_clear, found.first_sealed_seen) else {
        return Ok(());
    };
    Err(dir::fail(
        path,
        meta::NAME,
        format!(
            "is not authenticated (version 1: written by a version before meta was \
             authenticated, by a run without a key, or by someone who can write the spool \
             directory), and the spool \
             holds {} records stored unencrypted beside records sealed under a key: it cannot \
             tell records this spool wrote in clear from ones put there with a rewritten meta, \
             so none is read and meta is left as it is. Drain the records in clear with the \
             version that wrote them, or restore meta from a backup; records in clear this \
             spool did not write are set aside one by one (the first: segment {segment} offset \
             {offset}; {})",
            found.clear,
            scan::set_aside_hint(segment, offset)
        ),
    ))
}

/// No record tried opens under the meta's spool id (see [`scan::Trial`]): refused before the
/// meta is rewritten and before any record is quarantined for it.
fn foreign_meta(path: &Path, trial: scan::Trial) -> SpoolError {
    dir::fail(
        path,
        meta::NAME,
        format!(
            "names another spool: none of the {} records tried (the first sealed record of \
             each segment) decrypts under its spool id, so it was replaced (by the meta of \
             another spool under the same key, or rewritten) or every segment was copied from \
             another spool; nothing was quarantined and meta is left as it is. Restore this \
             spool's meta (from a backup of the spool directory), or set the foreign records \
             aside with `svc spool set-aside`",
            trial.tried
        ),
    )
}

/// The meta the opened spool reads with, written when it changed, when it was not
/// authenticated under the current key (the old format, or a rotation), or when a spool now
/// without a key had a tag. `next_id` is the segment the next append opens.
fn settle_meta(
    (dir, path): (&OwnedFd, &Path),
    crypt: &Crypt,
    (stored, trust): (Option<&meta::Stored>, Option<MetaTrust>),
    found: &scan::Found,
    next_id: u64,
) -> Result<meta::Meta, SpoolError> {
    let old_meta = stored.map(meta::Stored::meta);
    // Encryption begins at the next append when it was off. A spool with a key and no meta
    // file (removed, or never written) reads no record in clear in any segment it holds: only
    // its meta file says where clear ones may be.
    let begins = match old_meta {
        None => found
            .segments
            .first()
            .map_or(next_id, |s| s.id.min(next_id)),
        Some(_) => next_id,
    };
    let seals = crypt.seals();
    let new_meta = meta::next(old_meta, seals, begins)?;
    let new_meta = effective(new_meta, seals, found.first_sealed_seen);
    let new_meta = close_clear(new_meta, seals, &found.segments);
    let bytes = crypt.meta_bytes(&new_meta);
    if stored.map(meta::Stored::bytes) != Some(bytes.clone()) {
        meta::write(dir, path, &bytes)?;
        if let Some(MetaTrust::Unsigned | MetaTrust::Authentic { current: false }) = trust {
            log::info!(
                "spool {}: meta rewritten, authenticated under the current key",
                path.display()
            );
        }
    }
    Ok(new_meta)
}

impl Spool {
    /// Opens the spool directory (creating it), takes its lock, and recovers: removes
    /// segments the position is past, cuts a torn tail of the last segment, quarantines
    /// damaged records, and counts what is left.
    pub fn open(cfg: &SpoolConfig, metrics: Arc<Metrics>) -> Result<Spool, SpoolError> {
        let path = cfg.dir.clone();
        let mut crypt = Crypt::load(cfg.encryption.as_ref(), cfg.allow_unencrypted)
            .map_err(|e| dir::fail(&path, "open", e))?;
        metrics.gauges.spool_enabled.store(true, Ordering::Relaxed);
        let dir = dir::open_dir(&path, true)?;
        let lock = dir::lock(&dir, &path)?;
        let (stored, trust) = load_meta(&dir, &path, &mut crypt)?;
        let old_meta = stored.as_ref().map(meta::Stored::meta);
        let found = scan::recover(&dir, &path, &metrics, &crypt)?;
        if old_meta.is_none() && found.sealed_v2 > 0 {
            // A new spool id would make every one of them undecryptable (quarantined).
            return Err(dir::fail(
                &path,
                "open",
                format!(
                    "the meta file is missing, but {} records are sealed under this spool's \
                     id, which it held: restore it (from a backup of the spool directory); \
                     nothing was changed",
                    found.sealed_v2
                ),
            ));
        }
        if found.trial.none_opened() {
            return Err(foreign_meta(&path, found.trial));
        }
        if trust == Some(MetaTrust::Unsigned) {
            accept_unsigned(&path, &found)?;
        }
        dir::write_position(&dir, &path, found.position)?;
        let next_id = found
            .segments
            .last()
            .map_or(found.position.segment, |s| s.id + 1)
            .max(1);
        let new_meta = settle_meta(
            (&dir, &path),
            &crypt,
            (stored.as_ref(), trust),
            &found,
            next_id,
        )?;
        crypt.bind(new_meta);
        if crypt.seals() && cfg.allow_unencrypted && new_meta.first_sealed == 0 {
            // Attack finding 3 (issue 47): `meta` is authenticated, not protected from being
            // rolled back; while this is set, an older one put back re-opens reading in clear.
            log::warn!(
                "spool {}: allow_unencrypted is set beside the key, but no record in clear is \
                 left to drain: remove it (while it is set, an older meta put back by someone \
                 who can write the spool directory lets records in clear be read again)",
                path.display()
            );
        }
        let bytes = found.segments.iter().map(|s| s.len).sum();
        let spool = Spool {
            path,
            dir,
            _lock: lock,
            cfg: cfg.clone(),
            state: Mutex::new(State {
                segments: found.segments,
                active: None,
                position: found.position,
                records: found.records,
                bytes,
                oldest_ms: found.oldest_ms,
                next_id,
                persisted: found.position,
                persisted_at: Instant::now(),
            }),
            appended: Condvar::new(),
            metrics,
            crypt: Arc::new(crypt),
        };
        spool.publish(&spool.lock_state());
        Ok(spool)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> &SpoolConfig {
        &self.cfg
    }

    /// The loaded keys (the drain opens records with them).
    pub fn crypt(&self) -> &Arc<Crypt> {
        &self.crypt
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records waiting to be drained.
    pub fn records(&self) -> u64 {
        self.lock_state().records
    }

    /// Appends the envelopes as one batch: all of them durable when `Ok`, none counted when
    /// not. With a key, each record is sealed bound to the segment and offset it lands at, so
    /// the bodies are encoded first and sealed under the lock, where the place is known.
    pub fn append<'a>(
        &self,
        envelopes: impl IntoIterator<Item = &'a Envelope>,
    ) -> Result<(), AppendError> {
        let now_ms = (now_epoch_seconds() * 1000.0) as u64;
        let mut plain = Vec::with_capacity(64 * 1024);
        let mut ends = Vec::new();
        let mut framed = 0usize;
        for env in envelopes {
            let start = plain.len();
            codec::encode(&mut plain, env, now_ms).map_err(AppendError::Failed)?;
            let body = self.crypt.body_len(plain.len() - start);
            if body > frame::MAX_BODY {
                return Err(AppendError::Failed(format!(
                    "spool {}: record of {body} bytes over the frame limit",
                    self.path.display(),
                )));
            }
            framed += frame::FRAME_OVERHEAD + body;
            ends.push(plain.len());
        }
        let n = ends.len() as u64;
        let failed = |e: String| AppendError::Failed(format!("spool {}: {e}", self.path.display()));
        let mut sealer = self.crypt.batch().map_err(failed)?;
        let mut st = self.lock_state();
        if st.bytes + framed as u64 > self.cfg.max_bytes || st.records + n > self.cfg.max_records {
            Metrics::add(&self.metrics.counters.spool_full_refusals_total, n);
            return Err(AppendError::Full(format!(
                "spool {}: full ({} records, {} of {} bytes)",
                self.path.display(),
                st.records,
                st.bytes,
                self.cfg.max_bytes
            )));
        }
        let (segment, base) = self.ensure_segment(&mut st)?;
        let mut buf = Vec::with_capacity(framed);
        let mut start = 0;
        for &end in &ends {
            let rec = &plain[start..end];
            start = end;
            let Some(sealer) = sealer.as_mut() else {
                frame::encode(&mut buf, rec);
                continue;
            };
            let place = Place {
                segment,
                offset: base + buf.len() as u64,
            };
            frame::encode_with(&mut buf, |out| sealer.seal(out, rec, now_ms, place))
                .map_err(failed)?;
        }
        let written = self.write_locked(&mut st, &buf)?;
        st.bytes += written;
        st.records += n;
        if st.oldest_ms.is_none() {
            st.oldest_ms = Some(now_ms);
        }
        Metrics::add(&self.metrics.counters.spool_appended_total, n);
        self.publish(&st);
        drop(st);
        self.appended.notify_all();
        Ok(())
    }

    /// Appends one custody checkpoint frame (`sink.type` = `spool` with checkpoints), durable
    /// as a record append is (fsynced, sealed bound to its place under a key). It counts in
    /// `max_bytes` (refused when past it: the checkpoint thread keeps what it covers for the
    /// next one); it is not held to `max_records`, but counts among the frames waiting to be
    /// drained (`records`, which record appends are held to).
    pub fn append_checkpoint(
        &self,
        (runner_id, index): (&str, u64),
        bytes: &[u8],
    ) -> Result<(), AppendError> {
        let now_ms = (now_epoch_seconds() * 1000.0) as u64;
        let failed = |e: String| AppendError::Failed(format!("spool {}: {e}", self.path.display()));
        let mut plain = Vec::with_capacity(bytes.len() + 64);
        codec::encode_checkpoint(&mut plain, (runner_id, index), bytes, now_ms).map_err(failed)?;
        let body = self.crypt.body_len(plain.len());
        if body > frame::MAX_BODY {
            return Err(failed(format!(
                "checkpoint of {body} bytes over the frame limit"
            )));
        }
        let framed = (frame::FRAME_OVERHEAD + body) as u64;
        let mut sealer = self.crypt.batch().map_err(failed)?;
        let mut st = self.lock_state();
        if st.bytes + framed > self.cfg.max_bytes {
            return Err(AppendError::Full(format!(
                "spool {}: full ({} of {} bytes): checkpoint {index} not appended",
                self.path.display(),
                st.bytes,
                self.cfg.max_bytes
            )));
        }
        let (segment, base) = self.ensure_segment(&mut st)?;
        let mut buf = Vec::with_capacity(framed as usize);
        match sealer.as_mut() {
            None => frame::encode(&mut buf, &plain),
            Some(sealer) => {
                let place = Place {
                    segment,
                    offset: base,
                };
                frame::encode_with(&mut buf, |out| sealer.seal(out, &plain, now_ms, place))
                    .map_err(failed)?;
            }
        }
        let written = self.write_locked(&mut st, &buf)?;
        st.bytes += written;
        st.records += 1;
        if st.oldest_ms.is_none() {
            st.oldest_ms = Some(now_ms);
        }
        self.publish(&st);
        drop(st);
        self.appended.notify_all();
        Ok(())
    }

    /// Makes sure a segment takes the next write (rolling to a new one when the last is full
    /// or none is open); returns its id and the offset the next frame lands at.
    fn ensure_segment(&self, st: &mut State) -> Result<(u64, u64), AppendError> {
        let roll = match (st.segments.last(), &st.active) {
            (Some(last), Some(_)) => last.len >= self.cfg.segment_bytes,
            _ => true,
        };
        if roll {
            let id = st.next_id;
            let name = dir::segment_name(id);
            let file = dir::create_appending(&self.dir, &self.path, &name)
                .map_err(|e| AppendError::Failed(e.to_string()))?;
            st.next_id = id + 1;
            st.segments.push(Segment {
                id,
                len: 0,
                entry_durable: false,
            });
            st.active = Some(file);
        }
        let last = st.segments.last().expect("a segment was just ensured");
        // A segment's first write begins with its header.
        Ok((last.id, last.len.max(frame::HEADER_LEN as u64)))
    }

    /// Writes `frames` at the end of the active segment ([`Spool::ensure_segment`] chose it),
    /// fsyncs, and returns the bytes added to the disk.
    fn write_locked(&self, st: &mut State, frames: &[u8]) -> Result<u64, AppendError> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            AppendError::Failed(format!("spool {}: {what}: {e}", self.path.display()))
        };
        let mut added = 0u64;
        let last = st.segments.last_mut().expect("a segment was just ensured");
        let file = st
            .active
            .as_mut()
            .expect("an active segment was just ensured");
        let mut data = Vec::new();
        let to_write: &[u8] = if last.len == 0 {
            data.extend_from_slice(frame::SEGMENT_MAGIC);
            data.extend_from_slice(frames);
            &data
        } else {
            frames
        };
        let mut result = file
            .write_all(to_write)
            .and_then(|()| file.sync_data())
            .map_err(|e| failed("append", &e));
        if result.is_ok() && !last.entry_durable {
            // The segment's name must be durable before its records count as written: also
            // when its first write failed (a full disk) and a later one is the first to land.
            result = dir::sync(&self.dir, &self.path).map_err(|e| {
                AppendError::Failed(format!(
                    "{e} (after creating {})",
                    dir::segment_name(last.id)
                ))
            });
            last.entry_durable = result.is_ok();
        }
        if let Err(e) = result {
            // Cut what may have reached the file so the next batch starts on a frame
            // boundary (segments are opened O_APPEND: the next write lands at the cut); when
            // even that fails, the next batch begins a new segment and the stray bytes past
            // `len` are never read (recovery quarantines them).
            if file
                .set_len(last.len)
                .and_then(|()| file.sync_data())
                .is_err()
            {
                st.active = None;
            }
            return Err(e);
        }
        last.len += to_write.len() as u64;
        added += to_write.len() as u64;
        Ok(added)
    }

    /// Waits up to `timeout` for records to drain; true when there are some.
    pub fn wait_for_records(&self, timeout: Duration) -> bool {
        let st = self.lock_state();
        if st.records > 0 {
            return true;
        }
        let (st, _) = self
            .appended
            .wait_timeout(st, timeout)
            .unwrap_or_else(|p| p.into_inner());
        st.records > 0
    }

    /// Where the drain reads next: the segment holding the position (or the first after it).
    pub fn read_view(&self) -> Option<ReadView> {
        let st = self.lock_state();
        let idx = st
            .segments
            .iter()
            .position(|s| s.id >= st.position.segment)?;
        let seg = &st.segments[idx];
        let from = if seg.id == st.position.segment {
            st.position.offset
        } else {
            0
        };
        Some(ReadView {
            segment: seg.id,
            from: from.max(frame::HEADER_LEN as u64),
            len: seg.len,
            sealed: idx + 1 < st.segments.len(),
        })
    }

    /// Opens a segment for reading.
    pub fn open_segment(&self, id: u64) -> Result<File, SpoolError> {
        dir::open_file(&self.dir, &self.path, &dir::segment_name(id), false)
    }

    /// Notes the append time of the oldest record left.
    pub fn set_oldest(&self, ms: u64) {
        let mut st = self.lock_state();
        st.oldest_ms = Some(ms);
        self.publish(&st);
    }

    /// Makes `to` the durable drain position after the sink confirmed `delivered` records
    /// before it (and `dropped` were quarantined or rejected), then removes the segments the
    /// position has passed. When the spool is empty, the last segment is removed as well and
    /// the next append begins a new one.
    pub fn commit(&self, to: Position, delivered: u64, dropped: u64) -> Result<(), SpoolError> {
        self.commit_step(to, delivered, dropped, false)
    }

    /// [`Spool::commit`] of a step that kept rejected records: the position is made durable
    /// now, so a crash cannot repeat a step whose rejection is already on disk.
    pub fn commit_rejection(
        &self,
        to: Position,
        delivered: u64,
        dropped: u64,
    ) -> Result<(), SpoolError> {
        self.commit_step(to, delivered, dropped, true)
    }

    fn commit_step(
        &self,
        to: Position,
        delivered: u64,
        dropped: u64,
        durable_now: bool,
    ) -> Result<(), SpoolError> {
        let mut st = self.lock_state();
        let mut to = to;
        // Nothing left on disk past `to`: the spool is empty whatever the count says (a
        // damaged stretch may have held more than the one record it counted for).
        let emptied = st
            .segments
            .last()
            .is_some_and(|s| s.id == to.segment && s.len <= to.offset);
        if emptied {
            to = Position {
                segment: st.next_id,
                offset: 0,
            };
        }
        // The position is fsynced at most every POSITION_INTERVAL, and always before a segment
        // it passed is removed: a crash in between only repeats that much of the drain.
        let passes_segment = st.segments.first().is_some_and(|s| s.id < to.segment);
        if durable_now
            || emptied
            || passes_segment
            || st.persisted_at.elapsed() >= POSITION_INTERVAL
        {
            dir::write_position(&self.dir, &self.path, to)?;
            st.persisted_at = Instant::now();
            st.persisted = to;
        }
        st.position = to;
        // Exact at the end; before it, records remain on disk, so never 0 (the drain would
        // stop and the fallback go direct with records still spooled).
        st.records = if emptied {
            0
        } else {
            st.records.saturating_sub(delivered + dropped).max(1)
        };
        Metrics::add(&self.metrics.counters.spool_drained_total, delivered);
        let mut removed = false;
        while st.segments.first().is_some_and(|s| s.id < to.segment) {
            let seg = st.segments.remove(0);
            if st.segments.is_empty() {
                st.active = None;
            }
            let name = dir::segment_name(seg.id);
            if let Err(e) =
                rustix::fs::unlinkat(&self.dir, name.as_str(), rustix::fs::AtFlags::empty())
            {
                log::warn!(
                    "spool {}: cannot remove drained {name}: {}",
                    self.path.display(),
                    std::io::Error::from(e)
                );
            }
            st.bytes = st.bytes.saturating_sub(seg.len);
            removed = true;
        }
        if removed {
            dir::sync(&self.dir, &self.path)?;
        }
        if st.records == 0 {
            st.oldest_ms = None;
        }
        self.publish(&st);
        Ok(())
    }

    /// Records `text`, a checkpoint of `runner_id` its target now holds, as that runner's
    /// drained head (`super::drained`), durably; called before the position moves past its
    /// frame.
    pub fn record_drained(&self, runner_id: &str, text: &[u8]) -> Result<(), SpoolError> {
        super::drained::write(&self.dir, &self.path, runner_id, text)
    }

    /// The drained head of `runner_id` as (file name, text), if one was recorded.
    pub fn drained_head(&self, runner_id: &str) -> Result<Option<(String, String)>, SpoolError> {
        super::drained::read(&self.dir, &self.path, runner_id)
    }

    /// Makes the drain position durable now (when the drain stops).
    pub fn persist_position(&self) -> Result<(), SpoolError> {
        let mut st = self.lock_state();
        if st.persisted != st.position {
            dir::write_position(&self.dir, &self.path, st.position)?;
            st.persisted = st.position;
            st.persisted_at = Instant::now();
        }
        Ok(())
    }

    /// Keeps damaged bytes in a quarantine file (once: the same bytes already there mean an
    /// earlier pass kept them) and counts them; true when they were found now, so they were
    /// counted among the waiting records and are dropped from them; an error when they could
    /// not be kept (the drain then does not move past them).
    pub fn quarantine(&self, segment: u64, offset: u64, bytes: &[u8]) -> Result<bool, SpoolError> {
        dir::quarantine(&self.dir, &self.path, &self.metrics, segment, offset, bytes)
    }

    /// Keeps one record the sink refused for good (its frame, as in the segment) durably in
    /// `rejected-<segment>-<offset>.spool`, named by the record's own offset, and counts it;
    /// an error when it could not be kept (the drain then does not move past it). A complete
    /// file of the same record, left by a run that crashed before its position moved on,
    /// counts as kept (and is not counted again).
    pub fn reject(&self, segment: u64, offset: u64, frame: &[u8]) -> Result<(), SpoolError> {
        let name = dir::rejected_name(segment, offset);
        if dir::keep(&self.dir, &self.path, &name, frame)?.0 == dir::Kept::New {
            Metrics::add(&self.metrics.counters.spool_rejected_total, 1);
        }
        Ok(())
    }

    /// Publishes the gauges.
    fn publish(&self, st: &State) {
        let g = &self.metrics.gauges;
        g.spool_records.store(st.records, Ordering::Relaxed);
        g.spool_bytes.store(st.bytes, Ordering::Relaxed);
        g.spool_oldest_record_epoch_seconds
            .store(st.oldest_ms.map_or(0, |ms| ms / 1000), Ordering::Relaxed);
    }
}
