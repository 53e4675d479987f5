//! The normalized event (envelope) and the pure function that builds it from a broker message.
//!
//! `normalize` does no I/O: it takes the message as plain data plus the receive time, so every
//! rule here is unit-tested with byte literals. Sinks receive envelopes only; the reply subject
//! used for acknowledgement never enters this module.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::document::canonical::{self, Json};
use crate::text::rfc3339::{parse_rfc3339_nanos, Rfc3339};

pub const METADATA_SCHEMA: &str = "svc.metadata.v1";

/// A broker message as plain data: what the fetch thread hands to the normalizer.
#[derive(Debug, Clone, PartialEq)]
pub struct RawMessage {
    pub subject: String,
    /// Shared by every message of the consumer (no allocation per message).
    pub stream: Arc<str>,
    /// Which stream of that name: its creation time as the broker reported it, as
    /// [`crate::text::rfc3339::compact_utc`] writes it; empty when not known (a message not
    /// read from a broker). A stream deleted and created again numbers from 1 again: every id
    /// and key made from stream and sequence carries this too (docs/delivery-semantics.md).
    pub stream_incarnation: Arc<str>,
    pub consumer: Arc<str>,
    pub stream_sequence: u64,
    pub consumer_sequence: u64,
    /// Delivery attempt, 1 on first delivery.
    pub delivery_count: u64,
    /// Broker receive time of the original publish, Unix nanoseconds.
    pub published_unix_nanos: Option<i128>,
    /// Headers; names keep their case (lookups are case-sensitive, as the broker's are). Not
    /// in arrival order: the client keeps them in a map, one entry per distinct value, and a
    /// message whose id the broker and the client would read differently never gets here
    /// with headers (see `unreadable`).
    pub headers: Vec<(String, String)>,
    pub data: Vec<u8>,
    /// What of the message the broker client could not read as sent (a subject that is not
    /// UTF-8, a header block the broker would read differently); `svc-normalize` settles such
    /// a message with this reason, and its `headers` are then empty.
    pub unreadable: Option<&'static str>,
    /// The header block as the broker sent it, counted by the client before it built a map:
    /// what the header bounds measure (see [`RawMessage::header_lines`]).
    pub header_block: HeaderBlock,
}

/// Header lines and their name and value bytes in the block the broker delivered, repeated
/// lines included (the client's map keeps a repeated name and value once, and keeps nothing
/// of a block over its own bound). Zero when the message was not read from a broker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderBlock {
    pub lines: usize,
    pub bytes: usize,
}

impl RawMessage {
    /// A first delivery of `data` on `subject` from stream `ORDERS` to consumer `svc`, consumer
    /// sequence equal to the stream's, no headers, no publish time. For tests, benches and
    /// fuzz targets, which set what they care about with struct update syntax
    /// (`RawMessage { headers, ..RawMessage::sample("a.b", 1, b"{}") }`); not part of the API.
    #[doc(hidden)]
    pub fn sample(subject: &str, stream_sequence: u64, data: &[u8]) -> RawMessage {
        RawMessage {
            subject: subject.into(),
            stream: "ORDERS".into(),
            stream_incarnation: Arc::default(),
            consumer: "svc".into(),
            stream_sequence,
            consumer_sequence: stream_sequence,
            delivery_count: 1,
            published_unix_nanos: None,
            headers: Vec::new(),
            data: data.to_vec(),
            unreadable: None,
            header_block: HeaderBlock::default(),
        }
    }

    /// Header lines as sent: the lines the client counted (1,000 identical lines are 1,000,
    /// though the headers hold the pair once), or the pairs held when nothing was counted.
    pub fn header_lines(&self) -> usize {
        self.header_block.lines.max(self.headers.len())
    }

