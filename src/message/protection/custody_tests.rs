//! Unit tests of custody evidence: sealing, verification per stored shape, tampering.

use serde_json::Value;

use super::*;
use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

/// Verifies a record as a store holds it: its JSON text.
fn verify(c: &Custodian, record: &Value) -> Verdict {
    c.verify_text(&record.to_string())
}

fn custodian(key: Option<&[u8]>) -> Custodian {
    Custodian {
        runner_id: "runner-a".into(),
        key: key.map(|k| hmac::Key::new(hmac::HMAC_SHA256, k)),
    }
}

fn sealed(c: &Custodian, data: &[u8]) -> Envelope {
    let m = RawMessage {
        consumer_sequence: 3,
        published_unix_nanos: Some(1_700_000_000_000_000_000),
        headers: vec![
            ("Nats-Msg-Id".into(), "m-7".into()),
            ("Content-Type".into(), "application/json".into()),
        ],
        ..RawMessage::sample("orders.created", 7, data)
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
        assert_eq!(verify(&c, &rec), Verdict::Intact);
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
            assert_eq!(verify(&c, &t), Verdict::Altered, "{path}");
        }
        let mut t = rec.clone();
        t.as_object_mut().unwrap().remove("custody");
        assert!(matches!(verify(&c, &t), Verdict::Unverifiable(_)));
    }
}

#[test]
fn a_keyed_block_needs_the_key() {
    let keyed = custodian(Some(&[9u8; 32]));
    let rec = serde_json::to_value(sealed(&keyed, b"x")).unwrap();
    assert_eq!(verify(&custodian(Some(&[8u8; 32])), &rec), Verdict::Altered);
    assert!(
        matches!(verify(&custodian(None), &rec), Verdict::Unverifiable(w) if w.contains("hmac_key_env"))
    );
}

