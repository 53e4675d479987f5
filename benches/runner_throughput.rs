//! End-to-end throughput of `svc run` against the raw limit of the broker client, in one run.
//!
//! ```text
//! cargo bench --bench runner_throughput            # N = 200000 messages of ~205 bytes
//! cargo bench --bench runner_throughput -- 50000   # smaller N
//! ```
//!
//! Prints (a) the raw fetch+ack rate of the same client with no sink (the limit), (b) `svc run`
//! into the file sink in `jsonl` and `per_event` modes, (c) the ratios, and peak RSS of `svc`
//! at two backlog sizes (it must not grow with the backlog: memory is bounded by channel
//! capacities). The broker runs on the same 2-core host. The raw loop and the `jsonl` run
//! alternate for two rounds and the ratio compares their means: on this host the raw limit
//! alone swings by 20% between consecutive runs. The jsonl runs use 4 sink workers (more
//! batches share one fsync); one more run with the default of 2 is printed for comparison.
//!
//! Both sides are timed alike: from before the client connects (raw) or the process is
//! spawned (svc) until the broker reports every message acknowledged (consumer ack floor,
//! polled every 25 ms by the same loop). The per_event run is compared with a raw run over
//! the same stream and message count, not with the big raw run.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

const SIZE: usize = 205;
/// Raw and svc jsonl runs alternate this many times.
const ROUNDS: usize = 2;
/// `delivery.sink_workers` of the jsonl runs, as docs/sinks/file.md recommends for jsonl: with
/// more batches at the sink at once, more of them share one fsync (group commit).
const JSONL_SINK_WORKERS: usize = 4;

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0), |(s, c), v| (s + v, c + 1));
    sum / count.max(1) as f64
}

struct RawResult {
    rate: f64,
    /// CPU seconds of this process (the raw client) and of the broker during the run.
    client_cpu: f64,
    broker_cpu: f64,
}

/// The limit: the raw fetch+ack loop of the same client on a new consumer of a stream.
fn raw_run(
    broker: &support::Broker,
    (stream, subject): (&str, &str),
    consumer: &str,
    n: usize,
) -> RawResult {
    support::create_consumer(
        &broker.url,
        stream,
        consumer,
        subject,
        Duration::from_secs(30),
    )
    .unwrap();
    let mut acks = support::AckWatch::start(&broker.url, stream, consumer);
    let (broker_before, own_before) = (
        broker.cpu_seconds(),
        support::process_cpu_seconds(std::process::id()),
    );
    let start = Instant::now();
    support::raw_fetch_ack(
        &broker.url,
        stream,
        consumer,
        subject,
        n,
        256,
        Duration::ZERO,
    )
    .unwrap();
    acks.wait(n, |_| {});
    let rate = n as f64 / start.elapsed().as_secs_f64();
    RawResult {
        rate,
        client_cpu: support::process_cpu_seconds(std::process::id()) - own_before,
        broker_cpu: broker.cpu_seconds() - broker_before,
    }
}

struct RunResult {
    rate: f64,
    peak_rss_kib: u64,
    /// CPU seconds per thread name (threads of one name summed), highest first.
    thread_cpu: Vec<(String, f64)>,
    /// CPU seconds the broker spent during the run.
    broker_cpu: f64,
}

impl RunResult {
    fn svc_cpu(&self) -> f64 {
        self.thread_cpu.iter().map(|(_, s)| s).sum()
    }
}

