//! `mode` = `jsonl`: batches appended to rolling segments, one record per line, one fsync per
//! batch. At-least-once: a redelivered message is appended again.
//!
//! # Segments
//! `<directory>/[<key_prefix>/]segment-<UTC yyyymmddThhmmssZ>-<pid>-<counter>-<random><suffix>`,
//! e.g. `segment-20240501T120000Z-4711-000001-9f3c07a2.jsonl`. The counter starts at 1 per
//! process and only grows, so one process's segments sort by creation; the 32 random bits make
//! a name unpredictable, so another account able to write the directory cannot plant the next
//! names in advance. Several runners may write one directory
//! (scale-out, a shared volume): exclusive creation (`O_EXCL`), not the pid, keeps them apart,
//! since runners on other hosts or in containers (each pid 1) can share a pid and a second;
//! a name found taken is skipped. Segments are created lazily (no empty segments); a segment
//! is never reopened, neither by this process after a roll nor by a restarted one. A batch
//! rolls the segment first when it is older than
//! `segment_max_age_seconds` or when the batch would push it past `segment_max_bytes` (a single
//! batch larger than that gets a segment of its own). Age is checked only when a batch arrives.
//!
//! # Concurrency: one shared segment, group commit
//! Sink workers call `write_batch` concurrently. Each serializes its batch into a thread-local
//! buffer with no lock held, then takes the segment lock only for one `write_all` of the whole
//! batch (so batches never interleave and lines are always whole), and releases it. Durability
//! is a separate step under the segment's sync lock: a worker whose bytes are already covered
//! by a finished fsync returns at once; otherwise it fsyncs everything written so far
//! (`fdatasync`), covering the batches of the workers queued behind it. One fsync per batch at
//! most, usually fewer.
//!
//! # Failures
//! A failed append is truncated back to the last whole batch, so a disk-full error never leaves
//! a partial line. A failed fsync poisons the segment (its unsynced tail may be lost, Linux
//! reports such an error only once): every batch not yet covered by an earlier good fsync is
//! reported transient and the next batch starts a new segment. Only a crash (or a failed
//! truncate) can leave an incomplete last line; its records were never reported durable and
//! are redelivered into a later segment.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::config::FileSinkConfig;
use super::durable::{dir_mode, open_below, sync_dir};
use super::gzip_into;
use super::{error, WriteLimit};
use crate::message::envelope::Envelope;
use crate::message::record::encode_record;
use crate::sink::layout::Compression;
use crate::sink::{FailureClass, WriteOutcome};

/// Thread-local buffers kept after a batch only up to this capacity.
const KEEP_BUFFER_BYTES: usize = 8 * 1024 * 1024;

