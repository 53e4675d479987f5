//! Payload protection into the other sinks, end to end: the object store (moto, signature
//! checks on), the relational sink (the local PostgreSQL) and a fan-out to both. Every stored
//! record is decrypted by Python from the documented format, its custody verified by
//! `svc verify-custody`, and a tampered copy reported; a bad signature is dead-lettered.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::postgres::TestDb;
use crate::support::protection::*;
use crate::support::*;
use serde_json::{json, Value};

/// What one run stored, by stream sequence.
type Stored = BTreeMap<u64, Value>;

/// Publishes two signed encrypted messages, one clear public message and one with a bad
/// signature; runs `svc` into `sink`; checks the DLQ; returns what `fetch` finds stored
/// after checking every record with Python, `svc decrypt` and `svc verify-custody`.
fn run_case(
    tag: &str,
    sink: impl FnOnce(&Path) -> Value,
    env: &HashMap<String, String>,
    fetch: &dyn Fn() -> Vec<Stored>,
) -> Vec<Stored> {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_private(dir.path(), "k1.key", &AES_K1);
    let ed_pub = ed_public_key();
    let sink = sink(dir.path());
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(
            &server,
            dir.path(),
            sink,
            protection_blocks(&[("k1", &k1)], "k1", &ed_pub),
        ),
    );
    let c = cfg.to_str().unwrap();
    let bad_sig = py_sign(
        "ed25519",
        &ED_SEED,
        Some("m4"),
        b"{\"other\":1}",
        "orders.pii.d",
    );
    let mut msgs = vec![
        signed(
            "orders.pii.a",
            b"{\"card\": \"PLAINTEXT-1\", \"n\": 1e2}",
            "m1",
            "ed25519",
            "ed1",
        ),
        signed("orders.pii.b", b"PLAINTEXT-2", "m2", "hmac-sha256", "h1"),
        Msg {
            subject: "orders.public.c",
            payload: b"{\"public\":3}".to_vec(),
            headers: vec![],
        },
        signed("orders.pii.d", b"{\"PLAINTEXT\":4}", "m4", "ed25519", "ed1"),
    ];
    msgs[3].headers[3].1 = bad_sig;
    publish(&server, &msgs);
    let raw: BTreeMap<u64, Vec<u8>> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| (i as u64 + 1, m.payload.clone()))
        .collect();

    let mut runner = start_runner_env(&cfg, &dir.path().join("svc.log"), env);
    wait_until(Duration::from_secs(90), "every message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((4, 0, 0))
    });
    runner.signal("TERM");
    assert!(
        runner.wait_timeout(Duration::from_secs(30)).is_some(),
        "{tag}"
    );

    let dlq = dlq_records(&server);
    assert_eq!(dlq.len(), 1, "{tag}");
    assert_eq!(dlq[0].1["failure"]["reason"], "bad_signature", "{tag}");
    assert_eq!(dlq[0].1["original"]["stream_sequence"], 4, "{tag}");

    let all = fetch();
    for stored in &all {
        assert_eq!(
            stored.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3],
            "{tag}"
        );
        for v in stored.values() {
            assert!(!v.to_string().contains("PLAINTEXT"), "{tag}: {v}");
        }
        assert_eq!(stored[&3]["payload"], json!({"public": 3}), "{tag}");
        let enc: Vec<&Value> = [1, 2].iter().map(|s| &stored[s]).collect();
        let opened = python_open(&enc, &[("k1", &AES_K1)], &raw);
        assert_eq!(opened[&1].1, r#"{"card":"PLAINTEXT-1","n":1e2}"#, "{tag}");
        assert_eq!(opened[&2].1, r#"{"text":"PLAINTEXT-2"}"#, "{tag}");

        // The records as files: svc decrypt and svc verify-custody, then a tampered copy.
        let recs = dir.path().join(format!("recs-{}", stored.len()));
        let files = write_record_files(&recs, stored);
        let (code, stdout, err) = svc_env(&["decrypt", c, &files[1]], None);
        assert_eq!(
            (code, stdout.as_str()),
            (0, "{\"text\":\"PLAINTEXT-2\"}\n"),
            "{tag}: {err}"
        );
        let mut args = vec!["verify-custody", c];
        args.extend(files.iter().map(String::as_str));
        let (code, stdout, err) = svc_env(&args, None);
        assert_eq!(code, 0, "{tag}: {stdout}{err}");
        assert!(
            stdout.ends_with("3 intact, 0 altered, 0 unverifiable\n"),
            "{tag}: {stdout}"
        );
        let mut t = stored[&1].clone();
        t["classification"] = json!("downgraded");
        std::fs::write(&files[0], t.to_string()).unwrap();
        let (code, stdout, _) = svc_env(&args, None);
        assert_eq!(code, 1, "{tag}: {stdout}");
        assert!(
            stdout.contains("1.json (stream ORDERS sequence 1): ALTERED"),
            "{tag}: {stdout}"
        );
        assert!(
            stdout.ends_with("2 intact, 1 altered, 0 unverifiable\n"),
            "{tag}: {stdout}"
        );
    }
    let snap = dir.path().join("metrics.json");
    assert_eq!(
        snapshot_counter(&snap, "payload_encrypted_total"),
        2,
        "{tag}"
    );
    assert_eq!(snapshot_counter(&snap, "custody_sealed_total"), 3, "{tag}");
    assert_eq!(
        snapshot_counter(&snap, "authenticity_bad_signature_total"),
        1,
        "{tag}"
    );
    all
}

