//! Permanent sink failures against a real nats-server and the `svc` binary: with a DLQ they are
//! dead-lettered with a value-free reason and then acknowledged; without one they are NAKed
//! with backoff, logged on deliveries 1, 2, 4, ... only, and terminated at
//! `delivery.max_deliveries`.

use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const DLQ_SUBJECT: &str = "svc.dlq.orders";
/// A marker in every payload: it must never reach a DLQ record or a log line.
const MARK: &str = "PAYLOAD-MARK-7f3a";

fn config(server: &NatsServer, dir: &Path, consumer: &str, extra: Value) -> Value {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": consumer,
                 "subject": "orders.>"},
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": {"type": "file", "directory": dir.join("out"),
                 "duplicate_policy": "fail_existing"},
        "metrics": {"enabled": true, "snapshot_file": dir.join(format!("{consumer}.json")),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    for (k, v) in extra.as_object().unwrap() {
        match (cfg.get_mut(k), v) {
            (Some(Value::Object(base)), Value::Object(patch)) => base.extend(patch.clone()),
            (_, v) => cfg[k] = v.clone(),
        }
    }
    cfg
}

/// A broker with `n` messages stored once by a first runner (consumer `first`): their files
/// exist, so a second consumer replaying the stream into the same `fail_existing` directory
/// meets a permanent `duplicate_exists` failure for every message.
fn stored_once(n: usize) -> (NatsServer, tempfile::TempDir) {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, "first", "orders.>", Duration::from_secs(30));
    for i in 0..n {
        server.publish_with_headers(
            "orders.eu",
            &[("Nats-Msg-Id", &format!("order-{i}"))],
            format!("{{\"n\": {i}, \"mark\": \"{MARK}\"}}").as_bytes(),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "first.json",
        &config(&server, dir.path(), "first", json!({})),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("first.log"));
    wait_until(Duration::from_secs(30), "first run stores all", || {
        server.try_consumer_state(STREAM, "first") == Some((n as u64, 0, 0))
    });
    stop(&mut runner);
    assert_eq!(files_below(&dir.path().join("out")).len(), n);
    (server, dir)
}

fn stop(runner: &mut Runner) {
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(15)).expect("exits");
    assert!(status.success(), "{status}");
}

#[test]
fn permanent_sink_failures_are_dead_lettered_then_acked() {
    let (server, dir) = stored_once(3);
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    server.create_consumer(STREAM, "replay", "orders.>", Duration::from_secs(30));
    let extra = json!({
        "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                        "include_headers": ["Content-Type"], "publish_timeout_ms": 2000}
    });
    let cfg = write_config(
        dir.path(),
        "replay.json",
        &config(&server, dir.path(), "replay", extra),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("replay.log"));
    wait_until(Duration::from_secs(30), "replay settled", || {
        server.try_consumer_state(STREAM, "replay") == Some((3, 0, 0))
    });
    stop(&mut runner);

    assert_eq!(server.stream_messages("DLQ"), 3);
    let js = server.js();
    for seq in 1..=3 {
        let m = js.get_message("DLQ", seq).unwrap();
        let text = String::from_utf8(m.data.clone()).unwrap();
        assert!(!text.contains(MARK), "payload leaked into the DLQ: {text}");
        assert!(
            !text.contains("idempotency-key"),
            "the sink's message (a path) leaked: {text}"
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema"], "svc.dead-letter.v1");
        assert_eq!(v["failure"]["stage"], "sink");
        assert_eq!(v["failure"]["field"], "sink.file");
        assert_eq!(v["failure"]["reason"], "duplicate_exists");
        assert_eq!(
            v["failure"]["message"],
            "sink file: permanent write failure (duplicate_exists)"
        );
        assert_eq!(v["original"]["stream"], STREAM);
        assert_eq!(v["original"]["consumer"], "replay");
        assert_eq!(v["original"]["delivery_count"], 1);
        assert_eq!(v["original"]["message_id"], format!("order-{}", seq - 1));
        assert_eq!(v["payload"]["sha256"].as_str().unwrap().len(), 64);
        let headers = m.headers.unwrap();
        assert_eq!(
            headers.get("Svc-Dlq-Reason").map(String::as_str),
            Some("duplicate_exists")
        );
    }
    let snap = dir.path().join("replay.json");
    assert_eq!(snapshot_counter(&snap, "sink_permanent_failures_total"), 3);
    assert_eq!(snapshot_counter(&snap, "messages_dlq_total"), 3);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 3);
    assert_eq!(snapshot_counter(&snap, "messages_nacked_total"), 0);
    // The stored files are the first run's, untouched.
    assert_eq!(files_below(&dir.path().join("out")).len(), 3);
    let log = runner.log_text();
    assert!(!log.contains(MARK), "{log}");
    assert!(log.contains("dead-lettered as DLQ sequence"), "{log}");
}

#[test]
fn without_dlq_permanent_failures_are_bounded_and_terminated() {
    let (server, dir) = stored_once(1);
    server.create_consumer(STREAM, "replay", "orders.>", Duration::from_secs(30));
    let extra = json!({"delivery": {"max_deliveries": 5}});
    let cfg = write_config(
        dir.path(),
        "replay.json",
        &config(&server, dir.path(), "replay", extra),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("replay.log"));
    let snap = dir.path().join("replay.json");
    wait_until(Duration::from_secs(30), "terminated", || {
        snapshot_counter(&snap, "messages_terminated_total") == 1
    });
    stop(&mut runner);
    // Settled by TERM, never acknowledged as written.
    assert_eq!(server.consumer_state(STREAM, "replay").1, 0);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 0);
    assert_eq!(snapshot_counter(&snap, "sink_permanent_failures_total"), 5);
    assert_eq!(snapshot_counter(&snap, "messages_failed_total"), 5);
    assert_eq!(snapshot_counter(&snap, "messages_nacked_total"), 4);

    let log = runner.log_text();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed permanently on delivery"))
        .collect();
    // Deliveries 1, 2 and 4 warn; 3 does not; 5 is the terminating error line.
    for (delivery, expected) in [(1, true), (2, true), (3, false), (4, true), (5, true)] {
        let found = warned
            .iter()
            .any(|l| l.contains(&format!("on delivery {delivery} (")));
        assert_eq!(found, expected, "delivery {delivery}: {warned:#?}");
    }
    assert!(
        warned.iter().any(|l| l.contains("terminated")),
        "{warned:#?}"
    );
    assert!(
        warned[0].contains("duplicate_exists") && warned[0].contains("until delivery 5"),
        "{}",
        warned[0]
    );
    assert!(!log.contains(MARK), "{log}");
}
