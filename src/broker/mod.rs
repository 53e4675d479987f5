//! The broker side: connecting ([`connection`]), binding the durable pull consumer, turning
//! deliveries into plain data plus an acknowledgement handle, and sending
//! ACK/NAK/TERM/in-progress.
//!
//! The client is the sync `nats` crate, carried in-tree (`third_party/nats`, its changes in
//! `CHANGES.md` there): it delivers every message the broker sends, marking what it could not
//! read as sent (`unreadable`), which `svc-normalize` settles.

pub mod advisory;
pub mod config;
pub mod confirm_inbox;
mod connection;
pub mod consumer_shape;
pub mod consumer_watch;
pub mod dead_letter;
pub mod incarnation;
pub mod inspect;
pub mod permissions;
pub mod probe;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nats::jetstream::{
    AckPolicy, BatchOptions, ConsumerConfig, DeliverPolicy, PullSubscribeOptions, ReplayPolicy,
};

use crate::message::envelope::{HeaderBlock, RawMessage};
use crate::text::peer::PeerText;
use config::{ConsumerMode, NatsConfig, StartPosition};
pub use connection::{connect, connect_within, read_credentials_file};
pub use permissions::Denials;

/// The broker connection (aliased so the crate's deprecation allowance stays in this module).
pub type Connection = nats::Connection;
/// A bound pull subscription.
pub type PullSubscription = nats::jetstream::PullSubscription;

/// A broker failure, safe to print (never a credential). The source's text can carry what
/// the broker said (a JetStream API error description, an `-ERR`): shown as [`PeerText`].
#[derive(Debug)]
pub struct BrokerError {
    /// What we were doing, e.g. `connect`, `bind consumer ORDERS/svc`.
    pub action: String,
    pub source: io::Error,
}

/// Characters of a [`BrokerError`]'s source shown at most: our longest own message plus a
/// bounded quote of the broker.
const SOURCE_MAX_CHARS: usize = 512;

impl fmt::Display for BrokerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "broker: {}: {}",
            self.action,
            PeerText::with_limit(&self.source.to_string(), SOURCE_MAX_CHARS)
        )
    }
}

impl std::error::Error for BrokerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn err(action: impl Into<String>) -> impl FnOnce(io::Error) -> BrokerError {
    let action = action.into();
    move |source| BrokerError { action, source }
}

/// The bound consumer: subscription plus what the pipeline needs to know about it.
pub struct Consumer {
    pub subscription: PullSubscription,
    pub ack_wait: Duration,
    /// The consumer's MaxAckPending (unacknowledged deliveries the broker allows in all),
    /// when known and limited.
    pub max_ack_pending: Option<u64>,
    pub stream: String,
    /// The stream's incarnation at bind ([`incarnation`]).
    pub incarnation: Arc<str>,
    pub name: String,
    /// The consumer's config as the broker reported it at bind (its request limits are
    /// checked against the pipeline's requests: [`consumer_shape::check_request_limits`]).
    pub config: serde_json::Value,
}

/// Binds to the durable pull consumer, creating or reconciling it first when
/// `nats.consumer_mode` asks for it.
pub fn bind_consumer(nc: &Connection, cfg: &NatsConfig) -> Result<Consumer, BrokerError> {
    let js = nats::jetstream::new(nc.clone());
    let what = format!("consumer {}/{}", cfg.stream, cfg.consumer);
    require_filter_subjects(nc, &cfg.subjects).map_err(|why| invalid(&what, &why))?;
    let mut created = false;
    match consumer_shape::consumer_config(nc, &cfg.stream, &cfg.consumer) {
        Ok(existing) => {
            check_bindable(&existing, cfg).map_err(|why| invalid(&what, &why))?;
            if cfg.consumer_mode != ConsumerMode::Bind {
                report_start(&existing, cfg, &what);
            }
            if cfg.consumer_mode == ConsumerMode::Reconcile {
                reconcile_consumer(nc, existing, cfg).map_err(err(format!("update {what}")))?;
            }
        }
        Err(e) if cfg.consumer_mode != ConsumerMode::Bind && is_not_found(&e) => {
            js.add_consumer(&cfg.stream, planned_consumer(cfg))
                .map_err(err(format!("create {what}")))?;
            created = true;
            log::info!(
                "broker: created durable pull {what}, starting at deliver_policy {}",
                cfg.consumer_settings.start
            );
        }
        Err(e) if is_not_found(&e) => {
            return Err(invalid(
                &what,
                "does not exist (create it, or set nats.consumer_mode to \"create\")",
            ))
        }
        Err(e) => return Err(err(format!("look up {what}"))(e)),
    }
    let bound = subscribe_bound(nc, &js, cfg, &what, created);
    if created && bound.is_err() {
        // A consumer this runner made and then refused (a broker that created it otherwise
        // than asked, e.g. without the filter) must not stay behind: on an interest or
        // work-queue stream it would hold or take messages.
        match js.delete_consumer(&cfg.stream, &cfg.consumer) {
            Ok(_) => log::warn!("broker: deleted {what}, which this runner created and refused"),
            Err(e) => log::warn!(
                "broker: {what}, which this runner created and refused, could not be deleted: \
                 {}",
                PeerText::new(&e.to_string())
            ),
        }
    }
    bound
}

