//! Canonical JSON of custody evidence (`docs/payload-protection.md`, "Canonical record"):
//! objects with keys sorted by their UTF-8 bytes, no whitespace, strings as RFC 8785 escapes
//! them (`"`, `\` and control characters only, as serde_json does), integers in decimal, any
//! other number as the shortest round-trip decimal of its double, written as an integer when
//! integral and at most 2^53 in magnitude.
//!
//! Two writers with one output: [`canonical_json`] for any JSON value (what `svc
//! verify-custody` reads back from a store), and [`canonical_envelope`], which writes the
//! canonical record straight from an [`Envelope`] on `svc-normalize` without building a JSON
//! tree first (measured: most of custody's cost was that tree). A test holds them equal.

use std::io::Write as _;

use serde_json::{Number, Value};

use crate::message::envelope::{Envelope, PayloadFormat};

/// A JSON string as serde_json writes it, copied whole when nothing needs escaping.
pub fn string(out: &mut Vec<u8>, s: &str) {
    let needs_escape = s.bytes().fold(false, |acc, b| {
        acc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if needs_escape {
        serde_json::to_writer(&mut *out, s).expect("a string serializes");
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

fn number(out: &mut Vec<u8>, n: &Number) {
    if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else {
        let f = n.as_f64().unwrap_or(0.0);
        if f.is_finite() && f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 {
            let _ = write!(out, "{}", f as i64);
        } else {
            let _ = write!(out, "{n}");
        }
    }
}

fn opt_string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn opt_value(out: &mut Vec<u8>, v: Option<&Value>) {
    match v {
        Some(v) => canonical_json(out, v),
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

/// The canonical record of an envelope: its [`super::custody::RECORD_FIELDS`] in sorted order.
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
    out.extend_from_slice(b"},\"payload\":");
    if encrypted_payload(out, e.payload.json()) {
        // Written from the known layout, without a tree.
    } else {
        match serde_json::from_str::<Value>(e.payload.json()) {
            Ok(v) => canonical_json(out, &v),
            // Not representable as a tree (a number beyond f64): the stored text itself, which
            // is what a reader that cannot parse it either compares.
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

/// Writes the canonical JSON of `v` (see the module docs).
pub fn canonical_json(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => number(out, n),
        Value::String(s) => string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // serde_json's map iterates in key order unless its `preserve_order` feature is
            // on somewhere in the build: sort only when needed.
            let in_order = map
                .keys()
                .zip(map.keys().skip(1))
                .all(|(a, b)| a.as_bytes() < b.as_bytes());
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if !in_order {
                entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            }
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(out, k);
                out.push(b':');
                canonical_json(out, v);
            }
            out.push(b'}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

    /// The fast writer and the generic one agree on envelopes that fill every field.
    #[test]
    fn envelope_writer_matches_the_generic_canonical_json() {
        for data in [
            br#"{"z": 1, "a": [1.50, 1e2, -3, 12345678901234567890], "s": "q\"\u0001\u00e9"}"#
                .as_slice(),
            b"plain text with \"quotes\" and \x01 control",
            &[0xff, 0x00, 0x01],
            b"",
        ] {
            let m = RawMessage {
                subject: "orders.\"odd\"".into(),
                stream: "S".into(),
                consumer: "c".into(),
                stream_sequence: 9,
                consumer_sequence: 3,
                delivery_count: 2,
                published_unix_nanos: Some(1_700_000_000_000_000_000),
                headers: vec![
                    ("Nats-Msg-Id".into(), "id\n1".into()),
                    ("B".into(), "2".into()),
                    ("A".into(), "1".into()),
                    ("Svc-Event-Time".into(), "2023-11-14T22:13:20Z".into()),
                ],
                data: data.to_vec(),
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
            let mut fast = Vec::new();
            canonical_envelope(&mut fast, &env);
            let serde_json::Value::Object(mut all) = serde_json::to_value(&env).unwrap() else {
                panic!("an envelope is an object")
            };
            all.retain(|k, _| super::super::custody::RECORD_FIELDS.contains(&k.as_str()));
            let mut generic = Vec::new();
            canonical_json(&mut generic, &Value::Object(all));
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                String::from_utf8(generic).unwrap()
            );
        }
    }
}
