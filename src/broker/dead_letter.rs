//! The dead-letter queue (DLQ): where a message that can never be delivered goes, as a
//! sanitized failure record, before the original is acknowledged.
//!
//! Flow (see `docs/dead-letter.md`): the normalizer finds a permanent pre-sink failure (an
//! invalid security label profile, an invalid metadata header, ...) and builds a [`DeadLetter`]
//! from the raw message and the [`Failure`] (pure: [`DeadLetter::build`]). The ack thread
//! publishes it with [`DeadLetterPublisher::publish`], which returns only when the broker has
//! stored it in a stream (JetStream PubAck); only then is the original ACKed. Any publish
//! failure is an error, so the original is NAKed and comes back.
//!
//! What the record holds: schema `svc.dead-letter.v1`, the failure (stage, field, reason code,
//! value-free message, every problem found), where the original lives (subject, stream,
//! stream and consumer sequence, consumer, delivery count, publisher message ID, broker time),
//! the payload's SHA-256 and size, and only the headers an operator allow-listed. Never the
//! payload body, never the offending value, never a secret-looking header: the original stays
//! in its stream (by sequence) for anyone entitled to read it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::document::grammar::is_header_name;
use crate::document::grammar::looks_secret;
use crate::document::reader::{ObjectReader, Problems};
use crate::message::envelope::{hex_sha256, stream_place, Envelope, RawMessage, MESSAGE_ID_HEADER};
use crate::message::failure::FailureClass;
use crate::message::labels::LabelRejection;
use crate::message::metadata::MetadataError;
use crate::message::refusal::Refusal;
use crate::message::subject::SubjectPattern;
use crate::text::peer::{PeerText, PEER_TEXT_MAX_CHARS};
use crate::text::rfc3339::format_rfc3339_nanos;

/// Schema of the DLQ record.
pub const DEAD_LETTER_SCHEMA: &str = "svc.dead-letter.v1";
/// Header carrying the failure's reason code on the DLQ message (for consumers that route
/// without parsing the body).
pub const REASON_HEADER: &str = "Svc-Dlq-Reason";
pub const DEFAULT_PUBLISH_TIMEOUT_MS: i64 = 5000;
/// Most headers an operator may copy into the record.
pub const MAX_INCLUDE_HEADERS: usize = 32;
/// A copied header value longer than this is replaced by a marker (records stay small).
pub const MAX_HEADER_VALUE_BYTES: usize = 1024;

/// The `dead_letter` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterConfig {
    /// Defaults to false: no DLQ (see `docs/dead-letter.md` for what happens then).
    pub enabled: bool,
    /// Literal subject the records are published to; a stream must capture it.
    pub subject: String,
    /// Original headers copied into the record, by exact name. Defaults to none.
    pub include_headers: Vec<String>,
    /// How long to wait for the broker's confirmation. 10 to 60000 ms; defaults to 5000.
    pub publish_timeout: Duration,
    /// When set, the publish must land in this stream (`Nats-Expected-Stream`).
    pub expected_stream: Option<String>,
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        DeadLetterConfig {
            enabled: false,
            subject: String::new(),
            include_headers: Vec::new(),
            publish_timeout: Duration::from_millis(DEFAULT_PUBLISH_TIMEOUT_MS as u64),
            expected_stream: None,
        }
    }
}

impl DeadLetterConfig {
    /// Reads the `dead_letter` block (absent = disabled).
    pub fn read(r: Option<ObjectReader<'_>>) -> DeadLetterConfig {
        let Some(mut r) = r else {
            return DeadLetterConfig::default();
        };
        let enabled = r.bool_or("enabled", false);
        let subject = r.opt_string("subject").unwrap_or_default();
        if subject.is_empty() {
            if enabled {
                r.problem("subject", "is required when dead_letter.enabled is true");
            }
        } else {
            match SubjectPattern::parse(&subject) {
                Err(e) => r.problem("subject", e.to_string()),
                Ok(p) if !p.is_literal() => {
                    r.problem("subject", "must be a literal subject without wildcards")
                }
                Ok(_) if subject.starts_with('$') || subject.starts_with("_INBOX.") => r.problem(
                    "subject",
                    "must not be in a reserved subject tree ($... or _INBOX.)",
                ),
                Ok(_) => {}
            }
        }
        let include_headers = r.string_list("include_headers");
        if include_headers.len() > MAX_INCLUDE_HEADERS {
            r.problem(
                "include_headers",
                format!("must have at most {MAX_INCLUDE_HEADERS} entries"),
            );
        }
        for (i, h) in include_headers.iter().enumerate() {
            let path = format!("{}[{i}]", r.path_of("include_headers"));
            if !is_header_name(h) {
                r.problems().push(
                    path,
                    "must be a header name without spaces or control characters",
                );
            } else if looks_secret(h) {
                r.problems().push(
                    path,
                    "looks like a secret-bearing header and is never copied",
                );
            }
        }
        let publish_timeout = Duration::from_millis(r.int_in(
            "publish_timeout_ms",
            DEFAULT_PUBLISH_TIMEOUT_MS,
            10,
            60_000,
        ) as u64);
        let expected_stream = r.opt_string("expected_stream");
        if let Some(s) = &expected_stream {
            let ok = !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                r.problem(
                    "expected_stream",
                    "must be 1 to 64 characters of A-Z a-z 0-9 _ -",
                );
            }
        }
        r.finish();
        DeadLetterConfig {
            enabled,
            subject,
            include_headers,
            publish_timeout,
            expected_stream,
        }
    }

    /// Checks against the rest of the runtime config: the runner must not consume its own
    /// dead letters, and the record must not copy the headers whose values fail validation
    /// (that would echo the offending value).
    pub fn cross_check(&self, consumed: &[String], value_headers: &[&str], problems: &Problems) {
        if self.enabled && !self.subject.is_empty() {
            let patterns = consumed
                .iter()
                .filter_map(|c| SubjectPattern::parse(c).ok());
            for p in patterns {
                if p.matches(&self.subject) {
                    problems.push(
                        "dead_letter.subject",
                        "must not match nats.subject (the runner would consume its own dead letters)",
                    );
                }
            }
        }
        for (i, h) in self.include_headers.iter().enumerate() {
            if value_headers.contains(&h.as_str()) {
                problems.push(
                    format!("dead_letter.include_headers[{i}]"),
                    "names a validated header whose value may be the reason of the failure; it is never copied",
                );
            }
        }
    }
}

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

