//! Fan-out routing on what the message is (issue 45): a real `nats-server -js`, the `svc`
//! binary, PostgreSQL on 127.0.0.1:5432, an object store (moto) and a file sink. Each message
//! must land in exactly the children its route plans, once.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::moto::Moto;
use crate::support::postgres::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";

/// Publishes the five kinds of message both tests route, in this order (stream sequences):
/// 1-2 restricted + eu + high, 3 high public, 4 `Tenant: acme`, 5 restricted without labels,
/// 6 plain.
fn publish(server: &NatsServer) {
    let eu = [
        ("Svc-Classification", "restricted"),
        ("Svc-Labels", "eu,pii"),
        ("Svc-Priority", "high"),
    ];
    server.publish_with_headers("orders.a", &eu, b"{\"n\":1}");
    server.publish_with_headers("orders.b", &eu, b"{\"n\":2}");
    server.publish_with_headers("orders.c", &[("Svc-Priority", "high")], b"{\"n\":3}");
    server.publish_with_headers("orders.d", &[("Tenant", "acme")], b"{\"n\":4}");
    let restricted = [("Svc-Classification", "restricted")];
    server.publish_with_headers("orders.e", &restricted, b"{\"n\":5}");
    server.publish_with_headers("orders.f", &[], b"{\"n\":6}");
}

struct Setup {
    server: NatsServer,
    store: Moto,
    db: TestDb,
    dir: tempfile::TempDir,
}

fn setup(db: &str) -> Setup {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    publish(&server);
    let store = Moto::start();
    store.create_bucket("eu-bucket", true);
    Setup {
        server,
        store,
        db: TestDb::new(db),
        dir: tempfile::tempdir().unwrap(),
    }
}

impl Setup {
    fn config(&self, routing: Value) -> std::path::PathBuf {
        let sink = json!({
            "type": "fanout",
            "sinks": {
                "db": self.db.sink(json!({"auto_create_tables": true})),
                "files": {"type": "file", "directory": self.dir.path().join("out")},
                "eu_bucket": {
                    "type": "object_store", "bucket": "eu-bucket",
                    "endpoint_url": self.store.endpoint(), "allow_http_for_local_testing": true,
                    "credential_mode": "environment", "access_key_id_env": "T_KEY_ID",
                    "secret_access_key_env": "T_SECRET", "key_strategy": "stream_sequence"
                }
            },
            "routing": routing
        });
        let cfg = json!({
            "nats": {"url": self.server.url(), "stream": STREAM, "consumer": CONSUMER,
                     "subject": "orders.>"},
            "delivery": {"batch_size": 8, "fetch_expiry_ms": 200, "sink_workers": 1,
                         "shutdown_timeout_seconds": 10},
            "envelope": {"keep_headers": ["Tenant"]},
            "sink": sink,
            "metrics": {"enabled": true, "snapshot_file": self.snap(),
                        "write_interval_seconds": 1},
            "logging": {"level": "info"}
        });
        write_config(self.dir.path(), "c.json", &cfg)
    }

    fn snap(&self) -> std::path::PathBuf {
        self.dir.path().join("metrics.json")
    }

    /// Runs until all six messages are acknowledged, then stops cleanly.
    fn run(&self, cfg: &Path) {
        let mut runner =
            Runner::start_env(cfg, &self.dir.path().join("svc.log"), &self.store.env());
        wait_until(Duration::from_secs(60), "all six acked", || {
            self.server.try_consumer_state(STREAM, CONSUMER) == Some((6, 0, 0))
        });
        runner.signal("TERM");
        let status = runner.wait_timeout(Duration::from_secs(20)).expect("exits");
        assert!(status.success(), "clean exit: {}", runner.log_text());
    }

    fn db_sequences(&self) -> BTreeSet<u64> {
        let rows = self.db.rows("SELECT stream_sequence FROM events");
        let seqs: Vec<u64> = rows
            .iter()
            .map(|r| r[0].as_deref().unwrap().parse().unwrap())
            .collect();
        let set: BTreeSet<u64> = seqs.iter().copied().collect();
        assert_eq!(
            set.len(),
            seqs.len(),
            "a message stored twice in the database"
        );
        set
    }

