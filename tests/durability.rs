//! Durability when the disk says no: `fsync`/`fdatasync` failures injected into a running
//! `svc run` (real nats-server, file sink) for a window, and a window of a full disk (write
//! failures), in both file modes.
//!
//! The failures come from strace's fault injection (`strace -f -p PID -e inject=fsync:error=EIO
//! -e inject=fdatasync:error=EIO`): strace attaches to every thread of the running runner (and
//! follows the short-lived `svc-file-N` threads it spawns), makes every targeted call return
//! EIO without running it, and detaches when interrupted, after which the same process sees a
//! healthy disk again. No test-only code path in `svc`: the runner cannot tell the injected
//! EIO from a failing device. The trace strace writes is the positive control that the
//! failures really reached the runner (`(INJECTED)` lines).
//!
//! What is proven, per mode:
//! - nothing published during the window is acknowledged while every sync fails (the broker's
//!   consumer state: ack floor unchanged, every window message still pending or undelivered),
//!   although the runner fetched and tried them (failures in its log, injected calls in the
//!   trace);
//! - per_event: no final name of a window message appears while its fsync fails (only
//!   dot-named temporary files, removed again); a second test fails every other fsync and
//!   checks in the trace that every `link`/`rename` to a final name follows a successful
//!   fsync of that temporary file, and that every `+ACK` the runner sends to the broker
//!   follows the link of that message's final name and a later successful fsync of its
//!   directory (so an ACK never covers a failed fsync);
//! - jsonl: with every other `fdatasync` failing, every `+ACK` in the trace follows a write of
//!   that message's line and then a successful `fdatasync` of the segment entered after the
//!   write, with no failed one in between;
//! - the log names the failure with the OS error's Display text, never a Debug dump;
//! - once strace detaches, the same runner process writes and acknowledges everything, and
//!   every acknowledged sequence has a complete record on disk.
//!
//! Write failures: strace cannot limit an injected `write` error to the sink's files (the
//! runner's broker socket and log use `write` too), so the disk-full tests mount a 4 MiB tmpfs
//! as the output directory and fill it (real ENOSPC from the kernel), then free it; the same
//! properties are checked (see [`SmallFs`]). Mounting needs root, as ptrace of a non-child
//! does: the test machine runs the suite as root.
//!
//! jsonl by design appends a batch to its segment before the `fdatasync` (docs/sinks/file.md,
//! "Durability"): a batch whose sync failed stays in the poisoned segment as whole lines
//! and is never acknowledged; its redelivery lands in a later segment (at-least-once). So for
//! jsonl the test proves whole lines only and no ACK, not the absence of unsynced lines.
//!
//! Needs strace (Debian package strace, installed by scripts/deps.sh) and ptrace permission
//! (root or CAP_SYS_PTRACE, or `kernel.yama.ptrace_scope` 0: strace is the runner's sibling,
//! not its parent): an attach failure fails the test with strace's own message.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";
const EIO_TEXT: &str = "Input/output error (os error 5)";
const ENOSPC_TEXT: &str = "No space left on device (os error 28)";

fn config(server: &NatsServer, dir: &Path, out: &Path, sink: Value) -> Value {
    let mut sink_block = json!({"type": "file", "directory": out});
    if let (Value::Object(base), Value::Object(extra)) = (&mut sink_block, sink) {
        base.extend(extra);
    }
    json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": SUBJECT},
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "sink_workers": 2, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": sink_block,
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    })
}

/// strace attached to a running process, injecting EIO into the given calls until dropped or
/// [`Injector::detach`]ed. Also the spool's tests' tracer (tests/spool.rs).
pub(crate) struct Injector {
    child: Option<Child>,
    target: u32,
    trace: PathBuf,
    stderr: PathBuf,
}