    /// Name and value bytes of the header lines as sent, counted as [`Self::header_lines`].
    pub fn header_bytes(&self) -> usize {
        let held: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.header_block.bytes.max(held)
    }

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

impl PayloadFormat {
    /// The name it serializes as (`json`, `text`, `bytes`).
    pub fn name(self) -> &'static str {
        match self {
            PayloadFormat::Json => "json",
            PayloadFormat::Text => "text",
            PayloadFormat::Bytes => "bytes",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PayloadInfo {
    pub original_format: PayloadFormat,
    pub wrapped: bool,
    /// Hex SHA-256 of the payload bytes as received; the keyed digest when `keyed`.
    pub sha256: String,
    pub size_bytes: u64,
    /// `sha256` is the keyed digest of an encrypted payload (set by the encryption stage), not
    /// the plain one. Not stored: records show it by their encrypted payload.
    #[serde(skip)]
    pub keyed: bool,
}

/// Event metadata (`svc.metadata.v1`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventMetadata {
    pub schema: &'static str,
    /// RFC 3339 time the runner received the message.
    pub received_at: Rfc3339,
    /// RFC 3339 time the broker stored the message, when known.
    pub published_at: Option<Rfc3339>,
    /// RFC 3339 source event time from the configured header, when present and valid.
    pub event_time: Option<Rfc3339>,
    pub delivery_count: u64,
    /// Only the headers named in `envelope.keep_headers`.
    pub headers: BTreeMap<String, String>,
    /// Copy of the envelope's security label profile (spec: file record and relational
    /// `METADATA_JSON` hold it here too).
    pub security_labels: Option<Value>,
}

impl EventMetadata {
    /// The metadata as JSON text appended to `out`: byte for byte what
    /// `serde_json::to_writer` makes of it, written by hand (serde's derive escapes every
    /// member name byte by byte, a cost per stored row).
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        use crate::text::json::{decimal, push_str};
        let time = |out: &mut Vec<u8>, t: &Option<Rfc3339>| match t {
            Some(t) => push_str(out, t.as_str()),
            None => out.extend_from_slice(b"null"),
        };
        out.extend_from_slice(b"{\"schema\":");
        push_str(out, self.schema);
        out.extend_from_slice(b",\"received_at\":");
        push_str(out, self.received_at.as_str());
        out.extend_from_slice(b",\"published_at\":");
        time(out, &self.published_at);
        out.extend_from_slice(b",\"event_time\":");
        time(out, &self.event_time);
        out.extend_from_slice(b",\"delivery_count\":");
        out.extend_from_slice(decimal(self.delivery_count, &mut [0; 20]).as_bytes());
        out.extend_from_slice(b",\"headers\":{");
        for (n, (name, value)) in self.headers.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            push_str(out, name);
            out.push(b':');
            push_str(out, value);
        }
        out.extend_from_slice(b"},\"security_labels\":");
        match &self.security_labels {
            Some(v) => serde_json::to_writer(&mut *out, v)?,
            None => out.extend_from_slice(b"null"),
        }
        out.push(b'}');
        Ok(())
    }

    /// [`EventMetadata::write_json`] as a string.
    pub fn to_json(&self) -> serde_json::Result<String> {
        let mut out = Vec::with_capacity(256);
        self.write_json(&mut out)?;
        Ok(String::from_utf8(out).expect("JSON text is UTF-8"))
    }
}

/// A message's place in its stream as one text: stream, incarnation when known, sequence,
/// joined by `sep`. The incarnation tells apart two streams of one name that each number
/// from 1 (`broker/incarnation.rs`); without it (a message not read from a broker, a spool
/// record of an earlier version) the text is what it was before incarnations.
pub fn stream_place(stream: &str, incarnation: &str, sequence: u64, sep: &str) -> String {
    if incarnation.is_empty() {
        format!("{stream}{sep}{sequence}")
    } else {
        format!("{stream}{sep}{incarnation}{sep}{sequence}")
    }
}

/// The normalized event every sink writes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope {
    pub subject: String,
    pub stream: Arc<str>,
    /// See [`RawMessage::stream_incarnation`]; empty when not known.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub stream_incarnation: Arc<str>,
    pub stream_sequence: u64,
    pub consumer: Arc<str>,
    pub consumer_sequence: u64,
    /// Publisher message ID (`Nats-Msg-Id`).
    pub message_id: Option<String>,
    pub priority: String,
    pub classification: String,
    /// `labels_list` joined by `;`.
    pub labels: String,
    pub labels_list: Vec<String>,
    pub payload: Payload,
    pub payload_info: PayloadInfo,
    pub security_labels: Option<Value>,
    /// Mission metadata (`docs/governance.md`), when the stage gave one; absent from the
    /// serialized envelope otherwise, so records of runners without the stage keep their
    /// shape (the object-store body always holds the member, `null` when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mission_metadata: Option<Value>,
    /// Custody evidence (`svc.custody.v1`), when `custody.enabled`; absent from the
    /// serialized envelope otherwise (see `docs/payload-protection.md`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custody: Option<Custody>,
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
    /// Source time: the valid event time header, else the broker's time, Unix ns.
    pub source_unix_nanos: Option<i128>,
    /// Age at receive in seconds (0 when the source time is in the future).
    pub age_seconds: Option<f64>,
    pub stale: bool,
    pub missing_publisher_timestamp: bool,
    pub malformed_timestamp: bool,
    pub clock_skew: bool,
    /// The event time header is far from when the broker stored the message (see
    /// [`MAX_EVENT_TIME_LAG_SECONDS`]): kept in the envelope, left out of the age.
    pub implausible_event_time: bool,
}

/// An event time more than this before the broker stored the message is implausible for a
/// live stream (`0001-01-01T00:00:00Z` would add 6.3e10 s to the event-age sums and fire
/// `SvcEventAgeHigh`): counted on its own, and the broker's time is the source time instead.
pub const MAX_EVENT_TIME_LAG_SECONDS: i128 = 10 * 366 * 86_400;
/// Likewise an event time more than this after the broker stored the message (a publisher's
/// clock a little ahead is `clock_skew`, not this).
pub const MAX_EVENT_TIME_LEAD_SECONDS: i128 = 3_600;

