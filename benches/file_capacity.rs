//! `svc run` -> file sink end to end next to the file system's own capacity, in one run.
//!
//! ```text
//! cargo bench --bench file_capacity                       # 20000 mixed messages, defaults
//! cargo bench --bench file_capacity -- 50000              # more messages
//! cargo bench --bench file_capacity -- write_concurrency=8 sink_workers=4 batch_size=128
//! cargo bench --bench file_capacity -- per_event       # one part only (jsonl, ways, broker)
//! cargo bench --bench file_capacity -- quiet=360       # wait longer before measuring
//! ```
//!
//! per_event: the capacity is plain `open(O_CREAT|O_EXCL)` + `write` + `fsync` + `close` of
//! one file per record, with the bytes the sink writes (the same records: normalized and
//! encoded by the library), in the same layout (`idempotency-key/s-<stream>-<seq>.json`, one
//! directory), from as many threads as the sink has files in flight (`write_concurrency`),
//! with one directory `fsync` per `batch_size` files. No temporary name, no link: the least
//! a file system must do to hold each record durably under its own name.
//!
//! jsonl: the capacity is the batches' bytes appended to one file with one `write` per batch
//! under a lock and one `fdatasync` per batch outside it, from `sink_workers` threads.
//!
//! A warm-up capacity run comes first, then capacity and `svc run` alternate
//! (`C S C S ... C`) and each `svc run` is divided by the mean of the capacities measured
//! right before and after it. A round whose two capacities differ by more than 25% saw the
//! file system change pace (see below) and is marked; the summary gives the median and the
//! lowest ratio of the other rounds. `svc run` is timed from spawn until the
//! broker reports every message acknowledged; it creates its consumer itself, with the
//! defaults an operator gets (`max_ack_pending`), and runs with the default configuration
//! except for the `key=value` arguments given.
//!
//! Nothing is deleted before the end, and measuring starts only after 65 quiet seconds: ext4
//! without a journal (this project's test VM) does not reuse an inode within 60 s of its
//! deletion, or 360 s while the inode's table block has not been written back
//! (`recently_deleted`, `RECENTCY_MIN` and `RECENTCY_DIRTY` in the kernel's ext4/ialloc.c),
//! and while many such inodes sit near a new file's directory every allocation scans past
//! them (`perf record -a -g` shows it). Measured here: 14k-18k files/s from 16 threads on a
//! quiet file system, 0.8k-2.7k in the 30 s after `rm -rf` of 65,000 files, 4.5k-5k about
//! 40 s after one of 240,000. Without the wait, the clean-up of a previous run (or of a test
//! suite) decides the figures, and it may hit the two sides differently: their directories
//! can sit in different block groups.
//!
//! Each `svc run` also prints the CPU time of its threads and of the broker. The end of a
//! run is seen without asking the broker while it delivers (`support::AckWatch`): asking for
//! the consumer's info makes nats-server 2.9.10 recount pending messages on every later
//! delivery in part of the stream (docs/sinks/file.md, Performance), which the `broker` part
//! shows. `SVC_BENCH_BROKER_PROFILE=<port>` starts the broker with Go's pprof on that port.
//!
//! Diagnostics, by environment variable: `SVC_BENCH_TIMELINE=1` prints messages acknowledged
//! and files written per 250 ms and the scheduler states of svc's threads sampled every 25 ms
//! (R running, S sleeping, e.g. waiting for work, D waiting for the disk); with it,
//! `SVC_BENCH_DUMP=1` has svc log its pipeline dump (SIGUSR1) every 250 ms;
//! `SVC_BENCH_LOG=info` sets svc's log level. `SVC_BENCH_KEEP=1` leaves the bench's files
//! in place (the path is printed): the next run then starts on a quiet file system with
//! `quiet=0`, instead of behind the deletion of this one's files (200,000 for
//! per_event's default 20,000 messages).
//!
//! Messages are mixed: JSON of two sizes, text and raw bytes, on four subjects; records
//! average about 780 bytes.

#[path = "file_capacity/diagnose.rs"]
mod diagnose;
mod support;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svc::message::envelope::{normalize, EnvelopeConfig, RawMessage};
use svc::message::record::encode_record;

