//! The advisory observer (`advisories.enabled`): counts a small allow-list of JetStream consumer
//! advisories for the runner's own stream and consumer.
//!
//! One named thread, `svc-advisory`, owns three separate core subscriptions:
//!
//! | Subject | Event `type` | Counter |
//! |---|---|---|
//! | `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>` | `io.nats.jetstream.advisory.v1.max_deliver` | `advisory_max_deliveries_total` |
//! | `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>` | `io.nats.jetstream.advisory.v1.terminated` | `advisory_terminated_total` |
//! | `$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.<stream>.<consumer>` | `io.nats.jetstream.advisory.v1.nak` | `advisory_nak_total` |
//!
//! (All three exist in nats-server 2.9.10.) An event is counted only when its JSON `type`,
//! `stream` and `consumer` match the subscription; anything else is ignored. The observer keeps
//! aggregate counters only — no subject or payload is stored — and it never drives an
//! ACK, NAK, DLQ, retry or sink decision: it has no handle on any of them. Each subscription's
//! pending queue inside the client is bounded ([`PENDING_LIMIT`]); beyond it the client drops
//! advisories (counts are then a lower bound), it never grows memory.
//!
//! With `custody.checkpoints` on, the thread runs even without `advisories.enabled`, then with
//! the `MAX_DELIVERIES` subscription alone: each such advisory names a message the broker
//! delivers no more, and the runner lists it as a gap ([`Watch::on_abandoned`]; the pipeline
//! tells the checkpoint thread) when the consumer held that sequence unacknowledged at bind
//! ([`super::inherited`]: anyone allowed to publish on the subject can forge an advisory). That
//! is the one thing the observer drives, and never an acknowledgement. A body on the subject
//! that is not the broker's event for this stream and consumer, over [`MAX_ADVISORY_BYTES`],
//! or without a positive `stream_seq`, is ignored.
//!
//! Shutdown: the thread checks the stop flag at least every [`POLL_INTERVAL`], unsubscribes and
//! exits; it also exits when the connection is closed.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::metrics::Metrics;

pub const THREAD_NAME: &str = "svc-advisory";
/// Most advisories one subscription may hold before the client drops new ones.
pub const PENDING_LIMIT: usize = 4096;
/// Longest wait before the stop flag is looked at again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The allow-listed advisories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvisoryKind {
    MaxDeliveries,
    Terminated,
    Nak,
}

impl AdvisoryKind {
    pub const ALL: [AdvisoryKind; 3] = [
        AdvisoryKind::MaxDeliveries,
        AdvisoryKind::Terminated,
        AdvisoryKind::Nak,
    ];

    fn subject_prefix(self) -> &'static str {
        match self {
            AdvisoryKind::MaxDeliveries => "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES",
            AdvisoryKind::Terminated => "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED",
            AdvisoryKind::Nak => "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED",
        }
    }

    /// The `type` field of the advisory's JSON body.
    pub fn event_type(self) -> &'static str {
        match self {
            AdvisoryKind::MaxDeliveries => "io.nats.jetstream.advisory.v1.max_deliver",
            AdvisoryKind::Terminated => "io.nats.jetstream.advisory.v1.terminated",
            AdvisoryKind::Nak => "io.nats.jetstream.advisory.v1.nak",
        }
    }

    /// The subject for one stream and consumer.
    pub fn subject(self, stream: &str, consumer: &str) -> String {
        format!("{}.{stream}.{consumer}", self.subject_prefix())
    }

    pub fn counter(self, metrics: &Metrics) -> &AtomicU64 {
        match self {
            AdvisoryKind::MaxDeliveries => &metrics.counters.advisory_max_deliveries_total,
            AdvisoryKind::Terminated => &metrics.counters.advisory_terminated_total,
            AdvisoryKind::Nak => &metrics.counters.advisory_nak_total,
        }
    }
}

/// True when an advisory body is the expected event for this stream and consumer.
pub fn is_expected_event(kind: AdvisoryKind, body: &[u8], stream: &str, consumer: &str) -> bool {
    expected_event(kind, body, stream, consumer).is_some()
}

/// The advisory's JSON when it is the expected event for this stream and consumer.
fn expected_event(
    kind: AdvisoryKind,
    body: &[u8],
    stream: &str,
    consumer: &str,
) -> Option<serde_json::Value> {
    if body.len() > MAX_ADVISORY_BYTES {
        return None;
    }
    let v = serde_json::from_slice::<serde_json::Value>(body).ok()?;
    (v.get("type").and_then(|t| t.as_str()) == Some(kind.event_type())
        && v.get("stream").and_then(|t| t.as_str()) == Some(stream)
        && v.get("consumer").and_then(|t| t.as_str()) == Some(consumer))
    .then_some(v)
}

/// The stream sequence a `max_deliver` advisory names: the broker delivers that message no
/// more. `None` for any other body, or a sequence that is not a positive whole number.
pub fn abandoned_sequence(body: &[u8], stream: &str, consumer: &str) -> Option<u64> {
    let v = expected_event(AdvisoryKind::MaxDeliveries, body, stream, consumer)?;
    stream_seq(&v)
}

fn stream_seq(event: &serde_json::Value) -> Option<u64> {
    event
        .get("stream_seq")
        .and_then(|s| s.as_u64())
        .filter(|s| *s > 0)
}

/// Longest advisory body read (the broker's are a few hundred bytes; a larger one on the
/// subject is not the broker's).
pub const MAX_ADVISORY_BYTES: usize = 4096;

