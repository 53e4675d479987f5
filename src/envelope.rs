//! The normalized event (envelope) and the pure function that builds it from a broker message.
//!
//! `normalize` does no I/O: it takes the message as plain data plus the receive time, so every
//! rule here is unit-tested with byte literals. Sinks receive envelopes only; the reply subject
//! used for acknowledgement never enters this module.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

pub const METADATA_SCHEMA: &str = "svc.metadata.v1";

/// A broker message as plain data: what the fetch thread hands to the normalizer.
#[derive(Debug, Clone, PartialEq)]
pub struct RawMessage {
    pub subject: String,
    pub stream: String,
    pub consumer: String,
    pub stream_sequence: u64,
    pub consumer_sequence: u64,
    /// Delivery attempt, 1 on first delivery.
    pub delivery_count: u64,
    /// Broker receive time of the original publish, Unix nanoseconds.
    pub published_unix_nanos: Option<i128>,
    /// Headers in arrival order; names keep their case (lookups are case-sensitive, as the
    /// broker's are).
    pub headers: Vec<(String, String)>,
    pub data: Vec<u8>,
}

impl RawMessage {
    /// First value of a header, case-sensitive.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How the payload arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadFormat {
    Json,
    Text,
    Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PayloadInfo {
    pub original_format: PayloadFormat,
    pub wrapped: bool,
    /// Hex SHA-256 of the payload bytes as received.
    pub sha256: String,
    pub size_bytes: u64,
}

/// Event metadata (`svc.metadata.v1`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventMetadata {
    pub schema: &'static str,
    /// RFC 3339 time the runner received the message.
    pub received_at: String,
    /// RFC 3339 time the broker stored the message, when known.
    pub published_at: Option<String>,
    /// RFC 3339 source event time from the configured header, when present and valid.
    pub event_time: Option<String>,
    pub delivery_count: u64,
    /// Only the headers named in `envelope.keep_headers`.
    pub headers: BTreeMap<String, String>,
    /// Copy of the envelope's security label profile (spec: file record and relational
    /// `METADATA_JSON` hold it here too).
    pub security_labels: Option<Value>,
}

/// The normalized event every sink writes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope {
    pub subject: String,
    pub stream: String,
    pub stream_sequence: u64,
    pub consumer: String,
    pub consumer_sequence: u64,
    /// Publisher message ID (`Nats-Msg-Id`).
    pub message_id: Option<String>,
    pub priority: String,
    pub classification: String,
    /// `labels_list` joined by `;`.
    pub labels: String,
    pub labels_list: Vec<String>,
    pub payload: Value,
    pub payload_info: PayloadInfo,
    pub security_labels: Option<Value>,
    pub metadata: EventMetadata,
}

/// Settings of normalization (runtime config block `envelope`).
#[derive(Debug, Clone, PartialEq)]
pub struct EnvelopeConfig {
    /// Headers copied into `metadata.headers` (exact, case-sensitive names).
    pub keep_headers: Vec<String>,
    /// Header carrying the publisher's RFC 3339 event time.
    pub event_time_header: String,
    /// Events older than this at receive are counted as stale.
    pub stale_after_seconds: f64,
}

impl Default for EnvelopeConfig {
    fn default() -> Self {
        EnvelopeConfig {
            keep_headers: Vec::new(),
            event_time_header: "Svc-Event-Time".into(),
            stale_after_seconds: 300.0,
        }
    }
}

/// Freshness facts found while normalizing; the caller turns them into metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Freshness {
    /// Age at receive in seconds (0 when the source time is in the future).
    pub age_seconds: Option<f64>,
    pub stale: bool,
    pub missing_publisher_timestamp: bool,
    pub malformed_timestamp: bool,
    pub clock_skew: bool,
}

/// Publisher message-ID header of the broker.
pub const MESSAGE_ID_HEADER: &str = "Nats-Msg-Id";

/// Builds the envelope. Pure: `received_unix_nanos` is passed in.
pub fn normalize(
    msg: &RawMessage,
    received_unix_nanos: i128,
    cfg: &EnvelopeConfig,
) -> (Envelope, Freshness) {
    let (payload, payload_info) = normalize_payload(&msg.data);
    let headers = cfg
        .keep_headers
        .iter()
        .filter_map(|name| msg.header(name).map(|v| (name.clone(), v.to_string())))
        .collect();

    let mut fresh = Freshness::default();
    let event_time = match msg.header(&cfg.event_time_header) {
        None => {
            fresh.missing_publisher_timestamp = true;
            None
        }
        Some(text) => match parse_rfc3339_nanos(text) {
            Some(n) => Some(n),
            None => {
                fresh.malformed_timestamp = true;
                None
            }
        },
    };
    if let Some(source) = event_time.or(msg.published_unix_nanos) {
        let age = (received_unix_nanos - source) as f64 / 1e9;
        if age < 0.0 {
            fresh.clock_skew = true;
        }
        let age = age.max(0.0);
        fresh.age_seconds = Some(age);
        fresh.stale = age > cfg.stale_after_seconds;
    }

    let envelope = Envelope {
        subject: msg.subject.clone(),
        stream: msg.stream.clone(),
        stream_sequence: msg.stream_sequence,
        consumer: msg.consumer.clone(),
        consumer_sequence: msg.consumer_sequence,
        message_id: msg.header(MESSAGE_ID_HEADER).map(str::to_string),
        priority: String::new(),
        classification: String::new(),
        labels: String::new(),
        labels_list: Vec::new(),
        payload,
        payload_info,
        security_labels: None,
        metadata: EventMetadata {
            schema: METADATA_SCHEMA,
            received_at: format_rfc3339_nanos(received_unix_nanos),
            published_at: msg.published_unix_nanos.map(format_rfc3339_nanos),
            event_time: event_time.map(format_rfc3339_nanos),
            delivery_count: msg.delivery_count,
            headers,
            security_labels: None,
        },
    };
    (envelope, fresh)
}

