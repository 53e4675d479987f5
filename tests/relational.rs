//! The relational and fan-out sinks end to end: a real `nats-server -js`, the `svc` binary and
//! the real PostgreSQL on 127.0.0.1:5432 (each test creates and drops its own database).

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::postgres::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";

fn config(server: &NatsServer, dir: &Path, sink: serde_json::Value) -> serde_json::Value {
    json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": SUBJECT},
        "delivery": {"batch_size": 64, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "sink_workers": 2, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": sink,
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    })
}

fn setup(n: usize, subject: &str) -> (NatsServer, tempfile::TempDir) {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    server.publish_n(STREAM, subject, n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    (server, tempfile::tempdir().unwrap())
}

fn all_acked(server: &NatsServer, n: u64) -> bool {
    server.try_consumer_state(STREAM, CONSUMER) == Some((n, 0, 0))
}

fn stop(mut runner: Runner) {
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "clean exit: {}", runner.log_text());
}

/// Every stored stream sequence of a table, asserting none appears twice.
fn sequences_once(db: &TestDb, table: &str) -> BTreeSet<u64> {
    let rows = db.rows(&format!("SELECT stream_sequence FROM {table}"));
    let seqs: Vec<u64> = rows
        .iter()
        .map(|r| r[0].as_deref().unwrap().parse().unwrap())
        .collect();
    let set: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(set.len(), seqs.len(), "a message stored twice in {table}");
    set
}

#[test]
fn rows_land_routed_by_subject_and_are_acked() {
    let (server, dir) = setup(200, "orders.us.created");
    server.publish_n(STREAM, "orders.eu.created", 100, |i| {
        format!("{{\"eu\":{i}}}").into_bytes()
    });
    let db = TestDb::new("rows");
    let sink = db.sink(json!({
        "auto_create_tables": true,
        "routes": [{"subject": "orders.eu.>", "table": "eu_orders"}]
    }));
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), sink));

    let (code, out, _) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(
            "Configuration is valid.\nActive sink: relational_db\nACK policy: commit-then-acknowledge\n\n"
        ),
        "{out}"
    );

    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(60), "every message acked", || {
        all_acked(&server, 300)
    });
    assert_eq!(
        sequences_once(&db, "events"),
        (1..=200).collect::<BTreeSet<u64>>()
    );
    assert_eq!(
        sequences_once(&db, "eu_orders"),
        (201..=300).collect::<BTreeSet<u64>>()
    );
    let r = db.rows(
        "SELECT subject, stream, consumer, payload, payload_sha256, metadata_json->>'schema', \
         idempotency_key FROM eu_orders WHERE stream_sequence = 201",
    );
    assert_eq!(r[0][0].as_deref(), Some("orders.eu.created"));
    assert_eq!(r[0][1].as_deref(), Some(STREAM));
    assert_eq!(r[0][2].as_deref(), Some(CONSUMER));
    assert_eq!(r[0][3].as_deref(), Some(r#"{"eu": 0}"#));
    assert_eq!(r[0][5].as_deref(), Some("svc.metadata.v1"));
    let key = format!("s-ORDERS-{}-201", server.incarnation(STREAM));
    assert_eq!(r[0][6].as_deref(), Some(key.as_str()));
    stop(runner);
    let snap = dir.path().join("metrics.json");
    assert_eq!(snapshot_counter(&snap, "messages_written_total"), 300);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 300);
    assert_eq!(snapshot_counter(&snap, "db_duplicates_total"), 0);
}

