//! What confirmed acknowledgements (`delivery.ack_confirmation`) cost `svc run`: the same
//! stream delivered into the jsonl file sink with plain ACKs and with every ACK confirmed by
//! the broker, in one run (issue: at least 0.7x plain ACK throughput).
//!
//! ```text
//! cargo bench --bench ack_confirmation            # N = 100000 messages of ~205 bytes
//! cargo bench --bench ack_confirmation -- 50000   # smaller N
//! ```
//!
//! Each run is a new durable consumer over the same stream, timed from the spawn of `svc run`
//! until the broker reports every message acknowledged ([`support::AckWatch`]). Plain runs are
//! made before and after the confirmed ones, alternating, and the ratio is of the means (a
//! 2-core host swings by several percent between runs).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

const SIZE: usize = 205;
const ROUNDS: usize = 2;

/// One `svc run` over the whole stream on a new consumer; messages per second.
fn run(broker: &support::Broker, n: usize, confirmed: bool, consumer: &str, dir: &Path) -> f64 {
    support::create_consumer(
        &broker.url,
        "ORDERS",
        consumer,
        "orders.>",
        Duration::from_secs(30),
    )
    .unwrap();
    let cfg = json!({
        "nats": {"url": broker.url, "stream": "ORDERS", "consumer": consumer, "subject": "orders.>"},
        "delivery": {"batch_size": 256, "max_in_flight_batches": 8, "sink_workers": 4,
                     "ack_confirmation": confirmed},
        "sink": {"type": "file", "mode": "jsonl", "directory": dir.join(consumer)},
        "logging": {"level": "warn"}
    });
    let cfg_path = dir.join(format!("{consumer}.json"));
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let mut acks = support::AckWatch::start(&broker.url, "ORDERS", consumer);
    let start = Instant::now();
    let mut child = support::spawn_svc_run(&cfg_path);
    acks.wait(n, |_| {
        assert!(child.try_wait().unwrap().is_none(), "svc exited early");
    });
    let rate = n as f64 / start.elapsed().as_secs_f64();
    support::terminate(child);
    let _ = std::fs::remove_dir_all(dir.join(consumer));
    rate
}

fn main() {
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench ack_confirmation`"
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
    println!("{n} messages of {SIZE} bytes on orders.created, jsonl sink, 4 sink workers");
    let (mut plain, mut confirmed) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        plain.push(run(
            &broker,
            n,
            false,
            &format!("plain-{round}"),
            dir.path(),
        ));
        confirmed.push(run(
            &broker,
            n,
            true,
            &format!("confirmed-{round}"),
            dir.path(),
        ));
    }
    plain.push(run(&broker, n, false, "plain-last", dir.path()));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (p, c) = (mean(&plain), mean(&confirmed));
    let list = |v: &[f64]| {
        v.iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("plain ACKs:     {} msg/s (mean {p:.0})", list(&plain));
    println!("confirmed ACKs: {} msg/s (mean {c:.0})", list(&confirmed));
    println!("| ACKs | throughput | vs plain |");
    println!("|---|---|---|");
    println!("| plain | {p:.0} msg/s | 1.00x |");
    println!("| confirmed | {c:.0} msg/s | {:.2}x |", c / p);
}
