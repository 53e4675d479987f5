//! Message metadata, security labels, the dead-letter queue and the advisory observer against a
//! real nats-server (JetStream): the publisher and observer directly, then the `svc` binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::{json, Value};
use svc::broker::advisory::AdvisoryObserver;
use svc::broker::dead_letter::{
    DeadLetter, DeadLetterConfig, DeadLetterPublisher, DlqError, Failure,
};
use svc::message::envelope::RawMessage;
use svc::metrics::Metrics;

fn raw(seq: u64) -> RawMessage {
    RawMessage {
        headers: vec![("Svc-Security-Labels".into(), "{\"x\":\"OFFENDING\"}".into())],
        ..RawMessage::sample("orders.eu", seq, b"secret payload body")
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
    let b = NatsServer::start();
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
    let b = NatsServer::start();
    let nc = b.connect();
    // A publish timeout far beyond any scheduling delay: failing before it expires proves the
    // "no responders" answer was used, not a timeout.
    let mut cfg = dlq_cfg("nobody.listens");
    cfg.publish_timeout = Duration::from_secs(60);
    let publisher = DeadLetterPublisher::new(nc, cfg.clone());
    let started = Instant::now();
    let err = publisher
        .publish(&DeadLetter::build(&raw(1), &failure(), 0, &cfg))
        .unwrap_err();
    assert_eq!(err, DlqError::NoStream);
    assert!(
        started.elapsed() < cfg.publish_timeout,
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
    let b = NatsServer::start();
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
    let b = NatsServer::start();
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
    let watch = svc::broker::advisory::Watch {
        count: true,
        on_abandoned: None,
    };
    let observer =
        AdvisoryObserver::start(&nc, "ORDERS", "svc", watch, metrics.clone(), stop.clone())
            .unwrap();

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
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    wait_until(Duration::from_secs(5), "advisories counted", || {
        load(&c.advisory_nak_total) == 2
            && load(&c.advisory_max_deliveries_total) == 1
            && load(&c.advisory_terminated_total) == 1
    });
    stop.store(true, Ordering::Relaxed);
    observer.join();
}

// ---------------------------------------------------------------------------------------------
// The `svc` binary end to end.

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const DLQ_SUBJECT: &str = "svc.dlq";
/// Planted in every offending value: it must never appear in a DLQ record, log or snapshot.
const MARK: &str = "ZQXMARKZQX";

/// A runner config writing files to `out` and a snapshot into `dir`, patched by `extra`.
fn config(server: &NatsServer, dir: &Path, extra: Value) -> Value {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": "orders.>"},
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": {"type": "file", "directory": dir.join("out")},
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            match (cfg.get_mut(&k), v) {
                (Some(Value::Object(base)), Value::Object(patch)) => base.extend(patch),
                (_, v) => cfg[k] = v,
            }
        }
    }
    cfg
}

fn setup() -> (NatsServer, tempfile::TempDir) {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    (server, tempfile::tempdir().unwrap())
}

/// Stream sequence -> stored file record.
fn records(out: &Path) -> BTreeMap<u64, Value> {
    files_below(out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let v: Value = serde_json::from_slice(&std::fs::read(out.join(&p)).unwrap()).unwrap();
            (v["stream_sequence"].as_u64().unwrap(), v)
        })
        .collect()
}

/// Every DLQ record stored in stream `DLQ`, in order.
fn dlq_records(server: &NatsServer) -> Vec<(String, Value)> {
    let js = server.js();
    let n = server.stream_messages("DLQ");
    (1..=n)
        .map(|seq| {
            let m = js.get_message("DLQ", seq).unwrap();
            let text = String::from_utf8(m.data.clone()).unwrap();
            (text, serde_json::from_slice(&m.data).unwrap())
        })
        .collect()
}

fn labels_config() -> Value {
    json!({
        "security_labels": {
            "enabled": true,
            "max_bytes": 512,
            "allowed_classifications": ["unclassified", "restricted"],
            "allowed_releasability": ["nato", "eu"]
        },
        "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                        "include_headers": ["Content-Type"], "publish_timeout_ms": 2000}
    })
}

