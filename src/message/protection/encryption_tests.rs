//! Unit tests of payload encryption: format, AAD binding, rotation, the message bound, config.

use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::document::reader::{ObjectReader, Problems};
use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

/// Writes private key files for `ids` (key i = 32 bytes of value i+1) and returns the config.
fn config(dir: &std::path::Path, ids: &[&str], active: &str, extra: &str) -> EncryptionConfig {
    let keys: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let path = dir.join(id);
            std::fs::write(&path, B64.encode([i as u8 + 1; 32])).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            format!(r#"{{"key_id":"{id}","key_file":"{}"}}"#, path.display())
        })
        .collect();
    let doc = format!(
        r#"{{"enabled":true,"keys":[{}],"active_key_id":"{active}"{extra}}}"#,
        keys.join(",")
    );
    let v: Value = serde_json::from_str(&doc).unwrap();
    let problems = Problems::new();
    let cfg = EncryptionConfig::read(Some(ObjectReader::at(
        "payload_encryption".into(),
        &v,
        &problems,
    )));
    assert!(problems.is_empty(), "{:?}", problems.into_vec());
    cfg
}

fn raw(subject: &str, seq: u64, data: &[u8]) -> RawMessage {
    RawMessage::sample(subject, seq, data)
}

fn sealed(enc: &Encryptor, subject: &str, seq: u64, data: &[u8]) -> Value {
    let m = raw(subject, seq, data);
    let (mut env, _) = normalize(&m, 0, &EnvelopeConfig::default());
    enc.encrypt(&mut env, &m.data).unwrap();
    serde_json::to_value(&env).unwrap()
}

