//! Dead letters as the broker stores them: read back (`STREAM.MSG.GET`, bounded), compared
//! with the record a publish meant to store, and removed (`STREAM.MSG.DELETE`) by a redrive.

use std::time::{Duration, Instant};

use super::config::DEAD_LETTER_SCHEMA;
use super::record::DeadLetter;
use crate::text::peer::PeerText;

/// Largest `STREAM.MSG.GET` answer read back: a record is a few KiB (values are bounded to
/// [`MAX_HEADER_VALUE_BYTES`](super::config::MAX_HEADER_VALUE_BYTES)), base64 adds a third,
/// headers a little.
pub(super) const MAX_STORED_RECORD_REPLY_BYTES: usize = 256 * 1024;

/// A JetStream stream name as the broker can name it in a subject: no wildcard, separator or
/// white space.
pub(super) fn is_stream_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && !s
            .bytes()
            .any(|b| matches!(b, b'.' | b'*' | b'>') || b.is_ascii_whitespace() || b < 0x20)
}

/// A message as `STREAM.MSG.GET` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoredMessage {
    pub(super) subject: String,
    /// The header block (`hdrs`, base64), empty without headers.
    pub(super) headers: Vec<u8>,
    pub(super) data: Vec<u8>,
}

/// The message of a `STREAM.MSG.GET` answer (`message.subject`, `hdrs` and `data`, base64).
pub(super) fn stored_message(answer: &[u8]) -> Option<StoredMessage> {
    stored_message_of(&serde_json::from_slice(answer).ok()?)
}

/// [`stored_message`] of an answer already read as JSON.
pub(super) fn stored_message_of(v: &serde_json::Value) -> Option<StoredMessage> {
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
pub(super) fn msg_get(
    nc: &nats::Connection,
    stream: &str,
    sequence: u64,
    timeout: Duration,
    max_answer_bytes: usize,
) -> Result<Option<serde_json::Value>, String> {
    match msg_get_any(nc, stream, sequence, timeout, max_answer_bytes)? {
        Got::Missing => Ok(None),
        Got::Message(v) => Ok(Some(v)),
        Got::TooLarge => Err(format!(
            "{stream} sequence {sequence}: the answer is larger than {} KiB",
            max_answer_bytes / 1024
        )),
    }
}

/// What a `STREAM.MSG.GET` answered.
pub(super) enum Got {
    /// The stream holds no message there.
    Missing,
    /// The answer is larger than asked for (not read).
    TooLarge,
    Message(serde_json::Value),
}

/// [`msg_get`], an answer over `max_answer_bytes` told apart from a failure (a reader that
/// looks for small records skips a large message of the same stream).
pub(super) fn msg_get_any(
    nc: &nats::Connection,
    stream: &str,
    sequence: u64,
    timeout: Duration,
    max_answer_bytes: usize,
) -> Result<Got, String> {
    if !is_stream_name(stream) {
        return Err(format!("{} is not a stream name", PeerText::new(stream)));
    }
    let request = serde_json::json!({ "seq": sequence }).to_string();
    let subject = format!("$JS.API.STREAM.MSG.GET.{stream}");
    let reply =
        crate::broker::consumer_shape::flushed_request(nc, &subject, request.as_bytes(), timeout)
            .map_err(|e| format!("reading {stream} sequence {sequence}: {e}"))?;
    if reply.data.len() > max_answer_bytes {
        return Ok(Got::TooLarge);
    }
    let v: serde_json::Value = serde_json::from_slice(&reply.data)
        .map_err(|_| format!("{stream} sequence {sequence}: the answer is not JSON"))?;
    if v["error"]["code"] == 404 {
        return Ok(Got::Missing);
    }
    if let Some(e) = v["error"]["description"].as_str() {
        return Err(format!(
            "reading {stream} sequence {sequence}: {}",
            PeerText::new(e)
        ));
    }
    Ok(Got::Message(v))
}

/// Largest answer to a `STREAM.MSG.DELETE` read.
pub(super) const MAX_DELETE_REPLY_BYTES: usize = 16 * 1024;

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
    let now = crate::broker::incarnation::read_within(nc, stream, timeout)
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
    let reply =
        crate::broker::consumer_shape::flushed_request(nc, &subject, request.as_bytes(), timeout)
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
pub(super) const VARYING_FIELDS: [(&str, &str); 3] = [
    ("", "failed_at"),
    ("original", "delivery_count"),
    ("original", "consumer_sequence"),
];

/// Ok when `stored` is the record `dl` as this runner publishes it: on the DLQ subject, with
/// exactly our headers (`ours`, in any order and letter case of names) and a body equal to
/// ours in every field but [`VARYING_FIELDS`] (no field more, none less). A record under our
/// id with another failure, other headers or another original is not ours, even of the same
/// message: the one stored must say what happened. Err: why not.
pub(super) fn same_record(
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
pub(super) fn header_lines(block: &[u8]) -> Option<Vec<(String, String)>> {
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
