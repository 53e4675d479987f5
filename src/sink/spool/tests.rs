//! The spool on a real directory with a sink in memory: appends survive reopening, the drain
//! delivers in order and removes what it delivered, a torn tail is cut, damage quarantined,
//! a full spool refuses, a second opener is refused.

use std::sync::{Arc, Mutex};

use super::config::SpoolConfig;
use super::drain::{Drainer, Step};
use super::store::{AppendError, Spool};
use super::{dir, frame};
use crate::message::envelope::{normalize, Envelope, EnvelopeConfig, RawMessage};
use crate::metrics::Metrics;
use crate::sink::{Sink, SinkError, WriteOutcome};

pub(super) fn envelope(seq: u64) -> Envelope {
    let msg = RawMessage {
        stream: Arc::from("ORDERS"),
        consumer: Arc::from("svc"),
        published_unix_nanos: Some(1_700_000_000_000_000_000),
        ..RawMessage::sample("orders.eu", seq, &format!("{{\"n\":{seq}}}").into_bytes())
    };
    normalize(&msg, 1_700_000_000_000_000_001, &EnvelopeConfig::default()).0
}

pub(super) fn config(dir: &std::path::Path) -> SpoolConfig {
    SpoolConfig {
        dir: dir.join("spool"),
        max_bytes: 1 << 20,
        max_records: 10_000,
        after: std::time::Duration::ZERO,
        segment_bytes: 4096,
        drain_batch: 7,
        max_backoff: std::time::Duration::from_millis(10),
        encryption: None,
        allow_unencrypted: true,
    }
}

/// Keeps what it is given; fails transiently while `down`.
#[derive(Default)]
pub(super) struct Memory {
    pub(super) got: Mutex<Vec<u64>>,
    down: Mutex<bool>,
}

impl Sink for Memory {
    fn kind(&self) -> &'static str {
        "memory"
    }
    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        if *self.down.lock().unwrap() {
            let e = SinkError::new("memory", "down");
            return vec![WriteOutcome::Transient(e); batch.len()];
        }
        let mut got = self.got.lock().unwrap();
        got.extend(batch.iter().map(|e| e.stream_sequence));
        vec![WriteOutcome::Durable; batch.len()]
    }
    fn check(&self) -> Result<String, SinkError> {
        Ok(String::new())
    }
}

pub(super) fn open(cfg: &SpoolConfig) -> Arc<Spool> {
    Arc::new(Spool::open(cfg, Arc::new(Metrics::default())).unwrap())
}

pub(super) fn drain_all(spool: &Arc<Spool>, sink: &Arc<Memory>) {
    let mut d = Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()));
    d.run_until_empty(1).unwrap();
}

pub(super) fn segments(cfg: &SpoolConfig) -> Vec<String> {
    let fd = dir::open_dir(&cfg.dir, false).unwrap();
    let mut names = dir::names(&fd, &cfg.dir).unwrap();
    names.retain(|n| dir::segment_id(n).is_some());
    names
}

#[test]
fn appended_records_survive_reopening_and_drain_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let envs: Vec<Envelope> = (1..=100).map(envelope).collect();
    {
        let spool = open(&cfg);
        for chunk in envs.chunks(9) {
            spool.append(chunk).unwrap();
        }
        assert_eq!(spool.records(), 100);
    }
    let spool = open(&cfg);
    assert_eq!(spool.records(), 100);
    assert!(segments(&cfg).len() > 1, "small segments roll");
    let sink = Arc::new(Memory::default());
    // Half, then a "crash" (reopen): the rest continues where the position says.
    let mut d = Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()));
    for _ in 0..7 {
        d.step().unwrap();
    }
    drop(d);
    drop(spool);
    let spool = open(&cfg);
    drain_all(&spool, &sink);
    // The crash may repeat what was drained since the position was last fsynced (an
    // idempotent sink keeps one copy); nothing is lost or reordered.
    let got = sink.got.lock().unwrap().clone();
    let mut seen = std::collections::BTreeSet::new();
    let first: Vec<u64> = got.iter().copied().filter(|s| seen.insert(*s)).collect();
    assert_eq!(first, (1..=100).collect::<Vec<_>>());
    assert!(
        got.len() <= 100 + 7 * 7,
        "repeats at most what the crash left unsynced"
    );
    assert_eq!(spool.records(), 0);
    assert!(segments(&cfg).is_empty(), "drained segments are removed");
    let mode = std::fs::metadata(&cfg.dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o700);
}