impl Injector {
    /// Attaches to every thread of `pid`; `inject` are strace `-e inject=` specs, `trace` the
    /// calls written to the trace file. Returns once every thread is traced.
    pub(crate) fn attach(pid: u32, dir: &Path, trace: &str, inject: &[&str]) -> Injector {
        let trace_file = dir.join("strace.txt");
        let stderr_file = dir.join("strace.err");
        let mut cmd = Command::new("strace");
        cmd.args(["-f", "-y", "-s", "65536", "-p", &pid.to_string(), "-o"])
            .arg(&trace_file)
            .arg("-e")
            .arg(format!("trace={trace}"));
        for spec in inject {
            cmd.arg("-e").arg(format!("inject={spec}"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_file).unwrap())
            .spawn()
            .expect("strace (Debian package strace, installed by scripts/deps.sh)");
        let mut inj = Injector {
            child: Some(child),
            target: pid,
            trace: trace_file,
            stderr: stderr_file,
        };
        let tracer = inj.child.as_ref().unwrap().id();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = inj.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "strace exited ({status}) before attaching: {}",
                    std::fs::read_to_string(&inj.stderr).unwrap_or_default()
                );
            }
            let tracers = tracer_pids(pid);
            if !tracers.is_empty() && tracers.iter().all(|t| *t == tracer) {
                return inj;
            }
            assert!(
                Instant::now() < deadline,
                "strace did not attach to every thread: {tracers:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The trace so far.
    pub(crate) fn trace_text(&self) -> String {
        std::fs::read_to_string(&self.trace).unwrap_or_default()
    }

    fn injected(&self) -> usize {
        self.trace_text().matches("(INJECTED)").count()
    }

    /// Stops injecting: strace detaches on SIGINT and exits; the process runs on untraced.
    pub(crate) fn detach(&mut self) {
        let mut child = self.child.take().expect("attached");
        let sent = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill (Debian package procps)");
        assert!(sent.success(), "kill -INT strace: {sent}");
        child.wait().unwrap();
        wait_until(Duration::from_secs(30), "every thread detached", || {
            tracer_pids(self.target).iter().all(|t| *t == 0)
        });
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `TracerPid` of every thread of `pid`.
fn tracer_pids(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

fn publish(server: &NatsServer, first: usize, n: usize) {
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{}}}", first + i).into_bytes()
    });
}

fn all_acked(server: &NatsServer, n: u64) -> bool {
    server.try_consumer_state(STREAM, CONSUMER) == Some((n, 0, 0))
}

/// per_event: stream sequence -> record, for every final (not dot-named) file; each must be
/// one complete JSON record.
fn per_event_records(out: &Path) -> BTreeMap<u64, Value> {
    let mut records = BTreeMap::new();
    for p in files_below(out) {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') {
            assert!(name.starts_with(".svc-tmp-"), "{}", p.display());
            continue;
        }
        let bytes = std::fs::read(out.join(&p)).unwrap();
        let v: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{} is not a complete record: {e}", p.display()));
        let seq = v["stream_sequence"].as_u64().unwrap();
        assert!(records.insert(seq, v).is_none(), "sequence {seq} twice");
    }
    records
}

/// jsonl: every sequence found in the segments; every line must be one complete record.
fn jsonl_sequences(out: &Path) -> BTreeSet<u64> {
    let mut seqs = BTreeSet::new();
    for p in files_below(out) {
        // Read while the runner runs: a segment it removed since the listing (an empty one
        // whose first append failed) holds nothing.
        let bytes = match std::fs::read(out.join(&p)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            read => read.unwrap(),
        };
        if bytes.is_empty() {
            continue;
        }
        assert_eq!(
            bytes.last(),
            Some(&b'\n'),
            "{} ends in a whole line",
            p.display()
        );
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: Value = serde_json::from_slice(line)
                .unwrap_or_else(|e| panic!("{}: incomplete line: {e}", p.display()));
            seqs.insert(v["stream_sequence"].as_u64().unwrap());
        }
    }
    seqs
}

/// The log names the failure with the error's Display text and shows no Debug dump of it.
fn assert_failure_logged(log: &str, text: &str) {
    let line = log
        .lines()
        .find(|l| l.contains("sink file: ") && l.contains(text))
        .unwrap_or_else(|| panic!("no sink failure with {text:?} in the log:\n{log}"));
    assert!(line.contains("writes in batch"), "{line}");
    for debug in ["Os {", "kind: ", "Custom {"] {
        assert!(
            !log.contains(debug),
            "Debug output {debug:?} in the log:\n{log}"
        );
    }
}

/// What goes wrong during the window.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// Every fsync and fdatasync of the runner fails with EIO (strace injection).
    SyncFails,
    /// The sink's file system is full: writes fail with ENOSPC (a filled tmpfs).
    DiskFull,
}