#[test]
fn sigkill_redelivery_adds_no_rows_and_counts_duplicates() {
    let n = 2000;
    let (server, dir) = setup(n, "orders.created");
    let db = TestDb::new("kill");
    let sink = db.sink(json!({"auto_create_tables": true}));
    let mut cfg_value = config(&server, dir.path(), sink);
    cfg_value["delivery"]["batch_size"] = json!(32);
    cfg_value["delivery"]["max_in_flight_batches"] = json!(2);
    let cfg = write_config(dir.path(), "c.json", &cfg_value);

    let mut runner = Runner::start(&cfg, &dir.path().join("svc1.log"));
    wait_until(Duration::from_secs(60), "some rows committed", || {
        // The runner creates the table on connect: until then the count fails.
        db.conn()
            .query("SELECT count(*) FROM events", &[])
            .ok()
            .and_then(|r| r.rows[0][0].as_deref().map(|v| v.parse::<i64>().unwrap()))
            .is_some_and(|c| c >= 300)
    });
    runner.sigkill();
    let before = db.int("SELECT count(*) FROM events");
    assert!((before as usize) < n, "killed mid-stream ({before} of {n})");

    let runner = Runner::start(&cfg, &dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(90), "all acked after restart", || {
        all_acked(&server, n as u64)
    });
    assert_eq!(sequences_once(&db, "events").len(), n);
    stop(runner);

    // A consumer's ack state can move backwards (nats-server after a SIGKILL and restart):
    // replay everything from the start, as a recreated consumer does. Every row is already there.
    server.js().delete_consumer(STREAM, CONSUMER).unwrap();
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    let snap = dir.path().join("metrics.json");
    std::fs::remove_file(&snap).unwrap();
    let runner = Runner::start(&cfg, &dir.path().join("svc3.log"));
    wait_until(Duration::from_secs(90), "replay acked", || {
        all_acked(&server, n as u64)
    });
    stop(runner);
    assert_eq!(sequences_once(&db, "events").len(), n, "no duplicate rows");
    assert_eq!(snapshot_counter(&snap, "db_duplicates_total"), n as u64);
    assert_eq!(
        snapshot_counter(&snap, "db_duplicate_ignored_total"),
        n as u64
    );
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), n as u64);
}

#[test]
fn connection_cut_mid_run_acks_nothing_then_every_row_lands_once() {
    let n = 200;
    let (server, dir) = setup(n, "orders.created");
    let db = TestDb::new("cut");
    let sink = db.sink(json!({}));
    db.create_tables(&sink);
    // Inserts wait on this lock inside their transactions; the test cuts their connections.
    let mut locker = db.conn();
    locker
        .simple("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), sink));
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));

    let snap = dir.path().join("metrics.json");
    let mut killed = 0;
    wait_until(
        Duration::from_secs(30),
        "sessions cut and batches failed",
        || {
            killed += db.kill_runner_sessions();
            killed >= 3 && snapshot_counter(&snap, "sink_write_errors_total") >= 1
        },
    );
    let (floor, _, _) = server.consumer_state(STREAM, CONSUMER);
    assert_eq!(
        floor, 0,
        "nothing acknowledged while the database connection is cut"
    );
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 0);
    let rows = locker.query("SELECT count(*) FROM events", &[]).unwrap();
    assert_eq!(rows.rows[0][0].as_deref(), Some("0"), "nothing committed");
    locker.simple("ROLLBACK").unwrap();

    wait_until(Duration::from_secs(60), "every message acked", || {
        all_acked(&server, n as u64)
    });
    assert_eq!(
        sequences_once(&db, "events"),
        (1..=n as u64).collect::<BTreeSet<u64>>()
    );
    stop(runner);
    assert!(runner_log_mentions(dir.path(), "57P01"));
}

fn runner_log_mentions(dir: &Path, what: &str) -> bool {
    std::fs::read_to_string(dir.join("svc.log"))
        .unwrap_or_default()
        .contains(what)
}

/// A TCP listener that accepts and never answers: a destination that hangs.
fn black_hole() -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::Builder::new()
        .name("black-hole".into())
        .spawn(move || {
            let mut held = Vec::new();
            for s in l.incoming().take(64) {
                held.push(s);
            }
        })
        .unwrap();
    (port, h)
}