#[test]
fn a_failing_sink_moves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let spool = open(&cfg);
    spool.append(&[envelope(1), envelope(2)]).unwrap();
    let sink = Arc::new(Memory::default());
    *sink.down.lock().unwrap() = true;
    let mut d = Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()));
    assert!(matches!(d.step().unwrap(), Step::Refused(_)));
    assert_eq!(spool.records(), 2);
    *sink.down.lock().unwrap() = false;
    assert_eq!(d.step().unwrap(), Step::Delivered(2));
    assert_eq!(*sink.got.lock().unwrap(), vec![1, 2]);
}

#[test]
fn a_torn_tail_is_cut_and_damage_quarantined() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.segment_bytes = 1 << 20;
    {
        let spool = open(&cfg);
        spool
            .append(&[envelope(1), envelope(2), envelope(3)])
            .unwrap();
    }
    let seg = cfg.dir.join(&segments(&cfg)[0]);
    let mut data = std::fs::read(&seg).unwrap();
    // Damage the second record's body, and add half a frame at the end (a torn append).
    let second = frame::items(&data, frame::HEADER_LEN)
        .nth(1)
        .map(|i| match i {
            frame::Item::Record { start, .. } => start,
            other => panic!("{other:?}"),
        })
        .unwrap();
    data[second + frame::FRAME_OVERHEAD + 20] ^= 0xff;
    let whole = data.len();
    data.extend_from_slice(&frame::MARK);
    data.extend_from_slice(&[9, 0, 0]);
    std::fs::write(&seg, &data).unwrap();

    let metrics = Arc::new(Metrics::default());
    let spool = Arc::new(Spool::open(&cfg, metrics.clone()).unwrap());
    assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, whole);
    assert_eq!(spool.records(), 2);
    assert_eq!(
        metrics
            .counters
            .spool_quarantined_total
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    assert_eq!(*sink.got.lock().unwrap(), vec![1, 3]);
    let q = dir::quarantine_name(0, 0);
    let names = std::fs::read_dir(&cfg.dir).unwrap().count();
    assert!(names >= 3, "{q}: lock, position and the quarantine file");
}

pub(super) fn quarantined(cfg: &SpoolConfig) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&cfg.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("quarantine-"))
        .map(|n| {
            let bytes = std::fs::read(cfg.dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect();
    out.sort();
    out
}

/// A flipped bit in the length of a segment's last record, so that it runs past the end of
/// the file: the record was whole and acknowledged, so it is quarantined and counted, never
/// cut off as a torn tail. A true torn append behind it is still cut (its bytes kept).
#[test]
fn a_damaged_length_in_the_last_record_is_quarantined_not_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.segment_bytes = 1 << 20;
    {
        let spool = open(&cfg);
        for seq in 1..=3 {
            spool.append(&[envelope(seq)]).unwrap();
        }
    }
    let seg = cfg.dir.join(&segments(&cfg)[0]);
    let mut data = std::fs::read(&seg).unwrap();
    let last = match frame::items(&data, frame::HEADER_LEN).last().unwrap() {
        frame::Item::Record { start, .. } => start,
        other => panic!("{other:?}"),
    };
    // Length + 65536: past the end of the file.
    data[last + 6] ^= 0x01;
    let damaged = data[last..].to_vec();
    let whole = data.len();
    let mut torn = Vec::new();
    frame::encode(&mut torn, b"a write the crash cut short");
    data.extend_from_slice(&torn[..20]);
    std::fs::write(&seg, &data).unwrap();

    let metrics = Arc::new(Metrics::default());
    let spool = Arc::new(Spool::open(&cfg, metrics.clone()).unwrap());
    assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, whole);
    assert_eq!(spool.records(), 2);
    let counted = &metrics.counters.spool_quarantined_total;
    assert_eq!(counted.load(std::sync::atomic::Ordering::Relaxed), 1);
    let q = quarantined(&cfg);
    assert_eq!(q.len(), 2, "the damaged record and the cut bytes: {q:?}");
    assert_eq!(q[0].1, damaged, "the whole damaged record kept");
    assert_eq!(q[1].1, torn[..20], "the torn bytes kept, not only cut");
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    assert_eq!(*sink.got.lock().unwrap(), vec![1, 2]);
}