    fn bucket_objects(&self) -> usize {
        let v = self.store.versions("eu-bucket");
        assert!(
            v.values().all(|&n| n == 1),
            "an object written twice: {v:?}"
        );
        v.len()
    }

    fn files(&self) -> usize {
        files_below(&self.dir.path().join("out")).len()
    }
}

#[test]
fn mode_first_routes_by_classification_labels_priority_headers_and_default_route() {
    let s = setup("froute1");
    let cfg = s.config(json!({
        "enabled": true,
        "no_match": "default_route",
        "default_route": "rest",
        "routes": [
            {"name": "eu-restricted",
             "match": {"classification": ["restricted"], "labels_all": ["eu"]},
             "targets": ["eu_bucket", "db"]},
            {"name": "urgent", "match": {"priority": ["high"]}, "targets": ["db"]},
            {"name": "acme", "match": {"headers": {"Tenant": "acme"}, "labels_none": ["eu"]},
             "targets": ["files"]},
            {"name": "rest", "match": {"subject": "never.>"}, "targets": ["files"]}
        ]
    }));
    // `svc inspect` names the route each message would take, before anything runs.
    let routes = inspect_routes(&cfg, 6);
    assert_eq!(
        routes,
        [
            "\"route eu-restricted\"",
            "\"route eu-restricted\"",
            "\"route urgent\"",
            "\"route acme\"",
            "\"default route rest (no route matched)\"",
            "\"default route rest (no route matched)\"",
        ]
    );
    s.run(&cfg);
    // 1-2 eu-restricted (first wins over urgent), 3 urgent; 4 acme, 5 and 6 default route.
    assert_eq!(s.db_sequences(), BTreeSet::from([1, 2, 3]));
    assert_eq!(s.bucket_objects(), 2);
    assert_eq!(s.files(), 3);
    assert_eq!(
        snapshot_counter(&s.snap(), "fanout_messages_routed_total"),
        6
    );
}

#[test]
fn mode_all_writes_each_child_once_and_ignore_acks_the_rest_unstored() {
    let s = setup("froute2");
    let cfg = s.config(json!({
        "enabled": true,
        "mode": "all",
        "no_match": "ignore",
        "allow_ignore": true,
        "routes": [
            {"name": "eu", "match": {"labels_any": ["eu"]}, "targets": ["eu_bucket", "db"]},
            {"name": "restricted", "match": {"classification": ["restricted"]},
             "targets": ["db", {"sink": "files", "required": false}]},
            {"name": "acme", "match": {"headers": {"Tenant": "acme"}}, "targets": ["files"]}
        ]
    }));
    s.run(&cfg);
    // 1-2 eu + restricted: bucket, db once, files; 5 restricted: db, files; 4 acme: files;
    // 3 and 6 match nothing: acknowledged, stored nowhere.
    assert_eq!(s.db_sequences(), BTreeSet::from([1, 2, 5]));
    assert_eq!(s.bucket_objects(), 2);
    wait_until(Duration::from_secs(10), "optional file writes", || {
        s.files() == 4
    });
    assert_eq!(s.files(), 4);
    let snap = s.snap();
    assert_eq!(snapshot_counter(&snap, "fanout_messages_ignored_total"), 2);
    let log = std::fs::read_to_string(s.dir.path().join("svc.log")).unwrap();
    assert!(
        log.contains("routing.no_match is ignore"),
        "no start warning: {log}"
    );
    assert_eq!(snapshot_counter(&snap, "fanout_messages_routed_total"), 4);
    assert_eq!(
        snapshot_counter(&snap, "fanout_child_sinks_selected_total"),
        2 * 3 + 2 + 1
    );
}

