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
    /// CPU seconds over the run: the `svc` process, the broker, and the database's share
    /// (what `db_cpu` counted; zero when the caller counts none).
    pub svc_cpu_s: f64,
    pub broker_cpu_s: f64,
    pub db_cpu_s: f64,
}

/// CPU seconds (user + system) of every process whose command line starts with `prefix` and
/// contains `needle`: e.g. the PostgreSQL backends serving one database
/// (`postgres: user db 127.0.0.1(port) ...`), or `mariadbd` whole. A process that exited
/// before the call is not counted, so read before closing connections.
pub fn cpu_of_processes(prefix: &str, needle: &str) -> f64 {
    pids_of(prefix, needle)
        .into_iter()
        .map(support::process_cpu_seconds)
        .sum()
}

/// The processes whose command line starts with `prefix` and contains `needle`.
pub fn pids_of(prefix: &str, needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                c.starts_with(prefix) && c.contains(needle)
            })
        })
        .collect()
}

/// Runs `svc run` on a new durable `consumer` until `n` messages are acknowledged, counting CPU
/// seconds: of `svc`, of `broker` when given, and `db_cpu()` (read before `svc` stops, while
/// its database sessions still exist).
#[allow(clippy::too_many_arguments)]
pub fn run_svc(
    url: &str,
    broker: Option<&support::Broker>,
    stream: &str,
    subject: &str,
    consumer: &str,
    n: usize,
    sink: serde_json::Value,
    dir: &Path,
    env: &[(String, String)],
    db_cpu: &dyn Fn() -> f64,
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
    // The first ack times the start-up; later acks are not copied to this process (each copy
    // cost the broker CPU that the run shares: support::AckWatch).
    let mut acks = support::AckWatch::timing_first(url, stream, consumer);
    let broker_cpu = || broker.map_or(0.0, |b| b.cpu_seconds());
    let (broker_before, db_before) = (broker_cpu(), db_cpu());
    let start = Instant::now();
    // SVC_BENCH_WRAPPER="valgrind --tool=callgrind": `svc` runs under that command, to see
    // where its time goes (the rate is then the tool's, not the runner's).
    let wrapper = std::env::var("SVC_BENCH_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut child = match words.next() {
        Some(tool) => {
            let mut c = Command::new(tool);
            c.args(words).arg(env!("CARGO_BIN_EXE_svc"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_svc")),
    };
    let mut child = child
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
    let svc_cpu_s = support::process_cpu_seconds(child.id());
    let (broker_cpu_s, db_cpu_s) = (broker_cpu() - broker_before, db_cpu() - db_before);
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
        svc_cpu_s,
        broker_cpu_s,
        db_cpu_s,
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
