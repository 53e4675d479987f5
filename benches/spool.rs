//! Spool throughput next to the sinks it stands in for, on the same disk and in the same run:
//! `cargo bench --bench spool [-- N]`.
//!
//! Prints messages per second of
//! - `jsonl direct`: the jsonl file sink's `write_batch` (one thread, batches of 256, one
//!   `fdatasync` per batch): the baseline the spool's append is compared with;
//! - `spool append`: `Spool::append` of the same batches (one `fdatasync` per batch, plus a
//!   directory fsync per new segment), and its ratio to `jsonl direct` (aim: at least 0.8);
//! - `drain -> jsonl`: `svc spool drain`'s loop (`Drainer::run_until_empty`, 256 records a
//!   step) into a fresh jsonl sink, and its ratio to `jsonl direct` (the same sink written
//!   directly);
//! - `object store direct` and `drain -> object store` (moto, keys by stream sequence, 16
//!   concurrent PUTs; bench runs only), and their ratio;
//! - `sealed append` and `sealed drain -> jsonl`: the same with the spool encrypted at rest
//!   (AES-256-GCM, `spool.encryption`), measured in the same rounds beside the spool in
//!   clear, and their ratios to it (aim for the drain: at least 0.8).
//!
//! Output goes below `SVC_BENCH_DIR` (default: the system temp directory) and is removed.
//! Envelopes carry a ~200-byte JSON payload.

#[path = "../tests/support/moto.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod moto;
#[path = "../tests/support/python.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod python;
mod support;

// The shared test helpers below reach the loopback helpers as `super::net`.
use support::net;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use svc::config::RuntimeConfig;
use svc::message::envelope::Envelope;
use svc::metrics::Metrics;
use svc::sink::spool::drain::Drainer;
use svc::sink::spool::seal::{SpoolEncryption, SpoolKey};
use svc::sink::spool::{Spool, SpoolConfig};
use svc::sink::{Sink, SinkConfig};

const BATCH: usize = 256;

fn sink_of(sink: serde_json::Value) -> SinkConfig {
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "a.>"},
        "sink": sink,
    });
    RuntimeConfig::parse(&doc.to_string()).unwrap().sink
}

fn jsonl(dir: &Path) -> Arc<dyn Sink> {
    std::fs::create_dir_all(dir).unwrap();
    sink_of(json!({"type": "file", "directory": dir, "mode": "jsonl"}))
        .build(Arc::new(Metrics::default()))
        .unwrap()
}

fn spool_config(dir: &Path, encryption: Option<&SpoolEncryption>) -> SpoolConfig {
    SpoolConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1 << 40,
        max_records: u64::MAX,
        after: Duration::ZERO,
        segment_bytes: 16 << 20,
        drain_batch: BATCH,
        max_backoff: Duration::from_secs(1),
        encryption: encryption.cloned(),
        allow_unencrypted: encryption.is_none(),
    }
}

/// A key file (mode 0600) in `dir`, as `spool.encryption` names it.
fn key(dir: &Path) -> SpoolEncryption {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("spool.key");
    let text = base64::engine::general_purpose::STANDARD.encode([0x5a; 32]);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    SpoolEncryption {
        current: SpoolKey {
            key_id: "bench".into(),
            key_file: path,
        },
        old_keys: Vec::new(),
    }
}

/// msg/s of writing every envelope to `sink` in batches.
fn direct(sink: &dyn Sink, envs: &[Envelope]) -> f64 {
    let start = Instant::now();
    for batch in envs.chunks(BATCH) {
        for o in sink.write_batch(batch) {
            assert!(o.is_durable(), "{o}");
        }
    }
    envs.len() as f64 / start.elapsed().as_secs_f64()
}

/// msg/s of appending every envelope to a new spool at `dir`; leaves the spool there.
fn append(cfg: &SpoolConfig, envs: &[Envelope]) -> f64 {
    let spool = Spool::open(cfg, Arc::new(Metrics::default())).unwrap();
    let start = Instant::now();
    for batch in envs.chunks(BATCH) {
        spool.append(batch).unwrap();
    }
    envs.len() as f64 / start.elapsed().as_secs_f64()
}

/// msg/s of draining the spool at `dir` into `sink`, from an open spool: a runner's drain
/// thread works on the spool it opened at start, and `open_rate` measures the opening scan.
fn drain(cfg: &SpoolConfig, sink: Arc<dyn Sink>, n: usize) -> f64 {
    let metrics = Arc::new(Metrics::default());
    let spool = Arc::new(Spool::open(cfg, metrics.clone()).unwrap());
    let start = Instant::now();
    let delivered = Drainer::new(spool, sink, metrics)
        .run_until_empty(1)
        .unwrap();
    assert_eq!(delivered as usize, n);
    n as f64 / start.elapsed().as_secs_f64()
}

/// Records per second of opening the spool at `dir` (the scan that checks every frame).
fn open_rate(cfg: &SpoolConfig, n: usize) -> f64 {
    let start = Instant::now();
    let spool = Spool::open(cfg, Arc::new(Metrics::default())).unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(spool.records() as usize, n);
    rate
}