/// Someone who can edit the store but holds no key changes the payload, writes
/// `"alg":"sha256"` and recomputes plain digests: with a key configured that record is never
/// intact.
#[test]
fn with_a_key_configured_an_unkeyed_block_is_never_intact() {
    let keyed = custodian(Some(&[9u8; 32]));
    let original = serde_json::to_value(sealed(&keyed, br#"{"order": 1}"#)).unwrap();
    assert_eq!(verify(&keyed, &original), Verdict::Intact);
    // The forgery: the same record with another payload, sealed without a key.
    let forged = serde_json::to_value(sealed(&custodian(None), br#"{"order": 2}"#)).unwrap();
    assert_eq!(forged["custody"]["alg"], "sha256");
    assert_eq!(verify(&custodian(None), &forged), Verdict::Intact);
    match verify(&keyed, &forged) {
        Verdict::Unverifiable(why) => assert!(why.contains("only keyed blocks"), "{why}"),
        other => panic!("a downgraded block must not verify: {other:?}"),
    }
    let mut odd = forged.clone();
    odd["custody"]["alg"] = "none".into();
    assert!(matches!(verify(&keyed, &odd), Verdict::Unverifiable(_)));
}

#[test]
fn file_records_objects_and_relational_rows_verify_alike() {
    let c = custodian(Some(&[9u8; 32]));
    let env = sealed(&c, br#"{"z": 1, "a": 1.50, "n": 1e2}"#);
    let mut line = Vec::new();
    crate::message::record::encode_record(&mut line, &env).unwrap();
    let file_rec: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(verify(&c, &file_rec), Verdict::Intact, "file record");
    let object: Value =
        serde_json::from_slice(&crate::sink::object_store::body::object_json(&env).unwrap())
            .unwrap();
    assert_eq!(verify(&c, &object), Verdict::Intact, "object-store object");
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
    assert_eq!(verify(&c, &row), Verdict::Intact, "relational row");
    let mut t = row.clone();
    t["payload_sha256"] = "ff".into();
    assert_eq!(verify(&c, &t), Verdict::Altered);
    // A MySQL row: BOOLEAN is TINYINT(1), exported as 0/1; any other number does not verify.
    let mut my = row.clone();
    my["payload_wrapped"] = 0.into();
    assert_eq!(verify(&c, &my), Verdict::Intact, "mysql row");
    for other in [1, 2] {
        my["payload_wrapped"] = other.into();
        assert_eq!(verify(&c, &my), Verdict::Altered, "wrapped = {other}");
    }
}

/// A number beyond what a double holds, edited in a sealed record: caught (it verified when
/// numbers were compared through doubles).
#[test]
fn an_edit_beyond_double_precision_is_caught() {
    let c = custodian(Some(&[9u8; 32]));
    let env = sealed(
        &c,
        br#"{"amount": 18446744073709551616, "rate": 0.1000000000000000055}"#,
    );
    let text = serde_json::to_string(&env).unwrap();
    assert_eq!(c.verify_text(&text), Verdict::Intact);
    for (from, to) in [
        ("18446744073709551616", "18446744073709551999"),
        ("0.1000000000000000055", "0.1000000000000000056"),
    ] {
        assert!(text.contains(from), "{text}");
        let edited = text.replace(from, to);
        assert_eq!(c.verify_text(&edited), Verdict::Altered, "{to}");
    }
    // The same value in another form (as PostgreSQL's jsonb rewrites it) still verifies.
    let rewritten = text.replace("18446744073709551616", "1.8446744073709551616e19");
    assert_eq!(c.verify_text(&rewritten), Verdict::Intact);
}

/// Two readers could keep different values of a duplicated key: such a record is never
/// intact, whichever value the digest covered.
#[test]
fn a_record_with_a_duplicate_key_is_unverifiable() {
    let c = custodian(Some(&[9u8; 32]));
    let text = serde_json::to_string(&sealed(&c, br#"{"order": 1}"#)).unwrap();
    assert_eq!(c.verify_text(&text), Verdict::Intact);
    for edited in [
        text.replacen("{\"order\":1}", "{\"order\":1,\"order\":2}", 1),
        text.replacen(
            "\"stream\":\"ORDERS\"",
            "\"stream\":\"ORDERS\",\"stream\":\"X\"",
            1,
        ),
    ] {
        assert_ne!(edited, text);
        match c.verify_text(&edited) {
            Verdict::Unverifiable(why) => assert!(why.contains("duplicate key"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn debug_never_shows_the_key() {
    let d = format!("{:?}", custodian(Some(&[9u8; 32])));
    assert!(d.contains("keyed: true") && !d.contains("9, 9"), "{d}");
}

/// Mission metadata is covered by the record digest in every stored shape, and only when the
/// record holds one: a record without it (or sealed before the member existed, whose stored
/// shape is the same) verifies with the member absent or `null`.
#[test]
fn mission_metadata_is_covered_when_present() {
    let c = custodian(Some(&[9u8; 32]));
    let raw = br#"{"a": 1}"#;
    let mut env = sealed(&c, raw);
    env.mission_metadata = Some(serde_json::json!({"profile": "sortie.v1", "wave": 2}));
    c.seal(&mut env, raw, 1_700_000_002_000_000_000);
    let mut line = Vec::new();
    crate::message::record::encode_record(&mut line, &env).unwrap();
    let file_rec: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(file_rec["mission_metadata"]["wave"], 2);
    assert_eq!(verify(&c, &file_rec), Verdict::Intact, "file record");
    let object: Value =
        serde_json::from_slice(&crate::sink::object_store::body::object_json(&env).unwrap())
            .unwrap();
    assert_eq!(verify(&c, &object), Verdict::Intact, "object-store object");
    let mut row = file_rec.clone();
    let m = row.as_object_mut().unwrap();
    let mission = m.remove("mission_metadata").unwrap();
    m.insert("mission_metadata_json".into(), mission);
    let info = m.remove("payload_info").unwrap();
    for (k, v) in info.as_object().unwrap() {
        m.insert(format!("payload_{k}"), v.clone());
    }
    let labels = m.remove("security_labels").unwrap();
    m.insert("security_labels_json".into(), labels);
    let metadata = m.remove("metadata").unwrap();
    m.insert("metadata_json".into(), metadata);
    let custody = m.remove("custody").unwrap();
    m.insert("custody_json".into(), custody);
    assert_eq!(verify(&c, &row), Verdict::Intact, "relational row");

    for edit in [
        serde_json::json!({"profile": "sortie.v1", "wave": 3}),
        Value::Null,
    ] {
        let mut t = file_rec.clone();
        t["mission_metadata"] = edit;
        assert_eq!(verify(&c, &t), Verdict::Altered);
    }
    let mut t = file_rec.clone();
    t.as_object_mut().unwrap().remove("mission_metadata");
    assert_eq!(verify(&c, &t), Verdict::Altered, "removed");

    // Without mission metadata: the member may be absent (file record) or null (object).
    let plain = sealed(&c, raw);
    let mut v = serde_json::to_value(&plain).unwrap();
    assert!(v.get("mission_metadata").is_none());
    assert_eq!(verify(&c, &v), Verdict::Intact);
    v["mission_metadata"] = Value::Null;
    assert_eq!(verify(&c, &v), Verdict::Intact);
}
