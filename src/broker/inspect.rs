//! A read-only look at the stream for `svc inspect`: an ephemeral push consumer of our own
//! (no acknowledgement, one delivery per message, in stream order, flow-controlled), read
//! through a plain subscription on a fresh inbox. The durable consumer is never touched and
//! nothing is ever acknowledged.
//!
//! The consumer is deleted when the reading ends; if the process dies first, the broker drops
//! it after [`INACTIVE_THRESHOLD`] without interest, so none is left behind.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nats::jetstream::{AckPolicy, ConsumerConfig, DeliverPolicy, ReplayPolicy};

use super::{split, BrokerError, Connection, DeliveryNames};
use crate::message::envelope::RawMessage;
use crate::message::subject::SubjectPattern;
use crate::text::peer::PeerText;

/// How long the broker keeps the consumer once nobody listens (a killed `svc inspect`).
pub const INACTIVE_THRESHOLD: Duration = Duration::from_secs(5);
/// Heartbeat interval asked of the broker: an idle consumer still proves it is alive.
const IDLE_HEARTBEAT: Duration = Duration::from_secs(2);
/// How often a wait for the next delivery looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);

/// Where reading starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The last `n` messages of the stream (those of them the filter matches).
    Last(u64),
    /// From this stream sequence.
    Sequence(u64),
    /// From the first message stored at or after this time (Unix nanoseconds).
    Since(i128),
}

/// What to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub stream: String,
    /// Subject filters (the configured subjects, or one narrower than one of them).
    pub subjects: Vec<String>,
    pub start: Start,
    /// At most this many messages.
    pub max: u64,
    /// Stop when nothing arrives for this long; also bounds each broker request.
    pub timeout: Duration,
}

/// Reads up to `req.max` messages, calling `each` for every one in stream order. Returns how
/// many were read. Ends early when the consumer has nothing more pending or nothing arrives
/// within `req.timeout`.
pub fn read(
    nc: &Connection,
    req: &Request,
    mut each: impl FnMut(RawMessage),
) -> Result<u64, BrokerError> {
    read_while(nc, req, "svc inspect", None, |raw, _| {
        each(raw);
        true
    })
    .map(|(read, _)| read)
}

/// Why [`read_while`] stopped reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The consumer had nothing more pending (every message the filter matches was read).
    Exhausted,
    /// `each` asked to stop.
    Stopped,
    /// `req.max` messages were read.
    Max,
    /// Nothing arrived for `req.timeout` while the consumer still had this many pending.
    TimedOut { pending: u64 },
    /// A consumer sequence was skipped (the client dropped deliveries): what follows the
    /// last message handed to `each` was not read.
    Gap { expected: u64, got: u64 },
}

