//! The runtime configuration of `svc`: a strict JSON document, validated without touching the
//! network. Every problem is reported at once with its field path (see [`crate::document::reader`]).
//!
//! The reference for every field, default and range is `docs/configuration.md`.

mod effective;
pub mod hints;
pub mod lanes;

use crate::broker::config::read_nats;
pub use crate::broker::config::{ConsumerMode, ConsumerSettings, NatsAuth, NatsConfig};
pub use effective::effective_json;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backoff::{Backoff, Growth, Jitter};
use crate::broker::dead_letter::DeadLetterConfig;
use crate::document::grammar::{is_family_label, is_header_name, is_metric_name, looks_secret};
pub use crate::document::reader::LoadError;
use crate::document::reader::{self, parse_json, Invalid, ObjectReader, Problems};
use crate::message::envelope::EnvelopeConfig;
use crate::message::labels::SecurityLabelsConfig;
use crate::message::metadata::MessageMetadataConfig;
use crate::message::mission::MissionMetadataConfig;
use crate::message::policy::PreSinkPolicyConfig;
use crate::message::protection::authenticity::AuthenticityConfig;
use crate::message::protection::custody::CustodyConfig;
use crate::message::protection::encryption::EncryptionConfig;
use crate::message::size_policy::SizePolicyConfig;
use crate::message::subject::read_pattern;
use crate::metrics::SubjectFamily;
use crate::sink::spool::SpoolConfig;
use crate::sink::SinkConfig;

/// The whole runtime config.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    pub nats: NatsConfig,
    pub delivery: DeliveryConfig,
    pub envelope: EnvelopeConfig,
    pub sink: SinkConfig,
    pub metrics: MetricsConfig,
    pub advisories: AdvisoriesConfig,
    pub logging: LoggingConfig,
    /// Priority, classification and labels of each message (`docs/labels.md`).
    pub message_metadata: MessageMetadataConfig,
    /// The security label profile (`docs/labels.md`).
    pub security_labels: SecurityLabelsConfig,
    /// The governance stages (`docs/governance.md`): mission metadata, the pre-sink policy
    /// and the size policy.
    pub mission_metadata: MissionMetadataConfig,
    pub pre_sink_policy: PreSinkPolicyConfig,
    pub size_policy: SizePolicyConfig,
    /// Where permanently failing messages go (`docs/dead-letter.md`).
    pub dead_letter: DeadLetterConfig,
    /// Payload protection (`docs/payload-protection.md`): encryption at rest,
    /// publisher authenticity, custody evidence.
    pub payload_encryption: EncryptionConfig,
    pub authenticity: AuthenticityConfig,
    pub custody: CustodyConfig,
    /// The fallback spool beside the sink (`docs/spool.md`), when configured.
    pub spool: Option<SpoolConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryConfig {
    pub batch_size: usize,
    /// Expiry of each pull request: how long the broker may hold it open.
    pub fetch_expiry: Duration,
    /// Longest a message waits in a partly filled batch before it is handed to the sink.
    pub max_batch_wait: Duration,
    pub max_in_flight_batches: usize,
    /// Payload bytes the runner may have requested, hold in the pipeline and await
    /// acknowledgement for, in all (`pipeline/credit.rs`); one larger message still flows alone.
    pub max_in_flight_bytes: usize,
    /// Without `sink_workers` in the config: 2, or for the HTTP sink what keeps its request
    /// threads busy ([`crate::sink::http::config::HttpSinkConfig::workers_to_fill`]).
    pub sink_workers: usize,
    /// Batches older than this fraction of AckWait get in-progress acks.
    pub in_progress_fraction: f64,
    pub nak_backoff: Backoff,
    /// Permanent failures at or beyond this delivery count are terminated (`+TERM`);
    /// `None` leaves them to the broker's own limits.
    pub max_deliveries: Option<u64>,
    pub shutdown_timeout: Duration,
    /// `ack_confirmation`: every ACK sent as a request and settled only when the broker
    /// confirms it; unconfirmed ones are sent again after this long (`pipeline/confirm.rs`).
    pub ack_confirmation: Option<Duration>,
    /// `priority_lanes`: the order a batch is handed to the sink in; `None` = one call.
    pub priority_lanes: Option<lanes::PriorityLanes>,
}