#[test]
fn payload_becomes_the_documented_object_and_decrypts() {
    let dir = tempfile::tempdir().unwrap();
    let enc = Encryptor::load(&config(dir.path(), &["k1"], "k1", "")).unwrap();
    let rec = sealed(&enc, "orders.created", 42, br#"{"card": "4111 1111"}"#);
    let p = rec["payload"].as_object().unwrap();
    let keys: Vec<&str> = p.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 5);
    assert_eq!(p["schema"], "svc.encrypted_payload.v1");
    assert_eq!(p["alg"], "A256GCM");
    assert_eq!(p["key_id"], "k1");
    assert_eq!(B64.decode(p["nonce"].as_str().unwrap()).unwrap().len(), 12);
    let plain = br#"{"card":"4111 1111"}"#;
    assert_eq!(
        B64.decode(p["ciphertext"].as_str().unwrap()).unwrap().len(),
        plain.len() + 16
    );
    assert!(!rec.to_string().contains("4111"));
    assert_eq!(enc.decrypt_record(&rec).unwrap(), plain);
    // The digest is keyed: not the plain SHA-256 of the payload.
    let digest = rec["payload_info"]["sha256"].as_str().unwrap();
    assert_eq!(digest.len(), 64);
    assert_ne!(
        digest,
        crate::message::envelope::hex_sha256(br#"{"card": "4111 1111"}"#)
    );
    assert_eq!(digest, enc.payload_digest(br#"{"card": "4111 1111"}"#));
}

#[test]
fn a_ciphertext_moved_to_another_record_does_not_decrypt() {
    let dir = tempfile::tempdir().unwrap();
    let enc = Encryptor::load(&config(dir.path(), &["k1"], "k1", "")).unwrap();
    let rec = sealed(&enc, "orders.created", 42, b"secret");
    for (field, value) in [
        ("stream_sequence", serde_json::json!(43)),
        ("subject", serde_json::json!("orders.deleted")),
        ("stream", serde_json::json!("OTHER")),
    ] {
        let mut moved = rec.clone();
        moved[field] = value;
        assert_eq!(enc.decrypt_record(&moved), Err(CryptError::Open), "{field}");
    }
    let mut bad = rec.clone();
    bad["payload"]["key_id"] = "nope".into();
    assert_eq!(
        enc.decrypt_record(&bad),
        Err(CryptError::UnknownKey("nope".into()))
    );
}

#[test]
fn rotation_keeps_old_records_readable_and_uses_the_active_key() {
    let dir = tempfile::tempdir().unwrap();
    let old = Encryptor::load(&config(dir.path(), &["k1"], "k1", "")).unwrap();
    let old_rec = sealed(&old, "orders.created", 1, b"old");
    let new = Encryptor::load(&config(
        dir.path(),
        &["k1", "k2"],
        "k2",
        r#","digest_key_id":"k1""#,
    ))
    .unwrap();
    let new_rec = sealed(&new, "orders.created", 2, b"new");
    assert_eq!(new_rec["payload"]["key_id"], "k2");
    assert_eq!(new.decrypt_record(&old_rec).unwrap(), br#"{"text":"old"}"#);
    assert_eq!(new.decrypt_record(&new_rec).unwrap(), br#"{"text":"new"}"#);
    // digest_key_id pinned to k1: digests stay those of the old key.
    assert_eq!(old.payload_digest(b"x"), new.payload_digest(b"x"));
    assert_eq!(
        old.decrypt_record(&new_rec),
        Err(CryptError::UnknownKey("k2".into()))
    );
}

#[test]
fn the_per_key_message_bound_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let enc = Encryptor::load(&config(
        dir.path(),
        &["k1"],
        "k1",
        r#","max_messages_per_key":2"#,
    ))
    .unwrap();
    let m = raw("a", 1, b"x");
    let (mut env, _) = normalize(&m, 0, &EnvelopeConfig::default());
    for _ in 0..2 {
        let mut e = env.clone();
        enc.encrypt(&mut e, &m.data).unwrap();
    }
    let err = enc.encrypt(&mut env, &m.data).unwrap_err();
    assert_eq!(
        err,
        CryptError::KeyExhausted {
            key_id: "k1".into(),
            limit: 2
        }
    );
    assert!(err.to_string().contains("rotate active_key_id"));
    assert_eq!(enc.usage(), vec![("k1", 2)]);
}

#[test]
fn rules_first_match_then_default() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &["k1"],
        "k1",
        r#","default":"clear","rules":[{"subject":"orders.public.>","action":"clear"},{"subject":"orders.>","action":"encrypt"}]"#,
    );
    assert_eq!(cfg.action_for("orders.public.x"), Action::Clear);
    assert_eq!(cfg.action_for("orders.eu"), Action::Encrypt);
    assert_eq!(cfg.action_for("other"), Action::Clear);
    assert_eq!(
        EncryptionConfig::default().action_for("orders.eu"),
        Action::Clear
    );
}

#[test]
fn debug_shows_key_ids_only() {
    let dir = tempfile::tempdir().unwrap();
    let enc = Encryptor::load(&config(dir.path(), &["k1"], "k1", "")).unwrap();
    let d = format!("{enc:?}");
    assert!(d.contains("k1") && d.contains("redacted"), "{d}");
    assert!(!d.contains(&B64.encode([1u8; 32])));
}

#[test]
fn config_problems_name_the_field() {
    let problems_of = |doc: &str| {
        let v: Value = serde_json::from_str(doc).unwrap();
        let p = Problems::new();
        EncryptionConfig::read(Some(ObjectReader::at("payload_encryption".into(), &v, &p)));
        p.into_vec()
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
    };
    let p = problems_of(
        r#"{"enabled":true,"keys":[{"key_id":"a","key_env":"A","key_file":"/k"}],"active_key_id":"b","key":"x"}"#,
    );
    assert!(
        p.iter()
            .any(|m| m.contains("payload_encryption.keys[0].key_env") && m.contains("not both")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.contains("payload_encryption.active_key_id")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.contains("payload_encryption.key") && m.contains("unknown field")),
        "{p:?}"
    );
    let p = problems_of(
        r#"{"enabled":true,"keys":[{"key_id":"a","key_env":"A"}],"active_key_id":"a","rules":[{"subject":"x"}]}"#,
    );
    assert!(p.iter().any(|m| m.contains("rules[0].action")), "{p:?}");
}

#[test]
fn loading_refuses_a_group_readable_key_file_without_echoing_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &["k1"], "k1", "");
    std::fs::set_permissions(
        dir.path().join("k1"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let errors = Encryptor::load(&cfg).unwrap_err();
    assert!(
        errors[0].contains("key k1") && errors[0].contains("group or others"),
        "{errors:?}"
    );
}

#[test]
fn nonces_are_never_reused_across_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let enc = Encryptor::load(&config(dir.path(), &["k1"], "k1", "")).unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..1000 {
        assert!(
            seen.insert(enc.nonces.next().unwrap()),
            "a nonce came twice"
        );
    }
}