#[test]
fn validate_names_field_and_reason_and_warns_on_overlap() {
    let s = setup("froute3");
    let bad = s.config(json!({
        "enabled": true,
        "no_match": "ignore",
        "routes": [
            {"name": "a", "match": {"labels_all": ["eu"], "labels_none": ["eu"]},
             "targets": ["db"]},
            {"name": "b", "match": {"headers": {"Region": "eu"}}, "targets": ["db"]},
            {"name": "c", "match": {"priority": []}, "targets": ["db"]}
        ]
    }));
    let (code, stdout, stderr) = svc(&["validate", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    let err = stderr + &stdout;
    for want in [
        "sink.routing.no_match",
        "allow_ignore",
        "sink.routing.routes[0].match.labels_none: eu is also in labels_all",
        "sink.routing.routes[1].match.headers.Region: is not in envelope.keep_headers",
        "sink.routing.routes[2].match.priority: is an empty list",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    let good = s.config(json!({
        "enabled": true,
        "routes": [
            {"name": "restricted", "match": {"classification": ["restricted"]},
             "targets": ["db"]},
            {"name": "orders", "match": {"subject": "orders.>"}, "targets": ["files"]}
        ]
    }));
    let (code, text, stderr) = svc(&["validate", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}{stderr}");
    assert!(
        text.contains("Warning: fan-out routes restricted and orders overlap"),
        "{text}"
    );
}

/// Routes read the marking the record's columns hold (the metadata), never a label profile's
/// own fields, and a header sent twice by its first value on the wire, the same on every
/// delivery. Three file children, a real broker.
#[test]
fn routes_read_the_metadata_marking_and_a_repeated_header_first_value() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let profile = r#"{"classification":"RESTRICTED","labels":["EU"]}"#;
    // 1: restricted + eu only in the profile: not the message's marking.
    server.publish_with_headers("orders.a", &[("Svc-Security-Labels", profile)], b"{}");
    // 2: restricted + eu in the metadata; the profile saying otherwise does not reroute it.
    let plain = r#"{"classification":"unclassified","labels":[]}"#;
    let meta = [
        ("Svc-Classification", "restricted"),
        ("Svc-Labels", "eu"),
        ("Svc-Security-Labels", plain),
    ];
    server.publish_with_headers("orders.b", &meta, b"{}");
    // 3-10: Tenant sent twice; the first value routes.
    for _ in 0..8 {
        server.raw_publish(
            b"orders.t",
            &[(b"Tenant", b"acme"), (b"Tenant", b"other")],
            b"{}",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = |n: &str| dir.path().join(n);
    let cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER,
                 "subject": "orders.>"},
        "delivery": {"batch_size": 8, "fetch_expiry_ms": 200, "sink_workers": 1},
        "envelope": {"keep_headers": ["Tenant"]},
        "security_labels": {"enabled": true,
                            "allowed_classifications": ["UNCLASSIFIED", "RESTRICTED"]},
        "sink": {"type": "fanout",
                 "sinks": {"eu": {"type": "file", "directory": out("eu")},
                           "acme": {"type": "file", "directory": out("acme")},
                           "rest": {"type": "file", "directory": out("rest")}},
                 "routing": {"enabled": true, "no_match": "default_route",
                             "default_route": "rest", "routes": [
            {"name": "eu-restricted",
             "match": {"classification": ["restricted"], "labels_all": ["eu"]},
             "targets": ["eu"]},
            {"name": "acme", "match": {"headers": {"Tenant": "acme"}}, "targets": ["acme"]},
            {"name": "rest", "match": {"subject": "never.>"}, "targets": ["rest"]}]}},
        "logging": {"level": "info"}
    });
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let routes = inspect_routes(&cfg, 10);
    let mut want = vec![
        "\"default route rest (no route matched)\"".to_string(),
        "\"route eu-restricted\"".to_string(),
    ];
    want.extend(std::iter::repeat_n("\"route acme\"".to_string(), 8));
    assert_eq!(routes, want);
    let mut runner = Runner::start(&cfg, &out("svc.log"));
    wait_until(Duration::from_secs(60), "all ten acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((10, 0, 0))
    });
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20)).expect("exits");
    assert!(status.success(), "clean exit: {}", runner.log_text());
    let count = |n: &str| files_below(&out(n)).len();
    assert_eq!((count("eu"), count("rest"), count("acme")), (1, 1, 8));
}

/// The `fanout_route` `svc inspect` shows for each of the last `n` messages, as JSON text.
fn inspect_routes(cfg: &Path, n: usize) -> Vec<String> {
    let (code, out, err) = svc(&[
        "inspect",
        cfg.to_str().unwrap(),
        "--last",
        &n.to_string(),
        "--format",
        "jsonl",
    ]);
    assert_eq!(code, 0, "{err}");
    out.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["fanout_route"].to_string())
        .collect()
}

