//! Deliveries: pull requests, each delivery split into plain data and an ack handle (its ack
//! subject parsed strictly), and the names that tell a consumer created again.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nats::jetstream::BatchOptions;

use super::{Connection, PullSubscription};
use crate::message::envelope::{HeaderBlock, RawMessage};
use crate::text::peer::PeerText;

/// Queues one pull request. The client writes it within its flusher's 5 ms floor; call
/// [`flush`] (from a thread that may wait) to write it at once.
pub fn request_batch(
    sub: &PullSubscription,
    batch: usize,
    max_bytes: Option<usize>,
    expires: Duration,
) -> io::Result<()> {
    sub.request_batch(BatchOptions {
        batch,
        expires: Some(expires.as_nanos() as usize),
        no_wait: false,
        max_bytes,
    })
}

/// Makes the broker forget this subscription's open pull requests (it delivers into a waiting
/// request only while its reply subject has interest: the `UNSUB` ends that), while what it
/// delivered before reading the `UNSUB` still arrives here. For a clean stop: a NAK then goes
/// back to the broker for another runner, not into one of our own requests again.
pub fn forget_pull_requests(sub: &PullSubscription) -> io::Result<()> {
    sub.stop_interest()
}

/// The broker's confirmation that a request brought all its messages (nats-server 2.10 and
/// later, for requests with `max_bytes`): not the end of any request still open.
pub(super) fn batch_completed(status: &str, description: Option<&str>) -> bool {
    status.trim() == "409"
        && description.is_some_and(|d| d.trim().eq_ignore_ascii_case("batch completed"))
}

/// True when a pull request ended because the next message did not fit in its `max_bytes`.
pub fn message_over_max_bytes(status: &str) -> bool {
    let status = status.trim_start();
    status.starts_with("409") && status.to_ascii_lowercase().contains("exceeds maxbytes")
}

/// The largest message the connected server accepts (`max_payload` of its INFO).
pub fn max_payload(nc: &Connection) -> usize {
    nc.max_payload()
}

/// Writes everything queued on the connection now and waits for the server's PONG. The wait
/// can be long: the PONG comes after every message already on its way to us, so only a thread
/// that has nothing else to do should call this (`svc-flush`).
pub fn flush(nc: &Connection, timeout: Duration) -> io::Result<()> {
    nc.flush_timeout(timeout)
}

/// A message's headers as the envelope takes them: its (name, value) pairs in order (none
/// when the block could not be read, `unreadable`) and the size of the block as received.
/// The delivery path and `svc dlq redrive` (for a message read back from the stream) share it.
pub fn header_pairs(
    headers: Option<nats::HeaderMap>,
    unreadable: bool,
) -> (Vec<(String, String)>, HeaderBlock) {
    let block = headers.as_ref().map_or_else(Default::default, |h| {
        let counted = h.counted();
        HeaderBlock {
            lines: counted.lines,
            bytes: counted.bytes,
        }
    });
    let pairs = headers
        .filter(|_| !unreadable)
        .map(|h| {
            // Exactly as many pairs as held: a growing vector could hold twice the room, which
            // the credit (`pipeline::fetch::delivery_bytes`) does not charge.
            let mut pairs = Vec::with_capacity(h.values().map(|vs| vs.len()).sum());
            pairs.extend(
                h.iter()
                    .flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.clone()))),
            );
            pairs
        })
        .unwrap_or_default();
    (pairs, block)
}

/// What one wait on the subscription produced.
// A message is the common case and moves straight into a batch: boxing it would cost an
// allocation per delivery to shrink a value that only lives on `svc-fetch`'s stack.
#[allow(clippy::large_enum_variant)]
pub enum Delivery {
    /// A message to process, split into data and its acknowledgement handle, with the
    /// consumer's messages still to deliver after it (the broker's count in the ack subject).
    Message {
        raw: RawMessage,
        handle: AckHandle,
        pending: u64,
    },
    /// The oldest outstanding pull request ended (408 expiry, 409 limits) without filling.
    RequestEnded(RequestEnd),
    /// Nothing arrived within the wait.
    Idle,
    /// The subscription is gone (connection closed).
    Closed,
}

