//! The dead-letter record (`svc.dead-letter.v1`): the failure, where the original lives, the
//! payload's digest and the allow-listed headers, built from the raw message (pure).

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::config::{DeadLetterConfig, DEAD_LETTER_SCHEMA, MAX_HEADER_VALUE_BYTES};
use crate::message::envelope::{hex_sha256, stream_place, Envelope, RawMessage, MESSAGE_ID_HEADER};
use crate::message::failure::FailureClass;
use crate::message::labels::LabelRejection;
use crate::message::metadata::MetadataError;
use crate::message::refusal::Refusal;
use crate::text::rfc3339::format_rfc3339_nanos;

/// One problem of a failure, value-free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailureProblem {
    /// Full field path, e.g. `security_labels.releasability[1]`.
    pub field: String,
    /// Stable reason code, e.g. `not_in_vocabulary`.
    pub reason: &'static str,
}

/// Why a message can never be delivered (a permanent pre-sink failure). Every text here is
/// built from field names and static reasons: never from message content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Which check refused it: `security_labels`, `message_metadata`, ...
    pub stage: &'static str,
    /// The first failed field (full path), or the stage name for the whole input.
    pub field: String,
    /// Reason code of the first problem.
    pub reason: &'static str,
    /// One-line, value-free description.
    pub message: String,
    /// Every problem found (bounded by the check that produced them).
    pub problems: Vec<FailureProblem>,
    /// A size limit's measured value and the limit (size refusals only; never the content).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<FailureSize>,
}

/// `failure.size` of a DLQ record: what was measured and the limit it exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FailureSize {
    pub measured: u64,
    pub limit: u64,
}

impl From<&Refusal> for Failure {
    fn from(r: &Refusal) -> Self {
        let first = r.first();
        Failure {
            stage: r.stage,
            field: first.field.clone(),
            reason: first.code,
            message: r.to_string(),
            problems: r
                .problems
                .iter()
                .map(|p| FailureProblem {
                    field: p.field.clone(),
                    reason: p.code,
                })
                .collect(),
            size: r.measured.map(|m| FailureSize {
                measured: m.measured,
                limit: m.limit,
            }),
        }
    }
}

impl Failure {
    /// A failure of some other pre-sink check; `message` must not contain message content.
    pub fn new(stage: &'static str, field: &str, reason: &'static str, message: String) -> Self {
        Failure {
            stage,
            field: field.to_string(),
            reason,
            message,
            problems: vec![FailureProblem {
                field: field.to_string(),
                reason,
            }],
            size: None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

pub(super) fn label_field(field: &str) -> String {
    if field.is_empty() {
        "security_labels".to_string()
    } else {
        format!("security_labels.{field}")
    }
}

impl From<&LabelRejection> for Failure {
    fn from(r: &LabelRejection) -> Self {
        let first = r.first();
        Failure {
            stage: "security_labels",
            field: label_field(&first.field),
            reason: first.reason.code(),
            message: r.to_string(),
            problems: r
                .errors
                .iter()
                .map(|e| FailureProblem {
                    field: label_field(&e.field),
                    reason: e.reason.code(),
                })
                .collect(),
            size: None,
        }
    }
}

impl From<&MetadataError> for Failure {
    fn from(e: &MetadataError) -> Self {
        Failure::new(
            "message_metadata",
            &format!("message_metadata.{}", e.field.as_str()),
            e.reason.code(),
            e.to_string(),
        )
    }
}

/// Where the original message lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Original {
    pub subject: String,
    pub stream: String,
    /// The stream's incarnation (`broker/incarnation.rs`), when known.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub stream_incarnation: String,
    pub stream_sequence: u64,
    pub consumer: String,
    pub consumer_sequence: u64,
    pub delivery_count: u64,
    pub message_id: Option<String>,
    /// RFC 3339 time the broker stored it, when known.
    pub published_at: Option<String>,
}

/// Digest and size of the payload (never its body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PayloadDigest {
    /// Plain SHA-256 (hex) of the payload bytes; absent when the payload would be encrypted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Instead of `sha256` when `payload_encryption` applies to the subject: the keyed digest
    /// that `payload_info.sha256` of a stored record would hold (`docs/payload-protection.md`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hmac_sha256: Option<String>,
    pub size_bytes: u64,
}

/// The DLQ record (`svc.dead-letter.v1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Record {
    pub schema: &'static str,
    /// RFC 3339 time the runner decided the failure.
    pub failed_at: String,
    pub failure: Failure,
    pub original: Original,
    pub payload: PayloadDigest,
    /// Only `dead_letter.include_headers`, present ones.
    pub headers: BTreeMap<String, String>,
    /// `custody.runner_id`, with custody checkpoints on: the runner whose checkpoints list
    /// the original as a gap.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub runner_id: String,
}

