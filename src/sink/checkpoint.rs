//! Custody checkpoints on the sink side: the `svc-checkpoint` thread and where each sink keeps
//! its checkpoints ([`CheckpointStore`]). Format and audit: `message::protection::checkpoint`.
//!
//! The sink workers hand the thread, after a batch is durable, each committed record's
//! (stream sequence, checkpoint digest) and each sequence the runner itself gave up on
//! (dead-lettered, refused) through a bounded channel they never wait on ([`Feed`]): delivery
//! is never held back. The thread writes a signed checkpoint every `every_records` records or
//! `every_seconds` seconds, and what is pending when the workers stop.
//!
//! Crash story: at its start (and after the channel overflowed) the thread reads its own chain
//! back from the store and the store's records of its runner id, and every record that no
//! checkpoint of its chain covers is pending again: records committed before a kill -9 are
//! covered by the first checkpoint after the restart. Until then `svc verify-custody` reports
//! them as present in no checkpoint yet.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};

use crate::document::canonical;
use crate::message::envelope::now_unix_nanos;
use crate::message::protection::checkpoint::{
    self, seal, Body, CheckpointConfig, Signer, TrustedKeys, MAX_CHECKPOINT_BYTES,
};
use crate::message::protection::checkpoint_audit::StoredRecord;
use crate::message::protection::custody::public_digest_stored;
use crate::text::rfc3339::format_rfc3339_nanos;

/// Events the channel holds before the sink workers' sends start failing (then the thread
/// rescans the store instead).
pub const FEED_CAPACITY: usize = 65_536;
/// Largest record file read by a store scan.
pub const MAX_RECORD_FILE_BYTES: u64 = 1 << 30;
/// Directory below the file sink's output directory holding its checkpoints.
pub const FILE_CHECKPOINT_DIR: &str = ".svc-checkpoints";

/// Where one sink keeps its checkpoints, and how its records are read back.
pub trait CheckpointStore: Send {
    /// Stores one checkpoint durably (returns once it is on stable storage).
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String>;
    /// Every stored checkpoint (any runner), as (place, text), bounded.
    fn checkpoints(&self) -> Result<Vec<(String, String)>, String>;
    /// Every stored record, read back as the audit needs it.
    fn records(&self) -> Result<Vec<StoredRecord>, String>;
}