/// What the observer does besides counting: with custody checkpoints the runner lists each
/// message the broker gave up on (`max_deliver`) as a gap, whatever let it go (a NAK of any
/// thread on its last delivery, a delivery in flight at a crash, a `max_deliver` lowered
/// under a message being retried). Called with the advisory's stream sequence.
pub type OnAbandoned = Box<dyn Fn(u64) + Send>;

/// What the observer watches and does: `count` the allow-listed advisories
/// (`advisories.enabled`), and/or call `on_abandoned` for each `max_deliver` one.
pub struct Watch {
    pub count: bool,
    pub on_abandoned: Option<OnAbandoned>,
}

impl Watch {
    fn kinds(&self) -> &'static [AdvisoryKind] {
        if self.count {
            &AdvisoryKind::ALL
        } else {
            &[AdvisoryKind::MaxDeliveries]
        }
    }
}

/// The running observer thread.
pub struct AdvisoryObserver {
    handle: JoinHandle<()>,
}

impl AdvisoryObserver {
    /// Subscribes (errors surface here, before the thread starts) and starts `svc-advisory`.
    pub fn start(
        nc: &nats::Connection,
        stream: &str,
        consumer: &str,
        watch: Watch,
        metrics: Arc<Metrics>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<AdvisoryObserver> {
        let mut subs = Vec::with_capacity(AdvisoryKind::ALL.len());
        for &kind in watch.kinds() {
            let sub = nc.subscribe(&kind.subject(stream, consumer))?;
            sub.set_message_limits(PENDING_LIMIT);
            subs.push((kind, sub));
        }
        // The subscriptions must be registered at the server before events are expected.
        nc.flush()?;
        let (stream, consumer) = (stream.to_string(), consumer.to_string());
        let handle = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || observe(subs, &stream, &consumer, (&watch, &metrics), &stop))?;
        Ok(AdvisoryObserver { handle })
    }

    /// Waits for the thread after the stop flag was set.
    pub fn join(self) {
        if self.handle.join().is_err() {
            log::error!("{THREAD_NAME}: thread panicked");
        }
    }
}

fn observe(
    subs: Vec<(AdvisoryKind, nats::Subscription)>,
    stream: &str,
    consumer: &str,
    (watch, metrics): (&Watch, &Metrics),
    stop: &AtomicBool,
) {
    log::debug!("{THREAD_NAME}: observing {} advisory subjects", subs.len());
    'outer: while !stop.load(Ordering::Relaxed) {
        let mut select = crossbeam_channel::Select::new();
        for (_, sub) in &subs {
            select.recv(sub.receiver());
        }
        let Ok(op) = select.select_timeout(POLL_INTERVAL) else {
            continue;
        };
        let i = op.index();
        let (kind, sub) = &subs[i];
        match op.recv(sub.receiver()) {
            Ok(msg) => {
                let Some(event) = expected_event(*kind, &msg.data, stream, consumer) else {
                    log::debug!("{THREAD_NAME}: ignored an unexpected advisory body");
                    continue;
                };
                if watch.count {
                    Metrics::add(kind.counter(metrics), 1);
                }
                let abandoned = (*kind == AdvisoryKind::MaxDeliveries)
                    .then(|| stream_seq(&event))
                    .flatten();
                if let (Some(seq), Some(tell)) = (abandoned, &watch.on_abandoned) {
                    tell(seq);
                }
            }
            // The connection was closed: nothing more will arrive.
            Err(_) => break 'outer,
        }
    }
    for (_, sub) in subs {
        let _ = sub.unsubscribe();
    }
    log::debug!("{THREAD_NAME}: stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_event_filter() {
        assert_eq!(
            AdvisoryKind::MaxDeliveries.subject("ORDERS", "svc"),
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.svc"
        );
        assert_eq!(
            AdvisoryKind::Nak.subject("S", "c"),
            "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.S.c"
        );
        let body = br#"{"type":"io.nats.jetstream.advisory.v1.terminated","stream":"S","consumer":"c","stream_seq":3}"#;
        assert!(is_expected_event(AdvisoryKind::Terminated, body, "S", "c"));
        assert!(!is_expected_event(AdvisoryKind::Nak, body, "S", "c"));
        assert!(!is_expected_event(
            AdvisoryKind::Terminated,
            body,
            "S",
            "other"
        ));
        assert!(!is_expected_event(
            AdvisoryKind::Terminated,
            b"not json",
            "S",
            "c"
        ));
        let max = br#"{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"S","consumer":"c","stream_seq":7,"deliveries":3}"#;
        assert_eq!(abandoned_sequence(max, "S", "c"), Some(7));
        assert_eq!(abandoned_sequence(max, "S", "other"), None);
        assert_eq!(abandoned_sequence(body, "S", "c"), None, "not max_deliver");
        for bad in [r#""7""#, "0", "-1", "7.5", "null"] {
            let text = String::from_utf8_lossy(max).replace(":7,", &format!(":{bad},"));
            assert_eq!(abandoned_sequence(text.as_bytes(), "S", "c"), None, "{bad}");
        }
        let mut big = max.to_vec();
        big.splice(
            1..1,
            format!(r#""pad":"{}","#, "x".repeat(MAX_ADVISORY_BYTES)).bytes(),
        );
        assert_eq!(abandoned_sequence(&big, "S", "c"), None, "over the bound");
        let m = Metrics::default();
        for k in AdvisoryKind::ALL {
            Metrics::add(k.counter(&m), 1);
        }
        let v = m.counters.values();
        for name in [
            "advisory_max_deliveries_total",
            "advisory_terminated_total",
            "advisory_nak_total",
        ] {
            assert!(v.contains(&(name, 1)), "{name}");
        }
    }
}