/// Each invalid-label case of the spec's Errors row (and an invalid metadata header) lands on
/// the DLQ with a sanitized record, and its original is ACKed only after the DLQ publish; the
/// good messages of the same batch are stored and ACKed as usual.
#[test]
fn invalid_labels_are_dead_lettered_then_acked() {
    let (server, dir) = setup();
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    let big = MARK.repeat(60);
    // (header name, header value, expected failure field, expected reason)
    let bad: Vec<(&str, String, &str, &str)> = vec![
        (
            "Svc-Security-Labels",
            format!("{{\"owner\": \"{MARK}\""),
            "security_labels",
            "invalid_json",
        ),
        (
            "Svc-Security-Labels",
            format!("{{\"{MARK}\": \"{MARK}\"}}"),
            "security_labels",
            "unknown_field",
        ),
        (
            "Svc-Security-Labels",
            format!("{{\"classification\": \"{MARK}\"}}"),
            "security_labels.classification",
            "not_in_vocabulary",
        ),
        (
            "Svc-Security-Labels",
            format!("{{\"releasability\": [\"nato\", \"{MARK}\"]}}"),
            "security_labels.releasability[1]",
            "not_in_vocabulary",
        ),
        (
            "Svc-Security-Labels",
            format!("{{\"owner\": \"{big}\"}}"),
            "security_labels",
            "too_large",
        ),
        (
            "Svc-Security-Labels",
            format!("{{\"extensions\": {{\"api_token\": \"{MARK}\"}}}}"),
            "security_labels.extensions",
            "secret_extension_key",
        ),
        (
            "Svc-Security-Labels",
            format!("{{\"profile\": \"{MARK}\"}}"),
            "security_labels.profile",
            "wrong_profile",
        ),
        (
            "Svc-Classification",
            format!("{MARK};x"),
            "message_metadata.classification",
            "invalid_value",
        ),
    ];
    // Sequence 1 good, then bad ones interleaved with good ones.
    let mut bad_seqs = BTreeMap::new();
    let mut seq = 0;
    let mut good = Vec::new();
    for (i, (header, value, field, reason)) in bad.iter().enumerate() {
        seq += 1;
        server.publish_with_headers(
            "orders.eu",
            &[(
                "Svc-Security-Labels",
                r#"{"owner":"team-a","releasability":["eu"]}"#,
            )],
            format!("{{\"good\":{i}}}").as_bytes(),
        );
        good.push(seq);
        seq += 1;
        server.publish_with_headers(
            "orders.eu",
            &[
                (header, value.as_str()),
                ("Content-Type", "application/json"),
            ],
            format!("{{\"card\":\"{MARK}-{i}\"}}").as_bytes(),
        );
        bad_seqs.insert(seq, (*field, *reason));
    }
    let total = seq;

    // Watch the runner's DLQ publishes and ACKs on the wire, in the order the broker saw them.
    // One subscription, one handler thread: two subscriptions would each get their own handler
    // thread, and those threads would race to record events out of wire order.
    let watch = server.connect();
    let events = Arc::new(std::sync::Mutex::new(Vec::<(String, u64)>::new()));
    let recorded = events.clone();
    let ack_prefix = format!("$JS.ACK.{STREAM}.{CONSUMER}.");
    let _tap = watch.subscribe(">").unwrap().with_handler(move |m| {
        if m.subject == DLQ_SUBJECT {
            let v: Value = serde_json::from_slice(&m.data).unwrap();
            let sseq = v["original"]["stream_sequence"].as_u64().unwrap();
            recorded.lock().unwrap().push(("dlq".into(), sseq));
        } else if let Some(rest) = m.subject.strip_prefix(&ack_prefix) {
            // <delivered>.<stream seq>.<consumer seq>.<ts>.<pending>
            let sseq: u64 = rest.split('.').nth(1).unwrap().parse().unwrap();
            let verb = String::from_utf8_lossy(&m.data).to_string();
            recorded.lock().unwrap().push((verb, sseq));
        }
        Ok(())
    });
    watch.flush().unwrap();

    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), labels_config()),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "every message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((total, 0, 0))
    });

    // The DLQ holds exactly the bad ones, each sanitized and naming field and reason.
    let dlq = dlq_records(&server);
    assert_eq!(dlq.len(), bad_seqs.len());
    for (text, v) in &dlq {
        assert!(!text.contains(MARK), "offending value or payload in {text}");
        assert!(!text.contains("card"), "payload in {text}");
        let sseq = v["original"]["stream_sequence"].as_u64().unwrap();
        let (field, reason) = bad_seqs[&sseq];
        assert_eq!(v["schema"], "svc.dead-letter.v1");
        assert_eq!(v["failure"]["field"], field, "{text}");
        assert_eq!(v["failure"]["reason"], reason, "{text}");
        assert_eq!(v["original"]["subject"], "orders.eu");
        assert_eq!(v["original"]["stream"], STREAM);
        assert_eq!(v["original"]["consumer"], CONSUMER);
        assert_eq!(
            v["payload"]["size_bytes"].as_u64().unwrap() as usize,
            format!("{{\"card\":\"{MARK}-0\"}}").len()
        );
        assert_eq!(v["payload"]["sha256"].as_str().unwrap().len(), 64);
        assert_eq!(v["headers"], json!({"Content-Type": "application/json"}));
    }
    // Only the good ones reached the sink.
    let stored = records(&dir.path().join("out"));
    assert_eq!(stored.keys().copied().collect::<Vec<_>>(), good);

    // Order on the wire: each bad original's DLQ record before its ACK; nothing else for it.
    let events = events.lock().unwrap().clone();
    for sseq in bad_seqs.keys() {
        let mine: Vec<&str> = events
            .iter()
            .filter(|(_, s)| s == sseq)
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            mine,
            vec!["dlq", "+ACK"],
            "stream sequence {sseq}: {events:?}"
        );
    }

    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits")
        .success());
    let snap = dir.path().join("metrics.json");
    let n_bad = bad_seqs.len() as u64;
    assert_eq!(snapshot_counter(&snap, "messages_dlq_total"), n_bad);
    assert_eq!(snapshot_counter(&snap, "messages_failed_total"), n_bad);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), total);
    assert_eq!(
        snapshot_counter(&snap, "messages_written_total"),
        total - n_bad
    );
    assert_eq!(snapshot_counter(&snap, "messages_terminated_total"), 0);
    let log = runner.log_text();
    assert!(!log.contains(MARK), "offending value in the log");
    assert!(log.contains("dead-lettered as DLQ sequence"), "{log}");
    let snapshot_text = std::fs::read_to_string(&snap).unwrap();
    assert!(!snapshot_text.contains(MARK));
}

/// No stream captures the DLQ subject: the bad message is never ACKed (NAKed and redelivered),
/// the good one is. Once a stream exists, the next redelivery is dead-lettered and ACKed.
#[test]
fn dlq_publish_failure_leaves_the_original_unacked() {
    let (server, dir) = setup();
    server.publish_with_headers("orders.a", &[], b"{\"good\":1}");
    server.publish_with_headers(
        "orders.a",
        &[("Svc-Security-Labels", &format!("{{\"x\":\"{MARK}\"}}"))],
        b"{\"bad\":1}",
    );
    server.publish_with_headers("orders.a", &[], b"{\"good\":2}");
    let mut extra = labels_config();
    extra["dead_letter"]["expected_stream"] = Value::Null;
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), extra));
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    let snap = dir.path().join("metrics.json");
    wait_until(
        Duration::from_secs(30),
        "three failed dlq publishes",
        || snapshot_counter(&snap, "dlq_publish_errors_total") >= 3,
    );
    // Good ones stored and acked; the bad one (sequence 2) holds the ack floor at 1.
    let (floor, pending, _) = server.consumer_state(STREAM, CONSUMER);
    assert_eq!(floor, 1, "sequence 2 must not be acknowledged");
    assert!(pending <= 1);
    assert_eq!(
        records(&dir.path().join("out"))
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        vec![1, 3]
    );
    assert_eq!(snapshot_counter(&snap, "messages_dlq_total"), 0);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 2);
    assert!(snapshot_counter(&snap, "messages_nacked_total") >= 3);
    assert_eq!(snapshot_counter(&snap, "messages_terminated_total"), 0);
    let log = runner.log_text();
    assert!(
        log.contains("no stream captures it"),
        "start-up check: {log}"
    );
    assert!(
        log.contains("dlq publish: no stream captures the subject"),
        "{log}"
    );

    // The operator adds the stream: the next redelivery goes through.
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    wait_until(
        Duration::from_secs(30),
        "bad message dead-lettered and acked",
        || server.try_consumer_state(STREAM, CONSUMER) == Some((3, 0, 0)),
    );
    assert_eq!(server.stream_messages("DLQ"), 1);
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits")
        .success());
    assert_eq!(snapshot_counter(&snap, "messages_dlq_total"), 1);
    assert!(!runner.log_text().contains(MARK));
}