/// A record ready to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// `Nats-Msg-Id` of the DLQ message: one per original stream position, so a redelivered
    /// original that is dead-lettered again is dropped by the stream's duplicate window.
    pub msg_id: String,
    pub reason: &'static str,
    pub body: Vec<u8>,
}

impl DeadLetter {
    /// Builds the record of a permanent pre-sink failure (pure).
    pub fn build(
        raw: &RawMessage,
        failure: &Failure,
        failed_at_unix_nanos: i128,
        cfg: &DeadLetterConfig,
    ) -> DeadLetter {
        Self::build_with_digest(raw, failure, failed_at_unix_nanos, cfg, None)
    }

    /// [`Self::build`], with the keyed payload digest replacing the plain SHA-256 when the
    /// payload would be encrypted (no unkeyed digest of such a payload leaves the runner).
    pub fn build_with_digest(
        raw: &RawMessage,
        failure: &Failure,
        failed_at_unix_nanos: i128,
        cfg: &DeadLetterConfig,
        keyed_digest: Option<String>,
    ) -> DeadLetter {
        let headers = included_headers(cfg, |name| raw.header(name));
        let original = Original {
            subject: raw.subject.clone(),
            stream: raw.stream.to_string(),
            stream_incarnation: raw.stream_incarnation.to_string(),
            stream_sequence: raw.stream_sequence,
            consumer: raw.consumer.to_string(),
            consumer_sequence: raw.consumer_sequence,
            delivery_count: raw.delivery_count,
            message_id: raw.header(MESSAGE_ID_HEADER).map(bounded),
            published_at: raw.published_unix_nanos.map(format_rfc3339_nanos),
        };
        let payload = PayloadDigest {
            sha256: keyed_digest.is_none().then(|| hex_sha256(&raw.data)),
            hmac_sha256: keyed_digest,
            size_bytes: raw.data.len() as u64,
        };
        let meta = (original, payload, headers);
        Self::assemble(failure, failed_at_unix_nanos, meta, &cfg.runner_id)
    }

    /// Builds the record of a permanent sink failure (pure). The sink has the envelope, not
    /// the raw message: the payload digest is the envelope's `payload_info` (already the
    /// keyed digest when the payload was encrypted), and the headers are those of
    /// `include_headers` that the envelope kept (`envelope.keep_headers`). The failure names
    /// the sink and the error class, never the sink's message (a database error may quote the
    /// refused value).
    pub fn build_for_sink(
        env: &Envelope,
        (sink, class): (&str, FailureClass),
        failed_at_unix_nanos: i128,
        cfg: &DeadLetterConfig,
    ) -> DeadLetter {
        let code = class.code();
        let failure = Failure::new(
            "sink",
            &format!("sink.{sink}"),
            code,
            format!("sink {sink}: permanent write failure ({code})"),
        );
        let headers = included_headers(cfg, |name| {
            env.metadata.headers.get(name).map(String::as_str)
        });
        let original = Original {
            subject: env.subject.clone(),
            stream: env.stream.to_string(),
            stream_incarnation: env.stream_incarnation.to_string(),
            stream_sequence: env.stream_sequence,
            consumer: env.consumer.to_string(),
            consumer_sequence: env.consumer_sequence,
            delivery_count: env.metadata.delivery_count,
            // A key that failed its grammar may have been made from the message id: that id
            // is the offending value, and stays out of the record.
            message_id: match class {
                FailureClass::InvalidKey => env.message_id.as_ref().map(|_| WITHHELD_ID.into()),
                _ => env.message_id.as_deref().map(bounded),
            },
            published_at: env.metadata.published_at.map(|t| t.as_str().to_string()),
        };
        // An encrypted envelope carries the keyed digest in `payload_info.sha256`: label it so.
        let digest = env.payload_info.sha256.clone();
        let (sha256, hmac_sha256) = if env.payload_info.keyed {
            (None, Some(digest))
        } else {
            (Some(digest), None)
        };
        let payload = PayloadDigest {
            sha256,
            hmac_sha256,
            size_bytes: env.payload_info.size_bytes,
        };
        let meta = (original, payload, headers);
        Self::assemble(&failure, failed_at_unix_nanos, meta, &cfg.runner_id)
    }

