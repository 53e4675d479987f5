//! The runner's metrics: lock-free counters, small summaries, bounded subject-family rows.
//!
//! Every pipeline thread bumps counters here; `svc-snapshot` reads them and writes the JSON
//! snapshot (see [`snapshot`]). Nothing in this module ever sees a payload, a raw subject
//! outside the family matcher, a path, a table name or a credential.

pub mod snapshot;

// The names and plain data of the snapshot contract (crates/snapshot), under their old paths.
pub use svc_snapshot::{now_epoch_seconds, Counters, Summary, SPOOL_GAUGE_NAMES, SUMMARY_NAMES};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::message::subject::{SubjectPattern, SubjectRule, SubjectRules};

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

#[cfg(test)]
mod tests {
    use super::*;

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