/// Which incarnation of the bound consumer (and so of its stream) deliveries come from,
/// counted from 0 at bind. An ack subject names stream, consumer and stream sequence, not the
/// incarnation: an acknowledgement of a delivery made before the consumer was created again
/// (with its stream, say) settles the new consumer's message of the same sequence, unwritten.
/// `svc-fetch` advances it the moment a delivery shows the consumer created again (before
/// anything else, even the stream info read); `svc-ack` compares each handle's generation
/// with it and sends nothing for an older one. One atomic, read once per batch: no lock on
/// the ACK path.
#[derive(Debug, Default)]
pub struct AckGeneration(AtomicU64);

impl AckGeneration {
    /// The generation of deliveries made now.
    pub fn current(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn advance(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// The stream and consumer names of recent deliveries, shared by every message that carries
/// the same names instead of allocated per message.
#[derive(Default)]
pub struct DeliveryNames {
    stream: Option<Arc<str>>,
    consumer: Option<Arc<str>>,
    /// The bound stream's incarnation, stamped on every delivery.
    incarnation: Arc<str>,
    /// Shared with `svc-ack`; `generation` is its value as this side last set it.
    shared_generation: Arc<AckGeneration>,
    pub(super) generation: u64,
    /// The highest consumer sequence delivered so far. The broker numbers every delivery of a
    /// consumer, redeliveries included, upwards from 1: a lower one comes from a consumer
    /// created again, perhaps on a stream created again ([`DeliveryNames::take_restart`]).
    last_consumer_sequence: u64,
    restarted: bool,
    /// The generation was advanced for the delivery being named (its consumer sequence went
    /// back): a stream found created again then needs no second one.
    generation_fresh: bool,
}

impl DeliveryNames {
    /// Names for the deliveries of a consumer on the stream of `incarnation` (read at bind).
    /// The first delivery reads it again: a stream and consumer created again between the
    /// bind and that delivery number from 1, above the nothing this runner has seen yet.
    /// `generation` is shared with whoever settles the handles.
    pub fn new(incarnation: Arc<str>, generation: Arc<AckGeneration>) -> DeliveryNames {
        DeliveryNames {
            incarnation,
            generation: generation.current(),
            shared_generation: generation,
            restarted: true,
            ..DeliveryNames::default()
        }
    }

    /// True once after a delivery whose consumer sequence was not above every earlier one:
    /// the consumer was created again since, and its stream may have been too. The caller
    /// reads the stream's incarnation again before that delivery goes on
    /// ([`DeliveryNames::set_incarnation`]).
    pub fn take_restart(&mut self) -> bool {
        std::mem::take(&mut self.restarted)
    }

    pub fn incarnation(&self) -> &Arc<str> {
        &self.incarnation
    }

    /// Asks the next delivery to read the incarnation again (this one's read failed).
    pub fn note_restart(&mut self) {
        self.restarted = true;
    }

    /// The stream was found created again. Unless the delivery being named already started
    /// a generation (its consumer sequence went back), the handles of earlier deliveries
    /// belong to another one from here on (a runner that saw no sequence go back, beside
    /// others on one consumer): returns the new generation, for the delivery's handle.
    pub fn set_incarnation(&mut self, incarnation: Arc<str>) -> Option<u64> {
        self.incarnation = incarnation;
        if std::mem::take(&mut self.generation_fresh) {
            return None;
        }
        self.generation = self.shared_generation.advance();
        Some(self.generation)
    }

    /// A consumer sequence not above every earlier one: the consumer was created again, so
    /// the handles of earlier deliveries belong to another generation from here on.
    pub(super) fn note_consumer_sequence(&mut self, sequence: u64) {
        self.generation_fresh = false;
        if sequence <= self.last_consumer_sequence {
            self.restarted = true;
            self.generation = self.shared_generation.advance();
            self.generation_fresh = true;
        }
        self.last_consumer_sequence = sequence;
    }

    pub(super) fn share(cached: &mut Option<Arc<str>>, name: &str) -> Arc<str> {
        match cached {
            Some(arc) if **arc == *name => Arc::clone(arc),
            _ => Arc::clone(cached.insert(Arc::from(name))),
        }
    }
}

/// Why a pull request ended, as the broker said it.
pub struct RequestEnd {
    /// Status and description, e.g. `409 Message Size Exceeds MaxBytes` (peer text, escaped).
    pub why: String,
    /// The request's byte allowance left unused (`Nats-Pending-Bytes`), when the broker says.
    pub unused_bytes: Option<usize>,
}

/// Waits up to `timeout` for the next delivery.
pub fn next_delivery(
    sub: &PullSubscription,
    timeout: Duration,
    names: &mut DeliveryNames,
) -> Delivery {
    match sub.next_timeout(timeout) {
        Ok(m) => {
            // A pull request's status comes on the version line of a message without an ack
            // subject; a publisher's message always has one, and its `Status` header line is
            // just a header (it once ended the pull request and the message was never seen).
            if let (None, true, Some(h)) = (&m.reply, m.data.is_empty(), &m.headers) {
                if let Some(status) = h.status() {
                    // Current servers confirm a request that a byte allowance came with, once
                    // its last message is delivered (`409 Batch Completed`, nothing pending).
                    // svc-fetch closed that request with its last delivery: taking this for
                    // the end of the next one lost track of a request still open, whose
                    // deliveries a clean stop then left waiting for AckWait.
                    if batch_completed(status, h.description()) {
                        return Delivery::Idle;
                    }
                    // Status and description are the broker's text.
                    let why = format!("{status} {}", h.description().unwrap_or_default());
                    return Delivery::RequestEnded(RequestEnd {
                        why: PeerText::new(why.trim()).to_string(),
                        unused_bytes: h
                            .get("Nats-Pending-Bytes")
                            .and_then(|b| b.trim().parse().ok()),
                    });
                }
            }
            match split(m, names) {
                Some((raw, handle, pending)) => Delivery::Message {
                    raw,
                    handle,
                    pending,
                },
                None => Delivery::Idle,
            }
        }
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Delivery::Idle,
        Err(e) if e.to_string().contains("unsubscribed") => Delivery::Closed,
        // 408: the request expired. The crate quotes the broker's status description.
        Err(e) => Delivery::RequestEnded(RequestEnd {
            why: PeerText::new(&e.to_string()).to_string(),
            unused_bytes: None,
        }),
    }
}

/// The acknowledgement side of a delivery; only `svc-ack` uses it.
#[derive(Debug, Clone)]
pub struct AckHandle {
    pub(super) reply: String,
    pub delivery_count: u64,
    pub stream_sequence: u64,
    /// The [`AckGeneration`] it was delivered under: an older one is never settled.
    pub generation: u64,
}

/// True when a delivery may be one of a consumer switched to `headers_only` under the runner:
/// no payload, and the broker's `Nats-Msg-Size` header (any case), or headers the client
/// could not read. A publisher can send such a message too; only the consumer's config tells
/// (`pipeline/fetch.rs` asks before the batch ships).
pub fn maybe_headers_only(raw: &RawMessage) -> bool {
    // `Nats-Msg-Size: 0` with no payload is an empty message whichever way it came.
    raw.data.is_empty()
        && (raw.unreadable.is_some()
            || raw
                .headers
                .iter()
                .any(|(k, v)| k.eq_ignore_ascii_case("Nats-Msg-Size") && v.trim() != "0"))
}

/// Splits a JetStream delivery into plain data, its ack handle and the consumer's pending
/// count. Messages that are not JetStream deliveries (no ack subject) yield `None`.
pub(super) fn split(
    m: nats::Message,
    names: &mut DeliveryNames,
) -> Option<(RawMessage, AckHandle, u64)> {
    let info = AckSubject::parse(m.reply.as_deref()?)?;
    let stream = DeliveryNames::share(&mut names.stream, info.stream);
    let consumer = DeliveryNames::share(&mut names.consumer, info.consumer);
    let (stream_sequence, consumer_sequence, pending) =
        (info.stream_sequence, info.consumer_sequence, info.pending);
    names.note_consumer_sequence(consumer_sequence);
    let stream_incarnation = Arc::clone(&names.incarnation);
    let delivery_count = info.delivered.max(1);
    let published_unix_nanos = Some(info.published_unix_nanos);
    // The message's own strings and bytes move into the result: no copies per delivery.
    let nats::Message {
        subject,
        reply,
        data,
        headers,
        unreadable,
        ..
    } = m;
    let (headers, header_block) = header_pairs(headers, unreadable.is_some());
    let handle = AckHandle {
        reply: reply?,
        delivery_count,
        stream_sequence,
        generation: names.generation,
    };
    let raw = RawMessage {
        subject,
        stream,
        stream_incarnation,
        consumer,
        stream_sequence,
        consumer_sequence,
        delivery_count,
        published_unix_nanos,
        headers,
        data,
        unreadable,
        header_block,
    };
    Some((raw, handle, pending))
}

/// What the broker encodes in a delivery's ack subject.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct AckSubject<'a> {
    pub(super) stream: &'a str,
    pub(super) consumer: &'a str,
    pub(super) delivered: u64,
    pub(super) stream_sequence: u64,
    pub(super) consumer_sequence: u64,
    pub(super) published_unix_nanos: i128,
    /// The consumer's messages still to deliver after this one, as the broker counted them.
    /// Only advice (it paces the consumer checks): a delivery whose count does not parse
    /// is still a delivery, with 0.
    pub(super) pending: u64,
}

impl AckSubject<'_> {
    /// Parses `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.
    /// <pending>` and the form with a domain and an account hash before the stream (and
    /// possibly a random token after `pending`). The crate's `jetstream_message_info` does the
    /// same but builds a calendar date per message and cost half of `svc-fetch`'s time;
    /// unlike it, a publish time outside years -9999..9999 is not a reason to drop the
    /// delivery.
    pub(super) fn parse(reply: &str) -> Option<AckSubject<'_>> {
        let rest = reply.strip_prefix("$JS.ACK.")?;
        // The tokens of `rest.split('.')`, found in one pass over the bytes (the `str`
        // splitter's searcher cost more than the rest of the delivery's split).
        let mut tokens: [&str; 9] = [""; 9];
        let mut count = 0;
        let mut start = 0;
        for (at, b) in rest.bytes().enumerate() {
            if b == b'.' {
                if let Some(t) = tokens.get_mut(count) {
                    *t = &rest[start..at];
                }
                count += 1;
                start = at + 1;
            }
        }
        if let Some(t) = tokens.get_mut(count) {
            *t = &rest[start..];
        }
        count += 1;
        let t = match count {
            7 => &tokens[..7],
            n if n >= 9 => &tokens[2..9],
            _ => return None,
        };
        // Subjects have no empty tokens: an empty stream or consumer name is not the broker's.
        if t[0].is_empty() || t[1].is_empty() {
            return None;
        }
        Some(AckSubject {
            stream: t[0],
            consumer: t[1],
            delivered: t[2].parse().ok()?,
            stream_sequence: t[3].parse().ok()?,
            consumer_sequence: t[4].parse().ok()?,
            // The broker writes its int64 UnixNano: anything wider is not the broker's (and
            // would overflow the ages computed from it).
            published_unix_nanos: t[5].parse::<i64>().ok()?.into(),
            pending: t[6].parse().unwrap_or(0),
        })
    }
}

/// Fuzzing entry point (`fuzz/fuzz_targets/ack_subject.rs`): [`AckSubject::parse`] as plain
/// values `(stream, consumer, delivered, stream_sequence, consumer_sequence, published)`.
#[doc(hidden)]
pub fn fuzz_parse_ack_subject(reply: &str) -> Option<(&str, &str, u64, u64, u64, i128)> {
    AckSubject::parse(reply).map(|a| {
        let (s, c) = (a.stream, a.consumer);
        (
            s,
            c,
            a.delivered,
            a.stream_sequence,
            a.consumer_sequence,
            a.published_unix_nanos,
        )
    })
}