    fn assemble(
        failure: &Failure,
        failed_at_unix_nanos: i128,
        (original, payload, headers): (Original, PayloadDigest, BTreeMap<String, String>),
        runner_id: &str,
    ) -> DeadLetter {
        let msg_id = format!(
            "svc-dlq:{}",
            stream_place(
                &original.stream,
                &original.stream_incarnation,
                original.stream_sequence,
                ":"
            )
        );
        let record = Record {
            schema: DEAD_LETTER_SCHEMA,
            failed_at: format_rfc3339_nanos(failed_at_unix_nanos),
            failure: failure.clone(),
            original,
            payload,
            headers,
            runner_id: runner_id.to_string(),
        };
        DeadLetter {
            msg_id,
            reason: failure.reason,
            // Serializing plain strings and integers cannot fail.
            body: serde_json::to_vec(&record).unwrap_or_default(),
        }
    }
}

impl DeadLetter {
    /// The record marked as dead-lettered by `svc replay`: a `replayed` field (`true`) is
    /// added, no existing field changes, and the message id is `svc-dlq-replay:...`, so a
    /// record the runner stored for the same original is not taken for this one.
    pub fn replayed(self) -> DeadLetter {
        let mut value: serde_json::Value = match serde_json::from_slice(&self.body) {
            Ok(v) => v,
            Err(_) => return self,
        };
        if let Some(record) = value.as_object_mut() {
            record.insert("replayed".into(), serde_json::Value::Bool(true));
        }
        DeadLetter {
            msg_id: self.msg_id.replacen("svc-dlq:", "svc-dlq-replay:", 1),
            reason: self.reason,
            body: serde_json::to_vec(&value).unwrap_or(self.body),
        }
    }
}

impl DeadLetter {
    /// A record of `svc dlq redrive` (already [`Self::replayed`]): `redriven_from` names the
    /// dead-letter record it replaces (its sequence in the dead-letter stream), and the
    /// message id is `svc-dlq-redrive:<that sequence>:...`. So the stream never calls it a
    /// duplicate of the record being redriven (which is removed once this one is stored), while
    /// a resumed redrive of the same record finds its own earlier copy.
    pub fn redriven(self, dead_letter_sequence: u64) -> DeadLetter {
        let mut value: serde_json::Value = match serde_json::from_slice(&self.body) {
            Ok(v) => v,
            Err(_) => return self,
        };
        if let Some(record) = value.as_object_mut() {
            record.insert("redriven_from".into(), dead_letter_sequence.into());
        }
        let place = self
            .msg_id
            .split_once(':')
            .map_or(self.msg_id.as_str(), |(_, rest)| rest);
        DeadLetter {
            msg_id: format!("svc-dlq-redrive:{dead_letter_sequence}:{place}"),
            reason: self.reason,
            body: serde_json::to_vec(&value).unwrap_or(self.body),
        }
    }
}

/// `original.message_id` of a sink's `invalid_key` record: the id may be the refused value.
pub const WITHHELD_ID: &str = "(withheld: the object key made from it was invalid)";

/// A publisher's value as the record holds it: whole up to [`MAX_HEADER_VALUE_BYTES`], else a
/// size note. JSON escapes a control character in six bytes, so a 20,000-byte id would make
/// a 120 KB record that a DLQ stream with a 64 KiB `max_msg_size` refuses, NAKed forever.
pub(super) fn bounded(v: &str) -> String {
    if v.len() > MAX_HEADER_VALUE_BYTES {
        format!("(omitted: {} bytes)", v.len())
    } else {
        v.to_string()
    }
}

/// The configured `include_headers` that are present, long values replaced by a size note.
pub(super) fn included_headers<'a>(
    cfg: &DeadLetterConfig,
    lookup: impl Fn(&str) -> Option<&'a str>,
) -> BTreeMap<String, String> {
    cfg.include_headers
        .iter()
        .filter_map(|name| lookup(name).map(|v| (name.clone(), bounded(v))))
        .collect()
}
