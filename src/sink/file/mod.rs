//! File sink: envelopes become `svc.file.message.v1` records in a local directory.
//!
//! Two modes (operator reference: `docs/sinks/file.md`):
//! - `per_event` ([`per_event`]): one file per envelope at its deterministic key (the same
//!   key strategies as the object-store sink), exclusive create or atomic replace per
//!   `duplicate_policy`, file and directory fsynced before `Durable` is reported. Exactly one
//!   file per key, whatever the redeliveries.
//! - `jsonl` ([`jsonl`]): each batch appended to a rolling segment with one `write_all` and at
//!   most one fsync; at-least-once (a redelivered message may appear twice; every line carries
//!   `stream` and `stream_sequence` for de-duplication).
//!
//! Layout below `directory`: `[<key_prefix>/][<escaped subject>/]<strategy key><suffix>` for
//! per_event, `[<key_prefix>/]segment-<UTC>-<pid>-<n><suffix>` for jsonl. Names starting with a
//! `.` are never keys or segments (the key escaping guarantees it); they are reserved for
//! temporary (`.svc-tmp-*`) and probe (`.svc-check-*`) files.
//!
//! Errors name the key or segment relative to `directory`, never the payload. I/O failures are
//! transient (redelivery retries them); failures that a retry cannot fix (missing key input,
//! a record over `max_record_bytes`, a name too long, a non-file at the final name, a duplicate
//! under `fail_existing`) are permanent. The pipeline, not the sink, counts writes and errors.

pub mod config;
pub(crate) mod durable;
mod durable_file;
mod existing;
pub mod jsonl;
pub mod per_event;
mod writer_pool;

use flate2::write::GzEncoder;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use config::FileMode;
pub use config::FileSinkConfig;
use durable::{create_all, dir_mode, sync_dir};

use super::layout::DuplicatePolicy;
use super::{FailureClass, Sink, SinkError, WriteOutcome};
use crate::message::envelope::Envelope;
use crate::metrics::Metrics;

fn error(message: impl Into<String>) -> SinkError {
    SinkError::new("file", message)
}

/// Gzips `data` into `out` (cleared first), reusing its allocation.
fn gzip_into(out: &mut Vec<u8>, data: &[u8]) -> io::Result<()> {
    out.clear();
    let mut enc = GzEncoder::new(std::mem::take(out), flate2::Compression::default());
    enc.write_all(data)?;
    *out = enc.finish()?;
    Ok(())
}

/// `max_record_bytes`, applied to the serialized record before compression.
struct WriteLimit {
    max: u64,
}

impl WriteLimit {
    fn of(cfg: &FileSinkConfig) -> WriteLimit {
        WriteLimit {
            max: cfg.max_record_bytes,
        }
    }

    /// `what` names the record in the error (`idempotency-key/...json`, `of stream sequence 7`);
    /// it is only formatted for a record over the limit.
    fn check<W: std::fmt::Display>(
        &self,
        len: usize,
        what: impl FnOnce() -> W,
    ) -> Result<(), WriteOutcome> {
        if len as u64 > self.max {
            return Err(WriteOutcome::Permanent(
                error(format!(
                    "record {} is {len} bytes, over max_record_bytes {}",
                    what(),
                    self.max
                ))
                .classified(FailureClass::TooLarge),
            ));
        }
        Ok(())
    }
}

enum Writer {
    PerEvent(per_event::PerEvent),
    Jsonl(jsonl::Jsonl),
}

pub struct FileSink {
    cfg: FileSinkConfig,
    writer: Writer,
}

impl FileSink {
    /// Creates the output directory (and `key_prefix` below it) when missing, with the parent
    /// of each new directory fsynced. Fails when a non-directory is in the way or creation
    /// fails. Does not probe writability: that is [`Sink::check`].
    pub fn new(cfg: FileSinkConfig, _metrics: Arc<Metrics>) -> Result<FileSink, SinkError> {
        prepare(&cfg)?;
        let writer = match cfg.mode {
            FileMode::PerEvent => Writer::PerEvent(per_event::PerEvent::new(cfg.clone())),
            FileMode::Jsonl => Writer::Jsonl(jsonl::Jsonl::new(cfg.clone())),
        };
        Ok(FileSink { cfg, writer })
    }
}

/// Makes sure `directory` and `directory/key_prefix` are directories; returns the latter.
fn prepare(cfg: &FileSinkConfig) -> Result<PathBuf, SinkError> {
    let mode = dir_mode(cfg.file_mode);
    let make = |dir: &Path| -> Result<(), SinkError> {
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(error(format!(
                "output directory {} exists and is not a directory",
                dir.display()
            ))),
            Err(_) => create_all(dir, mode).map_err(|e| {
                error(format!(
                    "cannot create output directory {}: {e}",
                    dir.display()
                ))
            }),
        }
    };
    make(&cfg.directory)?;
    match &cfg.key_prefix {
        Some(p) => {
            let base = cfg.directory.join(p);
            make(&base)?;
            Ok(base)
        }
        None => Ok(cfg.directory.clone()),
    }
}

