//! Shared by the relational and fan-out benchmarks: a private broker, a private PostgreSQL
//! database, and `svc run` timed until every message is acknowledged.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/support/mysql.rs"]
pub mod mysql;
#[path = "../../tests/support/postgres.rs"]
pub mod postgres;
#[path = "../support/mod.rs"]
pub mod support;

pub const SIZE: usize = 205;

pub use support::start_broker;

/// One `svc run` measurement.
pub struct Run {
    /// Acknowledged messages per second, process start to last ACK.
    pub rate: f64,
    /// Seconds from process start to the first acknowledged message (start-up, connects).
    pub first_ack_s: f64,
    /// Sink batches written and their mean write time (from the metrics snapshot).
    pub batches: u64,
    pub mean_batch_ms: f64,
}

/// Runs `svc run` on a new durable `consumer` until `n` messages are acknowledged.
#[allow(clippy::too_many_arguments)]
pub fn run_svc(
    url: &str,
    stream: &str,
    subject: &str,
    consumer: &str,
    n: usize,
    sink: serde_json::Value,
    dir: &Path,
    env: &[(String, String)],
) -> Run {
    support::create_consumer(url, stream, consumer, subject, Duration::from_secs(60)).unwrap();
    let cfg = serde_json::json!({
        "nats": {"url": url, "stream": stream, "consumer": consumer, "subject": subject},
        "delivery": {"batch_size": 256, "max_in_flight_batches": 4, "sink_workers": 2},
        "sink": sink,
        "metrics": {"enabled": true, "snapshot_file": dir.join(format!("{consumer}.metrics.json")),
                    "write_interval_seconds": 1},
        "logging": {"level": "warn"}
    });
    let cfg_path = dir.join(format!("{consumer}.json"));
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    // Counting every ack (not only the end): the first one times the start-up.
    let mut acks = support::AckWatch::counting(url, stream, consumer);
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("run")
        .arg(&cfg_path)
        .envs(env.iter().cloned())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut first_ack_s = None;
    acks.wait(n, |acked| {
        if acked.unwrap_or(0) > 0 && first_ack_s.is_none() {
            first_ack_s = Some(start.elapsed().as_secs_f64());
        }
        assert!(child.try_wait().unwrap().is_none(), "svc exited early");
    });
    let rate = n as f64 / start.elapsed().as_secs_f64();
    support::terminate(child);
    // The final snapshot is written at exit.
    let snap: serde_json::Value = std::fs::read(dir.join(format!("{consumer}.metrics.json")))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let s = &snap["summaries"]["sink_batch_write_seconds"];
    let batches = s["count"].as_u64().unwrap_or(0);
    let mean_batch_ms = s["sum"].as_f64().unwrap_or(0.0) * 1000.0 / batches.max(1) as f64;
    Run {
        rate,
        first_ack_s: first_ack_s.unwrap_or(0.0),
        batches,
        mean_batch_ms,
    }
}

/// Full measurement under `cargo bench` (which passes `--bench`); a short smoke pass under
/// `cargo test --all-targets`.
pub fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// `n` from the first numeric argument, else `default` (full) or `smoke` (under cargo test).
pub fn arg_n(default: usize, smoke: usize) -> usize {
    std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(if full() { default } else { smoke })
}