thread_local! {
    /// Serialized lines of the current batch, and its gzip member: reused across batches so the
    /// hot path allocates nothing per record.
    static BUFFERS: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

pub struct Jsonl {
    cfg: FileSinkConfig,
    /// `key_prefix/` or empty: segment names in errors are relative to the directory.
    prefix: String,
    dir_mode: u32,
    limit: WriteLimit,
    max_age: Duration,
    state: Mutex<State>,
}

struct State {
    current: Option<Segment>,
    /// Counter of the next segment name.
    next: u64,
}

/// The open segment, owned by the state lock.
struct Segment {
    shared: Arc<SegmentFile>,
    opened: Instant,
    /// Bytes of whole batches in the file.
    len: u64,
}

/// What a worker needs to make its batch durable after releasing the state lock.
struct SegmentFile {
    file: File,
    /// Name relative to the output directory.
    rel: String,
    /// Bytes of whole batches written (== `Segment::len`, readable without the state lock).
    written: AtomicU64,
    /// Set when an fsync failed: bytes past `synced` may be lost.
    poisoned: AtomicBool,
    /// Bytes known durable. Its lock is the group-commit lock.
    synced: Mutex<u64>,
}

impl Jsonl {
    pub fn new(cfg: FileSinkConfig) -> Jsonl {
        let prefix = match &cfg.key_prefix {
            Some(p) => format!("{p}/"),
            None => String::new(),
        };
        Jsonl {
            prefix,
            dir_mode: dir_mode(cfg.file_mode),
            limit: WriteLimit::of(&cfg),
            max_age: Duration::from_secs(cfg.segment_max_age_seconds),
            state: Mutex::new(State {
                current: None,
                next: 1,
            }),
            cfg,
        }
    }

    pub fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        self.write_each(
            batch,
            |lines, env| {
                encode_record(lines, env).map_err(|e| {
                    WriteOutcome::Permanent(
                        error(format!(
                            "encode record of stream sequence {}: {e}",
                            env.stream_sequence
                        ))
                        .classified(FailureClass::EncodeFailed),
                    )
                })
            },
            |env| format!("of stream sequence {}", env.stream_sequence),
        )
    }

    /// Appends records already encoded (a spool drain's), exactly as `write_batch` appends
    /// the records it encodes.
    pub fn write_records(&self, records: &[&[u8]]) -> Vec<WriteOutcome> {
        self.write_each(
            records,
            |lines, record| {
                lines.extend_from_slice(record);
                Ok(())
            },
            |_| "drained from the spool".to_string(),
        )
    }

    /// Appends one line per item, written into the buffer by `encode`; `name` names an item
    /// in a size error.
    fn write_each<T>(
        &self,
        items: &[T],
        encode: impl FnMut(&mut Vec<u8>, &T) -> Result<(), WriteOutcome>,
        name: impl Fn(&T) -> String,
    ) -> Vec<WriteOutcome> {
        BUFFERS.with(|cell| {
            let mut bufs = cell.borrow_mut();
            let (lines, gz) = &mut *bufs;
            let out = self.write_with(items, encode, name, lines, gz);
            for b in [lines, gz] {
                b.clear();
                if b.capacity() > KEEP_BUFFER_BYTES {
                    b.shrink_to(KEEP_BUFFER_BYTES);
                }
            }
            out
        })
    }

    fn write_with<T>(
        &self,
        items: &[T],
        mut encode: impl FnMut(&mut Vec<u8>, &T) -> Result<(), WriteOutcome>,
        name: impl Fn(&T) -> String,
        lines: &mut Vec<u8>,
        gz: &mut Vec<u8>,
    ) -> Vec<WriteOutcome> {
        // `None` = pending, appended with the batch.
        let mut outcomes: Vec<Option<WriteOutcome>> = Vec::with_capacity(items.len());
        lines.clear();
        for item in items {
            let start = lines.len();
            let outcome = match encode(lines, item) {
                Err(failed) => Some(failed),
                Ok(()) => self.limit.check(lines.len() - start, || name(item)).err(),
            };
            if outcome.is_some() {
                lines.truncate(start);
            } else {
                lines.push(b'\n');
            }
            outcomes.push(outcome);
        }
        if !lines.is_empty() {
            let result = match self.cfg.compression {
                Compression::None => self.append(lines),
                Compression::Gzip => match gzip_into(gz, lines) {
                    // Each batch is one gzip member; concatenated members are one valid stream.
                    Ok(()) => self.append(gz),
                    Err(e) => Err(error(format!("compress batch: {e}"))),
                },
            };
            for o in outcomes.iter_mut().filter(|o| o.is_none()) {
                *o = Some(match &result {
                    Ok(()) => WriteOutcome::Durable,
                    Err(e) => WriteOutcome::Transient(e.clone()),
                });
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every outcome is set"))
            .collect()
    }

    /// Appends one batch's bytes and makes them durable.
    fn append(&self, bytes: &[u8]) -> Result<(), crate::sink::SinkError> {
        let (shared, end) = {
            let mut state = self.lock_state();
            let seg = self.segment_for(&mut state, bytes.len() as u64)?;
            let start = seg.len;
            if let Err(e) = (&seg.shared.file).write_all(bytes) {
                // Keep whole lines only: cut the partial batch off again.
                if seg.shared.file.set_len(start).is_err() {
                    seg.shared.poisoned.store(true, Ordering::SeqCst);
                }
                return Err(error(format!("append to {}: {e}", seg.shared.rel)));
            }
            seg.len = start + bytes.len() as u64;
            seg.shared.written.store(seg.len, Ordering::SeqCst);
            (Arc::clone(&seg.shared), seg.len)
        };
        shared.sync_through(end)
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave partial state that matters here: the
        // segment length is only updated after a whole write.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The segment the next `len` bytes go to, rolling or opening one as needed.
    fn segment_for<'s>(
        &self,
        state: &'s mut State,
        len: u64,
    ) -> Result<&'s mut Segment, crate::sink::SinkError> {
        let roll = match &state.current {
            None => true,
            Some(seg) => {
                seg.shared.poisoned.load(Ordering::SeqCst)
                    || seg.opened.elapsed() >= self.max_age
                    || (seg.len > 0 && seg.len + len > self.cfg.segment_max_bytes)
            }
        };
        if roll {
            // Workers still syncing the old segment hold their own `Arc` to it.
            state.current = None;
            let seg = self.open_segment(&mut state.next)?;
            state.current = Some(seg);
        }
        Ok(state.current.as_mut().expect("a segment was just opened"))
    }

    fn open_segment(&self, next: &mut u64) -> Result<Segment, crate::sink::SinkError> {
        let stamp = utc_stamp();
        let pid = std::process::id();
        let mut created_parents = Vec::new();
        let rel_dir = self.prefix.trim_end_matches('/');
        let in_dir = |e: &dyn std::fmt::Display| {
            error(format!(
                "create segment in {}: {e}",
                if rel_dir.is_empty() { "." } else { rel_dir }
            ))
        };
        // No link followed, every directory the service's (see durable::open_below).
        let dir = open_below(
            &self.cfg.directory,
            Path::new(rel_dir),
            self.dir_mode,
            &mut created_parents,
        )
        .map_err(|p| in_dir(&p))?;
        // A restarted process may reuse a pid within the same second, and another account
        // able to write the directory could plant names: the random part makes names
        // unpredictable, and a taken one is skipped.
        for _ in 0..1000 {
            let name = format!(
                "segment-{stamp}-{pid}-{:06}-{:08x}{}",
                *next,
                rand::random::<u32>(),
                self.cfg.file_suffix
            );
            *next += 1;
            let rel = format!("{}{name}", self.prefix);
            let created = rustix::fs::openat(
                &dir,
                &name,
                OFlags::WRONLY
                    | OFlags::APPEND
                    | OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::CLOEXEC,
                Mode::from_bits_truncate(self.cfg.file_mode),
            );
            let file = match created {
                Ok(fd) => File::from(fd),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(error(format!("create {rel}: {}", io::Error::from(e)))),
            };
            let synced = rustix::fs::fchmod(&file, Mode::from_bits_truncate(self.cfg.file_mode))
                .map_err(io::Error::from)
                .and_then(|()| file.sync_all())
                .and_then(|()| rustix::fs::fsync(&dir).map_err(io::Error::from))
                .and_then(|()| created_parents.iter().try_for_each(|p| sync_dir(p)));
            if let Err(e) = synced {
                // Not usable: leave no empty segment behind (one per retry during a sync outage).
                let _ = rustix::fs::unlinkat(&dir, &name, rustix::fs::AtFlags::empty());
                return Err(error(format!("create {rel}: {e}")));
            }
            return Ok(Segment {
                shared: Arc::new(SegmentFile {
                    file,
                    rel,
                    written: AtomicU64::new(0),
                    poisoned: AtomicBool::new(false),
                    synced: Mutex::new(0),
                }),
                opened: Instant::now(),
                len: 0,
            });
        }
        Err(error(format!(
            "create segment in {}: no free segment name",
            if self.prefix.is_empty() {
                "."
            } else {
                self.prefix.trim_end_matches('/')
            }
        )))
    }
}

impl SegmentFile {
    /// Returns once bytes `..end` are on stable storage (group commit, see module docs).
    fn sync_through(&self, end: u64) -> Result<(), crate::sink::SinkError> {
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        if *synced >= end {
            return Ok(());
        }
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(error(format!(
                "sync {}: an earlier sync of this segment failed",
                self.rel
            )));
        }
        // Everything below `target` was fully written before this fsync starts.
        let target = self.written.load(Ordering::SeqCst);
        match self.file.sync_data() {
            Ok(()) => {
                *synced = target;
                Ok(())
            }
            Err(e) => {
                self.poisoned.store(true, Ordering::SeqCst);
                Err(error(format!("sync {}: {e}", self.rel)))
            }
        }
    }
}