/// Keeps what it is given but the sequences in `refuse`, which it refuses for good.
struct Refusing {
    got: Mutex<Vec<u64>>,
    refuse: Vec<u64>,
}

impl Sink for Refusing {
    fn kind(&self) -> &'static str {
        "refusing"
    }
    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        let mut got = self.got.lock().unwrap();
        batch
            .iter()
            .map(|e| {
                if self.refuse.contains(&e.stream_sequence) {
                    WriteOutcome::Permanent(SinkError::new("refusing", "not this one"))
                } else {
                    got.push(e.stream_sequence);
                    WriteOutcome::Durable
                }
            })
            .collect()
    }
    fn check(&self) -> Result<String, SinkError> {
        Ok(String::new())
    }
}

/// The spool's `rejected-*` files and their bytes.
fn rejected(cfg: &SpoolConfig) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&cfg.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("rejected-"))
        .map(|n| {
            let bytes = std::fs::read(cfg.dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect();
    out.sort();
    out
}

/// A crash between keeping a refused record and making the drain position durable: the
/// next drain starts at an older durable position, and its steps hold other records than the
/// crashed one did (here another `drain_batch`; in a runner also a read buffer that ended
/// elsewhere, or records appended during a step); the refused record is still kept once,
/// under one name.
#[test]
fn a_refused_record_kept_before_a_crash_is_kept_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.segment_bytes = 1 << 20;
    cfg.drain_batch = 3;
    let sink = Arc::new(Refusing {
        got: Mutex::new(Vec::new()),
        refuse: vec![5],
    });
    let spool = open(&cfg);
    let position = cfg.dir.join("position");
    let durable = std::fs::read(&position).unwrap();
    spool
        .append(&(1..=10).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let metrics = Arc::new(Metrics::default());
    let mut d = Drainer::new(spool.clone(), sink.clone(), metrics);
    assert_eq!(d.step().unwrap(), Step::Delivered(3));
    // The position cannot be written: the step keeps the refusal, then fails as a kill -9
    // before the position's fsync would leave it.
    std::fs::remove_file(&position).unwrap();
    std::fs::create_dir(&position).unwrap();
    assert!(d.step().is_err());
    assert_eq!(rejected(&cfg).len(), 1, "kept before the crash");
    drop(d);
    drop(spool);
    // After the crash the durable position is the one of the open (the 200 ms interval).
    std::fs::remove_dir(&position).unwrap();
    std::fs::write(&position, &durable).unwrap();

    cfg.drain_batch = 7;
    let spool = open(&cfg);
    let mut d = Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()));
    d.run_until_empty(1).unwrap();
    let kept = rejected(&cfg);
    assert_eq!(
        kept.len(),
        1,
        "one copy: {:?}",
        kept.iter().map(|k| &k.0).collect::<Vec<_>>()
    );
    let records: Vec<u64> = frame::items(&kept[0].1, 0)
        .map(|i| match i {
            frame::Item::Record { body, .. } => super::codec::decode(body).unwrap().stream_sequence,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(records, vec![5], "the refused record, once");
    let got: std::collections::BTreeSet<u64> = sink.got.lock().unwrap().iter().copied().collect();
    assert_eq!(got, [1, 2, 3, 4, 6, 7, 8, 9, 10].into_iter().collect());
    assert_eq!(spool.records(), 0);
}

/// A segment far larger than `segment_bytes` (five read windows), damaged in the middle:
/// recovery and the survey count every record and quarantine the damage holding at most two
/// windows of it, never the whole file.
#[test]
fn an_oversized_segment_is_read_a_window_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.segment_bytes = 1 << 20;
    {
        let spool = open(&cfg);
        spool
            .append(&(1..=100).map(envelope).collect::<Vec<_>>())
            .unwrap();
    }
    let seg = cfg.dir.join(&segments(&cfg)[0]);
    let data = std::fs::read(&seg).unwrap();
    let frames = &data[frame::HEADER_LEN..];
    let mut big = data[..frame::HEADER_LEN].to_vec();
    while big.len() < 20 << 20 {
        big.extend_from_slice(frames);
    }
    let copies = (big.len() - frame::HEADER_LEN) / frames.len();
    // One flipped body byte near the middle: one record lost, quarantined.
    let middle = frame::HEADER_LEN + copies / 2 * frames.len() + frame::FRAME_OVERHEAD + 30;
    big[middle] ^= 0x40;
    std::fs::write(&seg, &big).unwrap();

    super::scan::HELD.with(|h| h.set(0));
    let survey = super::scan::walk(&cfg.dir, |_| true).unwrap();
    assert_eq!(survey.records as usize, copies * 100 - 1);
    assert_eq!(survey.damaged, 1);
    let metrics = Arc::new(Metrics::default());
    let spool = Spool::open(&cfg, metrics.clone()).unwrap();
    assert_eq!(spool.records() as usize, copies * 100 - 1);
    let counted = &metrics.counters.spool_quarantined_total;
    assert_eq!(counted.load(std::sync::atomic::Ordering::Relaxed), 1);
    let held = super::scan::HELD.with(|h| h.get());
    assert!(
        held <= 8 << 20,
        "held {held} bytes of a {} byte segment",
        big.len()
    );
    assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, big.len());
}

