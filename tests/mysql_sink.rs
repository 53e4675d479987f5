//! The relational sink's MySQL engine (`engine: "mysql"`) against the real MariaDB on
//! 127.0.0.1:3306: rows routed by subject with labels, mission metadata and byte-exact
//! payloads in their columns, redelivery without a second row, a key collision refused, a
//! connection cut mid-batch (nothing durable, then every row once), `svc test-sink`'s probe.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::support::mysql::{root, MyDb};
use crate::support::postgres::{envelope, parse_cfg};
use svc::metrics::Metrics;
use svc::sink::relational::my_sink::MySqlSink;
use svc::sink::{Sink, WriteOutcome};

fn sink_cfg(db: &MyDb, extra: serde_json::Value) -> serde_json::Value {
    let mut v = json!({
        "type": "relational_db",
        "engine": "mysql",
        "dsn": format!("mysql://root@127.0.0.1:3306/{}", db.name),
        "tls_mode": "disable",
        "table": "events",
        "routes": [{"subject": "orders.>", "table": "orders"}],
        "auto_create_tables": true,
    });
    for (k, val) in extra.as_object().unwrap() {
        v[k] = val.clone();
    }
    v
}

fn sink(db: &MyDb, extra: serde_json::Value) -> MySqlSink {
    MySqlSink::new(
        parse_cfg(&sink_cfg(db, extra)),
        Arc::new(Metrics::default()),
    )
    .unwrap()
}

