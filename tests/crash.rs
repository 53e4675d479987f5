//! The crash explorer (tests/support/crash) on each durable component: the file sink (`jsonl`,
//! `per_event`), the spool (appends with segment rollover, a drain with a record the sink
//! refuses for good, a first segment write that hit ENOSPC), and the metrics snapshot (a root
//! of every `svc run` workload). Power-loss states are read as the cut left them and then
//! started on: `svc spool drain` for a spool, `svc run` storing new messages beside what is
//! there for a file sink. The fast tier runs a sample of the crash points (the first
//! and the last of each class) and a bounded sample of power-loss states;
//! `scripts/crash-explore.sh` sets `SVC_CRASH_FULL=1` for all of them.
//!
//! Expected on a branch without the spool fixes of issue 43 (items 1 and 3):
//! `spool_drain_with_a_refused_record_survives_a_kill_at_every_call` and
//! `spool_after_enospc_survives_every_power_cut` fail, naming the call and the invariant. With
//! every point (`SVC_CRASH_FULL=1`), `spool_appends_survive_a_kill_at_every_call` and
//! `spool_fallback_survives_a_kill_at_every_call` also find the empty `position` a kill at its
//! first write leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::broker::NatsServer;
use crate::support::crash::explore::{self, Setup, Workload};
use crate::support::crash::power::{self, Recording};
use crate::support::crash::{position_whole, AckLog};
use crate::support::process::{svc, Runner};
use crate::support::receiver::Receiver;
use crate::support::{files_below, wait_until, write_config};

const CONSUMER: &str = "C";

/// Which component a `svc run` workload writes through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Jsonl,
    PerEvent,
    /// `sink.type: spool`, drained into a `per_event` file sink after the restart.
    Spool,
}

fn per_event(out: &Path, policy: &str) -> Value {
    // One writer thread: strace counts calls per thread, so every file's calls get a point.
    json!({"type": "file", "directory": out, "mode": "per_event", "write_concurrency": 1,
           "key_strategy": "stream_sequence", "duplicate_policy": policy})
}

/// A spool key file (32 bytes, base64, mode 0600) in `dir`.
fn spool_key(dir: &Path) -> Value {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("spool.key");
    std::fs::write(
        &path,
        base64::engine::general_purpose::STANDARD.encode([3u8; 32]),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    json!({"key_id": "crash", "key_file": path})
}

fn sink_for(kind: Kind, dir: &Path) -> Value {
    let out = dir.join("out");
    match kind {
        Kind::Jsonl => json!({"type": "file", "directory": out, "mode": "jsonl"}),
        Kind::PerEvent => per_event(&out, "skip_existing"),
        // Encrypted at rest: sealed records, each bound to the offset the append chose.
        Kind::Spool => json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 1 << 20,
                              "encryption": spool_key(dir),
                              "segment_bytes": 8192, "drain_batch": 20, "max_backoff_seconds": 1,
                              "target": per_event(&out, "skip_existing")}),
    }
}