/// `json_or_envelope`: a JSON document stays a JSON value; UTF-8 text is wrapped as a string;
/// anything else is wrapped as base64.
pub fn normalize_payload(data: &[u8]) -> (Value, PayloadInfo) {
    let sha256 = hex_sha256(data);
    let size_bytes = data.len() as u64;
    let (payload, original_format, wrapped) = match serde_json::from_slice::<Value>(data) {
        Ok(v) => (v, PayloadFormat::Json, false),
        Err(_) => match std::str::from_utf8(data) {
            Ok(text) => (
                serde_json::json!({ "text": text }),
                PayloadFormat::Text,
                true,
            ),
            Err(_) => (
                serde_json::json!({
                    "base64": base64::engine::general_purpose::STANDARD.encode(data)
                }),
                PayloadFormat::Bytes,
                true,
            ),
        },
    };
    (
        payload,
        PayloadInfo {
            original_format,
            wrapped,
            sha256,
            size_bytes,
        },
    )
}

pub fn hex_sha256(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let mut out = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// RFC 3339 with nanoseconds in UTC.
pub fn format_rfc3339_nanos(unix_nanos: i128) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(unix_nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

pub fn parse_rfc3339_nanos(text: &str) -> Option<i128> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp_nanos())
}

/// Current time in Unix nanoseconds.
pub fn now_unix_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(data: &[u8]) -> RawMessage {
        RawMessage {
            subject: "orders.created".into(),
            stream: "ORDERS".into(),
            consumer: "svc".into(),
            stream_sequence: 42,
            consumer_sequence: 7,
            delivery_count: 1,
            published_unix_nanos: Some(1_700_000_000_000_000_000),
            headers: vec![
                ("Nats-Msg-Id".into(), "abc".into()),
                ("Authorization".into(), "Bearer hunter2".into()),
                ("Content-Type".into(), "application/json".into()),
            ],
            data: data.to_vec(),
        }
    }

    #[test]
    fn json_payload_stays_json() {
        let (e, _) = normalize(
            &msg(br#"{"a":1}"#),
            1_700_000_001_000_000_000,
            &EnvelopeConfig::default(),
        );
        assert_eq!(e.payload, serde_json::json!({"a": 1}));
        assert_eq!(e.payload_info.original_format, PayloadFormat::Json);
        assert!(!e.payload_info.wrapped);
        assert_eq!(e.payload_info.size_bytes, 7);
        assert_eq!(e.payload_info.sha256, hex_sha256(br#"{"a":1}"#));
        assert_eq!(e.message_id.as_deref(), Some("abc"));
        assert_eq!(e.stream_sequence, 42);
        assert_eq!(e.metadata.schema, "svc.metadata.v1");
    }

    #[test]
    fn text_and_bytes_are_wrapped() {
        let (e, _) = normalize(&msg(b"hello"), 0, &EnvelopeConfig::default());
        assert_eq!(e.payload, serde_json::json!({"text": "hello"}));
        assert_eq!(e.payload_info.original_format, PayloadFormat::Text);
        assert!(e.payload_info.wrapped);
        let (e, _) = normalize(&msg(&[0xff, 0x00, 0x01]), 0, &EnvelopeConfig::default());
        assert_eq!(e.payload, serde_json::json!({"base64": "/wAB"}));
        assert_eq!(e.payload_info.original_format, PayloadFormat::Bytes);
    }

    #[test]
    fn only_listed_headers_are_kept() {
        let cfg = EnvelopeConfig {
            keep_headers: vec!["Content-Type".into(), "Missing".into()],
            ..Default::default()
        };
        let (e, _) = normalize(&msg(b"{}"), 0, &cfg);
        assert_eq!(e.metadata.headers.len(), 1);
        assert_eq!(e.metadata.headers["Content-Type"], "application/json");
        let text = serde_json::to_string(&e).unwrap();
        assert!(!text.contains("hunter2"));
    }

    #[test]
    fn freshness_from_header_or_broker_time() {
        let cfg = EnvelopeConfig::default();
        let recv = 1_700_000_400_000_000_000;
        let (_, f) = normalize(&msg(b"{}"), recv, &cfg);
        assert!(f.missing_publisher_timestamp);
        assert_eq!(f.age_seconds, Some(400.0));
        assert!(f.stale);

        let mut m = msg(b"{}");
        m.headers
            .push(("Svc-Event-Time".into(), "2023-11-14T22:13:30Z".into()));
        let (e, f) = normalize(&m, 1_700_000_000_000_000_000, &cfg);
        assert!(!f.missing_publisher_timestamp);
        assert_eq!(f.age_seconds, Some(0.0));
        assert!(f.clock_skew, "event time 10 s in the future");
        assert_eq!(
            e.metadata.event_time.as_deref(),
            Some("2023-11-14T22:13:30Z")
        );

        let mut m = msg(b"{}");
        m.headers
            .push(("Svc-Event-Time".into(), "yesterday".into()));
        let (_, f) = normalize(&m, recv, &cfg);
        assert!(f.malformed_timestamp);
        assert_eq!(f.age_seconds, Some(400.0), "falls back to broker time");
    }

    #[test]
    fn normalize_is_deterministic() {
        let a = normalize(&msg(b"x"), 5, &EnvelopeConfig::default());
        let b = normalize(&msg(b"x"), 5, &EnvelopeConfig::default());
        assert_eq!(a, b);
    }
}