/// Metadata rules/defaults and label rules/defaults by subject; labels reach the file record
/// at top level and in `metadata.security_labels`.
#[test]
fn rules_and_defaults_apply_by_subject_and_reach_the_record() {
    let (server, dir) = setup();
    let extra = json!({
        "message_metadata": {
            "default_priority": "normal",
            "default_labels": ["base"],
            "rules": [
                {"subject": "orders.eu.*", "classification": "restricted", "labels": ["eu", "gdpr"]},
                {"subject": "orders.audit.>", "priority": "high"}
            ]
        },
        "security_labels": {
            "enabled": true,
            "default": {"owner": "platform", "retention_category": "standard"},
            "rules": [
                {"subject": "orders.audit.>", "profile": {"owner": "audit", "handling_caveats": ["no-export"]}},
                {"subject": "orders.public", "profile": null}
            ]
        }
    });
    server.publish_with_headers("orders.eu.created", &[], b"{}"); // 1
    server.publish_with_headers("orders.audit.login.ok", &[], b"{}"); // 2
    server.publish_with_headers("orders.public", &[], b"{}"); // 3
    server.publish_with_headers(
        "orders.eu.created",
        &[
            ("Svc-Priority", " URGENT "),
            ("Svc-Labels", "Zeta, alpha,ALPHA"),
            (
                "Svc-Security-Labels",
                r#"{"owner":"hdr","classification":null}"#,
            ),
        ],
        b"{}",
    ); // 4
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), extra));
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "every message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((4, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits")
        .success());
    let r = records(&dir.path().join("out"));
    let meta = |s: u64| {
        (
            r[&s]["priority"].as_str().unwrap().to_string(),
            r[&s]["classification"].as_str().unwrap().to_string(),
            r[&s]["labels"].as_str().unwrap().to_string(),
            r[&s]["labels_list"].clone(),
        )
    };
    assert_eq!(
        meta(1),
        (
            "normal".into(),
            "restricted".into(),
            "eu;gdpr".into(),
            json!(["eu", "gdpr"])
        )
    );
    assert_eq!(
        meta(2),
        (
            "high".into(),
            "unclassified".into(),
            "base".into(),
            json!(["base"])
        )
    );
    assert_eq!(
        meta(3),
        (
            "normal".into(),
            "unclassified".into(),
            "base".into(),
            json!(["base"])
        )
    );
    assert_eq!(
        meta(4),
        (
            "urgent".into(),
            "restricted".into(),
            "alpha;zeta".into(),
            json!(["alpha", "zeta"])
        )
    );

    let labels = |s: u64| {
        let top = r[&s]["security_labels"].clone();
        assert_eq!(
            top, r[&s]["metadata"]["security_labels"],
            "both places, sequence {s}"
        );
        top
    };
    assert_eq!(
        labels(1),
        json!({"profile": "svc.security-label.v1", "owner": "platform", "retention_category": "standard",
               "priority": "normal", "classification": "restricted", "labels": ["eu", "gdpr"]})
    );
    assert_eq!(
        labels(2),
        json!({"profile": "svc.security-label.v1", "owner": "audit", "handling_caveats": ["no-export"],
               "priority": "high", "classification": "unclassified", "labels": ["base"]})
    );
    assert_eq!(labels(3), Value::Null, "a null rule clears the default");
    assert_eq!(
        labels(4),
        json!({"profile": "svc.security-label.v1", "owner": "hdr", "classification": null,
               "priority": "urgent", "labels": ["alpha", "zeta"]})
    );
}

/// Without a DLQ: a permanent failure is counted and NAKed, then terminated at
/// `delivery.max_deliveries`; the advisory observer counts the broker's NAK and TERM
/// advisories into the snapshot.
#[test]
fn without_dlq_failures_are_naked_then_terminated_and_advisories_counted() {
    let (server, dir) = setup();
    server.publish_with_headers("orders.a", &[("Svc-Security-Labels", "[]")], b"{}");
    server.publish_with_headers("orders.a", &[], b"{}");
    let extra = json!({
        "security_labels": {"enabled": true},
        "delivery": {"max_deliveries": 2},
        "advisories": {"enabled": true}
    });
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), extra));
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "both settled", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((2, 0, 0))
    });
    let snap = dir.path().join("metrics.json");
    wait_until(
        Duration::from_secs(10),
        "advisories in the snapshot",
        || {
            snapshot_counter(&snap, "advisory_terminated_total") == 1
                && snapshot_counter(&snap, "advisory_nak_total") == 1
        },
    );
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits")
        .success());
    assert_eq!(
        snapshot_counter(&snap, "messages_failed_total"),
        2,
        "once per delivery"
    );
    assert_eq!(snapshot_counter(&snap, "messages_nacked_total"), 1);
    assert_eq!(snapshot_counter(&snap, "messages_terminated_total"), 1);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 1);
    assert_eq!(snapshot_counter(&snap, "messages_dlq_total"), 0);
    assert_eq!(records(&dir.path().join("out")).len(), 1);
    let log = runner.log_text();
    assert!(
        log.contains("security_labels: must be a JSON object"),
        "{log}"
    );
}

/// The broker's own `max_deliver` is reached (the DLQ keeps failing, so the runner NAKs every
/// delivery): the observer counts the max-deliveries advisory in the snapshot.
#[test]
fn max_deliveries_advisory_is_counted_in_the_snapshot() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server
        .js()
        .add_consumer(
            STREAM,
            nats::jetstream::ConsumerConfig {
                durable_name: Some(CONSUMER.into()),
                ack_policy: nats::jetstream::AckPolicy::Explicit,
                filter_subject: "orders.>".into(),
                ack_wait: Duration::from_secs(30),
                max_deliver: 3,
                ..Default::default()
            },
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    server.publish_with_headers("orders.a", &[("Svc-Security-Labels", "nope")], b"{}");
    let mut extra = labels_config();
    extra["dead_letter"]["expected_stream"] = Value::Null;
    extra["advisories"] = json!({"enabled": true});
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), extra));
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    let snap = dir.path().join("metrics.json");
    wait_until(
        Duration::from_secs(30),
        "max-deliveries advisory counted",
        || snapshot_counter(&snap, "advisory_max_deliveries_total") == 1,
    );
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits")
        .success());
    assert_eq!(snapshot_counter(&snap, "dlq_publish_errors_total"), 3);
    assert_eq!(snapshot_counter(&snap, "advisory_nak_total"), 3);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 0);
    assert_eq!(snapshot_counter(&snap, "messages_terminated_total"), 0);
    // Never acknowledged: the broker stopped delivering it, the stream still holds it.
    assert_eq!(server.consumer_state(STREAM, CONSUMER).0, 0);
    assert_eq!(server.stream_messages(STREAM), 1);
}