fn run_config(server: &NatsServer, stream: &str, dir: &Path, sink: Value) -> PathBuf {
    let subject = format!("{}.>", stream.to_lowercase());
    let cfg = json!({
        "nats": {"url": server.url(), "stream": stream, "consumer": CONSUMER, "subject": subject},
        "delivery": {"batch_size": 20, "fetch_expiry_ms": 100, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 5,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": sink,
        "metrics": {"enabled": true, "snapshot_file": dir.join("state").join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    write_config(dir, "c.json", &cfg)
}

/// A new stream with its consumer and `n` messages; returns its name.
fn stream_with(server: &NatsServer, name: &str, n: usize) -> String {
    let subject = format!("{}.>", name.to_lowercase());
    server.create_stream(name, &[&subject]);
    server.create_consumer(name, CONSUMER, &subject, Duration::from_secs(1));
    let publish = format!("{}.created", name.to_lowercase());
    server.publish_n(name, &publish, n, |i| {
        format!("{{\"order\":{}}}", i + 1).into_bytes()
    });
    name.to_string()
}

/// Stream sequences stored below `out`, with how often: `per_event` files or `jsonl` lines.
/// A line or file that is not a whole record is reported.
fn stored(out: &Path) -> (BTreeMap<u64, usize>, Vec<String>) {
    let mut seqs = BTreeMap::new();
    let mut broken = Vec::new();
    for rel in files_below(out) {
        let name = rel.to_string_lossy().into_owned();
        if name.rsplit('/').next().is_some_and(|n| n.starts_with('.')) {
            continue;
        }
        let text = std::fs::read_to_string(out.join(&rel)).unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Value>(line).map(|v| v["stream_sequence"].as_u64()) {
                Ok(Some(s)) => *seqs.entry(s).or_insert(0) += 1,
                _ => broken.push(name.clone()),
            }
        }
    }
    (seqs, broken)
}

/// A short list of numbers for a message.
fn few(v: &[u64]) -> String {
    let shown: Vec<String> = v.iter().take(8).map(u64::to_string).collect();
    format!(
        "{} ({}{})",
        v.len(),
        shown.join(", "),
        if v.len() > 8 { ", ..." } else { "" }
    )
}

/// The stored copies against what must be there: `acked` at least once (exactly once when
/// `once`), and every one of `all` after recovery.
fn compare(
    seqs: &BTreeMap<u64, usize>,
    acked: &BTreeSet<u64>,
    all: u64,
    once: bool,
) -> Vec<String> {
    let mut v = Vec::new();
    let lost: Vec<u64> = acked
        .iter()
        .copied()
        .filter(|s| !seqs.contains_key(s))
        .collect();
    if !lost.is_empty() {
        v.push(format!(
            "ACKed before the crash, not stored after recovery: {}",
            few(&lost)
        ));
    }
    let missing: Vec<u64> = (1..=all)
        .filter(|s| !seqs.contains_key(s) && !acked.contains(s))
        .collect();
    if !missing.is_empty() {
        v.push(format!(
            "recovery did not finish the backlog: not stored {}",
            few(&missing)
        ));
    }
    let twice: Vec<u64> = seqs
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(&s, _)| s)
        .collect();
    if once && !twice.is_empty() {
        v.push(format!(
            "stored more than once (keys allow once): {}",
            few(&twice)
        ));
    }
    v
}

/// State files the kill left: the snapshot parses, the spool's position is whole.
fn state_files(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    let snap = dir.join("state").join("metrics.json");
    if let Ok(text) = std::fs::read_to_string(&snap) {
        if serde_json::from_str::<Value>(&text).is_err() {
            v.push("state file half-written: state/metrics.json does not parse".to_string());
        }
    }
    if let Ok(bytes) = std::fs::read(dir.join("spool").join("position")) {
        if !position_whole(&bytes) {
            v.push(format!(
                "state file half-written: spool/position ({} bytes)",
                bytes.len()
            ));
        }
    }
    v
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// `svc run` through one component, killed at every durable call; recovery restarts the
/// runner until the broker's backlog is empty (and drains the spool).
struct RunWorkload<'a> {
    server: &'a NatsServer,
    kind: Kind,
    messages: usize,
    runs: usize,
    stream: String,
    acks: Option<AckLog>,
}

impl<'a> RunWorkload<'a> {
    fn new(server: &'a NatsServer, kind: Kind, messages: usize) -> Self {
        RunWorkload {
            server,
            kind,
            messages,
            runs: 0,
            stream: String::new(),
            acks: None,
        }
    }

    fn floor(&self) -> u64 {
        self.server
            .try_consumer_state(&self.stream, CONSUMER)
            .map_or(0, |s| s.0)
    }

    /// Restarts the runner until every message is acknowledged; the problems seen.
    fn restart(&self, dir: &Path) -> Vec<String> {
        let n = self.messages as u64;
        restart_until(dir, &|| acked_all(self.server, &self.stream, n), &|| {
            format!("ack floor {} of {n}", self.floor())
        })
    }
}

/// The consumer's ack floor reached `n` and nothing awaits an ACK.
fn acked_all(server: &NatsServer, stream: &str, n: u64) -> bool {
    server
        .try_consumer_state(stream, CONSUMER)
        .is_some_and(|s| s.0 >= n && s.1 == 0)
}

/// Starts `svc run` on `dir/c.json` until `done` (30 s at most), then stops it; the problems
/// seen (`progress` says where it stood when it gave up).
fn restart_until(
    dir: &Path,
    done: &dyn Fn() -> bool,
    progress: &dyn Fn() -> String,
) -> Vec<String> {
    let mut runner = Runner::start(&dir.join("c.json"), &dir.join("restart.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut v = Vec::new();
    loop {
        if let Some(status) = runner.child.try_wait().unwrap() {
            v.push(format!(
                "a later start refused ({status}): {}",
                tail(&runner.log_text())
            ));
            return v;
        }
        if done() {
            break;
        }
        if Instant::now() >= deadline {
            v.push(format!(
                "the restart made no progress: {} after 30 s: {}",
                progress(),
                tail(&runner.log_text())
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    runner.signal("TERM");
    if runner.wait_timeout(Duration::from_secs(20)).is_none() {
        v.push("the restarted runner did not stop on SIGTERM".into());
    }
    v
}

impl Workload for RunWorkload<'_> {
    fn component(&self) -> String {
        match self.kind {
            Kind::Jsonl => "file sink jsonl".into(),
            Kind::PerEvent => "file sink per_event".into(),
            Kind::Spool => "spool (append, rollover, drain)".into(),
        }
    }

    fn prepare(&mut self, dir: &Path) -> Setup {
        self.runs += 1;
        let kind = format!("{:?}", self.kind).to_uppercase();
        self.stream = stream_with(self.server, &format!("{kind}{}", self.runs), self.messages);
        for d in ["out", "state"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let cfg = run_config(self.server, &self.stream, dir, sink_for(self.kind, dir));
        self.acks = Some(AckLog::start(
            &self.server.connect(),
            &self.stream,
            CONSUMER,
        ));
        let mut roots = vec![dir.join("out"), dir.join("state")];
        if self.kind == Kind::Spool {
            roots.push(dir.join("spool"));
        }
        Setup {
            args: vec![OsString::from("run"), cfg.into_os_string()],
            env: vec![("RUST_LOG".into(), "warn".into())],
            roots,
        }
    }

    fn complete(&self, _dir: &Path) -> bool {
        self.floor() >= self.messages as u64
    }

    fn check(&mut self, dir: &Path) -> Vec<String> {
        let acked = self
            .acks
            .as_mut()
            .expect("prepared")
            .acked(Duration::from_millis(300))
            .clone();
        let mut v = state_files(dir);
        v.extend(self.restart(dir));
        if self.kind == Kind::Spool {
            let (code, out, err) = svc(&["spool", "drain", dir.join("c.json").to_str().unwrap()]);
            if code != 0 {
                v.push(format!(
                    "the drain after the restart failed ({code}): {}",
                    tail(&(out + &err))
                ));
            }
        }
        let (seqs, broken) = stored(&dir.join("out"));
        if !broken.is_empty() {
            v.push(format!("half-written records after recovery in {broken:?}"));
        }
        v.extend(compare(
            &seqs,
            &acked,
            self.messages as u64,
            self.kind != Kind::Jsonl,
        ));
        v
    }
}

fn report(r: &explore::Report) {
    println!("{r}");
}

#[test]
fn file_sink_jsonl_survives_a_kill_at_every_call() {
    let server = NatsServer::start();
    let scratch = tempfile::tempdir().unwrap();
    let mut w = RunWorkload::new(&server, Kind::Jsonl, 60);
    let r = explore::explore(&mut w, scratch.path());
    report(&r);
    assert!(r.violations.is_empty(), "{r}");
    assert!(r.killed > 0, "no kill landed on the sink's files: {r}");
}

#[test]
fn file_sink_per_event_survives_a_kill_at_every_call() {
    let server = NatsServer::start();
    let scratch = tempfile::tempdir().unwrap();
    let mut w = RunWorkload::new(
        &server,
        Kind::PerEvent,
        if explore::full() { 60 } else { 40 },
    );
    let r = explore::explore(&mut w, scratch.path());
    report(&r);
    assert!(r.violations.is_empty(), "{r}");
    assert!(r.killed > 0, "no kill landed on the sink's files: {r}");
}

#[test]
fn spool_appends_survive_a_kill_at_every_call() {
    let server = NatsServer::start();
    let scratch = tempfile::tempdir().unwrap();
    let mut w = RunWorkload::new(&server, Kind::Spool, 100);
    let r = explore::explore(&mut w, scratch.path());
    report(&r);
    assert!(r.violations.is_empty(), "{r}");
    assert!(r.killed > 0, "no kill landed on the spool's files: {r}");
}

/// The record the drain's sink refuses for good: its file exists with other content.
const REFUSED: u64 = 25;
const SPOOLED: usize = 60;

/// `svc spool drain` over a spool of [`SPOOLED`] records (made once by a real runner) into a
/// `per_event` sink with `fail_existing`, where record [`REFUSED`]'s name is taken: the drain
/// keeps it in a `rejected-*` file. Recovery is one more `svc spool drain`.
struct DrainWorkload {
    template: PathBuf,
    /// The incarnation of the stream the records came from: part of their keys.
    incarnation: String,
    /// One byte flipped in the middle of the second segment (the drain quarantines its frame):
    /// the sequences still whole, which the drain must deliver.
    damaged: Option<BTreeSet<u64>>,
}

impl DrainWorkload {
    fn new(server: &NatsServer, dir: &Path) -> DrainWorkload {
        let stream = stream_with(server, "T", SPOOLED);
        let sink = json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 1 << 20,
                          "allow_unencrypted": true,
                          "segment_bytes": 8192, "target": per_event(&dir.join("out"), "skip_existing")});
        let cfg = run_config(server, &stream, dir, sink);
        std::fs::create_dir_all(dir.join("state")).unwrap();
        let mut runner = Runner::start(&cfg, &dir.join("template.log"));
        wait_until(Duration::from_secs(30), "every message spooled", || {
            server
                .try_consumer_state(&stream, CONSUMER)
                .is_some_and(|s| s.0 >= SPOOLED as u64)
        });
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(20)).expect("stops");
        DrainWorkload {
            template: dir.join("spool"),
            incarnation: server.incarnation(&stream),
            damaged: None,
        }
    }

    /// The same spool with one byte flipped in the middle of its second segment; what is still
    /// whole is read with `svc spool inspect` on a damaged copy.
    fn with_damage(mut self, dir: &Path) -> DrainWorkload {
        let probe = dir.join("probe");
        self.copy_spool(&probe.join("spool"), true);
        let cfg = Self::config(&probe);
        let (code, out, err) = svc(&["spool", "inspect", cfg.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        let whole: BTreeSet<u64> = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["stream_sequence"].as_u64())
            .collect();
        let lost = SPOOLED - whole.len();
        assert!(
            (1..=2).contains(&lost),
            "one flipped byte costs its record (a frame mark: two): {lost}"
        );
        self.damaged = Some(whole);
        self
    }

    /// A fresh copy of the template at `spool`, with the byte flipped when `damage`.
    fn copy_spool(&self, spool: &Path, damage: bool) {
        std::fs::create_dir_all(spool).unwrap();
        for rel in files_below(&self.template) {
            std::fs::copy(self.template.join(&rel), spool.join(&rel)).unwrap();
        }
        if !damage {
            return;
        }
        let mut segments: Vec<PathBuf> = files_below(spool)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "spool"))
            .collect();
        segments.sort();
        let segment = spool.join(&segments[1]);
        let mut data = std::fs::read(&segment).unwrap();
        let at = data.len() / 2;
        data[at] ^= 0x5a;
        std::fs::write(&segment, &data).unwrap();
    }

    fn config(dir: &Path) -> PathBuf {
        let sink = json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 1 << 20,
                          "allow_unencrypted": true,
                          "segment_bytes": 8192, "drain_batch": 10, "max_backoff_seconds": 0.1,
                          "target": per_event(&dir.join("out"), "skip_existing")});
        let cfg = json!({"nats": {"url": "nats://127.0.0.1:1", "stream": "T", "consumer": CONSUMER,
                                  "subject": "t.>"},
                         "sink": sink, "logging": {"level": "info"}});
        write_config(dir, "c.json", &cfg)
    }

    fn refused_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!(
            "out/stream-sequence/T/{}/{REFUSED}.json",
            self.incarnation
        ))
    }
}

