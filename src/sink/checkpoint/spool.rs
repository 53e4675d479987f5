//! Custody checkpoints with `sink.type: spool` (an edge site with no downstream): the
//! checkpoints are kept as CHECKPOINT frames in the spool ([`SpoolStore`]), beside the
//! records they cover and after them, and `svc spool drain` puts each into the target's
//! checkpoint store once the records before it are delivered (`sink::spool::drain`).
//!
//! A checkpoint frame is told from a record by its first byte, which the runner writes and a
//! publisher never chooses (`spool::codec::FLAG_CHECKPOINT`; sealed,
//! `spool::seal::FLAG_SEALED_CHECKPOINT`, covered by the associated data and checked against
//! the opened body's kind). The spool holds only the end of the chain (what is not drained
//! yet): the runner's start takes a suffix that links and reaches the head file
//! ([`super::CheckpointStore::holds_suffix`]).
//!
//! `svc verify-custody` over a spool sink reads the union ([`UnionStore`]): the spool first,
//! then the target. The drain moves records before their checkpoint, and a frame leaves the
//! spool only after the target holds it, so whatever the read of the spool missed (drained
//! meanwhile) the later read of the target holds: an untouched system verifies complete at
//! any point of a drain.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{records_of, CheckpointStore, MAX_AUDIT_CHECKPOINTS, MAX_AUDIT_RECORDS};
use crate::message::protection::checkpoint::MAX_CHECKPOINT_BYTES;
use crate::message::protection::checkpoint_audit::StoredRecord;
use crate::message::protection::custody::Custodian;
use crate::sink::spool::scan::{self, Seen};
use crate::sink::spool::seal::{Crypt, Opened, Opener};
use crate::sink::spool::{codec, Spool, SpoolConfig, SpoolSinkConfig};
use crate::text::peer::PeerText;

/// The spool as a checkpoint store: the runner's (appends through its open spool) or a
/// reader's (`svc verify-custody`: reads only, without the lock).
pub struct SpoolStore {
    spool: Option<Arc<Spool>>,
    cfg: SpoolConfig,
    /// The runner's: the target's checkpoint store, read by the start (the chain drained
    /// already) and the rescan (records drained before their checkpoint was cut).
    target: Option<Box<dyn CheckpointStore>>,
}

/// What one read of the spool found: checkpoints as (place, text), and records.
type Read = (Vec<(String, String)>, Vec<StoredRecord>);

/// One read of the spool: [`Read`], and why each checkpoint frame waiting in a segment (its
/// first byte says custody checkpoint) could not be opened.
struct Frames {
    checkpoints: Vec<(String, String)>,
    records: Vec<StoredRecord>,
    unopened: Vec<String>,
}

impl SpoolStore {
    /// The runner's store, on the spool its sink appends to.
    pub fn new(spool: Arc<Spool>) -> SpoolStore {
        let cfg = spool.config().clone();
        SpoolStore {
            spool: Some(spool),
            cfg,
            target: None,
        }
    }

    /// The same, with the target's checkpoint store beside it
    /// ([`CheckpointStore::target`]).
    pub fn with_target(mut self, target: Box<dyn CheckpointStore>) -> SpoolStore {
        self.target = Some(target);
        self
    }

    /// A store that only reads the spool of `cfg` (no lock: a runner may append beside it).
    pub fn reader(cfg: &SpoolConfig) -> SpoolStore {
        SpoolStore {
            spool: None,
            cfg: cfg.clone(),
            target: None,
        }
    }

    fn crypt(&self) -> Result<Arc<Crypt>, String> {
        if let Some(s) = &self.spool {
            return Ok(s.crypt().clone());
        }
        use crate::sink::spool::{dir, meta};
        let path = &self.cfg.dir;
        let mut crypt = Crypt::load(self.cfg.encryption.as_ref(), self.cfg.allow_unencrypted)
            .map_err(|e| format!("spool {}: {e}", path.display()))?;
        let fd = dir::open_dir(path, false).map_err(|e| e.to_string())?;
        let stored = meta::read(&fd, path).map_err(|e| e.to_string())?;
        crypt
            .bind_stored(stored.as_ref())
            .map_err(|e| dir::fail(path, meta::NAME, e).to_string())?;
        Ok(Arc::new(crypt))
    }

