//! Dead-letter publishing and the advisory observer against a real nats-server (JetStream).
#![allow(deprecated)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use svc::advisory::AdvisoryObserver;
use svc::dead_letter::{DeadLetter, DeadLetterConfig, DeadLetterPublisher, DlqError, Failure};
use svc::envelope::RawMessage;
use svc::metrics::Metrics;

struct Broker {
    child: Child,
    port: u16,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn healthy(mon: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", mon)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200")
}

impl Broker {
    fn start() -> Broker {
        let dir = std::env::temp_dir().join(format!(
            "svc-labels-dlq-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (port, mon) = (free_port(), free_port());
        let child = Command::new("/usr/sbin/nats-server")
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
            assert!(
                Instant::now() < deadline,
                "nats-server did not become healthy"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Broker {
            child,
            port,
            _dir: TempDir(dir),
        }
    }

    fn connect(&self) -> nats::Connection {
        nats::connect(format!("nats://127.0.0.1:{}", self.port)).unwrap()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn raw(seq: u64) -> RawMessage {
    RawMessage {
        subject: "orders.eu".into(),
        stream: "ORDERS".into(),
        consumer: "svc".into(),
        stream_sequence: seq,
        consumer_sequence: seq,
        delivery_count: 1,
        published_unix_nanos: None,
        headers: vec![("Svc-Security-Labels".into(), "{\"x\":\"OFFENDING\"}".into())],
        data: b"secret payload body".to_vec(),
    }
}

fn dlq_cfg(subject: &str) -> DeadLetterConfig {
    DeadLetterConfig {
        enabled: true,
        subject: subject.into(),
        publish_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn failure() -> Failure {
    Failure::new(
        "security_labels",
        "security_labels",
        "unknown_field",
        "security_labels: unknown root field".into(),
    )
}

#[test]
fn dlq_publish_is_confirmed_stored_and_deduplicated() {
    let b = Broker::start();
    let nc = b.connect();
    let js = nats::jetstream::new(nc.clone());
    js.add_stream(nats::jetstream::StreamConfig {
        name: "DLQ".into(),
        subjects: vec!["svc.dlq".into()],
        ..Default::default()
    })
    .unwrap();
    let cfg = DeadLetterConfig {
        expected_stream: Some("DLQ".into()),
        ..dlq_cfg("svc.dlq")
    };
    let publisher = DeadLetterPublisher::new(nc.clone(), cfg.clone());
    let dl = DeadLetter::build(&raw(7), &failure(), 0, &cfg);
    let ack = publisher.publish(&dl).unwrap();
    assert_eq!(
        (ack.stream.as_str(), ack.sequence, ack.duplicate),
        ("DLQ", 1, false)
    );
    // The same original dead-lettered again (redelivery) is recognised as a duplicate.
    let again = publisher.publish(&dl).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.sequence, 1);
    let other = DeadLetter::build(&raw(8), &failure(), 0, &cfg);
    assert_eq!(publisher.publish(&other).unwrap().sequence, 2);

    // What is stored: the sanitized record, never the payload or the offending header.
    let stored = js.get_message("DLQ", 1).unwrap();
    let body = String::from_utf8(stored.data.clone()).unwrap();
    assert!(
        !body.contains("OFFENDING") && !body.contains("secret payload"),
        "{body}"
    );
    let v: serde_json::Value = serde_json::from_slice(&stored.data).unwrap();
    assert_eq!(v["schema"], "svc.dead-letter.v1");
    assert_eq!(v["original"]["stream_sequence"], 7);
    assert_eq!(v["failure"]["reason"], "unknown_field");
    let headers = stored.headers.unwrap();
    assert_eq!(
        headers.get("Svc-Dlq-Reason").map(String::as_str),
        Some("unknown_field")
    );
    assert_eq!(
        headers.get("Nats-Msg-Id").map(String::as_str),
        Some("svc-dlq:ORDERS:7")
    );
}

#[test]
fn dlq_publish_without_a_stream_fails_fast() {
    let b = Broker::start();
    let nc = b.connect();
    let cfg = dlq_cfg("nobody.listens");
    let publisher = DeadLetterPublisher::new(nc, cfg.clone());
    let started = Instant::now();
    let err = publisher
        .publish(&DeadLetter::build(&raw(1), &failure(), 0, &cfg))
        .unwrap_err();
    assert_eq!(err, DlqError::NoStream);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        err.to_string(),
        "dlq publish: no stream captures the subject"
    );
}

#[test]
fn dlq_publish_into_an_unexpected_stream_is_refused() {
    let b = Broker::start();
    let nc = b.connect();
    let js = nats::jetstream::new(nc.clone());
    js.add_stream(nats::jetstream::StreamConfig {
        name: "OTHER".into(),
        subjects: vec!["svc.dlq".into()],
        ..Default::default()
    })
    .unwrap();
    let cfg = DeadLetterConfig {
        expected_stream: Some("DLQ".into()),
        ..dlq_cfg("svc.dlq")
    };
    let err = DeadLetterPublisher::new(nc, cfg.clone())
        .publish(&DeadLetter::build(&raw(1), &failure(), 0, &cfg))
        .unwrap_err();
    assert!(matches!(err, DlqError::Rejected { .. }), "{err}");
    // Nothing was stored.
    assert_eq!(js.stream_info("OTHER").unwrap().state.messages, 0);
}

/// NAK, TERM and max-deliveries advisories of the runner's consumer are counted; other
/// consumers' are not.
#[test]
fn advisories_are_counted() {
    let b = Broker::start();
    let nc = b.connect();
    let js = nats::jetstream::new(nc.clone());
    js.add_stream(nats::jetstream::StreamConfig {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .unwrap();
    for name in ["svc", "other"] {
        js.add_consumer(
            "ORDERS",
            nats::jetstream::ConsumerConfig {
                durable_name: Some(name.into()),
                ack_policy: nats::jetstream::AckPolicy::Explicit,
                max_deliver: 2,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .unwrap();
    }
    let metrics = Arc::new(Metrics::default());
    let stop = Arc::new(AtomicBool::new(false));
    let observer =
        AdvisoryObserver::start(&nc, "ORDERS", "svc", metrics.clone(), stop.clone()).unwrap();

    js.publish("orders.a", b"1").unwrap();
    js.publish("orders.b", b"2").unwrap();
    // Another consumer's NAK and TERM: its advisories are on other subjects.
    let other = js
        .pull_subscribe_with_options(
            "orders.>",
            &nats::jetstream::PullSubscribeOptions::new()
                .bind_stream("ORDERS".into())
                .durable_name("other".into()),
        )
        .unwrap();
    for m in other.timeout_fetch(2, Duration::from_secs(2)).unwrap() {
        let Ok(m) = m else { break };
        let verdict: &[u8] = if m.data == b"1" { b"-NAK" } else { b"+TERM" };
        m.respond(verdict).unwrap();
    }
    nc.flush().unwrap();
    let sub = js
        .pull_subscribe_with_options(
            "orders.>",
            &nats::jetstream::PullSubscribeOptions::new()
                .bind_stream("ORDERS".into())
                .durable_name("svc".into()),
        )
        .unwrap();
    // Message 1: NAK twice -> two NAK advisories, then max deliveries (2) is reached.
    // Message 2: TERM -> one terminated advisory.
    let (mut naks, mut termed) = (0, false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while naks < 2 || !termed {
        assert!(Instant::now() < deadline, "messages did not come back");
        let Ok(batch) = sub.timeout_fetch(1, Duration::from_millis(300)) else {
            continue;
        };
        for m in batch {
            let Ok(m) = m else { break };
            if m.data == b"1" {
                m.respond(b"-NAK").unwrap();
                naks += 1;
            } else {
                m.respond(b"+TERM").unwrap();
                termed = true;
            }
        }
        nc.flush().unwrap();
    }
    let c = &metrics.counters;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        wait_for(
            || load(&c.advisory_nak_total) == 2
                && load(&c.advisory_max_deliveries_total) == 1
                && load(&c.advisory_terminated_total) == 1,
            Duration::from_secs(5)
        ),
        "nak={} max={} term={}",
        load(&c.advisory_nak_total),
        load(&c.advisory_max_deliveries_total),
        load(&c.advisory_terminated_total)
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    observer.join();
}

fn wait_for(mut f: impl FnMut() -> bool, max: Duration) -> bool {
    let deadline = Instant::now() + max;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