/// per_event reads `FILES` (n messages), jsonl `LINES` (10 n): both hold the same mix.
const FILES: &str = "FILES";
const LINES: &str = "LINES";
const ROUNDS: usize = 4;
/// An `svc run` that has not acknowledged everything by then is reported as stalled.
const RUN_DEADLINE: Duration = Duration::from_secs(600);
/// How long to wait, before measuring, for inodes freed before the bench to become reusable.
/// `quiet=<seconds>` changes it: per_event's own writes recover later than plain create
/// (docs/sinks/file.md, Performance), up to ext4's 360 s.
const QUIET: Duration = Duration::from_secs(65);

/// The settings of one comparison: the defaults unless given as `key=value` arguments.
struct Settings {
    write_concurrency: usize,
    /// Threads of the per_event capacity: `write_concurrency` unless given.
    capacity_threads: usize,
    sink_workers: usize,
    batch_size: usize,
    /// The wait before measuring.
    quiet: Duration,
    /// Other `key=value` arguments, passed to `svc run` as they are (`max_ack_pending=...`).
    extra: Vec<(String, u64)>,
}

impl Settings {
    fn from_args() -> Settings {
        // The defaults of src/sink/file/config.rs and src/config/mod.rs.
        let mut s = Settings {
            write_concurrency: svc::sink::file::config::DEFAULT_WRITE_CONCURRENCY as usize,
            capacity_threads: 0,
            sink_workers: svc::config::DEFAULT_SINK_WORKERS as usize,
            batch_size: svc::config::DEFAULT_BATCH_SIZE as usize,
            quiet: QUIET,
            extra: Vec::new(),
        };
        for arg in std::env::args().skip(1) {
            // Flags of the test harness (`--test-threads=4` under `cargo test`) are not ours.
            let Some((key, value)) = arg.split_once('=').filter(|_| !arg.starts_with('-')) else {
                continue;
            };
            let value: u64 = value
                .parse()
                .unwrap_or_else(|_| panic!("{key}: not a number"));
            match key {
                "write_concurrency" => s.write_concurrency = value as usize,
                "capacity_threads" => s.capacity_threads = value as usize,
                "sink_workers" => s.sink_workers = value as usize,
                "batch_size" => s.batch_size = value as usize,
                "quiet" => s.quiet = Duration::from_secs(value),
                "max_ack_pending" | "max_in_flight_batches" | "max_batch_wait_ms" => {
                    s.extra.push((key.to_string(), value))
                }
                _ => panic!("{key}: unknown setting"),
            }
        }
        if s.capacity_threads == 0 {
            s.capacity_threads = s.write_concurrency;
        }
        s
    }

    /// The `svc run` configuration for `sink`.
    fn config(&self, url: &str, stream: &str, consumer: &str, sink: Value) -> Value {
        let mut cfg = json!({
            "nats": {"url": url, "stream": stream, "consumer": consumer, "subject": format!("{}.>", stream.to_lowercase()),
                     "consumer_mode": "create"},
            "delivery": {"sink_workers": self.sink_workers, "batch_size": self.batch_size},
            "sink": sink,
            "logging": {"level": std::env::var("SVC_BENCH_LOG").unwrap_or("warn".into())}
        });
        for (key, value) in &self.extra {
            let section = match key.as_str() {
                "max_ack_pending" => "nats",
                _ => "delivery",
            };
            cfg[section][key] = json!(value);
        }
        cfg
    }
}