/// Runs `svc run` on a new `consumer` of (stream, subject) until `n` messages are acknowledged.
fn run_svc(
    broker: &support::Broker,
    (stream, subject): (&str, &str),
    consumer: &str,
    n: usize,
    sink: serde_json::Value,
    sink_workers: usize,
    dir: &Path,
) -> RunResult {
    support::create_consumer(
        &broker.url,
        stream,
        consumer,
        subject,
        Duration::from_secs(30),
    )
    .unwrap();
    let cfg = serde_json::json!({
        "nats": {"url": broker.url, "stream": stream, "consumer": consumer, "subject": subject},
        "delivery": {"batch_size": 256, "max_in_flight_batches": 8, "sink_workers": sink_workers},
        "sink": sink,
        "logging": {"level": "warn"}
    });
    let cfg_path = dir.join(format!("{consumer}.json"));
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let mut acks = support::AckWatch::start(&broker.url, stream, consumer);
    let broker_cpu_before = broker.cpu_seconds();
    let start = Instant::now();
    let mut child = support::spawn_svc_run(&cfg_path);
    let mut peak = 0;
    acks.wait(n, |_| {
        peak = peak.max(support::peak_rss_kib(child.id()));
        assert!(child.try_wait().unwrap().is_none(), "svc exited early");
    });
    let elapsed = start.elapsed().as_secs_f64();
    peak = peak.max(support::peak_rss_kib(child.id()));
    let cpu = support::thread_cpu(child.id());
    let broker_cpu = broker.cpu_seconds() - broker_cpu_before;
    support::terminate(child);
    RunResult {
        rate: n as f64 / elapsed,
        peak_rss_kib: peak,
        thread_cpu: cpu,
        broker_cpu,
    }
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench runner_throughput`"
        );
    }
    // Under `cargo test --all-targets` (no `--bench` flag) run a small smoke pass.
    let (_, n) = support::bench_count(200_000, 3_000);
    let n_files = (n / 10).max(1000);
    let n_small = (n / 10).max(1000);
    let dir = match std::env::var_os("SVC_BENCH_DIR") {
        Some(base) => tempfile::tempdir_in(base).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let broker = support::start_broker();
    support::create_stream(&broker.url, "BIG", &["big.>"]).unwrap();
    support::create_stream(&broker.url, "SMALL", &["small.>"]).unwrap();
    support::create_stream(&broker.url, "FILES", &["files.>"]).unwrap();
    let p = support::publish(&broker.url, "BIG", "big.orders", n, SIZE).unwrap();
    support::publish(&broker.url, "SMALL", "small.orders", n_small, SIZE).unwrap();
    support::publish(&broker.url, "FILES", "files.orders", n_files, SIZE).unwrap();
    println!("published {n} + {n_small} + {n_files} messages of {SIZE} bytes ({p:.0} msg/s)");

    // The raw limit swings by +-20% from run to run on a shared 2-core host, so raw and svc
    // alternate for ROUNDS rounds and the ratio compares their means.
    let jsonl = |dir_name: &str| serde_json::json!({"type": "file", "mode": "jsonl", "directory": dir.path().join(dir_name)});
    let mut raws = Vec::new();
    let mut bigs = Vec::new();
    for round in 1..=ROUNDS {
        raws.push(raw_run(
            &broker,
            ("BIG", "big.>"),
            &format!("raw-{round}"),
            n,
        ));
        bigs.push(run_svc(
            &broker,
            ("BIG", "big.>"),
            &format!("svc-jsonl-{round}"),
            n,
            jsonl(&format!("jsonl-big-{round}")),
            JSONL_SINK_WORKERS,
            dir.path(),
        ));
    }
    // The default of sink_workers, for comparison: fewer batches share one fsync.
    let default_workers = run_svc(
        &broker,
        ("BIG", "big.>"),
        "svc-jsonl-default",
        n,
        jsonl("jsonl-big-default"),
        2,
        dir.path(),
    );
    let small = run_svc(
        &broker,
        ("SMALL", "small.>"),
        "svc-jsonl",
        n_small,
        jsonl("jsonl-small"),
        JSONL_SINK_WORKERS,
        dir.path(),
    );
    let raw_files = raw_run(&broker, ("FILES", "files.>"), "raw-files", n_files);
    let per_event = run_svc(
        &broker,
        ("FILES", "files.>"),
        "svc-files",
        n_files,
        serde_json::json!({"type": "file", "directory": dir.path().join("files")}),
        2,
        dir.path(),
    );

    println!();
    println!("runner throughput, {SIZE}-byte messages, broker on the same 2-core host");
    let raw = mean(raws.iter().map(|r| r.rate));
    let big_rate = mean(bigs.iter().map(|r| r.rate));
    let rounds = |rates: &mut dyn Iterator<Item = f64>| {
        rates
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!(
        "  (a) raw fetch+ack, no sink (the limit)   {raw:>10.0} msg/s   (mean of rounds {}; {n} msgs, batch 256)",
        rounds(&mut raws.iter().map(|r| r.rate))
    );
    println!(
        "  (b) svc run -> file sink jsonl, {JSONL_SINK_WORKERS} sink workers {big_rate:>7.0} msg/s   ratio {:.2}x of (a)  (mean of rounds {}; per round {})",
        big_rate / raw,
        rounds(&mut bigs.iter().map(|r| r.rate)),
        raws.iter()
            .zip(&bigs)
            .map(|(a, b)| format!("{:.2}x", b.rate / a.rate))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    println!(
        "      same with sink_workers 2 (default)   {:>10.0} msg/s   ratio {:.2}x of (a)  (one run)",
        default_workers.rate,
        default_workers.rate / raw
    );
    println!(
        "      raw fetch+ack on the per_event stream {:>9.0} msg/s   ({n_files} msgs)",
        raw_files.rate
    );
    println!("      svc run -> file sink per_event       {:>10.0} msg/s   ratio {:.2}x of the raw run above  ({n_files} msgs, fsync per file)", per_event.rate, per_event.rate / raw_files.rate);
    let big = bigs.last().expect("ROUNDS >= 1");
    println!("  (c) peak RSS of svc (jsonl): backlog {n:>7} -> {:>7} KiB; backlog {n_small:>7} -> {:>7} KiB (ratio {:.2})",
        big.peak_rss_kib, small.peak_rss_kib, big.peak_rss_kib as f64 / small.peak_rss_kib.max(1) as f64);
    println!(
        "      peak RSS of svc (per_event, backlog {n_files}): {} KiB",
        per_event.peak_rss_kib
    );
    let fmt = |r: &RunResult| {
        r.thread_cpu
            .iter()
            .map(|(n, s)| format!("{n} {s:.2}s"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let per_msg = |cpu: f64| cpu / n as f64 * 1e6;
    println!(
        "  CPU per message, client / broker: (a) {:.1} / {:.1} us; (b) jsonl {:.1} / {:.1} us  (means of rounds)",
        per_msg(mean(raws.iter().map(|r| r.client_cpu))),
        per_msg(mean(raws.iter().map(|r| r.broker_cpu))),
        per_msg(mean(bigs.iter().map(RunResult::svc_cpu))),
        per_msg(mean(bigs.iter().map(|r| r.broker_cpu)))
    );
    println!(
        "  CPU by thread (jsonl, {n} msgs, last round): {}",
        fmt(big)
    );
    println!("  CPU by thread (per_event): {}", fmt(&per_event));
}
