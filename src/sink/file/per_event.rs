//! `mode` = `per_event`: one file per envelope at its deterministic key.
//!
//! Every write goes through a temporary file in the final directory (`.svc-tmp-<pid>-<n>`, a
//! dot name no key can take): write, set the mode, fsync, then publish the name atomically:
//!
//! - `skip_existing` / `fail_existing`: `link(tmp, final)`. `link` fails with `EEXIST` when the
//!   final name exists, so creation is exclusive with no check-then-write race, and the final
//!   name only ever appears with complete, fsynced content.
//! - `replace`: `rename(tmp, final)`, which atomically replaces an existing file.
//!
//! The temporary name is then removed and, once per batch, every directory whose entries
//! changed (plus the parent of every directory created) is fsynced before any outcome is
//! reported. A crash at any point leaves either no final file or a complete one; at worst a
//! dot-named temporary file remains (safe to delete, see `docs/sinks/file.md`).
//!
//! Concurrency: no lock. Sink workers share only the temp-name counter; racing writers of one
//! key are arbitrated by the file system's `link`. Within one batch, files are written by up to
//! `write_concurrency` scoped threads (`svc-file-N`, living for that batch only), because the
//! fsync of a new file costs a journal commit and concurrent fsyncs share commits; outcomes
//! keep the batch order. The directories are synced once, after all files of the batch.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use flate2::write::GzEncoder;

use super::config::{Compression, DuplicatePolicy, FileSinkConfig};
use super::durable::{create_below, dir_mode, DirSync};
use super::{encode_record, error, WriteLimit};
use crate::message::envelope::Envelope;
use crate::sink::key::{safe_component, strategy_key};
use crate::sink::{FailureClass, WriteOutcome};

/// Longest file or directory name most Linux file systems accept.
pub const NAME_MAX: usize = 255;

pub struct PerEvent {
    cfg: FileSinkConfig,
    /// Prefix of every relative key: `<key_prefix>/` or empty.
    prefix: String,
    dir_mode: u32,
    limit: WriteLimit,
    temp_counter: AtomicU64,
}

/// Where one envelope's record goes.
struct Target {
    /// Path relative to the output directory (used in errors and logs).
    rel: String,
    path: PathBuf,
}

/// Result of writing one envelope before its directory is synced.
enum Written {
    /// Outcome is final (a failure).
    Done(WriteOutcome),
    /// Durable or already durable once `dirs` are synced.
    Pending(WriteOutcome, PathBuf, Vec<PathBuf>),
}

impl PerEvent {
    pub fn new(cfg: FileSinkConfig) -> PerEvent {
        let prefix = cfg
            .key_prefix
            .as_deref()
            .map(|p| format!("{p}/"))
            .unwrap_or_default();
        PerEvent {
            dir_mode: dir_mode(cfg.file_mode),
            limit: WriteLimit::of(&cfg),
            prefix,
            cfg,
            temp_counter: AtomicU64::new(0),
        }
    }

