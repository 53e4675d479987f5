//! What goes into the bucket: object bodies (envelope document or payload), the sidecar
//! document, gzip, and the request headers that describe them.
//!
//! Bodies are deterministic functions of the envelope (gzip with a zero mtime and no file
//! name), so a retry of the same delivery sends the same bytes.

use std::io::Write;

use flate2::write::GzEncoder;

use crate::message::envelope::{hex_sha256, Envelope};
use crate::message::record::{
    push_identity_members, push_message_members, push_metadata, push_payload_info, record_capacity,
    Unknown,
};
use crate::text::json::{decimal, push_str};
use crate::text::rfc3339::format_rfc3339_nanos;

use super::config::{MetadataMode, ObjectFormat, ObjectStoreConfig, ServerSideEncryption};
use crate::sink::layout::Compression;

pub const OBJECT_SCHEMA: &str = "svc.objectstore.object.v1";
pub const SIDECAR_SCHEMA: &str = "svc.objectstore.sidecar.v1";
pub const SCHEMA_VERSION: u32 = 1;

/// The stored object of `object_format = envelope`, members in the spec's order: `schema`,
/// `schema_version`, the members every stored form begins with
/// ([`push_message_members`]: `subject` to `payload`, `stream_incarnation` left out when not
/// known), `payload_info`, then `mission_metadata`, `security_labels` and `custody` (each
/// `null` when absent, unlike the record, which leaves the first and last out) and
/// `metadata`. Written from the one projection of the envelope's stored fields in
/// [`crate::message::record`]; byte for byte what `serde_json` wrote of the derived struct it
/// replaced (kept as the oracle of the tests below).
pub fn object_json(env: &Envelope) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(record_capacity(env));
    head(&mut out, OBJECT_SCHEMA);
    push_message_members(&mut out, env, Unknown::Absent)?;
    out.push(b',');
    push_payload_info(&mut out, &env.payload_info)?;
    out.extend_from_slice(b",\"mission_metadata\":");
    serde_json::to_writer(&mut out, &env.mission_metadata)?;
    out.extend_from_slice(b",\"security_labels\":");
    serde_json::to_writer(&mut out, &env.security_labels)?;
    out.extend_from_slice(b",\"custody\":");
    serde_json::to_writer(&mut out, &env.custody)?;
    out.push(b',');
    push_metadata(&mut out, &env.metadata)?;
    out.push(b'}');
    Ok(out)
}

/// The sidecar document: event metadata and payload hashes, never the payload. Members:
/// `schema`, `schema_version`, `object_key` (the primary object it describes),
/// `object_format`, `compression`, `content_type`, the message's identity members
/// ([`push_identity_members`]), `payload_info` (`sha256` over the bytes as received),
/// `normalized_payload_sha256` (over the normalized payload JSON as serialized),
/// `security_labels`, `metadata` (of the delivery that wrote it) and `object_metadata` (the
/// configured static pairs).
fn sidecar_json(
    cfg: &ObjectStoreConfig,
    env: &Envelope,
    primary_key: &str,
) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(1024);
    head(&mut out, SIDECAR_SCHEMA);
    out.extend_from_slice(b"\"object_key\":");
    push_str(&mut out, primary_key);
    out.extend_from_slice(b",\"object_format\":");
    push_str(
        &mut out,
        match cfg.object_format {
            ObjectFormat::Envelope => "envelope",
            ObjectFormat::Payload => "payload",
        },
    );
    out.extend_from_slice(b",\"compression\":");
    push_str(&mut out, cfg.compression.name());
    out.extend_from_slice(b",\"content_type\":");
    push_str(&mut out, &cfg.content_type);
    out.push(b',');
    push_identity_members(&mut out, env, Unknown::Absent)?;
    out.push(b',');
    push_payload_info(&mut out, &env.payload_info)?;
    out.extend_from_slice(b",\"normalized_payload_sha256\":");
    push_str(&mut out, &hex_sha256(env.payload.json().as_bytes()));
    out.extend_from_slice(b",\"security_labels\":");
    serde_json::to_writer(&mut out, &env.security_labels)?;
    out.push(b',');
    push_metadata(&mut out, &env.metadata)?;
    out.extend_from_slice(b",\"object_metadata\":");
    serde_json::to_writer(&mut out, &cfg.object_metadata)?;
    out.push(b'}');
    Ok(out)
}