fn count(db: &MyDb, table: &str) -> usize {
    db.rows(&format!("SELECT COUNT(*) FROM `{table}`"))[0][0]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn rows_are_routed_exact_and_stored_once() {
    let db = MyDb::new("sink");
    let s = sink(&db, json!({}));
    // Key order, number text and escapes a JSON type would rewrite; quotes and backslashes.
    let payload = br#"{"z":1,"a":1.50,"big":12345678901234567890,"s":"it's \"q\" \\ \u00e9 \n"}"#;
    let mut batch = vec![
        envelope("orders.eu", 1, payload),
        envelope("audit.x", 2, b"{\"k\":2}"),
        envelope("orders.us", 3, b"[1,2,3]"),
    ];
    batch[1].mission_metadata = Some(json!({"mission": "m-1", "phase": "ops"}));
    let out = s.write_batch(&batch);
    assert!(
        out.iter().all(|o| matches!(o, WriteOutcome::Durable)),
        "{out:?}"
    );
    assert_eq!(count(&db, "orders"), 2);
    assert_eq!(count(&db, "events"), 1);
    let row = &db.rows(
        "SELECT payload, labels, labels_list, priority, classification, stream_sequence, \
         security_labels_json IS NOT NULL, received_at FROM orders WHERE stream_sequence = 1",
    )[0];
    assert_eq!(row[0].as_deref().unwrap().as_bytes(), payload.as_slice());
    assert_eq!(row[1].as_deref(), Some("pii;eu"));
    assert_eq!(row[2].as_deref(), Some(r#"["pii","eu"]"#));
    assert_eq!(row[3].as_deref(), Some("high"));
    assert_eq!(row[4].as_deref(), Some("restricted"));
    assert_eq!(row[5].as_deref(), Some("1"));
    assert_eq!(row[6].as_deref(), Some("1"));
    assert_eq!(row[7].as_deref(), Some("2023-11-14 22:13:21.000000"));
    let mission = db.rows("SELECT mission_metadata_json FROM events")[0][0].clone();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&mission.unwrap()).unwrap(),
        json!({"mission": "m-1", "phase": "ops"})
    );

    // Redelivery (also within one batch): already durable, never a second row.
    let again = s.write_batch(&[batch[0].clone(), batch[0].clone(), batch[1].clone()]);
    assert!(
        again
            .iter()
            .all(|o| matches!(o, WriteOutcome::AlreadyDurable)),
        "{again:?}"
    );
    assert_eq!(count(&db, "orders"), 2);
    // The same key with another payload: a collision, not overwritten.
    let other = envelope("orders.eu", 1, b"{\"other\":true}");
    let out = s.write_batch(&[other]);
    assert!(
        matches!(&out[0], WriteOutcome::Permanent(e) if e.to_string().contains("different event")),
        "{out:?}"
    );
    assert_eq!(
        db.rows("SELECT payload FROM orders WHERE stream_sequence = 1")[0][0]
            .as_deref()
            .unwrap()
            .as_bytes(),
        payload.as_slice()
    );
}

#[test]
fn both_backslash_modes_store_the_same_bytes() {
    let db = MyDb::new("nbe");
    let payload = br#"{"s":"a\\b'c\"d\u00e9"}"#;
    let s = sink(&db, json!({}));
    assert!(s.write_batch(&[envelope("a", 1, payload)])[0].is_durable());
    let mut c = db.conn();
    c.query("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'")
        .unwrap();
    let lit = c.quote(std::str::from_utf8(payload).unwrap());
    c.query(&format!(
        "SELECT {lit} = (SELECT payload FROM `{}`.events)",
        db.name
    ))
    .map(|r| assert_eq!(r.rows[0][0].as_deref(), Some("1")))
    .unwrap();
    assert_eq!(
        db.rows("SELECT payload FROM events")[0][0]
            .as_deref()
            .unwrap()
            .as_bytes(),
        payload.as_slice()
    );
}

#[test]
fn a_connection_cut_mid_batch_acks_nothing_then_every_row_once() {
    let db = MyDb::new("cut");
    let s = Arc::new(sink(&db, json!({})));
    assert!(s.write_batch(&[envelope("a", 1, b"1")])[0].is_durable());
    // Hold the table so the next batch waits inside its transaction, then cut its session.
    let mut locker = db.conn();
    locker.query("LOCK TABLES events WRITE").unwrap();
    let batch: Vec<_> = (2..=20).map(|i| envelope("a", i, b"{\"n\":1}")).collect();
    let (s2, b2) = (s.clone(), batch.clone());
    let writer = std::thread::spawn(move || s2.write_batch(&b2));
    let mut admin = root();
    let mut killed = 0;
    for _ in 0..100 {
        let ids = admin
            .query(&format!(
                "SELECT id FROM information_schema.processlist WHERE db = '{}' AND state LIKE '%lock%' AND command = 'Query'",
                db.name
            ))
            .unwrap();
        for r in ids.rows {
            if let Some(id) = r[0].as_deref() {
                let _ = admin.query(&format!("KILL CONNECTION {id}"));
                killed += 1;
            }
        }
        if killed > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(killed > 0, "the batch never waited on the lock");
    let out = writer.join().unwrap();
    locker.query("UNLOCK TABLES").unwrap();
    assert!(
        out.iter().all(|o| matches!(o, WriteOutcome::Transient(_))),
        "{out:?}"
    );
    assert_eq!(
        count(&db, "events"),
        1,
        "nothing of the cut batch is stored"
    );
    let out = s.write_batch(&batch);
    assert!(out.iter().all(WriteOutcome::is_durable), "{out:?}");
    let out = s.write_batch(&batch);
    assert!(out
        .iter()
        .all(|o| matches!(o, WriteOutcome::AlreadyDurable)));
    assert_eq!(count(&db, "events"), 20);
}

#[test]
fn test_sink_probes_and_names_missing_tables() {
    let db = MyDb::new("probe");
    let s = sink(&db, json!({"auto_create_tables": false}));
    let e = s.check().unwrap_err().to_string();
    assert!(
        e.contains("missing table(s)") && e.contains("events"),
        "{e}"
    );
    s.create_tables().unwrap();
    let ok = s.check().unwrap();
    assert!(
        ok.starts_with("mysql ") && ok.contains("probe rolled back"),
        "{ok}"
    );
    assert_eq!(count(&db, "events"), 0);
    // A wrong password env: a clear error naming the variable.
    let s = sink(&db, json!({"password_env": "SVC_E2E_NO_SUCH_VAR_49"}));
    let e = s.check().unwrap_err().to_string();
    assert!(e.contains("SVC_E2E_NO_SUCH_VAR_49"), "{e}");
}

#[test]
fn upsert_replaces_with_newer_content_never_older() {
    let db = MyDb::new("upsert");
    let s = sink(
        &db,
        json!({"write_mode": "upsert", "key_field": "/order/id"}),
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
    let out = s.write_batch(&[v(1, json!("A"), "new"), v(2, json!(7), "new")]);
    assert!(out.iter().all(WriteOutcome::is_durable), "{out:?}");
    // Newer content replaces; inside one batch the last (highest sequence) wins.
    let out = s.write_batch(&[v(3, json!("A"), "paid"), v(4, json!("A"), "shipped")]);
    assert!(out.iter().all(WriteOutcome::is_durable), "{out:?}");
    // A redelivered older message never overwrites a newer row.
    assert!(s.write_batch(&[v(1, json!("A"), "new")])[0].is_durable());
    let rows = db.rows(
        "SELECT idempotency_key, stream_sequence, payload FROM orders ORDER BY idempotency_key",
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0][0].as_deref(), Some("k-7"));
    assert_eq!(rows[1][0].as_deref(), Some("k-A"));
    assert_eq!(rows[1][1].as_deref(), Some("4"));
    assert!(
        rows[1][2].as_deref().unwrap().contains("shipped"),
        "{rows:?}"
    );
    // No key in the payload: that row is Permanent, the others are written.
    let out = s.write_batch(&[
        envelope("orders.eu", 9, b"{\"x\":1}"),
        v(10, json!("B"), "new"),
    ]);
    assert!(
        matches!(&out[0], WriteOutcome::Permanent(e) if e.to_string().contains("/order/id")),
        "{out:?}"
    );
    assert!(out[1].is_durable());
    // By stream sequence (no key_field): a redelivery rewrites the same row, never a second.
    let s = sink(
        &db,
        json!({"write_mode": "upsert", "table": "by_seq", "routes": []}),
    );
    for _ in 0..2 {
        assert!(s.write_batch(&[envelope("x", 5, b"{\"a\":1}")])[0].is_durable());
    }
    assert_eq!(count(&db, "by_seq"), 1);
}

/// `svc run` end to end: a real nats-server, the `svc` binary, MariaDB. SIGKILL mid-stream and
/// a restart (then a full replay from a recreated consumer) leave every message exactly once;
/// `svc init-db --print`, `svc init-db` and `svc test-sink` for the mysql engine.
#[test]
fn runner_sigkill_and_replay_store_every_message_once() {
    use crate::support::broker::NatsServer;
    use crate::support::net::wait_until;
    use crate::support::process::{svc, Runner};
    use crate::support::{snapshot_counter, write_config};
    const STREAM: &str = "ORDERS";
    let n = 2000usize;
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, "svc", "orders.>", Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    let dir = tempfile::tempdir().unwrap();
    let db = MyDb::new("run");
    let mut sink = sink_cfg(&db, json!({"auto_create_tables": false, "routes": []}));
    sink["table"] = json!("events");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({
            "nats": {"url": server.url(), "stream": STREAM, "consumer": "svc", "subject": "orders.>"},
            "delivery": {"batch_size": 32, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                         "sink_workers": 2, "shutdown_timeout_seconds": 10,
                         "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
            "sink": sink,
            "metrics": {"enabled": true, "snapshot_file": dir.path().join("metrics.json"),
                        "write_interval_seconds": 1},
            "logging": {"level": "info"}
        }),
    );
    let cfg_s = cfg.to_str().unwrap();
    let (code, out, err) = svc(&["init-db", cfg_s, "--print"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("CREATE TABLE IF NOT EXISTS `events` ("),
        "{out}"
    );
    assert!(
        out.contains("payload LONGTEXT NOT NULL CHECK (JSON_VALID(payload))"),
        "{out}"
    );
    let (code, _, err) = svc(&["test-sink", cfg_s]);
    assert_ne!(code, 0, "test-sink before the table exists");
    assert!(err.contains("missing table"), "{err}");
    let (code, out, err) = svc(&["init-db", cfg_s]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = svc(&["test-sink", cfg_s]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(format!("{out}{err}").contains("mysql"), "{out}{err}");

    let acked =
        |server: &NatsServer| server.try_consumer_state(STREAM, "svc") == Some((n as u64, 0, 0));
    let stop = |mut r: Runner| {
        r.signal("TERM");
        let status = r.wait_timeout(Duration::from_secs(20)).expect("exits");
        assert!(status.success(), "{}", r.log_text());
    };
    let stored = |db: &MyDb| {
        let rows = db.rows("SELECT COUNT(*), COUNT(DISTINCT stream_sequence) FROM events");
        let all: usize = rows[0][0].as_deref().unwrap().parse().unwrap();
        let distinct: usize = rows[0][1].as_deref().unwrap().parse().unwrap();
        assert_eq!(all, distinct, "a message stored twice");
        all
    };
    let mut runner = Runner::start(&cfg, &dir.path().join("svc1.log"));
    wait_until(Duration::from_secs(60), "some rows committed", || {
        stored(&db) >= 300
    });
    runner.sigkill();
    assert!(stored(&db) < n, "killed mid-stream");
    let runner = Runner::start(&cfg, &dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(90), "all acked after restart", || {
        acked(&server)
    });
    assert_eq!(stored(&db), n);
    stop(runner);
    // Replay everything from a recreated consumer: every row is already there.
    server.js().delete_consumer(STREAM, "svc").unwrap();
    server.create_consumer(STREAM, "svc", "orders.>", Duration::from_secs(30));
    let snap = dir.path().join("metrics.json");
    std::fs::remove_file(&snap).unwrap();
    let runner = Runner::start(&cfg, &dir.path().join("svc3.log"));
    wait_until(Duration::from_secs(90), "replay acked", || acked(&server));
    stop(runner);
    assert_eq!(stored(&db), n, "no duplicate rows");
    assert_eq!(
        snapshot_counter(&snap, "db_duplicate_ignored_total"),
        n as u64
    );
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), n as u64);
}

/// A row the server refuses on its data (a stream name longer than its column: 1406, 22001)
/// is Permanent alone; the rest of the batch commits; a later copy of the refused row in the
/// same batch is not reported stored.
#[test]
fn a_row_the_database_refuses_is_permanent_and_the_rest_commit() {
    let db = MyDb::new("reject");
    let s = sink(&db, json!({}));
    let mut long = envelope("a", 1, b"{\"n\":1}");
    long.stream = "S".repeat(300).into();
    let out = s.write_batch(&[long.clone(), envelope("a", 2, b"{\"n\":2}"), long]);
    assert!(
        matches!(&out[0], WriteOutcome::Permanent(e) if e.to_string().contains("22001")),
        "{out:?}"
    );
    assert!(out[1].is_durable(), "{out:?}");
    assert!(matches!(&out[2], WriteOutcome::Permanent(_)), "{out:?}");
    assert_eq!(count(&db, "events"), 1);
}

/// The rows of `table` exported with the `mariadb` command-line client and the statement the
/// docs show (`custody_export_sql`), as JSON lines; the file's path.
fn export_rows(db: &MyDb, table: &str, dir: &std::path::Path) -> String {
    use svc::sink::relational::config::TableName;
    let sql = svc::sink::relational::my_sink::custody_export_sql(&TableName {
        schema: None,
        name: table.into(),
    });
    let out = std::process::Command::new("mariadb")
        .args(["-h", "127.0.0.1", "-P", "3306", "-u", "root"])
        .args([
            "--batch",
            "--raw",
            "--skip-column-names",
            "-D",
            &db.name,
            "-e",
            &sql,
        ])
        .output()
        .expect("the mariadb command-line client (scripts/deps.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(format!("{table}.jsonl"));
    std::fs::write(&path, &out.stdout).unwrap();
    path.to_str().unwrap().to_string()
}

/// Rows written with custody on verify with `svc verify-custody` from a `mariadb` export, as
/// PostgreSQL rows do from `row_to_json`: byte-exact payloads (key order, `1.50`, `1e2`,
/// numbers beyond a double), mission metadata, a wrapped text payload; a row changed in
/// MariaDB afterwards is named by its stream sequence, exit 1.
#[test]
fn custody_sealed_rows_verify_from_a_mariadb_export() {
    use crate::support::protection::{svc_env, B64, CUSTODY_KEY};
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    use svc::message::protection::custody::{Custodian, CustodyConfig};
    use svc::message::protection::keys::KeySource;

    let db = MyDb::new("custody");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("custody.key");
    std::fs::write(&key, B64.encode(CUSTODY_KEY)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let custodian = Custodian::load(&CustodyConfig {
        enabled: true,
        runner_id: "runner-test-1".into(),
        hmac_key: Some(KeySource::File(key)),
        checkpoints: Default::default(),
    })
    .unwrap();
    let raw: [&[u8]; 4] = [
        br#"{"z":1,"a":1.50,"n":1e2,"big":123456789012345678901234567890,"s":"\u00e9\n'"}"#,
        b"{\"k\":2}",
        b"[1,2,3]",
        b"plain text, wrapped",
    ];
    let mut batch: Vec<_> = raw
        .iter()
        .enumerate()
        .map(|(i, p)| envelope("audit.x", i as u64 + 1, p))
        .collect();
    batch[1].mission_metadata = Some(json!({"mission": "m-1", "phase": "ops"}));
    for (e, p) in batch.iter_mut().zip(raw) {
        custodian.seal(e, p, 1_700_000_002_000_000_000);
    }
    assert!(batch[3].payload_info.wrapped);
    let s = sink(&db, json!({}));
    let out = s.write_batch(&batch);
    assert!(out.iter().all(|o| *o == WriteOutcome::Durable), "{out:?}");

    let cfg = crate::support::write_config(
        dir.path(),
        "c.json",
        &json!({
            "nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                     "subject": "audit.>"},
            "sink": sink_cfg(&db, json!({})),
            "custody": {"enabled": true, "runner_id": "runner-test-1",
                        "hmac_key_env": "PP_CUSTODY_KEY"},
        }),
    );
    let cfg = cfg.to_str().unwrap();
    let file = export_rows(&db, "events", dir.path());
    let (code, stdout, err) = svc_env(&["verify-custody", cfg, &file], None);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.ends_with("4 intact, 0 altered, 0 unverifiable\n"),
        "{stdout}"
    );

    // Changed in the database after writing: the row is named.
    db.conn()
        .query("UPDATE events SET classification = 'public' WHERE stream_sequence = 2")
        .unwrap();
    db.conn()
        .query("UPDATE events SET payload = '{\"k\":3}' WHERE stream_sequence = 3")
        .unwrap();
    let file = export_rows(&db, "events", dir.path());
    let (code, stdout, _) = svc_env(&["verify-custody", cfg, &file], None);
    assert_eq!(code, 1, "{stdout}");
    for seq in [2, 3] {
        assert!(
            stdout.contains(&format!("(stream ORDERS sequence {seq}): ALTERED")),
            "{stdout}"
        );
    }
    assert!(
        stdout.ends_with("2 intact, 2 altered, 0 unverifiable\n"),
        "{stdout}"
    );
}