/// Damage longer than the most the reader holds (the largest frame and a window): it comes
/// in pieces that cover it exactly, and the records after it are read.
#[test]
fn damage_longer_than_the_reader_holds_comes_in_pieces() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    {
        let spool = open(&cfg);
        spool
            .append(&(1..=3).map(envelope).collect::<Vec<_>>())
            .unwrap();
    }
    let seg = cfg.dir.join(&segments(&cfg)[0]);
    let data = std::fs::read(&seg).unwrap();
    let garbage = frame::MAX_BODY + (9 << 20);
    let mut big = data[..frame::HEADER_LEN].to_vec();
    big.resize(frame::HEADER_LEN + garbage, 0x5A);
    big.extend_from_slice(&data[frame::HEADER_LEN..]);
    std::fs::write(&seg, &big).unwrap();
    let survey = super::scan::walk(&cfg.dir, |_| true).unwrap();
    assert_eq!(survey.records, 3);
    assert!(survey.damaged >= 2, "{:?}", survey.damage);
    let mut at = frame::HEADER_LEN as u64;
    for d in &survey.damage {
        assert_eq!(d.offset, at, "{:?}", survey.damage);
        at += d.bytes;
    }
    assert_eq!(at as usize, frame::HEADER_LEN + garbage);
    // Recovery quarantines the same pieces; the drain meets them (kept already: not counted
    // twice), never holding the whole segment, and delivers the records after them.
    let spool = open(&cfg);
    assert_eq!(spool.records(), 3);
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    assert_eq!(*sink.got.lock().unwrap(), vec![1, 2, 3]);
    let pieces = quarantined(&cfg);
    assert_eq!(pieces.len() as u64, survey.damaged);
    let kept: usize = pieces.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(kept, garbage);
}