/// One window of `fault` in `mode`, then recovery in the same process.
fn window(sink: Value, jsonl: bool, fault: Fault) {
    let (before, during) = (40usize, 120usize);
    let server = NatsServer::start();
    server.create_stream(STREAM, &[SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    // Declared before the runner: dropped (unmounted) after it has been killed.
    let fs = (fault == Fault::DiskFull).then(|| SmallFs::mount(&dir.path().join("mnt")));
    let out = match &fs {
        Some(fs) => fs.path.join("out"),
        None => dir.path().join("out"),
    };
    let (text, what) = match fault {
        Fault::SyncFails => (EIO_TEXT, "every sync failed"),
        Fault::DiskFull => (ENOSPC_TEXT, "the disk was full"),
    };
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), &out, sink),
    );
    publish(&server, 0, before);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(60), "the first messages acked", || {
        all_acked(&server, before as u64)
    });

    let mut inj = match fault {
        Fault::SyncFails => Some(Injector::attach(
            runner.child.id(),
            dir.path(),
            "fsync,fdatasync",
            &["fsync:error=EIO", "fdatasync:error=EIO"],
        )),
        Fault::DiskFull => {
            fs.as_ref().unwrap().fill();
            None
        }
    };
    publish(&server, before, during);
    // Positive control: the runner fetched the window's messages and its writes failed, more
    // than once (NAK, redelivery, failing again), so "nothing acked" below is not slowness.
    // (The wait also ends as soon as anything of the window is acknowledged, so a runner that
    // ignored the failures fails on the assertions below, not on this wait.)
    wait_until(Duration::from_secs(60), "failed writes, retried", || {
        let (floor, pending, undelivered) = server.consumer_state(STREAM, CONSUMER);
        let acked_some = floor > before as u64 || pending as u64 + undelivered < during as u64;
        let failures = runner
            .log_text()
            .lines()
            .filter(|l| l.contains("writes in batch") && l.contains(text))
            .count();
        let injected = inj.as_ref().map_or(usize::MAX, Injector::injected);
        undelivered == 0 && injected >= 4 && (failures >= 3 || acked_some)
    });
    assert!(runner.child.try_wait().unwrap().is_none(), "runner alive");
    // No ACK of anything published in the window that is not written: every window message
    // is still pending or undelivered (an out-of-order ACK would lower that sum), or in the
    // file. Acks are never taken back, so this one look covers the whole window so far.
    let (floor, pending, undelivered) = server.consumer_state(STREAM, CONSUMER);
    let acked_in_window = during as u64 - (pending as u64 + undelivered);
    if jsonl {
        let seqs = jsonl_sequences(&out);
        assert!((1..=before as u64).all(|s| seqs.contains(&s)));
        // A full tmpfs still takes an append that fits in the free part of the open segment's
        // last page (no new page needed): such a batch is written and synced, and may be
        // acknowledged (seen on nats-server 2.15.1: 4 of 120). Every window message
        // acknowledged must be in the file; while syncs fail, none may be acknowledged.
        let written_in_window = seqs.iter().filter(|s| **s > before as u64).count() as u64;
        if acked_in_window > 0 {
            eprintln!("{acked_in_window} acknowledged, {written_in_window} written while {what}");
        }
        assert!(
            fault == Fault::DiskFull || (acked_in_window == 0 && floor == before as u64),
            "{acked_in_window} messages acknowledged while {what}"
        );
        assert!(
            acked_in_window <= written_in_window,
            "{acked_in_window} messages acknowledged while {what}, {written_in_window} written"
        );
        assert!(
            (before as u64 + 1..=floor).all(|s| seqs.contains(&s)),
            "the ack floor passed a message that is not written while {what}"
        );
    } else {
        assert_eq!(floor, before as u64, "ack floor moved while {what}");
        assert_eq!(
            acked_in_window, 0,
            "a message was acknowledged while {what}"
        );
        let seqs: Vec<u64> = per_event_records(&out).into_keys().collect();
        assert_eq!(
            seqs,
            (1..=before as u64).collect::<Vec<_>>(),
            "a final name appeared while {what}"
        );
    }
    assert_failure_logged(&runner.log_text(), text);
    if jsonl {
        // The path under test was taken: a batch meant for the open segment failed there
        // (its sync, or its append, which is cut back to whole lines).
        let prefix = match fault {
            Fault::SyncFails => "sink file: sync segment-",
            Fault::DiskFull => "sink file: append to segment-",
        };
        let log = runner.log_text();
        assert!(
            log.lines().any(|l| l.contains(prefix) && l.contains(text)),
            "no {prefix:?} failure in the log:\n{log}"
        );
    }

    // The disk recovers: the same process writes and acknowledges everything.
    match (&mut inj, &fs) {
        (Some(inj), _) => inj.detach(),
        (None, Some(fs)) => fs.free(),
        (None, None) => unreachable!("a fault was set up"),
    }
    let total = (before + during) as u64;
    wait_until(
        Duration::from_secs(120),
        "everything acked after the window",
        || all_acked(&server, total),
    );
    if jsonl {
        let seqs = jsonl_sequences(&out);
        assert_eq!(seqs, (1..=total).collect::<BTreeSet<_>>());
        // A segment whose creation could not be synced is removed again, not left empty (one
        // per retry during the window: 90 of 91 segments were empty before that was fixed).
        let empty: Vec<_> = files_below(&out)
            .into_iter()
            .filter(|p| std::fs::metadata(out.join(p)).unwrap().len() == 0)
            .collect();
        assert!(empty.is_empty(), "empty segments left: {empty:?}");
    } else {
        let records = per_event_records(&out);
        assert_eq!(
            records.keys().copied().collect::<Vec<_>>(),
            (1..=total).collect::<Vec<_>>()
        );
        for (seq, v) in &records {
            assert_eq!(v["payload"]["order"], json!(seq - 1), "record of {seq}");
        }
        let temps: Vec<_> = files_below(&out)
            .into_iter()
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        assert!(temps.is_empty(), "temporary files left: {temps:?}");
    }
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(30))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{}", runner.log_text());
}

