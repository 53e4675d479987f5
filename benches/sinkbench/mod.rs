//! Shared by the relational and fan-out benchmarks: a private broker, a private PostgreSQL
//! database, and `svc run` timed until every message is acknowledged.
#![allow(dead_code, deprecated)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svc::sink::relational::wire::{
    AuthPolicy, ChannelBindingMode, ConnectParams, Connection, TlsMode,
};

#[path = "../support/mod.rs"]
pub mod support;

pub const SIZE: usize = 205;

pub use support::start_broker;

fn pg(database: &str) -> ConnectParams {
    ConnectParams {
        host: "127.0.0.1".into(),
        port: 5432,
        user: "postgres".into(),
        database: database.into(),
        application_name: "svc-bench".into(),
        tls: TlsMode::Disable,
        tls_config: None,
        // The shared test server trusts loopback: it asks for no authentication.
        require_auth: AuthPolicy::parse("none").unwrap(),
        channel_binding: ChannelBindingMode::Prefer,
        scram_min_iterations: 4096,
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(120),
    }
}

/// A database of its own on the local PostgreSQL, dropped at the end.
pub struct BenchDb {
    pub name: String,
}

impl BenchDb {
    pub fn new(tag: &str) -> BenchDb {
        let name = format!("svc_bench_{tag}_{}", std::process::id());
        let mut admin = Connection::connect(&pg("postgres"), None)
            .expect("PostgreSQL on 127.0.0.1:5432 with trust auth");
        admin
            .simple(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .unwrap();
        admin
            .simple(&format!("CREATE DATABASE \"{name}\""))
            .unwrap();
        BenchDb { name }
    }

    pub fn sink(&self, table: &str) -> serde_json::Value {
        serde_json::json!({
            "type": "relational_db",
            "dsn": format!("postgresql://postgres@127.0.0.1:5432/{}", self.name),
            "tls_mode": "disable",
            // The shared server trusts loopback: it asks for no authentication.
            "require_auth": "none",
            "table": table,
            "auto_create_tables": true,
        })
    }

    pub fn count(&self, table: &str) -> u64 {
        Connection::connect(&pg(&self.name), None)
            .unwrap()
            .query(&format!("SELECT count(*) FROM \"{table}\""), &[])
            .unwrap()
            .rows[0][0]
            .as_deref()
            .unwrap()
            .parse()
            .unwrap()
    }
}

impl Drop for BenchDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = Connection::connect(&pg("postgres"), None) {
            let _ = admin.simple(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ));
        }
    }
}

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