/// Subscribes to the consumer found or created, and judges it once more as the broker now
/// reports it.
fn subscribe_bound(
    nc: &Connection,
    js: &nats::jetstream::JetStream,
    cfg: &NatsConfig,
    what: &str,
    created: bool,
) -> Result<Consumer, BrokerError> {
    let opts = PullSubscribeOptions::new()
        .bind_stream(cfg.stream.clone())
        .durable_name(cfg.consumer.clone());
    // The crate compares this with the consumer's `filter_subject`, which is empty for
    // several subjects; the filters are judged below, from the broker's own JSON.
    let subject = cfg.subjects.first().map_or("", String::as_str);
    let subscription = js
        .pull_subscribe_with_options(subject, &opts)
        .map_err(err(format!("bind {what}")))?;
    // What the consumer is now (created, updated or as it was), judged again: a consumer
    // changed between the look-up and the bind is caught here, not by its first delivery.
    let config = consumer_shape::consumer_config(nc, &cfg.stream, &cfg.consumer)
        .map_err(err(format!("look up {what}")))?;
    check_bindable(&config, cfg).map_err(|why| invalid(what, &why))?;
    if created {
        // A broker that created it starting elsewhere than asked delivers other messages.
        consumer_shape::check_start(&config, cfg.consumer_settings.start)
            .map_err(|why| invalid(what, &why))?;
    }
    let stream_incarnation = incarnation::read(nc, &cfg.stream)
        .map_err(err(format!("look up stream {}", cfg.stream)))?;
    let typed = typed_config(&config);
    let ack_wait = Some(typed.ack_wait)
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(30));
    let max_ack_pending = u64::try_from(typed.max_ack_pending).ok().filter(|n| *n > 0);
    Ok(Consumer {
        subscription,
        ack_wait,
        max_ack_pending,
        stream: cfg.stream.clone(),
        incarnation: stream_incarnation,
        name: cfg.consumer.clone(),
        config,
    })
}

/// The settings of the broker's consumer JSON the runner reads (AckWait, MaxAckPending,
/// MaxDeliver, BackOff, the deliver policy) in the crate's typed config; the rest stays at
/// its default. Read field by field: the whole config does not always parse into the typed
/// struct (`sample_freq` `"50%"`, fields it does not know), and a value it cannot read counts
/// as unset.
pub(crate) fn typed_config(config: &serde_json::Value) -> ConsumerConfig {
    let int = |name: &str| config.get(name).and_then(serde_json::Value::as_i64);
    let nanos = |v: &serde_json::Value| v.as_u64().map(Duration::from_nanos);
    ConsumerConfig {
        ack_wait: config.get("ack_wait").and_then(nanos).unwrap_or_default(),
        max_ack_pending: int("max_ack_pending").unwrap_or_default(),
        max_deliver: int("max_deliver").unwrap_or_default(),
        backoff: config
            .get("backoff")
            .and_then(serde_json::Value::as_array)
            .map(|b| b.iter().filter_map(nanos).collect())
            .unwrap_or_default(),
        deliver_policy: config
            .get("deliver_policy")
            .and_then(|p| serde_json::from_value(p.clone()).ok())
            .unwrap_or(DeliverPolicy::All),
        ..Default::default()
    }
}