#[test]
fn per_event_acks_nothing_while_fsync_fails_and_recovers_in_the_same_process() {
    window(json!({}), false, Fault::SyncFails);
}

#[test]
fn jsonl_acks_nothing_while_fdatasync_fails_and_recovers_in_the_same_process() {
    // Segments large enough that the window's first batch goes to the open segment and meets
    // the failing fdatasync (later ones fail earlier, at the new segment's fsync).
    window(json!({"mode": "jsonl"}), true, Fault::SyncFails);
}

#[test]
fn per_event_acks_nothing_while_the_disk_is_full_and_recovers_when_space_returns() {
    window(json!({}), false, Fault::DiskFull);
}

#[test]
fn jsonl_acks_nothing_while_the_disk_is_full_and_recovers_when_space_returns() {
    window(json!({"mode": "jsonl"}), true, Fault::DiskFull);
}

/// A 4 MiB tmpfs mounted for one test: a real file system that runs out of space on demand
/// (ENOSPC from the kernel, on every write path the sink uses). tmpfs rather than a loop-mounted
/// ext4 image: no image file on a tight disk, no loop device shared with other processes, and
/// this window is about failing writes, not fsync (whose failures the strace tests inject).
/// Mounting needs root, which the test machine gives; a mount failure fails the test.
struct SmallFs {
    path: PathBuf,
}

