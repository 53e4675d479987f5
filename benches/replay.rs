//! `svc replay` throughput next to `svc run`'s into the same sink (jsonl file sink), in one
//! run, with the ratio (issue 46 aims at >= 0.8x); then `svc dlq redrive`'s: dead letters per
//! second into the same sink, with its ratio to `svc run`.
//!
//! ```text
//! cargo bench --bench replay            # N = 100000 messages of ~205 bytes
//! cargo bench --bench replay -- 20000   # smaller N
//! ```
//!
//! `svc run` is timed from its spawn until the broker reports every message acknowledged on a
//! new durable consumer ([`support::AckWatch`]); `svc replay` from its spawn until it exits
//! (every message settled, the state file written after each batch). Both use the same
//! delivery settings and a fresh jsonl directory. They alternate for two rounds and the ratio
//! compares their means (a 2-core host swings by several percent between runs).
//!
//! The redrive: a `svc run` with a size policy below the message size dead-letters every
//! message into the `DLQ` stream (not timed); `svc dlq redrive` with the policy lifted is timed
//! from its spawn until it exits (each record's original fetched by sequence, stored, and the
//! record removed). One round: the redrive empties the dead-letter stream.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

const SIZE: usize = 205;
const ROUNDS: usize = 2;

fn config(broker: &support::Broker, consumer: &str, out: &Path) -> serde_json::Value {
    json!({
        "nats": {"url": broker.url, "stream": "ORDERS", "consumer": consumer, "subject": "orders.>"},
        "delivery": {"batch_size": 256, "max_in_flight_batches": 8, "sink_workers": 4},
        "sink": {"type": "file", "mode": "jsonl", "directory": out},
        "logging": {"level": "warn"}
    })
}

/// One `svc run` over the whole stream on a new consumer; messages per second.
fn run(broker: &support::Broker, n: usize, consumer: &str, dir: &Path) -> f64 {
    support::create_consumer(
        &broker.url,
        "ORDERS",
        consumer,
        "orders.>",
        Duration::from_secs(30),
    )
    .unwrap();
    let out = dir.join(consumer);
    let cfg_path = dir.join(format!("{consumer}.json"));
    std::fs::write(
        &cfg_path,
        serde_json::to_vec(&config(broker, consumer, &out)).unwrap(),
    )
    .unwrap();
    let mut acks = support::AckWatch::start(&broker.url, "ORDERS", consumer);
    let start = Instant::now();
    let mut child = support::spawn_svc_run(&cfg_path);
    acks.wait(n, |_| {
        assert!(child.try_wait().unwrap().is_none(), "svc exited early");
    });
    let rate = n as f64 / start.elapsed().as_secs_f64();
    support::terminate(child);
    let _ = std::fs::remove_dir_all(out);
    rate
}