impl Workload for DrainWorkload {
    fn component(&self) -> String {
        match self.damaged {
            None => "spool drain (a refused record, rejected file)".into(),
            Some(_) => "spool drain (a refused record, a damaged segment)".into(),
        }
    }

    fn prepare(&mut self, dir: &Path) -> Setup {
        let spool = dir.join("spool");
        self.copy_spool(&spool, self.damaged.is_some());
        let taken = self.refused_path(dir);
        std::fs::create_dir_all(taken.parent().unwrap()).unwrap();
        std::fs::write(&taken, "{\"not\":\"the record\"}\n").unwrap();
        let cfg = Self::config(dir);
        Setup {
            args: vec!["spool".into(), "drain".into(), cfg.into_os_string()],
            env: vec![("RUST_LOG".into(), "warn".into())],
            roots: vec![spool, dir.join("out")],
        }
    }

    fn complete(&self, _dir: &Path) -> bool {
        false
    }

    /// Every point of the sample: a point costs a fraction of a second here.
    fn fast_points(&self) -> usize {
        usize::MAX
    }

    fn check(&mut self, dir: &Path) -> Vec<String> {
        let mut v = state_files(dir);
        let (code, out, err) = svc(&["spool", "drain", dir.join("c.json").to_str().unwrap()]);
        if code != 0 {
            v.push(format!(
                "the restarted drain made no progress (exit {code}): {}",
                tail(&(out + &err))
            ));
        }
        let (mut seqs, _) = stored(&dir.join("out"));
        seqs.remove(&REFUSED);
        let whole = |s: &u64| self.damaged.as_ref().is_none_or(|w| w.contains(s));
        let all: BTreeSet<u64> = (1..=SPOOLED as u64)
            .filter(|s| *s != REFUSED && whole(s))
            .collect();
        v.extend(
            compare(&seqs, &all, SPOOLED as u64, true)
                .into_iter()
                .filter(|m| !m.starts_with("recovery")),
        );
        let spool = dir.join("spool");
        let quarantined = files_below(&spool)
            .iter()
            .any(|p| p.to_string_lossy().starts_with("quarantine-"));
        if self.damaged.is_some() && !quarantined {
            v.push("the damaged frame is not kept in a quarantine file".to_string());
        }
        let kept = files_below(&spool).iter().any(|p| {
            let name = p.to_string_lossy();
            name.starts_with("rejected-")
                && std::fs::read(spool.join(p)).is_ok_and(|b| {
                    String::from_utf8_lossy(&b).contains(&format!("\"stream_sequence\":{REFUSED}"))
                })
        });
        if !kept {
            v.push(format!(
                "the refused record {REFUSED} is neither delivered nor kept in a rejected file"
            ));
        }
        v
    }
}

