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
use crate::message::record::encode_record;
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

/// First byte of the plain body of a custody checkpoint frame (a record's is `0` or `1`,
/// written by the runner, never by a publisher): `FLAG_CHECKPOINT | appended at, Unix ms (8
/// LE) | runner id length (1) | runner id | checkpoint index (8 LE) | the checkpoint's bytes`.
/// [`decode`] and [`file_record`] refuse it ("unknown flags"); sealed, its outer flag is
/// `FLAG_SEALED_CHECKPOINT` (seal.rs), which the associated data covers.
pub const FLAG_CHECKPOINT: u8 = 0x43;
/// Bytes of a checkpoint body before its runner id.
const CHECKPOINT_PREFIX: usize = PREFIX_LEN + 1;

/// Appends the plain body of a checkpoint frame (see [`FLAG_CHECKPOINT`]) to `out`.
pub fn encode_checkpoint(
    out: &mut Vec<u8>,
    (runner_id, index): (&str, u64),
    bytes: &[u8],
    appended_unix_ms: u64,
) -> Result<(), String> {
    let len = u8::try_from(runner_id.len())
        .map_err(|_| "runner id longer than 255 bytes: not kept in a spool".to_string())?;
    out.push(FLAG_CHECKPOINT);
    out.extend_from_slice(&appended_unix_ms.to_le_bytes());
    out.push(len);
    out.extend_from_slice(runner_id.as_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// True for the plain body of a checkpoint frame.
pub fn is_checkpoint(plain: &[u8]) -> bool {
    plain.first() == Some(&FLAG_CHECKPOINT)
}

/// A checkpoint frame's plain body, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointBody<'a> {
    pub runner_id: &'a str,
    pub index: u64,
    /// The checkpoint as the store keeps it (its JSON text).
    pub bytes: &'a [u8],
}

/// Reads a checkpoint frame's plain body; errors never quote it.
pub fn decode_checkpoint(plain: &[u8]) -> Result<CheckpointBody<'_>, &'static str> {
    if !is_checkpoint(plain) {
        return Err("not a checkpoint");
    }
    let len = usize::from(
        *plain
            .get(PREFIX_LEN)
            .ok_or("checkpoint shorter than its prefix")?,
    );
    let id_end = CHECKPOINT_PREFIX + len;
    let index = plain
        .get(id_end..id_end + 8)
        .ok_or("checkpoint shorter than its prefix")?;
    let runner_id = std::str::from_utf8(&plain[CHECKPOINT_PREFIX..id_end])
        .map_err(|_| "checkpoint runner id is not UTF-8")?;
    let bytes = &plain[id_end + 8..];
    std::str::from_utf8(bytes).map_err(|_| "checkpoint is not UTF-8")?;
    Ok(CheckpointBody {
        runner_id,
        index: u64::from_le_bytes(index.try_into().expect("8 bytes")),
        bytes,
    })
}

/// When the record was appended (Unix ms), from a body's prefix.
pub fn appended_unix_ms(body: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(
        body.get(1..PREFIX_LEN)?.try_into().ok()?,
    ))
}

#[derive(Deserialize)]
struct Rec {
    subject: String,
    stream: String,
    #[serde(default)]
    stream_incarnation: String,
    stream_sequence: u64,
    consumer: String,
    consumer_sequence: u64,
    message_id: Option<String>,
    priority: String,
    classification: String,
    labels: String,
    labels_list: Vec<String>,
    payload: Box<RawValue>,
    payload_info: Info,
    security_labels: Option<Value>,
    #[serde(default)]
    mission_metadata: Option<Value>,
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

/// The file record inside a body, for a sink that takes records as they are
/// ([`crate::sink::Sink::takes_stored_records`]): checked to begin with the
/// `svc.file.message.v1` schema, end its object, and be UTF-8 without a control character,
/// so a damaged record can never split a line of the sink's output or carry bytes its
/// encoder never writes (it escapes every control character and writes no whitespace).
///
/// Not a full JSON parse: that cost twice the write itself, and the frame's checksum
/// already catches damage. A record forged with a valid checksum needs the service's own
/// account, and even then it chooses nothing: it only lands as one line.
pub fn file_record(body: &[u8]) -> Result<&[u8], &'static str> {
    if body.len() < PREFIX_LEN {
        return Err("shorter than its prefix");
    }
    if !matches!(body[0], 0 | FLAG_KEYED) {
        return Err("unknown flags");
    }
    let record = &body[PREFIX_LEN..];
    if !record.starts_with(RECORD_START.as_bytes()) {
        return Err("unknown record schema");
    }
    if record.last() != Some(&b'}') {
        return Err("record is not readable");
    }
    // The smallest byte, without an early exit: this form compiles to vector code.
    if record.iter().fold(u8::MAX, |low, &b| low.min(b)) < 0x20 {
        return Err("record holds a control character");
    }
    std::str::from_utf8(record).map_err(|_| "record is not UTF-8")?;
    Ok(record)
}