/// One `svc replay` of the whole stream; messages per second.
fn replay(broker: &support::Broker, n: usize, name: &str, dir: &Path) -> f64 {
    let out = dir.join(name);
    let cfg_path = dir.join(format!("{name}.json"));
    std::fs::write(
        &cfg_path,
        serde_json::to_vec(&config(broker, "svc", &out)).unwrap(),
    )
    .unwrap();
    let svc = std::env::var_os("SVC_BENCH_SVC").unwrap_or(env!("CARGO_BIN_EXE_svc").into());
    let start = Instant::now();
    let done = std::process::Command::new(svc)
        .arg("replay")
        .arg(&cfg_path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let summary = String::from_utf8_lossy(&done.stdout);
    assert!(done.status.success(), "svc replay failed: {summary}");
    assert!(
        summary.contains(&format!("read {n}, stored {n},")),
        "{summary}"
    );
    let _ = std::fs::remove_dir_all(out);
    rate
}

/// `svc run` with a size policy that refuses every message: `n` dead letters in `DLQ`.
fn dead_letter_all(broker: &support::Broker, n: usize, dir: &Path) -> serde_json::Value {
    support::create_stream(&broker.url, "DLQ", &["dlq.orders"]).unwrap();
    support::create_consumer(
        &broker.url,
        "ORDERS",
        "dead",
        "orders.>",
        Duration::from_secs(30),
    )
    .unwrap();
    let mut cfg = config(broker, "dead", &dir.join("dead-out"));
    cfg["dead_letter"] =
        json!({"enabled": true, "subject": "dlq.orders", "expected_stream": "DLQ"});
    let mut broken = cfg.clone();
    broken["size_policy"] = json!({"enabled": true, "max_payload_bytes": SIZE / 2});
    broken["logging"] = json!({"level": "error"});
    let path = dir.join("dead.json");
    std::fs::write(&path, serde_json::to_vec(&broken).unwrap()).unwrap();
    let child = support::spawn_svc_run(&path);
    let js = nats::jetstream::new(support::connect(&broker.url).unwrap());
    let deadline = Instant::now() + Duration::from_secs(600);
    while js.stream_info("DLQ").unwrap().state.messages < n as u64
        || support::consumer_state(&broker.url, "ORDERS", "dead").unwrap() != (n as u64, 0, 0)
    {
        assert!(
            Instant::now() < deadline,
            "the dead letters never all arrived"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    support::terminate(child);
    cfg
}

/// One `svc dlq redrive` of `n` dead letters into the jsonl sink; dead letters per second.
fn redrive(broker: &support::Broker, n: usize, dir: &Path) -> f64 {
    let mut cfg = dead_letter_all(broker, n, dir);
    let out = dir.join("redrive-out");
    cfg["sink"]["directory"] = json!(out);
    let path = dir.join("redrive.json");
    std::fs::write(&path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let svc = std::env::var_os("SVC_BENCH_SVC").unwrap_or(env!("CARGO_BIN_EXE_svc").into());
    let start = Instant::now();
    let done = std::process::Command::new(svc)
        .args(["dlq", "redrive"])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let summary = String::from_utf8_lossy(&done.stdout);
    assert!(done.status.success(), "svc dlq redrive failed: {summary}");
    assert!(
        summary.contains(&format!("redrive: read {n}, stored {n},"))
            && summary.contains(&format!("removed {n}")),
        "{summary}"
    );
    let js = nats::jetstream::new(support::connect(&broker.url).unwrap());
    assert_eq!(js.stream_info("DLQ").unwrap().state.messages, 0);
    let _ = std::fs::remove_dir_all(out);
    rate
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn main() {
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench replay`"
        );
    }
    let (_, n) = support::bench_count(100_000, 2_000);
    let dir = match std::env::var_os("SVC_BENCH_DIR") {
        Some(base) => tempfile::tempdir_in(base).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let broker = support::start_broker();
    support::create_stream(&broker.url, "ORDERS", &["orders.>"]).unwrap();
    support::publish(&broker.url, "ORDERS", "orders.created", n, SIZE).unwrap();
    println!("{n} messages of {SIZE} bytes on orders.created, jsonl sink, batch 256 x 8");
    let (mut runs, mut replays) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        runs.push(run(&broker, n, &format!("run-{round}"), dir.path()));
        replays.push(replay(&broker, n, &format!("replay-{round}"), dir.path()));
        println!(
            "round {round}: svc run {:.0} msg/s, svc replay {:.0} msg/s",
            runs[round], replays[round]
        );
    }
    let (run, replay) = (mean(&runs), mean(&replays));
    println!(
        "svc replay vs svc run (jsonl): {:.2}x ({replay:.0} vs {run:.0} msg/s; aim >= 0.8x)",
        replay / run
    );
    let redrive = redrive(&broker, n, dir.path());
    println!(
        "svc dlq redrive vs svc run (jsonl): {:.4}x ({redrive:.0} dead letters/s vs {run:.0} msg/s)",
        redrive / run
    );
}
