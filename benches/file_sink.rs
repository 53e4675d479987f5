//! File sink throughput, sink alone (no broker): `cargo bench --bench file_sink [-- N]`.
//!
//! Prints messages per second of
//! - `raw append+fdatasync`: the baseline measured in the same run: the same bytes the jsonl
//!   sink writes, pre-serialized, appended with one `write_all` + one `fdatasync` per batch
//!   from the same number of threads. The append is serialized (one file), the `fdatasync`
//!   runs outside the lock, so concurrent threads overlap writes with syncs and the kernel
//!   lets one journal commit cover several threads' syncs: the same freedom the jsonl sink's
//!   group commit has. (Until 2026-11-23 the lock guard lived through the `fdatasync`, which
//!   serialized the raw threads and flattered the sink's ratio.)
//! - `raw create+write+fsync`: the per_event baseline, the file system's parallel capacity for
//!   this shape: one new file per record, `write_all` + `fsync` each, one directory `fsync` per
//!   chunk, from as many threads as the sink writes with (its `write_concurrency` writers, 16
//!   by default), on the same smaller sample;
//! - `jsonl` with 1 and 2 writer threads (2 = default `delivery.sink_workers`);
//! - `per_event` (skip_existing, default `write_concurrency`) called from 2 threads, on a
//!   smaller sample (it is bound by one fsync per file);
//!
//! and each sink figure's ratio to the baseline. Batches of 256 envelopes (the default
//! `delivery.batch_size`) with a ~200-byte JSON payload. Output goes below the system temp
//! directory and is removed afterwards.

mod support;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use svc::message::record::encode_record;
use svc::metrics::Metrics;
use svc::sink::file::config::FileMode;
use svc::sink::file::{FileSink, FileSinkConfig};
use svc::sink::{Sink, WriteOutcome};

const BATCH: usize = 256;
/// The per_event sink's default `write_concurrency`: its writer threads, files in flight.
const PER_EVENT_WRITERS: usize = svc::sink::file::config::DEFAULT_WRITE_CONCURRENCY as usize;

fn batches(n: usize) -> Vec<Vec<svc::message::envelope::Envelope>> {
    let envs = support::order_envelopes(n);
    envs.chunks(BATCH).map(|c| c.to_vec()).collect()
}

/// Runs `work` over the batches split round-robin across `threads` threads; returns msg/s.
fn run<T: Send + Sync + 'static>(
    name: &str,
    threads: usize,
    items: Arc<Vec<T>>,
    msgs: usize,
    work: impl Fn(&T) + Send + Sync + 'static,
) -> f64 {
    let work = Arc::new(work);
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let items = Arc::clone(&items);
            let work = Arc::clone(&work);
            std::thread::Builder::new()
                .name(format!("bench-{name}-{t}"))
                .spawn(move || {
                    for item in items.iter().skip(t).step_by(threads) {
                        work(item);
                    }
                })
                .unwrap()
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    msgs as f64 / start.elapsed().as_secs_f64()
}

fn scratch(root: &Path, name: &str) -> PathBuf {
    let p = root.join(name);
    let _ = fs::remove_dir_all(&p);
    p
}

fn sink(dir: &Path, mode: FileMode) -> Arc<FileSink> {
    let mut cfg = FileSinkConfig::new(dir);
    if mode == FileMode::Jsonl {
        cfg.mode = FileMode::Jsonl;
        cfg.file_suffix = ".jsonl".into();
    }
    Arc::new(FileSink::new(cfg, Arc::new(Metrics::default())).unwrap())
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench file_sink`"
        );
    }
    // Under `cargo test --all-targets` (no `--bench` flag) a small smoke pass.
    let (_, n) = support::bench_count(200_000, 5_000);
    let root = std::env::temp_dir().join(format!("svc-bench-file-sink-{}", std::process::id()));
    let data = Arc::new(batches(n));
    let bytes_per_batch: Vec<Vec<u8>> = data
        .iter()
        .map(|b| {
            let mut buf = Vec::new();
            for e in b {
                encode_record(&mut buf, e).unwrap();
                buf.push(b'\n');
            }
            buf
        })
        .collect();
    let avg = bytes_per_batch.iter().map(Vec::len).sum::<usize>() / (n.max(1));
    println!("file sink bench: {n} messages, batches of {BATCH}, ~{avg} bytes per record");

    let mut base = Vec::new();
    for threads in [1, 2] {
        let dir = scratch(&root, &format!("raw{threads}"));
        fs::create_dir_all(&dir).unwrap();
        let file = Arc::new(Mutex::new(
            OpenOptions::new()
                .append(true)
                .create(true)
                .open(dir.join("raw.jsonl"))
                .unwrap(),
        ));
        let rate = run(
            "raw",
            threads,
            Arc::new(bytes_per_batch.clone()),
            n,
            move |b: &Vec<u8>| {
                let f = {
                    let f = file.lock().unwrap();
                    (&*f).write_all(b).unwrap();
                    f.try_clone().unwrap()
                };
                // Invariant: the lock is released here, before the sync.
                f.sync_data().unwrap();
            },
        );
        println!("raw append+fdatasync, {threads} thread(s): {rate:>10.0} msg/s");
        base.push(rate);
    }

    for threads in [1, 2] {
        let dir = scratch(&root, &format!("jsonl{threads}"));
        let s = sink(&dir, FileMode::Jsonl);
        let rate = run("jsonl", threads, Arc::clone(&data), n, move |b| {
            assert!(s.write_batch(b).iter().all(WriteOutcome::is_durable));
        });
        println!(
            "jsonl sink, {threads} thread(s):           {rate:>10.0} msg/s  ({:.2}x raw)",
            rate / base[threads - 1]
        );
    }

    let small = (n / 10).clamp(BATCH, 20_000);
    let per_event_data = Arc::new(batches(small));
    // Per batch: (stream sequence, encoded record) of each envelope.
    type EncodedBatch = Vec<(u64, Vec<u8>)>;
    // A batch's share per writer thread (BATCH / write_concurrency).
    let records: Arc<Vec<EncodedBatch>> = Arc::new(
        per_event_data
            .iter()
            .flat_map(|b| b.chunks(BATCH / PER_EVENT_WRITERS))
            .map(|chunk| {
                chunk
                    .iter()
                    .map(|e| {
                        let mut buf = Vec::new();
                        encode_record(&mut buf, e).unwrap();
                        (e.stream_sequence, buf)
                    })
                    .collect()
            })
            .collect(),
    );
    let dir = scratch(&root, "raw_files");
    fs::create_dir_all(&dir).unwrap();
    let writers = PER_EVENT_WRITERS;
    let raw_files = run("raw-files", writers, records, small, move |b| {
        for (seq, bytes) in b {
            let mut f = fs::File::create(dir.join(format!("{seq}.json"))).unwrap();
            f.write_all(bytes).unwrap();
            f.sync_all().unwrap();
        }
        fs::File::open(&dir).unwrap().sync_all().unwrap();
    });
    println!("raw create+write+fsync, {writers} threads ({small} msgs): {raw_files:>10.0} msg/s");
    let dir = scratch(&root, "per_event");
    let s = sink(&dir, FileMode::PerEvent);
    let rate = run("per-event", 2, per_event_data, small, move |b| {
        assert!(s.write_batch(b).iter().all(WriteOutcome::is_durable));
    });
    println!(
        "per_event sink, 2 threads ({small} msgs): {rate:>10.0} msg/s  ({:.2}x raw create+write+fsync)",
        rate / raw_files
    );
    let _ = fs::remove_dir_all(&root);
}