    pub fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        let written = self.write_files(batch);
        let mut dirs = DirSync::default();
        let mut outcomes = Vec::with_capacity(batch.len());
        for (i, w) in written.into_iter().enumerate() {
            match w {
                Written::Done(o) => outcomes.push(o),
                Written::Pending(o, dir, created_parents) => {
                    dirs.need(i, &dir);
                    for p in &created_parents {
                        dirs.need(i, p);
                    }
                    outcomes.push(o);
                }
            }
        }
        for (i, dir, e) in dirs.sync() {
            if outcomes[i].is_durable() {
                let rel = self.relative(&dir);
                outcomes[i] = WriteOutcome::Transient(error(format!("sync directory {rel}: {e}")));
            }
        }
        outcomes
    }

    /// Writes the files of a batch, in order, on up to `write_concurrency` threads: concurrent
    /// fsyncs share journal commits, so throughput grows with them on ext4 and xfs.
    fn write_files(&self, batch: &[Envelope]) -> Vec<Written> {
        let threads = self.cfg.write_concurrency.min(batch.len());
        if threads <= 1 {
            return self.write_chunk(batch);
        }
        let chunk = batch.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .chunks(chunk)
                .enumerate()
                .map(|(n, part)| {
                    let handle = std::thread::Builder::new()
                        .name(format!("svc-file-{n}"))
                        .spawn_scoped(scope, move || self.write_chunk(part));
                    (part, handle)
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|(part, handle)| match handle {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        let e = error("file writer thread panicked");
                        part.iter()
                            .map(|_| Written::Done(WriteOutcome::Transient(e.clone())))
                            .collect()
                    }),
                    // No thread available (resource limits): write this part here instead.
                    Err(_) => self.write_chunk(part),
                })
                .collect()
        })
    }

    fn write_chunk(&self, part: &[Envelope]) -> Vec<Written> {
        let mut record = Vec::new();
        let mut gz = Vec::new();
        part.iter()
            .map(|env| self.write_one(env, &mut record, &mut gz))
            .collect()
    }

    /// The key of an envelope relative to the output directory.
    fn target(&self, env: &Envelope) -> Result<Target, WriteOutcome> {
        let key = strategy_key(env, self.cfg.key_strategy, &self.cfg.file_suffix)
            .map_err(|e| WriteOutcome::Permanent(error(e).classified(FailureClass::InvalidKey)))?;
        let rel = if self.cfg.per_subject_directories {
            format!("{}{}/{key}", self.prefix, safe_component(&env.subject))
        } else {
            format!("{}{key}", self.prefix)
        };
        // The temporary name is short and fixed-size, so only the final names can be too long.
        if rel.split('/').any(|c| c.len() > NAME_MAX) {
            return Err(WriteOutcome::Permanent(
                error(format!(
                    "key {rel} has a path component longer than {NAME_MAX} bytes"
                ))
                .classified(FailureClass::InvalidKey),
            ));
        }
        let path = self.cfg.directory.join(&rel);
        Ok(Target { rel, path })
    }

    fn write_one(&self, env: &Envelope, record: &mut Vec<u8>, gz: &mut Vec<u8>) -> Written {
        let target = match self.target(env) {
            Ok(t) => t,
            Err(o) => return Written::Done(o),
        };
        record.clear();
        if let Err(e) = encode_record(record, env) {
            return Written::Done(WriteOutcome::Permanent(
                error(format!("encode {}: {e}", target.rel)).classified(FailureClass::EncodeFailed),
            ));
        }
        if let Err(o) = self.limit.check(record.len(), &target.rel) {
            return Written::Done(o);
        }
        let body: &[u8] = match self.cfg.compression {
            Compression::None => record,
            Compression::Gzip => match gzip_into(gz, record) {
                Ok(()) => gz,
                Err(e) => {
                    return Written::Done(WriteOutcome::Transient(error(format!(
                        "compress {}: {e}",
                        target.rel
                    ))))
                }
            },
        };
        let dir = target
            .path
            .parent()
            .expect("a key always has a file name below the output directory")
            .to_path_buf();
        let mut created_parents = Vec::new();
        let temp = dir.join(format!(
            ".svc-tmp-{}-{}",
            std::process::id(),
            self.temp_counter.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(e) = self.write_temp(&temp, &dir, body, &mut created_parents) {
            let _ = fs::remove_file(&temp);
            return Written::Done(WriteOutcome::Transient(error(format!(
                "write {}: {e}",
                target.rel
            ))));
        }
        let outcome = self.publish(&temp, &target);
        // Whatever happened, the temporary name must go; its removal is made durable by the
        // directory sync below (or is harmless if lost in a crash: it is a dot name).
        let _ = fs::remove_file(&temp);
        match outcome {
            o @ (WriteOutcome::Durable | WriteOutcome::AlreadyDurable) => {
                Written::Pending(o, dir, created_parents)
            }
            o => Written::Done(o),
        }
    }

    /// Creates the temporary file (and missing directories), writes and fsyncs it.
    fn write_temp(
        &self,
        temp: &Path,
        dir: &Path,
        body: &[u8],
        created_parents: &mut Vec<PathBuf>,
    ) -> io::Result<()> {
        let open = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(self.cfg.file_mode)
                .open(temp)
        };
        let mut f: File = match open() {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_below(&self.cfg.directory, dir, self.dir_mode, created_parents)?;
                open()?
            }
            Err(e) => return Err(e),
        };
        // fchmod is not subject to the umask, so the configured mode is exact.
        f.set_permissions(Permissions::from_mode(self.cfg.file_mode))?;
        f.write_all(body)?;
        f.sync_all()
    }

    /// Gives the temporary file its final name according to the duplicate policy.
    fn publish(&self, temp: &Path, target: &Target) -> WriteOutcome {
        let rel = &target.rel;
        let result = match self.cfg.duplicate_policy {
            DuplicatePolicy::Replace => fs::rename(temp, &target.path),
            DuplicatePolicy::SkipExisting | DuplicatePolicy::FailExisting => {
                fs::hard_link(temp, &target.path)
            }
        };
        match result {
            Ok(()) => WriteOutcome::Durable,
            Err(e) => match fs::symlink_metadata(&target.path) {
                Ok(m) if !m.file_type().is_file() => WriteOutcome::Permanent(
                    error(format!("{rel} exists and is not a regular file"))
                        .classified(FailureClass::DestinationConflict),
                ),
                Ok(_) if e.kind() == io::ErrorKind::AlreadyExists => {
                    match self.cfg.duplicate_policy {
                        DuplicatePolicy::FailExisting => WriteOutcome::Permanent(
                            error(format!(
                                "{rel} already exists (duplicate_policy fail_existing)"
                            ))
                            .classified(FailureClass::DuplicateExists),
                        ),
                        // An earlier delivery (or a racing worker) wrote it; the directory sync
                        // of this batch makes sure its name is durable before we say so.
                        _ => WriteOutcome::AlreadyDurable,
                    }
                }
                _ => WriteOutcome::Transient(error(format!("write {rel}: {e}"))),
            },
        }
    }

    /// A directory below the output directory, as shown in errors.
    fn relative(&self, dir: &Path) -> String {
        match dir.strip_prefix(&self.cfg.directory) {
            Ok(r) if r.as_os_str().is_empty() => ".".into(),
            Ok(r) => r.display().to_string(),
            Err(_) => "output directory".into(),
        }
    }
}

