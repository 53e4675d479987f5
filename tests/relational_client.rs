//! The relational sink and its PostgreSQL client against the local server on 127.0.0.1:5432
//! (trust auth), called in-process through the library's API; each test creates and drops its
//! own database. End to end through `svc run` is `relational`; a private server with password
//! authentication and verified TLS is `relational_cluster`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use svc::message::envelope::Envelope;
use svc::metrics::Metrics;
use svc::sink::relational::{ddl, RelationalSink};
use svc::sink::{Sink, WriteOutcome};

use crate::support::postgres::{envelope, parse_cfg, TestDb};

fn batch(subject: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<Envelope> {
    seqs.map(|s| envelope(subject, s, format!("{{\"n\":{s}}}").as_bytes()))
        .collect()
}

fn all_durable(o: &[WriteOutcome]) -> bool {
    o.iter().all(|o| *o == WriteOutcome::Durable)
}

#[test]
fn rows_land_with_labels_in_both_columns() {
    let db = TestDb::new("rows");
    let (sink, _) = db.relational_sink(json!({}));
    sink.create_tables().unwrap();
    let mut b = batch("orders.created", 1..=3);
    b.push(envelope("orders.created", 4, b"null"));
    b.push(envelope("orders.created", 5, b"plain text"));
    let out = sink.write_batch(&b);
    assert!(all_durable(&out), "{out:?}");
    assert_eq!(db.count("events"), 5);

    let rows = db.rows(
        "SELECT idempotency_key, subject, stream, stream_sequence, consumer, message_id, priority, \
         classification, labels, labels_list, payload, payload_original_format, payload_wrapped, \
         payload_sha256, payload_size_bytes, security_labels_json, \
         metadata_json->'security_labels', metadata_json->>'schema', payload IS NULL \
         FROM events ORDER BY stream_sequence",
    );
    let r = &rows[0];
    let s = |i: usize| r[i].as_deref().unwrap();
    assert_eq!(s(0), "s-ORDERS-1");
    assert_eq!(s(1), "orders.created");
    assert_eq!(s(2), "ORDERS");
    assert_eq!(s(3), "1");
    assert_eq!(s(4), "svc");
    assert_eq!(s(5), "msg-1");
    assert_eq!(s(6), "high");
    assert_eq!(s(7), "restricted");
    assert_eq!(s(8), "pii;eu");
    assert_eq!(s(9), "{pii,eu}");
    assert_eq!(s(10), r#"{"n": 1}"#);
    assert_eq!(s(11), "json");
    assert_eq!(s(12), "f");
    assert_eq!(s(13), b[0].payload_info.sha256);
    assert_eq!(s(14), "7");
    let labels: serde_json::Value = serde_json::from_str(s(15)).unwrap();
    assert_eq!(labels, b[0].security_labels.clone().unwrap());
    let in_meta: serde_json::Value = serde_json::from_str(s(16)).unwrap();
    assert_eq!(
        in_meta, labels,
        "METADATA_JSON.security_labels equals SECURITY_LABELS_JSON"
    );
    assert_eq!(s(17), "svc.metadata.v1");
    // A JSON null payload stays JSON null (not SQL NULL); text is wrapped.
    assert_eq!(rows[3][10].as_deref(), Some("null"));
    assert_eq!(rows[3][18].as_deref(), Some("f"));
    assert_eq!(rows[4][10].as_deref(), Some(r#"{"text": "plain text"}"#));
    assert_eq!(rows[4][12].as_deref(), Some("t"));

    // The spec's upper-case column names resolve (unquoted identifiers fold to lower case).
    let n = db.rows(
        "SELECT count(*) FROM events WHERE SECURITY_LABELS_JSON->>'owner' = 'ops' \
         AND METADATA_JSON->'security_labels'->>'owner' = 'ops'",
    );
    assert_eq!(n[0][0].as_deref(), Some("5"));
}

#[test]
fn redelivered_rows_are_ignored_and_counted() {
    let db = TestDb::new("dup");
    let (sink, metrics) = db.relational_sink(json!({"auto_create_tables": true}));
    let b = batch("orders.created", 1..=4);
    assert!(all_durable(&sink.write_batch(&b)));
    let c = &metrics.counters;
    assert_eq!(c.db_duplicates_total.load(Ordering::Relaxed), 0);

    // Redelivery of the whole batch, plus one new message: no duplicate rows.
    let mut again = b.clone();
    for e in &mut again {
        e.metadata.delivery_count = 2;
    }
    again.push(envelope("orders.created", 5, b"{}"));
    let out = sink.write_batch(&again);
    assert_eq!(out[..4].to_vec(), vec![WriteOutcome::AlreadyDurable; 4]);
    assert_eq!(out[4], WriteOutcome::Durable);
    assert_eq!(db.count("events"), 5);
    assert_eq!(c.db_duplicates_total.load(Ordering::Relaxed), 4);
    assert_eq!(c.db_duplicate_ignored_total.load(Ordering::Relaxed), 4);

    // The same message twice inside one batch: one row, the second is a duplicate.
    let twice = vec![
        envelope("orders.created", 6, b"{}"),
        envelope("orders.created", 6, b"{}"),
    ];
    assert_eq!(
        sink.write_batch(&twice),
        vec![WriteOutcome::Durable, WriteOutcome::AlreadyDurable]
    );
    assert_eq!(db.count("events"), 6);
    assert_eq!(c.db_duplicates_total.load(Ordering::Relaxed), 5);
    assert_eq!(c.db_duplicate_ignored_total.load(Ordering::Relaxed), 5);
}

#[test]
fn key_collision_with_a_different_event_is_permanent_and_not_overwritten() {
    let db = TestDb::new("collide");
    let (sink, metrics) = db.relational_sink(json!({"auto_create_tables": true}));
    assert!(all_durable(&sink.write_batch(&[envelope(
        "orders.a",
        1,
        b"{\"v\":1}"
    )])));
    // A reset stream reuses sequence 1 for a different event.
    let out = sink.write_batch(&[
        envelope("orders.a", 1, b"{\"v\":2}"),
        envelope("orders.a", 2, b"{}"),
    ]);
    match &out[0] {
        WriteOutcome::Permanent(e) => {
            assert!(e.message.contains("already holds a different event"), "{e}");
            assert!(!e.message.contains("\"v\""), "no payload in errors: {e}");
        }
        o => panic!("expected permanent, got {o:?}"),
    }
    assert_eq!(out[1], WriteOutcome::Durable);
    let stored = db.rows("SELECT payload FROM events WHERE stream_sequence = 1");
    assert_eq!(stored[0][0].as_deref(), Some(r#"{"v": 1}"#));
    let c = &metrics.counters;
    assert_eq!(c.db_duplicates_total.load(Ordering::Relaxed), 1);
    assert_eq!(c.db_duplicate_ignored_total.load(Ordering::Relaxed), 0);
}

#[test]
fn subjects_are_routed_to_their_tables() {
    let db = TestDb::new("route");
    let extra = json!({
        "table": "other",
        "routes": [
            {"subject": "orders.eu.*", "table": "audit.eu_orders"},
            {"subject": "orders.>", "table": "orders"}
        ]
    });
    let (sink, _) = db.relational_sink(extra.clone());
    let ddl_text = ddl(&parse_cfg(&db.sink(extra)));
    assert!(
        ddl_text.starts_with("CREATE SCHEMA IF NOT EXISTS \"audit\";"),
        "{ddl_text}"
    );
    sink.create_tables().unwrap();
    let b = vec![
        envelope("orders.eu.created", 1, b"{}"),
        envelope("orders.us.created", 2, b"{}"),
        envelope("billing.paid", 3, b"{}"),
        envelope("orders.eu.paid", 4, b"{}"),
    ];
    assert!(all_durable(&sink.write_batch(&b)));
    assert_eq!(db.count("audit.eu_orders"), 2);
    assert_eq!(db.count("orders"), 1);
    assert_eq!(db.count("other"), 1);
    let r = db.rows("SELECT subject FROM audit.eu_orders ORDER BY stream_sequence");
    assert_eq!(r[1][0].as_deref(), Some("orders.eu.paid"));
}

#[test]
fn a_row_the_database_rejects_is_permanent_and_the_rest_commit() {
    let db = TestDb::new("reject");
    let (sink, _) = db.relational_sink(json!({
        "auto_create_tables": true,
        "routes": [{"subject": "b.>", "table": "b_events"}]
    }));
    // jsonb cannot hold \u0000: the server rejects that row's data (SQLSTATE 22P05).
    // Normalization keeps such a payload as text; set here as a row the server refuses.
    let mut bad = envelope("a.x", 2, b"{}");
    bad.payload =
        svc::message::envelope::Payload::from_compact_json(r#"{"k":"secret\u0000value"}"#.into())
            .unwrap();
    let b = vec![
        envelope("b.x", 10, b"{}"),
        envelope("a.x", 1, b"{}"),
        bad,
        envelope("a.x", 3, b"{}"),
    ];
    let out = sink.write_batch(&b);
    assert_eq!(out[0], WriteOutcome::Durable);
    assert_eq!(out[1], WriteOutcome::Durable);
    assert_eq!(out[3], WriteOutcome::Durable);
    match &out[2] {
        WriteOutcome::Permanent(e) => {
            assert!(e.message.contains("22P05"), "{e}");
            assert!(!e.message.contains("secret"), "no payload in errors: {e}");
        }
        o => panic!("expected permanent, got {o:?}"),
    }
    assert_eq!(db.count("events"), 2);
    assert_eq!(db.count("b_events"), 1);
}

#[test]
fn missing_table_is_transient_and_check_says_so() {
    let db = TestDb::new("missing");
    let (sink, _) =
        db.relational_sink(json!({"routes": [{"subject": "x.>", "table": "x_events"}]}));
    let out = sink.write_batch(&batch("a.b", 1..=2));
    match &out[0] {
        WriteOutcome::Transient(e) => assert!(e.message.contains("42P01"), "{e}"),
        o => panic!("expected transient, got {o:?}"),
    }
    let err = sink.check().unwrap_err();
    assert_eq!(
        err.message,
        format!(
            "missing table(s) in 127.0.0.1:5432/{}: events, x_events; create them with the DDL \
             in docs/sinks/relational.md or set sink.auto_create_tables",
            db.name
        )
    );
    sink.create_tables().unwrap();
    let ok = sink.check().unwrap();
    assert!(
        ok.contains("2 table(s) exist and accept inserts (probe rolled back)"),
        "{ok}"
    );
    assert_eq!(db.count("events"), 0, "the probe row was rolled back");
    // The pooled connection recovered from the failed batch: the retry succeeds.
    assert!(all_durable(&sink.write_batch(&batch("a.b", 1..=2))));
}

#[test]
fn check_rejects_a_table_without_the_unique_key() {
    let db = TestDb::new("nokey");
    let (sink, _) = db.relational_sink(json!({}));
    // Same columns, no unique constraint: ON CONFLICT (idempotency_key) cannot work.
    let weak =
        ddl(&parse_cfg(&db.sink(json!({})))).replace("text NOT NULL PRIMARY KEY", "text NOT NULL");
    db.conn().simple(&weak).unwrap();
    let err = sink.check().unwrap_err();
    assert!(err.message.contains("is not writable"), "{err}");
    assert!(err.message.contains("42P10"), "{err}");
}

#[test]
fn connection_cut_mid_batch_is_transient_then_all_rows_land_once() {
    let db = TestDb::new("cut");
    let (sink, _) = db.relational_sink(json!({"auto_create_tables": true}));
    assert!(all_durable(&sink.write_batch(&batch("a.b", 1..=3))));

    // Hold a lock so the sink's next INSERT waits inside its transaction, then kill its backend.
    let mut locker = db.conn();
    locker
        .simple("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let second = batch("a.b", 4..=8);
    let out = std::thread::scope(|s| {
        let writer = s.spawn(|| sink.write_batch(&second));
        let mut killer = db.conn();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let killed = killer
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name = 'svc' \
                     AND wait_event_type = 'Lock'",
                    &[],
                )
                .unwrap();
            if !killed.rows.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the insert never waited"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        writer.join().unwrap()
    });
    locker.simple("ROLLBACK").unwrap();
    assert_eq!(out.len(), 5);
    for o in &out {
        match o {
            WriteOutcome::Transient(e) => {
                assert!(e.message.contains("nothing committed"), "{e}");
                assert!(e.message.contains("57P01"), "{e}");
            }
            o => panic!("expected transient, got {o:?}"),
        }
    }
    assert_eq!(db.count("events"), 3, "nothing of the cut batch committed");

    // Between batches: the idle pooled connection is killed too.
    let mut killer = db.conn();
    killer
        .simple(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'svc'",
        )
        .unwrap();
    // Redelivery: reconnect, and every row lands exactly once.
    let mut retried = sink.write_batch(&second);
    if retried.iter().any(|o| !o.is_durable()) {
        // The first attempt may meet the killed pooled connection; the next reconnects.
        retried = sink.write_batch(&second);
    }
    assert!(all_durable(&retried), "{retried:?}");
    assert_eq!(db.count("events"), 8);
    assert!(all_durable(&sink.write_batch(&batch("a.b", 9..=9))));
}

#[test]
fn killed_idle_connection_fails_one_batch_then_reconnects() {
    let db = TestDb::new("idle");
    let (sink, _) = db.relational_sink(json!({"auto_create_tables": true}));
    assert!(all_durable(&sink.write_batch(&batch("a.b", 1..=1))));
    db.conn()
        .simple(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'svc'",
        )
        .unwrap();
    let out = sink.write_batch(&batch("a.b", 2..=3));
    assert!(
        out.iter().all(|o| matches!(o, WriteOutcome::Transient(_))),
        "{out:?}"
    );
    assert!(all_durable(&sink.write_batch(&batch("a.b", 2..=3))));
    assert_eq!(db.count("events"), 3);
}

#[test]
fn verify_full_against_an_untrusted_certificate_fails_cleanly() {
    // The shared server has ssl=on with a self-signed certificate: verification must fail with
    // a certificate error (not a panic, not a silent plaintext fallback).
    let db = TestDb::new("tls");
    let mut v = db.sink(json!({}));
    v["tls_mode"] = json!("verify_full");
    let sink = RelationalSink::new(parse_cfg(&v), Arc::new(Metrics::default())).unwrap();
    let err = sink.check().unwrap_err();
    assert!(err.message.contains("tls handshake"), "{err}");
    assert!(err.message.contains("certificate"), "{err}");
}

#[test]
fn concurrent_table_creation_does_not_race() {
    // Several workers (or runners) connecting at once to an empty database: the DDL is
    // serialized, so none fails with the catalog's unique violation.
    let db = TestDb::new("race");
    let block = db.sink(json!({"auto_create_tables": true,
                               "routes": [{"subject": "b.>", "table": "s1.b_events"}]}));
    let sinks: Vec<RelationalSink> = (0..6)
        .map(|_| RelationalSink::new(parse_cfg(&block), Arc::new(Metrics::default())).unwrap())
        .collect();
    let outcomes: Vec<Vec<WriteOutcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = sinks
            .iter()
            .enumerate()
            .map(|(i, k)| {
                s.spawn(move || {
                    let subject = if i % 2 == 0 { "a.x" } else { "b.x" };
                    k.write_batch(&[envelope(subject, i as u64 + 1, b"{}")])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in &outcomes {
        assert!(all_durable(o), "{o:?}");
    }
    assert_eq!(db.count("events") + db.count("s1.b_events"), 6);
}
#[test]
fn a_missing_password_variable_is_transient() {
    let db = TestDb::new("pwenv");
    let (sink, _) = db.relational_sink(json!({"password_env": "SVC_TEST_UNSET_PASSWORD_VAR"}));
    let err = sink.check().unwrap_err();
    assert!(
        err.message
            .contains("environment variable SVC_TEST_UNSET_PASSWORD_VAR named by sink.password_env is not set"),
        "{err}"
    );
}

/// `write_mode: upsert` on PostgreSQL: newer content (by stream sequence) replaces, an older
/// redelivery never does, the newest of a batch wins, a payload without `key_field` is
/// Permanent; without `key_field` a redelivery rewrites the same row.
#[test]
fn upsert_replaces_with_newer_content_never_older() {
    let db = TestDb::new("upsert");
    let (s, _) = db.relational_sink(
        json!({"write_mode": "upsert", "key_field": "/order/id", "auto_create_tables": true}),
    );
    let v = |seq, id: serde_json::Value, state: &str| {
        envelope(
            "orders.eu",
            seq,
            json!({"order": {"id": id, "state": state}})
                .to_string()
                .as_bytes(),
        )
    };
    assert!(all_durable(
        &s.write_batch(&[v(1, json!("A"), "new"), v(2, json!(7), "new")])
    ));
    assert!(all_durable(&s.write_batch(&[
        v(3, json!("A"), "paid"),
        v(4, json!("A"), "shipped")
    ])));
    assert!(all_durable(&s.write_batch(&[v(1, json!("A"), "new")])));
    let rows = db.rows(
        "SELECT idempotency_key, stream_sequence, payload->'order'->>'state' FROM events \
         ORDER BY idempotency_key",
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0][0].as_deref(), Some("k-7"));
    assert_eq!(rows[1][0].as_deref(), Some("k-A"));
    assert_eq!(rows[1][1].as_deref(), Some("4"));
    assert_eq!(rows[1][2].as_deref(), Some("shipped"));
    let out = s.write_batch(&[
        envelope("orders.eu", 9, b"{\"x\":1}"),
        v(10, json!("B"), "new"),
    ]);
    assert!(
        matches!(&out[0], WriteOutcome::Permanent(e) if e.to_string().contains("/order/id")),
        "{out:?}"
    );
    assert!(out[1].is_durable());
    let (s, _) = db.relational_sink(
        json!({"write_mode": "upsert", "table": "by_seq", "auto_create_tables": true}),
    );
    for _ in 0..2 {
        assert!(all_durable(&s.write_batch(&[envelope(
            "x",
            5,
            b"{\"a\":1}"
        )])));
    }
    assert_eq!(db.count("by_seq"), 1);
}
