//! The stored record of a message, `svc.file.message.v1`: `{"schema":"svc.file.message.v1",`
//! followed by the envelope's fields in their declared order, on one line. It belongs to the
//! message, not to one sink: the file sink writes it, the spool stores it, the HTTP sink sends
//! it (`body: envelope`), and the custody digest and checkpoints are computed over it.
//!
//! Written by hand rather than through the envelope's `Serialize`: the keys are constants
//! here, and a string that needs no escaping (nearly all of them) is copied whole. Through
//! serde_json every key and value went through its byte-by-byte escaper, the largest single
//! cost of the jsonl path. The output is byte-for-byte what `serde_json` writes for the
//! envelope; a test compares the two on envelopes that fill every field, so a field added to
//! the envelope but not here fails it.

use serde::Serialize;

use crate::message::envelope::{Envelope, EventMetadata, PayloadInfo};

/// `schema` of every record.
pub const RECORD_SCHEMA: &str = "svc.file.message.v1";

/// Bytes the record of `env` takes at most, give or take a few escapes: room to reserve so the
/// buffer is not grown (and copied) while the record is written. The fixed part (member names,
/// times, digest, numbers) is under 700 bytes.
pub fn record_capacity(env: &Envelope) -> usize {
    let m = &env.metadata;
    768 + env.payload.json().len()
        + env.subject.len()
        + env.stream.len()
        + env.stream_incarnation.len()
        + env.consumer.len()
        + env.message_id.as_ref().map_or(0, String::len)
        + env.priority.len()
        + env.classification.len()
        + 2 * env.labels.len()
        + 2 * env.labels_list.len()
        + m.headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum::<usize>()
}

/// Appends the record of `env` to `buf` (no newline). On error `buf` is left as it was.
pub fn encode_record(buf: &mut Vec<u8>, env: &Envelope) -> serde_json::Result<()> {
    let start = buf.len();
    let result = write_record(buf, env);
    if result.is_err() {
        buf.truncate(start);
    }
    result
}

fn write_record(out: &mut Vec<u8>, e: &Envelope) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"schema\":");
    string(out, RECORD_SCHEMA)?;
    out.push(b',');
    push_message_members(out, e, Unknown::Absent)?;

    out.push(b',');
    push_payload_info(out, &e.payload_info)?;
    out.extend_from_slice(b",\"security_labels\":");
    optional_value(out, e.security_labels.as_ref())?;
    // Present only when the mission metadata stage gave one (as `Serialize` skips `None`).
    if let Some(m) = &e.mission_metadata {
        out.extend_from_slice(b",\"mission_metadata\":");
        value(out, m)?;
    }
    // Present only when `custody.enabled` (as the envelope's `Serialize` skips `None`).
    if let Some(custody) = &e.custody {
        out.extend_from_slice(b",\"custody\":");
        value(out, custody)?;
    }
    out.push(b',');
    push_metadata(out, &e.metadata)?;
    out.push(b'}');
    Ok(())
}

/// The `"payload_info"` member (without a comma before or after), as every stored form that
/// holds it writes it.
pub fn push_payload_info(out: &mut Vec<u8>, info: &PayloadInfo) -> serde_json::Result<()> {
    out.extend_from_slice(b"\"payload_info\":{\"original_format\":");
    string(out, info.original_format.name())?;
    out.extend_from_slice(b",\"wrapped\":");
    out.extend_from_slice(if info.wrapped { b"true" } else { b"false" });
    out.extend_from_slice(b",\"sha256\":");
    string(out, &info.sha256)?;
    out.extend_from_slice(b",\"size_bytes\":");
    number(out, info.size_bytes);
    out.push(b'}');
    Ok(())
}