    /// Every frame waiting to be drained (and every record kept in a rejected file), opened:
    /// checkpoint frames as checkpoints, records as the audit reads them (`seal`: checked
    /// against their custody seal, for the runner's rescan). Bounded as the other stores.
    /// Without `records`, only checkpoint frames are opened: a frame's first byte says its
    /// kind, written by the runner and bound by the seal (a record never opens as a
    /// checkpoint), so the runner's start reads the chain without decrypting and parsing every
    /// spooled record (atk51b's figure: 10.35 s against 0.55 s for 100,000 of them).
    fn read(&self, seal: Option<&Custodian>, records_too: bool) -> Result<Frames, String> {
        let mut opener = Opener::new(self.crypt()?);
        let (mut checkpoints, mut records, mut unopened) = (Vec::new(), Vec::new(), Vec::new());
        let (mut text_bytes, mut opened) = (0usize, Vec::new());
        let mut failed: Option<String> = None;
        scan::walk(&self.cfg.dir, |seen: Seen<'_>| {
            let place = match seen.rejected_in {
                Some(f) => format!("spool {} offset {}", PeerText::new(f), seen.offset),
                None => format!("spool segment {} offset {}", seen.segment, seen.offset),
            };
            let checkpoint_frame = seen.rejected_in.is_none()
                && crate::sink::spool::seal::is_checkpoint_frame(seen.body);
            if !records_too && !checkpoint_frame {
                return true;
            }
            opened.clear();
            let plain = match opener.open(seen.place, seen.body, &mut opened) {
                Ok(Opened::Clear) => seen.body,
                Ok(Opened::Sealed(r)) => &opened[r],
                Err(e) => {
                    if checkpoint_frame {
                        // Never taken for drained: the runner's start stops on it.
                        unopened.push(format!(
                            "the custody checkpoint frame at {place} cannot be opened ({e}): \
                             the chain cannot be read back; configure the key it needs, or set \
                             it aside (svc spool set-aside) and audit the chain with svc \
                             verify-custody --public-key FILE --head"
                        ));
                    }
                    records.push(StoredRecord {
                        place,
                        read: Err(format!("cannot be opened: {e}")),
                    });
                    return records.len() <= MAX_AUDIT_RECORDS;
                }
            };
            if codec::is_checkpoint(plain) {
                match codec::decode_checkpoint(plain) {
                    Ok(c) if c.bytes.len() as u64 <= MAX_CHECKPOINT_BYTES => {
                        let text = String::from_utf8_lossy(c.bytes).into_owned();
                        text_bytes += text.len();
                        checkpoints.push((place, text));
                    }
                    // Still a checkpoint the audit must count: refused, not gone.
                    _ => checkpoints.push((place, String::new())),
                }
            } else {
                match codec::file_record(plain).map(std::str::from_utf8) {
                    Ok(Ok(text)) => records_of(&place, text, seal, &mut records),
                    _ => records.push(StoredRecord {
                        place,
                        read: Err("not a readable record".into()),
                    }),
                }
            }
            let past = checkpoints.len() > MAX_AUDIT_CHECKPOINTS
                || text_bytes > super::MAX_AUDIT_CHECKPOINT_BYTES
                || records.len() > MAX_AUDIT_RECORDS;
            if past {
                failed = Some("the spool holds more than the read-back bounds".into());
            }
            !past
        })
        .map_err(|e| e.to_string())?;
        match failed {
            Some(e) => Err(e),
            None => Ok(Frames {
                checkpoints,
                records,
                unopened,
            }),
        }
    }
}

/// A fallback spool with custody checkpoints on: an error when it holds a custody checkpoint
/// frame waiting to be drained (an edge spool handed to this configuration; this runner's own
/// fallback spool never holds one). The start reads the sink's store only, so a chain begun
/// under the same runner id would fork the one those frames continue, and this runner's drain
/// would put them under the same names (atk51b finding 1). Told by the frame's first byte,
/// nothing opened; the scan stops at the first one.
pub fn refuse_handed_frames(spool: &Spool) -> Result<(), String> {
    let mut found: Option<(u64, u64)> = None;
    scan::walk(spool.path(), |seen: Seen<'_>| {
        if seen.rejected_in.is_none() && crate::sink::spool::seal::is_checkpoint_frame(seen.body) {
            found = Some((seen.segment, seen.offset));
        }
        found.is_none()
    })
    .map_err(|e| format!("custody checkpoints: the fallback spool cannot be read: {e}"))?;
    match found {
        None => Ok(()),
        Some((segment, offset)) => Err(format!(
            "custody checkpoints: the fallback spool {} holds custody checkpoint frames (the \
             first at segment {segment} offset {offset}: an edge spool handed to this \
             configuration), which this start does not read: a chain begun here would fork \
             theirs. Put them into the sink's checkpoint store first with svc spool drain \
             <config_file> (the runner stopped), then start again",
            spool.path().display()
        )),
    }
}