#[test]
fn a_full_spool_refuses_and_a_second_opener_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.max_records = 3;
    let spool = open(&cfg);
    spool.append(&[envelope(1), envelope(2)]).unwrap();
    assert!(matches!(
        spool.append(&[envelope(3), envelope(4)]),
        Err(AppendError::Full(_))
    ));
    let second = Spool::open(&cfg, Arc::new(Metrics::default()));
    let err = second.err().unwrap().to_string();
    assert!(err.contains("another process"), "{err}");
}

#[test]
fn a_link_in_place_of_the_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &cfg.dir).unwrap();
    let err = Spool::open(&cfg, Arc::new(Metrics::default()))
        .err()
        .unwrap();
    assert!(err.to_string().contains("symbolic link"), "{err}");
}

/// Every line a jsonl file sink holds, in file order.
fn jsonl_lines(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    names
        .iter()
        .flat_map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines().map(str::to_string).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_drain_into_jsonl_writes_what_the_sink_writes_directly() {
    use crate::sink::file::{FileSink, FileSinkConfig};
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let envs: Vec<Envelope> = (1..=40).map(envelope).collect();
    let jsonl = |name: &str| {
        let sink_cfg = FileSinkConfig {
            mode: crate::sink::file::config::FileMode::Jsonl,
            ..FileSinkConfig::new(tmp.path().join(name))
        };
        std::fs::create_dir_all(&sink_cfg.directory).unwrap();
        Arc::new(FileSink::new(sink_cfg, Arc::new(Metrics::default())).unwrap())
    };
    let direct = jsonl("direct");
    assert!(direct.takes_stored_records());
    assert!(direct.write_batch(&envs).iter().all(|o| o.is_durable()));

    let spool = open(&cfg);
    for chunk in envs.chunks(9) {
        spool.append(chunk).unwrap();
    }
    let drained = jsonl("drained");
    let mut d = Drainer::new(spool.clone(), drained, Arc::new(Metrics::default()));
    assert_eq!(d.run_until_empty(1).unwrap(), 40);
    assert_eq!(
        jsonl_lines(&tmp.path().join("drained")),
        jsonl_lines(&tmp.path().join("direct"))
    );
}

/// Records larger than the drain's read-ahead, and many small ones spanning several
/// refills, all arrive once and in order; damage the drain finds past a refill is
/// quarantined, the rest delivered.
#[test]
fn the_drain_reads_on_past_its_read_ahead() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = SpoolConfig {
        max_bytes: 64 << 20,
        segment_bytes: 32 << 20,
        drain_batch: 50,
        ..config(tmp.path())
    };
    let big = |seq: u64| {
        let msg = RawMessage {
            stream: Arc::from("ORDERS"),
            consumer: Arc::from("svc"),
            ..RawMessage::sample("orders.eu", seq, &vec![b'x'; 3 << 20])
        };
        normalize(&msg, 1, &EnvelopeConfig::default()).0
    };
    let mut envs: Vec<Envelope> = (1..=3000).map(envelope).collect();
    envs.insert(10, big(100_001));
    envs.insert(2500, big(100_002));
    envs.push(big(100_003));
    let metrics = Arc::new(Metrics::default());
    let spool = Arc::new(Spool::open(&cfg, metrics.clone()).unwrap());
    for chunk in envs.chunks(64) {
        spool.append(chunk).unwrap();
    }
    // Damage one record well past the first read-ahead after the spool was opened: only the
    // drain can find it.
    let seg = cfg.dir.join(&segments(&cfg)[0]);
    let mut data = std::fs::read(&seg).unwrap();
    let (damaged, at) = frame::items(&data, frame::HEADER_LEN)
        .enumerate()
        .find_map(|(i, item)| match item {
            frame::Item::Record { start, .. } if start > (5 << 20) => Some((i, start)),
            _ => None,
        })
        .unwrap();
    data[at + frame::FRAME_OVERHEAD + 20] ^= 0xff;
    std::fs::write(&seg, &data).unwrap();

    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    let mut want: Vec<u64> = envs.iter().map(|e| e.stream_sequence).collect();
    want.remove(damaged);
    assert_eq!(*sink.got.lock().unwrap(), want);
    let quarantined = &metrics.counters.spool_quarantined_total;
    assert_eq!(quarantined.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// A hard link planted at `position` or at a segment's name (by someone who could write the
/// directory before the runner made it 0700, on a host without `fs.protected_hardlinks`) is
/// refused with a clear error; the file it points at is never written.
#[test]
fn a_hard_link_planted_in_the_spool_is_refused_and_its_target_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let victim = tmp.path().join("victim");
    let original = b"the first bytes of another file of the service's user".to_vec();
    std::fs::write(&victim, &original).unwrap();
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&cfg.dir)
            .unwrap();
    }
    std::fs::hard_link(&victim, cfg.dir.join("position")).unwrap();
    let err = Spool::open(&cfg, Arc::new(Metrics::default()))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("position: has 2 hard links"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), original);

    std::fs::remove_file(cfg.dir.join("position")).unwrap();
    std::fs::hard_link(&victim, cfg.dir.join(dir::segment_name(1))).unwrap();
    let err = Spool::open(&cfg, Arc::new(Metrics::default()))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("has 2 hard links"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), original);
}

