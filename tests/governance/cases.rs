//! What `tests/governance.rs` publishes and what must become of each message: the three
//! governance blocks of its runner, the passing messages (one per mission metadata source and
//! per policy rule) and one failing message per reason code, each with its field and reason.

use std::path::Path;

use serde_json::{json, Value};

use crate::support::protection::DLQ_SUBJECT;

/// Planted in every offending value and every payload.
pub const MARK: &str = "PLANTED-MARKER";
pub const HEADER: &str = "Svc-Mission-Metadata";

/// The three governance blocks, custody, encryption of `orders.enc.yes.>` and a DLQ.
pub fn governance_blocks(key: &Path) -> Value {
    json!({
        "mission_metadata": {
            "enabled": true,
            "max_bytes": 512,
            "max_depth": 3,
            "profiles": {
                "sortie.v1": {
                    "required_fields": {
                        "sortie_id": {"type": "string", "min_length": 1, "max_length": 16},
                        "wave": {"type": "integer", "min": 1, "max": 9}
                    },
                    "optional_fields": {"notes": {"type": "string", "max_length": 400}},
                    "unknown_fields": "forbid"
                },
                "open.v1": {"unknown_fields": "allow"}
            },
            "allowed_profiles": ["sortie.v1"],
            "default": {"profile": "sortie.v1", "sortie_id": "global", "wave": 1},
            "rules": [
                {"subject": "orders.none.>", "metadata": null},
                {"subject": "orders.plain.>", "metadata": null},
                {"subject": "orders.default.>",
                 "metadata": {"profile": "sortie.v1", "sortie_id": "by-rule", "wave": 2}}
            ]
        },
        "pre_sink_policy": {
            "enabled": true,
            "rules": [
                {"subject": "orders.prio.>", "require_priority": ["high"]},
                {"subject": "orders.class.>", "require_classification": ["restricted"]},
                {"subject": "orders.label.>", "required_labels": ["eu"]},
                {"subject": "orders.none.>", "require_mission_metadata": true},
                {"subject": "orders.enc.>", "require_encrypted_payload": true},
                {"subject": "orders.big.>", "max_payload_bytes": 64},
                {"subject": "orders.keys.>",
                 "allowed_mission_metadata_keys": ["profile", "sortie_id", "wave"]},
                {"subject": "orders.ok.>", "require_mission_metadata": true},
                {"subject": "orders.default.>", "require_mission_metadata": true},
                {"subject": "orders.plain.>", "max_payload_bytes": 4096}
            ]
        },
        "size_policy": {
            "enabled": true,
            "max_payload_bytes": 8192,
            "max_header_count": 12,
            "max_header_name_bytes": 40,
            "max_header_value_bytes": 1024,
            "max_total_header_bytes": 2048,
            "max_label_count": 3,
            "max_label_bytes": 40,
            "max_mission_metadata_bytes": 200,
            "max_record_bytes": 4000
        },
        "payload_encryption": {
            "enabled": true, "keys": [{"key_id": "k1", "key_file": key}], "active_key_id": "k1",
            "rules": [{"subject": "orders.enc.yes.>", "action": "encrypt"}], "default": "clear"
        },
        "custody": {"enabled": true, "runner_id": "runner-gov", "hmac_key_env": "PP_CUSTODY_KEY"},
        "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                        "publish_timeout_ms": 2000}
    })
}

pub fn sortie(id: &str, wave: i64) -> String {
    json!({"profile": "sortie.v1", "sortie_id": id, "wave": wave}).to_string()
}

/// One message: subject, headers, payload, and what must become of it.
pub struct Case {
    pub subject: &'static str,
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
    /// `Ok`: stored with this mission metadata (`Value::Null`: none);
    /// `Err((field, reason))`: dead-lettered.
    pub expect: Result<Value, (&'static str, &'static str)>,
}

fn ok(subject: &'static str, headers: Vec<(&str, String)>, mission: Value) -> Case {
    Case {
        subject,
        headers: headers
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        payload: format!("{{\"n\":\"{subject}\"}}").into_bytes(),
        expect: Ok(mission),
    }
}