impl SmallFs {
    fn mount(path: &Path) -> SmallFs {
        std::fs::create_dir_all(path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m,mode=0755", "svc-durability"])
            .arg(path)
            .output()
            .expect("mount (util-linux)");
        assert!(
            out.status.success(),
            "mount -t tmpfs (needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs {
            path: path.to_path_buf(),
        }
    }

    /// Takes every free byte with one file; the write that fails proves the disk is full.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path.join("filler")).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let err = loop {
            if let Err(e) = f.write_all(&chunk) {
                break e;
            }
        };
        assert_eq!(err.raw_os_error(), Some(28), "filling: {err}");
        // Smaller writes fill the last partial page too.
        while f.write_all(&[0u8; 512]).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.path.join("filler")).unwrap();
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // Lazy: succeeds even if a process still has a file open there.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Every third fsync fails (strace `when=3+3`; not every other one: an unnamed file takes two
/// fsyncs, so a writer would fail the second one of every file, forever): some files of a
/// batch make it, some do not, and so do some directory syncs. The trace (fsyncs, links, and the ACKs the runner sends to
/// the broker) must show, in order:
/// - every `link` that gives a file its final name (an unnamed `O_TMPFILE` file by its
///   descriptor, or a `.svc-tmp-*` one) follows a successful `fsync` of that very
///   file, never a failed one;
/// - every `+ACK` of a message follows the link of its final name and then a successful
///   `fsync` of that directory: an ACK never covers a failed fsync;
/// - when that link named an unnamed file, the `+ACK` also follows a successful `fsync` of that
///   file after the link, through the same descriptor (the link count the link raised is in
///   the inode, which a directory fsync does not write everywhere: see durable_file.rs).
///
/// After the window every message is stored once and acknowledged.
#[test]
fn per_event_acks_only_after_a_successful_fsync_of_file_and_directory() {
    let (before, during) = (20usize, 100usize);
    let server = NatsServer::start();
    server.create_stream(STREAM, &[SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(
            &server,
            dir.path(),
            &out,
            json!({"key_strategy": "stream_sequence"}),
        ),
    );
    publish(&server, 0, before);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(60), "the first messages acked", || {
        all_acked(&server, before as u64)
    });
    let mut inj = Injector::attach(
        runner.child.id(),
        dir.path(),
        "fsync,link,linkat,rename,renameat,renameat2,sendto,sendmsg,write,writev",
        &["fsync:error=EIO:when=3+3"],
    );
    publish(&server, before, during);
    let total = (before + during) as u64;
    // Mixed failures: everything still gets through, by redelivery of what failed.
    wait_until(
        Duration::from_secs(120),
        "everything acked under mixed failures",
        || all_acked(&server, total),
    );
    inj.detach();
    let trace = inj.trace_text();
    let checked = check_trace(&trace);
    assert!(
        checked.links > 0,
        "no final name was published in the window"
    );
    assert!(
        checked.failed_temp_fsyncs > 0,
        "no fsync of a temporary file failed"
    );
    assert!(
        checked.failed_dir_fsyncs > 0,
        "no fsync of the directory failed"
    );
    // Every message of the window was acknowledged while traced: each ACK was checked.
    let window: BTreeSet<u64> = (before as u64 + 1..=total).collect();
    assert!(
        window.is_subset(&checked.acked),
        "ACKs missing from the trace: {:?}",
        window.difference(&checked.acked).collect::<Vec<_>>()
    );
    assert_failure_logged(&runner.log_text(), EIO_TEXT);
    let records = per_event_records(&out);
    assert_eq!(
        records.keys().copied().collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>()
    );
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(30))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{}", runner.log_text());
}

/// What [`check_trace`] saw.
struct Checked {
    links: usize,
    failed_temp_fsyncs: usize,
    failed_dir_fsyncs: usize,
    acked: BTreeSet<u64>,
}

