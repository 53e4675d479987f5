//! DLQ publish cost: confirmed publishes through `DeadLetterPublisher` (own inbox + flush +
//! PubAck) against the crate's `JetStream::publish_message` (same confirmation, but the
//! client's 5 ms flusher delays each request), measured in the same run on a private
//! nats-server. Prints figures and the ratio; asserts nothing about time.
//!
//! Run: `cargo bench --bench dlq_publish` (needs nats-server; `SVC_NATS_SERVER` picks another).

#[path = "../tests/support/broker.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod broker;
#[path = "../tests/support/net.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod net;

use std::time::{Duration, Instant};

use svc::broker::dead_letter::{DeadLetter, DeadLetterConfig, DeadLetterPublisher, Failure};
use svc::message::envelope::RawMessage;

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench dlq_publish`"
        );
    }
    let n: u64 = std::env::var("DLQ_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        // `cargo test --all-targets` runs this unoptimized as a smoke test: keep it short there.
        .unwrap_or(if cfg!(debug_assertions) { 50 } else { 500 });
    let server = broker::NatsServer::start();
    let nc = nats::connect(server.url()).unwrap();
    let js = nats::jetstream::new(nc.clone());
    js.add_stream(nats::jetstream::StreamConfig {
        name: "DLQ".into(),
        subjects: vec!["svc.dlq".into(), "svc.base".into()],
        ..Default::default()
    })
    .unwrap();

    let cfg = DeadLetterConfig {
        enabled: true,
        subject: "svc.dlq".into(),
        ..Default::default()
    };
    let failure = Failure::new(
        "security_labels",
        "security_labels.classification",
        "not_in_vocabulary",
        "security_labels.classification: value is not in security_labels.allowed_classifications"
            .into(),
    );
    let letters: Vec<DeadLetter> = (0..n)
        .map(|seq| {
            let raw = RawMessage::sample("orders.eu", seq + 1, &[b'x'; 200]);
            DeadLetter::build(&raw, &failure, 0, &cfg)
        })
        .collect();

    let publisher = DeadLetterPublisher::new(nc.clone(), cfg);
    let t = Instant::now();
    for dl in &letters {
        publisher.publish(dl).unwrap();
    }
    let ours = t.elapsed();

    let t = Instant::now();
    for dl in &letters {
        let mut m = nats::Message::new("svc.base", None, dl.body.clone(), None);
        let mut h = nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("base-{}", dl.msg_id));
        m.headers = Some(h);
        js.publish_message(&m).unwrap();
    }
    let base = t.elapsed();

    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    println!(
        "dlq_publish: {n} confirmed publishes of {} B records",
        letters[0].body.len()
    );
    println!(
        "  DeadLetterPublisher::publish   {:>8.0} msg/s  {:>7.3} ms/msg",
        rate(ours),
        ours.as_secs_f64() * 1e3 / n as f64
    );
    println!(
        "  JetStream::publish_message     {:>8.0} msg/s  {:>7.3} ms/msg  (baseline)",
        rate(base),
        base.as_secs_f64() * 1e3 / n as f64
    );
    println!("  ratio ours/baseline: {:.1}x", rate(ours) / rate(base));
}
