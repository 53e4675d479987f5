//! The runner's metrics: lock-free counters, small summaries, bounded subject-family rows.
//!
//! Every pipeline thread bumps counters here; `svc-snapshot` reads them and writes the JSON
//! snapshot (see [`snapshot`]). Nothing in this module ever sees a payload, a raw subject
//! outside the family matcher, a path, a table name or a credential.

pub mod snapshot;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::message::subject::{SubjectPattern, SubjectRule, SubjectRules};

/// Declares the counter set once: the struct, its names and the snapshot iteration stay in step.
macro_rules! counters {
    ($( $(#[$doc:meta])* $field:ident ),* $(,)?) => {
        /// Monotonic counters. Field name = metric suffix.
        #[derive(Debug, Default)]
        pub struct Counters {
            $( $(#[$doc])* pub $field: AtomicU64, )*
        }

        impl Counters {
            /// Every counter as `(suffix, value)`, in declaration order.
            pub fn values(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($field), self.$field.load(Ordering::Relaxed)), )* ]
            }

            /// Every counter suffix the runner can produce.
            pub const NAMES: &'static [&'static str] = &[ $( stringify!($field), )* ];
        }
    };
}

counters! {
    /// Messages received from the broker.
    messages_fetched_total,
    /// Messages normalized into envelopes and handed to the sink.
    messages_prepared_total,
    /// Messages the sink reported durable (including already-durable duplicates).
    messages_written_total,
    /// Messages acknowledged after durable success or DLQ success.
    messages_acked_total,
    /// Messages terminated (`+TERM`) after the configured delivery limit.
    messages_terminated_total,
    /// Negative acknowledgements sent (transient failures and permanent failures awaiting a limit).
    messages_nacked_total,
    /// Messages whose processing failed permanently (pre-sink or sink).
    messages_failed_total,
    /// Messages published to the dead-letter subject and confirmed by the broker.
    messages_dlq_total,
    /// Dead-letter publishes that were not confirmed (the original stays unacknowledged).
    dlq_publish_errors_total,
    /// Sink write failures, counted per message.
    sink_write_errors_total,
    /// Sink writes that failed permanently (a failure class redelivery cannot fix), counted per
    /// message and delivery: dead-lettered when a DLQ is on, else NAKed until a delivery limit.
    sink_permanent_failures_total,
    /// In-sink retries of a single write (object store: timeouts, 5xx, 409 conflicts).
    sink_retries_total,
    /// Events whose age at receive exceeded `envelope.stale_after_seconds`.
    events_stale_at_receive_total,
    /// Events without a publisher timestamp header (broker time used instead).
    events_missing_publisher_timestamp_total,
    /// Events whose publisher timestamp header could not be parsed.
    events_malformed_timestamp_total,
    /// Events whose source time lies in the runner's future (positive source clock skew).
    events_source_clock_skew_total,
    /// Events whose event time header lies more than 10 years before or an hour after the
    /// broker's store time: left out of the event-age summaries (broker time used instead).
    events_implausible_time_total,
    /// Relational sink: rows whose idempotency key already existed (every duplicate detected).
    db_duplicates_total,
    /// Relational sink: the duplicates confirmed to be the same event (same subject and payload
    /// digest), ignored without error; the rest are key collisions reported as permanent.
    db_duplicate_ignored_total,
    /// Connections lost to the broker.
    broker_connection_disconnects_total,
    /// Connections re-established to the broker.
    broker_connection_reconnects_total,
    /// Asynchronous connection errors reported by the client.
    broker_connection_errors_total,
    /// In-progress acknowledgements sent to extend AckWait of long batches.
    messages_in_progress_total,
    /// `ack_confirmation`: ACKs the broker confirmed having processed.
    ack_confirmations_total,
    /// `ack_confirmation`: ACKs sent again because no confirmation came in time.
    acks_resent_total,
    /// `ack_confirmation`: ACKs given up unconfirmed (after the ack wait, at a stop, or for a
    /// consumer created again); the broker redelivers what they did not settle.
    ack_confirmations_abandoned_total,
    /// Custody checkpoints: deliveries of a message given up on that were NAKed to wait until a
    /// stored checkpoint lists its gap (sign first, settle last).
    checkpoint_gap_waits_total,
    /// Custody checkpoints: messages given up on and settled before a checkpoint listed their
    /// gap (the checkpoint store failing with the hold full, the thread reading the store
    /// back, or the consumer's own last delivery); the gap is still listed by the next cut.
    checkpoint_gaps_settled_unsigned_total,
    /// Fan-out: messages routed to at least one child.
    fanout_messages_routed_total,
    /// Fan-out: messages no route matched, acknowledged unstored (`no_match: ignore`).
    fanout_messages_ignored_total,
    /// Fan-out: child sinks selected, summed over messages.
    fanout_child_sinks_selected_total,
    /// Fan-out: required child writes that succeeded.
    fanout_required_child_success_total,
    /// Fan-out: required child writes that failed and blocked ACK.
    fanout_required_child_failure_total,
    /// Fan-out: optional child writes that did not finish within their timeout.
    fanout_optional_child_timeout_total,
    /// Fan-out: optional child writes that failed.
    fanout_optional_child_failure_total,
    /// Fan-out: messages released by the ACK gate.
    fanout_messages_acked_total,
    /// Fan-out: messages held back by the ACK gate.
    fanout_messages_ack_blocked_total,
    /// Advisory observer: max-deliveries advisories seen.
    advisory_max_deliveries_total,
    /// Advisory observer: message-terminated advisories seen.
    advisory_terminated_total,
    /// Advisory observer: consumer NAK advisories seen.
    advisory_nak_total,
    /// Authenticity: messages whose signature verified.
    authenticity_verified_total,
    /// Authenticity: messages without a signature on a subject that does not require one.
    authenticity_unsigned_total,
    /// Authenticity: refused, no signature where one is required.
    authenticity_missing_signature_total,
    /// Authenticity: refused, incomplete, repeated or undecodable signature headers.
    authenticity_malformed_signature_total,
    /// Authenticity: refused, algorithm not allowed for the subject.
    authenticity_disallowed_algorithm_total,
    /// Authenticity: refused, key id unknown or not allowed for the subject.
    authenticity_unknown_key_total,
    /// Authenticity: refused, the signature does not verify.
    authenticity_bad_signature_total,
    /// Payload encryption: payloads encrypted.
    payload_encrypted_total,
    /// Payload encryption: payloads left in clear by a `clear` rule or default.
    payload_encryption_clear_total,
    /// Payload encryption: messages refused because the active key reached its message bound
    /// (left unacknowledged until the key is rotated).
    payload_encryption_refused_total,
    /// Custody: records sealed with a custody block.
    custody_sealed_total,
    /// Mission metadata: records given a mission metadata object.
    mission_metadata_attached_total,
    /// Mission metadata: messages refused (dead-lettered) by the mission metadata stage.
    mission_metadata_rejected_total,
    /// Pre-sink policy: messages refused (dead-lettered) by a policy rule or as unmatched.
    pre_sink_policy_rejected_total,
    /// Size policy: messages refused (dead-lettered) by a size bound.
    size_policy_rejected_total,
    /// Mission metadata refused: `duplicate_header`.
    mission_metadata_duplicate_header_total,
    /// Mission metadata refused: `header_too_large`.
    mission_metadata_header_too_large_total,
    /// Mission metadata refused: `invalid_json`.
    mission_metadata_invalid_json_total,
    /// Mission metadata refused: `duplicate_key`.
    mission_metadata_duplicate_key_total,
    /// Mission metadata refused: `not_object`.
    mission_metadata_not_object_total,
    /// Mission metadata refused: `control_character`.
    mission_metadata_control_character_total,
    /// Mission metadata refused: `nul_character`.
    mission_metadata_nul_character_total,
    /// Mission metadata refused: `too_deep`.
    mission_metadata_too_deep_total,
    /// Mission metadata refused: `too_large`.
    mission_metadata_too_large_total,
    /// Mission metadata refused: `missing_profile`.
    mission_metadata_missing_profile_total,
    /// Mission metadata refused: `wrong_type`.
    mission_metadata_wrong_type_total,
    /// Mission metadata refused: `unknown_profile`.
    mission_metadata_unknown_profile_total,
    /// Mission metadata refused: `profile_not_allowed`.
    mission_metadata_profile_not_allowed_total,
    /// Mission metadata refused: `missing_field`.
    mission_metadata_missing_field_total,
    /// Mission metadata refused: `out_of_bounds`.
    mission_metadata_out_of_bounds_total,
    /// Mission metadata refused: `unknown_field`.
    mission_metadata_unknown_field_total,
    /// Pre-sink policy refused: `unmatched_subject`.
    pre_sink_policy_unmatched_subject_total,
    /// Pre-sink policy refused: `priority_not_allowed`.
    pre_sink_policy_priority_not_allowed_total,
    /// Pre-sink policy refused: `classification_not_allowed`.
    pre_sink_policy_classification_not_allowed_total,
    /// Pre-sink policy refused: `missing_required_label`.
    pre_sink_policy_missing_required_label_total,
    /// Pre-sink policy refused: `missing_mission_metadata`.
    pre_sink_policy_missing_mission_metadata_total,
    /// Pre-sink policy refused: `payload_not_encrypted`.
    pre_sink_policy_payload_not_encrypted_total,
    /// Pre-sink policy refused: `policy_payload_too_large`.
    pre_sink_policy_policy_payload_too_large_total,
    /// Pre-sink policy refused: `mission_metadata_key_not_allowed`.
    pre_sink_policy_mission_metadata_key_not_allowed_total,
    /// Size policy refused: `payload_too_large`.
    size_policy_payload_too_large_total,
    /// Size policy refused: `too_many_headers`.
    size_policy_too_many_headers_total,
    /// Size policy refused: `header_name_too_long`.
    size_policy_header_name_too_long_total,
    /// Size policy refused: `header_value_too_long`.
    size_policy_header_value_too_long_total,
    /// Size policy refused: `headers_too_large`.
    size_policy_headers_too_large_total,
    /// Size policy refused: `too_many_labels`.
    size_policy_too_many_labels_total,
    /// Size policy refused: `labels_too_large`.
    size_policy_labels_too_large_total,
    /// Size policy refused: `mission_metadata_too_large`.
    size_policy_mission_metadata_too_large_total,
    /// Size policy refused: `record_too_large`.
    size_policy_record_too_large_total,
    /// Spool: records appended (fsynced) instead of being written to the sink directly.
    spool_appended_total,
    /// Spool: records the drain delivered and the sink confirmed.
    spool_drained_total,
    /// Spool: damaged stretches of a segment moved to a quarantine file.
    spool_quarantined_total,
    /// Spool: records refused because the spool was full (left to the broker, NAKed).
    spool_full_refusals_total,
    /// Spool: records the sink refused for good while draining (kept in a `rejected-*` file).
    spool_rejected_total,
    /// Spool: drain steps that failed on the spool's side (records the sink refused that
    /// could not be kept, a segment or the position that could not be read or written); the
    /// drain does not move past such a step.
    spool_drain_errors_total,
    /// HTTP sink: requests answered with a 2xx status.
    http_requests_2xx_total,
    /// HTTP sink: requests answered with a 3xx status (never followed: the sink is unusable).
    http_requests_3xx_total,
    /// HTTP sink: requests answered with a 4xx status.
    http_requests_4xx_total,
    /// HTTP sink: requests answered with a 5xx status.
    http_requests_5xx_total,
    /// HTTP sink: requests answered with a status that refuses the sink itself (401, 403, 404,
    /// 407, a redirect: any status outside the success, retry and dead-letter lists).
    http_sink_unusable_total,
    /// HTTP sink: requests without an answer (timeout, connection or TLS failure).
    http_request_failures_total,
    /// HTTP sink: requests sent again in the call (retry statuses, timeouts, no answer).
    http_retries_total,
    /// HTTP sink: retries that waited as the receiver's `Retry-After` asked.
    http_retry_after_waits_total,
    /// HTTP sink: request body bytes sent (as sent: after gzip), retries included.
    http_request_bytes_total,
}