/// Whether a permanent failure on delivery `delivery_count` is terminated (`+TERM`) rather
/// than redelivered: the one rule `svc-ack` acts on and the checkpoint gaps list.
pub fn terminated_at(max_deliveries: Option<u64>, delivery_count: u64) -> bool {
    max_deliveries.is_some_and(|max| delivery_count >= max)
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    pub enabled: bool,
    pub namespace: String,
    pub snapshot_file: Option<PathBuf>,
    pub write_interval: Duration,
    pub subject_families: Vec<SubjectFamily>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvisoriesConfig {
    pub enabled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggingConfig {
    pub level: log::LevelFilter,
    pub format: LogFormat,
    pub timestamps: LogTimestamps,
}

/// `logging.format`: human-readable lines, or one JSON object per line (Loki, Elastic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `logging.timestamps` (text format): `auto` drops the line's own timestamp when stderr is
/// the systemd journal, which stamps every line itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTimestamps {
    Auto,
    Always,
    Never,
}

impl LoggingConfig {
    /// The defaults with another level (the exporter has no config file).
    pub fn with_level(level: log::LevelFilter) -> Self {
        LoggingConfig {
            level,
            format: LogFormat::Text,
            timestamps: LogTimestamps::Auto,
        }
    }
}

/// Bounds, named so docs and code agree.
pub const MAX_BATCH_SIZE: i64 = 10_000;
pub const MAX_IN_FLIGHT_BATCHES: i64 = 64;
pub const DEFAULT_BATCH_SIZE: i64 = 256;
const DEFAULT_MAX_IN_FLIGHT_BATCHES: i64 = 8;
const MIB: i64 = 1024 * 1024;
const DEFAULT_MAX_IN_FLIGHT_BYTES: i64 = 64 * MIB;
const MIN_MAX_IN_FLIGHT_BYTES: i64 = MIB;
const MAX_MAX_IN_FLIGHT_BYTES: i64 = 64 * 1024 * MIB;
pub const DEFAULT_SINK_WORKERS: i64 = 2;
pub const MAX_SINK_WORKERS: i64 = 64;
pub const MAX_SUBJECT_FAMILIES: usize = 100;

impl RuntimeConfig {
    pub fn load(path: &Path) -> Result<RuntimeConfig, LoadError> {
        let mut cfg = reader::load_document(path, "", Self::parse)?;
        cfg.custody.checkpoints.default_head_file(path);
        Ok(cfg)
    }

    /// Parses and validates a config document.
    pub fn parse(text: &str) -> Result<RuntimeConfig, Invalid> {
        let value = parse_json(text)?;
        if !value.is_object() {
            return Err(Invalid::one("", "the configuration must be a JSON object"));
        }
        let problems = Problems::new();
        let mut root = ObjectReader::root(&value, &problems);

        let nats = match root.object("nats") {
            Some(r) => Some(read_nats(
                r,
                DEFAULT_MAX_IN_FLIGHT_BATCHES * DEFAULT_BATCH_SIZE,
            )),
            None => {
                root.problem("nats", "is required");
                None
            }
        };
        let (mut delivery, workers_set) = read_delivery(root.object("delivery"));
        let envelope = read_envelope(root.object("envelope"));
        let sink = match root.object("sink") {
            Some(r) => SinkConfig::read(r),
            None => {
                root.problem("sink", "is required");
                None
            }
        };
        if !workers_set {
            if let Some(SinkConfig::Http(http)) = &sink {
                delivery.sink_workers = http
                    .workers_to_fill(delivery.batch_size)
                    .min(MAX_SINK_WORKERS as usize);
            }
            // Shown as the runner uses it (`null` would hide it).
            crate::document::effective::record(
                "delivery.sink_workers",
                crate::document::effective::Node::Leaf(delivery.sink_workers.into()),
            );
        }
        let metrics = read_metrics(root.object("metrics"));
        let advisories = AdvisoriesConfig {
            enabled: match root.object("advisories") {
                Some(mut r) => {
                    let e = r.bool_or("enabled", false);
                    r.finish();
                    e
                }
                None => false,
            },
        };
        let logging = read_logging(root.object("logging"));
        let message_metadata = MessageMetadataConfig::read(root.object("message_metadata"));
        let security_labels = SecurityLabelsConfig::read(root.object("security_labels"));
        let mission_metadata = MissionMetadataConfig::read(root.object("mission_metadata"));
        let pre_sink_policy = PreSinkPolicyConfig::read(root.object("pre_sink_policy"));
        let size_policy = SizePolicyConfig::read(root.object("size_policy"));
        let mut dead_letter = DeadLetterConfig::read(root.object("dead_letter"));
        let payload_encryption = EncryptionConfig::read(root.object("payload_encryption"));
        let authenticity = AuthenticityConfig::read(root.object("authenticity"));
        let custody = CustodyConfig::read(root.object("custody"));
        let spool = root.object("spool").map(SpoolConfig::read);
        if spool.is_some() && matches!(sink, Some(SinkConfig::Spool(_))) {
            problems.push("spool", "must not be set when sink.type is spool");
        }
        root.finish();
        security_labels.cross_check(&message_metadata, &problems);
        pre_sink_policy.cross_check(
            mission_metadata.enabled,
            payload_encryption.enabled,
            &problems,
        );
        if mission_metadata.enabled {
            let others = [
                &security_labels.header,
                &message_metadata.priority_header,
                &message_metadata.classification_header,
                &message_metadata.labels_header,
                &envelope.event_time_header,
            ];
            if others.contains(&&mission_metadata.header) {
                problems.push(
                    "mission_metadata.header",
                    "must differ from the label, metadata and event time headers (one header \
                     cannot carry two things)",
                );
            }
        }
        let [alg_header, key_id_header, signature_header] = authenticity.headers();
        dead_letter.cross_check(
            nats.as_ref().map_or(&[][..], |n| n.subjects.as_slice()),
            &[
                &security_labels.header,
                &mission_metadata.header,
                &message_metadata.priority_header,
                &message_metadata.classification_header,
                &message_metadata.labels_header,
                alg_header,
                key_id_header,
                signature_header,
            ],
            &problems,
        );
        refuse_kept_signature_headers(
            &envelope,
            [alg_header, key_id_header, signature_header],
            &problems,
        );
        crate::message::protection::cross_check(&payload_encryption, &custody, &problems);
        if let Some(SinkConfig::Fanout(f)) = &sink {
            check_fanout_routes(f, &envelope, &security_labels, &problems);
        }
        if custody.enabled && custody.checkpoints.enabled {
            dead_letter.runner_id = custody.runner_id.clone();
            let why = sink.as_ref().and_then(crate::sink::checkpoint::unavailable);
            if let Some(why) = why {
                problems.push("custody.checkpoints.enabled", &why);
            }
        }
        if payload_encryption.enabled {
            if let Some(sink) = &sink {
                refuse_payload_sha256_keys(sink, "sink", &problems);
            }
        }

        match (nats, sink, problems.is_empty()) {
            (Some(nats), Some(sink), true) => Ok(RuntimeConfig {
                nats,
                delivery,
                envelope,
                sink,
                metrics,
                advisories,
                logging,
                message_metadata,
                security_labels,
                mission_metadata,
                pre_sink_policy,
                size_policy,
                dead_letter,
                payload_encryption,
                authenticity,
                custody,
                spool,
            }),
            _ => Err(Invalid(problems.into_vec())),
        }
    }
}

/// A fan-out route matches the envelope the sink receives: a header it names must be kept, and
/// a priority or classification must be one the label profile allows (when it lists any).
fn check_fanout_routes(
    f: &crate::sink::fanout::FanoutConfig,
    envelope: &EnvelopeConfig,
    labels: &SecurityLabelsConfig,
    problems: &Problems,
) {
    for (i, r) in f.routing.routes.iter().enumerate() {
        let at = format!("sink.routing.routes[{i}].match");
        for h in r.when.headers.keys() {
            if !envelope.keep_headers.iter().any(|k| k == h) {
                problems.push(
                    format!("{at}.headers.{h}"),
                    "is not in envelope.keep_headers, so the envelope never carries it and no \
                     message could match",
                );
            }
        }
        let allowed = &labels.allowed_priorities;
        let listed = |allowed: &std::collections::BTreeSet<String>, v: &str| {
            allowed.iter().any(|a| a.eq_ignore_ascii_case(v))
        };
        for p in r.when.priority.iter().flatten() {
            if !allowed.is_empty() && !listed(allowed, p) {
                problems.push(
                    format!("{at}.priority"),
                    format!(
                        "{p} is not in security_labels.allowed_priorities, so no message could \
                         match"
                    ),
                );
            }
        }
        let allowed = &labels.allowed_classifications;
        for c in r.when.classification.iter().flatten() {
            if !allowed.is_empty() && !listed(allowed, c) {
                problems.push(
                    format!("{at}.classification"),
                    format!(
                        "{c} is not in security_labels.allowed_classifications, so no message \
                         could match"
                    ),
                );
            }
        }
    }
}

/// With payload encryption on, equal payloads must not share a storage key (the key would
/// reveal equality, and a keyed digest rotates with its key).
fn refuse_payload_sha256_keys(sink: &SinkConfig, path: &str, problems: &Problems) {
    use crate::sink::key::KeyStrategy::PayloadSha256;
    let refuse = || {
        problems.push(
            format!("{path}.key_strategy"),
            "payload_sha256 is refused when payload_encryption is enabled (equal payloads \
             would share a key); use idempotency_key or stream_sequence",
        )
    };
    match sink {
        SinkConfig::File(c) if c.key_strategy == PayloadSha256 => refuse(),
        SinkConfig::ObjectStore(c) if c.key_strategy == PayloadSha256 => refuse(),
        SinkConfig::Fanout(f) => {
            for (name, child) in &f.sinks {
                refuse_payload_sha256_keys(child, &format!("{path}.sinks.{name}"), problems);
            }
        }
        _ => {}
    }
}

pub const DEFAULT_NAK_BACKOFF: Backoff = Backoff {
    growth: Growth::Exponential,
    initial: Duration::from_millis(1000),
    multiplier: 2.0,
    max: Duration::from_millis(60_000),
    jitter: Jitter::Full,
};

/// The `delivery` block, and whether it set `sink_workers` (else a sink may choose).
fn read_delivery(r: Option<ObjectReader<'_>>) -> (DeliveryConfig, bool) {
    let empty = serde_json::Value::Object(Default::default());
    let scratch = Problems::new();
    let mut r = r.unwrap_or_else(|| ObjectReader::at("delivery".into(), &empty, &scratch));
    let batch_size = r.int_in("batch_size", DEFAULT_BATCH_SIZE, 1, MAX_BATCH_SIZE) as usize;
    let fetch_expiry = Duration::from_millis(r.int_in("fetch_expiry_ms", 1000, 10, 60_000) as u64);
    let max_batch_wait =
        Duration::from_millis(r.int_in("max_batch_wait_ms", 100, 1, 60_000) as u64);
    let max_in_flight_batches = r.int_in(
        "max_in_flight_batches",
        DEFAULT_MAX_IN_FLIGHT_BATCHES,
        1,
        MAX_IN_FLIGHT_BATCHES,
    ) as usize;
    let max_in_flight_bytes = r.int_in(
        "max_in_flight_bytes",
        DEFAULT_MAX_IN_FLIGHT_BYTES,
        MIN_MAX_IN_FLIGHT_BYTES,
        MAX_MAX_IN_FLIGHT_BYTES,
    ) as usize;
    let sink_workers = r
        .opt_int_in("sink_workers", 1, MAX_SINK_WORKERS)
        .map(|n| n as usize);
    let in_progress_fraction = r.number_in("in_progress_fraction", 0.5, 0.05, false, 0.9);
    let nak_backoff = match r.object("nak_backoff") {
        Some(mut b) => {
            let v = Backoff::read(&mut b, DEFAULT_NAK_BACKOFF);
            b.finish();
            v
        }
        None => DEFAULT_NAK_BACKOFF,
    };
    let max_deliveries = r
        .opt_int_in("max_deliveries", 1, 1_000_000)
        .map(|n| n as u64);
    let shutdown_timeout =
        Duration::from_secs(r.int_in("shutdown_timeout_seconds", 30, 1, 600) as u64);
    let ack_confirmation = r.bool_or("ack_confirmation", false);
    let confirmation_timeout =
        Duration::from_millis(r.int_in("ack_confirmation_timeout_ms", 1000, 50, 60_000) as u64);
    let priority_lanes = r.object("priority_lanes").and_then(|mut l| {
        let lanes = lanes::PriorityLanes::read(&mut l);
        l.finish();
        lanes
    });
    r.finish();
    let config = DeliveryConfig {
        batch_size,
        fetch_expiry,
        max_batch_wait,
        max_in_flight_batches,
        max_in_flight_bytes,
        sink_workers: sink_workers.unwrap_or(DEFAULT_SINK_WORKERS as usize),
        in_progress_fraction,
        nak_backoff,
        max_deliveries,
        shutdown_timeout,
        ack_confirmation: ack_confirmation.then_some(confirmation_timeout),
        priority_lanes,
    };
    (config, sink_workers.is_some())
}

/// A publisher's signature stored beside an encrypted payload lets anyone with the public key
/// confirm guesses of the plaintext, and an HMAC tag is an unkeyed-to-them digest of it:
/// signature headers are never kept, whether or not encryption is on today.
fn refuse_kept_signature_headers(
    envelope: &EnvelopeConfig,
    signature_headers: [&str; 3],
    problems: &Problems,
) {
    for (i, h) in envelope.keep_headers.iter().enumerate() {
        if signature_headers.iter().any(|s| s.eq_ignore_ascii_case(h)) {
            problems.push(
                format!("envelope.keep_headers[{i}]"),
                "names a signature header of authenticity; a stored signature lets anyone with \
                 the public key confirm guesses of an encrypted payload, so it is never kept",
            );
        }
    }
}

fn read_envelope(r: Option<ObjectReader<'_>>) -> EnvelopeConfig {
    let Some(mut r) = r else {
        return EnvelopeConfig::default();
    };
    let d = EnvelopeConfig::default();
    let keep_headers = r.string_list("keep_headers");
    for (i, h) in keep_headers.iter().enumerate() {
        if !is_header_name(h) {
            r.problems().push(
                format!("{}[{i}]", r.path_of("keep_headers")),
                "must be a header name without spaces or control characters",
            );
        } else if looks_secret(h) {
            r.problems().push(
                format!("{}[{i}]", r.path_of("keep_headers")),
                "looks like a secret-bearing header and is never kept",
            );
        }
    }
    let event_time_header = r.string_or("event_time_header", &d.event_time_header);
    if !is_header_name(&event_time_header) {
        r.problem(
            "event_time_header",
            "must be a header name without spaces or control characters",
        );
    }
    let stale_after_seconds = r.number_in(
        "stale_after_seconds",
        d.stale_after_seconds,
        0.0,
        true,
        31_536_000.0,
    );
    r.finish();
    EnvelopeConfig {
        keep_headers,
        event_time_header,
        stale_after_seconds,
    }
}

fn read_metrics(r: Option<ObjectReader<'_>>) -> MetricsConfig {
    let Some(mut r) = r else {
        return MetricsConfig {
            enabled: false,
            namespace: "svc".into(),
            snapshot_file: None,
            write_interval: Duration::from_secs(5),
            subject_families: Vec::new(),
        };
    };
    let enabled = r.bool_or("enabled", false);
    let namespace = r.string_or("namespace", "svc");
    if !is_metric_name(&namespace) || namespace.len() > 64 {
        r.problem(
            "namespace",
            "must match [a-zA-Z_][a-zA-Z0-9_]* and be at most 64 bytes",
        );
    }
    let snapshot_file = r.opt_nonempty("snapshot_file").map(PathBuf::from);
    if enabled && snapshot_file.is_none() {
        r.problem("snapshot_file", "is required when metrics.enabled is true");
    }
    let write_interval = Duration::from_secs(r.int_in("write_interval_seconds", 5, 1, 3600) as u64);
    let mut subject_families = Vec::new();
    let families = r.objects("subject_families");
    if families.len() > MAX_SUBJECT_FAMILIES {
        r.problem(
            "subject_families",
            format!("must have at most {MAX_SUBJECT_FAMILIES} entries"),
        );
    }
    for mut f in families {
        let label = f.req_string("label");
        let pattern = read_pattern(&mut f, "subject");
        if !label.is_empty() && !is_family_label(&label) {
            f.problem(
                "label",
                "must match [a-z][a-z0-9_-]*, at most 64 bytes, and not look like a credential",
            );
        } else if !label.is_empty()
            && subject_families
                .iter()
                .any(|s: &SubjectFamily| s.label == label)
        {
            // One label, one family: exporters join rows to patterns by label.
            f.problem(
                "label",
                "is used by an earlier family; labels must be unique",
            );
        }
        f.finish();
        if let Some(pattern) = pattern {
            subject_families.push(SubjectFamily { pattern, label });
        }
    }
    r.finish();
    MetricsConfig {
        enabled,
        namespace,
        snapshot_file,
        write_interval,
        subject_families,
    }
}

fn read_logging(r: Option<ObjectReader<'_>>) -> LoggingConfig {
    use log::LevelFilter as L;
    let Some(mut r) = r else {
        return LoggingConfig::with_level(L::Info);
    };
    let level = r.one_of(
        "level",
        L::Info,
        &[
            ("error", L::Error),
            ("warn", L::Warn),
            ("info", L::Info),
            ("debug", L::Debug),
            ("trace", L::Trace),
        ],
    );
    let format = r.one_of(
        "format",
        LogFormat::Text,
        &[("text", LogFormat::Text), ("json", LogFormat::Json)],
    );
    let timestamps = r.one_of(
        "timestamps",
        LogTimestamps::Auto,
        &[
            ("auto", LogTimestamps::Auto),
            ("always", LogTimestamps::Always),
            ("never", LogTimestamps::Never),
        ],
    );
    r.finish();
    LoggingConfig {
        level,
        format,
        timestamps,
    }
}

#[cfg(test)]
mod tests;