/// Object-store primary objects (not sidecars) by stream sequence, and the sidecars.
fn s3_records(m: &crate::support::moto::Moto, bucket: &str) -> (Stored, Stored) {
    let ans = py(
        &json!({"op": "s3_objects", "endpoint": m.endpoint(), "key_id": m.key_id,
                         "secret": m.secret, "bucket": bucket}),
    );
    let (mut objects, mut sidecars) = (Stored::new(), Stored::new());
    for o in ans["objects"].as_array().unwrap() {
        let v: Value = serde_json::from_str(o["body"].as_str().unwrap()).unwrap();
        let seq = v["stream_sequence"].as_u64().unwrap();
        if o["key"].as_str().unwrap().ends_with(".metadata.json") {
            sidecars.insert(seq, v);
        } else {
            objects.insert(seq, v);
        }
    }
    (objects, sidecars)
}

fn s3_sink(m: &crate::support::moto::Moto, bucket: &str) -> Value {
    json!({
        "type": "object_store", "bucket": bucket, "endpoint_url": m.endpoint(),
        "allow_http_for_local_testing": true, "credential_mode": "environment",
        "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
        "key_strategy": "stream_sequence", "metadata_mode": "sidecar",
    })
}

#[test]
fn object_store_objects_and_sidecars_are_protected() {
    let m = crate::support::moto::Moto::start();
    m.create_bucket("prot", false);
    let stored = run_case("object_store", |_| s3_sink(&m, "prot"), &m.env(), &|| {
        vec![s3_records(&m, "prot").0]
    });
    let (objects, sidecars) = s3_records(&m, "prot");
    assert_eq!(objects, stored[0]);
    // The sidecar holds the keyed digest, never the payload, and no plain SHA-256 of it.
    for seq in [1, 2] {
        let side = &sidecars[&seq];
        assert!(!side.to_string().contains("PLAINTEXT"));
        assert_eq!(
            side["payload_info"]["sha256"],
            objects[&seq]["payload_info"]["sha256"]
        );
        assert_eq!(objects[&seq]["custody"]["schema"], "svc.custody.v1");
    }
}

/// The relational sink block of `db`, creating its table at start.
fn db_sink(db: &TestDb) -> Value {
    db.sink(json!({"auto_create_tables": true}))
}

#[test]
fn relational_rows_are_protected() {
    let db = TestDb::new("rel");
    let stored = run_case("relational", |_| db_sink(&db), &HashMap::new(), &|| {
        vec![db.events_by_sequence()]
    });
    for seq in [1, 2, 3] {
        assert_eq!(stored[0][&seq]["custody_json"]["schema"], "svc.custody.v1");
    }
}

#[test]
fn fanout_children_store_the_same_protected_envelope() {
    let m = crate::support::moto::Moto::start();
    m.create_bucket("fan", false);
    let db = TestDb::new("fan");
    let sink = json!({
        "type": "fanout",
        "sinks": {"db": db_sink(&db), "store": s3_sink(&m, "fan")},
        "routing": {"enabled": true,
                    "target_sink_types": {"db": "relational_db", "store": "object_store"},
                    "routes": [{"name": "all", "match": {"subject": ">"}, "targets": ["db", "store"]}]}
    });
    let stored = run_case("fanout", |_| sink, &m.env(), &|| {
        vec![db.events_by_sequence(), s3_records(&m, "fan").0]
    });
    // Encrypted and sealed once, before the fan-out: both children hold the same bytes.
    for seq in [1, 2, 3] {
        assert_eq!(stored[0][&seq]["payload"], stored[1][&seq]["payload"]);
        assert_eq!(stored[0][&seq]["custody_json"], stored[1][&seq]["custody"]);
    }
}
