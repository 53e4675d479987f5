//! `jsctl`: the JetStream control tool of the demo and the benchmarks (not shipped).
//!
//! ```text
//! cargo bench --bench jsctl -- stream   <url> <stream> <subjects>
//! cargo bench --bench jsctl -- consumer <url> <stream> <name> <filter> [ack_wait_s]
//! cargo bench --bench jsctl -- publish  <url> <stream> <subject> <count> [size_bytes]
//! cargo bench --bench jsctl -- state    <url> <stream> <consumer>
//! cargo bench --bench jsctl -- raw      <url> <stream> <consumer> <filter> <count> [batch]
//! ```

mod support;

use std::time::Duration;

fn main() {
    // cargo appends harness flags (`--bench`, and under `cargo test` whatever follows `--`,
    // e.g. `--test-threads=4`); none of jsctl's own arguments start with `--`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if args.is_empty() {
        // `cargo test --all-targets` runs every bench target without arguments.
        println!("jsctl: no command (see the header of benches/jsctl.rs)");
        return;
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match a.as_slice() {
        ["stream", url, stream, subjects] => {
            support::create_stream(url, stream, &subjects.split(',').collect::<Vec<_>>())
        }
        ["consumer", url, stream, name, filter, rest @ ..] => {
            let ack_wait = rest.first().and_then(|s| s.parse().ok()).unwrap_or(30);
            support::create_consumer(url, stream, name, filter, Duration::from_secs(ack_wait))
        }
        ["publish", url, stream, subject, count, rest @ ..] => {
            let size = rest.first().and_then(|s| s.parse().ok()).unwrap_or(200);
            let count: usize = count.parse().expect("count");
            support::publish(url, stream, subject, count, size).map(|rate| {
                println!("published {count} messages of ~{size} bytes ({rate:.0} msg/s)");
            })
        }
        ["state", url, stream, consumer] => {
            support::consumer_state(url, stream, consumer).map(|(floor, pending, waiting)| {
                println!("ack_floor={floor} ack_pending={pending} not_delivered={waiting}");
            })
        }
        ["raw", url, stream, consumer, filter, count, rest @ ..] => {
            // The raw fetch+ack limit of runner_throughput, on its own (for profiling).
            let batch = rest.first().and_then(|s| s.parse().ok()).unwrap_or(256);
            let count: usize = count.parse().expect("count");
            support::raw_fetch_ack(url, stream, consumer, filter, count, batch, Duration::ZERO).map(
                |rate| {
                    println!("raw fetch+ack: {count} messages, batch {batch}: {rate:.0} msg/s");
                },
            )
        }
        _ => {
            eprintln!("usage: see the header of benches/jsctl.rs");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("jsctl: {e}");
        std::process::exit(1);
    }
}