/// Gauges: last-value metrics.
#[derive(Debug, Default)]
pub struct Gauges {
    /// Unix time (seconds) of the last successful sink batch, 0 before the first.
    pub last_sink_success_epoch_seconds: AtomicU64,
    /// Spool: records waiting to be drained.
    pub spool_records: AtomicU64,
    /// Spool: bytes of its segment files.
    pub spool_bytes: AtomicU64,
    /// Spool: Unix time (seconds) the oldest waiting record was appended, 0 when empty.
    pub spool_oldest_record_epoch_seconds: AtomicU64,
    /// Spool: 0 direct, 1 spooling (the sink does not answer), 2 draining.
    pub spool_mode: AtomicU64,
    /// A spool is configured: the spool gauges are in the snapshot.
    pub spool_enabled: std::sync::atomic::AtomicBool,
}

/// The spool's gauges, in the snapshot only when a spool is configured.
pub const SPOOL_GAUGE_NAMES: &[&str] = &[
    "spool_records",
    "spool_bytes",
    "spool_oldest_record_epoch_seconds",
    "spool_mode",
];

impl Gauges {
    /// The spool gauges as `(name, value)`, empty without a spool.
    pub fn spool_values(&self) -> Vec<(&'static str, u64)> {
        if !self.spool_enabled.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let values = [
            &self.spool_records,
            &self.spool_bytes,
            &self.spool_oldest_record_epoch_seconds,
            &self.spool_mode,
        ];
        SPOOL_GAUGE_NAMES
            .iter()
            .zip(values)
            .map(|(n, v)| (*n, v.load(Ordering::Relaxed)))
            .collect()
    }
}