/// Issue 43 item 1: a kill between the rejected file and the drain position stops the drain.
/// Fails until the spool fix is merged; names the call and the invariant.
#[test]
fn spool_drain_with_a_refused_record_survives_a_kill_at_every_call() {
    let server = NatsServer::start();
    let scratch = tempfile::tempdir().unwrap();
    let base = scratch.path().join("template");
    std::fs::create_dir_all(&base).unwrap();
    let mut w = DrainWorkload::new(&server, &base);
    let r = explore::explore(&mut w, &scratch.path().join("points"));
    report(&r);
    assert!(r.killed > 0, "no kill landed on the spool's files: {r}");
    assert!(r.violations.is_empty(), "{r}");
}

/// A drain that quarantines a damaged frame (and keeps a refused record) while a kill may land
/// on any of its calls: the quarantine file, the segment's removal and the position agree, and
/// every whole record is delivered once.
#[test]
fn spool_drain_over_a_damaged_segment_survives_a_kill_at_every_call() {
    let server = NatsServer::start();
    let scratch = tempfile::tempdir().unwrap();
    let base = scratch.path().join("template");
    std::fs::create_dir_all(&base).unwrap();
    let mut w = DrainWorkload::new(&server, &base).with_damage(scratch.path());
    let r = explore::explore(&mut w, &scratch.path().join("points"));
    report(&r);
    assert!(r.killed > 0, "no kill landed on the spool's files: {r}");
    assert!(r.violations.is_empty(), "{r}");
}