/// `yyyymmddThhmmssZ` of now, UTC.
fn utc_stamp() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::file::config::FileMode;
    use crate::sink::file::tests::{envelope, record_of, sink, Scratch};
    use crate::sink::Sink;
    use serde_json::Value;
    use std::collections::BTreeSet;
    use std::fs;
    use std::fs::OpenOptions;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    fn cfg(s: &Scratch) -> FileSinkConfig {
        let mut c = FileSinkConfig::new(s.path().join("out"));
        c.mode = FileMode::Jsonl;
        c.file_suffix = ".jsonl".into();
        c
    }

    fn read_all(s: &Scratch, gzip: bool) -> Vec<(String, Vec<u8>)> {
        s.files("out")
            .into_iter()
            .map(|name| {
                let raw = fs::read(s.path().join("out").join(&name)).unwrap();
                let bytes = if gzip {
                    let mut text = Vec::new();
                    flate2::read::MultiGzDecoder::new(&raw[..])
                        .read_to_end(&mut text)
                        .unwrap();
                    text
                } else {
                    raw
                };
                (name, bytes)
            })
            .collect()
    }

    /// Every line of every segment, checking that each segment ends with a whole line.
    fn lines(s: &Scratch, gzip: bool) -> Vec<Value> {
        let mut out = Vec::new();
        for (name, bytes) in read_all(s, gzip) {
            assert_eq!(bytes.last(), Some(&b'\n'), "{name} ends with a whole line");
            for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                out.push(serde_json::from_slice(line).expect("every line is one JSON record"));
            }
        }
        out
    }

    fn batch(first_seq: u64, n: u64) -> Vec<Envelope> {
        (first_seq..first_seq + n)
            .map(|seq| envelope("orders.created", seq, None, br#"{"k":"v"}"#))
            .collect()
    }

    #[test]
    fn batches_are_appended_as_lines_to_one_segment() {
        let s = Scratch::new();
        let sink = sink(cfg(&s));
        let b1 = batch(1, 3);
        let b2 = batch(4, 2);
        assert_eq!(sink.write_batch(&b1), vec![WriteOutcome::Durable; 3]);
        assert_eq!(sink.write_batch(&b2), vec![WriteOutcome::Durable; 2]);
        let segs = read_all(&s, false);
        assert_eq!(segs.len(), 1);
        let (name, bytes) = &segs[0];
        let pid = std::process::id();
        assert!(
            name.starts_with("segment-") && name.contains(&format!("-{pid}-000001-")),
            "{name}"
        );
        assert_eq!(
            name.len(),
            "segment-20240501T120000Z-".len() + format!("{pid}-000001-9f3c07a2.jsonl").len()
        );
        let mut expected = Vec::new();
        for e in b1.iter().chain(&b2) {
            expected.extend(record_of(e));
            expected.push(b'\n');
        }
        assert_eq!(bytes, &expected);
        let mode = fs::metadata(s.path().join("out").join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o640);
    }

    #[test]
    fn segments_roll_by_size() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.segment_max_bytes = 4096;
        let sink = sink(c);
        let mut seq = 1;
        for _ in 0..20 {
            assert_eq!(
                sink.write_batch(&batch(seq, 3)),
                vec![WriteOutcome::Durable; 3]
            );
            seq += 3;
        }
        let segs = read_all(&s, false);
        assert!(segs.len() > 3, "{}", segs.len());
        for (name, bytes) in &segs {
            assert!(bytes.len() <= 4096, "{name}: {}", bytes.len());
        }
        let seqs: Vec<u64> = lines(&s, false)
            .iter()
            .map(|v| v["stream_sequence"].as_u64().unwrap())
            .collect();
        assert_eq!(
            seqs,
            (1..seq).collect::<Vec<_>>(),
            "in order across segments"
        );
        // A batch larger than the limit gets a segment of its own.
        let big = batch(1000, 40);
        assert_eq!(sink.write_batch(&big), vec![WriteOutcome::Durable; 40]);
        let last = read_all(&s, false).pop().unwrap();
        assert!(last.1.len() > 4096);
        assert_eq!(last.1.iter().filter(|b| **b == b'\n').count(), 40);
    }

    #[test]
    fn segments_roll_by_age() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        // Below the configurable minimum of 1 s: every batch finds its segment too old.
        c.segment_max_age_seconds = 0;
        let sink = sink(c);
        for i in 0..3 {
            assert_eq!(
                sink.write_batch(&batch(i * 2 + 1, 2)),
                vec![WriteOutcome::Durable; 2]
            );
        }
        let names: Vec<String> = read_all(&s, false).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        for (i, n) in names.iter().enumerate() {
            assert!(n.contains(&format!("-{:06}-", i + 1)), "{n}");
        }
    }

    #[test]
    fn concurrent_batches_produce_only_whole_lines() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.segment_max_bytes = 64 * 1024;
        let sink: Arc<dyn Sink> = Arc::new(sink(c));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let sink = Arc::clone(&sink);
                std::thread::Builder::new()
                    .name(format!("jsonl-writer-{t}"))
                    .spawn(move || {
                        for b in 0..50u64 {
                            let first = t * 100_000 + b * 20 + 1;
                            let out = sink.write_batch(&batch(first, 20));
                            assert_eq!(out, vec![WriteOutcome::Durable; 20]);
                        }
                    })
                    .unwrap()
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let all = lines(&s, false);
        assert_eq!(all.len(), 4 * 50 * 20);
        let seqs: BTreeSet<u64> = all
            .iter()
            .map(|v| v["stream_sequence"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs.len(), all.len(), "each record exactly once");
        assert!(read_all(&s, false).len() > 1, "rolled while racing");
    }

    #[test]
    fn gzip_segments_are_one_member_per_batch() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.compression = Compression::Gzip;
        c.file_suffix = ".jsonl.gz".into();
        let sink = sink(c);
        for first in [1, 6, 11] {
            assert_eq!(
                sink.write_batch(&batch(first, 5)),
                vec![WriteOutcome::Durable; 5]
            );
        }
        let seqs: Vec<u64> = lines(&s, true)
            .iter()
            .map(|v| v["stream_sequence"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (1..=15).collect::<Vec<_>>());
        let files = s.files("out");
        assert_eq!(files.len(), 1, "{files:?}");
        let name = &files[0];
        assert!(name.ends_with(".jsonl.gz"), "{name}");
        // Decode member by member: a single-member decoder stops at the end of its member's
        // trailer, leaving the rest of the file for the next one.
        let raw = fs::read(s.path().join("out").join(name)).unwrap();
        let mut rest = &raw[..];
        let mut members = Vec::new();
        while !rest.is_empty() {
            let mut member = flate2::bufread::GzDecoder::new(rest);
            let mut text = Vec::new();
            member.read_to_end(&mut text).expect("a whole gzip member");
            rest = member.into_inner();
            members.push(text);
        }
        assert_eq!(members.len(), 3, "one member per batch");
        for (i, text) in members.iter().enumerate() {
            let firsts: Vec<u64> = text
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    serde_json::from_slice::<Value>(l).unwrap()["stream_sequence"]
                        .as_u64()
                        .unwrap()
                })
                .collect();
            let first = i as u64 * 5 + 1;
            assert_eq!(firsts, (first..first + 5).collect::<Vec<_>>(), "member {i}");
        }
    }

    #[test]
    fn oversized_records_are_permanent_and_the_rest_is_appended() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.max_record_bytes = 1024;
        let sink = sink(c);
        let mut b = batch(1, 3);
        b[1] = envelope("orders.created", 2, None, &[b'z'; 3000]);
        let out = sink.write_batch(&b);
        assert_eq!(out[0], WriteOutcome::Durable);
        match &out[1] {
            WriteOutcome::Permanent(e) => {
                let m = e.to_string();
                assert!(
                    m.starts_with("sink file: record of stream sequence 2 is "),
                    "{m}"
                );
                assert!(m.ends_with(" bytes, over max_record_bytes 1024"), "{m}");
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(out[2], WriteOutcome::Durable);
        let seqs: Vec<u64> = lines(&s, false)
            .iter()
            .map(|v| v["stream_sequence"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, vec![1, 3]);
    }

    #[test]
    fn key_prefix_holds_the_segments_and_a_vanished_directory_is_transient() {
        let s = Scratch::new();
        let mut c = cfg(&s);
        c.key_prefix = Some("stream/a".into());
        let first = sink(c);
        assert_eq!(first.write_batch(&batch(1, 1)), vec![WriteOutcome::Durable]);
        let files = s.files("out");
        assert_eq!(files.len(), 1);
        assert!(files[0].starts_with("stream/a/segment-"), "{files:?}");

        let s = Scratch::new();
        let mut c = cfg(&s);
        c.segment_max_age_seconds = 0;
        let second = sink(c);
        fs::remove_dir(s.path().join("out")).unwrap();
        match &second.write_batch(&batch(1, 1))[0] {
            WriteOutcome::Transient(e) => {
                let m = e.to_string();
                assert_eq!(
                    m,
                    "sink file: create segment in .: output directory is missing"
                );
            }
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn a_failed_append_is_transient_and_the_next_batch_gets_a_new_segment() {
        let s = Scratch::new();
        fs::create_dir(s.path().join("out")).unwrap();
        let jsonl = Jsonl::new(cfg(&s));
        // A segment on which every write fails with ENOSPC (and which cannot be truncated).
        jsonl.lock_state().current = Some(Segment {
            shared: Arc::new(SegmentFile {
                file: OpenOptions::new().append(true).open("/dev/full").unwrap(),
                rel: "segment-full.jsonl".into(),
                written: AtomicU64::new(0),
                poisoned: AtomicBool::new(false),
                synced: Mutex::new(0),
            }),
            opened: Instant::now(),
            len: 0,
        });
        let b = batch(1, 3);
        let out = jsonl.write_batch(&b);
        let expected = WriteOutcome::Transient(error(
            "append to segment-full.jsonl: No space left on device (os error 28)",
        ));
        assert_eq!(out, vec![expected; 3]);
        assert_eq!(jsonl.write_batch(&b), vec![WriteOutcome::Durable; 3]);
        let seqs: Vec<u64> = lines(&s, false)
            .iter()
            .map(|v| v["stream_sequence"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, vec![1, 2, 3], "retried batch in a fresh segment");
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        let s = Scratch::new();
        let sink = sink(cfg(&s));
        assert!(sink.write_batch(&[]).is_empty());
        assert!(s.files("out").is_empty());
    }
    #[test]
    fn writers_sharing_a_directory_never_share_a_segment() {
        // Two instances of one process share a pid, stamp and counter start, as runners in
        // containers (each pid 1) writing one volume do: exclusive creation keeps them apart.
        let s = Scratch::new();
        fs::create_dir_all(s.path().join("out")).unwrap();
        let (a, b) = (Jsonl::new(cfg(&s)), Jsonl::new(cfg(&s)));
        for i in 0..5 {
            assert_eq!(
                a.write_batch(&batch(1 + i * 10, 10)),
                vec![WriteOutcome::Durable; 10]
            );
            assert_eq!(
                b.write_batch(&batch(1001 + i * 10, 10)),
                vec![WriteOutcome::Durable; 10]
            );
        }
        let segments = read_all(&s, false);
        assert_eq!(segments.len(), 2, "one segment each");
        let mut all = Vec::new();
        for (name, bytes) in segments {
            let seqs: Vec<u64> = bytes
                .split(|c| *c == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    serde_json::from_slice::<Value>(l).unwrap()["stream_sequence"]
                        .as_u64()
                        .unwrap()
                })
                .collect();
            assert!(
                seqs.iter().all(|q| *q < 1000) || seqs.iter().all(|q| *q > 1000),
                "{name} holds lines of both writers"
            );
            all.extend(seqs);
        }
        all.sort_unstable();
        let expected: Vec<u64> = (1..=50).chain(1001..=1050).collect();
        assert_eq!(all, expected);
    }
}