/// The custody block of one record (`svc.custody.v1`): plain data the envelope holds;
/// `message::protection::custody` seals and verifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Custody {
    pub schema: String,
    /// `sha256` or `hmac-sha256`.
    pub alg: String,
    pub runner_id: String,
    /// When the runner received the message (RFC 3339).
    pub received_at: String,
    /// When the runner computed this block (RFC 3339).
    pub sealed_at: String,
    /// Hex digest of the payload bytes as received.
    pub payload_digest: String,
    /// Hex digest of the canonical record and this block (see the module docs).
    pub record_digest: String,
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
    let stored = msg.published_unix_nanos.unwrap_or(received_unix_nanos);
    // Saturating: the times are the broker's and the publisher's, never trusted to be sane.
    let plausible = |t: &i128| {
        (stored.saturating_sub(MAX_EVENT_TIME_LAG_SECONDS * 1_000_000_000)
            ..=stored.saturating_add(MAX_EVENT_TIME_LEAD_SECONDS * 1_000_000_000))
            .contains(t)
    };
    fresh.implausible_event_time = event_time.is_some_and(|t| !plausible(&t));
    fresh.source_unix_nanos = event_time.filter(plausible).or(msg.published_unix_nanos);
    if let Some(source) = fresh.source_unix_nanos {
        let age = received_unix_nanos.saturating_sub(source) as f64 / 1e9;
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
        stream_incarnation: msg.stream_incarnation.clone(),
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
        mission_metadata: None,
        custody: None,
        metadata: EventMetadata {
            schema: METADATA_SCHEMA,
            received_at: Rfc3339::from_unix_nanos(received_unix_nanos),
            published_at: msg.published_unix_nanos.map(Rfc3339::from_unix_nanos),
            event_time: event_time.map(Rfc3339::from_unix_nanos),
            delivery_count: msg.delivery_count,
            headers,
            security_labels: None,
        },
    };
    (envelope, fresh)
}

/// The normalized payload: one JSON value, kept as compact JSON text and written verbatim.
///
/// A JSON payload keeps its publisher's text (key order, the exact digits of every number)
/// minus insignificant whitespace. Parsing it into a tree and printing it again cost more
/// than the rest of the envelope, sorted the keys, and rounded integers beyond 64 bits
/// through f64.
#[derive(Debug, Clone)]
pub struct Payload(Box<RawValue>);

impl Payload {
    /// The payload of a JSON document, or `None` when `data` is not one (see [`compact`]) or
    /// is one that every reader cannot take alike (see [`readable_alike`]).
    fn from_json(data: &[u8]) -> Option<Payload> {
        let raw: &RawValue = serde_json::from_slice(data).ok()?;
        let text = compact(raw.get())?;
        if !readable_alike(&text) {
            return None;
        }
        match text {
            Cow::Borrowed(_) => Some(Payload(raw.to_owned())),
            Cow::Owned(text) => RawValue::from_string(text).ok().map(Payload),
        }
    }

    /// `{"<key>": "<value>"}`: how text and bytes are wrapped.
    fn wrapped(key: &str, value: &str) -> Payload {
        let doc = serde_json::json!({ key: value });
        Payload(serde_json::value::to_raw_value(&doc).expect("a one-string object serializes"))
    }

    /// A payload from compact JSON text the caller built (no whitespace outside strings);
    /// `None` when it is not one JSON value.
    pub fn from_compact_json(text: String) -> Option<Payload> {
        RawValue::from_string(text).ok().map(Payload)
    }

    /// A payload read back from text this runner wrote as a payload (the spool's records):
    /// kept as it is, not validated or compacted again.
    pub fn from_raw(raw: Box<RawValue>) -> Payload {
        Payload(raw)
    }

    /// The compact JSON text.
    pub fn json(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        self.json() == other.json()
    }
}

impl Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Deepest nesting of a JSON payload kept as JSON; a deeper document is wrapped as text. The
/// envelope is one for every sink (custody digests, fan-out), so the bound is the strictest
/// store's: MariaDB's `JSON_VALID` (the MySQL engine's `CHECK`) refuses 32 levels or more
/// (atk52b finding 2: such rows were refused for good; MySQL 8 takes 100, serde_json 127).
const MAX_JSON_DEPTH: usize = 31;