/// `svc spool drain` configuration for a spool at `spool` into a `per_event` sink at `out`.
fn drain_config(dir: &Path, spool: &Path, out: &Path) -> PathBuf {
    let sink = json!({"type": "spool", "dir": spool, "max_bytes": 1 << 20, "max_backoff_seconds": 1,
                      "allow_unencrypted": true,
                      "target": per_event(out, "skip_existing")});
    let cfg = json!({"nats": {"url": "nats://127.0.0.1:1", "stream": "W", "consumer": CONSUMER,
                              "subject": "w.>"},
                     "sink": sink, "logging": {"level": "info"}});
    write_config(dir, "drain.json", &cfg)
}

/// One recorded `svc run` into a spool (`sink.type: spool`) with the data of every call, and
/// what the roots held before it.
struct Recorded {
    trace: String,
    roots: Vec<String>,
    initial: BTreeMap<String, Option<Vec<u8>>>,
}

/// What a recorded run writes through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Recorder {
    /// `sink.type: spool` (appends).
    Spool,
    /// The same on a 1 MiB tmpfs filled up before the messages come: the first segment write
    /// meets ENOSPC, the filler is removed once it did, and the redelivered batches land in
    /// that same segment.
    SpoolFullDisk,
    Jsonl,
    PerEvent,
}

