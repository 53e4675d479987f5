//! The canonical record of an envelope (`docs/payload-protection.md`, "Canonical record"),
//! written straight from an [`Envelope`] on `svc-normalize` without building a JSON tree
//! first (measured: most of custody's cost was that tree). Its output is byte for byte what
//! the project's one canonical writer ([`crate::document::canonical`]) gives for the stored
//! record, which `svc verify-custody` reads back; a test holds the two equal.

use std::io::Write as _;

use serde_json::Value;

use crate::document::canonical::{self, write_string as string, write_value};
use crate::message::envelope::{Envelope, PayloadFormat};

fn opt_string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn opt_value(out: &mut Vec<u8>, v: Option<&Value>) {
    match v {
        Some(v) => write_value(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

/// The canonical JSON of a payload in exactly the layout `encryption.rs` writes (values of
/// base64 and key-id characters, nothing to escape), keys reordered; false (nothing written)
/// for anything else, which then takes the generic path.
fn encrypted_payload(out: &mut Vec<u8>, text: &str) -> bool {
    let head = concat!(
        "{\"schema\":\"svc.encrypted_payload.v1\",\"alg\":\"A256GCM\",",
        "\"key_id\":\""
    );
    let Some(rest) = text.strip_prefix(head) else {
        return false;
    };
    let Some((key_id, rest)) = rest.split_once("\",\"nonce\":\"") else {
        return false;
    };
    let Some((nonce, rest)) = rest.split_once("\",\"ciphertext\":\"") else {
        return false;
    };
    let Some(ciphertext) = rest.strip_suffix("\"}") else {
        return false;
    };
    let plain = |v: &str| {
        v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=_-.".contains(&b))
    };
    if !(plain(key_id) && plain(nonce) && plain(ciphertext)) {
        return false;
    }
    for part in [
        "{\"alg\":\"A256GCM\",\"ciphertext\":\"",
        ciphertext,
        "\",\"key_id\":\"",
        key_id,
        "\",\"nonce\":\"",
        nonce,
        "\",\"schema\":\"svc.encrypted_payload.v1\"}",
    ] {
        out.extend_from_slice(part.as_bytes());
    }
    true
}

/// The envelope fields the canonical record holds.
pub const RECORD_FIELDS: &[&str] = &[
    "classification",
    "consumer",
    "consumer_sequence",
    "labels",
    "labels_list",
    "message_id",
    "metadata",
    "payload",
    "payload_info",
    "priority",
    "security_labels",
    "stream",
    "stream_sequence",
    "subject",
];

/// The member of the canonical record present only when the record holds a non-null value:
/// a record sealed before it existed still verifies.
pub const OPTIONAL_RECORD_FIELD: &str = "mission_metadata";

/// The canonical record of an envelope: its [`RECORD_FIELDS`] (and
/// [`OPTIONAL_RECORD_FIELD`] when set) in sorted order.
pub fn canonical_envelope(out: &mut Vec<u8>, e: &Envelope) {
    out.extend_from_slice(b"{\"classification\":");
    string(out, &e.classification);
    out.extend_from_slice(b",\"consumer\":");
    string(out, &e.consumer);
    let _ = write!(out, ",\"consumer_sequence\":{}", e.consumer_sequence);
    out.extend_from_slice(b",\"labels\":");
    string(out, &e.labels);
    out.extend_from_slice(b",\"labels_list\":[");
    for (i, l) in e.labels_list.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, l);
    }
    out.extend_from_slice(b"],\"message_id\":");
    opt_string(out, e.message_id.as_deref());
    let m = &e.metadata;
    let _ = write!(
        out,
        ",\"metadata\":{{\"delivery_count\":{}",
        m.delivery_count
    );
    out.extend_from_slice(b",\"event_time\":");
    opt_string(out, m.event_time.as_deref());
    out.extend_from_slice(b",\"headers\":{");
    // A BTreeMap of Strings: already in byte order.
    for (i, (k, v)) in m.headers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, k);
        out.push(b':');
        string(out, v);
    }
    out.extend_from_slice(b"},\"published_at\":");
    opt_string(out, m.published_at.as_deref());
    out.extend_from_slice(b",\"received_at\":");
    string(out, &m.received_at);
    out.extend_from_slice(b",\"schema\":");
    string(out, m.schema);
    out.extend_from_slice(b",\"security_labels\":");
    opt_value(out, m.security_labels.as_ref());
    out.push(b'}');
    // Only when present: records made before the member existed (and records without mission
    // metadata) keep the canonical form, and so the digest, they were sealed with.
    if let Some(m) = &e.mission_metadata {
        out.extend_from_slice(b",\"mission_metadata\":");
        write_value(out, m);
    }
    out.extend_from_slice(b",\"payload\":");
    if encrypted_payload(out, e.payload.json()) {
        // Written from the known layout, without a tree.
    } else {
        match canonical::parse(e.payload.json()) {
            Ok(doc) => canonical::write(out, &doc),
            // Not strict JSON (a duplicate key, an exponent beyond range): the stored text
            // itself. `svc verify-custody` reports such a record unverifiable.
            Err(_) => out.extend_from_slice(e.payload.json().as_bytes()),
        }
    }
    let info = &e.payload_info;
    out.extend_from_slice(b",\"payload_info\":{\"original_format\":");
    string(
        out,
        match info.original_format {
            PayloadFormat::Json => "json",
            PayloadFormat::Text => "text",
            PayloadFormat::Bytes => "bytes",
        },
    );
    out.extend_from_slice(b",\"sha256\":");
    string(out, &info.sha256);
    let _ = write!(
        out,
        ",\"size_bytes\":{},\"wrapped\":{}}}",
        info.size_bytes, info.wrapped
    );
    out.extend_from_slice(b",\"priority\":");
    string(out, &e.priority);
    out.extend_from_slice(b",\"security_labels\":");
    opt_value(out, e.security_labels.as_ref());
    out.extend_from_slice(b",\"stream\":");
    string(out, &e.stream);
    let _ = write!(out, ",\"stream_sequence\":{}", e.stream_sequence);
    out.extend_from_slice(b",\"subject\":");
    string(out, &e.subject);
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

    /// The fast writer and the generic one (over the stored record's text) agree on
    /// envelopes that fill every field.
    #[test]
    fn envelope_writer_matches_the_generic_canonical_json() {
        for data in [
            br#"{"z": 1, "a": [1.50, 1e2, -3, 12345678901234567890], "s": "q\"\u0001\u00e9"}"#
                .as_slice(),
            br#"[18446744073709551616, 1e400, 0.1000000000000000055511151231257827, 5e-324]"#,
            b"plain text with \"quotes\" and \x01 control",
            &[0xff, 0x00, 0x01],
            b"",
        ] {
            let m = RawMessage {
                stream: "S".into(),
                consumer: "c".into(),
                consumer_sequence: 3,
                delivery_count: 2,
                published_unix_nanos: Some(1_700_000_000_000_000_000),
                headers: vec![
                    ("Nats-Msg-Id".into(), "id\n1".into()),
                    ("B".into(), "2".into()),
                    ("A".into(), "1".into()),
                    ("Svc-Event-Time".into(), "2023-11-14T22:13:20Z".into()),
                ],
                ..RawMessage::sample("orders.\"odd\"", 9, data)
            };
            let cfg = EnvelopeConfig {
                keep_headers: vec!["B".into(), "A".into()],
                ..Default::default()
            };
            let (mut env, _) = normalize(&m, 1_700_000_001_000_000_000, &cfg);
            if data.is_empty() {
                // The layout `encryption.rs` writes takes the fast path.
                env.payload = crate::message::envelope::Payload::from_compact_json(
                    r#"{"schema":"svc.encrypted_payload.v1","alg":"A256GCM","key_id":"k-1.a","nonce":"AAECAwQFBgcICQoL","ciphertext":"q+/w=="}"#.into(),
                )
                .unwrap();
                let mut fast = Vec::new();
                assert!(encrypted_payload(&mut fast, env.payload.json()));
                // Anything else (here: an escaped quote in a value) takes the generic path.
                let odd = r#"{"schema":"svc.encrypted_payload.v1","alg":"A256GCM","key_id":"a\"b","nonce":"AA","ciphertext":"AA"}"#;
                let mut none = Vec::new();
                assert!(!encrypted_payload(&mut none, odd) && none.is_empty());
            }
            env.labels_list = vec!["a".into(), "b c".into()];
            env.labels = "a;b c".into();
            env.priority = "high".into();
            env.classification = "restricted".into();
            let profile = serde_json::json!({"classification": "restricted", "releasability": ["eu", "nato"], "n": 1.0});
            env.security_labels = Some(profile.clone());
            env.metadata.security_labels = Some(profile);
            if data.is_empty() {
                env.mission_metadata =
                    Some(serde_json::json!({"z": [1.0, {"b": null}], "a": "q\""}));
            }
            let mut fast = Vec::new();
            canonical_envelope(&mut fast, &env);
            let stored = serde_json::to_string(&env).unwrap();
            let canonical::Json::Object(mut all) = canonical::parse(&stored).unwrap() else {
                panic!("an envelope is an object")
            };
            all.retain(|(k, _)| {
                RECORD_FIELDS.contains(&k.as_ref()) || k.as_ref() == OPTIONAL_RECORD_FIELD
            });
            let mut generic = Vec::new();
            canonical::write(&mut generic, &canonical::Json::Object(all));
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                String::from_utf8(generic).unwrap()
            );
        }
    }
}