fn bad(
    subject: &'static str,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
    field: &'static str,
    reason: &'static str,
) -> Case {
    Case {
        subject,
        headers,
        payload,
        expect: Err((field, reason)),
    }
}

fn mission(text: String) -> Vec<(String, String)> {
    vec![(HEADER.to_string(), text)]
}

pub fn body() -> Vec<u8> {
    format!("{{\"card\":\"{MARK}\"}}").into_bytes()
}

pub fn cases() -> Vec<Case> {
    let good = || mission(sortie("s-1", 3));
    let notes = |n: usize| {
        json!({"profile": "sortie.v1", "sortie_id": "s", "wave": 1, "notes": "n".repeat(n)})
            .to_string()
    };
    let m = "mission_metadata";
    let mut v = vec![
        // Passing records, one per source and per policy rule.
        ok(
            "orders.ok.a",
            vec![(HEADER, sortie("s-1", 3))],
            json!({"profile": "sortie.v1", "sortie_id": "s-1", "wave": 3}),
        ),
        ok(
            "orders.default.b",
            vec![],
            json!({"profile": "sortie.v1", "sortie_id": "by-rule", "wave": 2}),
        ),
        ok(
            "orders.prio.c",
            vec![("Svc-Priority", "high".into())],
            json!({"profile": "sortie.v1", "sortie_id": "global", "wave": 1}),
        ),
        ok("orders.plain.d", vec![], Value::Null),
        ok(
            "orders.class.e",
            vec![("Svc-Classification", "restricted".into())],
            json!({"profile": "sortie.v1", "sortie_id": "global", "wave": 1}),
        ),
        ok(
            "orders.label.f",
            vec![("Svc-Labels", "eu,x".into())],
            json!({"profile": "sortie.v1", "sortie_id": "global", "wave": 1}),
        ),
        ok(
            "orders.enc.yes.g",
            vec![(HEADER, sortie("enc", 4))],
            json!({"profile": "sortie.v1", "sortie_id": "enc", "wave": 4}),
        ),
        ok(
            "orders.big.h",
            vec![],
            json!({"profile": "sortie.v1", "sortie_id": "global", "wave": 1}),
        ),
        ok(
            "orders.keys.i",
            vec![(HEADER, sortie("k", 5))],
            json!({"profile": "sortie.v1", "sortie_id": "k", "wave": 5}),
        ),
    ];
    // Mission metadata.
    for (header, field, reason) in [
        (format!("{{\"sortie_id\": \"{MARK}\""), m, "invalid_json"),
        (
            format!(r#"{{"profile":"sortie.v1","sortie_id":"a","wave":1,"sortie_id":"{MARK}"}}"#),
            m,
            "duplicate_key",
        ),
        (
            format!("{{\"wave\": NaN, \"x\": \"{MARK}\"}}"),
            m,
            "invalid_json",
        ),
        (format!("[\"{MARK}\"]"), m, "not_object"),
        (format!("{{\"{MARK}\\u0001\": 1}}"), m, "control_character"),
        (
            format!("{{\"a\": {{\"b\": {{\"c\": [\"{MARK}\"]}}}}}}"),
            m,
            "too_deep",
        ),
        (
            format!("{{\"a\": \"{}\"}}", MARK.repeat(40)),
            m,
            "too_large",
        ),
        (
            format!("{{\"sortie_id\": \"{MARK}\"}}"),
            "mission_metadata.profile",
            "missing_profile",
        ),
        (
            format!("{{\"profile\": \"{MARK}\"}}"),
            "mission_metadata.profile",
            "unknown_profile",
        ),
        (
            r#"{"profile": "open.v1"}"#.to_string(),
            "mission_metadata.profile",
            "profile_not_allowed",
        ),
        (
            r#"{"profile": "sortie.v1", "wave": 1}"#.to_string(),
            "mission_metadata.sortie_id",
            "missing_field",
        ),
        (
            format!(r#"{{"profile":"sortie.v1","wave":1,"sortie_id":"a","{MARK}":1}}"#),
            m,
            "unknown_field",
        ),
        (
            format!(r#"{{"profile":"sortie.v1","wave":"{MARK}","sortie_id":"a"}}"#),
            "mission_metadata.wave",
            "wrong_type",
        ),
        (
            format!(r#"{{"profile":"sortie.v1","wave":1,"sortie_id":"{MARK}{MARK}"}}"#),
            "mission_metadata.sortie_id",
            "out_of_bounds",
        ),
    ] {
        v.push(bad("orders.ok.m", mission(header), body(), field, reason));
    }
    // The pre-sink policy.
    let r = |i: usize, f: &str| -> &'static str {
        Box::leak(format!("pre_sink_policy.rules[{i}].{f}").into_boxed_str())
    };
    v.extend([
        bad(
            "orders.prio.p",
            vec![("Svc-Priority".into(), "low".into())],
            body(),
            r(0, "require_priority"),
            "priority_not_allowed",
        ),
        bad(
            "orders.class.p",
            vec![],
            body(),
            r(1, "require_classification"),
            "classification_not_allowed",
        ),
        bad(
            "orders.label.p",
            vec![("Svc-Labels".into(), "x".into())],
            body(),
            r(2, "required_labels[0]"),
            "missing_required_label",
        ),
        bad(
            "orders.none.p",
            vec![],
            body(),
            r(3, "require_mission_metadata"),
            "missing_mission_metadata",
        ),
        bad(
            "orders.enc.no.p",
            vec![],
            body(),
            r(4, "require_encrypted_payload"),
            "payload_not_encrypted",
        ),
        bad(
            "orders.big.p",
            vec![],
            format!("{{\"card\":\"{}\"}}", MARK.repeat(6)).into_bytes(),
            r(5, "max_payload_bytes"),
            "policy_payload_too_large",
        ),
        bad(
            "orders.keys.p",
            mission(notes(3)),
            body(),
            r(6, "allowed_mission_metadata_keys"),
            "mission_metadata_key_not_allowed",
        ),
        bad(
            "orders.unmatched.p",
            vec![],
            body(),
            "pre_sink_policy.rules",
            "unmatched_subject",
        ),
    ]);
    // The size policy.
    let many: Vec<(String, String)> = (0..13).map(|i| (format!("X-H{i}"), MARK.into())).collect();
    let wide: Vec<(String, String)> = (0..3)
        .map(|i| (format!("X-W{i}"), MARK.repeat(60)))
        .collect();
    let with = |mut h: Vec<(String, String)>| {
        h.extend(good());
        h
    };
    v.extend([
        bad(
            "orders.ok.s",
            good(),
            format!("\"{}\"", MARK.repeat(600)).into_bytes(),
            "payload",
            "payload_too_large",
        ),
        bad(
            "orders.ok.s",
            with(many),
            body(),
            "headers",
            "too_many_headers",
        ),
        bad(
            "orders.ok.s",
            with(vec![(format!("X-{MARK}-{MARK}-{MARK}"), "v".into())]),
            body(),
            "headers",
            "header_name_too_long",
        ),
        bad(
            "orders.ok.s",
            with(vec![("X-V".into(), MARK.repeat(80))]),
            body(),
            "headers",
            "header_value_too_long",
        ),
        bad(
            "orders.ok.s",
            with(wide),
            body(),
            "headers",
            "headers_too_large",
        ),
        bad(
            "orders.ok.s",
            with(vec![("Svc-Labels".into(), "a,b,c,d".into())]),
            body(),
            "labels",
            "too_many_labels",
        ),
        bad(
            "orders.ok.s",
            with(vec![(
                "Svc-Labels".into(),
                "plantedlabel-aaaaaaaaaa,plantedlabel-bbbbbbbbbb".into(),
            )]),
            body(),
            "labels",
            "labels_too_large",
        ),
        bad(
            "orders.ok.s",
            mission(notes(250)),
            body(),
            "mission_metadata",
            "mission_metadata_too_large",
        ),
        bad(
            "orders.ok.s",
            good(),
            format!("\"{}\"", MARK.repeat(280)).into_bytes(),
            "record",
            "record_too_large",
        ),
    ]);
    v
}