/// Records a run storing `n` messages through `what`.
fn record_run(server: &NatsServer, dir: &Path, n: usize, what: Recorder) -> Recorded {
    let full_disk = what == Recorder::SpoolFullDisk;
    let stream = stream_with(server, &format!("{what:?}").to_uppercase(), 0);
    let parent = dir.join("small");
    let _fs = full_disk.then(|| crate::spool::SmallFs::mount(&parent, "1m"));
    let spool = parent.join("spool");
    for d in [&spool, &dir.join("state"), &dir.join("out")] {
        std::fs::create_dir_all(d).unwrap();
    }
    let sink = match what {
        Recorder::Jsonl => sink_for(Kind::Jsonl, dir),
        Recorder::PerEvent => sink_for(Kind::PerEvent, dir),
        _ => json!({"type": "spool", "dir": spool, "max_bytes": 1 << 20, "segment_bytes": 65536,
                    "allow_unencrypted": true,
                    "target": per_event(&dir.join("out"), "skip_existing")}),
    };
    let cfg = run_config(server, &stream, dir, sink);
    let first = if matches!(what, Recorder::Jsonl | Recorder::PerEvent) {
        dir.join("out")
    } else {
        spool.clone()
    };
    let roots = vec![
        first.to_string_lossy().into_owned(),
        dir.join("state").to_string_lossy().into_owned(),
    ];
    let initial = power::snapshot(&roots);
    let trace_file = dir.join("strace.txt");
    let mut traced = record(dir, &trace_file, &cfg);
    // Started: the spool opened, or the first snapshot written.
    let ready = match what {
        Recorder::Jsonl | Recorder::PerEvent => dir.join("state").join("metrics.json"),
        _ => spool.join("position"),
    };
    wait_until(Duration::from_secs(30), "the runner started", || {
        ready.exists()
    });
    let filler = parent.join("filler");
    if full_disk {
        fill(&filler);
    }
    let subject = format!("{}.created", stream.to_lowercase());
    server.publish_n(&stream, &subject, n, |i| {
        format!("{{\"order\":{}}}", i + 1).into_bytes()
    });
    if full_disk {
        wait_until(Duration::from_secs(30), "an append meets ENOSPC", || {
            std::fs::read_to_string(&trace_file).is_ok_and(|t| t.contains("= -1 ENOSPC"))
        });
        std::fs::remove_file(&filler).unwrap();
    }
    wait_until(
        Duration::from_secs(60),
        "every message spooled and ACKed",
        || {
            server
                .try_consumer_state(&stream, CONSUMER)
                .is_some_and(|s| s.0 >= n as u64)
        },
    );
    explore::stop(&mut traced.0, "TERM");
    Recorded {
        trace: std::fs::read_to_string(&trace_file).unwrap(),
        roots,
        initial,
    }
}