#[test]
fn fanout_required_child_failure_blocks_ack_optional_timeout_does_not() {
    let n = 100;
    let (server, dir) = setup(n, "orders.created");
    let db = TestDb::new("fan");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // A regular file where the file child's key namespace directory must go: its writes fail.
    let blocker = out.join("idempotency-key");
    std::fs::write(&blocker, b"in the way").unwrap();
    let (hole, _h) = black_hole();
    let sink = json!({
        "type": "fanout",
        "sinks": {
            "db": db.sink(json!({"auto_create_tables": true})),
            "files": {"type": "file", "directory": out},
            "slow": {"type": "relational_db",
                     "dsn": format!("postgresql://postgres@127.0.0.1:{hole}/x"),
                     "tls_mode": "disable", "table": "events", "connect_timeout_seconds": 5}
        },
        "routing": {
            "enabled": true,
            "target_sink_types": {"db": "relational_db", "files": "file", "slow": "relational_db"},
            "routes": [{"name": "all", "match": {"subject": ">"},
                        "targets": ["db", "files",
                                    {"sink": "slow", "required": false,
                                     "minimum_wait_ms": 50, "timeout_ms": 300}]}]
        },
        "optional_max_in_flight": 2
    });
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), sink));
    let (code, stdout, _) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(stdout.contains("Active sink: fanout"), "{stdout}");

    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    let snap = dir.path().join("metrics.json");
    wait_until(Duration::from_secs(30), "required child failures", || {
        snapshot_counter(&snap, "fanout_required_child_failure_total") >= n as u64
            && snapshot_counter(&snap, "fanout_messages_ack_blocked_total") >= n as u64
    });
    let (floor, _, _) = server.consumer_state(STREAM, CONSUMER);
    assert_eq!(floor, 0, "no ACK while a required child fails");
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 0);
    assert_eq!(snapshot_counter(&snap, "fanout_messages_acked_total"), 0);

    std::fs::remove_file(&blocker).unwrap();
    wait_until(Duration::from_secs(60), "every message acked", || {
        all_acked(&server, n as u64)
    });
    assert_eq!(sequences_once(&db, "events").len(), n, "db rows once");
    assert_eq!(files_below(&out).len(), n, "one file per message");
    wait_until(Duration::from_secs(10), "snapshot caught up", || {
        snapshot_counter(&snap, "fanout_messages_acked_total") >= n as u64
    });
    stop(runner);
    // The db child stored messages during the failing period too: their redelivery was
    // ignored by key and counted.
    assert!(snapshot_counter(&snap, "db_duplicates_total") >= 1);
    assert!(
        snapshot_counter(&snap, "fanout_optional_child_timeout_total") >= 1,
        "the hanging optional child timed out without blocking ACK"
    );
    assert!(snapshot_counter(&snap, "fanout_required_child_success_total") >= 2 * n as u64);
    assert!(snapshot_counter(&snap, "fanout_messages_routed_total") >= n as u64);
}

#[test]
fn fanout_routes_select_children_by_subject() {
    let (server, dir) = setup(30, "orders.eu.created");
    server.publish_n(STREAM, "orders.us.created", 20, |i| {
        format!("{{\"us\":{i}}}").into_bytes()
    });
    let db = TestDb::new("froute");
    let out = dir.path().join("out");
    let sink = json!({
        "type": "fanout",
        "sinks": {
            "db": db.sink(json!({"auto_create_tables": true})),
            "files": {"type": "file", "directory": out}
        },
        "routing": {
            "enabled": true,
            "routes": [
                {"name": "eu", "match": {"subject": "orders.eu.>"}, "targets": ["db"]},
                {"name": "us", "match": {"subject": "orders.us.>"}, "targets": ["files"]}
            ]
        }
    });
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), sink));
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(60), "every message acked", || {
        all_acked(&server, 50)
    });
    stop(runner);
    assert_eq!(
        sequences_once(&db, "events"),
        (1..=30).collect::<BTreeSet<u64>>()
    );
    assert_eq!(files_below(&out).len(), 20);
    let snap = dir.path().join("metrics.json");
    assert_eq!(
        snapshot_counter(&snap, "fanout_child_sinks_selected_total"),
        50
    );
    assert_eq!(snapshot_counter(&snap, "fanout_messages_acked_total"), 50);
}

