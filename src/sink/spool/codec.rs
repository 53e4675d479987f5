//! A spool record's body: the envelope exactly as the sink would have received it.
//!
//! `flags (1 byte) | appended at, Unix ms (8 bytes LE) | the svc.file.message.v1 record`.
//! The JSON is the file sink's record (its hand-written encoder is the fast one, and it holds
//! every field of the envelope, stream and sequence included); the flag byte carries the one
//! field that record leaves out (`payload_info.keyed`). Decoding rebuilds the same envelope,
//! so a drain after a crash writes the same key to an idempotent sink and no duplicate.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::message::envelope::{
    Custody, Envelope, EventMetadata, Payload, PayloadFormat, PayloadInfo, METADATA_SCHEMA,
};
use crate::sink::file::record::encode_record;
use crate::text::rfc3339::{parse_rfc3339_nanos, Rfc3339};

const FLAG_KEYED: u8 = 1;
/// Flag byte and append time.
pub const PREFIX_LEN: usize = 9;

/// Appends the body of `env` to `out`; on error `out` is left as it was.
pub fn encode(out: &mut Vec<u8>, env: &Envelope, appended_unix_ms: u64) -> Result<(), String> {
    let start = out.len();
    out.push(if env.payload_info.keyed {
        FLAG_KEYED
    } else {
        0
    });
    out.extend_from_slice(&appended_unix_ms.to_le_bytes());
    encode_record(out, env).map_err(|e| {
        out.truncate(start);
        format!("encode: {e}")
    })
}

/// When the record was appended (Unix ms), from a body's prefix.
pub fn appended_unix_ms(body: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(
        body.get(1..PREFIX_LEN)?.try_into().ok()?,
    ))
}

#[derive(Deserialize)]
struct Rec<'a> {
    subject: String,
    stream: String,
    stream_sequence: u64,
    consumer: String,
    consumer_sequence: u64,
    message_id: Option<String>,
    priority: String,
    classification: String,
    labels: String,
    labels_list: Vec<String>,
    #[serde(borrow)]
    payload: &'a RawValue,
    payload_info: Info,
    security_labels: Option<Value>,
    #[serde(default)]
    custody: Option<Custody>,
    metadata: Meta,
}

#[derive(Deserialize)]
struct Info {
    original_format: String,
    wrapped: bool,
    sha256: String,
    size_bytes: u64,
}

#[derive(Deserialize)]
struct Meta {
    schema: String,
    received_at: String,
    published_at: Option<String>,
    event_time: Option<String>,
    delivery_count: u64,
    headers: BTreeMap<String, String>,
    security_labels: Option<Value>,
}

/// The envelope of a body. Errors say which part is wrong, never quoting the data.
pub fn decode(body: &[u8]) -> Result<Envelope, &'static str> {
    if body.len() < PREFIX_LEN {
        return Err("shorter than its prefix");
    }
    let keyed = match body[0] {
        0 => false,
        FLAG_KEYED => true,
        _ => return Err("unknown flags"),
    };
    let r: Rec<'_> =
        serde_json::from_slice(&body[PREFIX_LEN..]).map_err(|_| "record is not readable")?;
    if r.metadata.schema != METADATA_SCHEMA {
        return Err("unknown metadata schema");
    }
    let original_format = match r.payload_info.original_format.as_str() {
        "json" => PayloadFormat::Json,
        "text" => PayloadFormat::Text,
        "bytes" => PayloadFormat::Bytes,
        _ => return Err("unknown payload format"),
    };
    let time = |t: &str| -> Result<Rfc3339, &'static str> {
        let nanos = parse_rfc3339_nanos(t).ok_or("a time is not RFC 3339")?;
        let back = Rfc3339::from_unix_nanos(nanos);
        // Every time the runner writes is in this canonical form: anything else was altered.
        (back.as_str() == t)
            .then_some(back)
            .ok_or("a time is not canonical")
    };
    let opt_time = |t: Option<String>| t.as_deref().map(time).transpose();
    let payload = Payload::from_compact_json(r.payload.get().to_string()).ok_or("payload")?;
    Ok(Envelope {
        subject: r.subject,
        stream: Arc::from(r.stream),
        stream_sequence: r.stream_sequence,
        consumer: Arc::from(r.consumer),
        consumer_sequence: r.consumer_sequence,
        message_id: r.message_id,
        priority: r.priority,
        classification: r.classification,
        labels: r.labels,
        labels_list: r.labels_list,
        payload,
        payload_info: PayloadInfo {
            original_format,
            wrapped: r.payload_info.wrapped,
            sha256: r.payload_info.sha256,
            size_bytes: r.payload_info.size_bytes,
            keyed,
        },
        security_labels: r.security_labels,
        custody: r.custody,
        metadata: EventMetadata {
            schema: METADATA_SCHEMA,
            received_at: time(&r.metadata.received_at)?,
            published_at: opt_time(r.metadata.published_at)?,
            event_time: opt_time(r.metadata.event_time)?,
            delivery_count: r.metadata.delivery_count,
            headers: r.metadata.headers,
            security_labels: r.metadata.security_labels,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

    pub fn envelope(seq: u64, data: &[u8]) -> Envelope {
        let msg = RawMessage {
            subject: "orders.eu".into(),
            stream: Arc::from("ORDERS"),
            consumer: Arc::from("svc"),
            stream_sequence: seq,
            consumer_sequence: seq,
            delivery_count: 2,
            published_unix_nanos: Some(1_700_000_000_123_456_789),
            headers: vec![
                ("Nats-Msg-Id".into(), format!("id-{seq}")),
                ("Svc-Event-Time".into(), "2023-11-14T22:13:20.5Z".into()),
                ("Keep".into(), "v\"al\n".into()),
            ],
            data: data.to_vec(),
            unreadable: None,
        };
        let cfg = EnvelopeConfig {
            keep_headers: vec!["Keep".into()],
            ..EnvelopeConfig::default()
        };
        normalize(&msg, 1_700_000_001_000_000_001, &cfg).0
    }

    #[test]
    fn every_envelope_reads_back_equal() {
        for data in [
            &br#"{"b": [1, 2.50, 1e400, "x\u00e9"], "a": null}"#[..],
            b"plain text",
            b"\x00\xffbytes",
        ] {
            let mut env = envelope(42, data);
            env.security_labels = Some(serde_json::json!({"level": "secret"}));
            env.metadata.security_labels = env.security_labels.clone();
            env.custody = Some(Custody {
                schema: "svc.custody.v1".into(),
                alg: "sha256".into(),
                runner_id: "r".into(),
                received_at: "t".into(),
                sealed_at: "t".into(),
                payload_digest: "00".into(),
                record_digest: "11".into(),
            });
            env.payload_info.keyed = data[0] == b'p';
            let mut body = Vec::new();
            encode(&mut body, &env, 7).unwrap();
            assert_eq!(appended_unix_ms(&body), Some(7));
            assert_eq!(decode(&body).unwrap(), env);
        }
    }

    #[test]
    fn altered_bodies_are_refused_without_quoting_them() {
        let env = envelope(1, b"{}");
        let mut body = Vec::new();
        encode(&mut body, &env, 7).unwrap();
        let mut bad = body.clone();
        bad[0] = 9;
        assert_eq!(decode(&bad).unwrap_err(), "unknown flags");
        assert!(decode(&body[..20]).is_err());
    }
}