/// Walks an `strace -f -y -o` trace of a per_event runner with `key_strategy`
/// `stream_sequence` (final names `<dir>/<sequence>.json`), in trace order. strace prints a
/// call when it completes (or at entry, marked `<unfinished ...>`, and its result later as
/// `<... resumed>`); a thread that acts on a result was stopped until strace printed it, so a
/// line's position orders it after every call whose result it depended on.
fn check_trace(trace: &str) -> Checked {
    // pid -> the unfinished call's text, to join "<unfinished ...>" with "<... resumed>".
    let mut unfinished: HashMap<String, String> = HashMap::new();
    let mut last_fsync_ok: HashMap<String, bool> = HashMap::new();
    // sequence -> trace position of the first successful link of its final name, and whether
    // it named an unnamed file.
    let mut linked: HashMap<u64, (usize, bool)> = HashMap::new();
    // An unnamed file just linked, by its key -> its sequence: the next fsync of that
    // descriptor is its second one (step 3), which the writer runs a few files later.
    let mut named_unnamed: HashMap<String, u64> = HashMap::new();
    let mut synced = Synced::default();

    let mut c = Checked {
        links: 0,
        failed_temp_fsyncs: 0,
        failed_dir_fsyncs: 0,
        acked: BTreeSet::new(),
    };
    for (at, raw) in trace.lines().enumerate() {
        // `PID  call`: strace pads the pid to five columns.
        let Some((pid, rest)) = raw.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        let call = if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
            // A send's bytes may leave before it returns: check its ACKs at entry.
            if head.starts_with("send") || head.starts_with("write") {
                check_acks(head, at, &linked, &synced, &mut c.acked);
            }
            unfinished.insert(pid.to_string(), head.to_string());
            continue;
        } else if rest.starts_with("<... ") {
            let tail = rest.split_once("resumed>").map(|(_, t)| t).unwrap_or("");
            match unfinished.remove(pid) {
                Some(head) if head.starts_with("send") || head.starts_with("write") => continue,
                Some(head) => format!("{head}{tail}"),
                None => continue,
            }
        } else {
            rest.to_string()
        };
        if call.starts_with("send") || call.starts_with("write") {
            check_acks(&call, at, &linked, &synced, &mut c.acked);
            continue;
        }
        // strace pads before the result: `fsync(7</d/.svc-tmp-1-2>)      = 0`.
        let Some((_, result)) = call.rsplit_once(" = ") else {
            continue;
        };
        let ok = result.trim() == "0";
        if let Some(args) = call.strip_prefix("fsync(") {
            // fsync(7</dir/.svc-tmp-123-4>)
            let Some(path) = call
                .split_once('<')
                .and_then(|(_, p)| p.rsplit_once('>'))
                .map(|(p, _)| p.to_string())
            else {
                continue;
            };
            let key = unnamed_key(pid, args.split('<').next().unwrap_or(""));
            if let Some(seq) = named_unnamed.remove(&key) {
                // The second fsync of an unnamed file, through the descriptor the link named
                // (however strace shows its path).
                if ok {
                    synced.finals.entry(seq).or_default().push(at);
                }
            } else if path.contains("/.svc-tmp-") {
                c.failed_temp_fsyncs += usize::from(!ok);
                last_fsync_ok.insert(path, ok);
            } else if call.contains(">(deleted)") {
                // An unnamed (O_TMPFILE) file, `fsync(7</dir/#<inode>>(deleted))`: known by its
                // thread and descriptor until `linkat` names it.
                let fd = args.split('<').next().unwrap_or("");
                c.failed_temp_fsyncs += usize::from(!ok);
                last_fsync_ok.insert(unnamed_key(pid, fd), ok);
            } else if is_key_directory(&path) {
                c.failed_dir_fsyncs += usize::from(!ok);
                if ok {
                    synced.dirs.entry(path).or_default().push(at);
                }
            } else if let (true, Some(seq)) = (ok, final_sequence(&path)) {
                synced.finals.entry(seq).or_default().push(at);
            }
        } else if ["link", "rename"].iter().any(|p| call.starts_with(p)) && ok {
            // link*(..., "src", ..., "dst", ...): the quoted paths are the 2nd and 4th fields.
            let mut quoted = call.split('"').skip(1).step_by(2);
            let (Some(src), Some(dst)) = (quoted.next(), quoted.next()) else {
                continue;
            };
            // An unnamed file: `linkat(7</dir/#123>(deleted), "", ..., AT_EMPTY_PATH)`, or
            // `linkat(AT_FDCWD, "/proc/self/fd/7", ...)` where the kernel refuses the former.
            let by_fd = call.strip_prefix("linkat(").filter(|_| src.is_empty());
            let unnamed = by_fd.is_some() || src.starts_with("/proc/self/fd/");
            let src = match (by_fd, src.strip_prefix("/proc/self/fd/")) {
                (Some(args), _) => unnamed_key(pid, args.split('<').next().unwrap_or("")),
                (None, Some(fd)) => unnamed_key(pid, fd),
                (None, None) if src.contains("/.svc-tmp-") => src.to_string(),
                (None, None) => continue,
            };
            // The metrics snapshot's own unnamed file, linked at its temporary name before
            // the rename (crates/files/src/atomic.rs): not a record.
            let dst_name = Path::new(dst)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if dst_name.starts_with(".metrics.json.tmp.") {
                continue;
            }
            c.links += 1;
            assert_eq!(
                last_fsync_ok.get(&src),
                Some(&true),
                "{src} got a final name without a successful fsync: {call}"
            );
            let seq = final_sequence(dst).unwrap_or_else(|| panic!("final name {dst}"));
            linked.entry(seq).or_insert((at, unnamed));
            if unnamed {
                named_unnamed.insert(src, seq);
            }
        }
    }
    c
}

/// The sequence in a final name `<dir>/<sequence>.json`.
/// The directory the final names are linked into: `.../stream-sequence/ORDERS/<incarnation>`.
fn is_key_directory(path: &str) -> bool {
    Path::new(path)
        .parent()
        .is_some_and(|p| p.ends_with("stream-sequence/ORDERS"))
}

fn final_sequence(path: &str) -> Option<u64> {
    let path = Path::new(path);
    if path.extension()? != "json" {
        return None;
    }
    path.file_stem()?.to_str()?.parse().ok()
}