const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn line(name: &str, rate: f64, base: Option<(&str, f64)>) {
    match base {
        Some((of, b)) => println!("  {name:<28} {rate:9.0} msg/s   {:.2}x {of}", rate / b),
        None => println!("  {name:<28} {rate:9.0} msg/s"),
    }
}

fn main() {
    let (benching, n) = support::bench_count(50_000, 2_000);
    let root = tempfile::Builder::new()
        .prefix("svc-spool-bench")
        .tempdir_in(
            std::env::var_os("SVC_BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into()),
        )
        .unwrap();
    let envs = support::order_envelopes(n);
    println!(
        "spool bench: {n} envelopes, batches of {BATCH}, in {}",
        root.path().display()
    );

    // The disk is shared: five rounds, each measuring the three side by side, and the
    // median of each figure.
    let (mut direct_rates, mut append_rates, mut drain_rates) = (vec![], vec![], vec![]);
    let (mut sealed_append, mut sealed_drain) = (vec![], vec![]);
    let mut open_rates = vec![];
    let enc = key(root.path());
    for round in 0..ROUNDS {
        let at = |name: &str| root.path().join(format!("{name}-{round}"));
        let clear = spool_config(&at("spool"), None);
        let sealed = spool_config(&at("sealed"), Some(&enc));
        direct_rates.push(direct(&*jsonl(&at("jsonl-direct")), &envs));
        append_rates.push(append(&clear, &envs));
        sealed_append.push(append(&sealed, &envs));
        open_rates.push(open_rate(&clear, n));
        drain_rates.push(drain(&clear, jsonl(&at("jsonl-drained")), n));
        sealed_drain.push(drain(&sealed, jsonl(&at("jsonl-unsealed")), n));
        println!(
            "  round {round}: jsonl direct {:.0}, spool append {:.0} (sealed {:.0}), drain -> \
             jsonl {:.0} (sealed {:.0}) msg/s",
            direct_rates[round],
            append_rates[round],
            sealed_append[round],
            drain_rates[round],
            sealed_drain[round]
        );
    }
    // Sealed next to clear, round by round.
    let per_round = |sealed: &[f64], clear: &[f64]| {
        median(sealed.iter().zip(clear).map(|(s, c)| s / c).collect())
    };
    let sealed_append_ratio = per_round(&sealed_append, &append_rates);
    let sealed_drain_ratio = per_round(&sealed_drain, &drain_rates);
    // Each round measures the three side by side: the median of the per-round ratios is
    // steadier than the ratio of medians when other work loads the disk between rounds.
    let ratio_of = |rates: &[f64]| {
        median(
            rates
                .iter()
                .zip(&direct_rates)
                .map(|(r, d)| r / d)
                .collect(),
        )
    };
    let (append_ratio, drain_ratio) = (ratio_of(&append_rates), ratio_of(&drain_rates));
    let jsonl_direct = median(direct_rates);
    line("jsonl direct (median)", jsonl_direct, None);
    let base = Some(("jsonl direct", jsonl_direct));
    line("spool append (median)", median(append_rates), base);
    line("drain -> jsonl (median)", median(drain_rates), base);
    println!(
        "  median of the rounds' own ratios: append {append_ratio:.2}x, drain -> jsonl \
         {drain_ratio:.2}x jsonl direct"
    );
    println!(
        "  opening scan (median)        {:9.0} records/s (once per start, before draining)",
        median(open_rates)
    );
    line("sealed append (median)", median(sealed_append), None);
    line("sealed drain -> jsonl (median)", median(sealed_drain), None);
    println!(
        "  encrypted at rest, median of the rounds' own ratios: append {sealed_append_ratio:.2}x, \
         drain -> jsonl {sealed_drain_ratio:.2}x the spool in clear"
    );

    if !benching {
        return;
    }
    let m = moto::Moto::start();
    m.create_bucket("direct", false);
    m.create_bucket("drained", false);
    let object_store = |bucket: &str| -> Arc<dyn Sink> {
        let SinkConfig::ObjectStore(cfg) = sink_of(json!({
            "type": "object_store", "bucket": bucket, "endpoint_url": m.endpoint(),
            "allow_http_for_local_testing": true, "credential_mode": "environment",
            "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
            "key_strategy": "stream_sequence", "max_concurrent_puts": 16}))
        else {
            unreachable!()
        };
        Arc::new(
            svc::sink::object_store::ObjectStoreSink::with_env(
                *cfg,
                Arc::new(Metrics::default()),
                &m.env(),
            )
            .unwrap(),
        )
    };
    // moto takes a few hundred objects per second: a smaller sample.
    let sample = &envs[..n.min(3_000)];
    let store_direct = direct(&*object_store("direct"), sample);
    line("object store direct", store_direct, None);
    let spool_o = spool_config(&root.path().join("spool-o"), None);
    append(&spool_o, sample);
    let store_drained = drain(&spool_o, object_store("drained"), sample.len());
    line(
        "drain -> object store",
        store_drained,
        Some(("object store direct", store_direct)),
    );
}