/// What one publisher can put into a message through the raw protocol (client libraries
/// refuse most of it) is settled with its reason, and the messages behind it are delivered:
/// 300 headers with a 20,000-byte message id of control characters (never read: the client
/// refuses the block unread; the DLQ record stays small enough for a DLQ stream with a 64 KiB
/// `max_msg_size`), 40 KB of headers, U+0000 in the
/// message id, a kept header and the subject (dead-lettered); text holding U+0000 (stored as
/// bytes), duplicate keys (stored as text) and an event time of year 1 (stored, counted, left
/// out of the event ages).
#[test]
fn hostile_publisher_inputs_are_settled_with_their_reasons() {
    let (server, dir) = setup();
    server
        .js()
        .add_stream(nats::jetstream::StreamConfig {
            name: "DLQ".into(),
            subjects: vec![DLQ_SUBJECT.into()],
            max_msg_size: 65_536,
            storage: nats::jetstream::StorageType::File,
            ..Default::default()
        })
        .unwrap();
    let long_id = vec![1u8; 20_000];
    let names: Vec<Vec<u8>> = (0..300).map(|i| format!("X-H{i}").into_bytes()).collect();
    let mut many: Vec<(&[u8], &[u8])> = vec![(b"Nats-Msg-Id", &long_id)];
    many.extend(names.iter().map(|k| (k.as_slice(), b"v".as_slice())));
    let big = vec![b'b'; 40_000];
    server.raw_publish(b"orders.many", &many, br#"{"n":1}"#);
    server.raw_publish(b"orders.big", &[(b"X-Big", &big)], br#"{"n":2}"#);
    server.raw_publish(b"orders.id", &[(b"Nats-Msg-Id", b"id\0x")], br#"{"n":3}"#);
    server.raw_publish(b"orders.kept", &[(b"Content-Type", b"a\0b")], br#"{"n":4}"#);
    server.raw_publish(b"orders.text", &[], b"ab\0cd");
    server.raw_publish(b"orders.dup", &[], br#"{"amount":1,"amount":2}"#);
    server.raw_publish(b"orders.ok", &[], br#"{"order":7}"#);
    server.raw_publish(b"orders.a\0b", &[], br#"{"order":8}"#);
    let ancient: &[(&[u8], &[u8])] = &[(b"Svc-Event-Time", b"0001-01-01T00:00:00Z")];
    server.raw_publish(b"orders.old", ancient, br#"{"order":9}"#);
    wait_until(Duration::from_secs(10), "9 stored", || {
        server.stream_messages(STREAM) == 9
    });
    let cfg = config(
        &server,
        dir.path(),
        json!({
            "envelope": {"keep_headers": ["Content-Type"]},
            "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                            "publish_timeout_ms": 2000}
        }),
    );
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "all 9 settled", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((9, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(15)).is_some());
    let dlq = dlq_records(&server);
    let got: Vec<(u64, &str, &str)> = dlq
        .iter()
        .map(|(_, v)| {
            (
                v["original"]["stream_sequence"].as_u64().unwrap(),
                v["failure"]["field"].as_str().unwrap(),
                v["failure"]["reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, "headers", "too_many_headers"),
            (2, "headers", "headers_too_large"),
            (3, "message_id", "nul_character"),
            (4, "envelope.keep_headers", "nul_character"),
            (8, "subject", "nul_character"),
        ]
    );
    // Over the client's 256-line bound the block is refused unread: no id, no headers.
    assert_eq!(dlq[0].1["original"]["message_id"], Value::Null);
    assert!(dlq.iter().all(|(text, _)| text.len() < 4096));
    let stored = records(&dir.path().join("out"));
    assert_eq!(stored.keys().copied().collect::<Vec<_>>(), [5, 6, 7, 9]);
    let format = |seq: u64| stored[&seq]["payload_info"]["original_format"].clone();
    assert_eq!(format(5), "bytes");
    assert_eq!(stored[&5]["payload"], json!({"base64": "YWIAY2Q="}));
    assert_eq!(format(6), "text");
    assert_eq!(format(7), "json");
    // An event time of year 1 is stored as sent, counted, and kept out of the event ages.
    assert_eq!(stored[&9]["metadata"]["event_time"], "0001-01-01T00:00:00Z");
    let snap = dir.path().join("metrics.json");
    assert_eq!(snapshot_counter(&snap, "events_implausible_time_total"), 1);
    let snapshot: Value = serde_json::from_slice(&std::fs::read(&snap).unwrap()).unwrap();
    let ages = &snapshot["summaries"]["event_age_at_receive_seconds"];
    assert!(ages["max"].as_f64().unwrap() < 3600.0, "{ages}");
}

/// Header lines are counted as the publisher sent them, before the client builds any map:
/// 1,000 identical lines (one pair in the client's map, which passed the 256-line bound) and
/// 7,000 one-byte lines (which the client once turned into a map a hundred times their size)
/// are dead-lettered as `too_many_headers` with their line counts; three identical lines are
/// within the bound and stored.
#[test]
fn header_lines_are_counted_as_sent() {
    let (server, dir) = setup();
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    let same: Vec<(&[u8], &[u8])> = vec![(b"X-Same", b"1"); 1_000];
    server.raw_publish(b"orders.same", &same, br#"{"n":1}"#);
    let mut block = b"NATS/1.0\r\n".to_vec();
    for i in 0..7_000 {
        block.extend_from_slice(format!("a:{}\r\n", i % 10).as_bytes());
    }
    block.extend_from_slice(b"\r\n");
    server.raw_publish_block(b"orders.tiny", &block, br#"{"n":2}"#);
    server.raw_publish(b"orders.three", &same[..3], br#"{"n":3}"#);
    wait_until(Duration::from_secs(10), "3 stored", || {
        server.stream_messages(STREAM) == 3
    });
    let cfg = config(
        &server,
        dir.path(),
        json!({"dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                               "publish_timeout_ms": 2000}}),
    );
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "all 3 settled", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((3, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(15)).is_some());
    let got: Vec<(u64, String, String)> = dlq_records(&server)
        .iter()
        .map(|(_, v)| {
            let failure = &v["failure"];
            (
                v["original"]["stream_sequence"].as_u64().unwrap(),
                failure["reason"].as_str().unwrap().to_string(),
                failure["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].0, got[0].1.as_str()), (1, "too_many_headers"));
    assert!(got[0].2.contains("1000 header lines"), "{got:?}");
    assert_eq!((got[1].0, got[1].1.as_str()), (2, "too_many_headers"));
    assert!(got[1].2.contains("7000 header lines"), "{got:?}");
    let stored = records(&dir.path().join("out"));
    assert_eq!(stored.keys().copied().collect::<Vec<_>>(), [3]);
}

/// Messages the published `nats` crate could not parse (it dropped the connection, the runner
/// reconnected every AckWait and never saw them or anything behind them), and messages it took
/// for the broker's status (a `Status: 404` header, a publisher's own `NATS/1.0 404` or `408`
/// version line) and dropped: each is settled with its reason, or delivered when it can be
/// read, and the message behind them arrives.
#[test]
fn messages_the_client_could_not_parse_no_longer_stop_delivery() {
    let (server, dir) = setup();
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    let long = format!("orders.{}", "l".repeat(4_070));
    let nbsp = "orders.caf\u{e9}\u{a0}menu";
    server.raw_publish(b"orders.x", &[(b"X-Bad", b"\xff\xfe")], br#"{"n":1}"#);
    server.raw_publish_block(b"orders.x", b"NATS/1.0\r\nno colon\r\n\r\n", br#"{"n":2}"#);
    server.raw_publish(b"orders.\xffx", &[], br#"{"n":3}"#);
    server.raw_publish(nbsp.as_bytes(), &[], br#"{"n":4}"#);
    server.raw_publish(long.as_bytes(), &[], br#"{"n":5}"#);
    let twice: &[(&[u8], &[u8])] = &[(b"X-Note", b"Nats-Msg-Id"), (b"Nats-Msg-Id", b"m-6")];
    server.raw_publish(b"orders.x", twice, br#"{"n":6}"#);
    server.raw_publish(b"orders.x", &[(b"Status", b"404")], b"");
    server.raw_publish(b"orders.ok", &[], br#"{"n":8}"#);
    // The server stores a publisher's header block as sent, version line included.
    server.raw_publish_block(b"orders.x", b"NATS/1.0 404 No Messages\r\n\r\n", b"");
    server.raw_publish_block(b"orders.x", b"NATS/1.0 408 Request Timeout\r\n\r\n", b"");
    wait_until(Duration::from_secs(10), "10 stored", || {
        server.stream_messages(STREAM) == 10
    });
    let cfg = config(
        &server,
        dir.path(),
        json!({"dead_letter": {"enabled": true, "subject": DLQ_SUBJECT,
                               "expected_stream": "DLQ", "publish_timeout_ms": 2000}}),
    );
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "all 10 settled", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((10, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(15)).is_some());
    let log = runner.log_text();
    assert!(!log.contains("connection lost"), "{log}");
    let dlq: Vec<(u64, String, String)> = dlq_records(&server)
        .into_iter()
        .map(|(_, v)| {
            (
                v["original"]["stream_sequence"].as_u64().unwrap(),
                v["failure"]["reason"].as_str().unwrap().to_string(),
                v["failure"]["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = [
        (1, "a header is not UTF-8"),
        (2, "a header line has no ':'"),
        (3, "the subject is not UTF-8"),
        (
            6,
            "the broker and this client would read Nats-Msg-Id differently",
        ),
    ];
    assert_eq!(dlq.len(), want.len(), "{dlq:?}");
    for ((seq, reason, message), (want_seq, why)) in dlq.iter().zip(want) {
        assert_eq!((*seq, reason.as_str()), (want_seq, "unreadable"));
        assert_eq!(
            message,
            &format!("the message could not be read as sent: {why}")
        );
    }
    let stored = records(&dir.path().join("out"));
    assert_eq!(
        stored.keys().copied().collect::<Vec<_>>(),
        [4, 5, 7, 8, 9, 10]
    );
    assert_eq!(stored[&4]["subject"], nbsp);
    assert_eq!(stored[&5]["subject"], long.as_str());
}

/// The broker answers a publish on a literal `orders.*` or `orders.>` with an error and
/// stores it all the same; no subject rule matches such a subject, so a rule requiring a
/// signature on `orders.>` was skipped and the unsigned message stored. Now it is refused
/// before any rule is looked up.
#[test]
fn wildcard_subjects_fail_closed_before_a_required_signature_rule() {
    let (server, dir) = setup();
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    for subject in [&b"orders.*"[..], b"orders.>", b"orders.x"] {
        server.raw_publish(subject, &[], br#"{"unsigned":true}"#);
    }
    wait_until(Duration::from_secs(10), "3 stored", || {
        server.stream_messages(STREAM) == 3
    });
    let cfg = config(
        &server,
        dir.path(),
        json!({
            "authenticity": {
                "enabled": true,
                "keys": [{"key_id": "ed1", "public_key_b64": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}],
                "rules": [{"subject": "orders.>", "required": true}]
            },
            "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                            "publish_timeout_ms": 2000}
        }),
    );
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "all 3 settled", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((3, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(15)).is_some());
    let reasons: Vec<(u64, String)> = dlq_records(&server)
        .into_iter()
        .map(|(_, v)| {
            (
                v["original"]["stream_sequence"].as_u64().unwrap(),
                v["failure"]["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            (1, "wildcard_subject".to_string()),
            (2, "wildcard_subject".to_string()),
            (3, "missing_signature".to_string()),
        ]
    );
    assert!(
        records(&dir.path().join("out")).is_empty(),
        "nothing stored"
    );
}

/// A publisher who first sends a victim's future `Nats-Msg-Id` with its own content (after the
/// stream's duplicate window, so the broker stores both): with `message_id` keys and
/// `skip_existing`, the victim's message is no longer acknowledged as written with the
/// attacker's content stored; it is dead-lettered (`duplicate_exists`), and the message after
/// it is delivered.
#[test]
fn a_victims_message_id_taken_first_is_dead_lettered_not_counted_as_written() {
    let server = NatsServer::start();
    server
        .js()
        .add_stream(nats::jetstream::StreamConfig {
            name: STREAM.into(),
            subjects: vec!["orders.>".into()],
            duplicate_window: 100_000_000, // 100 ms
            storage: nats::jetstream::StorageType::File,
            ..Default::default()
        })
        .unwrap();
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    let dir = tempfile::tempdir().unwrap();
    let id: &[(&[u8], &[u8])] = &[(b"Nats-Msg-Id", b"victim-1")];
    // The attacker's message first, delivered and written on its own (in one batch, two
    // writers would race for the name and either could win).
    server.raw_publish(b"orders.x", id, br#"{"order":666}"#);
    let cfg = config(
        &server,
        dir.path(),
        json!({
            "sink": {"type": "file", "directory": dir.path().join("out"),
                     "key_strategy": "message_id"},
            "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                            "publish_timeout_ms": 2000}
        }),
    );
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(
        Duration::from_secs(30),
        "the attacker's message written",
        || server.try_consumer_state(STREAM, CONSUMER) == Some((1, 0, 0)),
    );
    // Past the stream's duplicate window, so the broker stores the victim's message too.
    std::thread::sleep(Duration::from_millis(300));
    server.raw_publish(b"orders.x", id, br#"{"order":42}"#);
    let other: &[(&[u8], &[u8])] = &[(b"Nats-Msg-Id", b"other-1")];
    server.raw_publish(b"orders.x", other, br#"{"order":7}"#);
    wait_until(Duration::from_secs(30), "all 3 settled", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((3, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(15)).is_some());
    let dlq = dlq_records(&server);
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    assert_eq!(dlq[0].1["original"]["stream_sequence"], 2);
    assert_eq!(dlq[0].1["failure"]["reason"], "duplicate_exists");
    let stored = records(&dir.path().join("out"));
    assert_eq!(stored.keys().copied().collect::<Vec<_>>(), [1, 3]);
    let snap = dir.path().join("metrics.json");
    assert_eq!(snapshot_counter(&snap, "messages_written_total"), 2);
}

/// `delivery.priority_lanes`: one fetched batch with mixed priorities reaches the sink lane
/// by lane (flash, then priority, then the default lane), in fetch order inside a lane, and
/// every message is ACKed; the snapshot counts each lane.
#[test]
fn a_mixed_batch_is_written_lane_by_lane() {
    let (server, dir) = setup();
    // Published before the runner starts: the first pull takes all twelve in one batch.
    let priorities = [
        "routine", "flash", "normal", "priority", "flash", "routine", "high", "", "flash",
        "priority", "routine", "flash",
    ];
    for p in priorities {
        let headers: &[(&str, &str)] = if p.is_empty() {
            &[]
        } else {
            &[("Svc-Priority", p)]
        };
        server.publish_with_headers("orders.created", headers, b"{}");
    }
    let extra = json!({
        "delivery": {"priority_lanes": {"lanes": [
            {"name": "flash", "priorities": ["flash"]},
            {"name": "priority", "priorities": ["priority", "high"]},
            {"name": "routine", "priorities": ["routine"]}
        ]}},
        "sink": {"type": "file", "directory": dir.path().join("out"), "mode": "jsonl"}
    });
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), extra));
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "every message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((12, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits")
        .success());

    let out = dir.path().join("out");
    let mut lines = Vec::new();
    for f in files_below(&out) {
        let text = std::fs::read_to_string(out.join(f)).unwrap();
        lines.extend(
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()),
        );
    }
    let seen: Vec<(u64, String)> = lines
        .iter()
        .map(|r| {
            let p = r["priority"].as_str().unwrap().to_string();
            (r["stream_sequence"].as_u64().unwrap(), p)
        })
        .collect();
    let lane = |p: &str| match p {
        "flash" => 0,
        "priority" | "high" => 1,
        _ => 2,
    };
    let mut expected: Vec<(u64, String)> = priorities
        .iter()
        .enumerate()
        // No header: the default priority, `normal`, in the default lane.
        .map(|(i, p)| {
            (
                i as u64 + 1,
                if p.is_empty() { "normal" } else { p }.to_string(),
            )
        })
        .collect();
    expected.sort_by_key(|(seq, p)| (lane(p), *seq));
    assert_eq!(
        seen, expected,
        "file order: lane by lane, fetch order inside a lane"
    );

    let snap: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("metrics.json")).unwrap()).unwrap();
    assert_eq!(
        snap["priority_lanes"],
        json!([
            {"lane": "flash", "messages_total": 4, "messages_written_total": 4, "sink_writes_total": 1},
            {"lane": "priority", "messages_total": 3, "messages_written_total": 3, "sink_writes_total": 1},
            {"lane": "routine", "messages_total": 5, "messages_written_total": 5, "sink_writes_total": 1}
        ])
    );
}

/// Publishes `body` on `svc.dlq` under the message id `id`, as a publisher allowed on the DLQ
/// subject can.
fn publish_under(nc: &nats::Connection, id: &str, body: &[u8]) {
    nats::jetstream::new(nc.clone())
        .publish_with_options(
            "svc.dlq",
            body,
            &nats::jetstream::PublishOptions {
                id: Some(id.to_string()),
                ..Default::default()
            },
        )
        .unwrap();
}

/// The DLQ stream's message `seq`: its body and whether it carries a `Nats-Msg-Id`.
fn dlq_message(b: &NatsServer, seq: u64) -> (Vec<u8>, bool) {
    let m = b.js().get_message("DLQ", seq).unwrap();
    let has_id = m
        .headers
        .as_ref()
        .is_some_and(|h| h.get("Nats-Msg-Id").is_some());
    (m.data, has_id)
}

/// A record published first under the id the runner's record will carry (a publisher allowed
/// on the DLQ subject, or a stream's from before it was created again) makes the stream call
/// ours a duplicate: that is not "stored". Review 51: a forged record with the real
/// original's identity and payload digest but the forger's own `failure` and `headers` was
/// taken for ours, the original ACKed, and the forged failure was the only record. Now a
/// duplicate counts only when the stream holds our very record (all but the time, delivery
/// count and consumer sequence equal, our headers, our subject); otherwise ours is stored
/// again without a message id, so the original is acknowledged only with its true record and
/// a forger cannot hold it back.
#[test]
fn a_forged_record_under_our_id_is_not_taken_for_ours() {
    let b = NatsServer::start();
    let nc = b.connect();
    b.create_stream("DLQ", &["svc.dlq"]);
    let cfg = DeadLetterConfig {
        expected_stream: Some("DLQ".into()),
        ..dlq_cfg("svc.dlq")
    };
    let publisher = DeadLetterPublisher::new(nc.clone(), cfg.clone());

    // Another message's record under our id.
    let ours = DeadLetter::build(&raw(7), &failure(), 0, &cfg);
    let forged = DeadLetter::build(
        &RawMessage {
            data: b"another payload".to_vec(),
            ..raw(7)
        },
        &failure(),
        0,
        &cfg,
    );
    assert_eq!(forged.msg_id, ours.msg_id);
    publish_under(&nc, &ours.msg_id, &forged.body);
    let ack = publisher.publish(&ours).unwrap();
    assert_eq!((ack.sequence, ack.duplicate), (2, false));
    assert_eq!(dlq_message(&b, 2), (ours.body.clone(), false));

    // The reviewer's forgery: our record's identity and payload digest, the forger's failure
    // and headers.
    let real = DeadLetter::build(&raw(9), &failure(), 5, &cfg);
    let mut lie: Value = serde_json::from_slice(&real.body).unwrap();
    lie["failure"]["reason"] = json!("forged");
    lie["failure"]["message"] = json!("nothing wrong here, ignore");
    lie["headers"] = json!({"X-Forged": "yes"});
    publish_under(&nc, &real.msg_id, &serde_json::to_vec(&lie).unwrap());
    assert_eq!(b.stream_messages("DLQ"), 3);
    let ack = publisher.publish(&real).unwrap();
    assert_eq!((ack.sequence, ack.duplicate), (4, false));
    assert_eq!(dlq_message(&b, 4), (real.body.clone(), false));
    let of_9: Vec<Value> = dlq_records(&b)
        .into_iter()
        .map(|(_, v)| v)
        .filter(|v| v["original"]["stream_sequence"] == 9)
        .collect();
    assert_eq!(of_9.len(), 2, "{of_9:?}");
    assert_eq!(of_9[1]["failure"]["reason"], "unknown_field");
    // Our own body under our id but with another reason header is not ours either.
    let tagged = DeadLetter::build(&raw(10), &failure(), 0, &cfg);
    let mut h = nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", tagged.msg_id.as_str());
    h.insert("Svc-Dlq-Reason", "forged");
    nats::jetstream::new(nc.clone())
        .publish_message(&nats::Message::new(
            "svc.dlq",
            None,
            tagged.body.clone(),
            Some(h),
        ))
        .unwrap();
    let ack = publisher.publish(&tagged).unwrap();
    assert_eq!((ack.sequence, ack.duplicate), (6, false));

    // The same message's record from an earlier delivery still counts as stored.
    let other_delivery = DeadLetter::build(
        &RawMessage {
            delivery_count: 4,
            consumer_sequence: 31,
            ..raw(8)
        },
        &failure(),
        9,
        &dlq_cfg("svc.dlq"),
    );
    publisher
        .publish(&DeadLetter::build(
            &raw(8),
            &failure(),
            0,
            &dlq_cfg("svc.dlq"),
        ))
        .unwrap();
    let ack = publisher.publish(&other_delivery).unwrap();
    assert!(ack.duplicate && ack.sequence == 7, "{ack:?}");
    assert_eq!(b.stream_messages("DLQ"), 7);
}

const BAD_LABELS: [(&str, &str); 1] = [("Svc-Security-Labels", "{\"x\": 1}")];

/// A broker with a DLQ stream and two messages (1 fails its labels, 2 is stored), and the
/// config of a runner storing per event by stream sequence.
fn recreation_setup() -> (NatsServer, tempfile::TempDir, std::path::PathBuf) {
    let (server, dir) = setup();
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    server.publish_with_headers("orders.a", &BAD_LABELS, b"{\"old\":1}");
    server.publish_with_headers("orders.a", &[], b"{\"old\":2}");
    let mut extra = labels_config();
    extra["sink"] = json!({"type": "file", "directory": dir.path().join("out"),
                           "mode": "per_event", "key_strategy": "stream_sequence"});
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), extra));
    (server, dir, cfg)
}

fn settled(server: &NatsServer, what: &str) {
    wait_until(Duration::from_secs(30), what, || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((2, 0, 0))
    });
}

/// Deletes the stream, creates it and its consumer again, and publishes the same two shapes.
fn recreate_and_publish(server: &NatsServer) {
    server.js().delete_stream(STREAM).unwrap();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.publish_with_headers("orders.a", &BAD_LABELS, b"{\"new\":1}");
    server.publish_with_headers("orders.a", &[], b"{\"new\":2}");
}

/// Both messages 1 are dead-lettered, each under its stream's incarnation, and both messages 2
/// are stored under their own keys.
fn assert_ids_of_their_own(server: &NatsServer, out: &Path) {
    let dlq = dlq_records(server);
    assert_eq!(
        dlq.len(),
        2,
        "the new message 1 was dropped as a duplicate: {dlq:?}"
    );
    let incarnations: Vec<&str> = dlq
        .iter()
        .map(|(_, v)| v["original"]["stream_incarnation"].as_str().unwrap())
        .collect();
    assert_ne!(incarnations[0], incarnations[1]);
    let js = server.js();
    for (i, (_, v)) in dlq.iter().enumerate() {
        assert_eq!(v["original"]["stream_sequence"], 1);
        let m = js.get_message("DLQ", i as u64 + 1).unwrap();
        assert_eq!(
            m.headers.unwrap().get("Nats-Msg-Id").map(String::as_str),
            Some(format!("svc-dlq:ORDERS:{}:1", incarnations[i]).as_str())
        );
    }
    let mut stored: Vec<String> = files_below(out)
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p.ends_with("/2.json"))
        .collect();
    stored.sort();
    let mut expected: Vec<String> = incarnations
        .iter()
        .map(|i| format!("stream-sequence/ORDERS/{i}/2.json"))
        .collect();
    expected.sort();
    assert_eq!(stored, expected);
}

fn stop_cleanly(mut runner: Runner) {
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits")
        .success());
}

/// A stream deleted and created again under a running runner numbers from 1 again. Its first
/// messages must not meet the old stream's ids: a failure of its message 1 is dead-lettered
/// (not dropped as the old message 1's duplicate), and its records carry the new incarnation.
#[test]
fn a_stream_created_again_under_the_runner_gets_ids_of_its_own() {
    let (server, dir, cfg) = recreation_setup();
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    settled(&server, "first stream settled");
    assert_eq!(server.stream_messages("DLQ"), 1);
    recreate_and_publish(&server);
    settled(&server, "second stream settled");
    assert_ids_of_their_own(&server, &dir.path().join("out"));
    assert!(
        runner.log_text().contains("was created again"),
        "{}",
        runner.log_text()
    );
    stop_cleanly(runner);
}

/// Found by the hostile review (atk-broker): a runner restarted after its stream's messages
/// were settled has delivered nothing in this process. The stream is then deleted and created
/// again with its consumer: the new consumer's first delivery (sequence 1) is above the nothing
/// seen, so the sequence check never fired and the new messages carried the old incarnation
/// (the new message 1's DLQ record met the old one's id, retried forever; the new message 2
/// met the old message 2's key). The first delivery of every bind now reads it again.
#[test]
fn a_stream_created_again_under_a_fresh_runner_gets_ids_of_its_own() {
    let (server, dir, cfg) = recreation_setup();
    let first = Runner::start(&cfg, &dir.path().join("svc1.log"));
    settled(&server, "first stream settled");
    stop_cleanly(first);
    // A new process: it binds (reading the old incarnation) and is handed nothing.
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    std::thread::sleep(Duration::from_secs(2));
    recreate_and_publish(&server);
    settled(&server, "second stream settled under the fresh runner");
    assert_ids_of_their_own(&server, &dir.path().join("out"));
    stop_cleanly(runner);
}

/// An HTTP receiver that holds every record of the old stream (`{"old":..}`) until `release`
/// is set, and refuses the new stream's (503) until `accept_new` is.
struct Gate {
    receiver: crate::support::http::Receiver,
    old_arrived: Arc<AtomicBool>,
    release: Arc<AtomicBool>,
    accept_new: Arc<AtomicBool>,
    accepted_new: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl Gate {
    fn start() -> Gate {
        let [old_arrived, release, accept_new] = [(); 3].map(|_| Arc::new(AtomicBool::new(false)));
        let accepted_new = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (o, r, a, n) = (
            old_arrived.clone(),
            release.clone(),
            accept_new.clone(),
            accepted_new.clone(),
        );
        let receiver = crate::support::http::Receiver::start(Box::new(move |req| {
            let rec: Value = serde_json::from_slice(&req.body).unwrap();
            if rec["payload"].get("old").is_some() {
                o.store(true, Ordering::SeqCst);
                while !r.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return (200, String::new());
            }
            if !a.load(Ordering::SeqCst) {
                return (503, String::new());
            }
            n.lock()
                .unwrap()
                .push(rec["payload"]["new"].as_u64().unwrap());
            (200, String::new())
        }));
        Gate {
            receiver,
            old_arrived,
            release,
            accept_new,
            accepted_new,
        }
    }
}

/// Found by the hostile review (atk51): ack subjects name stream, consumer and stream
/// sequence, not the stream's incarnation. A batch of the old stream still in the sink when the
/// stream and its consumer were created again sent its ACKs after the new consumer had
/// delivered sequences 1..N: the broker took them for the new messages, which were never
/// written (0 of 5 delivered after a crash). Now no handle delivered before the consumer was
/// created again is settled: the new messages stay pending until they are written.
#[test]
fn acks_of_an_old_streams_batch_never_settle_the_new_streams_messages() {
    let (server, dir) = setup();
    let gate = Gate::start();
    let mut cfg = config(&server, dir.path(), json!({}));
    cfg["sink"] = json!({"type": "http", "url": gate.receiver.url(),
                         "allow_http_for_local_testing": true, "batching": "none",
                         "request_timeout_seconds": 60, "retry_backoff_ms": 100,
                         "retry_max_backoff_ms": 200, "retry_budget_seconds": 1});
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    for i in 1..=3 {
        server.publish_with_headers("orders.a", &[], format!("{{\"old\":{i}}}").as_bytes());
    }
    wait_until(Duration::from_secs(30), "the old batch in the sink", || {
        gate.old_arrived.load(Ordering::SeqCst)
            && server.try_consumer_state(STREAM, CONSUMER) == Some((0, 3, 0))
    });
    server.js().delete_stream(STREAM).unwrap();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    for i in 1..=3 {
        server.publish_with_headers("orders.a", &[], format!("{{\"new\":{i}}}").as_bytes());
    }
    wait_until(
        Duration::from_secs(30),
        "the new messages delivered",
        || {
            runner.log_text().contains("was created again")
                && server.try_consumer_state(STREAM, CONSUMER) == Some((0, 3, 0))
        },
    );
    gate.release.store(true, Ordering::SeqCst);
    wait_until(Duration::from_secs(30), "the old batch settled", || {
        runner
            .log_text()
            .contains("3 deliveries made before the consumer was created again")
    });
    // The old batch's outcome came and went: the new messages are still all pending.
    assert_eq!(server.consumer_state(STREAM, CONSUMER), (0, 3, 0));
    assert!(gate.accepted_new.lock().unwrap().is_empty());
    gate.accept_new.store(true, Ordering::SeqCst);
    wait_until(Duration::from_secs(30), "the new messages written", || {
        server.consumer_state(STREAM, CONSUMER) == (3, 0, 0)
    });
    let mut accepted = gate.accepted_new.lock().unwrap().clone();
    accepted.sort();
    accepted.dedup();
    assert_eq!(accepted, [1, 2, 3], "{}", runner.log_text());
    stop_cleanly(runner);
}

/// `svc dlq list` counts the dead-letter stream's records by stage/reason and subject within
/// its filters, skipping what is not a record, and `svc dlq show` prints one by sequence,
/// escaped for the terminal; neither removes anything from the stream.
#[test]
fn dlq_list_counts_and_show_prints_the_records_read_only() {
    let (server, dir) = setup();
    server.create_stream("DLQ", &["svc.dlq"]);
    let cfg = dlq_cfg("svc.dlq");
    let publisher = DeadLetterPublisher::new(server.connect(), cfg.clone());
    let other = Failure::new("message_metadata", "priority", "not_allowed", "x".into());
    for seq in 1..=5 {
        let mut m = raw(seq);
        if seq == 5 {
            m.subject = "orders.\u{1b}[2Jus".into();
        }
        let f = if seq <= 3 { failure() } else { other.clone() };
        publisher
            .publish(&DeadLetter::build(&m, &f, 0, &cfg))
            .unwrap();
    }
    server.raw_publish(b"svc.dlq", &[], b"not a record");
    let path = write_config(
        dir.path(),
        "c.json",
        &config(
            &server,
            dir.path(),
            json!({"dead_letter": {"enabled": true, "subject": "svc.dlq"}}),
        ),
    );
    let path = path.to_str().unwrap();
    let (code, out, err) = svc(&["dlq", "list", path, "--format", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["records"], 5, "{v}");
    assert_eq!(v["not_records"], 1, "{v}");
    assert_eq!(v["by_reason"]["security_labels/unknown_field"], 3, "{v}");
    assert_eq!(v["by_reason"]["message_metadata/not_allowed"], 2, "{v}");
    assert_eq!(
        (
            v["oldest"]["sequence"].as_u64(),
            v["newest"]["sequence"].as_u64()
        ),
        (Some(1), Some(5))
    );

    let (code, out, _) = svc(&["dlq", "list", path, "--reason", "not_allowed"]);
    assert_eq!(code, 0);
    assert!(out.contains("dead-letter stream DLQ: 2 records"), "{out}");
    assert!(!out.contains('\u{1b}'), "{out}");

    let (code, out, err) = svc(&["dlq", "show", path, "2", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["record"]["original"]["stream_sequence"], 2, "{shown}");
    assert_eq!(shown["subject"], "svc.dlq");
    let (code, out, _) = svc(&["dlq", "show", path, "5"]);
    assert_eq!(code, 0);
    assert!(!out.contains('\u{1b}'), "{out}");
    let (code, _, err) = svc(&["dlq", "show", path, "99"]);
    assert_eq!(code, 1);
    assert!(err.contains("holds no message at sequence 99"), "{err}");
    // Only a dead-letter record is shown as one (found by the attack on dlq: any message was).
    let (code, _, err) = svc(&["dlq", "show", path, "6"]);
    assert_eq!(code, 1);
    assert!(err.contains("is not a svc.dead-letter.v1 record"), "{err}");
    // Read-only: every message is still there.
    assert_eq!(server.stream_messages("DLQ"), 6);

    // Counts cut short by --max say so and exit 3 (found by the attack: they looked whole).
    let (code, out, err) = svc(&["dlq", "list", path, "--max", "3"]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.contains("dead-letter stream DLQ: 3 records"), "{out}");
    assert!(
        err.contains("the counts are partial: --max 3 reached with 3 more messages"),
        "{err}"
    );

    // Forged records with long, distinct reasons: each kept cut at 256 characters, at most
    // 1,000 reasons counted one by one (the attack's 150 records of 400 KiB took +203 MiB).
    let long = "r".repeat(4000);
    for i in 0..1005 {
        let forged = json!({"schema": "svc.dead-letter.v1", "failed_at": long,
                            "failure": {"stage": "forged", "reason": format!("{i}{long}")},
                            "original": {"subject": long}});
        server.raw_publish(b"svc.dlq", &[], forged.to_string().as_bytes());
    }
    let (code, out, err) = svc(&["dlq", "list", path, "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["records"], 1010, "{}", &out[..200]);
    let reasons = v["by_reason"].as_object().unwrap();
    assert_eq!(reasons.len(), 1000);
    assert_eq!(
        v["other_reasons"], 7,
        "1,005 forged beside the 2 real reasons"
    );
    assert!(
        reasons.keys().all(|k| k.chars().count() <= 7 + 256 + 8),
        "a reason kept whole"
    );
    assert!(out.len() < 400_000, "output of {} bytes", out.len());

    // Without a dead-letter queue there is nothing to read: a usage error.
    let plain = write_config(
        dir.path(),
        "plain.json",
        &config(&server, dir.path(), json!({})),
    );
    let (code, _, err) = svc(&["dlq", "list", plain.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("dead_letter.enabled is false"), "{err}");
}
