//! The metrics snapshot: the only thing the runner shares with the exporters, and the contract
//! between the two programs (svc writes it, svc-observe reads it; neither links the other's
//! code for it).
//!
//! Schema `svc.metrics.snapshot.v1` (documented in `docs/metrics-snapshot.md`). The runner
//! writes it atomically (`svc_files::atomic::write_atomically`, mode [`SNAPSHOT_MODE`]), so a
//! reader sees either the previous snapshot or the new one, never a torn file.
//!
//! - this module: the document, its bounds and the checks a reader applies;
//! - [`names`]: every counter, summary and spool gauge name the runner writes.

pub mod names;

pub use names::{Counters, SPOOL_GAUGE_NAMES, SUMMARY_NAMES};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use svc_text::peer::PeerText;

pub const SCHEMA: &str = "svc.metrics.snapshot.v1";

/// Largest snapshot file an exporter reads. The largest snapshot the runner can write (100
/// subject families with 512-byte patterns and 64-byte labels, every value at its widest,
/// pretty-printed) is about 180 KiB (`largest_snapshot_fits_the_read_cap` in svc's `metrics::snapshot`): the cap
/// leaves more than 5x room and bounds what a replaced or corrupted file costs per scrape.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 20;

/// How far `generated_at_epoch_seconds` may lie in the future of the exporter's clock. The
/// runner and the exporters share a host (and so a clock): the allowance covers a clock
/// stepped back by NTP between a write and a read, not hosts with different clocks. A
/// snapshot dated further ahead would never go stale, so it is invalid.
pub const MAX_CLOCK_SKEW_SECONDS: f64 = 5.0;

/// Largest counter value a snapshot may hold: 2^53, the largest up to which every integer is
/// exact in a double (the runner would need centuries at a million messages per second).
pub const MAX_COUNTER: u64 = 1 << 53;

/// Largest magnitude of a gauge, summary field or labelled value (seconds, bytes, epoch
/// times: all far below).
pub const MAX_VALUE: f64 = 1e15;

/// A prepared, reviewed, low-cardinality row (spec "Metrics snapshot").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabeledRow {
    pub kind: String,
    pub name: String,
    pub value: f64,
    pub labels: BTreeMap<String, String>,
}

/// A configured subject family: its reviewed label and its reviewed subject pattern (runtime
/// config `metrics.subject_families`). Exporters match `subject_metrics` rules against the
/// pattern; it is configuration, never a subject seen on a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyEntry {
    pub label: String,
    pub subject: String,
}

/// The snapshot document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    pub schema: String,
    /// Metric-name prefix configured on the runner (`metrics.namespace`).
    pub namespace: String,
    /// When this snapshot was generated; exporters use it for staleness.
    pub generated_at_epoch_seconds: f64,
    /// When the runner process started.
    pub started_at_epoch_seconds: f64,
    /// Counter suffix -> value.
    pub counters: BTreeMap<String, u64>,
    /// Gauge suffix -> value.
    pub gauges: BTreeMap<String, f64>,
    /// Summary suffix -> count/sum/min/max/last.
    pub summaries: BTreeMap<String, Summary>,
    /// Prepared subject-family rows; absent when no families are configured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labeled_metrics: Vec<LabeledRow>,
    /// The family catalogue behind `labeled_metrics` (label -> subject pattern), in config
    /// order; absent when no families are configured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_families: Vec<FamilyEntry>,
    /// One row per priority lane (`delivery.priority_lanes`), in hand-off order; absent
    /// without lanes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub priority_lanes: Vec<LaneRow>,
}

/// The counters of one priority lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneRow {
    /// The lane's configured name (a reviewed label).
    pub lane: String,
    pub messages_total: u64,
    pub messages_written_total: u64,
    pub sink_writes_total: u64,
}

impl Snapshot {
    /// Parses a snapshot, checking its schema identifier.
    pub fn parse(text: &str) -> Result<Snapshot, String> {
        // serde_json's message quotes unknown keys: the file's text, bounded and escaped.
        let snap: Snapshot = serde_json::from_str(text)
            .map_err(|e| format!("snapshot is not valid: {}", PeerText::new(&e.to_string())))?;
        if snap.schema != SCHEMA {
            return Err(format!(
                "snapshot schema must be {SCHEMA}, found \"{}\"",
                PeerText::new(&snap.schema)
            ));
        }
        Ok(snap)
    }

    /// Checks the timestamps against `now` (Unix seconds): both finite and not negative, the
    /// start not after the generation, the generation at most [`MAX_CLOCK_SKEW_SECONDS`]
    /// ahead of `now`.
    pub fn check_times(&self, now: f64) -> Result<(), String> {
        let (generated, started) = (
            self.generated_at_epoch_seconds,
            self.started_at_epoch_seconds,
        );
        for (name, v) in [
            ("generated_at_epoch_seconds", generated),
            ("started_at_epoch_seconds", started),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!(
                    "{name} must be a non-negative number of seconds, found {v}"
                ));
            }
        }
        if started > generated {
            return Err(format!(
                "started_at_epoch_seconds {started} is after generated_at_epoch_seconds {generated}"
            ));
        }
        if generated > now + MAX_CLOCK_SKEW_SECONDS {
            return Err(format!(
                "generated_at_epoch_seconds {generated} is {:.0} s in the future (allowed clock skew: {MAX_CLOCK_SKEW_SECONDS} s)",
                generated - now
            ));
        }
        Ok(())
    }

    /// Checks every value: counters at most [`MAX_COUNTER`] (exact in a double, which is how
    /// every exporter prints them), gauges, summary fields and labelled values finite and at
    /// most [`MAX_VALUE`] in magnitude. (Negative counters and non-finite numbers cannot even
    /// be parsed.) A snapshot another account forged must not export `1e308` as a
    /// 309-digit number.
    pub fn check_values(&self) -> Result<(), String> {
        let bad = |what: &str, name: &str, v: String| {
            Err(format!(
                "{what} {} is {v}, outside the plausible range",
                PeerText::new(name)
            ))
        };
        for (name, v) in &self.counters {
            if *v > MAX_COUNTER {
                return bad("counter", name, v.to_string());
            }
        }
        let plausible = |v: f64| v.is_finite() && v.abs() <= MAX_VALUE;
        for (name, v) in &self.gauges {
            if !plausible(*v) {
                return bad("gauge", name, v.to_string());
            }
        }
        for (name, s) in &self.summaries {
            if s.count > MAX_COUNTER {
                return bad("summary count", name, s.count.to_string());
            }
            for v in [s.sum, s.min, s.max, s.last] {
                if !plausible(v) {
                    return bad("summary", name, v.to_string());
                }
            }
        }
        for row in &self.labeled_metrics {
            if !plausible(row.value) || (row.kind == "counter" && row.value < 0.0) {
                return bad("labelled metric", &row.name, row.value.to_string());
            }
        }
        Ok(())
    }

    /// Age in seconds relative to now (negative ages count as 0).
    pub fn age_seconds(&self) -> f64 {
        (now_epoch_seconds() - self.generated_at_epoch_seconds).max(0.0)
    }
}

/// Mode of the snapshot file: the runner's user writes it, its group (the exporter's user is
/// in the runner's group in the packages) reads it, nobody else does. Set exactly, whatever
/// the umask.
pub const SNAPSHOT_MODE: u32 = 0o640;

/// Count, sum, min, max and last of an observed quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
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
}