/// Creates, fsyncs, (optionally) hard-links and removes a dot-named probe file in `dir`,
/// fsyncing the directory after each change.
fn probe(dir: &Path, link: bool) -> io::Result<()> {
    let stamp = crate::message::envelope::now_unix_nanos();
    let name = dir.join(format!(".svc-check-{}-{stamp}", std::process::id()));
    let linked = dir.join(format!(".svc-check-{}-{stamp}-link", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&name)?;
        f.write_all(b"svc test-sink probe\n")?;
        f.sync_all()?;
        sync_dir(dir)?;
        if link {
            fs::hard_link(&name, &linked).map_err(|e| {
                io::Error::new(e.kind(), format!("hard links are not supported: {e}"))
            })?;
            fs::remove_file(&linked)?;
        }
        fs::remove_file(&name)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&linked);
        let _ = fs::remove_file(&name);
    }
    result
}

impl Sink for FileSink {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        match &self.writer {
            Writer::PerEvent(w) => w.write_batch(batch),
            Writer::Jsonl(w) => w.write_batch(batch),
        }
    }

    fn takes_stored_records(&self) -> bool {
        matches!(self.writer, Writer::Jsonl(_))
    }

    fn write_stored_records(&self, records: &[&[u8]]) -> Vec<WriteOutcome> {
        match &self.writer {
            Writer::Jsonl(w) => w.write_records(records),
            // Each per-event file is named from its envelope: nothing to pass through.
            Writer::PerEvent(_) => {
                let refuse = error("mode per_event takes no encoded records");
                vec![WriteOutcome::Transient(refuse); records.len()]
            }
        }
    }

    fn check(&self) -> Result<String, SinkError> {
        let c = &self.cfg;
        let base = prepare(c)?;
        let link = c.mode == FileMode::PerEvent && c.duplicate_policy != DuplicatePolicy::Replace;
        probe(&base, link).map_err(|e| {
            error(format!(
                "output directory {} is not writable",
                base.display()
            ))
            .caused_by(e)
        })?;
        let details = match c.mode {
            FileMode::PerEvent => format!(
                "mode per_event, key_strategy {}, duplicate_policy {}",
                crate::sink::key::KEY_STRATEGIES
                    .iter()
                    .find(|(_, k)| *k == c.key_strategy)
                    .map_or("?", |(n, _)| n),
                c.duplicate_policy.name()
            ),
            FileMode::Jsonl => format!(
                "mode jsonl, segments up to {} bytes or {} s",
                c.segment_max_bytes, c.segment_max_age_seconds
            ),
        };
        Ok(format!(
            "file sink ready: {} is a writable directory (probe file created, fsynced and \
             removed; {details})",
            base.display()
        ))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};
    use crate::message::record::{encode_record, RECORD_SCHEMA};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    pub struct Scratch(PathBuf);

    impl Scratch {
        pub fn new() -> Scratch {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "svc-filesink-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }

        /// Every non-directory below `sub`, relative to it, sorted (dot files included).
        pub fn files(&self, sub: &str) -> Vec<String> {
            fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
                for e in fs::read_dir(dir).unwrap() {
                    let e = e.unwrap();
                    let p = e.path();
                    if e.file_type().unwrap().is_dir() {
                        walk(root, &p, out);
                    } else {
                        out.push(p.strip_prefix(root).unwrap().display().to_string());
                    }
                }
            }
            let root = self.0.join(sub);
            let mut out = Vec::new();
            walk(&root, &root, &mut out);
            out.sort();
            out
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    pub fn envelope(subject: &str, seq: u64, msg_id: Option<&str>, data: &[u8]) -> Envelope {
        let mut headers = vec![];
        if let Some(m) = msg_id {
            headers.push(("Nats-Msg-Id".to_string(), m.to_string()));
        }
        normalize(
            &RawMessage {
                stream_incarnation: Default::default(),
                subject: subject.into(),
                stream: "ORDERS".into(),
                consumer: "svc".into(),
                stream_sequence: seq,
                consumer_sequence: seq,
                delivery_count: 1,
                published_unix_nanos: Some(1_700_000_000_000_000_000),
                headers,
                data: data.to_vec(),
                unreadable: None,
                header_block: Default::default(),
            },
            1_700_000_001_000_000_000,
            &EnvelopeConfig::default(),
        )
        .0
    }

    pub fn record_of(env: &Envelope) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_record(&mut buf, env).unwrap();
        buf
    }

    pub fn sink(cfg: FileSinkConfig) -> FileSink {
        FileSink::new(cfg, Arc::new(Metrics::default())).unwrap()
    }

    #[test]
    fn record_is_schema_then_the_envelope() {
        let mut e = envelope("orders.created", 42, Some("m-1"), br#"{"a":[1,2]}"#);
        let labels = serde_json::json!({"profile": "svc.security-label.v1", "owner": "ops"});
        e.security_labels = Some(labels.clone());
        e.metadata.security_labels = Some(labels.clone());
        e.classification = "internal".into();
        e.labels_list = vec!["a".into(), "b".into()];
        e.labels = "a;b".into();
        let bytes = record_of(&e);
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(
            text.starts_with(r#"{"schema":"svc.file.message.v1","subject":"orders.created","#),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let mut expected = serde_json::to_value(&e).unwrap();
        expected["schema"] = RECORD_SCHEMA.into();
        assert_eq!(v, expected);
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut want = vec![
            "schema",
            "subject",
            "stream",
            "stream_sequence",
            "consumer",
            "consumer_sequence",
            "message_id",
            "priority",
            "classification",
            "labels",
            "labels_list",
            "payload",
            "payload_info",
            "security_labels",
            "metadata",
        ];
        want.sort();
        assert_eq!(keys, want);
        assert_eq!(v["security_labels"], labels);
        assert_eq!(v["metadata"]["security_labels"], labels);
        assert_eq!(v["metadata"]["schema"], "svc.metadata.v1");
        assert_eq!(v["payload"], serde_json::json!({"a": [1, 2]}));
        assert!(!text.contains('\n'), "one line");
    }

    #[test]
    fn new_creates_the_directory_and_prefix() {
        let s = Scratch::new();
        let mut c = FileSinkConfig::new(s.path().join("a/b/out"));
        c.key_prefix = Some("p/q".into());
        sink(c);
        assert!(s.path().join("a/b/out/p/q").is_dir());
        let mode = |p: &str| {
            use std::os::unix::fs::PermissionsExt;
            fs::metadata(s.path().join(p)).unwrap().permissions().mode() & 0o7777
        };
        assert_eq!(mode("a/b/out/p/q"), 0o750);
        assert_eq!(mode("a"), 0o750);
    }

    #[test]
    fn new_rejects_a_file_in_the_way() {
        let s = Scratch::new();
        fs::write(s.path().join("out"), b"x").unwrap();
        let err = FileSink::new(
            FileSinkConfig::new(s.path().join("out")),
            Arc::new(Metrics::default()),
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            format!(
                "sink file: output directory {}/out exists and is not a directory",
                s.path().display()
            )
        );
        let err = FileSink::new(
            FileSinkConfig::new(s.path().join("out/sub")),
            Arc::new(Metrics::default()),
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            format!(
                "sink file: cannot create output directory {}/out/sub: Not a directory (os \
                 error 20)",
                s.path().display()
            )
        );
    }

    #[test]
    fn check_probes_and_leaves_nothing() {
        let s = Scratch::new();
        let out = s.path().join("out");
        let sink = sink(FileSinkConfig::new(&out));
        let verdict = sink.check().unwrap();
        assert_eq!(
            verdict,
            format!(
                "file sink ready: {} is a writable directory (probe file created, fsynced and \
                 removed; mode per_event, key_strategy idempotency_key, duplicate_policy \
                 skip_existing)",
                out.display()
            )
        );
        assert!(!verdict.contains('\n'));
        assert!(s.files("out").is_empty(), "{:?}", s.files("out"));

        // Removed after start-up: check recreates it (start-up semantics), unlike writes.
        fs::remove_dir(&out).unwrap();
        sink.check().unwrap();
        assert!(out.is_dir());

        let mut c = FileSinkConfig::new(&out);
        c.mode = FileMode::Jsonl;
        c.key_prefix = Some("seg".into());
        let verdict = super::tests::sink(c).check().unwrap();
        assert!(
            verdict.ends_with("mode jsonl, segments up to 67108864 bytes or 300 s)"),
            "{verdict}"
        );
        assert!(
            verdict.contains("/out/seg is a writable directory"),
            "{verdict}"
        );
        assert!(s.files("out").is_empty());
    }

    #[test]
    fn check_fails_clearly() {
        let s = Scratch::new();
        let out = s.path().join("out");
        let sink = sink(FileSinkConfig::new(&out));
        // A file where the directory should be.
        fs::remove_dir(&out).unwrap();
        fs::write(&out, b"x").unwrap();
        assert_eq!(
            sink.check().unwrap_err().to_string(),
            format!(
                "sink file: output directory {} exists and is not a directory",
                out.display()
            )
        );
        // A directory that cannot be created (its parent is a regular file; tests run as
        // root, where permission bits would not stop the write).
        let under_file = sink_unchecked(FileSinkConfig::new(out.join("sub")));
        assert_eq!(
            under_file.check().unwrap_err().to_string(),
            format!(
                "sink file: cannot create output directory {}/sub: Not a directory (os error \
                 20)",
                out.display()
            )
        );
    }

    /// A sink built on a good directory whose config is then pointed elsewhere, to test
    /// `check` on destinations that `new` would already refuse.
    fn sink_unchecked(cfg: FileSinkConfig) -> FileSink {
        let s = Scratch::new();
        let mut built = sink(FileSinkConfig::new(s.path()));
        built.cfg = cfg;
        built
    }
}
