//! The runner's side of the metrics snapshot: [`capture`] reads the registry into the document
//! the snapshot contract defines (crates/snapshot, `svc-snapshot`, re-exported here under its
//! old paths). The runner's `svc-snapshot` thread (`pipeline/snapshot_writer.rs`) writes it
//! atomically with [`crate::files::atomic::write_atomically`] (mode [`SNAPSHOT_MODE`]).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

pub use svc_snapshot::{
    FamilyEntry, LabeledRow, LaneRow, Snapshot, MAX_CLOCK_SKEW_SECONDS, MAX_COUNTER,
    MAX_SNAPSHOT_BYTES, MAX_VALUE, SCHEMA, SNAPSHOT_MODE,
};

use super::{now_epoch_seconds, Metrics};

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
        let mut snap = capture(&Metrics::default(), "svc", 1.0);
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
        let mut snap = capture(&Metrics::default(), "svc", 1.0);
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
        let snap = capture(&m, "svc", 1.0);
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
        let good = capture(&m, "svc", 1.0);
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
        let mut snap = capture(&m, "svc", now - 100.0);
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
        let mut snap = capture(&m, "svc_namespace", 1_700_000_000.123_456_7);
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
        let mut snap = capture(&m, "svc", 1.0);
        snap.schema = "other".into();
        let text = serde_json::to_string(&snap).unwrap();
        assert!(Snapshot::parse(&text).unwrap_err().contains("schema"));
    }
}
