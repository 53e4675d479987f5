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
//! target's store by `svc spool drain` (spool.rs in this folder, built on this
//! module): the spool holds only the end of the chain ([`CheckpointStore::holds_suffix`]).
//!
//! Start: before any delivery the runner reads its chain back ([`Writer::start`]) and refuses
//! to run when it cannot be read, does not verify, has a hole, or does not reach the head
//! kept outside the sink ([`self::head`]). A store holding a suffix (the spool) is
//! read with its target's store ([`CheckpointStore::target`]), the whole chain checked; when
//! the target cannot be read, the spool's part alone must link, reach the head and hold or
//! follow the drained head (the last checkpoint the drain put, [`self::drained`]); an empty
//! one goes on from the drained head when it is the head file's, and without a drained head
//! (a spool drained by an older version) an empty one beside a head file stops the start. Crash story: the thread then (and after
//! the channel overflowed) rescans the store's records of its runner id ([`Writer::rescan`]):
//! every record after the chain's covered range that no checkpoint covers and whose custody
//! seal verifies is pending again (with the spool, its target's records too), so records
//! committed before a kill -9 are covered by the first checkpoint after the restart; a record
//! failing its seal is never signed.

mod drained;
mod feed;
mod file_store;
pub mod head;
mod object_store;
pub mod spool;
mod sql_store;
mod writer;

pub use feed::{gap_reason, DrainFeed, Event, Feed, Origin, DEAD_LETTERED, GAP_REASONS};
pub use file_store::FileStore;
pub use object_store::{ObjectStore, MAX_LISTED_OBJECTS};
pub use sql_store::{MyStore, PgStore, PG_CHECKPOINT_TABLE};
pub use writer::Writer;

use std::path::Path;

use crate::document::canonical;
use crate::message::protection::checkpoint_audit::{RecordRead, StoredRecord};
use crate::message::protection::custody::{public_digest_stored, Custodian};
use crate::text::peer::PeerText;

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
    /// For a store holding a suffix: the last checkpoint of `runner_id` its drain put into the
    /// target, as (file name, text) (`sink::spool::drained`), when the store can vouch for it;
    /// `Unvouched` when a file is there that it cannot (a spool that may keep frames in clear:
    /// a checkpoint copied out of such a frame and planted as the drained head verifies;
    /// atk52c finding 3).
    fn drained_head(&self, runner_id: &str) -> Result<drained::DrainedHead, String> {
        let _ = runner_id;
        Ok(drained::DrainedHead::None)
    }
}

/// How a record whose custody seal does not verify reads in a rescan.
pub const SEAL_REFUSED: &str = "custody seal refused";

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

/// A path for an error line, escaped.
fn shown_path(p: &Path) -> String {
    PeerText::new(&p.to_string_lossy()).to_string()
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
             (checkpoint/spool.rs)"
                .into(),
        ),
        other => Err(format!(
            "custody.checkpoints: not available for sink type {}",
            other.kind()
        )),
    }
}
