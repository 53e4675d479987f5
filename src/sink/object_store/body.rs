//! What goes into the bucket: object bodies (envelope document or payload), the sidecar
//! document, gzip, and the request headers that describe them.
//!
//! Bodies are deterministic functions of the envelope (gzip with a zero mtime and no file
//! name), so a retry of the same delivery sends the same bytes.

use std::io::Write;

use flate2::write::GzEncoder;
use serde::Serialize;
use serde_json::Value;

use crate::message::envelope::{hex_sha256, Envelope, EventMetadata, Payload, PayloadInfo};
use crate::text::rfc3339::format_rfc3339_nanos;

use super::config::{MetadataMode, ObjectFormat, ObjectStoreConfig, ServerSideEncryption};
use crate::sink::layout::Compression;

pub const OBJECT_SCHEMA: &str = "svc.objectstore.object.v1";
pub const SIDECAR_SCHEMA: &str = "svc.objectstore.sidecar.v1";
pub const SCHEMA_VERSION: u32 = 1;

/// The stored object of `object_format = envelope`, fields in the spec's order.
#[derive(Serialize)]
pub struct StoredObject<'a> {
    pub schema: &'static str,
    pub schema_version: u32,
    pub subject: &'a str,
    pub stream: &'a str,
    /// The stream's incarnation (`broker/incarnation.rs`), absent when not known.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub stream_incarnation: &'a str,
    pub stream_sequence: u64,
    pub consumer: &'a str,
    pub consumer_sequence: u64,
    pub message_id: Option<&'a str>,
    pub priority: &'a str,
    pub classification: &'a str,
    pub labels: &'a str,
    pub labels_list: &'a [String],
    pub payload: &'a Payload,
    pub payload_info: &'a PayloadInfo,
    /// The record's mission metadata (`docs/governance.md`), else `null`.
    pub mission_metadata: Option<&'a Value>,
    pub security_labels: Option<&'a Value>,
    /// The custody block (`custody.enabled`), else `null`.
    pub custody: Option<&'a crate::message::envelope::Custody>,
    pub metadata: &'a EventMetadata,
}

impl<'a> StoredObject<'a> {
    pub fn new(env: &'a Envelope) -> Self {
        StoredObject {
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
        }
    }
}

/// The sidecar document: event metadata and payload hashes, never the payload.
#[derive(Serialize)]
pub struct Sidecar<'a> {
    pub schema: &'static str,
    pub schema_version: u32,
    /// Key of the primary object this sidecar describes.
    pub object_key: &'a str,
    pub object_format: &'static str,
    pub compression: &'static str,
    pub content_type: &'a str,
    pub subject: &'a str,
    pub stream: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub stream_incarnation: &'a str,
    pub stream_sequence: u64,
    pub consumer: &'a str,
    pub consumer_sequence: u64,
    pub message_id: Option<&'a str>,
    pub priority: &'a str,
    pub classification: &'a str,
    pub labels: &'a str,
    pub labels_list: &'a [String],
    /// Hashes of the payload: `payload_info.sha256` is over the bytes as received,
    /// `normalized_payload_sha256` over the normalized payload JSON as serialized.
    pub payload_info: &'a PayloadInfo,
    pub normalized_payload_sha256: String,
    pub security_labels: Option<&'a Value>,
    /// Event metadata of the delivery that wrote this sidecar.
    pub metadata: &'a EventMetadata,
    /// The configured static `object_metadata` pairs.
    pub object_metadata: &'a std::collections::BTreeMap<String, String>,
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
        ObjectFormat::Envelope => serde_json::to_vec(&StoredObject::new(env)),
        ObjectFormat::Payload => Ok(env.payload.json().as_bytes().to_vec()),
    }
    .map_err(|e| format!("encode object: {e}"))?;
    let plain_len = json.len();
    let primary = encode(cfg, json)?;
    check_size(cfg, "object", primary.len())?;

    let sidecar = if with_sidecar {
        let doc = Sidecar {
            schema: SIDECAR_SCHEMA,
            schema_version: SCHEMA_VERSION,
            object_key: primary_key,
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
        };
        // The sidecar is never compressed: it is small and read by tools.
        let bytes = serde_json::to_vec(&doc).map_err(|e| format!("encode sidecar: {e}"))?;
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
