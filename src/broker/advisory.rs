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
//! aggregate counters only — no subject, sequence or payload is stored — and it never drives an
//! ACK, NAK, DLQ, retry or sink decision: it has no handle on any of them. Each subscription's
//! pending queue inside the client is bounded ([`PENDING_LIMIT`]); beyond it the client drops
//! advisories (counts are then a lower bound), it never grows memory.
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
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    v.get("type").and_then(|t| t.as_str()) == Some(kind.event_type())
        && v.get("stream").and_then(|t| t.as_str()) == Some(stream)
        && v.get("consumer").and_then(|t| t.as_str()) == Some(consumer)
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
        metrics: Arc<Metrics>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<AdvisoryObserver> {
        let mut subs = Vec::with_capacity(AdvisoryKind::ALL.len());
        for kind in AdvisoryKind::ALL {
            let sub = nc.subscribe(&kind.subject(stream, consumer))?;
            sub.set_message_limits(PENDING_LIMIT);
            subs.push((kind, sub));
        }
        // The subscriptions must be registered at the server before events are expected.
        nc.flush()?;
        let (stream, consumer) = (stream.to_string(), consumer.to_string());
        let handle = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || observe(subs, &stream, &consumer, &metrics, &stop))?;
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
    metrics: &Metrics,
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
                if is_expected_event(*kind, &msg.data, stream, consumer) {
                    Metrics::add(kind.counter(metrics), 1);
                } else {
                    log::debug!("{THREAD_NAME}: ignored an unexpected advisory body");
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
