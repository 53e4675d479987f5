//! Fan-out overhead: `svc run` into a fan-out of two children against each child alone, in one
//! run on the same backlog (one stream, one durable consumer per measurement).
//!
//! ```text
//! cargo bench --bench fanout_overhead            # N = 20000 messages of ~205 bytes
//! cargo bench --bench fanout_overhead -- 5000
//! ```
//!
//! Under `cargo test --all-targets` it runs a smoke pass of 300 messages, one round.
//!
//! Prints each child alone, the fan-out with both children required, the fan-out with the
//! slower child's partner optional, and the ratio of each fan-out to the slower child alone
//! (1.00x = no overhead: the fan-out is as fast as its slowest required child). Each
//! configuration runs twice, interleaved; the best rate of each is shown.
#![allow(deprecated)]

mod sinkbench;

use serde_json::json;
use sinkbench::{support, BenchDb, SIZE};

fn main() {
    let n = sinkbench::arg_n(20_000, 300);
    let dir = tempfile::tempdir().unwrap();
    let db = BenchDb::new("fan");
    let broker = sinkbench::start_broker();
    support::create_stream(&broker.url, "FAN", &["fan.>"]).unwrap();
    let p = support::publish(&broker.url, "FAN", "fan.orders", n, SIZE).unwrap();
    println!("published {n} messages of {SIZE} bytes ({p:.0} msg/s)");

    let file = |name: &str| json!({"type": "file", "directory": dir.path().join(name)});
    let run = |consumer: &str, sink: serde_json::Value| {
        sinkbench::run_svc(&broker.url, "FAN", "fan.>", consumer, n, sink, dir.path()).rate
    };

    // The host is shared: each configuration runs twice (once in a smoke pass), interleaved, and the best
    // rate of each is reported (the least disturbed run).
    let rounds = if sinkbench::full() { 2 } else { 1 };
    let (mut file_alone, mut db_alone, mut both, mut optional) = (0f64, 0f64, 0f64, 0f64);
    let mut slow = ("", "", "");
    for round in 0..rounds {
        let c = |name: &str| format!("{name}_{round}");
        file_alone = file_alone.max(run(&c("file_alone"), file(&c("f_alone"))));
        db_alone = db_alone.max(run(&c("db_alone"), db.sink(&c("alone"))));
        both = both.max(run(
            &c("fan_both"),
            json!({"type": "fanout",
                   "sinks": {"files": file(&c("f_both")), "db": db.sink(&c("both"))},
                   "routing": {"enabled": false}}),
        ));
        assert_eq!(db.count(&c("both")), n as u64);
        // The slower child stays required; the faster one becomes optional.
        slow = if file_alone <= db_alone {
            ("file (per event, fsync)", "files", "db")
        } else {
            ("relational_db", "db", "files")
        };
        optional = optional.max(run(
            &c("fan_optional"),
            json!({"type": "fanout",
                   "sinks": {"files": file(&c("f_opt")), "db": db.sink(&c("opt"))},
                   "routing": {"enabled": true, "routes": [
                       {"name": "all", "match": {"subject": ">"},
                        "targets": [slow.1,
                                    {"sink": slow.2, "required": false, "timeout_ms": 5000}]}]}}),
        ));
    }
    let (slow_name, slow_child, fast_name) = slow;
    let slow_rate = file_alone.min(db_alone);

    println!();
    println!(
        "fan-out overhead, {SIZE}-byte messages, broker + PostgreSQL + svc on one 2-core host"
    );
    println!("  file child alone (per event, fsync)      {file_alone:>9.0} msg/s");
    println!("  relational_db child alone                {db_alone:>9.0} msg/s");
    println!("  slower child alone: {slow_name}");
    println!(
        "  fan-out, both required                   {both:>9.0} msg/s   ratio {:.2}x of the slower child alone",
        both / slow_rate
    );
    println!(
        "  fan-out, {slow_child} required + {fast_name} optional  {optional:>9.0} msg/s   ratio {:.2}x of the slower child alone",
        optional / slow_rate
    );
}
