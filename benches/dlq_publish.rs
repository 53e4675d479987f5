//! DLQ publish cost: confirmed publishes through `DeadLetterPublisher` (own inbox + flush +
//! PubAck) against the crate's `JetStream::publish_message` (same confirmation, but the
//! client's 5 ms flusher delays each request), measured in the same run on a private
//! nats-server. Prints figures and the ratio; asserts nothing about time.
//!
//! Run: `cargo bench --bench dlq_publish` (needs /usr/sbin/nats-server).
#![allow(deprecated)]

#[path = "../tests/support/net.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
mod net;
use net::free_port;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svc::broker::dead_letter::{DeadLetter, DeadLetterConfig, DeadLetterPublisher, Failure};
use svc::message::envelope::RawMessage;

fn healthy(mon: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", mon)) else {
        return false;
    };
    let _ = s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains(" 200 ")
}

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
    let dir = std::env::temp_dir().join(format!("svc-dlq-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (port, mon) = (free_port(), free_port());
    let mut child = Command::new("/usr/sbin/nats-server")
        .args([
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-m",
            &mon.to_string(),
        ])
        .args(["-js", "-sd", dir.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !healthy(mon) {
        assert!(Instant::now() < deadline, "nats-server not healthy");
        std::thread::sleep(Duration::from_millis(20));
    }
    let nc = nats::connect(format!("nats://127.0.0.1:{port}")).unwrap();
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
            let raw = RawMessage {
                subject: "orders.eu".into(),
                stream: "ORDERS".into(),
                consumer: "svc".into(),
                stream_sequence: seq + 1,
                consumer_sequence: seq + 1,
                delivery_count: 1,
                published_unix_nanos: None,
                headers: Vec::new(),
                data: vec![b'x'; 200],
                unreadable: None,
            };
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
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