#[test]
fn validate_and_test_sink_cover_both_sinks() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new("cli");
    let nats = json!({"url": "nats://127.0.0.1:1", "stream": STREAM, "consumer": CONSUMER,
                      "subject": SUBJECT});

    // A password in the DSN: rejected, exit 2, the secret never printed.
    let bad = write_config(
        dir.path(),
        "bad.json",
        &json!({"nats": nats, "sink": {"type": "relational_db",
                "dsn": "postgresql://svc:hunter2@db.example/events", "table": "events",
                "tls_mode": "disable"}}),
    );
    let (code, out, err) = svc(&["validate", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains(
        "sink.dsn: must not contain a password; name an environment variable in password_env instead"
    ), "{err}");
    assert!(!out.contains("hunter2") && !err.contains("hunter2"));

    // test-sink contacts the real database: missing table first, then usable.
    let sink = db.sink(json!({}));
    let cfg = write_config(dir.path(), "c.json", &json!({"nats": nats, "sink": sink}));
    let (code, _, err) = svc(&["test-sink", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Sink relational_db is NOT usable"), "{err}");
    assert!(err.contains("missing table(s)"), "{err}");
    db.create_tables(&sink);
    let (code, out, err) = svc(&["test-sink", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("Sink relational_db is usable: postgresql "),
        "{out}"
    );
    assert_eq!(
        db.int("SELECT count(*) FROM events"),
        0,
        "probe rolled back"
    );

    // Fan-out: every child is checked; a failing one is named.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let fan = json!({"type": "fanout", "sinks": {
        "db": sink,
        "files": {"type": "file", "directory": dir.path().join("files")},
        "down": {"type": "relational_db", "dsn": format!("postgresql://svc@127.0.0.1:{dead}/x"),
                 "tls_mode": "disable", "table": "events", "connect_timeout_seconds": 2}
    }});
    let cfg = write_config(dir.path(), "f.json", &json!({"nats": nats, "sink": fan}));
    let (code, _, err) = svc(&["test-sink", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Sink fanout is NOT usable"), "{err}");
    assert!(err.contains("child down (relational_db)"), "{err}");
    assert!(
        !err.contains("child db ("),
        "healthy children are not reported as failing: {err}"
    );
}

#[test]
fn init_db_prints_or_creates_every_relational_table() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new("init");
    let nats = json!({"url": "nats://127.0.0.1:1", "stream": STREAM, "consumer": CONSUMER,
                      "subject": SUBJECT});
    let fan = json!({"type": "fanout", "sinks": {
        "main": db.sink(json!({"routes": [{"subject": "orders.eu.>", "table": "audit.eu_orders"}]})),
        "files": {"type": "file", "directory": dir.path().join("files")}
    }});
    let cfg = write_config(dir.path(), "f.json", &json!({"nats": nats, "sink": fan}));

    // --print: the DDL only; nothing is created.
    let (code, out, err) = svc(&["init-db", cfg.to_str().unwrap(), "--print"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("-- sink main\nCREATE SCHEMA IF NOT EXISTS \"audit\";\n"),
        "{out}"
    );
    assert!(
        out.contains("CREATE TABLE IF NOT EXISTS \"events\" ("),
        "{out}"
    );
    assert!(
        out.contains("CREATE TABLE IF NOT EXISTS \"audit\".\"eu_orders\" ("),
        "{out}"
    );
    assert_eq!(
        db.int("SELECT count(*) FROM pg_tables WHERE tablename IN ('events', 'eu_orders')"),
        0
    );

    // Without --print: created, twice without harm, then test-sink is satisfied.
    for _ in 0..2 {
        let (code, out, err) = svc(&["init-db", cfg.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            out,
            format!(
                "Sink main: tables ready in 127.0.0.1:5432/{}: events, audit.eu_orders\n",
                db.name
            )
        );
    }
    let (code, out, err) = svc(&["test-sink", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("Sink fanout is usable: 2 child sink(s) ready"),
        "{out}"
    );

    // A config without a relational sink.
    let file_only = write_config(
        dir.path(),
        "file.json",
        &json!({"nats": nats, "sink": {"type": "file", "directory": dir.path().join("x")}}),
    );
    let (code, _, err) = svc(&["init-db", file_only.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "svc: init-db: the configured sink (file) has no relational_db sink\n"
    );

    // An unreachable database: exit 1, the sink named.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let down = write_config(
        dir.path(),
        "down.json",
        &json!({"nats": nats, "sink": {"type": "relational_db",
                "dsn": format!("postgresql://svc@127.0.0.1:{dead}/x"), "tls_mode": "disable",
                "table": "events", "connect_timeout_seconds": 2}}),
    );
    let (code, _, err) = svc(&["init-db", down.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("Sink sink: tables NOT created: sink relational_db: connect to 127.0.0.1:"),
        "{err}"
    );
}

#[test]
fn rows_land_with_security_labels_in_both_columns() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    let profile = r#"{"profile":"svc.security-label.v1","releasability":["team-a","team-b"],
                      "owner":"ops","retention_category":"short"}"#;
    for i in 0..3 {
        server.publish_with_headers(
            "orders.eu.created",
            &[
                ("Svc-Security-Labels", profile),
                ("Svc-Classification", "restricted"),
                ("Svc-Labels", "pii,eu"),
                ("Svc-Priority", "high"),
            ],
            format!("{{\"order\":{i}}}").as_bytes(),
        );
    }
    // No header: the rule's profile applies.
    server.publish_with_headers("orders.us.created", &[], b"{\"order\":9}");
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new("labels");
    let mut cfg = config(
        &server,
        dir.path(),
        db.sink(json!({"auto_create_tables": true})),
    );
    cfg["message_metadata"] = json!({"default_classification": "unclassified"});
    cfg["security_labels"] = json!({
        "enabled": true,
        "rules": [{"subject": "orders.us.>", "profile": {"owner": "us-desk"}}]
    });
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "every message acked", || {
        all_acked(&server, 4)
    });
    stop(runner);

    let rows = db.rows(
        "SELECT classification, labels, labels_list, priority, security_labels_json, \
         metadata_json->'security_labels', security_labels_json = metadata_json->'security_labels' \
         FROM events ORDER BY stream_sequence",
    );
    assert_eq!(rows.len(), 4);
    let r = &rows[0];
    assert_eq!(r[0].as_deref(), Some("restricted"));
    assert_eq!(r[1].as_deref(), Some("eu;pii"), "normalized: sorted");
    assert_eq!(r[2].as_deref(), Some("{eu,pii}"));
    assert_eq!(r[3].as_deref(), Some("high"));
    let labels: serde_json::Value = serde_json::from_str(r[4].as_deref().unwrap()).unwrap();
    assert_eq!(labels["profile"], "svc.security-label.v1");
    assert_eq!(labels["releasability"], json!(["team-a", "team-b"]));
    assert_eq!(labels["owner"], "ops");
    assert_eq!(
        labels["classification"], "restricted",
        "filled from message metadata"
    );
    assert_eq!(labels["labels"], json!(["eu", "pii"]));
    let in_meta: serde_json::Value = serde_json::from_str(r[5].as_deref().unwrap()).unwrap();
    assert_eq!(
        in_meta, labels,
        "SECURITY_LABELS_JSON = METADATA_JSON.security_labels"
    );
    assert!(rows.iter().all(|r| r[6].as_deref() == Some("t")));
    let us: serde_json::Value = serde_json::from_str(rows[3][4].as_deref().unwrap()).unwrap();
    assert_eq!(us["owner"], "us-desk");
    assert_eq!(rows[3][0].as_deref(), Some("unclassified"));
}

/// `svc run` with extra environment (object-store credentials).
fn start_runner_env(
    config: &Path,
    log: &Path,
    env: &std::collections::HashMap<String, String>,
) -> Runner {
    Runner::start_env(config, log, env)
}

#[test]
fn fanout_with_moto_object_store_optional_hang_acks_required_hang_does_not() {
    let store = crate::support::moto::Moto::start();
    // Versioned, so a rewritten object would show as a second version ("every object once").
    store.create_bucket("fan-archive", true);
    let (server, dir) = setup(40, "orders.created");
    let db = TestDb::new("fanmoto");
    let archive = json!({
        "type": "object_store", "bucket": "fan-archive", "endpoint_url": store.endpoint(),
        "allow_http_for_local_testing": true, "credential_mode": "environment",
        "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
        "key_strategy": "stream_sequence", "request_timeout_seconds": 2
    });
    let fanout = |archive_target: serde_json::Value| {
        json!({
            "type": "fanout",
            "sinks": {"db": db.sink(json!({"auto_create_tables": true})), "archive": archive},
            "routing": {
                "enabled": true,
                "target_sink_types": {"db": "relational_db", "archive": "object_store"},
                "routes": [{"name": "all", "match": {"subject": "orders.>"},
                            "targets": ["db", archive_target]}]
            }
        })
    };
    let snap = dir.path().join("metrics.json");

    // Phase 1: the archive is optional (object-store defaults: 1000 ms wait, here a 1500 ms
    // timeout). Healthy store: everything lands in both.
    let optional = fanout(json!({"sink": "archive", "required": false, "timeout_ms": 1500}));
    let cfg = write_config(
        dir.path(),
        "opt.json",
        &config(&server, dir.path(), optional),
    );
    let runner = start_runner_env(&cfg, &dir.path().join("svc1.log"), &store.env());
    wait_until(Duration::from_secs(60), "first 40 acked", || {
        all_acked(&server, 40)
    });
    wait_until(Duration::from_secs(20), "40 objects", || {
        store.versions("fan-archive").len() == 40
    });

    // The store hangs (SIGSTOP): ACKs go on behind the database alone; timeouts are counted.
    store.pause();
    server.publish_n(STREAM, "orders.created", 40, |i| {
        format!("{{\"late\":{i}}}").into_bytes()
    });
    wait_until(
        Duration::from_secs(60),
        "acked while the optional store hangs",
        || all_acked(&server, 80),
    );
    wait_until(Duration::from_secs(20), "timeouts counted", || {
        snapshot_counter(&snap, "fanout_optional_child_timeout_total") >= 1
    });
    assert_eq!(sequences_once(&db, "events").len(), 80);
    stop(runner);
    store.resume();

    // Phase 2: the archive is required. The store hangs again: nothing is acknowledged, even
    // though the database has the rows; when it is back, every message lands once.
    let required = fanout(json!("archive"));
    let cfg = write_config(
        dir.path(),
        "req.json",
        &config(&server, dir.path(), required),
    );
    std::fs::remove_file(&snap).unwrap();
    store.pause();
    server.publish_n(STREAM, "orders.created", 20, |i| {
        format!("{{\"req\":{i}}}").into_bytes()
    });
    let runner = start_runner_env(&cfg, &dir.path().join("svc2.log"), &store.env());
    wait_until(Duration::from_secs(60), "required child failures", || {
        snapshot_counter(&snap, "fanout_required_child_failure_total") >= 20
    });
    let (floor, _, _) = server.consumer_state(STREAM, CONSUMER);
    assert_eq!(
        floor, 80,
        "nothing acknowledged while the required store hangs"
    );
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 0);
    store.resume();
    wait_until(
        Duration::from_secs(90),
        "acked after the store is back",
        || all_acked(&server, 100),
    );
    stop(runner);
    assert_eq!(sequences_once(&db, "events").len(), 100, "db rows once");
    let versions = store.versions("fan-archive");
    let incarnation = server.incarnation(STREAM);
    for seq in 81..=100 {
        let key = format!("stream-sequence/{STREAM}/{incarnation}/{seq}.json");
        assert_eq!(versions.get(&key), Some(&1), "{key}");
    }
    assert!(
        snapshot_counter(&snap, "db_duplicates_total") >= 1,
        "redelivered rows counted"
    );
}

/// A row the database refuses for good (a CHECK constraint: SQLSTATE 23514) is a permanent
/// sink failure: with a DLQ it is dead-lettered with the class `value_rejected` and never the
/// value or the database's message (which quotes the row), then acknowledged; the other rows
/// of its batch land and are acknowledged as usual.
#[test]
fn rows_the_database_refuses_are_dead_lettered_then_acked() {
    let (server, dir) = setup(20, "orders.us.created");
    server.publish_n(STREAM, "orders.eu.refused", 3, |i| {
        format!("{{\"refused\":{i},\"mark\":\"ROW-MARK-91\"}}").into_bytes()
    });
    server.create_stream("DLQ", &["svc.dlq.rows"]);
    let db = TestDb::new("refused");
    let sink = db.sink(json!({}));
    db.create_tables(&sink);
    db.conn()
        .simple(
            "ALTER TABLE events ADD CONSTRAINT no_refused CHECK (subject <> 'orders.eu.refused')",
        )
        .unwrap();
    let mut cfg = config(&server, dir.path(), sink);
    cfg["dead_letter"] = json!({"enabled": true, "subject": "svc.dlq.rows",
                                "expected_stream": "DLQ", "publish_timeout_ms": 2000});
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(60), "all 23 settled", || {
        all_acked(&server, 23)
    });
    stop(runner);
    assert_eq!(sequences_once(&db, "events").len(), 20);
    assert_eq!(server.stream_messages("DLQ"), 3);
    let js = server.js();
    for seq in 1..=3 {
        let m = js.get_message("DLQ", seq).unwrap();
        let text = String::from_utf8(m.data.clone()).unwrap();
        assert!(
            !text.contains("ROW-MARK-91") && !text.contains("no_refused"),
            "a value or the database's message reached the DLQ: {text}"
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["failure"]["stage"], "sink");
        assert_eq!(v["failure"]["field"], "sink.relational_db");
        assert_eq!(v["failure"]["reason"], "value_rejected");
        assert_eq!(v["original"]["subject"], "orders.eu.refused");
    }
    let snap = dir.path().join("metrics.json");
    assert_eq!(snapshot_counter(&snap, "sink_permanent_failures_total"), 3);
    assert_eq!(snapshot_counter(&snap, "messages_dlq_total"), 3);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 23);
}