/// What a sink worker tells the thread.
#[derive(Debug, Clone)]
pub enum Event {
    Committed(u64, [u8; 32]),
    Gap(u64, &'static str),
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

/// The `svc-checkpoint` thread's state.
pub struct Writer {
    store: Box<dyn CheckpointStore>,
    signer: Signer,
    runner_id: String,
    sink: String,
    every_records: usize,
    every: Duration,
    rx: Receiver<Event>,
    overflowed: Arc<AtomicBool>,
    /// (index, body digest) of the chain's last checkpoint.
    head: Option<(u64, String)>,
    pending: BTreeMap<u64, [u8; 32]>,
    gaps: BTreeMap<u64, &'static str>,
}

impl Writer {
    pub fn new(
        store: Box<dyn CheckpointStore>,
        cfg: &CheckpointConfig,
        runner_id: &str,
        sink: &str,
    ) -> Result<(Writer, Feed), String> {
        let signer = Signer::load(cfg)?;
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
            runner_id: runner_id.to_string(),
            sink: sink.to_string(),
            every_records: cfg.every_records,
            every: Duration::from_secs(cfg.every_seconds),
            rx,
            overflowed,
            head: None,
            pending: BTreeMap::new(),
            gaps: BTreeMap::new(),
        };
        Ok((w, feed))
    }

    /// Reads the chain back and makes every record of this runner in no checkpoint pending.
    pub fn recover(&mut self) -> Result<(), String> {
        let mut trusted = TrustedKeys::default();
        trusted
            .0
            .insert(self.signer.key_id().to_string(), self.signer.public_key());
        let mut covered = BTreeSet::new();
        let mut head: Option<(u64, String)> = None;
        for (place, text) in self.store.checkpoints()? {
            let Ok(v) = checkpoint::verify(&text, &trusted) else {
                log::warn!(
                    "custody checkpoint {}: not one of this runner's signed checkpoints; ignored",
                    crate::text::peer::PeerText::new(&place)
                );
                continue;
            };
            if v.body.runner_id != self.runner_id {
                continue;
            }
            covered.extend(v.leaves.iter().map(|l| l.0));
            if head.as_ref().is_none_or(|(i, _)| v.body.index > *i) {
                head = Some((v.body.index, v.digest));
            }
        }
        self.head = head;
        let mut found = 0usize;
        for rec in self.store.records()? {
            if let Ok((seq, runner, d)) = rec.read {
                if runner == self.runner_id && !covered.contains(&seq) {
                    found += usize::from(self.pending.insert(seq, d).is_none());
                }
            }
        }
        if found > 0 {
            log::info!("custody checkpoints: {found} committed records in no checkpoint yet");
        }
        Ok(())
    }

    /// The thread: until every sink worker has gone, then once more for what is pending.
    pub fn run(mut self) {
        if let Err(e) = self.recover() {
            log::error!("custody checkpoints: cannot read the chain back: {e}");
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
            if self.pending.len() >= self.every_records || now >= due {
                self.cut();
                due = Instant::now() + self.every;
            }
        }
        self.cut();
    }

    fn take(&mut self, e: Event) {
        match e {
            Event::Committed(seq, d) => {
                self.pending.insert(seq, d);
            }
            Event::Gap(seq, why) => {
                self.gaps.insert(seq, why);
            }
        }
    }

    /// Writes a checkpoint of what is pending (nothing when nothing is).
    fn cut(&mut self) {
        if self.overflowed.swap(false, Ordering::Relaxed) {
            while let Ok(e) = self.rx.try_recv() {
                self.take(e);
            }
            if let Err(e) = self.recover() {
                log::error!("custody checkpoints: rescan after an overflow failed: {e}");
            }
        }
        if self.pending.is_empty() && self.gaps.is_empty() {
            return;
        }
        let leaves: Vec<(u64, [u8; 32])> = self.pending.iter().map(|(s, d)| (*s, *d)).collect();
        let seqs = leaves.iter().map(|l| l.0).chain(self.gaps.keys().copied());
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
            gaps: self.gaps.iter().map(|(s, w)| (*s, w.to_string())).collect(),
            created_at: format_rfc3339_nanos(now_unix_nanos()),
        };
        let bytes = seal(&body, &leaves, &self.signer);
        match self.store.put(&self.runner_id, body.index, &bytes) {
            Ok(()) => {
                self.head = Some((body.index, checkpoint::body_digest(&body.encode())));
                self.pending.clear();
                self.gaps.clear();
            }
            Err(e) => log::error!(
                "custody checkpoint {} not written (kept for the next one): {e}",
                body.index
            ),
        }
    }
}

/// A record file's records: one JSON object, or JSON lines.
fn records_of(place: &str, text: &str, out: &mut Vec<StoredRecord>) {
    let one = |place: String, t: &str| StoredRecord {
        place,
        read: canonical::parse(t)
            .map_err(|e| format!("not a JSON record: {e}"))
            .and_then(|doc| public_digest_stored(&doc)),
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

/// Reads a regular file (never through a link) up to `max` bytes.
fn read_bounded(path: &Path, max: u64) -> Result<String, String> {
    let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    let mut text = String::new();
    fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_string(&mut text))
        .map_err(|e| format!("cannot read: {e}"))?;
    if text.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(text)
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

    fn walk(&self, dir: &Path, depth: usize, out: &mut Vec<StoredRecord>) -> Result<(), String> {
        let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
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
                self.walk(&path, depth + 1, out)?;
            } else if ft.is_file() {
                match read_bounded(&path, MAX_RECORD_FILE_BYTES) {
                    Ok(text) => records_of(&place, &text, out),
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

impl CheckpointStore for FileStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
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
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(self.file_mode)
                .custom_flags(libc_nofollow())
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            // A link, not a rename: an existing checkpoint of that name is never replaced.
            fs::hard_link(&tmp, dir.join(&name))?;
            fs::remove_file(&tmp)?;
            super::file::durable::sync_dir(&dir)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            format!("write {FILE_CHECKPOINT_DIR}/{name}: {e}")
        })
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        let dir = self.dir();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| e.to_string())?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let place = format!("{FILE_CHECKPOINT_DIR}/{name}");
            // An unreadable one is still a checkpoint the audit must count: refused, not gone.
            let text = read_bounded(&entry.path(), MAX_CHECKPOINT_BYTES).unwrap_or_default();
            out.push((place, text));
        }
        out.sort();
        Ok(out)
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        let mut out = Vec::new();
        self.walk(&self.root, 0, &mut out)?;
        Ok(out)
    }
}