/// Summary suffixes the runner produces.
pub const SUMMARY_NAMES: &[&str] = &[
    "sink_batch_write_seconds",
    "event_age_at_receive_seconds",
    "event_age_at_store_seconds",
    "fanout_ack_gate_wait_seconds",
    "http_request_seconds",
    "http_retry_after_wait_seconds",
    "ack_confirmation_seconds",
];

/// One of the summaries, named at the call site by variant (a typo does not compile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SummaryMetric {
    SinkBatchWrite = 0,
    EventAgeAtReceive = 1,
    EventAgeAtStore = 2,
    FanoutAckGateWait = 3,
    HttpRequest = 4,
    HttpRetryAfterWait = 5,
    AckConfirmation = 6,
}

impl SummaryMetric {
    /// Every one, in [`SUMMARY_NAMES`] order.
    pub const ALL: [SummaryMetric; 7] = [
        SummaryMetric::SinkBatchWrite,
        SummaryMetric::EventAgeAtReceive,
        SummaryMetric::EventAgeAtStore,
        SummaryMetric::FanoutAckGateWait,
        SummaryMetric::HttpRequest,
        SummaryMetric::HttpRetryAfterWait,
        SummaryMetric::AckConfirmation,
    ];

    /// Its name in the snapshot.
    pub fn name(self) -> &'static str {
        SUMMARY_NAMES[self as usize]
    }
}