/// How every record the file sink's encoder writes begins.
const RECORD_START: &str = concat!("{\"schema\":\"", "svc.file.message.v1", "\",");

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
    let r: Rec =
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
        let nanos = canonical_nanos(t)
            .or_else(|| parse_rfc3339_nanos(t))
            .ok_or("a time is not RFC 3339")?;
        let back = Rfc3339::from_unix_nanos(nanos);
        // Every time the runner writes is in this canonical form: anything else was altered.
        (back.as_str() == t)
            .then_some(back)
            .ok_or("a time is not canonical")
    };
    let opt_time = |t: Option<String>| t.as_deref().map(time).transpose();
    if !is_incarnation(&r.stream_incarnation) {
        return Err("stream incarnation is not a compact UTC time");
    }
    let payload = Payload::from_raw(r.payload);
    Ok(Envelope {
        subject: r.subject,
        stream: Arc::from(r.stream),
        stream_incarnation: Arc::from(r.stream_incarnation),
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
        mission_metadata: r.mission_metadata,
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

/// Empty (a record of a runner before incarnations, or of a message not from a broker) or what
/// [`crate::text::rfc3339::compact_utc`] writes: it becomes part of keys and ids.
fn is_incarnation(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 32
            && s.ends_with('Z')
            && s.bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'T' | b'Z' | b'.')))
}