impl CheckpointStore for SpoolStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        let Some(spool) = &self.spool else {
            return Err("the spool is only read here".into());
        };
        spool
            .append_checkpoint((runner_id, index), bytes)
            .map_err(|e| e.to_string())
    }

    /// The spool's checkpoints; an error when a checkpoint frame waiting in a segment does not
    /// open (a key id no longer configured, another spool's frame, damage): the chain's end
    /// is not known, and such a frame is never taken for drained.
    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        let read = self.read(None, false)?;
        match read.unopened.first() {
            Some(e) if read.unopened.len() > 1 => Err(format!(
                "{e} (and {} more checkpoint frames that cannot be opened)",
                read.unopened.len() - 1
            )),
            Some(e) => Err(e.clone()),
            None => Ok(read.checkpoints),
        }
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.read(None, true).map(|r| r.records)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        self.read(seal, true).map(|r| r.records)
    }

    fn holds_suffix(&self) -> bool {
        true
    }

    fn target(&self) -> Option<&dyn CheckpointStore> {
        self.target.as_deref()
    }

    fn drained_head(&self, runner_id: &str) -> Result<super::drained::DrainedHead, String> {
        use super::drained::DrainedHead;
        use crate::sink::spool::{dir, drained};
        let read = match &self.spool {
            Some(s) => s.drained_head(runner_id),
            None => dir::open_dir(&self.cfg.dir, false)
                .and_then(|fd| drained::read(&fd, &self.cfg.dir, runner_id)),
        };
        let shown = |name: String| {
            let path = self.cfg.dir.join(name);
            PeerText::new(&path.to_string_lossy()).to_string()
        };
        let read = read.map_err(|e| e.to_string())?;
        Ok(match read {
            None => DrainedHead::None,
            // Frames in clear can be read by whoever can read the directory: a genuine
            // checkpoint not yet drained, copied out of its frame (the frame then damaged),
            // would pass for one the drain put (atk52c finding 3). Only a sealed spool's
            // drained head counts; a clear one's still says that a drain happened.
            Some((name, _)) if self.cfg.allow_unencrypted => DrainedHead::Unvouched(shown(name)),
            Some((name, text)) => DrainedHead::Vouched((shown(name), text)),
        })
    }
}

/// `svc verify-custody` over a spool sink: the spool's frames and the target's store as one.
/// A record in both (delivered, its segment not yet removed) counts once when it is the same
/// (stream, incarnation, sequence, digest); another digest for the same sequence stays, and
/// the audit names it ALTERED. A checkpoint in both (put, the position not yet moved) counts
/// once when its text is the same.
pub struct UnionStore {
    spool: SpoolStore,
    target: Box<dyn CheckpointStore>,
}

impl UnionStore {
    /// The union for a spool sink's config; an error when the target's store cannot be built
    /// (then no partial verdict is given).
    pub fn new(cfg: &SpoolSinkConfig) -> Result<UnionStore, String> {
        let target =
            super::store_for(&cfg.target).map_err(|e| format!("the spool's target: {e}"))?;
        Ok(UnionStore {
            spool: SpoolStore::reader(&cfg.spool),
            target,
        })
    }

    /// Checkpoints and records of both, the spool read first (see the module comment).
    pub fn read(&self) -> Result<Read, String> {
        let read = self.spool.read(None, true)?;
        let (mut checkpoints, mut records) = (read.checkpoints, read.records);
        let target_checkpoints = self
            .target
            .checkpoints()
            .map_err(|e| format!("the spool's target cannot be read: {e}"))?;
        let target_records = self
            .target
            .records()
            .map_err(|e| format!("the spool's target cannot be read: {e}"))?;
        let seen: BTreeSet<String> = target_checkpoints.iter().map(|c| c.1.clone()).collect();
        checkpoints.retain(|c| c.1.is_empty() || !seen.contains(&c.1));
        checkpoints.extend(target_checkpoints);
        let key = |r: &StoredRecord| {
            r.read.as_ref().ok().map(|r| {
                (
                    r.stream.clone(),
                    r.incarnation.clone(),
                    r.sequence,
                    r.digest,
                )
            })
        };
        let held: BTreeSet<_> = target_records.iter().filter_map(key).collect();
        records.retain(|r| key(r).is_none_or(|k| !held.contains(&k)));
        records.extend(target_records);
        Ok((checkpoints, records))
    }
}