/// Count, sum, min, max and last of an observed quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
}

impl Summary {
    pub fn observe(&mut self, v: f64) {
        if self.count == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.count += 1;
        self.sum += v;
        self.last = v;
    }

    /// Adds the observations of `later` (made after this one's).
    pub fn merge(&mut self, later: &Summary) {
        if later.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *later;
            return;
        }
        self.count += later.count;
        self.sum += later.sum;
        self.min = self.min.min(later.min);
        self.max = self.max.max(later.max);
        self.last = later.last;
    }
}

/// A reviewed, bounded subject family: subjects matching `pattern` are counted under `label`.
#[derive(Debug, Clone, PartialEq)]
pub struct SubjectFamily {
    pub pattern: SubjectPattern,
    pub label: String,
}

impl SubjectRule for SubjectFamily {
    fn pattern(&self) -> &SubjectPattern {
        &self.pattern
    }
}

/// Metrics kept per subject family (the `labeled_metrics` rows of the snapshot).
pub const FAMILY_METRICS: &[&str] = &[
    "messages_fetched_total",
    "messages_written_total",
    "messages_acked_total",
    "messages_failed_total",
    "messages_dlq_total",
];

/// One of the per-family counters, named at the call site by variant (a typo does not
/// compile) and counted by index, never by searching [`FAMILY_METRICS`] per message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FamilyMetric {
    Fetched = 0,
    Written = 1,
    Acked = 2,
    Failed = 3,
    Dlq = 4,
}

impl FamilyMetric {
    /// Every one, in [`FAMILY_METRICS`] order.
    pub const ALL: [FamilyMetric; 5] = [
        FamilyMetric::Fetched,
        FamilyMetric::Written,
        FamilyMetric::Acked,
        FamilyMetric::Failed,
        FamilyMetric::Dlq,
    ];

    /// Its name in the snapshot (`messages_..._total`).
    pub fn name(self) -> &'static str {
        FAMILY_METRICS[self as usize]
    }
}

/// The registry shared by all threads.
#[derive(Debug)]
pub struct Metrics {
    pub counters: Counters,
    pub gauges: Gauges,
    summaries: Mutex<BTreeMap<&'static str, Summary>>,
    families: SubjectRules<SubjectFamily>,
    /// `family_counts[family][metric]`, indexes into `families` and [`FAMILY_METRICS`].
    family_counts: Vec<[AtomicU64; 5]>,
    /// Names of the priority lanes, in hand-off order (empty without lanes).
    lanes: Vec<String>,
    lane_counts: Vec<LaneCounts>,
}