/// What an existing consumer must be for this runner: a pull consumer with explicit acks on
/// exactly the configured subject, delivering whole messages, every other field reviewed
/// (`consumer_shape.rs`). Never changed by the runner, whatever the mode: each of these
/// changes which messages are delivered, what of them, or how they are settled.
pub(crate) fn check_bindable(existing: &serde_json::Value, cfg: &NatsConfig) -> Result<(), String> {
    consumer_shape::check_bindable(existing, &cfg.subjects)
}

/// Several filter subjects need `filter_subjects` (nats-server 2.10 and later): an older
/// server ignores the field and its consumer would deliver the whole stream. The version is
/// the one of the server's INFO the client keeps; a version that cannot be read is refused.
pub fn require_filter_subjects(nc: &Connection, subjects: &[String]) -> Result<(), String> {
    if subjects.len() <= 1 {
        return Ok(());
    }
    let version = nc.server_version();
    if supports_filter_subjects(&version) {
        return Ok(());
    }
    Err(format!(
        "nats.subjects names {} subjects, which needs a consumer with filter_subjects \
         (nats-server 2.10 or later), but the server is nats-server {}: use one nats.subject \
         or upgrade the server",
        subjects.len(),
        PeerText::with_limit(&version, 40)
    ))
}

/// True for a server version text `major.minor[.patch...]` of 2.10 or later.
pub(crate) fn supports_filter_subjects(version: &str) -> bool {
    let mut parts = version.trim().trim_start_matches('v').split('.');
    let mut number = || parts.next().and_then(|p| p.parse::<u64>().ok());
    match (number(), number()) {
        (Some(major), Some(minor)) => (major, minor) >= (2, 10),
        _ => false,
    }
}

/// An existing consumer is never moved: a start other than `nats.deliver_policy` asks is
/// logged, not refused (the policy is used once, when the runner creates the consumer).
fn report_start(existing: &serde_json::Value, cfg: &NatsConfig, what: &str) {
    let wanted = cfg.consumer_settings.start;
    if let Err(why) = consumer_shape::check_start(existing, wanted) {
        log::warn!(
            "broker: {what} exists and keeps its position: {why}; nats.deliver_policy {wanted} \
             applies only when the runner creates the consumer"
        );
    }
}
/// The durable consumer as the runner creates it (`consumer_mode` `create` or `reconcile`).
pub fn planned_consumer(cfg: &NatsConfig) -> ConsumerConfig {
    let s = &cfg.consumer_settings;
    let (deliver_policy, opt_start_seq, opt_start_time) = match s.start {
        StartPosition::All => (DeliverPolicy::All, None, None),
        StartPosition::New => (DeliverPolicy::New, None, None),
        StartPosition::LastPerSubject => (DeliverPolicy::LastPerSubject, None, None),
        StartPosition::ByStartSequence(seq) => (DeliverPolicy::ByStartSeq, Some(seq), None),
        StartPosition::ByStartTime(nanos) => (
            DeliverPolicy::ByStartTime,
            None,
            // Parsed from RFC 3339 text by the `time` crate: always in its range.
            time::OffsetDateTime::from_unix_timestamp_nanos(nanos).ok(),
        ),
    };
    let (filter_subject, filter_subjects) = match cfg.subjects.as_slice() {
        [one] => (one.clone(), Vec::new()),
        many => (String::new(), many.to_vec()),
    };
    ConsumerConfig {
        durable_name: Some(cfg.consumer.clone()),
        deliver_policy,
        opt_start_seq,
        opt_start_time,
        ack_policy: AckPolicy::Explicit,
        ack_wait: s.effective_ack_wait(),
        max_deliver: s.max_deliver,
        max_ack_pending: s.max_ack_pending,
        backoff: s.backoff.clone(),
        filter_subject,
        filter_subjects,
        replay_policy: ReplayPolicy::Instant,
        ..Default::default()
    }
}