/// Message `i` of the mixed stream: (subject below the stream's prefix, payload).
fn message(i: usize) -> (&'static str, Vec<u8>) {
    match i % 4 {
        0 => (
            "orders.created",
            format!(
                r#"{{"order_id":"ORD-{i:08}","customer":"c-{}","amount":{{"value":{},"currency":"EUR"}},"items":[{{"sku":"SKU-1","qty":2}}]}}"#,
                i % 977,
                i * 7 % 100_000
            )
            .into_bytes(),
        ),
        1 => (
            "orders.paid",
            format!(
                r#"{{"order_id":"ORD-{i:08}","payment":{{"method":"card","reference":"{}","captured":true}},"lines":[{}]}}"#,
                "r".repeat(40),
                (0..6)
                    .map(|n| format!(r#"{{"sku":"SKU-{n}","qty":{n},"price":{}}}"#, 100 + n))
                    .collect::<Vec<_>>()
                    .join(",")
            )
            .into_bytes(),
        ),
        2 => (
            "logs.app",
            format!("2024-05-01T12:00:00Z INFO request {i} served in 12 ms path=/api/v1/orders/{i} status=200").into_bytes(),
        ),
        _ => (
            "blobs.raw",
            (0..96u32).map(|b| (b * 37 + i as u32) as u8 | 0x80).collect(),
        ),
    }
}

fn publish(url: &str, stream: &str, n: usize) {
    support::create_stream(url, stream, &[&format!("{}.>", stream.to_lowercase())]).unwrap();
    let nc = support::connect(url).unwrap();
    let js = nats::jetstream::new(nc.clone());
    let before = js.stream_info(stream).unwrap().state.messages;
    for i in 0..n {
        let (subject, data) = message(i);
        nc.publish(&format!("{}.{subject}", stream.to_lowercase()), data)
            .unwrap();
        if i % 5000 == 4999 {
            nc.flush().unwrap();
        }
    }
    nc.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while js.stream_info(stream).unwrap().state.messages < before + n as u64 {
        assert!(Instant::now() < deadline, "the stream did not fill");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The records the sink writes for the first `n` messages (sequence, bytes).
fn records(stream: &str, n: usize) -> Vec<(u64, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let (subject, data) = message(i);
            let seq = i as u64 + 1;
            let raw = RawMessage {
                stream_incarnation: Default::default(),
                subject: format!("{}.{subject}", stream.to_lowercase()),
                stream: stream.into(),
                consumer: "svc".into(),
                stream_sequence: seq,
                consumer_sequence: seq,
                delivery_count: 1,
                published_unix_nanos: Some(1_700_000_000_000_000_000),
                headers: Vec::new(),
                data,
                unreadable: None,
                header_block: Default::default(),
            };
            let env = normalize(&raw, 1_700_000_001_000_000_000, &EnvelopeConfig::default()).0;
            let mut buf = Vec::new();
            encode_record(&mut buf, &env).unwrap();
            (seq, buf)
        })
        .collect()
}

/// How a file gets its final name. `Plain` is the capacity per_event is compared with; the
/// others are the ways a sink can publish a complete file, for the file system's cost alone.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// `open(final, O_CREAT|O_EXCL)`, `write`, `fsync`, `close`: no temporary file at all.
    Plain,
    /// `open(O_TMPFILE)`, `write`, `fsync`, `linkat(<fd>, "", AT_EMPTY_PATH)`, `close`.
    Unnamed,
    /// As `Unnamed`, then `fsync` again right after the link: the inode's new link count is
    /// written too, which a file system without a journal needs (docs/sinks/file.md). svc
    /// runs that fsync four files later on the same writer, so that one write of an
    /// inode-table block serves the files linked around it.
    UnnamedSynced,
    /// `open(.tmp, O_CREAT|O_EXCL)`, `write`, `fsync`, `link`, `unlink`, `close`.
    LinkUnlink,
    /// `open(.tmp, O_CREAT|O_EXCL)`, `write`, `fsync`, `renameat2(RENAME_NOREPLACE)`, `close`.
    RenameNoReplace,
}

/// One file per record in `dir/idempotency-key/` the given way, from `capacity_threads`
/// threads, a directory fsync per `batch_size` files; returns files per second.
fn capacity(dir: &Path, records: &[(u64, Vec<u8>)], s: &Settings, way: Way) -> f64 {
    use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, CWD};
    use std::os::fd::AsRawFd;
    let keys = dir.join("idempotency-key");
    fs::create_dir_all(&keys).unwrap();
    let done = AtomicUsize::new(0);
    support::parallel("capacity", s.capacity_threads, records.len(), |i| {
        let (seq, bytes) = &records[i];
        let last = keys.join(format!("s-{FILES}-{seq}.json"));
        let temp = keys.join(format!(".tmp-{seq}"));
        let create = |path: &Path| {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o640)
                .open(path)
                .unwrap()
        };
        let mut f = match way {
            Way::Plain => create(&last),
            Way::Unnamed | Way::UnnamedSynced => File::from(
                rustix::fs::openat(
                    CWD,
                    &keys,
                    OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                    Mode::from_bits_truncate(0o640),
                )
                .unwrap(),
            ),
            Way::LinkUnlink | Way::RenameNoReplace => create(&temp),
        };
        f.write_all(bytes).unwrap();
        f.sync_all().unwrap();
        match way {
            Way::Plain => {}
            Way::Unnamed | Way::UnnamedSynced => {
                // As svc links: by descriptor, through /proc where the kernel refuses that.
                rustix::fs::linkat(&f, "", CWD, &last, AtFlags::EMPTY_PATH)
                    .or_else(|_| {
                        rustix::fs::linkat(
                            CWD,
                            format!("/proc/self/fd/{}", f.as_raw_fd()),
                            CWD,
                            &last,
                            AtFlags::SYMLINK_FOLLOW,
                        )
                    })
                    .unwrap();
                if matches!(way, Way::UnnamedSynced) {
                    f.sync_all().unwrap();
                }
            }
            Way::LinkUnlink => {
                fs::hard_link(&temp, &last).unwrap();
                fs::remove_file(&temp).unwrap();
            }
            Way::RenameNoReplace => {
                rustix::fs::renameat_with(CWD, &temp, CWD, &last, RenameFlags::NOREPLACE).unwrap()
            }
        }
        drop(f);
        let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
        if finished % s.batch_size == 0 || finished == records.len() {
            File::open(&keys).unwrap().sync_all().unwrap();
        }
    })
}