/// Counters of one priority lane (`delivery.priority_lanes`).
#[derive(Debug, Default)]
pub struct LaneCounts {
    /// Messages handed to the sink in this lane.
    pub messages_total: AtomicU64,
    /// Of those, durably written.
    pub messages_written_total: AtomicU64,
    /// `write_batch` calls made for this lane.
    pub sink_writes_total: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Metrics {
    pub fn new(families: Vec<SubjectFamily>) -> Self {
        let family_counts = families.iter().map(|_| Default::default()).collect();
        Metrics {
            counters: Counters::default(),
            gauges: Gauges::default(),
            summaries: Mutex::new(
                SUMMARY_NAMES
                    .iter()
                    .map(|n| (*n, Summary::default()))
                    .collect(),
            ),
            families: SubjectRules::new(families),
            family_counts,
            lanes: Vec::new(),
            lane_counts: Vec::new(),
        }
    }

    /// Adds one set of lane counters per priority lane, in hand-off order.
    pub fn with_lanes(mut self, lanes: Vec<String>) -> Self {
        self.lane_counts = lanes.iter().map(|_| LaneCounts::default()).collect();
        self.lanes = lanes;
        self
    }

    /// The counters of lane `lane` (an index into the configured lanes).
    pub fn lane(&self, lane: usize) -> Option<&LaneCounts> {
        self.lane_counts.get(lane)
    }

    /// The lanes' names and counters, in hand-off order.
    pub fn lanes(&self) -> impl Iterator<Item = (&str, &LaneCounts)> {
        self.lanes.iter().map(String::as_str).zip(&self.lane_counts)
    }

    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Records one observation of a summary.
    pub fn observe(&self, metric: SummaryMetric, value: f64) {
        let mut one = Summary::default();
        one.observe(value);
        self.observe_all(metric, &one);
    }

    /// Records many observations at once, collected by the caller in `batch`: the pipeline
    /// collects per batch, so the shared lock is taken once per batch, not per message.
    pub fn observe_all(&self, metric: SummaryMetric, batch: &Summary) {
        if batch.count == 0 {
            return;
        }
        let mut s = self.summaries.lock().unwrap_or_else(|e| e.into_inner());
        s.entry(metric.name()).or_default().merge(batch);
    }

    pub fn summaries(&self) -> BTreeMap<&'static str, Summary> {
        self.summaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The configured subject families, in config order.
    pub fn families(&self) -> &[SubjectFamily] {
        &self.families
    }

    /// Index of the family a subject belongs to (first matching rule), if any.
    pub fn family_of(&self, subject: &str) -> Option<usize> {
        self.families.first_match(subject).map(|(i, _)| i)
    }

    /// Counts `n` for `family` (of a message's subject; most belong to none) under `metric`.
    pub fn add_family(&self, family: Option<usize>, metric: FamilyMetric, n: u64) {
        let Some(f) = family else { return };
        self.family_counts[f][metric as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Prepared `labeled_metrics` rows: one per family and metric, never a raw subject.
    pub fn labeled_rows(&self) -> Vec<snapshot::LabeledRow> {
        let mut rows = Vec::new();
        for (f, fam) in self.families.iter().enumerate() {
            for (m, name) in FAMILY_METRICS.iter().enumerate() {
                rows.push(snapshot::LabeledRow {
                    kind: "counter".into(),
                    name: (*name).into(),
                    value: self.family_counts[f][m].load(Ordering::Relaxed) as f64,
                    labels: BTreeMap::from([("subject_family".to_string(), fam.label.clone())]),
                });
            }
        }
        rows
    }
}

/// Seconds since the Unix epoch as f64.
pub fn now_epoch_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_tracks_min_max_last() {
        let mut s = Summary::default();
        for v in [3.0, 1.0, 2.0] {
            s.observe(v);
        }
        assert_eq!(
            s,
            Summary {
                count: 3,
                sum: 6.0,
                min: 1.0,
                max: 3.0,
                last: 2.0
            }
        );
    }

    #[test]
    fn family_rows_never_carry_subjects() {
        let m = Metrics::new(vec![SubjectFamily {
            pattern: SubjectPattern::parse("orders.>").unwrap(),
            label: "orders".into(),
        }]);
        let f = m.family_of("orders.eu.created");
        m.add_family(f, FamilyMetric::Written, 2);
        m.add_family(m.family_of("other.x"), FamilyMetric::Written, 5);
        let rows = m.labeled_rows();
        let written = rows
            .iter()
            .find(|r| r.name == "messages_written_total")
            .unwrap();
        assert_eq!(written.value, 2.0);
        assert_eq!(written.labels["subject_family"], "orders");
        let text = serde_json::to_string(&rows).unwrap();
        assert!(!text.contains("orders.eu"));
    }

    #[test]
    fn every_summary_name_is_observable() {
        let m = Metrics::default();
        for n in SummaryMetric::ALL {
            m.observe(n, 1.0);
        }
        assert!(m.summaries().values().all(|s| s.count == 1));
    }
}