/// The settings `reconcile` owns that differ between the broker's consumer and the config, as
/// `name: broker -> config` for the log.
pub(crate) fn settings_drift(existing: &ConsumerConfig, cfg: &NatsConfig) -> Vec<String> {
    let s = &cfg.consumer_settings;
    let mut drift = Vec::new();
    let wanted_ack_wait = s.effective_ack_wait();
    if existing.ack_wait != wanted_ack_wait {
        drift.push(format!(
            "ack_wait {} s -> {} s",
            existing.ack_wait.as_secs_f64(),
            wanted_ack_wait.as_secs_f64()
        ));
    }
    if existing.max_ack_pending != s.max_ack_pending {
        drift.push(format!(
            "max_ack_pending {} -> {}",
            existing.max_ack_pending, s.max_ack_pending
        ));
    }
    // The broker reports "unlimited" as -1 (or 0 from old servers).
    let max_deliver = |n: i64| if n <= 0 { -1 } else { n };
    if max_deliver(existing.max_deliver) != max_deliver(s.max_deliver) {
        drift.push(format!(
            "max_deliver {} -> {}",
            existing.max_deliver, s.max_deliver
        ));
    }
    if existing.backoff != s.backoff {
        let secs = |b: &[Duration]| {
            b.iter()
                .map(|d| d.as_secs_f64().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        drift.push(format!(
            "backoff [{}] -> [{}] s",
            secs(&existing.backoff),
            secs(&s.backoff)
        ));
    }
    drift
}

/// `reconcile`: brings AckWait, MaxAckPending, MaxDeliver and BackOff of an existing consumer
/// to the config, and logs what changed. The update is the broker's own JSON with only those
/// four changed: the crate's typed config lacks fields (`max_bytes`, `metadata`,
/// `mem_storage`, ...), and sending it back erased them (2.9) or was refused (2.15, a
/// memory-storage consumer).
fn reconcile_consumer(
    nc: &Connection,
    mut existing: serde_json::Value,
    cfg: &NatsConfig,
) -> io::Result<()> {
    let drift = settings_drift(&typed_config(&existing), cfg);
    if drift.is_empty() {
        return Ok(());
    }
    let s = &cfg.consumer_settings;
    let nanos = |d: Duration| serde_json::Value::from(d.as_nanos() as u64);
    let fields = existing
        .as_object_mut()
        .ok_or_else(|| io::Error::other("the broker's consumer config is not an object"))?;
    fields.insert("ack_wait".into(), nanos(s.effective_ack_wait()));
    fields.insert("max_ack_pending".into(), s.max_ack_pending.into());
    fields.insert("max_deliver".into(), s.max_deliver.into());
    if s.backoff.is_empty() {
        fields.remove("backoff");
    } else {
        let backoff = s.backoff.iter().map(|d| nanos(*d)).collect::<Vec<_>>();
        fields.insert("backoff".into(), backoff.into());
    }
    consumer_shape::put_consumer(nc, &cfg.stream, &existing)?;
    log::info!(
        "broker: consumer {}/{} updated to the config: {}",
        cfg.stream,
        cfg.consumer,
        drift.join(", ")
    );
    Ok(())
}

pub(crate) fn is_not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.to_string().contains("10014")
        || e.to_string().to_lowercase().contains("not found")
}

fn invalid(what: &str, why: &str) -> BrokerError {
    BrokerError {
        action: what.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidInput, why.to_string()),
    }
}

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
fn batch_completed(status: &str, description: Option<&str>) -> bool {
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
    generation: u64,
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
    fn note_consumer_sequence(&mut self, sequence: u64) {
        self.generation_fresh = false;
        if sequence <= self.last_consumer_sequence {
            self.restarted = true;
            self.generation = self.shared_generation.advance();
            self.generation_fresh = true;
        }
        self.last_consumer_sequence = sequence;
    }

    fn share(cached: &mut Option<Arc<str>>, name: &str) -> Arc<str> {
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
    reply: String,
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
fn split(m: nats::Message, names: &mut DeliveryNames) -> Option<(RawMessage, AckHandle, u64)> {
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
struct AckSubject<'a> {
    stream: &'a str,
    consumer: &'a str,
    delivered: u64,
    stream_sequence: u64,
    consumer_sequence: u64,
    published_unix_nanos: i128,
    /// The consumer's messages still to deliver after this one, as the broker counted them.
    /// Only advice (it paces the consumer checks): a delivery whose count does not parse
    /// is still a delivery, with 0.
    pending: u64,
}

impl AckSubject<'_> {
    /// Parses `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.
    /// <pending>` and the form with a domain and an account hash before the stream (and
    /// possibly a random token after `pending`). The crate's `jetstream_message_info` does the
    /// same but builds a calendar date per message and cost half of `svc-fetch`'s time;
    /// unlike it, a publish time outside years -9999..9999 is not a reason to drop the
    /// delivery.
    fn parse(reply: &str) -> Option<AckSubject<'_>> {
        let rest = reply.strip_prefix("$JS.ACK.")?;
        let mut tokens: [&str; 9] = [""; 9];
        let mut count = 0;
        for token in rest.split('.') {
            if count < tokens.len() {
                tokens[count] = token;
            }
            count += 1;
        }
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

/// Acknowledgement verbs of JetStream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AckVerb {
    Ack,
    /// NAK with a redelivery delay.
    Nak(Duration),
    Term,
    InProgress,
}

/// Sends one acknowledgement (buffered; the client's flusher or [`Connection::flush`] sends it).
pub fn send_ack(nc: &Connection, handle: &AckHandle, verb: AckVerb) -> io::Result<()> {
    match verb {
        AckVerb::Ack => nc.publish(&handle.reply, b"+ACK"),
        AckVerb::Nak(delay) if delay.is_zero() => nc.publish(&handle.reply, b"-NAK"),
        AckVerb::Nak(delay) => nc.publish(
            &handle.reply,
            format!("-NAK {{\"delay\": {}}}", delay.as_nanos()),
        ),
        AckVerb::Term => nc.publish(&handle.reply, b"+TERM"),
        AckVerb::InProgress => nc.publish(&handle.reply, b"+WPI"),
    }
}

/// Sends `+ACK` as a request: the broker answers on `confirm_to` once it has processed it
/// (JetStream's double acknowledgement; `pipeline/confirm.rs` waits for that answer).
pub fn send_confirmed_ack(nc: &Connection, handle: &AckHandle, confirm_to: &str) -> io::Result<()> {
    nc.publish_request(&handle.reply, confirm_to, b"+ACK")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_completed_confirmation_ends_no_request() {
        assert!(batch_completed("409", Some("Batch Completed")));
        assert!(!batch_completed(
            "409",
            Some("Message Size Exceeds MaxBytes")
        ));
        assert!(!batch_completed("408", Some("Request Timeout")));
        assert!(!batch_completed("409", None));
    }

    use super::*;

    /// Found by `fuzz/fuzz_targets/ack_subject.rs`: empty stream or consumer tokens were
    /// accepted (and became the delivery's stream name).
    #[test]
    fn ack_subjects_with_empty_names_or_wide_times_are_refused() {
        for bad in [
            // A publish time wider than the broker's int64 (review atk46c: it overflowed ages).
            "$JS.ACK.ORDERS.svc.1.2.3.-170141183460469231731687303715884105728.5",
            "$JS.ACK.ORDERS.svc.1.2.3.9223372036854775808.5",
            "$JS.ACK..svc.1.2.3.4.5",
            "$JS.ACK.ORDERS..1.2.3.4.5",
            "$JS.ACK.hub.ACC..svc.1.2.3.4.5.x",
        ] {
            assert_eq!(AckSubject::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn ack_subjects_of_both_forms_parse() {
        let expected = AckSubject {
            stream: "ORDERS",
            consumer: "svc",
            delivered: 2,
            stream_sequence: 1041,
            consumer_sequence: 17,
            published_unix_nanos: 1_700_000_000_123_456_789,
            pending: 5,
        };
        for reply in [
            "$JS.ACK.ORDERS.svc.2.1041.17.1700000000123456789.5",
            "$JS.ACK._.ACCHASH.ORDERS.svc.2.1041.17.1700000000123456789.5",
            "$JS.ACK.hub.ACCHASH.ORDERS.svc.2.1041.17.1700000000123456789.5.rnd",
            "$JS.ACK.hub.ACCHASH.ORDERS.svc.2.1041.17.1700000000123456789.5.rnd.future",
        ] {
            assert_eq!(AckSubject::parse(reply), Some(expected), "{reply}");
        }
        // The crate agrees on the form the broker here sends.
        let m = nats::Message {
            reply: Some("$JS.ACK.ORDERS.svc.2.1041.17.1700000000123456789.5".into()),
            ..Default::default()
        };
        let info = m.jetstream_message_info().unwrap();
        assert_eq!(
            (
                info.stream,
                info.consumer,
                info.delivered,
                info.stream_seq,
                info.consumer_seq
            ),
            ("ORDERS", "svc", 2, 1041, 17)
        );
        assert_eq!(
            info.published.unix_timestamp_nanos(),
            1_700_000_000_123_456_789
        );
    }

    #[test]
    fn a_consumer_created_again_starts_a_new_ack_generation() {
        let shared = Arc::new(AckGeneration::default());
        let mut names = DeliveryNames::new("I1".into(), Arc::clone(&shared));
        for sequence in [1, 2, 7] {
            names.note_consumer_sequence(sequence);
        }
        assert_eq!((names.generation, shared.current()), (0, 0));
        // Delivery sequence 1 again: handles of earlier deliveries are of another generation.
        names.note_consumer_sequence(1);
        assert_eq!((names.generation, shared.current()), (1, 1));
        names.note_consumer_sequence(2);
        assert_eq!(shared.current(), 1);
    }

    /// A stream found created again starts a generation too, unless the delivery's own
    /// consumer sequence already did (a runner beside others may see no sequence go back).
    #[test]
    fn a_stream_found_created_again_starts_one_generation() {
        let shared = Arc::new(AckGeneration::default());
        let mut names = DeliveryNames::new("I1".into(), Arc::clone(&shared));
        names.note_consumer_sequence(5);
        assert_eq!(names.set_incarnation("I2".into()), Some(1));
        assert_eq!((names.generation, shared.current()), (1, 1));
        names.note_consumer_sequence(6);
        names.note_consumer_sequence(2);
        assert_eq!(shared.current(), 2, "the sequence went back");
        assert_eq!(names.set_incarnation("I3".into()), None, "not twice");
        assert_eq!((names.generation, shared.current()), (2, 2));
    }

    #[test]
    fn empty_deliveries_with_a_size_header_may_be_headers_only() {
        let size = |name: &str| vec![(name.to_string(), "60".to_string())];
        let empty = |headers| RawMessage {
            headers,
            ..RawMessage::sample("orders.a", 1, b"")
        };
        assert!(maybe_headers_only(&empty(size("Nats-Msg-Size"))));
        assert!(maybe_headers_only(&empty(size("nats-msg-size"))));
        let unreadable = RawMessage {
            unreadable: Some("a header block"),
            ..empty(vec![])
        };
        assert!(maybe_headers_only(&unreadable));
        assert!(!maybe_headers_only(&empty(vec![])));
        assert!(!maybe_headers_only(&empty(size("Nats-Msg-Id"))));
        let whole = RawMessage {
            headers: size("Nats-Msg-Size"),
            ..RawMessage::sample("orders.a", 1, b"{}")
        };
        assert!(!maybe_headers_only(&whole));
    }

    #[test]
    fn delivery_names_are_shared_until_they_change() {
        let mut cached = None;
        let first = DeliveryNames::share(&mut cached, "ORDERS");
        let again = DeliveryNames::share(&mut cached, "ORDERS");
        assert!(Arc::ptr_eq(&first, &again));
        let other = DeliveryNames::share(&mut cached, "AUDIT");
        assert_eq!(&*other, "AUDIT");
        assert_eq!(&*first, "ORDERS");
        assert!(Arc::ptr_eq(
            &other,
            &DeliveryNames::share(&mut cached, "AUDIT")
        ));
    }

    #[test]
    fn other_subjects_are_not_deliveries() {
        for reply in [
            "_INBOX.abc",
            "$JS.ACK.ORDERS.svc.2.1041.17.1700000000123456789",
            "$JS.ACK.x.ORDERS.svc.2.1041.17.1700000000123456789.5",
            "$JS.ACK.ORDERS.svc.two.1041.17.1700000000123456789.5",
            "$JS.ACK.ORDERS.svc.2.-1.17.1700000000123456789.5",
            "$JS.ACK.ORDERS.svc.2.1041.17.time.5",
        ] {
            assert_eq!(AckSubject::parse(reply), None, "{reply}");
        }
    }
}

#[cfg(test)]
#[path = "client_parser_tests.rs"]
mod client_parser_tests;