fn records(dir: &Path) -> Vec<Value> {
    files_below(dir)
        .iter()
        .flat_map(|p| {
            std::fs::read_to_string(dir.join(p))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `message_metadata.trust_headers: false` says publishers must not choose their own marking,
/// and a metadata rule marks `orders.hr.>` restricted + pii. A publisher's `Svc-Security-Labels`
/// profile (read whatever `trust_headers` says) saying unclassified, or null, must not route the
/// message to the child for unclassified data: routes read the marking the pre-sink policy
/// checks and the record's columns hold (found by the attack on 34b8c36, which routed on the
/// profile).
#[test]
fn a_publisher_profile_cannot_reroute_an_operator_marking() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    // 1: no header: the operator's rule routes it to `secure` (control).
    server.publish_with_headers("orders.hr.a", &[], b"{}");
    // 2: the metadata header is ignored (trust_headers false): still `secure` (control).
    server.publish_with_headers(
        "orders.hr.b",
        &[("Svc-Classification", "unclassified"), ("Svc-Labels", "")],
        b"{}",
    );
    // 3: the profile says unclassified and no labels.
    let down = r#"{"classification":"unclassified","labels":[]}"#;
    server.publish_with_headers("orders.hr.c", &[("Svc-Security-Labels", down)], b"{}");
    // 4: the profile says "no classification" (null) and no labels.
    let null = r#"{"classification":null,"labels":[]}"#;
    server.publish_with_headers("orders.hr.d", &[("Svc-Security-Labels", null)], b"{}");
    let dir = tempfile::tempdir().unwrap();
    let out = |n: &str| dir.path().join(n);
    let cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER,
                 "subject": "orders.>"},
        "delivery": {"batch_size": 8, "fetch_expiry_ms": 200, "sink_workers": 1},
        "message_metadata": {"trust_headers": false, "rules": [
            {"subject": "orders.hr.>", "classification": "restricted", "labels": ["pii"]}]},
        "security_labels": {"enabled": true},
        "pre_sink_policy": {"enabled": true, "rules": [
            {"subject": "orders.hr.>", "require_classification": ["restricted"],
             "required_labels": ["pii"]}]},
        "sink": {"type": "fanout",
                 "sinks": {"secure": {"type": "file", "directory": out("secure")},
                           "general": {"type": "file", "directory": out("general")}},
                 "routing": {"enabled": true, "no_match": "reject", "routes": [
            {"name": "restricted", "match": {"classification": ["restricted"]},
             "targets": ["secure"]},
            {"name": "general", "match": {"labels_none": ["pii"]}, "targets": ["general"]}]}},
        "logging": {"level": "info"}
    });
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let routes = inspect_routes(&cfg, 4);
    let mut runner = Runner::start(&cfg, &out("svc.log"));
    wait_until(Duration::from_secs(60), "all four acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((4, 0, 0))
    });
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20)).expect("exits");
    assert!(status.success(), "clean exit: {}", runner.log_text());
    let general = records(&out("general"));
    assert_eq!(
        (records(&out("secure")).len(), general.len()),
        (4, 0),
        "an operator-marked restricted/pii message was routed by the publisher's profile"
    );
    assert_eq!(routes, vec!["\"route restricted\"".to_string(); 4]);
}

/// `svc inspect` does not route a message the runner dead-letters at the authenticity stage
/// (which runs before metadata and labels): it shows `rejected before routing (authenticity)`.
#[test]
fn inspect_does_not_route_a_message_the_runner_refuses_for_its_signature() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.publish_with_headers("orders.a", &[], b"{}");
    let dir = tempfile::tempdir().unwrap();
    let out = |n: &str| dir.path().join(n);
    let cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER,
                 "subject": "orders.>"},
        "delivery": {"batch_size": 8, "fetch_expiry_ms": 200, "sink_workers": 1},
        "authenticity": {"enabled": true, "default_required": true,
                         "keys": [{"key_id": "k1", "secret_env": "T_SIG_KEY"}]},
        "sink": {"type": "fanout",
                 "sinks": {"a": {"type": "file", "directory": out("a")}},
                 "routing": {"enabled": true, "routes": [
            {"name": "all", "match": {"subject": ">"}, "targets": ["a"]}]}},
        "logging": {"level": "info"}
    });
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    let (code, text, err) = svc_with_env(
        &[
            "inspect",
            cfg.to_str().unwrap(),
            "--last",
            "1",
            "--format",
            "jsonl",
        ],
        &[("T_SIG_KEY", key)],
    );
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(
        v["authenticity"].as_str().unwrap().starts_with("rejected"),
        "{text}"
    );
    assert_eq!(
        v["fanout"],
        json!("rejected before routing (authenticity)"),
        "inspect routes a message the runner refuses: {text}"
    );
}