/// Trace positions of successful fsyncs: of directories, and of files under their final name
/// (by sequence).
#[derive(Default)]
struct Synced {
    dirs: HashMap<String, Vec<usize>>,
    finals: HashMap<u64, Vec<usize>>,
}

/// How [`check_trace`] knows an unnamed file: the thread that opened it and its descriptor.
fn unnamed_key(pid: &str, fd: &str) -> String {
    format!("{pid}:fd {fd}")
}

/// Every `+ACK` in a send to the broker (`PUB $JS.ACK.<stream>.<consumer>.<delivered>.
/// <stream seq>.<consumer seq>.<time>.<pending> <len>\r\n+ACK\r\n`, escaped by strace) must
/// come after its final name was linked and the directory then fsynced successfully, and,
/// for an unnamed file, after a successful fsync of the file under its final name.
/// `linked`: sequence -> (trace position of its first link, whether an unnamed file).
fn check_acks(
    call: &str,
    at: usize,
    linked: &HashMap<u64, (usize, bool)>,
    synced: &Synced,
    acked: &mut BTreeSet<u64>,
) {
    for part in call.split("PUB $JS.ACK.").skip(1) {
        let Some((subject, rest)) = part.split_once(' ') else {
            continue;
        };
        let Some((_, body)) = rest.split_once("\\r\\n") else {
            continue;
        };
        if !body.starts_with("+ACK") {
            continue; // -NAK, +WPI, or cut off by strace's string limit
        }
        let seq: u64 = subject
            .split('.')
            .nth(3)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("ACK subject {subject}"));
        let (link, unnamed) = *linked
            .get(&seq)
            .unwrap_or_else(|| panic!("sequence {seq} acknowledged before its final name existed"));
        assert!(
            synced.dirs.values().flatten().any(|d| link < *d && *d < at),
            "sequence {seq} acknowledged (trace line {at}) without a successful directory \
             fsync after its link (line {link})"
        );
        if unnamed {
            let after_link = synced.finals.get(&seq).into_iter().flatten();
            assert!(
                after_link.into_iter().any(|f| link < *f && *f < at),
                "sequence {seq} acknowledged (trace line {at}) without a successful fsync of \
                 its file after the link (line {link})"
            );
        }
        acked.insert(seq);
    }
}

/// One system call of a trace: where it was entered and where its result was printed (the
/// same line unless another thread's line came between), and its joined text.
struct Call {
    entry: usize,
    done: usize,
    text: String,
}

/// The calls of an `strace -f -o` trace, in order of their result.
fn calls(trace: &str) -> Vec<Call> {
    let mut unfinished: HashMap<&str, (usize, String)> = HashMap::new();
    let mut out = Vec::new();
    for (at, raw) in trace.lines().enumerate() {
        // `PID  call`: strace pads the pid to five columns.
        let Some((pid, rest)) = raw.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
            unfinished.insert(pid, (at, head.to_string()));
        } else if rest.starts_with("<... ") {
            let tail = rest.split_once("resumed>").map(|(_, t)| t).unwrap_or("");
            if let Some((entry, head)) = unfinished.remove(pid) {
                out.push(Call {
                    entry,
                    done: at,
                    text: format!("{head}{tail}"),
                });
            }
        } else {
            out.push(Call {
                entry: at,
                done: at,
                text: rest.to_string(),
            });
        }
    }
    out
}

/// The fd path strace's `-y` printed for a call's first argument: `fdatasync(7</d/s.jsonl>)`.
fn fd_path(call: &str) -> Option<&str> {
    let (_, rest) = call.split_once('<')?;
    rest.split_once(">,")
        .or_else(|| rest.split_once(">)"))
        .map(|(p, _)| p)
}

/// Whether a call's result (after strace's padding) is success.
fn succeeded(call: &str) -> Option<bool> {
    call.rsplit_once(" = ").map(|(_, r)| {
        let r = r.trim();
        r == "0" || (r.parse::<u64>().is_ok() && !r.starts_with('-'))
    })
}