/// The `"metadata"` member (without a comma before or after), as every stored form that
/// holds it under that name writes it.
pub fn push_metadata(out: &mut Vec<u8>, m: &EventMetadata) -> serde_json::Result<()> {
    out.extend_from_slice(b"\"metadata\":{\"schema\":");
    string(out, m.schema)?;
    out.extend_from_slice(b",\"received_at\":");
    string(out, &m.received_at)?;
    out.extend_from_slice(b",\"published_at\":");
    optional_string(out, m.published_at.as_deref())?;
    out.extend_from_slice(b",\"event_time\":");
    optional_string(out, m.event_time.as_deref())?;
    out.extend_from_slice(b",\"delivery_count\":");
    number(out, m.delivery_count);
    out.extend_from_slice(b",\"headers\":{");
    for (i, (name, header)) in m.headers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, name)?;
        out.push(b':');
        string(out, header)?;
    }
    out.extend_from_slice(b"},\"security_labels\":");
    optional_value(out, m.security_labels.as_ref())?;
    out.push(b'}');
    Ok(())
}

/// How a stored form writes a stream incarnation that is not known.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// Left out (the record, as the envelope's `Serialize` skips it when empty).
    Absent,
    /// `null` (a row's column).
    Null,
}

/// The members every stored form of a message begins with, in this order and without braces:
/// the [identity members](push_identity_members) and `"payload"` (its JSON, not copied into a
/// value): the one projection of these fields the record, the relational row and the object
/// store's envelope document share, each writing its own members before and after them.
pub fn push_message_members(
    out: &mut Vec<u8>,
    e: &Envelope,
    unknown_incarnation: Unknown,
) -> serde_json::Result<()> {
    push_identity_members(out, e, unknown_incarnation)?;
    out.extend_from_slice(b",\"payload\":");
    out.extend_from_slice(e.payload.json().as_bytes());
    Ok(())
}

/// What says which message a stored form is of, in this order and without braces:
/// `"subject"`, `"stream"`, `"stream_incarnation"` (see [`Unknown`]), `"stream_sequence"`,
/// `"consumer"`, `"consumer_sequence"`, `"message_id"`, `"priority"`, `"classification"`,
/// `"labels"` and `"labels_list"`. [`push_message_members`] follows them with the payload; the
/// object store's sidecar, which never holds the payload, writes them alone.
pub fn push_identity_members(
    out: &mut Vec<u8>,
    e: &Envelope,
    unknown_incarnation: Unknown,
) -> serde_json::Result<()> {
    out.extend_from_slice(b"\"subject\":");
    string(out, &e.subject)?;
    out.extend_from_slice(b",\"stream\":");
    string(out, &e.stream)?;
    match (e.stream_incarnation.is_empty(), unknown_incarnation) {
        (true, Unknown::Absent) => {}
        (true, Unknown::Null) => out.extend_from_slice(b",\"stream_incarnation\":null"),
        (false, _) => {
            out.extend_from_slice(b",\"stream_incarnation\":");
            string(out, &e.stream_incarnation)?;
        }
    }
    out.extend_from_slice(b",\"stream_sequence\":");
    number(out, e.stream_sequence);
    out.extend_from_slice(b",\"consumer\":");
    string(out, &e.consumer)?;
    out.extend_from_slice(b",\"consumer_sequence\":");
    number(out, e.consumer_sequence);
    out.extend_from_slice(b",\"message_id\":");
    optional_string(out, e.message_id.as_deref())?;
    out.extend_from_slice(b",\"priority\":");
    string(out, &e.priority)?;
    out.extend_from_slice(b",\"classification\":");
    string(out, &e.classification)?;
    out.extend_from_slice(b",\"labels\":");
    string(out, &e.labels)?;
    out.extend_from_slice(b",\"labels_list\":[");
    for (i, label) in e.labels_list.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, label)?;
    }
    out.push(b']');
    Ok(())
}

