use serde_json::json;

use super::*;
use crate::config::RuntimeConfig;
use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

fn cfg(block: serde_json::Value) -> Result<PreSinkPolicyConfig, String> {
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
        "sink": {"type": "file", "directory": "/tmp/x"},
        "pre_sink_policy": block,
        "mission_metadata": {"enabled": true},
        "payload_encryption": {"enabled": true, "active_key_id": "k1",
                               "keys": [{"key_id": "k1", "key_file": "/nonexistent/k1"}]},
    });
    RuntimeConfig::parse(&doc.to_string())
        .map(|c| c.pre_sink_policy)
        .map_err(|e| e.to_string())
}

fn env(subject: &str, payload: &[u8]) -> Envelope {
    let raw = RawMessage {
        stream: "S".into(),
        consumer: "c".into(),
        ..RawMessage::sample(subject, 1, payload)
    };
    let (mut e, _) = normalize(&raw, 0, &EnvelopeConfig::default());
    e.priority = "high".into();
    e.classification = "restricted".into();
    e.labels_list = vec!["eu".into()];
    e.labels = "eu".into();
    e
}

#[test]
fn each_requirement_has_its_code_and_the_first_matching_rule_applies() {
    let p = cfg(json!({"enabled": true, "rules": [
        {"subject": "o.prio", "require_priority": ["low"]},
        {"subject": "o.class", "require_classification": ["secret"]},
        {"subject": "o.label", "required_labels": ["eu", "gdpr"]},
        {"subject": "o.mission", "require_mission_metadata": true},
        {"subject": "o.enc", "require_encrypted_payload": true},
        {"subject": "o.size", "max_payload_bytes": 4},
        {"subject": "o.keys", "allowed_mission_metadata_keys": ["a"]},
        {"subject": "o.>", "require_priority": ["high"]}
    ]}))
    .unwrap();
    for (subject, code, field) in [
        (
            "o.prio",
            "priority_not_allowed",
            "pre_sink_policy.rules[0].require_priority",
        ),
        (
            "o.class",
            "classification_not_allowed",
            "pre_sink_policy.rules[1].require_classification",
        ),
        (
            "o.label",
            "missing_required_label",
            "pre_sink_policy.rules[2].required_labels[1]",
        ),
        (
            "o.mission",
            "missing_mission_metadata",
            "pre_sink_policy.rules[3].require_mission_metadata",
        ),
        (
            "o.enc",
            "payload_not_encrypted",
            "pre_sink_policy.rules[4].require_encrypted_payload",
        ),
        (
            "o.size",
            "policy_payload_too_large",
            "pre_sink_policy.rules[5].max_payload_bytes",
        ),
    ] {
        let r = p.check(&env(subject, b"{\"x\":1}"), false).unwrap_err();
        assert_eq!((r.code(), r.first().field.as_str()), (code, field));
    }
    let mut e = env("o.keys", b"{}");
    e.mission_metadata = Some(json!({"a": 1, "SECRET-KEY": 2}));
    let r = p.check(&e, false).unwrap_err();
    assert_eq!(r.code(), "mission_metadata_key_not_allowed");
    assert!(!r.to_string().contains("SECRET"), "{r}");
    e.mission_metadata = Some(json!({"a": 1}));
    assert!(p.check(&e, false).is_ok());
    assert!(p.check(&env("o.enc", b"{}"), true).is_ok());
    assert!(p.check(&env("o.other", b"{}"), false).is_ok());
    assert_eq!(
        p.check(&env("x.y", b"{}"), false).unwrap_err().code(),
        "unmatched_subject"
    );
    let open = cfg(json!({"enabled": true, "unmatched_subject": "allow",
                          "rules": [{"subject": "o.a", "max_payload_bytes": 1}]}))
    .unwrap();
    assert!(open.check(&env("x.y", b"{}"), false).is_ok());
}

#[test]
fn config_problems_carry_their_paths() {
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
        "sink": {"type": "file", "directory": "/tmp/x"},
        "pre_sink_policy": {"enabled": true, "rules": [
            {"subject": "o.>", "require_mission_metadata": true, "require_encrypted_payload": true}
        ]},
    });
    let err = RuntimeConfig::parse(&doc.to_string())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "pre_sink_policy.rules[0].require_mission_metadata: mission_metadata.enabled is false"
        ),
        "{err}"
    );
    assert!(
        err.contains("pre_sink_policy.rules[0].require_encrypted_payload: payload_encryption.enabled is false"),
        "{err}"
    );
    let err = cfg(json!({"enabled": true})).unwrap_err();
    assert!(
        err.contains("pre_sink_policy.rules: must hold at least one rule"),
        "{err}"
    );
    let err = cfg(
        json!({"enabled": true, "unmatched_subject": "maybe", "rules": [
            {"subject": "o.>"},
            {"subject": "o.*", "require_priority": [], "max_payload_bytes": 0},
            {"subject": "o..x", "require_mission_metadata": true, "expression": "1 == 1"}
        ]}),
    )
    .unwrap_err();
    for want in [
        "pre_sink_policy.unmatched_subject: must be one of: reject, allow",
        "pre_sink_policy.rules[0].subject: the rule requires nothing",
        "pre_sink_policy.rules[1].require_priority: must list at least one value",
        "pre_sink_policy.rules[1].max_payload_bytes: must be an integer from 1",
        "pre_sink_policy.rules[2].subject: ",
        "pre_sink_policy.rules[2].expression: unknown field",
    ] {
        assert!(err.contains(want), "{want} missing from:\n{err}");
    }
}