/// [`read`], with `each` told how many messages the consumer still holds after this one and
/// returning whether to go on. The timeout runs from the end of the last `each` (a slow caller
/// is not a silent broker) and only a delivery restarts it (heartbeats alone do not keep a
/// read waiting). `stop`, when set, ends the wait for the next delivery within [`STOP_POLL`]
/// (`Ended::Stopped`). `who` describes the consumer to the broker.
///
/// The consumer is ours, but anyone allowed to create consumers on the stream can change it
/// in place: a delivery outside the subjects asked for, or one without its payload while the
/// consumer's own config says `headers_only`, is an error, never handed to `each` (an empty
/// message with a publisher's own `Nats-Msg-Size` header is handed on, as `svc run` does). The pending count of an ack subject
/// is the broker's word: before a read ends as `Exhausted`, the consumer's info must agree
/// that nothing more was delivered or is pending.
pub fn read_while(
    nc: &Connection,
    req: &Request,
    who: &str,
    stop: Option<&AtomicBool>,
    mut each: impl FnMut(RawMessage, u64) -> bool,
) -> Result<(u64, Ended), BrokerError> {
    let js = nats::jetstream::new(nc.clone());
    let what = format!("inspect stream {}", req.stream);
    let fail = |e: io::Error| BrokerError {
        action: what.clone(),
        source: e.into(),
    };
    super::require_filter_subjects(nc, &req.subjects)
        .map_err(|why| fail(io::Error::new(io::ErrorKind::InvalidInput, why)))?;
    let filters: Vec<SubjectPattern> = req
        .subjects
        .iter()
        .map(|s| SubjectPattern::parse(s))
        .collect::<Result<_, _>>()
        .map_err(|why| fail(io::Error::new(io::ErrorKind::InvalidInput, why)))?;
    let inbox = nc.new_inbox();
    // Subscribe before the consumer exists: its first deliveries must find us listening.
    let sub = nc.subscribe(&inbox).map_err(&fail)?;
    let info = create_consumer(&js, req, who, inbox).map_err(&fail)?;
    let consumer = info.name.clone();
    let mut reading = Reading {
        js: &js,
        req,
        consumer: &consumer,
        filters,
        // The ids `svc run` would give these messages carry the stream's incarnation too.
        names: DeliveryNames::new(
            super::incarnation::read(nc, &req.stream).map_err(&fail)?,
            Default::default(),
        ),
        read: 0,
        // Nothing matched: the consumer says so at once, no need to wait out the timeout.
        pending: info.num_pending,
        next_consumer_seq: 1,
    };
    let result = reading.run(nc, &sub, stop, &mut each);
    drop(sub);
    // Best effort: the inactivity threshold removes it otherwise.
    let _ = js.delete_consumer(&req.stream, &consumer);
    let ended = result.map_err(fail)?;
    Ok((reading.read, ended))
}

/// Creates the ephemeral consumer of `req`, delivering to `inbox`.
fn create_consumer(
    js: &nats::jetstream::JetStream,
    req: &Request,
    who: &str,
    inbox: String,
) -> io::Result<nats::jetstream::ConsumerInfo> {
    let (filter_subject, filter_subjects) = match req.subjects.as_slice() {
        [one] => (one.clone(), Vec::new()),
        many => (String::new(), many.to_vec()),
    };
    let (deliver_policy, opt_start_seq, opt_start_time) = match req.start {
        Start::Last(n) => {
            let info = js.stream_info(&req.stream)?;
            let last = info.state.last_seq;
            let first = last.saturating_sub(n.saturating_sub(1)).max(1);
            (DeliverPolicy::ByStartSeq, Some(first), None)
        }
        Start::Sequence(s) => (DeliverPolicy::ByStartSeq, Some(s.max(1)), None),
        Start::Since(nanos) => {
            let t = time::OffsetDateTime::from_unix_timestamp_nanos(nanos).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "--since is out of range")
            })?;
            (DeliverPolicy::ByStartTime, None, Some(t))
        }
    };
    js.add_consumer(
        &req.stream,
        ConsumerConfig {
            durable_name: None,
            description: Some(format!("{who} (read-only, ephemeral)")),
            deliver_subject: Some(inbox),
            deliver_policy,
            opt_start_seq,
            opt_start_time,
            ack_policy: AckPolicy::None,
            max_deliver: 1,
            filter_subject,
            filter_subjects,
            replay_policy: ReplayPolicy::Instant,
            flow_control: true,
            idle_heartbeat: IDLE_HEARTBEAT,
            inactive_threshold: INACTIVE_THRESHOLD,
            ..Default::default()
        },
    )
}

/// One read of [`read_while`]: its consumer and where it stands.
struct Reading<'a> {
    js: &'a nats::jetstream::JetStream,
    req: &'a Request,
    consumer: &'a str,
    filters: Vec<SubjectPattern>,
    names: DeliveryNames,
    read: u64,
    pending: u64,
    next_consumer_seq: u64,
}