/// A JSON string: copied whole between quotes when nothing in it needs escaping, otherwise
/// escaped by serde_json (so both paths write what serde_json writes). Measured against
/// `text::json::push_str` for these short strings (h53http): this is cheaper (148 against 183
/// instructions per string under callgrind).
fn string(out: &mut Vec<u8>, s: &str) -> serde_json::Result<()> {
    // Without an early exit the check compiles to a vectorized scan.
    let needs_escape = s.bytes().fold(false, |acc, b| {
        acc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if needs_escape {
        return serde_json::to_writer(out, s);
    }
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
    Ok(())
}

fn optional_string(out: &mut Vec<u8>, s: Option<&str>) -> serde_json::Result<()> {
    match s {
        Some(s) => string(out, s),
        None => {
            out.extend_from_slice(b"null");
            Ok(())
        }
    }
}

/// An unsigned number as serde_json writes it (its digits; no formatter machinery).
fn number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(crate::text::json::decimal(n, &mut [0; 20]).as_bytes());
}

/// `null`, or the value as serde_json writes it (the security label profile).
fn optional_value<T: Serialize>(out: &mut Vec<u8>, v: Option<&T>) -> serde_json::Result<()> {
    match v {
        Some(v) => value(out, v),
        None => {
            out.extend_from_slice(b"null");
            Ok(())
        }
    }
}

/// Anything else (the mission metadata, custody, a label profile) as serde_json writes it.
fn value<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) -> serde_json::Result<()> {
    serde_json::to_writer(out, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

    /// The record as serde_json writes it from the envelope's derived `Serialize`.
    fn by_serde(env: &Envelope) -> Vec<u8> {
        let mut v = serde_json::to_vec(env).unwrap();
        let head = format!("{{\"schema\":\"{RECORD_SCHEMA}\",");
        v.splice(0..1, head.into_bytes());
        v
    }

    fn envelope(data: &[u8], headers: Vec<(&str, &str)>) -> Envelope {
        let cfg = EnvelopeConfig {
            keep_headers: headers.iter().map(|(k, _)| k.to_string()).collect(),
            ..EnvelopeConfig::default()
        };
        normalize(
            &RawMessage {
                consumer_sequence: 7,
                delivery_count: 3,
                published_unix_nanos: Some(1_700_000_000_123_456_789),
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..RawMessage::sample("orders.créé", 42, data)
            },
            1_700_000_001_000_000_000,
            &cfg,
        )
        .0
    }

    #[test]
    fn matches_serde_json_byte_for_byte() {
        let mut full = envelope(
            br#"{"a": [1, 2.50], "s": "tab\there \"q\" \\ \u00e9"}"#,
            vec![
                ("Nats-Msg-Id", "m-\"1\"\n"),
                ("Svc-Event-Time", "2023-11-14T22:13:20.5Z"),
                ("Content-Type", "application/json"),
                ("X-Ctl", "\u{1}\u{1f}\u{7f}"),
            ],
        );
        let labels = serde_json::json!({"profile": "svc.security-label.v1", "owner": "o\"ps"});
        full.security_labels = Some(labels.clone());
        full.metadata.security_labels = Some(labels);
        full.mission_metadata = Some(serde_json::json!({"profile": "p", "wave": 2, "n": "x\"y"}));
        full.priority = "high".into();
        full.classification = "internal".into();
        full.labels_list = vec!["a".into(), "b\\c".into(), "ü".into()];
        full.labels = "a;b\\c;ü".into();
        full.stream_incarnation = "20261128T071943.123456789Z".into();
        assert!(full.message_id.is_some() && full.metadata.event_time.is_some());
        assert_eq!(full.metadata.headers.len(), 4);

        let cases = [
            full,
            envelope(b"plain text with \"quotes\"\r\n", vec![]),
            envelope(&[0xff, 0x00, 0x01], vec![]),
            envelope(b"{}", vec![]),
        ];
        for env in &cases {
            let mut ours = Vec::new();
            encode_record(&mut ours, env).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(by_serde(env)).unwrap()
            );
        }
    }

    #[test]
    fn appends_after_what_the_buffer_holds() {
        let env = envelope(b"{}", vec![]);
        let mut buf = b"earlier\n".to_vec();
        encode_record(&mut buf, &env).unwrap();
        assert_eq!(&buf[..8], b"earlier\n");
        assert_eq!(buf[8..], by_serde(&env)[..]);
    }
}