/// jsonl's capacity: one append per batch under a lock, one fdatasync per batch outside it.
fn jsonl_capacity(dir: &Path, batches: &[Vec<u8>], msgs: usize, s: &Settings) -> f64 {
    fs::create_dir_all(dir).unwrap();
    let file = Mutex::new(
        OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join("capacity.jsonl"))
            .unwrap(),
    );
    let start = Instant::now();
    support::parallel("capacity", s.sink_workers, batches.len(), |i| {
        let f = {
            let f = file.lock().unwrap();
            (&*f).write_all(&batches[i]).unwrap();
            f.try_clone().unwrap()
        };
        f.sync_data().unwrap();
    });
    msgs as f64 / start.elapsed().as_secs_f64()
}

struct SvcRun {
    rate: f64,
    /// CPU seconds the broker spent during the run.
    broker_cpu: f64,
    threads_at_end: usize,
    thread_cpu: Vec<(String, f64)>,
}

/// `svc run` on a new consumer of `subject` until `n` messages are acknowledged.
fn svc_run(
    broker: &support::Broker,
    work: &Path,
    (stream, name): (&str, &str),
    n: usize,
    cfg: Value,
) -> SvcRun {
    let url = &broker.url;
    let broker_before = broker.cpu_seconds();
    let cfg_path = work.join(format!("{name}.json"));
    fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    // SVC_BENCH_TIMELINE=1: messages acknowledged per 250 ms, to see stalls (counting the
    // acks costs the broker some CPU, see support::AckWatch).
    let timeline = std::env::var_os("SVC_BENCH_TIMELINE").is_some();
    let mut acks = match timeline {
        true => support::AckWatch::counting(url, stream, name),
        false => support::AckWatch::start(url, stream, name),
    };
    let start = Instant::now();
    let mut child = support::spawn_svc_run(&cfg_path);
    let (mut marks, mut last) = (Vec::new(), Instant::now());
    let mut states: std::collections::BTreeMap<String, usize> = Default::default();
    acks.wait(n, |acked| {
        assert!(child.try_wait().unwrap().is_none(), "svc exited early");
        assert!(start.elapsed() < RUN_DEADLINE, "svc run {name} stalled");
        if timeline {
            diagnose::sample_states(child.id(), &mut states);
        }
        if timeline && last.elapsed() >= Duration::from_millis(250) {
            last = Instant::now();
            if std::env::var_os("SVC_BENCH_DUMP").is_some() {
                let _ = Command::new("kill")
                    .args(["-USR1", &child.id().to_string()])
                    .status();
            }
            let files = fs::read_dir(work.join(name).join("idempotency-key"))
                .map(|d| d.count())
                .unwrap_or(0);
            marks.push((acked.unwrap_or(0), files));
        }
    });
    if timeline {
        let steps: Vec<String> = marks
            .windows(2)
            .map(|w| format!("{}/{}", w[1].0 - w[0].0, w[1].1 - w[0].1))
            .collect();
        println!("      acked/files per 250 ms: {}", steps.join(" "));
        println!("      thread states sampled every 25 ms: {states:?}");
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let threads_at_end = fs::read_dir(format!("/proc/{}/task", child.id()))
        .map(|d| d.count())
        .unwrap_or(0);
    let thread_cpu = support::thread_cpu(child.id());
    support::terminate(child);
    SvcRun {
        rate,
        broker_cpu: broker.cpu_seconds() - broker_before,
        threads_at_end,
        thread_cpu,
    }
}

/// One `svc run` and the capacities measured right before and after it.
struct Round {
    before: f64,
    svc: f64,
    after: f64,
}

impl Round {
    fn ratio(&self) -> f64 {
        self.svc / ((self.before + self.after) / 2.0)
    }

    /// The disk held one phase through the round: the capacities around it agree within
    /// `STEADY`.
    fn steady(&self) -> bool {
        self.before.min(self.after) >= self.before.max(self.after) * (1.0 - STEADY)
    }
}

/// Capacities before and after a round may differ by this fraction for it to count.
const STEADY: f64 = 0.25;

/// A warm-up capacity run (printed, not used), then capacity and `svc run` alternating (C S C S ... C).
fn compare(
    label: &str,
    n: usize,
    mut capacity: impl FnMut(usize) -> f64,
    mut svc: impl FnMut(usize) -> SvcRun,
) -> Vec<Round> {
    // The bench process does nothing else while a capacity runs: its CPU is the capacity's.
    let mut capacity = |round| {
        let cpu = support::process_cpu_seconds(std::process::id());
        let rate = capacity(round);
        (rate, support::process_cpu_seconds(std::process::id()) - cpu)
    };
    println!("  {label} warm-up: capacity {:>7.0}", capacity(0).0);
    let (mut before, mut cpu_before) = capacity(1);
    let mut rounds = Vec::new();
    for round in 1..=ROUNDS {
        let run = svc(round);
        let (after, cpu_after) = capacity(round + 1);
        let r = Round {
            before,
            svc: run.rate,
            after,
        };
        println!(
            "  {label} round {round}: capacity {:>7.0} -> svc run {:>7.0} msg/s -> capacity {:>7.0}   ratio {:.2}x{}   ({} threads at the end)",
            r.before,
            r.svc,
            r.after,
            r.ratio(),
            if r.steady() { "" } else { " (phase changed)" },
            run.threads_at_end,
        );
        let cpu: Vec<String> = run
            .thread_cpu
            .iter()
            .map(|(n, s)| format!("{n} {s:.2}s"))
            .collect();
        println!(
            "      CPU by thread: {}; broker {:.2}s",
            cpu.join(", "),
            run.broker_cpu
        );
        // Whether svc was short of CPU or waiting (for the disk, the broker, itself).
        let svc_cpu: f64 = run.thread_cpu.iter().map(|(_, s)| s).sum();
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
        let busy = (svc_cpu + run.broker_cpu) * r.svc / n as f64 / cores;
        let per = |cpu: f64| cpu * 1e6 / n as f64;
        println!(
            "      CPU per message: svc {:.0} us + broker {:.0} us ({:.0}% of {cores} cores busy); capacity {:.0} / {:.0} us per record",
            per(svc_cpu),
            per(run.broker_cpu),
            busy * 100.0,
            per(cpu_before),
            per(cpu_after),
        );
        (before, cpu_before) = (after, cpu_after);
        rounds.push(r);
    }
    rounds
}

/// The middle value of `sorted`, or the mean of the two middle ones.
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// The per-round ratios, and the median and lowest of the steady rounds.
fn summary(rounds: &[Round]) -> String {
    let all: Vec<String> = rounds
        .iter()
        .map(|r| format!("{:.2}x", r.ratio()))
        .collect();
    let mut steady: Vec<f64> = rounds
        .iter()
        .filter(|r| r.steady())
        .map(Round::ratio)
        .collect();
    steady.sort_by(f64::total_cmp);
    let median = match steady.len() {
        0 => "no steady round".to_string(),
        n => format!(
            "median of {n} steady rounds {:.2}x, lowest {:.2}x",
            median(&steady),
            steady[0]
        ),
    };
    format!("{} ({median})", all.join(" / "))
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench file_capacity`"
        );
    }
    // Under `cargo test --all-targets` (no `--bench` flag) a small smoke pass.
    let (benching, n) = support::bench_count(20_000, 600);
    let n_jsonl = n * 10;
    let only = |mode: &str| {
        let named: Vec<String> = std::env::args()
            .filter(|a| ["per_event", "jsonl", "ways", "broker"].contains(&a.as_str()))
            .collect();
        named.is_empty() || named.iter().any(|a| a == mode)
    };
    let s = Settings::from_args();
    let mut work = match std::env::var_os("SVC_BENCH_DIR") {
        Some(base) => tempfile::tempdir_in(base).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let broker = support::start_broker();
    publish(&broker.url, FILES, n);
    publish(&broker.url, LINES, n_jsonl);
    let recs = records(FILES, n);
    let avg = recs.iter().map(|(_, b)| b.len()).sum::<usize>() / n.max(1);
    println!(
        "file capacity bench: {n} mixed messages (per_event), {n_jsonl} (jsonl), records ~{avg} bytes; \
         write_concurrency {}, sink_workers {}, batch_size {}{}",
        s.write_concurrency,
        s.sink_workers,
        s.batch_size,
        s.extra
            .iter()
            .map(|(k, v)| format!(", {k} {v}"))
            .collect::<String>()
    );
    if std::env::var_os("SVC_BENCH_KEEP").is_some() {
        work.disable_cleanup(true);
        println!("keeping the bench's files in {}", work.path().display());
    }
    let out = |name: &str| work.path().join(name);
    if benching {
        println!(
            "waiting {} s: inodes deleted before the bench slow down file creation until ext4 may reuse them",
            s.quiet.as_secs()
        );
        std::thread::sleep(s.quiet);
    }

    let mut per_event = Vec::new();
    let mut jsonl = Vec::new();
    if only("per_event") {
        println!(
            "per_event (capacity: create+write+fsync, {} threads):",
            s.capacity_threads
        );
        per_event = compare(
            "per_event",
            n,
            |round| capacity(&out(&format!("cap-{round}")), &recs, &s, Way::Plain),
            |round| {
                let name = format!("per-event-{round}");
                let sink = json!({"type": "file", "directory": out(&name),
                              "write_concurrency": s.write_concurrency});
                let cfg = s.config(&broker.url, FILES, &name, sink);
                svc_run(&broker, work.path(), (FILES, &name), n, cfg)
            },
        );
    }
    if only("ways") {
        println!(
            "file system alone, files/s and CPU per file: plain create, then the ways a sink \
             can name a file (files/s and CPU against plain create's):"
        );
        // The bench process does nothing else meanwhile: its CPU is the way's.
        let measured = |round: usize, way: Way| {
            let cpu = support::process_cpu_seconds(std::process::id());
            let rate = capacity(&out(&format!("{way:?}-{round}")), &recs, &s, way);
            let cpu = support::process_cpu_seconds(std::process::id()) - cpu;
            (rate, cpu * 1e6 / recs.len() as f64)
        };
        for round in 1..=ROUNDS {
            let (plain, plain_us) = measured(round, Way::Plain);
            let ways: Vec<String> = [
                Way::Unnamed,
                Way::UnnamedSynced,
                Way::LinkUnlink,
                Way::RenameNoReplace,
            ]
            .iter()
            .map(|&w| {
                let (rate, us) = measured(round, w);
                format!(
                    "{w:?} {rate:>6.0} {us:>4.0} us ({:.2}x, {:.2}x)",
                    rate / plain,
                    us / plain_us
                )
            })
            .collect();
            println!(
                "  round {round}: create {plain:>6.0} {plain_us:>4.0} us   {}",
                ways.join("   ")
            );
        }
    }
    if only("broker") {
        diagnose::broker_alone(&broker, work.path(), n, &s);
    }
    if only("jsonl") {
        let all = records(LINES, n_jsonl);
        let batches: Vec<Vec<u8>> = all
            .chunks(s.batch_size)
            .map(|c| {
                let mut buf = Vec::new();
                for (_, r) in c {
                    buf.extend_from_slice(r);
                    buf.push(b'\n');
                }
                buf
            })
            .collect();
        println!(
            "jsonl (capacity: append+fdatasync per batch, {} threads):",
            s.sink_workers
        );
        jsonl = compare(
            "jsonl",
            n_jsonl,
            |round| jsonl_capacity(&out(&format!("jcap-{round}")), &batches, n_jsonl, &s),
            |round| {
                let name = format!("jsonl-{round}");
                let sink = json!({"type": "file", "mode": "jsonl", "directory": out(&name)});
                let cfg = s.config(&broker.url, LINES, &name, sink);
                svc_run(&broker, work.path(), (LINES, &name), n_jsonl, cfg)
            },
        );
    }
    println!(
        "per_event end to end / file system capacity: {}",
        summary(&per_event)
    );
    println!(
        "jsonl end to end / append capacity:          {}",
        summary(&jsonl)
    );
}
