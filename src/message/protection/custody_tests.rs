//! Unit tests of custody evidence: sealing, verification per stored shape, tampering.

use super::*;
use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

fn custodian(key: Option<&[u8]>) -> Custodian {
    Custodian {
        runner_id: "runner-a".into(),
        key: key.map(|k| hmac::Key::new(hmac::HMAC_SHA256, k)),
    }
}

fn sealed(c: &Custodian, data: &[u8]) -> Envelope {
    let m = RawMessage {
        subject: "orders.created".into(),
        stream: "ORDERS".into(),
        consumer: "svc".into(),
        stream_sequence: 7,
        consumer_sequence: 3,
        delivery_count: 1,
        published_unix_nanos: Some(1_700_000_000_000_000_000),
        headers: vec![
            ("Nats-Msg-Id".into(), "m-7".into()),
            ("Content-Type".into(), "application/json".into()),
        ],
        data: data.to_vec(),
    };
    let cfg = EnvelopeConfig {
        keep_headers: vec!["Content-Type".into()],
        ..Default::default()
    };
    let (mut env, _) = normalize(&m, 1_700_000_001_000_000_000, &cfg);
    c.seal(&mut env, &m.data, 1_700_000_001_500_000_000);
    env
}

#[test]
fn a_sealed_record_verifies_and_every_change_is_caught() {
    for key in [None, Some(&[9u8; 32][..])] {
        let c = custodian(key);
        let env = sealed(&c, br#"{"amount": 1.50, "n": 1e2, "items": [1, 2]}"#);
        let custody = env.custody.clone().unwrap();
        assert_eq!(custody.schema, "svc.custody.v1");
        assert_eq!(
            custody.alg,
            if key.is_some() {
                "hmac-sha256"
            } else {
                "sha256"
            }
        );
        assert_eq!(custody.runner_id, "runner-a");
        assert_eq!(custody.received_at, "2023-11-14T22:13:21Z");
        assert_eq!(custody.sealed_at, "2023-11-14T22:13:21.5Z");
        let rec = serde_json::to_value(&env).unwrap();
        assert_eq!(c.verify(&rec), Verdict::Intact);
        for (path, value) in [
            ("/payload/amount", serde_json::json!(2.5)),
            (
                "/metadata/headers/Content-Type",
                serde_json::json!("text/plain"),
            ),
            ("/classification", serde_json::json!("secret")),
            ("/custody/runner_id", serde_json::json!("runner-b")),
            ("/custody/payload_digest", serde_json::json!("00")),
            ("/stream_sequence", serde_json::json!(8)),
        ] {
            let mut t = rec.clone();
            *t.pointer_mut(path).unwrap() = value;
            assert_eq!(c.verify(&t), Verdict::Altered, "{path}");
        }
        let mut t = rec.clone();
        t.as_object_mut().unwrap().remove("custody");
        assert!(matches!(c.verify(&t), Verdict::Unverifiable(_)));
    }
}

#[test]
fn a_keyed_block_needs_the_key() {
    let keyed = custodian(Some(&[9u8; 32]));
    let rec = serde_json::to_value(sealed(&keyed, b"x")).unwrap();
    assert_eq!(custodian(Some(&[8u8; 32])).verify(&rec), Verdict::Altered);
    assert!(
        matches!(custodian(None).verify(&rec), Verdict::Unverifiable(w) if w.contains("hmac_key_env"))
    );
}

#[test]
fn file_records_objects_and_relational_rows_verify_alike() {
    let c = custodian(Some(&[9u8; 32]));
    let env = sealed(&c, br#"{"z": 1, "a": 1.50, "n": 1e2}"#);
    let mut line = Vec::new();
    crate::sink::file::record::encode_record(&mut line, &env).unwrap();
    let file_rec: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(c.verify(&file_rec), Verdict::Intact, "file record");
    let object =
        serde_json::to_value(crate::sink::object_store::body::StoredObject::new(&env)).unwrap();
    assert_eq!(c.verify(&object), Verdict::Intact, "object-store object");
    // A row as `row_to_json` gives it: columns, and jsonb's rewrite of the payload
    // (sorted keys, spaces, 1e2 -> 100).
    let e = &env;
    let row = serde_json::json!({
        "idempotency_key": "s-ORDERS-7", "subject": e.subject, "stream": &*e.stream,
        "stream_sequence": e.stream_sequence, "consumer": &*e.consumer,
        "consumer_sequence": e.consumer_sequence, "message_id": e.message_id,
        "priority": e.priority, "classification": e.classification, "labels": e.labels,
        "labels_list": e.labels_list,
        "payload": serde_json::from_str::<Value>(r#"{"a": 1.50, "n": 100, "z": 1}"#).unwrap(),
        "payload_original_format": "json", "payload_wrapped": false,
        "payload_sha256": e.payload_info.sha256, "payload_size_bytes": e.payload_info.size_bytes,
        "security_labels_json": null, "metadata_json": e.metadata,
        "received_at": "2023-11-14T22:13:21+00:00", "custody_json": e.custody,
        "stored_at": "2023-11-14T22:13:22+00:00",
    });
    assert_eq!(c.verify(&row), Verdict::Intact, "relational row");
    let mut t = row.clone();
    t["payload_sha256"] = "ff".into();
    assert_eq!(c.verify(&t), Verdict::Altered);
}

#[test]
fn canonical_json_sorts_keys_and_normalizes_numbers() {
    let v: Value = serde_json::from_str(
        r#"{"b": [1.0, 1e2, 2.5, -0, 12345678901234567890], "a": "é\n", "A": null}"#,
    )
    .unwrap();
    let mut out = Vec::new();
    canonical_json(&mut out, &v);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"A":null,"a":"é\n","b":[1,100,2.5,0,12345678901234567890]}"#
    );
}

#[test]
fn debug_never_shows_the_key() {
    let d = format!("{:?}", custodian(Some(&[9u8; 32])));
    assert!(d.contains("keyed: true") && !d.contains("9, 9"), "{d}");
}
