//! `mode` = `per_event`: one file per envelope at its deterministic key.
//!
//! A batch goes through four steps:
//! 1. here, on the sink worker's thread: each envelope's key and record (encoded, checked
//!    against `max_record_bytes`);
//! 2. on the sink's file writers ([`WriterPool`], `write_concurrency` threads shared by every
//!    sink worker, alive as long as the sink): each record compressed if configured and
//!    written durably under its final name ([`DurableFiles`]: a final name appears only with
//!    complete, fsynced content; racing writers of one key are decided by `link`);
//! 3. on the same writer, a few files later (a [`Finish`]): each file given a name in step 2
//!    fsynced again (its inode's link count, see durable_file.rs);
//! 4. here again, once every file is in: each directory whose entries changed (plus the
//!    parent of every directory created) fsynced once, before any outcome of the batch is
//!    reported. Outcomes keep the batch's order.
//!
//! No lock around file system work: sink workers share the writers' queue (its mutex is held
//! only to push a batch or take a task) and the temporary-name counter.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::config::FileSinkConfig;
use super::durable::DirSync;
use super::durable_file::{DurableFiles, Publication, Target};
use super::existing::RecordId;
use super::writer_pool::{run_here, Finish, Results, Slot, Task, WriterPool};
use super::{error, gzip_into, WriteLimit};
use crate::message::envelope::Envelope;
use crate::message::record::encode_record;
use crate::sink::key::{safe_component, strategy_key};
use crate::sink::layout::Compression;
use crate::sink::{FailureClass, WriteOutcome};

/// Longest file or directory name most Linux file systems accept.
pub const NAME_MAX: usize = 255;

pub struct PerEvent {
    cfg: FileSinkConfig,
    /// Prefix of every relative key: `<key_prefix>/` or empty.
    prefix: String,
    limit: WriteLimit,
    files: Arc<DurableFiles>,
    /// Started by the first batch (`svc validate` and `svc test-sink` start no threads);
    /// `None` inside when no thread could be started.
    writers: OnceLock<Option<WriterPool>>,
}

/// One file for the writers: everything owned, it crosses threads.
struct FileJob {
    target: Target,
    record: Vec<u8>,
}

/// Result of writing one envelope before its directory is synced.
enum Written {
    /// Outcome is final (a failure).
    Done(WriteOutcome),
    /// Durable or already durable once the target's directory and `created_parents` are synced.
    Pending(WriteOutcome, PathBuf, Vec<PathBuf>),
}

/// A file's step 2: its result, or the file still to be fsynced again (step 3) before its
/// result holds.
enum Step {
    Written(Written),
    SyncAgain(std::fs::File, String, Written),
}

impl FileJob {
    fn write(self, files: &DurableFiles, compression: Compression) -> Step {
        let mut gz = Vec::new();
        let body: &[u8] = match compression {
            Compression::None => &self.record,
            Compression::Gzip => match gzip_into(&mut gz, &self.record) {
                Ok(()) => &gz,
                Err(e) => {
                    return Step::Written(Written::Done(WriteOutcome::Transient(error(format!(
                        "compress {}: {e}",
                        self.target.rel
                    )))))
                }
            },
        };
        let mut created_parents = Vec::new();
        let Publication { outcome, named } = files.write(&self.target, body, &mut created_parents);
        if !outcome.is_durable() {
            return Step::Written(Written::Done(outcome));
        }
        let written = Written::Pending(outcome, self.target.dir().to_path_buf(), created_parents);
        match named {
            Some(file) => Step::SyncAgain(file, self.target.rel, written),
            None => Step::Written(written),
        }
    }
}

impl Step {
    /// Fills `slot` now, or returns the finish that fsyncs the file again and then fills it.
    fn settle(self, slot: Slot<Written>) -> Option<Finish> {
        match self {
            Step::Written(written) => {
                slot.fill(written);
                None
            }
            Step::SyncAgain(file, rel, written) => Some(Box::new(move || {
                slot.fill(match file.sync_all() {
                    Ok(()) => written,
                    Err(e) => {
                        Written::Done(WriteOutcome::Transient(error(format!("write {rel}: {e}"))))
                    }
                });
            })),
        }
    }
}

/// A task's slot was dropped without a result: its writer panicked.
fn writer_panicked() -> WriteOutcome {
    crate::sink::pool::panicked("file", "file writer thread")
}