/// `{"schema":<schema>,"schema_version":1,` (the opening both documents share).
fn head(out: &mut Vec<u8>, schema: &str) {
    out.extend_from_slice(b"{\"schema\":");
    push_str(out, schema);
    out.extend_from_slice(b",\"schema_version\":");
    out.extend_from_slice(decimal(u64::from(SCHEMA_VERSION), &mut [0; 20]).as_bytes());
    out.push(b',');
}

/// Encoded bodies and headers of one envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Bodies {
    pub primary: Vec<u8>,
    /// Bytes of the primary body before compression.
    pub plain_len: usize,
    pub sidecar: Option<Vec<u8>>,
    /// `x-amz-meta-*` pairs (name without the prefix) of the primary object.
    pub metadata: Vec<(String, String)>,
}

/// Builds the bodies of an envelope and enforces `max_object_bytes` (after compression) and
/// `max_metadata_bytes`. An error is permanent: the same envelope always fails the same way.
pub fn build(
    cfg: &ObjectStoreConfig,
    env: &Envelope,
    primary_key: &str,
    with_sidecar: bool,
) -> Result<Bodies, String> {
    let json = match cfg.object_format {
        ObjectFormat::Envelope => object_json(env),
        ObjectFormat::Payload => Ok(env.payload.json().as_bytes().to_vec()),
    }
    .map_err(|e| format!("encode object: {e}"))?;
    let plain_len = json.len();
    let primary = encode(cfg, json)?;
    check_size(cfg, "object", primary.len())?;

    let sidecar = if with_sidecar {
        // The sidecar is never compressed: it is small and read by tools.
        let bytes =
            sidecar_json(cfg, env, primary_key).map_err(|e| format!("encode sidecar: {e}"))?;
        check_size(cfg, "sidecar", bytes.len())?;
        Some(bytes)
    } else {
        None
    };

    let metadata = if cfg.metadata_mode == MetadataMode::ObjectMetadata {
        let mut m: Vec<(String, String)> = cfg
            .object_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        m.push(("svc-payload-sha256".into(), env.payload_info.sha256.clone()));
        m.push((
            "svc-stream-sequence".into(),
            env.stream_sequence.to_string(),
        ));
        if !env.stream_incarnation.is_empty() {
            m.push((
                "svc-stream-incarnation".into(),
                env.stream_incarnation.to_string(),
            ));
        }
        let total: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
        if total > cfg.max_metadata_bytes {
            return Err(format!(
                "metadata is {total} bytes, over max_metadata_bytes ({})",
                cfg.max_metadata_bytes
            ));
        }
        m
    } else {
        Vec::new()
    };
    Ok(Bodies {
        primary,
        plain_len,
        sidecar,
        metadata,
    })
}

fn encode(cfg: &ObjectStoreConfig, json: Vec<u8>) -> Result<Vec<u8>, String> {
    match cfg.compression {
        Compression::None => Ok(json),
        Compression::Gzip => gzip(&json).map_err(|e| format!("gzip: {e}")),
    }
}

/// Deterministic gzip: mtime 0, no file name, default level.
pub fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = GzEncoder::new(
        Vec::with_capacity(data.len() / 2 + 64),
        flate2::Compression::default(),
    );
    enc.write_all(data)?;
    enc.finish()
}

fn check_size(cfg: &ObjectStoreConfig, what: &str, len: usize) -> Result<(), String> {
    if len as u64 > cfg.max_object_bytes {
        return Err(format!(
            "{what} body is {len} bytes, over max_object_bytes ({})",
            cfg.max_object_bytes
        ));
    }
    Ok(())
}

/// Headers common to every put of this sink (content type, encoding, encryption).
pub fn common_headers(cfg: &ObjectStoreConfig, compressed: bool) -> Vec<(String, String)> {
    let mut h = vec![("content-type".to_string(), cfg.content_type.clone())];
    if compressed && cfg.compression == Compression::Gzip {
        h.push(("content-encoding".into(), "gzip".into()));
    }
    match cfg.server_side_encryption {
        ServerSideEncryption::None => {}
        ServerSideEncryption::Aes256 => {
            h.push(("x-amz-server-side-encryption".into(), "AES256".into()));
        }
        ServerSideEncryption::AwsKms => {
            h.push(("x-amz-server-side-encryption".into(), "aws:kms".into()));
            if let Some(id) = &cfg.kms_key_id {
                h.push((
                    "x-amz-server-side-encryption-aws-kms-key-id".into(),
                    id.clone(),
                ));
            }
        }
    }
    h
}