/// `svc run <cfg>` under strace with every write's data and the socket writes (the ACKs).
fn record(dir: &Path, trace_file: &Path, cfg: &Path) -> explore::Traced {
    let calls = format!(
        "trace={},lseek,sendto,writev,sendmsg",
        crate::support::crash::trace::DURABLE.join(",")
    );
    explore::Traced(
        explore::strace(trace_file, None)
            .args(["-s", "4000000", "-x", "-e", &calls])
            .arg(env!("CARGO_BIN_EXE_svc"))
            .arg("run")
            .arg(cfg)
            .env("RUST_LOG", "info")
            .stdout(std::fs::File::create(dir.join("traced.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("strace.err")).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// Writes `path` until the file system is full.
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

/// Every power-loss state of a recorded run, each checked by `check` (the materialized
/// directory, the state): what was ACKed before the cut must be there.
fn explore_power(
    rec: &Recorded,
    base: &Path,
    scratch: &Path,
    component: &str,
    check: &dyn Fn(&Path, &power::State) -> Vec<String>,
) -> explore::Report {
    let started = Instant::now();
    let recording = Recording::parse(&rec.trace, &rec.roots, rec.initial.clone());
    let limit = if explore::full() { 5000 } else { 80 };
    let states = recording.states(limit);
    let mut violations = Vec::new();
    for (k, st) in states.iter().enumerate() {
        let dest = scratch.join(format!("state-{k}"));
        power::materialize(st, base, &dest);
        violations.extend(
            check(&dest, st)
                .into_iter()
                .map(|m| format!("{}: {m}", st.label)),
        );
        violations.extend(
            state_files(&dest)
                .into_iter()
                .map(|m| format!("{}: {m}", st.label)),
        );
        let _ = std::fs::remove_dir_all(&dest);
    }
    explore::Report {
        component: component.into(),
        points: recording.len(),
        explored: states.len(),
        killed: 0,
        violations,
        elapsed: started.elapsed(),
    }
}

/// A spool state, drained by `svc spool drain` into a fresh `per_event` sink.
fn drained(dest: &Path, st: &power::State) -> Vec<String> {
    let spool = dest.join("small/spool");
    std::fs::create_dir_all(&spool).unwrap();
    let out = dest.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let cfg = drain_config(dest, &spool, &out);
    let mut v = Vec::new();
    let (code, o, e) = svc(&["spool", "drain", cfg.to_str().unwrap()]);
    if code != 0 {
        v.push(format!(
            "a later start refused the state (exit {code}): {}",
            tail(&(o + &e))
        ));
    }
    let (seqs, _) = stored(&out);
    let lost: Vec<u64> = st
        .acked
        .iter()
        .copied()
        .filter(|s| !seqs.contains_key(s))
        .collect();
    if !lost.is_empty() {
        v.push(format!(
            "ACKed before the cut, not in the spool after restart: {}",
            few(&lost)
        ));
    }
    v
}

/// A file sink state, read as it is (and then started on: [`restarted_on`]): every record
/// ACKed before the cut whole under `out`; a
/// record file that does not parse only as a `jsonl` segment's torn last line (never ACKed,
/// docs/sinks/file.md), never under a `per_event` final name.
fn stored_whole(dest: &Path, st: &power::State, jsonl: bool) -> Vec<String> {
    let out = dest.join("out");
    let (seqs, _) = stored(&out);
    let mut v = Vec::new();
    let lost: Vec<u64> = st
        .acked
        .iter()
        .copied()
        .filter(|s| !seqs.contains_key(s))
        .collect();
    if !lost.is_empty() {
        v.push(format!("ACKed before the cut, not stored: {}", few(&lost)));
    }
    for rel in files_below(&out) {
        if rel
            .to_string_lossy()
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with('.'))
        {
            continue;
        }
        let text = String::from_utf8_lossy(&std::fs::read(out.join(&rel)).unwrap()).into_owned();
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let bad = lines.iter().enumerate().find(|(i, l)| {
            let torn_tail = jsonl && *i + 1 == lines.len() && !l.ends_with('\n');
            !torn_tail && serde_json::from_str::<Value>(l.trim()).is_err()
        });
        if let Some((i, _)) = bad {
            v.push(format!(
                "half-written record in out/{} (line {})",
                rel.display(),
                i + 1
            ));
        }
    }
    v
}

/// `svc run` started on a file sink's power-loss state: it must take the state as it is and
/// store new messages beside what is there (three, on a stream of their own), and stop
/// cleanly. Every state with `SVC_CRASH_FULL=1`, every 10th in the fast tier.
fn restarted_on(server: &NatsServer, dest: &Path, kind: Kind, k: usize) -> Vec<String> {
    if !explore::full() && k % 10 != 0 {
        return Vec::new();
    }
    let stream = stream_with(server, &format!("AFTER{kind:?}{k}").to_uppercase(), 3);
    std::fs::create_dir_all(dest.join("state")).unwrap();
    run_config(server, &stream, dest, sink_for(kind, dest));
    restart_until(dest, &|| acked_all(server, &stream, 3), &|| {
        format!("new messages not stored on the state ({stream})")
    })
}

/// Records a run through `what` and explores its power-loss states.
fn power_run(what: Recorder, n: usize) -> explore::Report {
    let server = NatsServer::start();
    let scratch = tempfile::tempdir().unwrap();
    let base = scratch.path().join("run");
    std::fs::create_dir_all(&base).unwrap();
    let rec = record_run(&server, &base, n, what);
    if what == Recorder::SpoolFullDisk {
        assert!(
            rec.trace.contains("= -1 ENOSPC"),
            "the first segment write met no ENOSPC"
        );
    }
    let states = scratch.path().join("states");
    let component = format!("power loss {what:?}");
    let r = match what {
        Recorder::Spool | Recorder::SpoolFullDisk => {
            explore_power(&rec, &base, &states, &component, &drained)
        }
        Recorder::Jsonl | Recorder::PerEvent => {
            let (kind, jsonl) = match what {
                Recorder::Jsonl => (Kind::Jsonl, true),
                _ => (Kind::PerEvent, false),
            };
            let k = std::cell::Cell::new(0);
            explore_power(&rec, &base, &states, &component, &|d, st| {
                // Read as the cut left it, then started on.
                let mut v = stored_whole(d, st, jsonl);
                k.set(k.get() + 1);
                v.extend(restarted_on(&server, d, kind, k.get() - 1));
                v
            })
        }
    };
    report(&r);
    r
}

#[test]
fn file_sink_jsonl_survives_every_power_cut() {
    let r = power_run(Recorder::Jsonl, 100);
    assert!(r.explored > 10 && r.violations.is_empty(), "{r}");
}

#[test]
fn file_sink_per_event_survives_every_power_cut() {
    let r = power_run(Recorder::PerEvent, 30);
    assert!(r.explored > 10 && r.violations.is_empty(), "{r}");
}

#[test]
fn spool_appends_survive_every_power_cut() {
    let r = power_run(Recorder::Spool, 100);
    assert!(r.explored > 10 && r.violations.is_empty(), "{r}");
}

/// Issue 43 item 3: a segment whose first write hit ENOSPC is used, and its records ACKed,
/// without its directory entry ever fsynced. Fails until the spool fix is merged.
#[test]
fn spool_after_enospc_survives_every_power_cut() {
    let r = power_run(Recorder::SpoolFullDisk, 40);
    assert!(r.violations.is_empty(), "{r}");
}

/// A fallback spool beside the HTTP sink: the receiver is down, so every batch is spooled and
/// ACKed (the switch); once all are, the receiver comes up and the runner drains the spool
/// into it. Recovery restarts the runner until the receiver holds every message (at least
/// once: the HTTP sink has no key).
struct FallbackWorkload<'a> {
    server: &'a NatsServer,
    messages: usize,
    runs: usize,
    stream: String,
    acks: Option<AckLog>,
    receiver: std::cell::RefCell<Option<Receiver>>,
    receiving: std::cell::Cell<bool>,
}

impl FallbackWorkload<'_> {
    fn delivered(&self) -> BTreeMap<u64, usize> {
        let mut seqs = BTreeMap::new();
        if let Some(r) = self.receiver.borrow().as_ref() {
            for rec in r.records(200) {
                if let Some(s) = rec["stream_sequence"].as_u64() {
                    *seqs.entry(s).or_insert(0) += 1;
                }
            }
        }
        seqs
    }

    fn receive(&self) {
        if !self.receiving.replace(true) {
            if let Some(r) = self.receiver.borrow_mut().as_mut() {
                r.launch();
            }
        }
    }
}

impl Workload for FallbackWorkload<'_> {
    fn component(&self) -> String {
        "spool fallback (switch, drain, segment removal)".into()
    }

    fn prepare(&mut self, dir: &Path) -> Setup {
        self.runs += 1;
        self.stream = stream_with(
            self.server,
            &format!("FALLBACK{}", self.runs),
            self.messages,
        );
        std::fs::create_dir_all(dir.join("state")).unwrap();
        let mut receiver = Receiver::start(dir, &[]);
        receiver.kill();
        let sink = json!({"type": "http", "url": receiver.url(), "allow_http_for_local_testing": true,
                          "request_timeout_seconds": 2, "retry_backoff_ms": 50,
                          "retry_max_backoff_ms": 100, "retry_budget_seconds": 1,
                          "max_concurrent_requests": 1});
        *self.receiver.borrow_mut() = Some(receiver);
        self.receiving.set(false);
        let cfg = run_config(self.server, &self.stream, dir, sink);
        let mut value: Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        value["spool"] = json!({"dir": dir.join("spool"), "max_bytes": 1 << 20, "after_seconds": 0,
                                "allow_unencrypted": true,
                                "segment_bytes": 8192, "drain_batch": 20, "max_backoff_seconds": 0.2});
        let cfg = write_config(dir, "c.json", &value);
        self.acks = Some(AckLog::start(
            &self.server.connect(),
            &self.stream,
            CONSUMER,
        ));
        Setup {
            args: vec![OsString::from("run"), cfg.into_os_string()],
            env: vec![("RUST_LOG".into(), "warn".into())],
            roots: vec![dir.join("spool"), dir.join("state")],
        }
    }

    fn complete(&self, _dir: &Path) -> bool {
        if !self.receiving.get() {
            if acked_all(self.server, &self.stream, self.messages as u64) {
                self.receive();
            }
            return false;
        }
        self.delivered().len() >= self.messages
    }

    fn check(&mut self, dir: &Path) -> Vec<String> {
        let acked = self
            .acks
            .as_mut()
            .expect("prepared")
            .acked(Duration::from_millis(300))
            .clone();
        let mut v = state_files(dir);
        self.receive();
        let n = self.messages as u64;
        v.extend(restart_until(
            dir,
            &|| acked_all(self.server, &self.stream, n) && self.delivered().len() as u64 >= n,
            &|| format!("{} of {n} delivered", self.delivered().len()),
        ));
        v.extend(compare(&self.delivered(), &acked, n, false));
        if let Some(mut r) = self.receiver.borrow_mut().take() {
            r.kill();
        }
        v
    }
}

#[test]
fn spool_fallback_survives_a_kill_at_every_call() {
    let server = NatsServer::start();
    let scratch = tempfile::tempdir().unwrap();
    let mut w = FallbackWorkload {
        server: &server,
        messages: 60,
        runs: 0,
        stream: String::new(),
        acks: None,
        receiver: Default::default(),
        receiving: Default::default(),
    };
    let r = explore::explore(&mut w, scratch.path());
    report(&r);
    assert!(r.killed > 0, "no kill landed on the spool's files: {r}");
    assert!(r.violations.is_empty(), "{r}");
}