impl Reading<'_> {
    fn run(
        &mut self,
        nc: &Connection,
        sub: &nats::Subscription,
        stop: Option<&AtomicBool>,
        each: &mut impl FnMut(RawMessage, u64) -> bool,
    ) -> io::Result<Ended> {
        let mut last_seen = Instant::now();
        while self.pending > 0 || self.more_than_said()? {
            if self.read >= self.req.max {
                return Ok(Ended::Max);
            }
            let wait = self.req.timeout.saturating_sub(last_seen.elapsed());
            if wait.is_zero() {
                return Ok(Ended::TimedOut {
                    pending: self.pending,
                });
            }
            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Ok(Ended::Stopped);
            }
            let m = match sub.next_timeout(wait.min(STOP_POLL)) {
                Ok(m) => m,
                // The loop looks at the deadline and the stop flag again.
                Err(e) if e.kind() == io::ErrorKind::TimedOut => continue,
                Err(e) => return Err(e),
            };
            if m.data.is_empty() && m.headers.as_ref().and_then(|h| h.status()) == Some("100") {
                // Flow control asks for an answer on its reply subject; a heartbeat has none.
                // Neither is a delivery: the timeout goes on.
                if let Some(reply) = &m.reply {
                    let _ = nc.publish(reply, b"");
                }
                continue;
            }
            let Some((raw, _, left)) = split(m, &mut self.names) else {
                continue;
            };
            if raw.consumer_sequence != self.next_consumer_seq {
                return Ok(Ended::Gap {
                    expected: self.next_consumer_seq,
                    got: raw.consumer_sequence,
                });
            }
            self.check(&raw)?;
            self.next_consumer_seq += 1;
            self.pending = left;
            self.read += 1;
            let go_on = each(raw, left);
            last_seen = Instant::now();
            if !go_on {
                return Ok(Ended::Stopped);
            }
        }
        Ok(Ended::Exhausted)
    }

    /// A delivery the consumer asked for could not be this: the consumer was changed.
    fn check(&self, raw: &RawMessage) -> io::Result<()> {
        if !self.filters.iter().any(|p| p.matches(&raw.subject)) {
            return Err(io::Error::other(format!(
                "the broker delivered subject {} outside the filter asked for ({}): the \
                 read's consumer was changed under it",
                PeerText::new(&raw.subject),
                self.req.subjects.join(", ")
            )));
        }
        // An empty message with its own `Nats-Msg-Size` header looks the same: only the
        // consumer's own config tells (as `svc run` asks), or any publisher could stop a read.
        if super::maybe_headers_only(raw)
            && self
                .js
                .consumer_info(&self.req.stream, self.consumer)?
                .config
                .headers_only
        {
            return Err(io::Error::other(format!(
                "the broker delivered stream sequence {} without its payload (headers_only): \
                 the read's consumer was changed under it",
                raw.stream_sequence
            )));
        }
        Ok(())
    }

    /// Whether the consumer holds more than the last delivery's pending count said (0): its
    /// info is asked once the count reaches 0, and more pending or delivered than read goes on.
    fn more_than_said(&mut self) -> io::Result<bool> {
        if self.read >= self.req.max {
            return Ok(false);
        }
        let info = self.js.consumer_info(&self.req.stream, self.consumer)?;
        let delivered_unread = info.delivered.consumer_seq >= self.next_consumer_seq;
        if info.num_pending > 0 || delivered_unread {
            self.pending = info.num_pending.max(1);
            return Ok(true);
        }
        Ok(false)
    }
}

/// The stream's last sequence now: the end a replay fixes when it starts.
pub fn last_sequence(nc: &Connection, stream: &str) -> Result<u64, BrokerError> {
    sequences(nc, stream).map(|(_, last)| last)
}

/// The stream's first and last sequences now (what it still holds, and its end).
pub fn sequences(nc: &Connection, stream: &str) -> Result<(u64, u64), BrokerError> {
    let js = nats::jetstream::new(nc.clone());
    js.stream_info(stream)
        .map(|info| (info.state.first_seq, info.state.last_seq))
        .map_err(|e| BrokerError {
            action: format!("read stream info of {stream}"),
            source: e.into(),
        })
}
