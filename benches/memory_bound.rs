//! Peak memory of `svc run` with large messages: the byte bound (`delivery.max_in_flight_bytes`).
//!
//! ```text
//! cargo bench --bench memory_bound                 # 1 MiB and 8 MiB messages, 320 MiB each
//! SVC_BENCH_BOUND_MIB=32 cargo bench --bench memory_bound
//! SVC_BENCH_SVC=/path/to/other/svc cargo bench --bench memory_bound   # the same for another build
//! SVC_BENCH_SIZES_MIB=8 SVC_BENCH_SINKS=object_store cargo bench --bench memory_bound
//! ```
//!
//! For each message size (1 MiB, the broker's default `max_payload`, and 8 MiB on a broker
//! configured for it) and each sink (file `jsonl`, file `per_event`, object store in moto), a
//! backlog several times the bound is published, `svc run` drains it with the default
//! delivery settings, and its peak resident set (VmHWM) is read from /proc while it runs.
//! Printed beside it: the target (2 x the bound + 32 MiB) and the ratio peak / target, which
//! must stay at or below 1. Throughput of small messages is `runner_throughput`'s job.

mod support;

// The shared test helpers below reach the loopback helpers as `super::net`.
use support::net;

#[path = "../tests/support/moto.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod moto;
#[path = "../tests/support/python.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod python;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

const MIB: usize = 1024 * 1024;

struct Case<'a> {
    message_bytes: usize,
    sink: &'a str,
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn spawn_svc(config: &Path, env: &HashMap<String, String>) -> Child {
    let svc = std::env::var_os("SVC_BENCH_SVC").unwrap_or(env!("CARGO_BIN_EXE_svc").into());
    Command::new(svc)
        .arg("run")
        .arg(config)
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// One bucket per case: keys are stream sequences, and another case's object under the same
/// key holds another message (the sink rightly refuses to count it as this one).
fn bucket(case: &Case<'_>) -> String {
    format!("bound-{}-mib", case.message_bytes / MIB)
}

fn sink_config(case: &Case<'_>, dir: &Path, m: &moto::Moto) -> serde_json::Value {
    match case.sink {
        "jsonl" | "per_event" => json!({
            "type": "file", "directory": dir.join("out"), "mode": case.sink,
        }),
        _ => json!({
            "type": "object_store", "bucket": bucket(case), "endpoint_url": m.endpoint(),
            "allow_http_for_local_testing": true, "credential_mode": "environment",
            "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
            "key_strategy": "stream_sequence", "max_object_bytes": 64 * MIB,
        }),
    }
}

/// Drains a backlog of `count` messages of `case.message_bytes` and returns svc's peak RSS in
/// KiB and the run's seconds.
fn run(case: &Case<'_>, count: usize, bound: Option<usize>, m: &moto::Moto) -> (u64, f64) {
    let max_payload = case.message_bytes.max(MIB) + 64 * 1024;
    let broker = support::start_broker_with_config(&format!("max_payload: {max_payload}\n"));
    let url = broker.url.clone();
    let dir = tempfile::tempdir().unwrap();
    support::create_stream(&url, "BIG", &["big.>"]).unwrap();
    support::publish(&url, "BIG", "big.orders", count, case.message_bytes).unwrap();
    support::create_consumer(&url, "BIG", "svc", "big.>", Duration::from_secs(60)).unwrap();
    let mut delivery = json!({});
    if let Some(bound) = bound {
        delivery["max_in_flight_bytes"] = json!(bound);
    }
    let cfg = json!({
        "nats": {"url": url, "stream": "BIG", "consumer": "svc", "subject": "big.>"},
        "delivery": delivery,
        "sink": sink_config(case, dir.path(), m),
        "logging": {"level": "warn"}
    });
    let cfg_path = dir.path().join("svc.json");
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let mut acks = support::AckWatch::start(&url, "BIG", "svc");
    let start = Instant::now();
    let mut child = spawn_svc(&cfg_path, &m.env());
    let pid = child.id();
    let mut peak = 0;
    acks.wait(count, |_| {
        assert!(child.try_wait().unwrap().is_none(), "svc exited early");
        peak = peak.max(support::peak_rss_kib(pid));
    });
    let seconds = start.elapsed().as_secs_f64();
    peak = peak.max(support::peak_rss_kib(pid));
    support::terminate(child);
    (peak, seconds)
}

fn main() {
    let (benching, _) = support::bench_count(0, 0);
    let bound_mib = env_num("SVC_BENCH_BOUND_MIB", 64);
    let backlog_mib = if benching {
        env_num("SVC_BENCH_BACKLOG_MIB", 320)
    } else {
        4
    };
    let m = moto::Moto::start();
    let list = |name: &str, all: &str| {
        std::env::var(name)
            .unwrap_or(all.into())
            .split(',')
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let sizes: Vec<usize> = list("SVC_BENCH_SIZES_MIB", if benching { "1,8" } else { "1" })
        .iter()
        .map(|s| {
            s.parse::<usize>()
                .expect("SVC_BENCH_SIZES_MIB: MiB numbers")
                * MIB
        })
        .collect();
    let sinks = list(
        "SVC_BENCH_SINKS",
        if benching {
            "jsonl,per_event,object_store"
        } else {
            "jsonl"
        },
    );
    let bound = (bound_mib != 64).then_some(bound_mib * MIB);
    let target_kib = (2 * bound_mib + 32) as u64 * 1024;
    if !benching {
        println!("memory_bound smoke pass (4 MiB backlog): not a measurement");
    }
    println!(
        "memory_bound: delivery.max_in_flight_bytes {bound_mib} MiB, backlog {backlog_mib} MiB \
         per case, target peak RSS 2 x bound + 32 MiB = {} MiB",
        target_kib / 1024
    );
    for &message_bytes in &sizes {
        for sink in &sinks {
            let case = Case {
                message_bytes,
                sink,
            };
            if case.sink == "object_store" {
                m.create_bucket(&bucket(&case), false);
            }
            let count = (backlog_mib * MIB).div_ceil(message_bytes);
            let (peak_kib, seconds) = run(&case, count, bound, &m);
            println!(
                "  {:>2} MiB x {count:>4}  {sink:<12} peak RSS {:>6.1} MiB  ratio to target {:.2}  \
                 ({:.1} MiB/s)",
                message_bytes / MIB,
                peak_kib as f64 / 1024.0,
                peak_kib as f64 / target_kib as f64,
                (count * message_bytes) as f64 / MIB as f64 / seconds
            );
        }
    }
}