/// `text` (valid JSON grammar) without whitespace outside strings, borrowed when it has none.
///
/// `None` for what a JSON parser rejects although the grammar allows it, so the payload is
/// wrapped as text instead: nesting deeper than [`MAX_JSON_DEPTH`], and `\u` escapes of
/// unpaired UTF-16 surrogates (they denote no character; PostgreSQL's `jsonb` refuses them).
fn compact(text: &str) -> Option<Cow<'_, str>> {
    let bytes = text.as_bytes();
    // Fast path: with no whitespace and no escape anywhere (looked for eight bytes at a time),
    // and too few brackets to nest too deep (one branch-free, vectorized pass), there is
    // nothing to walk. Valid JSON holds no raw control characters, so a byte up to b' ' is
    // whitespace.
    use crate::text::scan::{byte_mask, find, less_mask};
    let whitespace_or_escape = find(
        bytes,
        0,
        |w| (less_mask(w, b' ' + 1) | byte_mask(w, b'\\')) != 0,
        |b| b <= b' ' || b == b'\\',
    );
    if whitespace_or_escape.is_none()
        && count_bytes(bytes, |b| (b == b'{') | (b == b'[')) <= MAX_JSON_DEPTH
    {
        return Some(Cow::Borrowed(text));
    }
    let mut out: Option<String> = None;
    // Start of the bytes not yet copied to `out`.
    let mut copied = 0;
    let mut depth = 0;
    let mut in_string = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'"' => in_string = false,
                b'\\' if bytes[i + 1] == b'u' => {
                    i += escaped_code_point_len(&bytes[i..])? - 1;
                }
                b'\\' => i += 1,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => {
                    depth += 1;
                    if depth > MAX_JSON_DEPTH {
                        return None;
                    }
                }
                b'}' | b']' => depth -= 1,
                b' ' | b'\t' | b'\n' | b'\r' => {
                    let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
                    o.push_str(&text[copied..i]);
                    copied = i + 1;
                }
                _ => {}
            }
        }
        i += 1;
    }
    Some(match out {
        None => Cow::Borrowed(text),
        Some(mut o) => {
            o.push_str(&text[copied..]);
            Cow::Owned(o)
        }
    })
}

/// Longest a JSON number may become when written without an exponent (as PostgreSQL prints
/// its `numeric`): 64 characters holds every 64- and 128-bit integer and every decimal128,
/// while `1e131071` (8 bytes, 131,072 characters printed) and a 10,000-digit literal do not.
pub const MAX_PLAIN_NUMBER_LEN: u64 = 64;

/// Whether every reader of the stored payload gets the same value from it, and can read it
/// back at all: no object with a duplicate key (a file keeps both values, PostgreSQL the last,
/// custody could cover only one), no number longer than [`MAX_PLAIN_NUMBER_LEN`] written out
/// (`[1e131071, ...]` is 2.5 KB in `jsonb` and an out-of-memory error for every `SELECT` of
/// the table), no string holding U+0000 (PostgreSQL refuses `\u0000` in `jsonb`, so the
/// message was never stored). A payload that fails is kept as text instead, exactly as sent.
///
/// Read by [`canonical::scan`]: the checks of a strict parse, without building its tree.
fn readable_alike(text: &str) -> bool {
    let mut value = |v: &Json<'_>| match v {
        Json::Number(d) => d.plain_len() <= MAX_PLAIN_NUMBER_LEN,
        Json::String(s) => !s.contains('\0'),
        Json::Array(_) | Json::Object(_) | Json::Null | Json::Bool(_) => true,
    };
    let mut key = |k: &str| !k.contains('\0');
    canonical::scan(text, &mut value, &mut key) == Ok(true)
}

/// How many of `bytes` are `wanted` (generic, so the test inlines and the loop vectorizes).
/// Counted in bytes, 255 at most per chunk, then added up: a sum kept in a `usize` per byte
/// vectorized two lanes at a time and cost about 5 instructions per payload byte, a byte
/// counter sixteen (h53http, callgrind).
fn count_bytes(bytes: &[u8], wanted: impl Fn(u8) -> bool) -> usize {
    bytes
        .chunks(255)
        .map(|chunk| {
            let n = chunk
                .iter()
                .fold(0u8, |n, &b| n.wrapping_add(u8::from(wanted(b))));
            usize::from(n)
        })
        .sum()
}

/// Length of the `\uXXXX` escape (or surrogate pair of two) at the start of `s`; `None` for
/// an unpaired surrogate. `s` is valid JSON string content, so the four hex digits exist.
fn escaped_code_point_len(s: &[u8]) -> Option<usize> {
    let unit = |at: usize| {
        s.get(at..at + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u16::from_str_radix(h, 16).ok())
    };
    match unit(2)? {
        0xD800..=0xDBFF => {
            let low = (s.get(6..8) == Some(b"\\u".as_slice()))
                .then(|| unit(8))
                .flatten()?;
            (0xDC00..=0xDFFF).contains(&low).then_some(12)
        }
        0xDC00..=0xDFFF => None,
        _ => Some(6),
    }
}