/// A route may not match on a header whose name `svc inspect` and `show-effective-config` treat
/// as secret (`X-Auth-Key`, `Ocp-Apim-Subscription-Key`, `X-Hub-Signature`, `Session-Id`):
/// validate refuses it, so `show-effective-config` (which validates first) never prints the
/// route's values.
#[test]
fn a_route_on_a_key_bearing_header_is_refused_or_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = [
        ("X-Auth-Key", "k-9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
        (
            "Ocp-Apim-Subscription-Key",
            "0123456789abcdef0123456789abcdef",
        ),
        ("X-Hub-Signature", "sha256=abcdef0123456789"),
        ("Session-Id", "sess-abcdef123456"),
    ];
    let headers: serde_json::Map<String, Value> = secrets
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let cfg = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                 "subject": "orders.>"},
        "envelope": {"keep_headers": secrets.iter().map(|(k, _)| *k).collect::<Vec<_>>()},
        "sink": {"type": "fanout",
                 "sinks": {"a": {"type": "file", "directory": dir.path().join("a")},
                           "b": {"type": "file", "directory": dir.path().join("b")}},
                 "routing": {"enabled": true, "routes": [
            {"name": "partner", "match": {"headers": headers}, "targets": ["a"]},
            {"name": "rest", "match": {"subject": ">"}, "targets": ["b"]}]}}
    });
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let (code, _, _) = svc(&["validate", cfg.to_str().unwrap()]);
    let (_, shown, _) = svc(&["show-effective-config", cfg.to_str().unwrap()]);
    let leaked: Vec<&str> = secrets
        .iter()
        .filter(|(_, v)| shown.contains(v))
        .map(|(k, _)| *k)
        .collect();
    assert_ne!(code, 0, "validate accepts routes on secret-looking headers");
    assert!(
        leaked.is_empty(),
        "show-effective-config prints the route values of {leaked:?}"
    );
}

/// The client trims every header value (spaces, tabs, NBSP and the other Unicode white space),
/// so a route value with white space at an end could never match: validate refuses it, naming
/// the header. Inspect shows a message sent as `Tenant:  acme ` taken by the route `acme`.
#[test]
fn a_route_header_value_no_message_can_carry_is_refused() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.raw_publish(b"orders.a", &[(b"Tenant", b"  acme ")], b"{}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = |value: &str| {
        let cfg = json!({
            "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER,
                     "subject": "orders.>"},
            "envelope": {"keep_headers": ["Tenant"]},
            "sink": {"type": "fanout",
                     "sinks": {"a": {"type": "file", "directory": dir.path().join("a")},
                               "b": {"type": "file", "directory": dir.path().join("b")}},
                     "routing": {"enabled": true, "routes": [
                {"name": "acme", "match": {"headers": {"Tenant": value}}, "targets": ["a"]},
                {"name": "rest", "match": {"subject": ">"}, "targets": ["b"]}]}}
        });
        write_config(dir.path(), "c.json", &cfg)
    };
    let (code, out, err) = svc(&["validate", cfg(" acme ").to_str().unwrap()]);
    assert_eq!(
        code, 2,
        "validate accepts a route value no message can carry"
    );
    assert!(
        (out + &err).contains("sink.routing.routes[0].match.headers.Tenant: has white space"),
        "no field named"
    );
    let (code, text, err) = svc(&[
        "inspect",
        cfg("acme").to_str().unwrap(),
        "--last",
        "1",
        "--format",
        "jsonl",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(v["fanout_route"], json!("route acme"), "{text}");
}