fn label_field(field: &str) -> String {
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
        Self::assemble(failure, failed_at_unix_nanos, original, payload, headers)
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
        Self::assemble(&failure, failed_at_unix_nanos, original, payload, headers)
    }

    fn assemble(
        failure: &Failure,
        failed_at_unix_nanos: i128,
        original: Original,
        payload: PayloadDigest,
        headers: BTreeMap<String, String>,
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
fn bounded(v: &str) -> String {
    if v.len() > MAX_HEADER_VALUE_BYTES {
        format!("(omitted: {} bytes)", v.len())
    } else {
        v.to_string()
    }
}

/// The configured `include_headers` that are present, long values replaced by a size note.
fn included_headers<'a>(
    cfg: &DeadLetterConfig,
    lookup: impl Fn(&str) -> Option<&'a str>,
) -> BTreeMap<String, String> {
    cfg.include_headers
        .iter()
        .filter_map(|name| lookup(name).map(|v| (name.clone(), bounded(v))))
        .collect()
}

/// The broker's confirmation of a stored DLQ record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubAck {
    pub stream: String,
    pub sequence: u64,
    /// The stream already held a record with this message ID (an earlier delivery's).
    pub duplicate: bool,
}

/// A DLQ publish that was not confirmed. Every variant is retryable: the original message is
/// not acknowledged and comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DlqError {
    /// No stream captures the DLQ subject (the broker answered "no responders").
    NoStream,
    /// No confirmation within `publish_timeout_ms`.
    Timeout { phase: &'static str, ms: u128 },
    /// The stream refused the message (limits, expected stream mismatch, ...).
    Rejected { code: u64, description: String },
    /// The confirmation came from another stream than `expected_stream`.
    WrongStream { stream: String },
    /// The confirmation could not be read.
    BadAck,
    /// The connection failed.
    Connection(String),
    /// The stream called the record a duplicate, but what it holds under the record's id is
    /// not this record (a forged one published first, or one of the same message with
    /// another failure), or could not be read back. [`DeadLetterPublisher::publish`] then
    /// stores the record once more without a message id; this error remains only when the
    /// stream calls that one a duplicate too (no honest stream does). The message stays
    /// unacknowledged.
    ForeignDuplicate {
        stream: String,
        sequence: u64,
        why: &'static str,
    },
}

impl fmt::Display for DlqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DlqError::NoStream => f.write_str("dlq publish: no stream captures the subject"),
            DlqError::Timeout { phase, ms } => {
                write!(f, "dlq publish: {phase} timed out after {ms} ms")
            }
            DlqError::Rejected { code, description } => {
                write!(
                    f,
                    "dlq publish: refused by the stream ({code}: {})",
                    PeerText::new(description)
                )
            }
            DlqError::WrongStream { stream } => {
                write!(
                    f,
                    "dlq publish: stored in unexpected stream {}",
                    PeerText::new(stream)
                )
            }
            DlqError::BadAck => f.write_str("dlq publish: unreadable confirmation"),
            DlqError::Connection(e) => write!(f, "dlq publish: connection: {e}"),
            DlqError::ForeignDuplicate {
                stream,
                sequence,
                why,
            } => write!(
                f,
                "dlq publish: stream {} calls the record a duplicate of its message {sequence}, \
                 which {why}",
                PeerText::new(stream)
            ),
        }
    }
}

impl std::error::Error for DlqError {}

/// Publishes DLQ records and waits for the broker's confirmation.
pub struct DeadLetterPublisher {
    nc: nats::Connection,
    cfg: DeadLetterConfig,
}

impl DeadLetterPublisher {
    pub fn new(nc: nats::Connection, cfg: DeadLetterConfig) -> Self {
        DeadLetterPublisher { nc, cfg }
    }

    /// Publishes one record through JetStream and returns the broker's PubAck: the record is
    /// stored in a stream. A request with its own inbox and an explicit flush, so one publish
    /// costs a round trip and not the client's 5 ms flush delay; bounded by the timeout.
    ///
    /// A duplicate PubAck counts as stored only when the stream holds this very record under
    /// the id ([`Self::check_duplicate`]). When it holds another one (a publisher allowed on
    /// the DLQ subject can write any record under the next id first), the record is published
    /// again without a message id, which no stream drops as a duplicate: the original is
    /// acknowledged only once its own record is stored, and a forger who keeps the id taken
    /// cannot hold it back. The cost: while the id is taken, each redelivery of the original
    /// stores one more copy (readers de-duplicate on `original`'s stream, incarnation and
    /// sequence). All of it within one `publish_timeout_ms`.
    pub fn publish(&self, dl: &DeadLetter) -> Result<PubAck, DlqError> {
        let deadline = Instant::now() + self.cfg.publish_timeout;
        let ack = self.send(dl, true, deadline)?;
        if !ack.duplicate {
            return Ok(ack);
        }
        match self.check_duplicate(dl, &ack, deadline) {
            Ok(()) => Ok(ack),
            Err(DlqError::ForeignDuplicate { why, .. }) => {
                let ours = self.send(dl, false, deadline)?;
                if ours.duplicate {
                    return Err(DlqError::ForeignDuplicate {
                        stream: ours.stream,
                        sequence: ours.sequence,
                        why: "cannot be: the record carried no message id",
                    });
                }
                log::warn!(
                    "dead-letter queue: stream {} holds under {} its message {}, which {why}; \
                     the record is stored again without a message id as sequence {}",
                    PeerText::new(&ack.stream),
                    PeerText::new(&dl.msg_id),
                    ack.sequence,
                    ours.sequence
                );
                Ok(ours)
            }
            Err(e) => Err(e),
        }
    }