/// Payloads a publisher chooses to break the table for every reader: `[1e131071, ...]` (2.5 KB
/// in `jsonb`, an out-of-memory error for `SELECT *` afterwards), duplicate keys (PostgreSQL
/// would keep the last, a file both) and text holding U+0000 (refused by PostgreSQL, so NAKed
/// forever). Each is stored as what it is (text or bytes), the message behind them too, and
/// the table reads back whole.
#[test]
fn payloads_every_reader_can_read_back_are_stored_as_text() {
    let (server, dir) = setup(0, "orders.us.created");
    let bomb = format!("[{}]", vec!["1e131071"; 9_000].join(","));
    let payloads: [&[u8]; 4] = [
        bomb.as_bytes(),
        br#"{"amount":1,"amount":2}"#,
        b"ab\x00cd",
        br#"{"order":1}"#,
    ];
    for p in payloads {
        server.publish_with_headers("orders.us.created", &[], p);
    }
    let db = TestDb::new("readable");
    let sink = db.sink(json!({"auto_create_tables": true}));
    let cfg = write_config(dir.path(), "c.json", &config(&server, dir.path(), sink));
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(60), "all 4 acked", || {
        all_acked(&server, 4)
    });
    stop(runner);
    // The whole table, every column, reads back.
    let all = db.rows("SELECT * FROM events ORDER BY stream_sequence");
    assert_eq!(all.len(), 4);
    let rows = db.rows(
        "SELECT payload_original_format, payload_wrapped, payload::text, \
         length(payload::text) FROM events ORDER BY stream_sequence",
    );
    let col = |r: usize, c: usize| rows[r][c].as_deref().unwrap().to_string();
    assert_eq!(col(0, 0), "text");
    assert!(
        col(0, 2).starts_with(r#"{"text": "[1e131071,1e131071"#),
        "{}",
        &col(0, 2)[..40]
    );
    assert!(col(0, 3).parse::<usize>().unwrap() < 2 * bomb.len());
    assert_eq!(col(1, 0), "text");
    assert_eq!(col(1, 2), r#"{"text": "{\"amount\":1,\"amount\":2}"}"#);
    assert_eq!(
        (col(2, 0), col(2, 2)),
        ("bytes".into(), r#"{"base64": "YWIAY2Q="}"#.into())
    );
    assert_eq!((col(3, 0), col(3, 1)), ("json".into(), "f".into()));
    assert_eq!(col(3, 2), r#"{"order": 1}"#);
}