/// `O_NOFOLLOW`, so a link planted at the temporary name is refused.
fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
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
        let sql = format!(
            "SELECT runner_id, checkpoint_index::text, left(checkpoint, {MAX_CHECKPOINT_BYTES} + 1) \
             FROM {} ORDER BY runner_id, checkpoint_index",
            self.table()
        );
        let res = self
            .sink
            .with_session("read the checkpoints of", |c| c.query(&sql, &[]))
            .map_err(|e| e.to_string())?;
        Ok(res
            .rows
            .into_iter()
            .map(|r| {
                let mut r = r.into_iter().map(Option::unwrap_or_default);
                let runner = r.next().unwrap_or_default();
                let idx = r.next().unwrap_or_default();
                let place = format!(
                    "{PG_CHECKPOINT_TABLE} row ({}, {idx})",
                    crate::text::peer::PeerText::new(&runner)
                );
                (place, r.next().unwrap_or_default())
            })
            .collect())
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        let mut out = Vec::new();
        for t in self.cfg.tables() {
            let sql = format!("SELECT row_to_json(e)::text FROM {} e", t.sql());
            let res = self
                .sink
                .with_session("read the records of", |c| c.query(&sql, &[]))
                .map_err(|e| e.to_string())?;
            for (i, row) in res.rows.into_iter().enumerate() {
                let text = row.into_iter().next().flatten().unwrap_or_default();
                records_of(&format!("{t} row {}", i + 1), &text, &mut out);
            }
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
        let headers = [("content-type".to_string(), "application/json".to_string())];
        self.sink
            .client()
            .put_object(&key, bytes, &headers)
            .map(|_| ())
            .map_err(|e| format!("put {key}: {e}"))
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        let client = self.sink.client();
        let mut out = Vec::new();
        for key in client.list_keys(&self.checkpoint_dir(), MAX_LISTED_OBJECTS)? {
            let text = match client.get_object(&key, MAX_CHECKPOINT_BYTES + 1) {
                Ok(Some(r)) => String::from_utf8(r.body).unwrap_or_default(),
                Ok(None) => continue,
                Err(e) => return Err(format!("get {key}: {e}")),
            };
            out.push((key, text));
        }
        Ok(out)
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
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
                    Ok(text) => records_of(&place, &text, &mut out),
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

/// The store of a configured sink, or why checkpoints are not available for it.
pub fn store_for(sink: &super::SinkConfig) -> Result<Box<dyn CheckpointStore>, String> {
    use super::relational::config::Engine;
    match sink {
        super::SinkConfig::File(f) => Ok(Box::new(FileStore {
            root: f.directory.clone(),
            file_mode: f.file_mode,
        })),
        super::SinkConfig::RelationalDb(r) if r.engine == Engine::PostgreSql => {
            Ok(Box::new(PgStore::new(r)?))
        }
        super::SinkConfig::ObjectStore(o) => Ok(Box::new(ObjectStore::new(o)?)),
        other => Err(format!(
            "custody.checkpoints: not available for sink type {} yet (file, object store \
             and PostgreSQL sinks only)",
            other.kind()
        )),
    }
}