    /// The headers of the DLQ message: `Nats-Msg-Id` (when `with_id`), the content type, the
    /// reason and, when configured, the expected stream. The stream stores them as they are.
    fn headers(&self, dl: &DeadLetter, with_id: bool) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        if with_id {
            h.push((MESSAGE_ID_HEADER, dl.msg_id.clone()));
        }
        h.push(("Content-Type", "application/json".to_string()));
        h.push((REASON_HEADER, dl.reason.to_string()));
        if let Some(stream) = &self.cfg.expected_stream {
            h.push(("Nats-Expected-Stream", stream.clone()));
        }
        h
    }

    /// One publish and its confirmation, by `deadline`.
    fn send(&self, dl: &DeadLetter, with_id: bool, deadline: Instant) -> Result<PubAck, DlqError> {
        let timeout = self.cfg.publish_timeout;
        let conn = |e: std::io::Error| DlqError::Connection(e.kind().to_string());
        let mut headers = nats::HeaderMap::new();
        for (name, value) in self.headers(dl, with_id) {
            headers.insert(name, value);
        }
        let inbox = self.nc.new_inbox();
        let sub = self.nc.subscribe(&inbox).map_err(conn)?;
        self.nc
            .publish_with_reply_or_headers(
                &self.cfg.subject,
                Some(&inbox),
                Some(&headers),
                &dl.body,
            )
            .map_err(conn)?;
        let left = || deadline.saturating_duration_since(Instant::now());
        self.nc.flush_timeout(left()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                DlqError::Timeout {
                    phase: "flush",
                    ms: timeout.as_millis(),
                }
            } else {
                conn(e)
            }
        })?;
        let reply = sub.next_timeout(left()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                DlqError::Timeout {
                    phase: "confirmation",
                    ms: timeout.as_millis(),
                }
            } else {
                conn(e)
            }
        })?;
        let _ = sub.unsubscribe();
        if reply.is_no_responders() {
            return Err(DlqError::NoStream);
        }
        let ack = parse_pub_ack(&reply.data)?;
        if let Some(expected) = &self.cfg.expected_stream {
            if &ack.stream != expected {
                return Err(DlqError::WrongStream { stream: ack.stream });
            }
        }
        Ok(ack)
    }

    /// Whether the stream's message under our id (read back with `STREAM.MSG.GET`) is this
    /// record: see [`same_record`]. By `deadline`.
    fn check_duplicate(
        &self,
        dl: &DeadLetter,
        ack: &PubAck,
        deadline: Instant,
    ) -> Result<(), DlqError> {
        let foreign = |why| DlqError::ForeignDuplicate {
            stream: ack.stream.clone(),
            sequence: ack.sequence,
            why,
        };
        if !is_stream_name(&ack.stream) {
            return Err(DlqError::BadAck);
        }
        let request = serde_json::json!({ "seq": ack.sequence }).to_string();
        let subject = format!("$JS.API.STREAM.MSG.GET.{}", ack.stream);
        let reply = self
            .nc
            .request_timeout(
                &subject,
                request,
                deadline.saturating_duration_since(Instant::now()),
            )
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut => DlqError::Timeout {
                    phase: "duplicate check",
                    ms: self.cfg.publish_timeout.as_millis(),
                },
                _ => DlqError::Connection(e.kind().to_string()),
            })?;
        if reply.data.len() > MAX_STORED_RECORD_REPLY_BYTES {
            return Err(foreign("could not be read back (its answer is too large)"));
        }
        let stored =
            stored_message(&reply.data).ok_or_else(|| foreign("could not be read back"))?;
        same_record(&stored, dl, &self.cfg.subject, &self.headers(dl, true)).map_err(foreign)
    }
}

/// Largest `STREAM.MSG.GET` answer read back: a record is a few KiB (values are bounded to
/// [`MAX_HEADER_VALUE_BYTES`]), base64 adds a third, headers a little.
const MAX_STORED_RECORD_REPLY_BYTES: usize = 256 * 1024;

/// A JetStream stream name as the broker can name it in a subject: no wildcard, separator or
/// white space.
fn is_stream_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && !s
            .bytes()
            .any(|b| matches!(b, b'.' | b'*' | b'>') || b.is_ascii_whitespace() || b < 0x20)
}

/// A message as `STREAM.MSG.GET` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredMessage {
    subject: String,
    /// The header block (`hdrs`, base64), empty without headers.
    headers: Vec<u8>,
    data: Vec<u8>,
}

/// The message of a `STREAM.MSG.GET` answer (`message.subject`, `hdrs` and `data`, base64).
fn stored_message(answer: &[u8]) -> Option<StoredMessage> {
    stored_message_of(&serde_json::from_slice(answer).ok()?)
}

/// [`stored_message`] of an answer already read as JSON.
fn stored_message_of(v: &serde_json::Value) -> Option<StoredMessage> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let m = v.get("message")?;
    let headers = match m.get("hdrs") {
        None => Vec::new(),
        Some(h) => b64.decode(h.as_str()?).ok()?,
    };
    Some(StoredMessage {
        subject: m.get("subject")?.as_str()?.to_string(),
        headers,
        data: b64.decode(m.get("data")?.as_str()?).ok()?,
    })
}

/// A message of the dead-letter stream as stored (`svc dlq show`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub subject: String,
    pub data: Vec<u8>,
}

/// Reads the message at `sequence` of `stream` back with `STREAM.MSG.GET` (its answer bounded
/// as the duplicate check's); `None` when the stream holds no message there.
pub fn read_back(
    nc: &nats::Connection,
    stream: &str,
    sequence: u64,
    timeout: Duration,
) -> Result<Option<StoredRecord>, String> {
    let Some(v) = msg_get(nc, stream, sequence, timeout, MAX_STORED_RECORD_REPLY_BYTES)? else {
        return Ok(None);
    };
    let m = stored_message_of(&v)
        .ok_or_else(|| format!("{stream} sequence {sequence}: the answer cannot be read"))?;
    Ok(Some(StoredRecord {
        subject: m.subject,
        data: m.data,
    }))
}

/// A message of the source stream as `STREAM.MSG.GET` returns it (`svc dlq redrive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOriginal {
    pub subject: String,
    /// The header block as stored (`NATS/1.0` and its lines), empty without headers.
    pub headers: Vec<u8>,
    pub data: Vec<u8>,
    /// When the broker stored it (the answer's `time`), Unix nanoseconds.
    pub published_unix_nanos: Option<i128>,
}

/// Reads the message at `sequence` of `stream` with `STREAM.MSG.GET` (read-only; no consumer,
/// nothing acknowledged), its answer bounded to `max_answer_bytes` and within `timeout`.
/// `None` when the stream holds no message there. An answer for another sequence, or one
/// that cannot be read, is an error: the stream's answer decides nothing else.
pub fn fetch_stored(
    nc: &nats::Connection,
    stream: &str,
    sequence: u64,
    timeout: Duration,
    max_answer_bytes: usize,
) -> Result<Option<StoredOriginal>, String> {
    let Some(v) = msg_get(nc, stream, sequence, timeout, max_answer_bytes)? else {
        return Ok(None);
    };
    if v["message"]["seq"].as_u64() != Some(sequence) {
        return Err(format!(
            "{stream} sequence {sequence}: the answer names another sequence"
        ));
    }
    let m = stored_message_of(&v)
        .ok_or_else(|| format!("{stream} sequence {sequence}: the answer cannot be read"))?;
    let published_unix_nanos = v["message"]["time"]
        .as_str()
        .and_then(crate::text::rfc3339::parse_rfc3339_nanos);
    Ok(Some(StoredOriginal {
        subject: m.subject,
        headers: m.headers,
        data: m.data,
        published_unix_nanos,
    }))
}