impl PerEvent {
    pub fn new(cfg: FileSinkConfig) -> PerEvent {
        let prefix = cfg
            .key_prefix
            .as_deref()
            .map(|p| format!("{p}/"))
            .unwrap_or_default();
        PerEvent {
            limit: WriteLimit::of(&cfg),
            files: Arc::new(DurableFiles::new(&cfg)),
            writers: OnceLock::new(),
            prefix,
            cfg,
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
        for (i, dir, e) in dirs.sync(&self.cfg.directory) {
            if outcomes[i].is_durable() {
                let rel = self.relative(&dir);
                outcomes[i] = WriteOutcome::Transient(error(format!("sync directory {rel}: {e}")));
            }
        }
        outcomes
    }

    /// Prepares each file here and has the writers write it (steps 2 and 3); returns the
    /// results in order.
    fn write_files(&self, batch: &[Envelope]) -> Vec<Written> {
        let results = Results::new(batch.len());
        let mut tasks: Vec<Task> = Vec::with_capacity(batch.len());
        for (i, env) in batch.iter().enumerate() {
            let slot = results.slot(i);
            let job = match self.job(env) {
                Ok(job) => job,
                Err(o) => {
                    slot.fill(Written::Done(o));
                    continue;
                }
            };
            let (files, compression) = (Arc::clone(&self.files), self.cfg.compression);
            tasks.push(Box::new(move || {
                job.write(&files, compression).settle(slot)
            }));
        }
        self.run(tasks);
        results
            .wait()
            .into_iter()
            .map(|w| w.unwrap_or_else(|| Written::Done(writer_panicked())))
            .collect()
    }

    /// Runs the tasks on the writers, or here when no writer thread could be started (or the
    /// pool is closing).
    fn run(&self, tasks: Vec<Task>) {
        let writers = self
            .writers
            .get_or_init(|| WriterPool::start(self.cfg.write_concurrency));
        let queued = match writers {
            Some(pool) => pool.run_all(tasks),
            None => Err(tasks),
        };
        if let Err(tasks) = queued {
            run_here(tasks);
        }
    }

    /// The key and encoded record of an envelope, or its (permanent) failure.
    fn job(&self, env: &Envelope) -> Result<FileJob, WriteOutcome> {
        let target = self.target(env)?;
        let mut record = Vec::new();
        if let Err(e) = encode_record(&mut record, env) {
            return Err(WriteOutcome::Permanent(
                error(format!("encode {}: {e}", target.rel)).classified(FailureClass::EncodeFailed),
            ));
        }
        self.limit.check(record.len(), || &target.rel)?;
        Ok(FileJob { target, record })
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
        let id = Some(RecordId::of(env, self.cfg.key_strategy));
        Ok(Target { rel, path, id })
    }

    /// A directory below the output directory, as shown in errors.
    fn relative(&self, dir: &std::path::Path) -> String {
        match dir.strip_prefix(&self.cfg.directory) {
            Ok(r) if r.as_os_str().is_empty() => ".".into(),
            Ok(r) => r.display().to_string(),
            Err(_) => "output directory".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::file::durable_file::sync_by_name;
    use crate::sink::file::tests::{envelope, record_of, sink, Scratch};
    use crate::sink::key::KeyStrategy;
    use crate::sink::layout::DuplicatePolicy;
    use crate::sink::{Sink, WriteOutcome};
    use std::fs;
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::sync::{Arc, Barrier};

    fn cfg(s: &Scratch) -> FileSinkConfig {
        FileSinkConfig::new(s.path().join("out"))
    }

    const POLICIES: [DuplicatePolicy; 3] = [
        DuplicatePolicy::SkipExisting,
        DuplicatePolicy::FailExisting,
        DuplicatePolicy::Replace,
    ];

    /// A scratch directory and a configuration with `policy`.
    fn scratch_with(policy: DuplicatePolicy) -> (Scratch, FileSinkConfig) {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.duplicate_policy = policy;
        (s, c)
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
        assert_eq!(
            sink.write_batch(&[envelope("a", 1, None, b"{}")]),
            vec![WriteOutcome::Durable]
        );
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
        for policy in POLICIES {
            let (s, c) = scratch_with(policy);
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
    #[test]
    fn writers_sharing_a_directory_leave_each_others_temporary_files_alone() {
        // Two instances of one process share a pid, as runners in containers (each pid 1)
        // writing one volume do. The named way is the one with temporary names.
        let s = Scratch::new();
        let a = DurableFiles::new(&cfg(&s)).named_only();
        let b = DurableFiles::new(&cfg(&s)).named_only();
        assert_ne!(
            a.temp_tag(),
            b.temp_tag(),
            "the random part tells them apart"
        );
        // Another writer's file in progress at the very name `a` tries first.
        let dir = s.path().join("out/idempotency-key");
        fs::create_dir_all(&dir).unwrap();
        let theirs = dir.join(format!(".svc-tmp-{}-0", a.temp_tag()));
        fs::write(&theirs, b"in progress").unwrap();
        let target = |n: u64| Target {
            rel: format!("idempotency-key/s-ORDERS-{n}.json"),
            path: dir.join(format!("s-ORDERS-{n}.json")),
            id: None,
        };
        let first = a.write(&target(1), b"one", &mut Vec::new()).outcome;
        assert!(transient(&first).contains("File exists"), "{first:?}");
        assert_eq!(fs::read(&theirs).unwrap(), b"in progress", "left alone");
        // The retry (a redelivery) takes the next name.
        assert_eq!(
            a.write(&target(1), b"one", &mut Vec::new()).outcome,
            WriteOutcome::Durable
        );
        assert_eq!(
            b.write(&target(2), b"two", &mut Vec::new()).outcome,
            WriteOutcome::Durable
        );
        assert_eq!(fs::read(dir.join("s-ORDERS-1.json")).unwrap(), b"one");
    }

    #[test]
    fn only_a_name_given_to_an_unnamed_file_asks_for_the_second_fsync() {
        let (s, c) = scratch_with(DuplicatePolicy::SkipExisting);
        fs::create_dir(&c.directory).unwrap();
        let target = |n: u64| Target {
            rel: format!("k/{n}.json"),
            path: s.path().join(format!("out/k/{n}.json")),
            id: None,
        };
        let unnamed = DurableFiles::new(&c);
        let first = unnamed.write(&target(1), b"one", &mut Vec::new());
        assert_eq!(first.outcome, WriteOutcome::Durable);
        // Scratch directories live on a file system with O_TMPFILE (the unnamed way).
        let kept = first.named.expect("the link raised the inode's link count");
        let at_name = fs::metadata(&target(1).path).unwrap();
        let kept_meta = kept.metadata().unwrap();
        assert_eq!(
            (kept_meta.ino(), kept_meta.nlink()),
            (at_name.ino(), 1),
            "the descriptor kept for the second fsync is the file under its final name"
        );
        kept.sync_all().unwrap();
        // Found existing: fsynced by name on the spot, nothing left for later.
        let again = unnamed.write(&target(1), b"one", &mut Vec::new());
        assert_eq!(again.outcome, WriteOutcome::AlreadyDurable);
        assert!(again.named.is_none());
        let named = DurableFiles::new(&c).named_only();
        let other = named.write(&target(2), b"two", &mut Vec::new());
        assert_eq!(other.outcome, WriteOutcome::Durable);
        assert!(
            other.named.is_none(),
            "fsynced with its name and link count 1"
        );
        // sync_by_name never follows a symbolic link at the final name.
        std::os::unix::fs::symlink(target(2).path, target(3).path).unwrap();
        assert_eq!(
            sync_by_name(&target(3).path).unwrap_err().raw_os_error(),
            Some(40),
            "ELOOP"
        );
    }

    #[test]
    fn the_named_way_gives_the_same_results() {
        for policy in POLICIES {
            let (s, mut c) = scratch_with(policy);
            c.file_mode = 0o600;
            fs::create_dir(&c.directory).unwrap();
            let files = DurableFiles::new(&c).named_only();
            let target = Target {
                rel: "k/1.json".into(),
                path: s.path().join("out/k/1.json"),
                id: None,
            };
            let mut created = Vec::new();
            assert_eq!(
                files.write(&target, b"first", &mut created).outcome,
                WriteOutcome::Durable
            );
            assert_eq!(created, vec![s.path().join("out")], "{policy:?}");
            let again = files.write(&target, b"second", &mut Vec::new()).outcome;
            let expected: &[u8] = match policy {
                DuplicatePolicy::SkipExisting => {
                    // Other bytes and no record identity: not this record's copy.
                    assert!(
                        permanent(&again).contains("holds another record"),
                        "{again:?}"
                    );
                    assert_eq!(
                        files.write(&target, b"first", &mut Vec::new()).outcome,
                        WriteOutcome::AlreadyDurable
                    );
                    b"first"
                }
                DuplicatePolicy::FailExisting => {
                    assert!(permanent(&again).contains("already exists"), "{again:?}");
                    b"first"
                }
                DuplicatePolicy::Replace => {
                    assert_eq!(again, WriteOutcome::Durable);
                    b"second"
                }
            };
            assert_eq!(fs::read(&target.path).unwrap(), expected, "{policy:?}");
            assert_eq!(
                files_in(&s.path().join("out/k")),
                vec!["1.json"],
                "no temp left"
            );
            let mode = fs::metadata(&target.path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o600);
        }
    }

    #[test]
    fn writer_threads_outlive_batches() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.write_concurrency = 3;
        fs::create_dir(&c.directory).unwrap();
        let sink = PerEvent::new(c);
        assert!(
            sink.writers.get().is_none(),
            "no thread before the first batch"
        );
        let threads = || sink.writers.get().unwrap().as_ref().unwrap().live_threads();
        let batch: Vec<_> = (1..=20).map(|n| envelope("a", n, None, b"{}")).collect();
        assert_eq!(sink.write_batch(&batch), vec![WriteOutcome::Durable; 20]);
        let first = threads();
        let batch: Vec<_> = (21..=40).map(|n| envelope("a", n, None, b"{}")).collect();
        assert_eq!(sink.write_batch(&batch), vec![WriteOutcome::Durable; 20]);
        assert_eq!(threads(), first, "the same threads wrote the second batch");
        let names: Vec<&str> = first.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, ["svc-file-0", "svc-file-1", "svc-file-2"]);
        assert_eq!(files(&s).len(), 40);
    }

    fn files_in(dir: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }
}