/// Every `+ACK` (stream sequence, trace position of the send's entry) in a trace.
fn acks(calls: &[Call]) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    for c in calls.iter().filter(|c| c.text.starts_with("send")) {
        for part in c.text.split("PUB $JS.ACK.").skip(1) {
            let Some((subject, rest)) = part.split_once(' ') else {
                continue;
            };
            let Some((_, body)) = rest.split_once("\\r\\n") else {
                continue;
            };
            if body.starts_with("+ACK") {
                let seq = subject.split('.').nth(3).and_then(|s| s.parse().ok());
                out.push((
                    seq.unwrap_or_else(|| panic!("ACK subject {subject}")),
                    c.entry,
                ));
            }
        }
    }
    out
}

/// jsonl: every `+ACK` of a sequence follows a write of its line to a segment and then a
/// successful `fdatasync` of that segment entered after the write returned, with no failed
/// sync of the segment after the write and before that one (after a failed sync the unsynced
/// tail may be gone, whatever a later sync says). Returns (ACKs checked, failed syncs seen).
fn check_jsonl_trace(trace: &str) -> (BTreeSet<u64>, usize) {
    let calls = calls(trace);
    // segment -> (entry, done, ok) of each fdatasync.
    let mut syncs: HashMap<&str, Vec<(usize, usize, bool)>> = HashMap::new();
    // sequence -> (segment, done) of each write of its line.
    let mut writes: HashMap<u64, Vec<(&str, usize)>> = HashMap::new();
    let mut failed = 0;
    for c in &calls {
        let Some(path) = fd_path(&c.text).filter(|p| p.contains("/segment-")) else {
            continue;
        };
        if c.text.starts_with("fdatasync(") {
            let ok = succeeded(&c.text) == Some(true);
            failed += usize::from(!ok);
            syncs.entry(path).or_default().push((c.entry, c.done, ok));
        } else if c.text.starts_with("write(") && succeeded(&c.text) == Some(true) {
            for part in c.text.split("stream_sequence\\\":").skip(1) {
                let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
                writes
                    .entry(digits.parse().unwrap())
                    .or_default()
                    .push((path, c.done));
            }
        }
    }
    let mut acked = BTreeSet::new();
    for (seq, at) in acks(&calls) {
        let covered = writes.get(&seq).into_iter().flatten().any(|(seg, w)| {
            // The first sync of this segment entered after the write, done before the ACK.
            syncs
                .get(seg)
                .into_iter()
                .flatten()
                .filter(|(entry, _, _)| entry > w)
                .min_by_key(|(entry, _, _)| *entry)
                .is_some_and(|(_, done, ok)| *ok && *done < at)
        });
        assert!(
            covered,
            "sequence {seq} acknowledged (trace line {at}) without a successful sync of its \
             line: writes {:?}",
            writes.get(&seq)
        );
        acked.insert(seq);
    }
    (acked, failed)
}

/// jsonl under mixed failures (every other fdatasync fails, strace `when=2+2`): every
/// ACK in the trace is covered by a successful sync of the segment holding that message's line
/// with no failed sync in between ([`check_jsonl_trace`]); afterwards every message is
/// present as a complete line and acknowledged.
#[test]
fn jsonl_acks_only_lines_covered_by_a_successful_fdatasync() {
    let (before, during) = (20usize, 100usize);
    let server = NatsServer::start();
    server.create_stream(STREAM, &[SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), &out, json!({"mode": "jsonl"})),
    );
    publish(&server, 0, before);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(60), "the first messages acked", || {
        all_acked(&server, before as u64)
    });
    let mut inj = Injector::attach(
        runner.child.id(),
        dir.path(),
        "fsync,fdatasync,write,sendto,sendmsg",
        // fdatasync only: creating a segment takes exactly two fsyncs (file, directory), so
        // failing every other fsync would fail every creation and nothing could progress.
        &["fdatasync:error=EIO:when=2+2"],
    );
    publish(&server, before, during);
    let total = (before + during) as u64;
    wait_until(
        Duration::from_secs(120),
        "everything acked under mixed failures",
        || all_acked(&server, total),
    );
    inj.detach();
    let (acked, failed) = check_jsonl_trace(&inj.trace_text());
    assert!(failed > 0, "no segment sync failed");
    let window: BTreeSet<u64> = (before as u64 + 1..=total).collect();
    assert!(
        window.is_subset(&acked),
        "ACKs missing from the trace: {:?}",
        window.difference(&acked).collect::<Vec<_>>()
    );
    assert_failure_logged(&runner.log_text(), EIO_TEXT);
    assert_eq!(jsonl_sequences(&out), (1..=total).collect::<BTreeSet<_>>());
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(30))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{}", runner.log_text());
}
