//! Fan-out overhead: `svc run` into a fan-out of a file child and an object-store child (moto,
//! signature checking enforced) against each child alone, in one run on the same backlog (one
//! stream, one durable consumer per measurement).
//!
//! ```text
//! cargo bench --bench fanout_overhead            # N = 4000 messages of ~205 bytes
//! cargo bench --bench fanout_overhead -- 2000
//! ```
//!
//! Prints each child alone, the fan-out with both children required, the fan-out with the
//! slower child required and the faster one optional, and the ratio of each fan-out to the
//! slower child alone (1.00x = no overhead: the fan-out is as fast as its slowest required
//! child). Each configuration runs twice, interleaved, and the best rate of each is shown (the
//! host is shared). Under `cargo test --all-targets` it runs a smoke pass of 200 messages, one
//! round. Needs nats-server, python3 with moto[server], boto3 and waitress (scripts/deps.sh).

#[path = "../tests/support/moto.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod moto;
#[path = "../tests/support/python.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod python;
mod sinkbench;

use serde_json::json;
// The shared test helpers above reach the loopback helpers as `super::net`.
use sinkbench::support::net;
use sinkbench::{support, SIZE};

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench fanout_overhead`"
        );
    }
    let n = sinkbench::arg_n(4_000, 200);
    let rounds = if sinkbench::full() { 2 } else { 1 };
    let dir = tempfile::tempdir().unwrap();
    let store = moto::Moto::start();
    let env: Vec<(String, String)> = store.env().into_iter().collect();
    let broker = sinkbench::start_broker();
    support::create_stream(&broker.url, "FAN", &["fan.>"]).unwrap();
    let p = support::publish(&broker.url, "FAN", "fan.orders", n, SIZE).unwrap();
    println!("published {n} messages of {SIZE} bytes ({p:.0} msg/s)");

    let file = |name: &str| json!({"type": "file", "directory": dir.path().join(name)});
    let archive = |bucket: &str| {
        // Versioned: "every object once" counts versions, so a rewrite would show.
        store.create_bucket(bucket, true);
        json!({
            "type": "object_store", "bucket": bucket, "endpoint_url": store.endpoint(),
            "allow_http_for_local_testing": true, "credential_mode": "environment",
            "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
            "key_strategy": "stream_sequence"
        })
    };
    let run = |consumer: &str, sink: serde_json::Value| {
        sinkbench::run_svc(
            &broker.url,
            None,
            "FAN",
            "fan.>",
            consumer,
            n,
            sink,
            dir.path(),
            &env,
            &|| 0.0,
        )
        .rate
    };

    let (mut file_alone, mut store_alone, mut both, mut optional) = (0f64, 0f64, 0f64, 0f64);
    let mut slow = ("", "", "");
    for round in 0..rounds {
        let c = |name: &str| format!("{name}-{round}");
        file_alone = file_alone.max(run(&c("file-alone"), file(&c("f-alone"))));
        store_alone = store_alone.max(run(&c("store-alone"), archive(&c("s-alone"))));
        both = both.max(run(
            &c("fan-both"),
            json!({"type": "fanout",
                   "sinks": {"files": file(&c("f-both")), "archive": archive(&c("s-both"))},
                   "routing": {"enabled": false}}),
        ));
        assert_eq!(store.versions(&c("s-both")).len(), n, "every object once");
        // The slower child stays required; the faster one becomes optional (its defaults:
        // object store 1000 / 5000 ms, file 0 / 5000 ms).
        slow = if file_alone <= store_alone {
            ("file (per event, fsync)", "files", "archive")
        } else {
            ("object_store (moto)", "archive", "files")
        };
        optional = optional.max(run(
            &c("fan-optional"),
            json!({"type": "fanout",
                   "sinks": {"files": file(&c("f-opt")), "archive": archive(&c("s-opt"))},
                   "routing": {"enabled": true, "routes": [
                       {"name": "all", "match": {"subject": ">"},
                        "targets": [slow.1, {"sink": slow.2, "required": false}]}]}}),
        ));
    }
    let (slow_name, slow_child, fast_name) = slow;
    let slow_rate = file_alone.min(store_alone);

    println!();
    println!("fan-out overhead, {SIZE}-byte messages, broker + moto + svc on one 2-core host");
    println!("  file child alone (per event, fsync)      {file_alone:>9.0} msg/s");
    println!("  object_store child alone (moto)          {store_alone:>9.0} msg/s");
    println!("  slower child alone: {slow_name}");
    println!(
        "  fan-out, both required                   {both:>9.0} msg/s   ratio {:.2}x of the slower child alone",
        both / slow_rate
    );
    let label = format!("fan-out, {slow_child} required, {fast_name} optional");
    println!(
        "  {label:<41}{optional:>9.0} msg/s   ratio {:.2}x of the slower child alone",
        optional / slow_rate
    );
}