/// Unix nanoseconds of `YYYY-MM-DDTHH:MM:SS[.f]Z`, the only form the runner writes, without
/// the general parser (the drain reads two or three times per record). `None` for anything
/// else; the caller formats the result again and requires the same text, so a wrong parse
/// here can only refuse a record, never alter it.
fn canonical_nanos(t: &str) -> Option<i128> {
    let b = t.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' || *b.last()? != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(r)?;
        digits.iter().try_fold(0i64, |acc, d| {
            d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0'))
        })
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let nanos = match &b[19..b.len() - 1] {
        [] => 0,
        [b'.', frac @ ..] if (1..=9).contains(&frac.len()) => {
            num(20..20 + frac.len())? * 10i64.pow(9 - frac.len() as u32)
        }
        _ => return None,
    };
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = year - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = (month + 9) % 12;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    Some(i128::from(seconds) * 1_000_000_000 + i128::from(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

    pub fn envelope(seq: u64, data: &[u8]) -> Envelope {
        let msg = RawMessage {
            stream: Arc::from("ORDERS"),
            consumer: Arc::from("svc"),
            delivery_count: 2,
            published_unix_nanos: Some(1_700_000_000_123_456_789),
            headers: vec![
                ("Nats-Msg-Id".into(), format!("id-{seq}")),
                ("Svc-Event-Time".into(), "2023-11-14T22:13:20.5Z".into()),
                ("Keep".into(), "v\"al\n".into()),
            ],
            ..RawMessage::sample("orders.eu", seq, data)
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
            env.mission_metadata = Some(serde_json::json!({"profile": "p", "wave": 2}));
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
            // Known for one of them, unknown (a record of an earlier version) for the others.
            if data[0] == b'p' {
                env.stream_incarnation = "20261128T071943.5Z".into();
            }
            let mut body = Vec::new();
            encode(&mut body, &env, 7).unwrap();
            assert_eq!(appended_unix_ms(&body), Some(7));
            assert_eq!(decode(&body).unwrap(), env);
        }
    }

    #[test]
    fn canonical_times_parse_as_the_general_parser_does() {
        let mut n: i128 = -62_167_219_200_000_000_000;
        while n < 253_402_300_799_999_999_999 {
            let text = Rfc3339::from_unix_nanos(n);
            assert_eq!(canonical_nanos(&text), Some(n), "{text}");
            assert_eq!(parse_rfc3339_nanos(&text), Some(n), "{text}");
            n += 7_919_000_000_123_457;
        }
        for bad in [
            "2023-11-14T22:13:20+01:00",
            "2023-11-14 22:13:20Z",
            "2023-11-14T22:13:20.Z",
        ] {
            assert_eq!(canonical_nanos(bad), None, "{bad}");
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
        // The incarnation becomes part of keys: only what the runner writes is read back.
        let mut planted = env.clone();
        planted.stream_incarnation = "../../etc".into();
        let mut body = Vec::new();
        encode(&mut body, &planted, 7).unwrap();
        assert_eq!(
            decode(&body).unwrap_err(),
            "stream incarnation is not a compact UTC time"
        );
    }

    /// A record's plain body can never read as a checkpoint, nor a checkpoint as a record,
    /// whatever a publisher sends: the kind is the runner's first byte.
    #[test]
    fn a_record_never_decodes_as_a_checkpoint_nor_a_checkpoint_as_a_record() {
        for data in [
            &b"\x43C"[..],
            b"{\"a\":1}",
            b"\x43\x00\x00\x00\x00\x00\x00\x00",
        ] {
            for keyed in [false, true] {
                let mut env = envelope(5, data);
                env.payload_info.keyed = keyed;
                env.subject = "\u{43}orders".into();
                let mut body = Vec::new();
                encode(&mut body, &env, u64::from_le_bytes(*b"CCCCCCCC")).unwrap();
                assert!(!is_checkpoint(&body));
                assert_eq!(decode_checkpoint(&body), Err("not a checkpoint"));
            }
        }
        let mut cp = Vec::new();
        encode_checkpoint(&mut cp, ("runner-1", 7), br#"{"signed":"x"}"#, 9).unwrap();
        assert!(is_checkpoint(&cp));
        assert_eq!(appended_unix_ms(&cp), Some(9));
        assert_eq!(
            decode_checkpoint(&cp).unwrap(),
            CheckpointBody {
                runner_id: "runner-1",
                index: 7,
                bytes: br#"{"signed":"x"}"#
            }
        );
        assert_eq!(decode(&cp).unwrap_err(), "unknown flags");
        assert_eq!(file_record(&cp).unwrap_err(), "unknown flags");
        assert!(decode_checkpoint(&cp[..12]).is_err());
        assert!(encode_checkpoint(&mut cp, (&"r".repeat(256), 0), b"", 0).is_err());
    }

    #[test]
    fn record_start_is_the_encoders_own() {
        let head = format!(
            "{{\"schema\":\"{}\",",
            crate::message::record::RECORD_SCHEMA
        );
        assert_eq!(RECORD_START, head);
    }

    #[test]
    fn a_stored_record_passes_as_it_is_and_damage_does_not() {
        let env = envelope(3, br#"{"a":"line\nbreak"}"#);
        let mut body = Vec::new();
        encode(&mut body, &env, 7).unwrap();
        let mut direct = Vec::new();
        encode_record(&mut direct, &env).unwrap();
        assert_eq!(file_record(&body).unwrap(), &direct[..]);

        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = body.clone();
            f(&mut b);
            file_record(&b).unwrap_err()
        };
        assert_eq!(with(&|b| b[0] = 9), "unknown flags");
        assert_eq!(
            with(&|b| b[PREFIX_LEN + 12] = b'X'),
            "unknown record schema"
        );
        // Whitespace between tokens is valid JSON but would split the output line.
        let control = "record holds a control character";
        assert_eq!(with(&|b| b.insert(b.len() - 1, b'\n')), control);
        assert_eq!(with(&|b| b.insert(b.len() - 1, 0)), control);
        assert_eq!(
            with(&|b| b.insert(b.len() - 1, 0xff)),
            "record is not UTF-8"
        );
        assert_eq!(
            with(&|b| *b.last_mut().unwrap() = b' '),
            "record is not readable"
        );
        assert_eq!(with(&|b| b.truncate(4)), "shorter than its prefix");
    }
}
