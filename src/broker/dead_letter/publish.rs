//! Publishing a dead letter and waiting for the broker's confirmation (JetStream PubAck),
//! and the start-up check of the streams that capture the DLQ subject.

use std::fmt;
use std::time::Instant;

use super::config::{DeadLetterConfig, REASON_HEADER};
use super::record::DeadLetter;
use super::stored::{is_stream_name, same_record, stored_message, MAX_STORED_RECORD_REPLY_BYTES};
use crate::message::envelope::MESSAGE_ID_HEADER;
use crate::text::peer::{PeerText, PEER_TEXT_MAX_CHARS};

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
            match crate::broker::incarnation::stream_info(&self.nc, stream, timeout) {
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
pub(super) const MAX_STREAMS_CHECKED: usize = 4;

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