/// Headers of an event object's put (primary and sidecar) under `object_lock` or
/// `legal_hold`: the retention (mode, and until `retain_days` from `now_unix_secs`, rounded up
/// to the second), the hold, and the body's SHA-256 checksum, which S3 requires of a put with
/// Object Lock headers. Empty without either. The `svc test-sink` probe is never locked.
pub fn retention_headers(
    cfg: &ObjectStoreConfig,
    body: &[u8],
    now_unix_secs: u64,
) -> Vec<(String, String)> {
    use base64::Engine as _;
    use sha2::{Digest, Sha256};
    if cfg.object_lock.is_none() && !cfg.legal_hold {
        return Vec::new();
    }
    let mut h = Vec::with_capacity(4);
    if let Some(lock) = cfg.object_lock {
        let until = now_unix_secs + 1 + u64::from(lock.retain_days) * 86_400;
        h.push(("x-amz-object-lock-mode".into(), lock.mode.as_str().into()));
        h.push((
            "x-amz-object-lock-retain-until-date".into(),
            format_rfc3339_nanos(i128::from(until) * 1_000_000_000),
        ));
    }
    if cfg.legal_hold {
        h.push(("x-amz-object-lock-legal-hold".into(), "ON".into()));
    }
    // S3 wants `Content-MD5` or the SDK checksum headers with Object Lock; SHA-256 is the
    // digest already in the tree.
    let digest = Sha256::digest(body);
    h.push(("x-amz-sdk-checksum-algorithm".into(), "SHA256".into()));
    h.push((
        "x-amz-checksum-sha256".into(),
        base64::engine::general_purpose::STANDARD.encode(digest),
    ));
    h
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde::Serialize;
    use serde_json::{json, Value};

    use super::*;
    use crate::message::envelope::{
        normalize, Custody, EnvelopeConfig, EventMetadata, Payload, PayloadFormat, PayloadInfo,
        RawMessage,
    };

    /// The oracle: the serde-derived envelope document the sink stored before
    /// [`object_json`] (kept as it was, fields in the spec's order).
    #[derive(Serialize)]
    struct StoredObject<'a> {
        schema: &'static str,
        schema_version: u32,
        subject: &'a str,
        stream: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        stream_incarnation: &'a str,
        stream_sequence: u64,
        consumer: &'a str,
        consumer_sequence: u64,
        message_id: Option<&'a str>,
        priority: &'a str,
        classification: &'a str,
        labels: &'a str,
        labels_list: &'a [String],
        payload: &'a Payload,
        payload_info: &'a PayloadInfo,
        mission_metadata: Option<&'a Value>,
        security_labels: Option<&'a Value>,
        custody: Option<&'a Custody>,
        metadata: &'a EventMetadata,
    }

    /// The oracle of the sidecar, the serde-derived document stored before [`sidecar_json`].
    #[derive(Serialize)]
    struct Sidecar<'a> {
        schema: &'static str,
        schema_version: u32,
        object_key: &'a str,
        object_format: &'static str,
        compression: &'static str,
        content_type: &'a str,
        subject: &'a str,
        stream: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        stream_incarnation: &'a str,
        stream_sequence: u64,
        consumer: &'a str,
        consumer_sequence: u64,
        message_id: Option<&'a str>,
        priority: &'a str,
        classification: &'a str,
        labels: &'a str,
        labels_list: &'a [String],
        payload_info: &'a PayloadInfo,
        normalized_payload_sha256: String,
        security_labels: Option<&'a Value>,
        metadata: &'a EventMetadata,
        object_metadata: &'a BTreeMap<String, String>,
    }

    fn by_serde(env: &Envelope) -> Vec<u8> {
        serde_json::to_vec(&StoredObject {
            schema: OBJECT_SCHEMA,
            schema_version: SCHEMA_VERSION,
            subject: &env.subject,
            stream: &env.stream,
            stream_incarnation: &env.stream_incarnation,
            stream_sequence: env.stream_sequence,
            consumer: &env.consumer,
            consumer_sequence: env.consumer_sequence,
            message_id: env.message_id.as_deref(),
            priority: &env.priority,
            classification: &env.classification,
            labels: &env.labels,
            labels_list: &env.labels_list,
            payload: &env.payload,
            payload_info: &env.payload_info,
            mission_metadata: env.mission_metadata.as_ref(),
            security_labels: env.security_labels.as_ref(),
            custody: env.custody.as_ref(),
            metadata: &env.metadata,
        })
        .unwrap()
    }

    fn sidecar_by_serde(cfg: &ObjectStoreConfig, env: &Envelope, key: &str) -> Vec<u8> {
        serde_json::to_vec(&Sidecar {
            schema: SIDECAR_SCHEMA,
            schema_version: SCHEMA_VERSION,
            object_key: key,
            object_format: match cfg.object_format {
                ObjectFormat::Envelope => "envelope",
                ObjectFormat::Payload => "payload",
            },
            compression: cfg.compression.name(),
            content_type: &cfg.content_type,
            subject: &env.subject,
            stream: &env.stream,
            stream_incarnation: &env.stream_incarnation,
            stream_sequence: env.stream_sequence,
            consumer: &env.consumer,
            consumer_sequence: env.consumer_sequence,
            message_id: env.message_id.as_deref(),
            priority: &env.priority,
            classification: &env.classification,
            labels: &env.labels,
            labels_list: &env.labels_list,
            payload_info: &env.payload_info,
            normalized_payload_sha256: hex_sha256(env.payload.json().as_bytes()),
            security_labels: env.security_labels.as_ref(),
            metadata: &env.metadata,
            object_metadata: &cfg.object_metadata,
        })
        .unwrap()
    }

    fn cfg(extra: &str) -> ObjectStoreConfig {
        let text = format!(
            r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
               "subject": "a"}}, "sink": {{"type": "object_store", "bucket": "abc"{extra}}}}}"#
        );
        match crate::config::RuntimeConfig::parse(&text).unwrap().sink {
            crate::sink::SinkConfig::ObjectStore(c) => *c,
            _ => unreachable!(),
        }
    }

    fn envelope(subject: &str, data: &[u8], headers: &[(&str, &str)]) -> Envelope {
        let cfg = EnvelopeConfig {
            keep_headers: headers.iter().map(|(k, _)| k.to_string()).collect(),
            ..EnvelopeConfig::default()
        };
        let raw = RawMessage {
            consumer_sequence: 7,
            delivery_count: 3,
            published_unix_nanos: Some(1_700_000_000_123_456_789),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..RawMessage::sample(subject, 42, data)
        };
        normalize(&raw, 1_700_000_001_000_000_000, &cfg).0
    }

    /// Envelopes that fill or leave out every field the documents hold: odd and escaped
    /// strings, control characters, characters outside the BMP (raw and as `\u` pairs), empty
    /// and absent optional fields, labels lists, and each payload kind.
    fn envelopes() -> Vec<Envelope> {
        let odd = "tab\t \"q\" \\ nul\u{0} \u{1f}\u{7f} é 😀 \u{2028}";
        let mut full = envelope(
            "orders.créé.😀",
            r#"{"a": [1, 2.50, -0, 1e2], "s": "tab\there \"q\" \\ \u00e9 \ud83d\ude00 \u0001", "e": "😀", "n": null, "o": {}}"#.as_bytes(),
            &[
                ("Nats-Msg-Id", "m-\"1\"\n😀"),
                ("Svc-Event-Time", "2023-11-14T22:13:20.5Z"),
                ("Content-Type", "application/json"),
                ("X-Ctl", "\u{1}\u{1f}\u{7f}"),
                ("X-Empty", ""),
            ],
        );
        let labels = json!({"profile": "svc.security-label.v1", "owner": "o\"ps", "x": "😀\n"});
        full.security_labels = Some(labels.clone());
        full.metadata.security_labels = Some(labels);
        full.mission_metadata = Some(json!({"profile": "p", "wave": 2, "n": "x\"y\u{1}"}));
        full.custody = Some(Custody {
            schema: "svc.custody.v1".into(),
            alg: "hmac-sha256".into(),
            runner_id: odd.into(),
            received_at: "2023-11-14T22:13:21Z".into(),
            sealed_at: "2023-11-14T22:13:21.000000001Z".into(),
            payload_digest: "ab".repeat(32),
            record_digest: "cd".repeat(32),
        });
        full.priority = "high".into();
        full.classification = odd.into();
        full.labels_list = vec![
            "a".into(),
            "b\\c".into(),
            "ü".into(),
            "😀".into(),
            "".into(),
        ];
        full.labels = full.labels_list.join(";");
        full.stream_incarnation = Arc::from("20261128T071943.123456789Z");
        full.stream = Arc::from("ORD\"ERS\u{1}");
        full.consumer = Arc::from("con😀sumer");
        full.stream_sequence = u64::MAX;
        full.consumer_sequence = 0;
        full.metadata.delivery_count = u64::MAX;
        assert!(full.message_id.is_some() && full.metadata.event_time.is_some());

        let mut only_mission = envelope("s", b"{}", &[]);
        only_mission.mission_metadata = Some(json!(null));
        let mut empty_strings = envelope("", b"", &[]);
        empty_strings.priority = String::new();
        empty_strings.classification = String::new();
        empty_strings.message_id = Some(String::new());
        let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
        let cases = vec![
            full,
            only_mission,
            empty_strings,
            envelope(
                "t",
                b"plain text with \"quotes\"\r\n\x01 \xf0\x9f\x98\x80",
                &[],
            ),
            envelope("b", &[0xff, 0x00, 0x01, 0xfe], &[]),
            envelope("j", b" [1, \"x\" , {\"k\" : true}] ", &[]),
            envelope("n", b"123", &[]),
            envelope("d", deep.as_bytes(), &[]),
            envelope("u", br#""\ud800""#, &[]),
        ];
        let kinds: Vec<_> = cases
            .iter()
            .map(|e| e.payload_info.original_format)
            .collect();
        for kind in [
            PayloadFormat::Json,
            PayloadFormat::Text,
            PayloadFormat::Bytes,
        ] {
            assert!(kinds.contains(&kind), "{kind:?} not covered");
        }
        assert!(cases.iter().any(|e| e.payload_info.wrapped));
        assert!(cases.iter().any(|e| e.stream_incarnation.is_empty()));
        assert!(cases.iter().any(|e| e.message_id.is_none()));
        assert!(cases.iter().any(|e| e.metadata.event_time.is_none()));
        cases
    }

    #[test]
    fn the_envelope_document_is_byte_for_byte_the_former_serde_document() {
        for env in &envelopes() {
            let ours = String::from_utf8(object_json(env).unwrap()).unwrap();
            assert_eq!(ours, String::from_utf8(by_serde(env)).unwrap());
            // And what the sink stores uncompressed is that document.
            let bodies = build(&cfg(""), env, "k", false).unwrap();
            assert_eq!(bodies.primary, ours.as_bytes());
            assert_eq!(bodies.plain_len, ours.len());
        }
    }

    #[test]
    fn the_sidecar_is_byte_for_byte_the_former_serde_document() {
        // Set after reading, past the config's checks: the writer must hold for any value.
        let mut odd = cfg(r#", "object_format": "payload", "compression": "gzip",
            "object_suffix": ".json.gz""#);
        odd.content_type = "text/plain; charset=\"utf-8\"\u{1}".into();
        odd.object_metadata = [("team", "o\"ps"), ("z", "😀"), ("a", "\u{1}\n")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let configs = [cfg(""), odd];
        assert!(!configs[1].object_metadata.is_empty());
        for c in &configs {
            for env in &envelopes() {
                let key = "stream-sequence/OR\"D/😀/42.json";
                let ours = String::from_utf8(sidecar_json(c, env, key).unwrap()).unwrap();
                assert_eq!(
                    ours,
                    String::from_utf8(sidecar_by_serde(c, env, key)).unwrap()
                );
                let bodies = build(c, env, key, true).unwrap();
                assert_eq!(bodies.sidecar.as_deref(), Some(ours.as_bytes()));
            }
        }
    }
}
