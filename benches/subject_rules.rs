//! What subject rules cost `svc run`: 1, 10, 100 and 1,000 rules in each of two first-match
//! lists (message metadata and the pre-sink policy), the matching rule last, against the same
//! run with no rules, in one run (issue: a thousand rules must cost what one does).
//!
//! ```text
//! cargo bench --bench subject_rules            # N = 100000 messages of ~205 bytes
//! cargo bench --bench subject_rules -- 50000   # smaller N
//! SVC_BENCH_SVC=/path/to/other/svc cargo bench --bench subject_rules   # another build
//! ```
//!
//! Each run is a new durable consumer over the same stream, into the jsonl file sink, timed
//! from the spawn of `svc run` until the broker reports every message acknowledged (the
//! runner-throughput bench's [`support::AckWatch`]). The rules that do not match share the
//! subject's first token (`orders.t<i>.>` against `orders.created`), so a linear scan compares
//! two tokens per rule. The run without rules is made before and after the others, and each
//! ratio is against their mean (a 2-core host swings by several percent between runs).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svc::message::subject::{SubjectIndex, SubjectPattern};

const SIZE: usize = 205;
const RULE_COUNTS: [usize; 4] = [1, 10, 100, 1000];

/// `message_metadata` and `pre_sink_policy` blocks with `rules` rules each, the last one
/// matching `orders.created`; `None`: the run without rules.
fn rule_blocks(rules: usize) -> (Value, Value) {
    if rules == 0 {
        return (json!({}), json!({"enabled": false}));
    }
    let miss = |i: usize| format!("orders.t{i}.>");
    let mut metadata: Vec<Value> = (0..rules - 1)
        .map(|i| json!({"subject": miss(i), "priority": "high"}))
        .collect();
    metadata.push(json!({"subject": "orders.>", "priority": "normal"}));
    let mut policy: Vec<Value> = (0..rules - 1)
        .map(|i| json!({"subject": miss(i), "require_priority": ["high"]}))
        .collect();
    policy.push(json!({"subject": "orders.>", "max_payload_bytes": 1 << 20}));
    (
        json!({"rules": metadata}),
        json!({"enabled": true, "rules": policy}),
    )
}

/// One `svc run` over the whole stream on a new consumer; messages per second.
fn run(broker: &support::Broker, n: usize, rules: usize, consumer: &str, dir: &Path) -> f64 {
    support::create_consumer(
        &broker.url,
        "ORDERS",
        consumer,
        "orders.>",
        Duration::from_secs(30),
    )
    .unwrap();
    let (metadata, policy) = rule_blocks(rules);
    let cfg = json!({
        "nats": {"url": broker.url, "stream": "ORDERS", "consumer": consumer, "subject": "orders.>"},
        "delivery": {"batch_size": 256, "max_in_flight_batches": 8, "sink_workers": 4},
        "sink": {"type": "file", "mode": "jsonl", "directory": dir.join(consumer)},
        "message_metadata": metadata,
        "pre_sink_policy": policy,
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

/// Nanoseconds per lookup of `orders.created` among `rules` patterns (the last one matching):
/// the compiled index, and the linear scan it replaced.
fn lookup_ns(rules: usize) -> (f64, f64) {
    let mut patterns: Vec<SubjectPattern> = (0..rules - 1)
        .map(|i| SubjectPattern::parse(&format!("orders.t{i}.>")).unwrap())
        .collect();
    patterns.push(SubjectPattern::parse("orders.>").unwrap());
    let index = SubjectIndex::new(&patterns);
    let rounds = 2_000_000 / rules;
    let time = |f: &dyn Fn(&str) -> Option<usize>| {
        let start = Instant::now();
        for _ in 0..rounds {
            assert_eq!(f(std::hint::black_box("orders.created")), Some(rules - 1));
        }
        start.elapsed().as_nanos() as f64 / rounds as f64
    };
    (
        time(&|s| index.first_match(s)),
        time(&|s| patterns.iter().position(|p| p.matches(s))),
    )
}

fn main() {
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench subject_rules`"
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

    let before = run(&broker, n, 0, "none-a", dir.path());
    let rates: Vec<(usize, f64)> = RULE_COUNTS
        .iter()
        .map(|&rules| {
            (
                rules,
                run(&broker, n, rules, &format!("rules-{rules}"), dir.path()),
            )
        })
        .collect();
    let after = run(&broker, n, 0, "none-b", dir.path());
    println!("one lookup, the matching rule last: compiled index vs linear scan");
    for rules in RULE_COUNTS {
        let (index, linear) = lookup_ns(rules);
        println!("  {rules:>4} rules: {index:.0} ns vs {linear:.0} ns");
    }
    let baseline = (before + after) / 2.0;
    println!("no rules: {before:.0} msg/s before, {after:.0} msg/s after the runs with rules");
    println!("| rules per list | throughput vs no rules |");
    println!("|---|---|");
    for (rules, rate) in rates {
        println!(
            "| {rules} | {:.2}x ({rate:.0} vs {baseline:.0} msg/s) |",
            rate / baseline
        );
    }
}
