//! The metrics snapshot: the only thing the runner shares with the exporters.
//!
//! Schema `svc.metrics.snapshot.v1` (documented in `docs/metrics-snapshot.md`). Written
//! atomically with [`crate::files::atomic::write_atomically`] (mode [`SNAPSHOT_MODE`]), so a
//! reader sees either the previous snapshot or the new one, never a torn file.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{now_epoch_seconds, Metrics, Summary};
use crate::text::peer::PeerText;

pub const SCHEMA: &str = "svc.metrics.snapshot.v1";

/// Largest snapshot file an exporter reads. The largest snapshot the runner can write (100
/// subject families with 512-byte patterns and 64-byte labels, every value at its widest,
/// pretty-printed) is about 180 KiB (`largest_snapshot_fits_the_read_cap` below): the cap
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
    /// Reads the registry into a snapshot document.
    pub fn capture(metrics: &Metrics, namespace: &str, started_at: f64) -> Snapshot {
        let counters = metrics
            .counters
            .values()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let mut gauges = BTreeMap::from([(
            "last_sink_success_epoch_seconds".to_string(),
            metrics
                .gauges
                .last_sink_success_epoch_seconds
                .load(std::sync::atomic::Ordering::Relaxed) as f64,
        )]);
        for (name, v) in metrics.gauges.spool_values() {
            gauges.insert(name.to_string(), v as f64);
        }
        let summaries = metrics
            .summaries()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        Snapshot {
            schema: SCHEMA.to_string(),
            namespace: namespace.to_string(),
            generated_at_epoch_seconds: now_epoch_seconds(),
            started_at_epoch_seconds: started_at,
            counters,
            gauges,
            summaries,
            labeled_metrics: metrics.labeled_rows(),
            subject_families: metrics
                .families()
                .iter()
                .map(|f| FamilyEntry {
                    label: f.label.clone(),
                    subject: f.pattern.as_str().to_string(),
                })
                .collect(),
            priority_lanes: metrics
                .lanes()
                .map(|(lane, c)| LaneRow {
                    lane: lane.to_string(),
                    messages_total: c.messages_total.load(Ordering::Relaxed),
                    messages_written_total: c.messages_written_total.load(Ordering::Relaxed),
                    sink_writes_total: c.sink_writes_total.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::atomic::write_atomically;
    use std::fs;
    use std::io;
    use std::sync::atomic::Ordering;

    /// Found by `fuzz/fuzz_targets/metrics_snapshot.rs`: without serde_json's
    /// `float_roundtrip`, 1.718000000477778e69 read back one ULP off what was written.
    #[test]
    fn floats_read_back_exactly() {
        let mut snap = Snapshot::capture(&Metrics::default(), "svc", 1.0);
        for v in [
            1.718000000477778e69,
            0.1 + 0.2,
            1717999999.123456,
            5e-324,
            f64::MAX,
        ] {
            snap.generated_at_epoch_seconds = v;
            let text = serde_json::to_string(&snap).unwrap();
            let back = Snapshot::parse(&text).unwrap();
            assert_eq!(
                back.generated_at_epoch_seconds.to_bits(),
                v.to_bits(),
                "{v:e}"
            );
        }
    }

    /// Found by `fuzz/fuzz_targets/metrics_snapshot.rs`: serde_json's message quotes an
    /// unknown key of the file, and the schema was shown with Debug (bidi controls pass).
    #[test]
    fn refusals_escape_the_files_text() {
        let e = Snapshot::parse(r#"{"schema":"x","x\n y\u202e":1}"#).unwrap_err();
        assert!(e.contains("unknown field `x\\n y\\u{202e}`"), "{e}");
        assert!(!e.chars().any(char::is_control), "{e}");
        let mut snap = Snapshot::capture(&Metrics::default(), "svc", 1.0);
        snap.schema = "v\u{202e}1\n".into();
        let e = Snapshot::parse(&serde_json::to_string(&snap).unwrap()).unwrap_err();
        assert_eq!(
            e,
            "snapshot schema must be svc.metrics.snapshot.v1, found \"v\\u{202e}1\\n\""
        );
    }

    #[test]
    fn round_trips_and_writes_atomically() {
        let m = Metrics::default();
        m.counters.messages_acked_total.store(7, Ordering::Relaxed);
        m.observe(crate::metrics::SummaryMetric::SinkBatchWrite, 0.5);
        let snap = Snapshot::capture(&m, "svc", 1.0);
        let text = serde_json::to_string_pretty(&snap).unwrap();
        let back = Snapshot::parse(&text).unwrap();
        assert_eq!(back.counters["messages_acked_total"], 7);
        assert_eq!(back.summaries["sink_batch_write_seconds"].count, 1);
        assert!(!text.contains("labeled_metrics"));

        let dir = std::env::temp_dir().join(format!("svc-snap-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.json");
        write_atomically(&path, text.as_bytes(), SNAPSHOT_MODE).unwrap();
        write_atomically(&path, text.as_bytes(), SNAPSHOT_MODE).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "no temp file left");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The end state alone cannot tell an atomic write from a torn one: a reader polls the file
    /// while it is rewritten and must only ever see one whole version or the other (or no file
    /// before the first write). A plain truncate-and-write (`fs::write`) fails this.
    #[test]
    fn a_concurrent_reader_never_sees_a_torn_file() {
        use std::sync::atomic::AtomicBool;
        let dir = std::env::temp_dir().join(format!("svc-snap-torn-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.json");
        // Two versions of different lengths and contents, large enough to need several writes.
        let a = vec![b'a'; 300 * 1024];
        let b = vec![b'b'; 700 * 1024];
        let done = AtomicBool::new(false);
        let (reads, whole) = std::thread::scope(|sc| {
            let reader = std::thread::Builder::new()
                .name("snapshot-reader".into())
                .spawn_scoped(sc, || {
                    let (mut reads, mut whole) = (0u64, 0u64);
                    while !done.load(Ordering::Acquire) {
                        reads += 1;
                        match fs::read(&path) {
                            Ok(bytes) => {
                                assert!(
                                    bytes == a || bytes == b,
                                    "torn file seen: {} bytes",
                                    bytes.len()
                                );
                                whole += 1;
                            }
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => panic!("read: {e}"),
                        }
                        // Only the final name and the writer's dot-named temp file may exist.
                        for entry in fs::read_dir(&dir).unwrap() {
                            let name = entry.unwrap().file_name().into_string().unwrap();
                            assert!(name == "metrics.json" || name.starts_with('.'), "{name}");
                        }
                    }
                    (reads, whole)
                })
                .unwrap();
            for i in 0..60 {
                write_atomically(&path, if i % 2 == 0 { &a } else { &b }, SNAPSHOT_MODE).unwrap();
                // Let the reader in between writes even on a loaded machine.
                std::thread::yield_now();
            }
            done.store(true, Ordering::Release);
            reader.join().unwrap()
        });
        // Positive control: the reader really read whole files while the writes went on.
        assert!(whole > 0 && reads >= whole, "reads {reads}, whole {whole}");
        assert_eq!(fs::read(&path).unwrap(), b, "last write wins");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "no temp file left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn absurd_values_are_refused() {
        let m = Metrics::default();
        m.observe(crate::metrics::SummaryMetric::SinkBatchWrite, 0.5);
        let good = Snapshot::capture(&m, "svc", 1.0);
        assert_eq!(good.check_values(), Ok(()));
        let mut snap = good.clone();
        snap.gauges
            .insert("last_sink_success_epoch_seconds".into(), 1e308);
        let e = snap.check_values().unwrap_err();
        assert!(
            e.starts_with("gauge last_sink_success_epoch_seconds is 1"),
            "{e}"
        );
        let mut snap = good.clone();
        snap.counters
            .insert("messages_acked_total".into(), u64::MAX);
        assert!(snap.check_values().is_err());
        let mut snap = good.clone();
        snap.summaries
            .get_mut("sink_batch_write_seconds")
            .unwrap()
            .max = -1e300;
        assert!(snap.check_values().is_err());
        let text = serde_json::to_string(&good)
            .unwrap()
            .replace("\"messages_acked_total\":0", "\"messages_acked_total\":-1");
        assert!(Snapshot::parse(&text).is_err(), "a negative counter parses");
    }

    #[test]
    fn timestamps_are_checked() {
        let m = Metrics::default();
        let now = 1_800_000_000.0;
        let mut snap = Snapshot::capture(&m, "svc", now - 100.0);
        snap.generated_at_epoch_seconds = now;
        assert_eq!(snap.check_times(now), Ok(()));
        // Within the skew allowance, then beyond it.
        snap.generated_at_epoch_seconds = now + MAX_CLOCK_SKEW_SECONDS;
        assert_eq!(snap.check_times(now), Ok(()));
        snap.generated_at_epoch_seconds = now + MAX_CLOCK_SKEW_SECONDS + 0.5;
        assert!(snap.check_times(now).unwrap_err().contains("in the future"));
        snap.generated_at_epoch_seconds = now + 86400.0 * 365.0;
        assert!(snap.check_times(now).unwrap_err().contains("in the future"));
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            snap.generated_at_epoch_seconds = bad;
            assert!(snap
                .check_times(now)
                .unwrap_err()
                .contains("generated_at_epoch_seconds must be"));
        }
        snap.generated_at_epoch_seconds = now;
        snap.started_at_epoch_seconds = now + 1.0;
        assert!(snap.check_times(now).unwrap_err().contains("is after"));
        snap.started_at_epoch_seconds = -5.0;
        assert!(snap.check_times(now).unwrap_err().contains("started_at"));
    }

    /// The largest snapshot the runner can produce stays well under the exporters' read cap.
    #[test]
    fn largest_snapshot_fits_the_read_cap() {
        use crate::message::subject::{SubjectPattern, MAX_SUBJECT_BYTES};
        use crate::metrics::SubjectFamily;
        let families: Vec<SubjectFamily> = (0..100)
            .map(|i| {
                let mut p = format!("f{i:03}.");
                while p.len() + 3 < MAX_SUBJECT_BYTES {
                    p.push_str("ab.");
                }
                p.push('>');
                SubjectFamily {
                    pattern: SubjectPattern::parse(&p).unwrap(),
                    label: format!("l{i:03}{}", "x".repeat(60)),
                }
            })
            .collect();
        let m = Metrics::new(families);
        for (i, _) in m.families().iter().enumerate() {
            for metric in crate::metrics::FamilyMetric::ALL {
                m.add_family(Some(i), metric, u64::MAX / 3);
            }
        }
        for n in crate::metrics::SummaryMetric::ALL {
            m.observe(n, 1.0e300 / 3.0);
        }
        let mut snap = Snapshot::capture(&m, "svc_namespace", 1_700_000_000.123_456_7);
        snap.counters.values_mut().for_each(|v| *v = u64::MAX);
        let bytes = serde_json::to_vec_pretty(&snap).unwrap().len() as u64;
        assert!(bytes * 5 < MAX_SNAPSHOT_BYTES, "{bytes} bytes");
        assert!(
            bytes > 100_000,
            "{bytes} bytes: the test no longer builds the worst case"
        );
    }

    #[test]
    fn rejects_other_schemas() {
        let m = Metrics::default();
        let mut snap = Snapshot::capture(&m, "svc", 1.0);
        snap.schema = "other".into();
        let text = serde_json::to_string(&snap).unwrap();
        assert!(Snapshot::parse(&text).unwrap_err().contains("schema"));
    }
}
