//! Binding the durable pull consumer: reading it, creating or reconciling it when
//! `nats.consumer_mode` asks, refusing what changes delivery, and subscribing.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use nats::jetstream::{
    AckPolicy, ConsumerConfig, DeliverPolicy, PullSubscribeOptions, ReplayPolicy,
};

use super::config::{ConsumerMode, NatsConfig, StartPosition};
use super::consumer_limits::{ConsumerLimits, Limits};
use super::inherited::Inherited;
use super::{
    consumer_shape, err, incarnation, is_not_found, BrokerError, Connection, PullSubscription,
};
use crate::text::peer::PeerText;

/// The bound consumer: subscription plus what the pipeline needs to know about it.
pub struct Consumer {
    pub subscription: PullSubscription,
    pub ack_wait: Duration,
    /// The consumer's MaxAckPending (unacknowledged deliveries the broker allows in all) and
    /// MaxDeliver (deliveries of one message at most): read at bind, then kept current by the
    /// consumer watch ([`super::consumer_limits`]).
    pub limits: Arc<ConsumerLimits>,
    pub stream: String,
    /// The stream's incarnation at bind ([`incarnation`]).
    pub incarnation: Arc<str>,
    pub name: String,
    /// The consumer's config as the broker reported it at bind (its request limits are
    /// checked against the pipeline's requests: [`consumer_shape::check_request_limits`]).
    pub config: serde_json::Value,
    /// The deliveries it held unacknowledged at bind ([`Inherited`]).
    pub inherited: Inherited,
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
pub(super) fn subscribe_bound(
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
    let (config, state) = consumer_shape::consumer_info(nc, &cfg.stream, &cfg.consumer)
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
    Ok(Consumer {
        subscription,
        ack_wait,
        limits: Arc::new(ConsumerLimits::new(Limits::of(&config))),
        stream: cfg.stream.clone(),
        incarnation: stream_incarnation,
        name: cfg.consumer.clone(),
        config,
        inherited: Inherited::of(&state),
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
pub(super) fn report_start(existing: &serde_json::Value, cfg: &NatsConfig, what: &str) {
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
pub(super) fn reconcile_consumer(
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

pub(super) fn invalid(what: &str, why: &str) -> BrokerError {
    BrokerError {
        action: what.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidInput, why.to_string()).into(),
    }
}