/// A record damaged while the spool is held (after its opening scan counted it): the drain
/// quarantines it and counts it dropped, so the count in memory reaches 0 with the disk, the
/// spool empties, and the fallback sink goes direct again.
#[test]
fn a_record_damaged_while_held_is_dropped_and_the_fallback_goes_direct() {
    use super::fallback::FallbackSink;
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let metrics = Arc::new(Metrics::default());
    let spool = Arc::new(Spool::open(&cfg, metrics.clone()).unwrap());
    spool
        .append(&(1..=10).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let seg = cfg.dir.join(&segments(&cfg)[0]);
    let mut data = std::fs::read(&seg).unwrap();
    let fifth = frame::items(&data, frame::HEADER_LEN)
        .nth(4)
        .map(|i| match i {
            frame::Item::Record { start, .. } => start,
            other => panic!("{other:?}"),
        })
        .unwrap();
    data[fifth + frame::FRAME_OVERHEAD + 20] ^= 0xff;
    std::fs::write(&seg, &data).unwrap();

    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    assert_eq!(*sink.got.lock().unwrap(), vec![1, 2, 3, 4, 6, 7, 8, 9, 10]);
    assert_eq!(spool.records(), 0, "the count follows the disk");
    let gauge = metrics
        .gauges
        .spool_records
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(gauge, 0);
    let quarantined = &metrics.counters.spool_quarantined_total;
    assert_eq!(quarantined.load(std::sync::atomic::Ordering::Relaxed), 1);

    let fallback = FallbackSink::new(sink.clone(), spool.clone(), metrics);
    assert_eq!(
        fallback.write_batch(&[envelope(11)]),
        vec![WriteOutcome::Durable]
    );
    assert_eq!(sink.got.lock().unwrap().last(), Some(&11), "direct again");
    assert_eq!(spool.records(), 0, "nothing spooled");
    // Behind a spooled record a batch is spooled too: `Spooled` (acknowledged, but the sink
    // workers do not tell custody checkpoints of it; the drain does once the sink holds it).
    spool.append(&[envelope(12)]).unwrap();
    assert_eq!(
        fallback.write_batch(&[envelope(13)]),
        vec![WriteOutcome::Spooled]
    );
    assert!(WriteOutcome::Spooled.is_durable());
}

/// A file at a kept name with other bytes (a quarantine or rejected file of an earlier
/// numbering of the segments, a planted directory) is never replaced: the new bytes go to the
/// next free `~k` name, and the same bytes again count as kept.
#[test]
fn keeping_never_replaces_a_file_with_other_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("spool");
    let fd = dir::open_dir(&path, true).unwrap();
    let name = dir::quarantine_name(1, 40);
    std::fs::write(path.join(&name), b"the only copy of an earlier record").unwrap();
    std::fs::create_dir(path.join("quarantine-0000000000000001-000000000040~1.bad")).unwrap();
    assert_eq!(
        dir::keep(&fd, &path, &name, b"new").unwrap(),
        (
            dir::Kept::New,
            "quarantine-0000000000000001-000000000040~2.bad".to_string()
        )
    );
    assert_eq!(
        std::fs::read(path.join(&name)).unwrap(),
        b"the only copy of an earlier record"
    );
    let second = path.join("quarantine-0000000000000001-000000000040~2.bad");
    assert_eq!(std::fs::read(&second).unwrap(), b"new");
    assert_eq!(
        dir::keep(&fd, &path, &name, b"new").unwrap(),
        (
            dir::Kept::Already,
            "quarantine-0000000000000001-000000000040~2.bad".to_string()
        )
    );
    assert!(!path
        .join("quarantine-0000000000000001-000000000040~3.bad")
        .exists());
}