/// One `STREAM.MSG.GET` of `stream` at `sequence`: the answer as JSON, `None` for the
/// broker's 404 (no message there), an error naming the stream and sequence otherwise.
fn msg_get(
    nc: &nats::Connection,
    stream: &str,
    sequence: u64,
    timeout: Duration,
    max_answer_bytes: usize,
) -> Result<Option<serde_json::Value>, String> {
    if !is_stream_name(stream) {
        return Err(format!("{} is not a stream name", PeerText::new(stream)));
    }
    let request = serde_json::json!({ "seq": sequence }).to_string();
    let subject = format!("$JS.API.STREAM.MSG.GET.{stream}");
    let reply = super::consumer_shape::flushed_request(nc, &subject, request.as_bytes(), timeout)
        .map_err(|e| format!("reading {stream} sequence {sequence}: {e}"))?;
    if reply.data.len() > max_answer_bytes {
        return Err(format!(
            "{stream} sequence {sequence}: the answer is larger than {} KiB",
            max_answer_bytes / 1024
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&reply.data)
        .map_err(|_| format!("{stream} sequence {sequence}: the answer is not JSON"))?;
    if v["error"]["code"] == 404 {
        return Ok(None);
    }
    if let Some(e) = v["error"]["description"].as_str() {
        return Err(format!(
            "reading {stream} sequence {sequence}: {}",
            PeerText::new(e)
        ));
    }
    Ok(Some(v))
}

/// Largest answer to a `STREAM.MSG.DELETE` read.
const MAX_DELETE_REPLY_BYTES: usize = 16 * 1024;

/// [`delete_stored`], once the broker said that `stream` is still of `incarnation`
/// (`STREAM.INFO`, flushed at once): a removal names a record by sequence alone, and a stream
/// deleted and created again numbers other records from 1. Both requests share `timeout`.
pub fn delete_stored_of(
    nc: &nats::Connection,
    stream: &str,
    incarnation: &str,
    sequence: u64,
    timeout: Duration,
) -> Result<bool, String> {
    if !is_stream_name(stream) {
        return Err(format!("{} is not a stream name", PeerText::new(stream)));
    }
    let deadline = Instant::now() + timeout;
    let now = super::incarnation::read_within(nc, stream, timeout)
        .map_err(|e| format!("stream {stream}: {}", PeerText::new(&e.to_string())))?;
    if *now != *incarnation {
        return Err(format!(
            "stream {stream} was created again (incarnation {} when it was read, {now} now): \
             record {sequence} not removed",
            PeerText::new(incarnation)
        ));
    }
    delete_stored(
        nc,
        stream,
        sequence,
        deadline.saturating_duration_since(Instant::now()),
    )
}

/// Removes the message at `sequence` from `stream` (`STREAM.MSG.DELETE`, not erased: the
/// record was delivered, not secret). `Ok(false)` when the stream no longer held it (a redrive
/// resumed after the delete, or an operator removed it).
pub fn delete_stored(
    nc: &nats::Connection,
    stream: &str,
    sequence: u64,
    timeout: Duration,
) -> Result<bool, String> {
    if !is_stream_name(stream) {
        return Err(format!("{} is not a stream name", PeerText::new(stream)));
    }
    let request = serde_json::json!({ "seq": sequence, "no_erase": true }).to_string();
    let subject = format!("$JS.API.STREAM.MSG.DELETE.{stream}");
    let reply = super::consumer_shape::flushed_request(nc, &subject, request.as_bytes(), timeout)
        .map_err(|e| format!("deleting {stream} sequence {sequence}: {e}"))?;
    let v: serde_json::Value = (reply.data.len() <= MAX_DELETE_REPLY_BYTES)
        .then(|| serde_json::from_slice(&reply.data).ok())
        .flatten()
        .ok_or_else(|| format!("deleting {stream} sequence {sequence}: unreadable answer"))?;
    if v["success"] == true {
        return Ok(true);
    }
    let description = v["error"]["description"].as_str().unwrap_or("no reason");
    if v["error"]["code"] == 404 || description.contains("no message found") {
        return Ok(false);
    }
    Err(format!(
        "deleting {stream} sequence {sequence}: {}",
        PeerText::new(description)
    ))
}

/// The fields of a record that two honest publishes of the same failure may differ in: when
/// the runner decided (`failed_at`), and which delivery it was (`original.delivery_count`,
/// `original.consumer_sequence`: the broker numbers every delivery, redeliveries included).
/// Everything else follows from the message, its stream position and the runner's
/// configuration, and must be equal.
const VARYING_FIELDS: [(&str, &str); 3] = [
    ("", "failed_at"),
    ("original", "delivery_count"),
    ("original", "consumer_sequence"),
];

/// Ok when `stored` is the record `dl` as this runner publishes it: on the DLQ subject, with
/// exactly our headers (`ours`, in any order and letter case of names) and a body equal to
/// ours in every field but [`VARYING_FIELDS`] (no field more, none less). A record under our
/// id with another failure, other headers or another original is not ours, even of the same
/// message: the one stored must say what happened. Err: why not.
fn same_record(
    stored: &StoredMessage,
    dl: &DeadLetter,
    subject: &str,
    ours: &[(&'static str, String)],
) -> Result<(), &'static str> {
    if stored.subject != subject {
        return Err("is on another subject");
    }
    let mut theirs = header_lines(&stored.headers).ok_or("has unreadable headers")?;
    let mut mine: Vec<(String, String)> = ours
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
        .collect();
    theirs.sort();
    mine.sort();
    if theirs != mine {
        return Err("has other headers");
    }
    let parse = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).ok();
    let (Some(mut a), Some(mut b)) = (parse(&stored.data), parse(&dl.body)) else {
        return Err("is not a record");
    };
    if a["schema"] != DEAD_LETTER_SCHEMA {
        return Err("is not a record");
    }
    let identity = |v: &serde_json::Value| {
        let o = &v["original"];
        (
            o["stream"].clone(),
            o["stream_incarnation"].clone(),
            o["stream_sequence"].clone(),
            o["subject"].clone(),
            v["payload"].clone(),
        )
    };
    if identity(&a) != identity(&b) {
        return Err("is a record of another message");
    }
    for v in [&mut a, &mut b] {
        for (parent, field) in VARYING_FIELDS {
            let holder = if parent.is_empty() {
                Some(&mut *v)
            } else {
                v.get_mut(parent)
            };
            if let Some(obj) = holder.and_then(|h| h.as_object_mut()) {
                obj.remove(field);
            }
        }
    }
    if a == b {
        Ok(())
    } else {
        Err("is a record of this message with another failure, headers or original")
    }
}

/// The `Name: value` lines of a NATS header block (after its `NATS/1.0` status line), names
/// lower-cased; None when the block is not one.
fn header_lines(block: &[u8]) -> Option<Vec<(String, String)>> {
    if block.is_empty() {
        return Some(Vec::new());
    }
    let text = std::str::from_utf8(block).ok()?;
    let mut lines = text.split("\r\n");
    if !lines.next()?.starts_with("NATS/1.0") {
        return None;
    }
    let mut out = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        out.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    Some(out)
}

impl DeadLetterPublisher {
    /// The streams that capture the DLQ subject (JetStream API `STREAM.NAMES` with a subject
    /// filter).
    pub fn capturing_streams(&self) -> Result<Vec<String>, DlqError> {
        let request = serde_json::json!({ "subject": self.cfg.subject }).to_string();
        let reply = self
            .nc
            .request_timeout("$JS.API.STREAM.NAMES", request, self.cfg.publish_timeout)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut => DlqError::Timeout {
                    phase: "stream lookup",
                    ms: self.cfg.publish_timeout.as_millis(),
                },
                _ => DlqError::Connection(e.kind().to_string()),
            })?;
        let v: serde_json::Value =
            serde_json::from_slice(&reply.data).map_err(|_| DlqError::BadAck)?;
        Ok(v.get("streams")
            .and_then(|s| s.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Start-up check, logged only: a missing DLQ stream is not fatal (messages that fail
    /// stay unacknowledged and are redelivered until the stream exists), but the operator
    /// should hear about it before the first bad message does.
    pub fn log_stream_check(&self) {
        match self.capturing_streams() {
            Ok(streams) if streams.is_empty() => log::error!(
                "dead_letter.subject {}: no stream captures it; messages failing pre-sink \
                 checks stay unacknowledged until one does",
                self.cfg.subject
            ),
            Ok(streams) => match &self.cfg.expected_stream {
                Some(e) if !streams.contains(e) => log::error!(
                    "dead_letter.subject {}: captured by {}, not by dead_letter.expected_stream \
                     {e}; dead-letter publishes will be refused",
                    self.cfg.subject,
                    PeerText::new(&streams.join(", "))
                ),
                _ => {
                    log::info!(
                        "dead-letter queue: subject {} captured by stream {}",
                        self.cfg.subject,
                        PeerText::new(&streams.join(", "))
                    );
                    self.log_stream_limits(&streams);
                }
            },
            Err(e) => log::warn!("dead-letter queue: stream check failed: {e}"),
        }
    }

    /// Warns of a capturing stream whose own settings can remove a dead letter the broker
    /// confirmed (atk50a finding 7): the original is ACKed then, and a custody checkpoint lists
    /// its sequence as dead-lettered, so the dead letter must stay.
    fn log_stream_limits(&self, streams: &[String]) {
        for stream in streams.iter().take(MAX_STREAMS_CHECKED) {
            if !is_stream_name(stream) {
                continue;
            }
            let timeout = self.cfg.publish_timeout;
            match super::incarnation::stream_info(&self.nc, stream, timeout) {
                Ok(info) => {
                    let drops = dropping_settings(&info["config"]);
                    if !drops.is_empty() {
                        log::warn!(
                            "dead-letter stream {}: {} can remove a dead letter after the \
                             broker confirmed it (the original is acknowledged then, and \
                             custody checkpoints list it as dead-lettered); keep dead letters \
                             until an operator removes them (svc dlq redrive does)",
                            PeerText::new(stream),
                            drops.join(", ")
                        );
                    }
                }
                Err(e) => log::warn!(
                    "dead-letter stream {}: its settings could not be read: {}",
                    PeerText::new(stream),
                    PeerText::new(&e.to_string())
                ),
            }
        }
    }
}

/// Capturing streams whose settings the start-up check reads at most.
const MAX_STREAMS_CHECKED: usize = 4;

/// The settings of a stream's `config` that remove messages on their own: limits with
/// `discard: old` (with `discard: new` a full stream refuses the publish, which is NAKed and
/// retried), memory storage (gone when the broker restarts), and a retention that removes
/// what consumers acknowledged. Each as `name value`. An age limit (`max_age`, 7 days in
/// `svc stream-plan`'s plan) is a retention the operator chose, not named.
pub fn dropping_settings(config: &serde_json::Value) -> Vec<String> {
    let positive = |k: &str| config[k].as_i64().filter(|v| *v > 0);
    let mut out = Vec::new();
    if config["discard"].as_str() != Some("new") {
        for k in ["max_msgs", "max_bytes", "max_msgs_per_subject"] {
            if let Some(v) = positive(k) {
                out.push(format!("{k} {v} (discard old)"));
            }
        }
    }
    if config["storage"].as_str() == Some("memory") {
        out.push("storage memory".into());
    }
    if let Some(r @ ("interest" | "workqueue")) = config["retention"].as_str() {
        out.push(format!("retention {r}"));
    }
    out
}

/// Reads a JetStream publish response: `{"stream":..,"seq":..,"duplicate":..}` or
/// `{"error":{"code":..,"err_code":..,"description":..}}`.
pub fn parse_pub_ack(data: &[u8]) -> Result<PubAck, DlqError> {
    let v: serde_json::Value = serde_json::from_slice(data).map_err(|_| DlqError::BadAck)?;
    if let Some(err) = v.get("error") {
        // The broker's text: kept bounded here, escaped when displayed (PeerText).
        let description: String = err
            .get("description")
            .and_then(|d| d.as_str())
            .unwrap_or("unknown error")
            .chars()
            .take(PEER_TEXT_MAX_CHARS + 1)
            .collect();
        return Err(DlqError::Rejected {
            code: err.get("code").and_then(|c| c.as_u64()).unwrap_or(0),
            description,
        });
    }
    match (
        v.get("stream").and_then(|s| s.as_str()),
        v.get("seq").and_then(|s| s.as_u64()),
    ) {
        (Some(stream), Some(sequence)) => Ok(PubAck {
            stream: stream.to_string(),
            sequence,
            duplicate: v
                .get("duplicate")
                .and_then(|d| d.as_bool())
                .unwrap_or(false),
        }),
        _ => Err(DlqError::BadAck),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::reader::parse_json;

    #[test]
    fn settings_that_remove_dead_letters_are_named() {
        let drops = |v: serde_json::Value| dropping_settings(&v);
        assert!(drops(
            serde_json::json!({"max_msgs": -1, "max_bytes": -1, "max_age": 0,
                                         "storage": "file", "retention": "limits"})
        )
        .is_empty());
        assert_eq!(
            drops(
                serde_json::json!({"max_msgs": 1, "max_age": 86_400_000_000_000i64,
                                     "storage": "memory", "retention": "workqueue"})
            ),
            [
                "max_msgs 1 (discard old)",
                "storage memory",
                "retention workqueue"
            ]
        );
        assert!(
            drops(serde_json::json!({"max_msgs": 1, "max_bytes": 10, "discard": "new"})).is_empty()
        );
    }

    fn cfg(text: &str) -> Result<DeadLetterConfig, Vec<String>> {
        let v = parse_json(text).unwrap();
        let p = Problems::new();
        let c = DeadLetterConfig::read(Some(ObjectReader::at("dead_letter".into(), &v, &p)));
        let p = p.into_vec();
        if p.is_empty() {
            Ok(c)
        } else {
            Err(p.iter().map(|p| p.to_string()).collect())
        }
    }

    fn raw() -> RawMessage {
        RawMessage {
            consumer_sequence: 7,
            delivery_count: 2,
            published_unix_nanos: Some(1_700_000_000_000_000_000),
            headers: vec![
                ("Nats-Msg-Id".into(), "m-1".into()),
                ("Content-Type".into(), "application/json".into()),
                (
                    "Svc-Security-Labels".into(),
                    "{\"owner\":\"TOPSECRETVALUE\"}".into(),
                ),
                ("Authorization".into(), "Bearer hunter2".into()),
                ("X-Big".into(), "b".repeat(2000)),
            ],
            ..RawMessage::sample("orders.eu", 42, br#"{"card":"4111111111111111"}"#)
        }
    }

    #[test]
    fn config_defaults_and_problems() {
        let c = cfg("{}").unwrap();
        assert_eq!(c, DeadLetterConfig::default());
        assert_eq!(
            cfg(r#"{"enabled": true, "include_headers": ["X-Api-Key", "a b"], "publish_timeout_ms": 1,
                    "expected_stream": "no spaces", "extra": 1}"#)
            .unwrap_err(),
            vec![
                "dead_letter.subject: is required when dead_letter.enabled is true",
                "dead_letter.include_headers[0]: looks like a secret-bearing header and is never copied",
                "dead_letter.include_headers[1]: must be a header name without spaces or control characters",
                "dead_letter.publish_timeout_ms: must be an integer from 10 to 60000",
                "dead_letter.expected_stream: must be 1 to 64 characters of A-Z a-z 0-9 _ -",
                "dead_letter.extra: unknown field",
            ]
        );
        for (subject, msg) in [
            (
                "dlq.*",
                "dead_letter.subject: must be a literal subject without wildcards",
            ),
            (
                "dlq..x",
                "dead_letter.subject: must not contain empty tokens",
            ),
            (
                "$JS.dlq",
                "dead_letter.subject: must not be in a reserved subject tree ($... or _INBOX.)",
            ),
        ] {
            assert_eq!(
                cfg(&format!(r#"{{"enabled": true, "subject": "{subject}"}}"#)).unwrap_err(),
                vec![msg]
            );
        }
        let c =
            cfg(r#"{"enabled": true, "subject": "orders.dlq", "include_headers": ["Svc-Labels"]}"#)
                .unwrap();
        let p = Problems::new();
        c.cross_check(
            &["orders.>".to_string()],
            &["Svc-Security-Labels", "Svc-Labels"],
            &p,
        );
        let got: Vec<String> = p.into_vec().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            vec![
                "dead_letter.subject: must not match nats.subject (the runner would consume its own dead letters)",
                "dead_letter.include_headers[0]: names a validated header whose value may be the reason of the failure; it is never copied",
            ]
        );
    }

    #[test]
    fn a_replayed_record_adds_one_field_and_its_own_message_id() {
        let c = DeadLetterConfig {
            enabled: true,
            subject: "dlq".into(),
            ..Default::default()
        };
        let failure = Failure::new("input", "headers", "too_many_headers", "x".into());
        let dl = DeadLetter::build(&raw(), &failure, 1_700_000_001_000_000_000, &c);
        let replayed = dl.clone().replayed();
        assert_eq!(replayed.msg_id, "svc-dlq-replay:ORDERS:42");
        assert_eq!(replayed.reason, dl.reason);
        let mut before: serde_json::Value = serde_json::from_slice(&dl.body).unwrap();
        let after: serde_json::Value = serde_json::from_slice(&replayed.body).unwrap();
        assert!(before.get("replayed").is_none());
        before["replayed"] = serde_json::Value::Bool(true);
        assert_eq!(before, after, "only the replayed field is added");
    }

    #[test]
    fn record_is_sanitized() {
        let c = DeadLetterConfig {
            enabled: true,
            subject: "dlq".into(),
            include_headers: vec!["Content-Type".into(), "X-Big".into(), "Missing".into()],
            ..Default::default()
        };
        let labels = crate::message::labels::SecurityLabelsConfig {
            enabled: true,
            allowed_classifications: ["a".to_string()].into(),
            ..Default::default()
        };
        let mut m = raw();
        m.headers[2].1 = r#"{"classification":"TOPSECRETVALUE","extensions":{"x":1}}"#.into();
        let meta = crate::message::metadata::MessageMetadataConfig::default()
            .resolve(&m)
            .unwrap();
        let rejection = labels.resolve(&m, &meta).unwrap_err();
        let failure = Failure::from(&rejection);
        let dl = DeadLetter::build(&m, &failure, 1_700_000_001_000_000_000, &c);
        assert_eq!(dl.msg_id, "svc-dlq:ORDERS:42");
        // The stream's incarnation, when known, tells a stream created again from the old one.
        let again = RawMessage {
            stream_incarnation: "20261128T071943.5Z".into(),
            ..m.clone()
        };
        let dl2 = DeadLetter::build(&again, &failure, 1_700_000_001_000_000_000, &c);
        assert_eq!(dl2.msg_id, "svc-dlq:ORDERS:20261128T071943.5Z:42");
        let v: serde_json::Value = serde_json::from_slice(&dl2.body).unwrap();
        assert_eq!(v["original"]["stream_incarnation"], "20261128T071943.5Z");
        assert_eq!(dl.reason, "not_in_vocabulary");
        let text = String::from_utf8(dl.body.clone()).unwrap();
        for never in ["TOPSECRETVALUE", "hunter2", "4111", "card", "bbbbbbbb"] {
            assert!(!text.contains(never), "{never} in {text}");
        }
        let v: serde_json::Value = serde_json::from_slice(&dl.body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "schema": "svc.dead-letter.v1",
                "failed_at": "2023-11-14T22:13:21Z",
                "failure": {
                    "stage": "security_labels",
                    "field": "security_labels.classification",
                    "reason": "not_in_vocabulary",
                    "message": "security_labels.classification: value is not in security_labels.allowed_classifications",
                    "problems": [{"field": "security_labels.classification", "reason": "not_in_vocabulary"}]
                },
                "original": {
                    "subject": "orders.eu", "stream": "ORDERS", "stream_sequence": 42,
                    "consumer": "svc", "consumer_sequence": 7, "delivery_count": 2,
                    "message_id": "m-1", "published_at": "2023-11-14T22:13:20Z"
                },
                "payload": {"sha256": hex_sha256(&m.data), "size_bytes": 27},
                "headers": {"Content-Type": "application/json", "X-Big": "(omitted: 2000 bytes)"}
            })
        );
    }

    #[test]
    fn metadata_failures_convert() {
        let c = crate::message::metadata::MessageMetadataConfig::default();
        let mut m = raw();
        m.headers
            .push(("Svc-Priority".into(), "SECRET;VALUE".into()));
        let e = c.resolve(&m).unwrap_err();
        let f = Failure::from(&e);
        assert_eq!(f.stage, "message_metadata");
        assert_eq!(f.field, "message_metadata.priority");
        assert_eq!(f.reason, "invalid_value");
        assert!(!serde_json::to_string(&f).unwrap().contains("SECRET"));
    }

    /// A duplicate PubAck is believed only for this very record: the same message (issue
    /// 51.11), and the same failure, headers and original (review 51: a forged record with
    /// the real identity and payload digest but its own failure was taken for ours).
    #[test]
    fn a_duplicate_counts_only_for_this_very_record() {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let c = DeadLetterConfig::default();
        let failure = Failure::new("normalize", "payload", "invalid_json", "bad".into());
        let m = RawMessage {
            stream_incarnation: "20261128T071943Z".into(),
            ..raw()
        };
        let first = DeadLetter::build(&m, &failure, 1_700_000_001_000_000_000, &c);
        let ours = vec![
            (MESSAGE_ID_HEADER, first.msg_id.clone()),
            ("Content-Type", "application/json".to_string()),
            (REASON_HEADER, first.reason.to_string()),
        ];
        let head = |lines: &[(&str, &str)]| {
            let mut h = b"NATS/1.0\r\n".to_vec();
            for (n, v) in lines {
                h.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            h.extend_from_slice(b"\r\n");
            h
        };
        let our_head = head(&[
            ("Svc-Dlq-Reason", "invalid_json"),
            ("nats-msg-id", &first.msg_id),
            ("Content-Type", "application/json"),
        ]);
        let stored = |data: &[u8]| StoredMessage {
            subject: c.subject.clone(),
            headers: our_head.clone(),
            data: data.to_vec(),
        };
        let check = |s: &StoredMessage| same_record(s, &first, &c.subject, &ours);
        // An earlier delivery's record: another time, delivery count and consumer sequence.
        let again = RawMessage {
            delivery_count: 5,
            consumer_sequence: 99,
            ..m.clone()
        };
        let later = DeadLetter::build(&again, &failure, 1_700_000_009_000_000_000, &c);
        assert_ne!(first.body, later.body);
        assert_eq!(check(&stored(&later.body)), Ok(()));
        // Another incarnation's message 42, or another payload: not ours.
        let old = RawMessage {
            stream_incarnation: "20251128T071943Z".into(),
            ..m.clone()
        };
        let old = DeadLetter::build(&old, &failure, 1_700_000_001_000_000_000, &c);
        assert_eq!(
            check(&stored(&old.body)),
            Err("is a record of another message")
        );
        let forged = RawMessage {
            data: b"other".to_vec(),
            ..m.clone()
        };
        let forged = DeadLetter::build(&forged, &failure, 1_700_000_001_000_000_000, &c);
        assert!(check(&stored(&forged.body)).is_err());
        // The same message's identity and digest with the forger's failure, headers, an
        // extra field, or one missing: not ours either.
        let body: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
        for change in [
            ("/failure/reason", serde_json::json!("forged")),
            ("/failure/message", serde_json::json!("nothing wrong here")),
            ("/headers", serde_json::json!({"X-Forged": "yes"})),
            ("/original/consumer", serde_json::json!("other")),
            ("/extra", serde_json::json!(1)),
        ] {
            let mut v = body.clone();
            match v.pointer_mut(change.0) {
                Some(slot) => *slot = change.1.clone(),
                None => v["extra"] = change.1.clone(),
            }
            let data = serde_json::to_vec(&v).unwrap();
            assert!(check(&stored(&data)).is_err(), "{}", change.0);
        }
        let mut v = body.clone();
        v["original"].as_object_mut().unwrap().remove("message_id");
        assert!(check(&stored(&serde_json::to_vec(&v).unwrap())).is_err());
        // Our body under other headers or on another subject: not ours.
        for bad_head in [
            head(&[("Svc-Dlq-Reason", "forged"), ("Nats-Msg-Id", &first.msg_id)]),
            head(&[
                ("Svc-Dlq-Reason", "invalid_json"),
                ("Nats-Msg-Id", &first.msg_id),
                ("Content-Type", "application/json"),
                ("X-Forged", "yes"),
            ]),
            Vec::new(),
            b"HTTP/1.1 200\r\n\r\n".to_vec(),
        ] {
            let s = StoredMessage {
                headers: bad_head,
                ..stored(&first.body)
            };
            assert!(check(&s).is_err());
        }
        let elsewhere = StoredMessage {
            subject: "dlq.other".into(),
            ..stored(&first.body)
        };
        assert_eq!(check(&elsewhere), Err("is on another subject"));
        assert!(check(&stored(b"not json")).is_err());
        assert!(check(&stored(br#"{"original":{}}"#)).is_err());

        let answer = serde_json::json!({"message": {"subject": "dlq", "seq": 3,
            "hdrs": b64(&our_head), "data": b64(&first.body)}})
        .to_string();
        let read = stored_message(answer.as_bytes()).unwrap();
        assert_eq!((read.data, read.headers), (first.body.clone(), our_head));
        let no_headers =
            serde_json::json!({"message": {"subject": "dlq", "data": b64(b"{}")}}).to_string();
        assert!(stored_message(no_headers.as_bytes())
            .unwrap()
            .headers
            .is_empty());
        assert!(stored_message(br#"{"message":{"subject":"d","data":"%%"}}"#).is_none());
        assert!(stored_message(br#"{"message":{"data":"e30="}}"#).is_none());
        assert!(stored_message(br#"{"error":{"code":404}}"#).is_none());
        for bad in ["", "A.B", "A*", ">", "A B", "A\u{7}"] {
            assert!(!is_stream_name(bad), "{bad}");
        }
        assert!(is_stream_name("ORDERS_DLQ"));
    }

    #[test]
    fn pub_ack_parsing() {
        assert_eq!(
            parse_pub_ack(br#"{"stream":"DLQ","seq":5}"#),
            Ok(PubAck {
                stream: "DLQ".into(),
                sequence: 5,
                duplicate: false
            })
        );
        assert!(
            parse_pub_ack(br#"{"stream":"DLQ","seq":5,"duplicate":true}"#)
                .unwrap()
                .duplicate
        );
        assert_eq!(
            parse_pub_ack(br#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#),
            Err(DlqError::Rejected {
                code: 503,
                description: "maximum messages exceeded".into()
            })
        );
        assert_eq!(parse_pub_ack(b"nope"), Err(DlqError::BadAck));
        assert_eq!(parse_pub_ack(b"{}"), Err(DlqError::BadAck));
    }

    #[test]
    fn a_hostile_broker_answer_is_bounded_and_escaped_in_the_error() {
        let forged = format!(
            "limits\n2026-01-01T00:00:00.000Z INFO  [svc-ack] fine{}{}",
            '\u{202e}',
            "x".repeat(1 << 20)
        );
        let answer = serde_json::json!({"error": {"code": 503, "description": forged}});
        let err = parse_pub_ack(answer.to_string().as_bytes()).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with("dlq publish: refused by the stream (503: limits\\n2026"),
            "{shown}"
        );
        assert!(!shown.contains(['\n', '\u{202e}']), "{shown}");
        assert!(shown.len() < 400, "{} bytes", shown.len());
        let wrong = DlqError::WrongStream {
            stream: "DLQ\r\nforged".repeat(1000),
        };
        let shown = wrong.to_string();
        assert!(
            !shown.contains(['\n', '\r']) && shown.len() < 400,
            "{shown}"
        );
    }

    /// A 20,000-byte message id of control characters became a 120 KB record (six bytes per
    /// escaped character) that a DLQ stream with a 64 KiB `max_msg_size` refuses: capped as
    /// included headers are; and an id whose object key was invalid is withheld.
    #[test]
    fn a_huge_message_id_keeps_the_record_small() {
        let mut m = raw();
        m.headers[0].1 = "\u{1}".repeat(20_000);
        let failure = Failure::new("x", "x", "x", "x".into());
        let d = DeadLetter::build(&m, &failure, 0, &DeadLetterConfig::default());
        assert!(d.body.len() < 2048, "{} bytes", d.body.len());
        let v: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(v["original"]["message_id"], "(omitted: 20000 bytes)");
        // Up to the bound the id is kept whole.
        m.headers[0].1 = "i".repeat(MAX_HEADER_VALUE_BYTES);
        let d = DeadLetter::build(&m, &failure, 0, &DeadLetterConfig::default());
        let v: serde_json::Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(v["original"]["message_id"].as_str().unwrap().len(), 1024);

        let mut m = raw();
        m.headers[0].1 = "../../evil-id".into();
        let (env, _) = crate::message::envelope::normalize(&m, 0, &Default::default());
        let err = crate::sink::SinkError::new("object_store", "bad key")
            .classified(FailureClass::InvalidKey);
        let d = DeadLetter::build_for_sink(
            &env,
            (err.sink, err.class),
            0,
            &DeadLetterConfig::default(),
        );
        let text = String::from_utf8(d.body).unwrap();
        assert!(!text.contains("evil-id"), "{text}");
        assert!(text.contains(WITHHELD_ID), "{text}");
    }

    /// A permanent sink failure's record names the sink and the class, never the sink's
    /// message; a keyed (encrypted) payload digest is labelled `hmac_sha256`, never `sha256`.
    #[test]
    fn sink_failure_records_are_value_free_and_label_keyed_digests() {
        let cfg = DeadLetterConfig::default();
        let (mut env, _) = crate::message::envelope::normalize(
            &raw(),
            1_700_000_001_000_000_000,
            &Default::default(),
        );
        let err =
            crate::sink::SinkError::new("relational_db", "row rejected: Key (id)=(SECRETVALUE)")
                .classified(crate::sink::FailureClass::ValueRejected);
        let plain = DeadLetter::build_for_sink(&env, (err.sink, err.class), 0, &cfg);
        let text = String::from_utf8(plain.body.clone()).unwrap();
        assert!(!text.contains("SECRETVALUE"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["failure"]["stage"], "sink");
        assert_eq!(v["failure"]["field"], "sink.relational_db");
        assert_eq!(v["failure"]["reason"], "value_rejected");
        assert_eq!(v["payload"]["sha256"], env.payload_info.sha256.as_str());
        assert!(v["payload"].get("hmac_sha256").is_none());

        env.payload_info.sha256 = "ab".repeat(32);
        env.payload_info.keyed = true;
        let keyed = DeadLetter::build_for_sink(&env, (err.sink, err.class), 0, &cfg);
        let v: serde_json::Value = serde_json::from_slice(&keyed.body).unwrap();
        assert!(v["payload"].get("sha256").is_none(), "{v}");
        assert_eq!(v["payload"]["hmac_sha256"], "ab".repeat(32).as_str());
    }
}