/// Gzips `data` into `out` (cleared first), reusing its allocation.
pub fn gzip_into(out: &mut Vec<u8>, data: &[u8]) -> io::Result<()> {
    out.clear();
    let mut enc = GzEncoder::new(std::mem::take(out), flate2::Compression::default());
    enc.write_all(data)?;
    *out = enc.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::file::tests::{envelope, record_of, sink, Scratch};
    use crate::sink::key::KeyStrategy;
    use crate::sink::{Sink, WriteOutcome};
    use std::io::Read;
    use std::sync::{Arc, Barrier};

    fn cfg(s: &Scratch) -> FileSinkConfig {
        FileSinkConfig::new(s.path().join("out"))
    }

    fn files(s: &Scratch) -> Vec<String> {
        s.files("out")
    }

    fn permanent(o: &WriteOutcome) -> String {
        match o {
            WriteOutcome::Permanent(e) => e.to_string(),
            other => panic!("expected permanent, got {other:?}"),
        }
    }

    fn transient(o: &WriteOutcome) -> String {
        match o {
            WriteOutcome::Transient(e) => e.to_string(),
            other => panic!("expected transient, got {other:?}"),
        }
    }

    #[test]
    fn each_key_strategy_lands_at_its_key() {
        let s = Scratch::new();
        let e = envelope("orders.created", 42, Some("id/1"), br#"{"n":1}"#);
        let digest = e.payload_info.sha256.clone();
        for (strategy, expected) in [
            (
                KeyStrategy::IdempotencyKey,
                "idempotency-key/s-ORDERS-42.json".to_string(),
            ),
            (
                KeyStrategy::StreamSequence,
                "stream-sequence/ORDERS/42.json".to_string(),
            ),
            (KeyStrategy::MessageId, "message-id/id~2F1.json".to_string()),
            (
                KeyStrategy::PayloadSha256,
                format!("payload-sha256/orders.created/{digest}.json"),
            ),
        ] {
            let mut c = cfg(&s);
            c.key_strategy = strategy;
            let sink = sink(c);
            assert_eq!(
                sink.write_batch(std::slice::from_ref(&e)),
                vec![WriteOutcome::Durable]
            );
            let bytes = fs::read(s.path().join("out").join(&expected)).unwrap();
            assert_eq!(bytes, record_of(&e), "{expected}");
        }
        assert_eq!(files(&s).len(), 4, "{:?}", files(&s));
    }

    #[test]
    fn key_prefix_and_per_subject_directories() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.key_prefix = Some("prod/events".into());
        c.per_subject_directories = true;
        c.key_strategy = KeyStrategy::StreamSequence;
        let sink = sink(c);
        let batch = [
            envelope("orders.created", 1, None, b"{}"),
            envelope("a/../b", 2, None, b"{}"),
        ];
        assert_eq!(sink.write_batch(&batch), vec![WriteOutcome::Durable; 2]);
        assert_eq!(
            files(&s),
            vec![
                "prod/events/a~2F..~2Fb/stream-sequence/ORDERS/2.json",
                "prod/events/orders.created/stream-sequence/ORDERS/1.json",
            ]
        );
        let mode = |p: &str| {
            fs::metadata(s.path().join("out").join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(
            mode("prod/events/orders.created/stream-sequence/ORDERS/1.json"),
            0o640
        );
        assert_eq!(mode("prod/events/orders.created/stream-sequence"), 0o750);
    }

    #[test]
    fn missing_key_input_is_permanent_and_does_not_hold_back_the_batch() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.key_strategy = KeyStrategy::MessageId;
        let sink = sink(c);
        let batch = [
            envelope("a", 1, Some("m1"), b"{}"),
            envelope("a", 2, None, b"SECRET-PAYLOAD"),
            envelope("a", 3, Some("m3"), b"{}"),
        ];
        let out = sink.write_batch(&batch);
        assert_eq!(out[0], WriteOutcome::Durable);
        assert_eq!(
            permanent(&out[1]),
            "sink file: key strategy message_id needs a Nats-Msg-Id header"
        );
        assert_eq!(out[2], WriteOutcome::Durable);
        assert_eq!(files(&s), vec!["message-id/m1.json", "message-id/m3.json"]);
    }

    #[test]
    fn skip_existing_keeps_the_first_bytes() {
        let s = Scratch::new();
        let sink = sink(cfg(&s));
        let first = envelope("a", 7, None, b"{}");
        let mut again = first.clone();
        again.metadata.delivery_count = 2;
        again.metadata.received_at =
            crate::text::rfc3339::Rfc3339::from_unix_nanos(1_893_456_000_000_000_000);
        assert_eq!(
            sink.write_batch(std::slice::from_ref(&first)),
            vec![WriteOutcome::Durable]
        );
        assert_eq!(
            sink.write_batch(&[again]),
            vec![WriteOutcome::AlreadyDurable]
        );
        let path = s.path().join("out/idempotency-key/s-ORDERS-7.json");
        assert_eq!(fs::read(path).unwrap(), record_of(&first));
        assert_eq!(
            files(&s),
            vec!["idempotency-key/s-ORDERS-7.json"],
            "no temp left"
        );
    }

    #[test]
    fn fail_existing_is_permanent_and_keeps_the_file() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.duplicate_policy = DuplicatePolicy::FailExisting;
        let sink = sink(c);
        let first = envelope("a", 7, None, b"{}");
        let mut again = first.clone();
        again.metadata.delivery_count = 2;
        assert_eq!(
            sink.write_batch(std::slice::from_ref(&first)),
            vec![WriteOutcome::Durable]
        );
        let out = sink.write_batch(&[again]);
        assert_eq!(
            permanent(&out[0]),
            "sink file: idempotency-key/s-ORDERS-7.json already exists (duplicate_policy \
             fail_existing)"
        );
        let path = s.path().join("out/idempotency-key/s-ORDERS-7.json");
        assert_eq!(fs::read(path).unwrap(), record_of(&first));
        assert_eq!(files(&s).len(), 1);
    }

    #[test]
    fn replace_swaps_in_the_new_record() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.duplicate_policy = DuplicatePolicy::Replace;
        let sink = sink(c);
        let first = envelope("a", 7, None, b"{}");
        let mut again = first.clone();
        again.metadata.delivery_count = 2;
        assert_eq!(
            sink.write_batch(std::slice::from_ref(&first)),
            vec![WriteOutcome::Durable]
        );
        assert_eq!(
            sink.write_batch(std::slice::from_ref(&again)),
            vec![WriteOutcome::Durable]
        );
        let path = s.path().join("out/idempotency-key/s-ORDERS-7.json");
        assert_eq!(fs::read(&path).unwrap(), record_of(&again));
        assert_ne!(record_of(&again), record_of(&first));
        assert_eq!(files(&s).len(), 1, "no temp left: {:?}", files(&s));
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o640);
    }

    #[test]
    fn racing_writers_of_one_key_leave_one_complete_file() {
        let s = Scratch::new();
        let sink: Arc<dyn Sink> = Arc::new(sink(cfg(&s)));
        for round in 0..10u64 {
            let barrier = Arc::new(Barrier::new(8));
            let handles: Vec<_> = (0..8u64)
                .map(|t| {
                    let sink = Arc::clone(&sink);
                    let barrier = Arc::clone(&barrier);
                    std::thread::Builder::new()
                        .name(format!("race-{t}"))
                        .spawn(move || {
                            let mut e = envelope("a", 100 + round, None, &[b'x'; 4000]);
                            // Every racer's record differs, so mixed bytes would show.
                            e.metadata.delivery_count = t + 1;
                            barrier.wait();
                            (sink.write_batch(std::slice::from_ref(&e)), record_of(&e))
                        })
                        .unwrap()
                })
                .collect();
            let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            let durable = results
                .iter()
                .filter(|(o, _)| o[0] == WriteOutcome::Durable)
                .count();
            let already = results
                .iter()
                .filter(|(o, _)| o[0] == WriteOutcome::AlreadyDurable)
                .count();
            assert_eq!((durable, already), (1, 7), "round {round}: {results:?}");
            let winner = &results
                .iter()
                .find(|(o, _)| o[0] == WriteOutcome::Durable)
                .unwrap()
                .1;
            let path = s
                .path()
                .join(format!("out/idempotency-key/s-ORDERS-{}.json", 100 + round));
            assert_eq!(&fs::read(path).unwrap(), winner);
        }
        assert_eq!(
            files(&s).len(),
            10,
            "one file per key, no temp: {:?}",
            files(&s)
        );
    }

    #[test]
    fn gzip_records_decompress_to_the_record() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.compression = Compression::Gzip;
        c.file_suffix = ".json.gz".into();
        let sink = sink(c);
        let e = envelope(
            "a",
            9,
            None,
            br#"{"big":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#,
        );
        assert_eq!(
            sink.write_batch(std::slice::from_ref(&e)),
            vec![WriteOutcome::Durable]
        );
        let bytes = fs::read(s.path().join("out/idempotency-key/s-ORDERS-9.json.gz")).unwrap();
        assert_eq!(&bytes[..2], &[0x1f, 0x8b]);
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut text)
            .unwrap();
        assert_eq!(text, record_of(&e));
    }

    #[test]
    fn file_mode_is_exact_despite_the_umask() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.file_mode = 0o664;
        let sink = sink(c);
        sink.write_batch(&[envelope("a", 1, None, b"{}")]);
        let p = s.path().join("out/idempotency-key/s-ORDERS-1.json");
        assert_eq!(
            fs::metadata(p).unwrap().permissions().mode() & 0o7777,
            0o664
        );
        let d = s.path().join("out/idempotency-key");
        assert_eq!(
            fs::metadata(d).unwrap().permissions().mode() & 0o7777,
            0o775
        );
    }

    #[test]
    fn a_directory_at_the_final_name_is_permanent_and_leaves_nothing() {
        for policy in [
            DuplicatePolicy::SkipExisting,
            DuplicatePolicy::FailExisting,
            DuplicatePolicy::Replace,
        ] {
            let s = Scratch::new();
            let mut c = cfg(&s);
            c.duplicate_policy = policy;
            let sink = sink(c);
            let blocker = s.path().join("out/idempotency-key/s-ORDERS-5.json");
            fs::create_dir_all(blocker.join("inner")).unwrap();
            let out = sink.write_batch(&[envelope("a", 5, None, b"SECRET-PAYLOAD")]);
            assert_eq!(
                permanent(&out[0]),
                "sink file: idempotency-key/s-ORDERS-5.json exists and is not a regular file",
                "{policy:?}"
            );
            assert!(blocker.join("inner").is_dir());
            let names: Vec<_> = fs::read_dir(s.path().join("out/idempotency-key"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(names, vec!["s-ORDERS-5.json"], "no temp left ({policy:?})");
        }
    }

    #[test]
    fn a_file_in_the_way_of_a_directory_is_transient_and_leaves_nothing() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.key_prefix = Some("blocked".into());
        let sink = sink(c);
        // Created as a directory at start-up, then replaced by a file.
        fs::remove_dir(s.path().join("out/blocked")).unwrap();
        fs::write(s.path().join("out/blocked"), b"not a dir").unwrap();
        let out = sink.write_batch(&[envelope("a", 5, None, b"SECRET-PAYLOAD")]);
        let msg = transient(&out[0]);
        assert!(
            msg.starts_with("sink file: write blocked/idempotency-key/s-ORDERS-5.json: "),
            "{msg}"
        );
        assert!(
            !msg.contains("SECRET") && !msg.contains(s.path().to_str().unwrap()),
            "{msg}"
        );
        assert_eq!(files(&s), vec!["blocked"]);
    }

    #[test]
    fn a_vanished_output_directory_is_not_recreated() {
        let s = Scratch::new();
        let sink = sink(cfg(&s));
        fs::remove_dir(s.path().join("out")).unwrap();
        let out = sink.write_batch(&[envelope("a", 5, None, b"{}")]);
        assert_eq!(
            transient(&out[0]),
            "sink file: write idempotency-key/s-ORDERS-5.json: output directory is missing"
        );
        assert!(!s.path().join("out").exists());
    }

    #[test]
    fn oversized_records_are_permanent() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.max_record_bytes = 1024;
        let sink = sink(c);
        let big = envelope("a", 1, None, &[b'y'; 2000]);
        let small = envelope("a", 2, None, b"{}");
        let out = sink.write_batch(&[big, small]);
        let msg = permanent(&out[0]);
        assert!(
            msg.starts_with("sink file: record idempotency-key/s-ORDERS-1.json is ")
                && msg.ends_with(" bytes, over max_record_bytes 1024"),
            "{msg}"
        );
        assert_eq!(out[1], WriteOutcome::Durable);
        assert_eq!(files(&s), vec!["idempotency-key/s-ORDERS-2.json"]);
    }

    #[test]
    fn overlong_names_are_permanent() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.key_strategy = KeyStrategy::MessageId;
        let sink = sink(c);
        let id = "é".repeat(50); // 100 bytes, 300 once escaped
        let out = sink.write_batch(&[envelope("a", 1, Some(&id), b"{}")]);
        let msg = permanent(&out[0]);
        assert!(
            msg.ends_with("has a path component longer than 255 bytes"),
            "{msg}"
        );
        assert!(files(&s).is_empty());
    }
}
