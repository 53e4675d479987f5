//! A read-only look at the stream for `svc inspect`: an ephemeral push consumer of our own
//! (no acknowledgement, one delivery per message, in stream order, flow-controlled), read
//! through a plain subscription on a fresh inbox. The durable consumer is never touched and
//! nothing is ever acknowledged.
//!
//! The consumer is deleted when the reading ends; if the process dies first, the broker drops
//! it after [`INACTIVE_THRESHOLD`] without interest, so none is left behind.

use std::io;
use std::time::{Duration, Instant};

use nats::jetstream::{AckPolicy, ConsumerConfig, DeliverPolicy, ReplayPolicy};

use super::{split, BrokerError, Connection, DeliveryNames};
use crate::message::envelope::RawMessage;

/// How long the broker keeps the consumer once nobody listens (a killed `svc inspect`).
pub const INACTIVE_THRESHOLD: Duration = Duration::from_secs(5);
/// Heartbeat interval asked of the broker: an idle consumer still proves it is alive.
const IDLE_HEARTBEAT: Duration = Duration::from_secs(2);

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
    read_while(nc, req, "svc inspect", |raw, _| {
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
/// returning whether to go on. The timeout runs from the end of the last `each`, so a slow
/// caller is not mistaken for a silent broker. `who` describes the consumer to the broker.
pub fn read_while(
    nc: &Connection,
    req: &Request,
    who: &str,
    mut each: impl FnMut(RawMessage, u64) -> bool,
) -> Result<(u64, Ended), BrokerError> {
    let js = nats::jetstream::new(nc.clone());
    let what = format!("inspect stream {}", req.stream);
    let fail = |e: io::Error| BrokerError {
        action: what.clone(),
        source: e,
    };
    super::require_filter_subjects(nc, &req.subjects)
        .map_err(|why| fail(io::Error::new(io::ErrorKind::InvalidInput, why)))?;
    let from = start_point(&js, req).map_err(&fail)?;
    let inbox = nc.new_inbox();
    // Subscribe before the consumer exists: its first deliveries must find us listening.
    let sub = nc.subscribe(&inbox).map_err(&fail)?;
    let info = js
        .add_consumer(&req.stream, consumer_config(req, who, inbox, from))
        .map_err(&fail)?;
    let consumer = info.name.clone();
    // The ids `svc run` would give these messages carry the stream's incarnation too.
    let incarnation = super::incarnation::read(nc, &req.stream).map_err(&fail)?;
    let mut reading = Reading {
        names: DeliveryNames::new(incarnation, Default::default()),
        read: 0,
        // Nothing matched: the consumer says so at once, no need to wait out the timeout.
        pending: info.num_pending,
        last_seen: Instant::now(),
        next_consumer_seq: 1,
    };
    let ended = match reading.run(nc, &sub, req, &mut each) {
        Ok(ended) => ended,
        Err(e) => {
            let _ = js.delete_consumer(&req.stream, &consumer);
            return Err(fail(e));
        }
    };
    drop(sub);
    // Best effort: the inactivity threshold removes it otherwise.
    let _ = js.delete_consumer(&req.stream, &consumer);
    Ok((reading.read, ended))
}

/// Where the consumer starts: its deliver policy, start sequence and start time.
type StartPoint = (DeliverPolicy, Option<u64>, Option<time::OffsetDateTime>);

/// The consumer's start for `req.start` (the last `n` need the stream's last sequence).
fn start_point(js: &nats::jetstream::JetStream, req: &Request) -> io::Result<StartPoint> {
    Ok(match req.start {
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
    })
}

/// The read-only ephemeral push consumer: no acknowledgement, one delivery per message,
/// flow-controlled, gone after [`INACTIVE_THRESHOLD`] without interest.
fn consumer_config(req: &Request, who: &str, inbox: String, from: StartPoint) -> ConsumerConfig {
    let (filter_subject, filter_subjects) = match req.subjects.as_slice() {
        [one] => (one.clone(), Vec::new()),
        many => (String::new(), many.to_vec()),
    };
    let (deliver_policy, opt_start_seq, opt_start_time) = from;
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
    }
}

/// One reading in progress: how many messages were read, what the consumer still holds,
/// when the last message came, the consumer sequence expected next.
struct Reading {
    names: DeliveryNames,
    read: u64,
    pending: u64,
    last_seen: Instant,
    next_consumer_seq: u64,
}

impl Reading {
    /// Reads until the consumer has nothing pending, `req.max` messages were read, nothing
    /// came within `req.timeout`, a sequence was skipped or `each` says stop. Err: the
    /// subscription failed.
    fn run(
        &mut self,
        nc: &Connection,
        sub: &nats::Subscription,
        req: &Request,
        each: &mut impl FnMut(RawMessage, u64) -> bool,
    ) -> io::Result<Ended> {
        while self.pending > 0 {
            if self.read >= req.max {
                return Ok(Ended::Max);
            }
            let wait = req.timeout.saturating_sub(self.last_seen.elapsed());
            if wait.is_zero() {
                return Ok(Ended::TimedOut {
                    pending: self.pending,
                });
            }
            let m = match sub.next_timeout(wait) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    return Ok(Ended::TimedOut {
                        pending: self.pending,
                    });
                }
                Err(e) => return Err(e),
            };
            self.last_seen = Instant::now();
            if let Some(ended) = self.on_message(nc, m, each) {
                return Ok(ended);
            }
        }
        Ok(Ended::Exhausted)
    }

    /// One message from the broker: flow control is answered, a heartbeat ignored, a
    /// delivery handed to `each`. `Some` says why reading ends.
    fn on_message(
        &mut self,
        nc: &Connection,
        m: nats::Message,
        each: &mut impl FnMut(RawMessage, u64) -> bool,
    ) -> Option<Ended> {
        if m.data.is_empty() && m.headers.as_ref().and_then(|h| h.status()) == Some("100") {
            // Flow control asks for an answer on its reply subject; a heartbeat has none.
            if let Some(reply) = &m.reply {
                let _ = nc.publish(reply, b"");
            }
            return None;
        }
        let (raw, _, left) = split(m, &mut self.names)?;
        if raw.consumer_sequence != self.next_consumer_seq {
            return Some(Ended::Gap {
                expected: self.next_consumer_seq,
                got: raw.consumer_sequence,
            });
        }
        self.next_consumer_seq += 1;
        self.pending = left;
        self.read += 1;
        let go_on = each(raw, left);
        self.last_seen = Instant::now();
        (!go_on).then_some(Ended::Stopped)
    }
}

/// The stream's last sequence now: the end a replay fixes when it starts.
pub fn last_sequence(nc: &Connection, stream: &str) -> Result<u64, BrokerError> {
    let js = nats::jetstream::new(nc.clone());
    js.stream_info(stream)
        .map(|info| info.state.last_seq)
        .map_err(|e| BrokerError {
            action: format!("read stream info of {stream}"),
            source: e,
        })
}