/// A directory planted at a kept file's temporary name (another account's, in a shared spool
/// directory) used to fail every keep of that name, and so every later drain step: the next
/// temporary name is used, and the directory is left as it was.
#[test]
fn a_directory_at_the_temporary_name_does_not_stop_keeping() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("spool");
    let fd = dir::open_dir(&path, true).unwrap();
    let name = dir::quarantine_name(2, 80);
    let planted = path.join(format!(".{name}.tmp"));
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join("theirs"), b"x").unwrap();
    // A file a crash left at the next temporary name is removed and the name used.
    let leftover = path.join(".quarantine-0000000000000002-000000000080.bad~1.tmp");
    std::fs::write(&leftover, b"half").unwrap();
    assert_eq!(
        dir::keep(&fd, &path, &name, b"kept").unwrap(),
        (dir::Kept::New, name.clone())
    );
    assert_eq!(std::fs::read(path.join(&name)).unwrap(), b"kept");
    assert_eq!(std::fs::read(planted.join("theirs")).unwrap(), b"x");
    assert!(!leftover.exists());
}

/// A segment shortened on disk by something else while it is drained (found by the attack on
/// issue 43): each step says so as an error (counted by the runner's drain, which backs off)
/// instead of reporting "delivered 0" and spinning a core forever without a word.
#[test]
fn a_segment_shortened_under_the_drain_is_an_error_not_a_spin() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.segment_bytes = 64 << 20;
    cfg.max_bytes = 64 << 20;
    cfg.max_records = 100_000;
    cfg.drain_batch = 100;
    let spool = open(&cfg);
    let batch: Vec<Envelope> = (1..=20_000).map(envelope).collect();
    spool.append(&batch).unwrap();
    let sink = Arc::new(Memory::default());
    let mut d = Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()));
    assert_eq!(d.step().unwrap(), Step::Delivered(100));
    let name = segments(&cfg).into_iter().next().unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(cfg.dir.join(name))
        .unwrap();
    let len = file.metadata().unwrap().len();
    assert!(
        len > 3 << 20,
        "a segment longer than the reader's window: {len}"
    );
    file.set_len(3 << 20).unwrap();
    let mut errors = 0;
    for _ in 0..200 {
        match d.step() {
            Ok(Step::Delivered(n)) if n > 0 => {}
            Ok(other) => panic!("a shortened segment gave {other:?}"),
            Err(e) => {
                assert!(e.to_string().contains("shortened by something else"), "{e}");
                errors += 1;
                if errors == 3 {
                    break;
                }
            }
        }
    }
    assert_eq!(errors, 3, "no error after 200 steps");
    let delivered = sink.got.lock().unwrap().len();
    assert!(delivered < 20_000, "{delivered}");
}