/// `json_or_envelope`: a JSON document every reader takes alike stays a JSON value; UTF-8
/// text without U+0000 is wrapped as a string; anything else is wrapped as base64.
pub fn normalize_payload(data: &[u8]) -> (Payload, PayloadInfo) {
    let sha256 = hex_sha256(data);
    let size_bytes = data.len() as u64;
    let (payload, original_format, wrapped) = match Payload::from_json(data) {
        Some(p) => (p, PayloadFormat::Json, false),
        None => match std::str::from_utf8(data) {
            // U+0000 is valid UTF-8 but no PostgreSQL text or `jsonb` string holds it: such a
            // payload travels as bytes, which every sink stores alike.
            Ok(text) if !text.contains('\0') => {
                (Payload::wrapped("text", text), PayloadFormat::Text, true)
            }
            Ok(_) | Err(_) => (
                Payload::wrapped(
                    "base64",
                    &base64::engine::general_purpose::STANDARD.encode(data),
                ),
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
            keyed: false,
        },
    )
}

/// Lower-case hex SHA-256 of `data` (in `text::hex`, which the exporter shares).
pub use crate::text::hex::sha256 as hex_sha256;

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
            consumer_sequence: 7,
            published_unix_nanos: Some(1_700_000_000_000_000_000),
            headers: vec![
                ("Nats-Msg-Id".into(), "abc".into()),
                ("Authorization".into(), "Bearer hunter2".into()),
                ("Content-Type".into(), "application/json".into()),
            ],
            ..RawMessage::sample("orders.created", 42, data)
        }
    }

    #[test]
    fn bytes_are_counted_across_chunks_as_one_by_one() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut bytes = Vec::new();
        for len in (0..2_000).step_by(7).chain([255, 256, 510, 511, 65_536]) {
            bytes.clear();
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                bytes.push(if x % 3 == 0 { b'{' } else { x as u8 });
            }
            let wanted = |b: u8| (b == b'{') | (b == b'[');
            let naive = bytes.iter().filter(|&&b| wanted(b)).count();
            assert_eq!(count_bytes(&bytes, wanted), naive, "{len}");
        }
        assert_eq!(count_bytes(&[b'{'; 1_000], |b| b == b'{'), 1_000);
    }

    #[test]
    fn json_payload_stays_json() {
        let (e, _) = normalize(
            &msg(br#"{"a":1}"#),
            1_700_000_001_000_000_000,
            &EnvelopeConfig::default(),
        );
        assert_eq!(e.payload.json(), r#"{"a":1}"#);
        let tree: Value = serde_json::from_str(e.payload.json()).unwrap();
        assert_eq!(tree, serde_json::json!({"a": 1}));
        assert_eq!(e.payload_info.original_format, PayloadFormat::Json);
        assert!(!e.payload_info.wrapped);
        assert_eq!(e.payload_info.size_bytes, 7);
        assert_eq!(e.payload_info.sha256, hex_sha256(br#"{"a":1}"#));
        assert_eq!(e.message_id.as_deref(), Some("abc"));
        assert_eq!(e.stream_sequence, 42);
        assert_eq!(e.metadata.schema, "svc.metadata.v1");
    }

    /// The publish time is the broker's (its ack subject, an int64 since review atk46c) and the
    /// event time the publisher's: no value of either makes the ages overflow (a panic in a
    /// debug build ended a replay's normalizer; a release build wrapped to a wrong age).
    #[test]
    fn extreme_publish_and_receive_times_do_not_overflow() {
        for published in [
            i128::from(i64::MIN),
            i128::from(i64::MAX),
            i128::MIN,
            i128::MAX,
            0,
        ] {
            for received in [
                i128::from(i64::MIN),
                i128::from(i64::MAX),
                1_700_000_000_000_000_000,
            ] {
                let m = RawMessage {
                    published_unix_nanos: Some(published),
                    ..msg(b"{}")
                };
                let (_, fresh) = normalize(&m, received, &EnvelopeConfig::default());
                assert!(
                    fresh.age_seconds.is_some_and(|a| a >= 0.0),
                    "{published} {received}"
                );
            }
        }
    }

    /// The normalized text of a payload and whether it stayed JSON.
    fn normalized(data: &[u8]) -> (String, PayloadFormat) {
        let (p, info) = normalize_payload(data);
        (p.json().to_string(), info.original_format)
    }

    #[test]
    fn json_payload_keeps_its_text_without_insignificant_whitespace() {
        let json = |s: &str| (s.to_string(), PayloadFormat::Json);
        assert_eq!(
            normalized(b" {\"z\": 1,\n \"a\" :[ true , null ]}\r\n"),
            json(r#"{"z":1,"a":[true,null]}"#),
            "publisher key order kept, whitespace outside strings dropped"
        );
        assert_eq!(
            normalized(br#"{"s": "two  spaces, \"quoted  \" \\ "}"#),
            json(r#"{"s":"two  spaces, \"quoted  \" \\ "}"#),
            "string content untouched, escaped quotes and backslashes included"
        );
        assert_eq!(
            normalized(b"[123456789012345678901234567890, 1.50, -0.0, 1e40]"),
            json("[123456789012345678901234567890,1.50,-0.0,1e40]"),
            "numbers keep their exact digits"
        );
        assert_eq!(
            normalized(br#""\ud83d\ude00 \u00e9""#),
            json(r#""\ud83d\ude00 \u00e9""#),
            "a surrogate pair is a character"
        );
        let compact = br#"{"order":1,"pad":"xx"}"#;
        assert_eq!(normalized(compact), json(r#"{"order":1,"pad":"xx"}"#));
    }

    /// One rule for every sink: JSON that readers could take differently, or not read back,
    /// is stored as the text it is.
    #[test]
    fn json_readers_would_disagree_on_is_wrapped_as_text() {
        let big_exponents = format!("[{}]", vec!["1e131071"; 9_000].join(","));
        let long_literal = "9".repeat(65);
        for data in [
            br#"{"amount":1,"amount":2}"#.as_slice(),
            br#"{"a":{"b":1,"\u0062":2}}"#,
            big_exponents.as_bytes(),
            long_literal.as_bytes(),
            b"[1e-64]",
            br#"{"note":"ab\u0000cd"}"#,
            br#"{"a\u0000":1}"#,
        ] {
            let (text, format) = normalized(data);
            assert_eq!(format, PayloadFormat::Text, "{text}");
            let wrapped: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(wrapped["text"].as_str().unwrap().as_bytes(), data);
        }
        // At the bound, and ordinary numbers, stay JSON.
        let at_bound = "9".repeat(64);
        for data in [
            at_bound.as_bytes(),
            b"[1e63, -1.5e-30, 0.000001, 340282366920938463463374607431768211455]".as_slice(),
            br#"{"a":1,"b":{"a":2}}"#,
        ] {
            assert_eq!(normalized(data).1, PayloadFormat::Json, "{data:?}");
        }
    }

    /// `ab\x00cd` is UTF-8 that no PostgreSQL text holds: bytes, base64, in every sink.
    #[test]
    fn text_with_nul_travels_as_bytes() {
        let (text, format) = normalized(b"ab\x00cd");
        assert_eq!(format, PayloadFormat::Bytes);
        assert_eq!(text, r#"{"base64":"YWIAY2Q="}"#);
    }

    #[test]
    fn what_a_json_parser_refuses_is_wrapped_as_text() {
        for data in [
            br#"{"a":"\ud800"}"#.as_slice(),
            br#"["\udc00"]"#,
            br#"["\ud800\u0041"]"#,
            br#"{"a":1,}"#,
            b"{\"a\":1} trailing",
            b"",
        ] {
            assert_eq!(normalized(data).1, PayloadFormat::Text, "{data:?}");
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes();
        // MariaDB's JSON_VALID takes 31 levels, not 32 (the strictest store); serde_json 127.
        assert_eq!(MAX_JSON_DEPTH, 31);
        assert_eq!(normalized(&deep(MAX_JSON_DEPTH)).1, PayloadFormat::Json);
        assert_eq!(normalized(&deep(MAX_JSON_DEPTH + 1)).1, PayloadFormat::Text);
        assert!(serde_json::from_slice::<Value>(&deep(127)).is_ok());
        assert_eq!(normalized(&deep(127)).1, PayloadFormat::Text);
    }

    #[test]
    fn text_and_bytes_are_wrapped() {
        let (e, _) = normalize(&msg(b"hello"), 0, &EnvelopeConfig::default());
        assert_eq!(e.payload.json(), r#"{"text":"hello"}"#);
        assert_eq!(e.payload_info.original_format, PayloadFormat::Text);
        assert!(e.payload_info.wrapped);
        let (e, _) = normalize(&msg(&[0xff, 0x00, 0x01]), 0, &EnvelopeConfig::default());
        assert_eq!(e.payload.json(), r#"{"base64":"/wAB"}"#);
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

    /// A publisher's `0001-01-01T00:00:00Z` (or a year ahead) is kept in the envelope but
    /// flagged, and the broker's time gives the age.
    #[test]
    fn implausible_event_times_are_flagged_and_left_out_of_the_age() {
        let cfg = EnvelopeConfig::default();
        let recv = 1_700_000_400_000_000_000;
        for (time, implausible) in [
            ("0001-01-01T00:00:00Z", true),
            ("2024-11-14T22:13:20Z", true),
            ("2013-11-01T00:00:00Z", true),
            ("2014-11-20T22:13:20Z", false),
            ("2023-11-14T23:13:20Z", false),
            ("2023-11-14T23:13:21Z", true),
        ] {
            let mut m = msg(b"{}");
            m.headers.push(("Svc-Event-Time".into(), time.into()));
            let (e, f) = normalize(&m, recv, &cfg);
            assert_eq!(f.implausible_event_time, implausible, "{time}");
            assert_eq!(e.metadata.event_time.as_deref(), Some(time));
            if implausible {
                assert_eq!(f.age_seconds, Some(400.0), "{time}: the broker's time");
                assert!(!f.clock_skew, "{time}");
            }
        }
    }

    /// The metadata written by hand is byte for byte serde_json's: times present and absent,
    /// hostile header names and values, a security label profile.
    #[test]
    fn metadata_json_is_what_serde_writes() {
        let cfg = EnvelopeConfig {
            keep_headers: vec!["X-A".into(), "b\"\\\u{1}".into(), "Svc-Event-Time".into()],
            ..EnvelopeConfig::default()
        };
        let mut m = msg(b"{}");
        let check = |m: &RawMessage, labels: Option<Value>| {
            let (mut e, _) = normalize(m, 1_700_000_000_123_456_789, &cfg);
            e.metadata.security_labels = labels;
            let by_serde = serde_json::to_string(&e.metadata).unwrap();
            assert_eq!(e.metadata.to_json().unwrap(), by_serde);
            let mut out = b"x".to_vec();
            e.metadata.write_json(&mut out).unwrap();
            assert_eq!(out[1..], *by_serde.as_bytes());
        };
        check(&m, None);
        m.published_unix_nanos = None;
        m.delivery_count = u64::MAX;
        m.headers
            .push(("X-A".into(), "v\"\n\t\u{7f}é😀\u{1f}".into()));
        m.headers.push(("b\"\\\u{1}".into(), String::new()));
        m.headers.push((
            "Svc-Event-Time".into(),
            "2023-11-14T22:13:30.5+01:00".into(),
        ));
        check(
            &m,
            Some(serde_json::json!({"level": "s\"", "n": [1, 2.5, null]})),
        );
        check(&m, None);
    }

    /// [`readable_alike`] as it was: the tree of [`canonical::parse`], walked.
    fn readable_alike_by_tree(text: &str) -> bool {
        fn walk(v: &Json<'_>) -> bool {
            match v {
                Json::Number(d) => d.plain_len() <= MAX_PLAIN_NUMBER_LEN,
                Json::String(s) => !s.contains('\0'),
                Json::Array(items) => items.iter().all(walk),
                Json::Object(members) => members.iter().all(|(k, v)| !k.contains('\0') && walk(v)),
                Json::Null | Json::Bool(_) => true,
            }
        }
        canonical::parse(text).is_ok_and(|doc| walk(&doc))
    }

    /// A random document for [`readable_alike_without_a_tree_answers_as_the_tree`]: atoms,
    /// arrays and objects of them, or brackets that may not match.
    fn random_doc(
        next: &mut impl FnMut(usize) -> usize,
        atoms: &[&str],
        keys: &[&str],
        d: u32,
    ) -> String {
        match next(if d > 5 { 1 } else { 4 }) {
            0 => atoms[next(atoms.len())].to_string(),
            1 => {
                let items: Vec<String> = (0..next(4))
                    .map(|_| random_doc(next, atoms, keys, d + 1))
                    .collect();
                format!("[{}]", items.join(","))
            }
            2 => {
                let members: Vec<String> = (0..next(4))
                    .map(|_| {
                        format!(
                            "\"{}\":{}",
                            keys[next(keys.len())],
                            random_doc(next, atoms, keys, d + 1)
                        )
                    })
                    .collect();
                format!("{{{}}}", members.join(", "))
            }
            _ => "[".repeat(next(300)) + &"]".repeat(next(300)),
        }
    }
    /// Random documents rich in what [`readable_alike`] refuses (duplicate keys, also spelled
    /// with escapes; `\u0000` in keys and values; long and out-of-range numbers; deep nesting;
    /// broken text): the scan without a tree answers as the tree did, and the payload each
    /// makes is the same.
    #[test]
    fn readable_alike_without_a_tree_answers_as_the_tree() {
        let atoms = [
            "0",
            "-0.0",
            "1.5",
            "1e64",
            "1e63",
            "1e65",
            "12345678901234567890",
            "0.000001e-60",
            "1e9999999999",
            "1E+0999999999",
            "0e99999999999",
            "-1.50e-3",
            "\"\"",
            "\"x\"",
            "\"\\u0000\"",
            "\"a\\u0000b\"",
            "\"\\\\u0000\"",
            "\"\\ud83d\\ude00\"",
            "true",
            "null",
            "false",
            "\"é😀\\n\"",
            "01",
            "1.",
            "\"\\u0041\"",
            "nul",
            "[",
            "}",
        ];
        let keys = [
            "a",
            "b",
            "\\u0061",
            "\\u0000",
            "",
            "é",
            "a\\u0000",
            "\\\\u0000",
        ];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let (mut yes, mut no) = (0, 0);
        for _ in 0..20_000 {
            let text = random_doc(&mut next, &atoms, &keys, 0);
            let old = readable_alike_by_tree(&text);
            assert_eq!(readable_alike(&text), old, "{text}");
            if old {
                yes += 1
            } else {
                no += 1
            }
            let (p, info) = normalize_payload(text.as_bytes());
            let expected = match serde_json::from_str::<&RawValue>(&text) {
                Ok(raw) if old && compact(raw.get()).is_some() => PayloadFormat::Json,
                _ => PayloadFormat::Text,
            };
            assert_eq!(info.original_format, expected, "{text} -> {}", p.json());
        }
        assert!(yes > 2_000 && no > 2_000, "{yes} readable, {no} not");
    }

    #[test]
    fn normalize_is_deterministic() {
        let a = normalize(&msg(b"x"), 5, &EnvelopeConfig::default());
        let b = normalize(&msg(b"x"), 5, &EnvelopeConfig::default());
        assert_eq!(a, b);
    }

    // ---- atk52b: attacks on the metadata JSON written by hand (h52perf) -----------------

    /// atk52b: header names and values made of every character up to U+0800, the
    /// surrogate neighbours, U+2028/9, U+FEFF, U+FFFF, U+10FFFF and bidi controls, one by one
    /// and packed across 8-byte words; times absent and at the limits; delivery counts at the
    /// edges; security labels with numbers serde writes in odd forms (1e21, -0.0, u64::MAX,
    /// i64::MIN, the largest and the smallest doubles). write_json is byte for byte serde's,
    /// and the text is JSON a strict parse reads back.
    #[test]
    fn held_atk52b_metadata_json_is_serde_for_every_character() {
        let mut chars: Vec<char> = (0u32..0x800).filter_map(char::from_u32).collect();
        chars.extend([
            '\u{d7ff}', '\u{e000}', '\u{2028}', '\u{2029}', '\u{feff}', '\u{ffff}',
        ]);
        chars.extend(['\u{10ffff}', '\u{202e}', '\u{2066}', '\u{200e}', '\u{61c}']);
        let labels = [
            None,
            Some(serde_json::json!({
                "a": 1e21, "b": -0.0, "c": u64::MAX, "d": i64::MIN, "e": f64::MAX,
                "f": f64::MIN_POSITIVE, "g": 5e-324, "h": 0.1, "i": 1e-7, "j": 123456789.0,
                "k": "\u{0}\u{1f}\u{7f}\u{2028}\"\\", "\u{0}": [null, true, {}],
            })),
        ];
        let base = msg(b"{}");
        let cfg = EnvelopeConfig::default();
        let (env, _) = normalize(&base, 1_700_000_000_123_456_789, &cfg);
        let mut m = env.metadata.clone();
        let check = |m: &EventMetadata| {
            let by_serde = serde_json::to_vec(m).unwrap();
            let mut ours = Vec::new();
            m.write_json(&mut ours).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&by_serde)
            );
            let text = String::from_utf8(ours).unwrap();
            assert!(crate::document::canonical::parse(&text).is_ok(), "{text}");
        };
        for (n, c) in chars.iter().enumerate() {
            m.headers.clear();
            m.headers
                .insert(c.to_string(), format!("{c}{c}{c}{c}{c}{c}{c}{c}{c}"));
            m.headers
                .insert(format!("x{c}"), "y".repeat(n % 17) + &c.to_string());
            m.delivery_count = [0, 1, 9, 10, u64::MAX, n as u64][n % 6];
            m.published_at = (n % 2 == 0).then(|| Rfc3339::from_unix_nanos(-(n as i128)));
            m.event_time = (n % 3 == 0).then(|| Rfc3339::from_unix_nanos(i128::MAX));
            m.security_labels = labels[n % 2].clone();
            check(&m);
        }
        let packed: String = chars.iter().collect();
        m.headers.clear();
        for shift in 0..9 {
            m.headers
                .insert(packed[..shift].to_string(), packed.clone());
            m.headers
                .insert(format!("{}{packed}", "z".repeat(shift)), String::new());
        }
        check(&m);
    }

    /// atk52b: `labels_list` for MySQL written by hand is what serde wrote, for lists of
    /// every character, empty strings and hostile text.
    #[test]
    fn held_atk52b_string_array_is_serde() {
        let chars: Vec<String> = (0u32..0x800)
            .filter_map(char::from_u32)
            .map(|c| format!("{c}{}{c}", "k".repeat(7)))
            .collect();
        for n in 0..chars.len() {
            let items = &chars[n.saturating_sub(9)..n];
            assert_eq!(
                crate::text::json::string_array(items),
                serde_json::to_string(items).unwrap()
            );
        }
    }

    /// atk52b: readable_alike (scan) against the tree walk it replaced, on hostile payloads
    /// that reach it (valid JSON for serde_json, up to 127 deep): duplicate keys spelled by
    /// escapes, `\u0000` in keys and values, long and out-of-range numbers.
    #[test]
    fn held_atk52b_readable_alike_is_the_tree_on_hostile_payloads() {
        let texts = [
            r#"{"a":1,"\u0061":2}"#,
            r#"{"a\u0000":1,"a\u0000":2}"#,
            r#"{"a":{"b":1},"c":[{"b":1,"b":2}]}"#,
            r#"{"k":1e64}"#,
            r#"{"k":1e65}"#,
            r#"{"k":1e-63}"#,
            r#"{"k":0.000000000000000000000000000000000000000000000000000000000001}"#,
            r#"[1e999999999]"#,
            r#"[1e1000000000]"#,
            r#"[0e1000000000]"#,
            r#"[-0.0e-99999]"#,
            r#"["\u0000"]"#,
            r#"["\\u0000"]"#,
            r#"{"\\u0000":1}"#,
        ];
        for text in texts {
            assert_eq!(readable_alike(text), readable_alike_by_tree(text), "{text}");
        }
        let deep = format!("{}1{}", "[".repeat(127), "]".repeat(127));
        assert_eq!(readable_alike(&deep), readable_alike_by_tree(&deep));
        let kept = format!("{}1{}", "[".repeat(31), "]".repeat(31));
        let (p, info) = normalize_payload(kept.as_bytes());
        assert_eq!(info.original_format, PayloadFormat::Json, "{}", p.json());
    }
}
