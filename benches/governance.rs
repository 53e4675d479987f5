//! Per-message cost of `svc-normalize` with the three governance stages on (mission metadata
//! with a profile, a pre-sink policy rule, every size bound including the record's bytes),
//! next to the baseline of the same run: the same normalizer with message metadata and
//! security labels alone. The fourth stage, priority lanes, acts in the sink worker: its cost
//! is measured as a batch of 256 split over four lanes into a sink that keeps nothing, next to
//! one `write_batch` of the same batch. Prints figures and the ratio only.
//!
//! Run: `cargo bench --bench governance`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svc::config::lanes::{Lane, PriorityLanes};
use svc::config::RuntimeConfig;
use svc::message::envelope::Envelope;
use svc::message::envelope::RawMessage;
use svc::message::protection::Protection;
use svc::metrics::{Metrics, Summary};
use svc::pipeline::{write_by_lane, Normalizer};
use svc::sink::{Sink, SinkError, WriteOutcome};

/// Takes every batch and keeps nothing: what is left is the caller's own cost.
struct Discard;

impl Sink for Discard {
    fn kind(&self) -> &'static str {
        "discard"
    }
    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        black_box(batch);
        vec![WriteOutcome::Durable; batch.len()]
    }
    fn check(&self) -> Result<String, SinkError> {
        Ok(String::new())
    }
}

/// Time of handing `rounds` batches to `Discard`, split by lane or in one call.
fn hand_off(rounds: usize, batch: &mut Vec<Envelope>, lanes: Option<&PriorityLanes>) -> Duration {
    let metrics =
        Metrics::default().with_lanes(vec!["a".into(), "b".into(), "c".into(), "d".into()]);
    let start = Instant::now();
    for _ in 0..rounds {
        let outcomes = match lanes {
            Some(l) => write_by_lane(&Discard, l, batch, &metrics),
            None => Discard.write_batch(batch),
        };
        black_box(outcomes);
    }
    start.elapsed()
}

fn config(extra: Value) -> RuntimeConfig {
    let mut doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                 "subject": "orders.>"},
        "sink": {"type": "file", "directory": "/nonexistent"},
        "security_labels": {"enabled": true,
                            "allowed_classifications": ["restricted", "unclassified"],
                            "allowed_releasability": ["nato", "eu"]}
    });
    for (k, v) in extra.as_object().unwrap() {
        doc[k] = v.clone();
    }
    RuntimeConfig::parse(&doc.to_string()).expect("a valid bench config")
}

fn normalizer(cfg: &RuntimeConfig) -> Normalizer {
    let p = Protection::load(&cfg.payload_encryption, &cfg.authenticity, &cfg.custody)
        .expect("no keys to load");
    Normalizer::new(cfg, Arc::new(p), Arc::new(Metrics::default()))
}

/// Time of `n` `prepare` calls (every one must pass).
fn run(n: usize, normalizer: &Normalizer, msg: &RawMessage) -> Duration {
    let mut ages = Summary::default();
    let t = Instant::now();
    for i in 0..n {
        let p = normalizer.prepare(black_box(msg), i as i128, None, &mut ages);
        assert!(p.is_ok(), "the bench message must pass");
        black_box(p.ok());
    }
    t.elapsed()
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its figures are not
    // measurements.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench governance`"
        );
    }
    let n = if cfg!(debug_assertions) {
        2_000
    } else {
        200_000
    };
    let profile = r#"{"owner":"team-a","releasability":["nato","eu"],"policy_id":"pol-7"}"#;
    let mission = r#"{"profile":"sortie.v1","sortie_id":"S-2026-0042","wave":3,
        "notes":"resupply","area":{"grid":"32U","cells":[4,5,6]}}"#;
    let msg = RawMessage {
        stream_incarnation: Default::default(),
        subject: "orders.eu.created".into(),
        stream: "ORDERS".into(),
        consumer: "svc".into(),
        stream_sequence: 1,
        consumer_sequence: 1,
        delivery_count: 1,
        published_unix_nanos: Some(1_700_000_000_000_000_000),
        headers: vec![
            ("Svc-Priority".into(), "high".into()),
            ("Svc-Classification".into(), "restricted".into()),
            ("Svc-Labels".into(), "eu,pii,orders".into()),
            ("Svc-Security-Labels".into(), profile.into()),
            ("Svc-Mission-Metadata".into(), mission.into()),
        ],
        data: br#"{"order":42,"amount":"12.30","currency":"EUR","items":[1,2,3]}"#.to_vec(),
        unreadable: None,
        header_block: Default::default(),
    };
    let labels_only = normalizer(&config(json!({})));
    let governed = normalizer(&config(json!({
        "mission_metadata": {
            "enabled": true,
            "profiles": {"sortie.v1": {
                "required_fields": {"sortie_id": {"type": "string", "max_length": 32},
                                    "wave": {"type": "integer", "min": 1, "max": 9}},
                "optional_fields": {"notes": {"type": "string", "max_length": 200},
                                    "area": {"type": "object", "max_length": 8}}}},
            "allowed_profiles": ["sortie.v1"]
        },
        "pre_sink_policy": {"enabled": true, "rules": [
            {"subject": "orders.eu.>", "require_classification": ["restricted"],
             "required_labels": ["eu"], "require_mission_metadata": true,
             "max_payload_bytes": 65536,
             "allowed_mission_metadata_keys": ["profile", "sortie_id", "wave", "notes", "area"]}
        ]},
        "size_policy": {"enabled": true, "max_payload_bytes": 65536, "max_header_count": 32,
                        "max_header_name_bytes": 64, "max_header_value_bytes": 4096,
                        "max_total_header_bytes": 16384, "max_label_count": 16,
                        "max_label_bytes": 512, "max_mission_metadata_bytes": 4096,
                        "max_record_bytes": 65536}
    })));

    // Warm up both, then alternate so drift hits both alike.
    run(n / 10, &labels_only, &msg);
    run(n / 10, &governed, &msg);
    let (mut base, mut ours) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..2 {
        base += run(n / 2, &labels_only, &msg);
        ours += run(n / 2, &governed, &msg);
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!(
        "governance: {n} messages, {} B mission metadata header, {} B profile header",
        mission.len(),
        profile.len()
    );
    println!(
        "  normalize with metadata + security labels (baseline) {:>7.2} us/msg",
        per(base)
    );
    println!(
        "  the same + mission metadata, pre-sink and size policy {:>7.2} us/msg",
        per(ours)
    );
    println!(
        "  added by the three stages {:>7.2} us/msg; ratio all/labels: {:.2}",
        per(ours) - per(base),
        per(ours) / per(base)
    );

    // Priority lanes: one envelope per priority, four lanes, a batch of 256.
    let envelope = match labels_only.prepare(&msg, 1, None, &mut Summary::default()) {
        Ok(p) => p.envelope,
        Err(_) => panic!("the bench message must pass"),
    };
    let priorities = ["flash", "immediate", "priority", "routine"];
    let mut batch: Vec<Envelope> = (0..256)
        .map(|i| {
            let mut e = envelope.clone();
            e.priority = priorities[i % 4].to_string();
            e
        })
        .collect();
    let lanes = PriorityLanes {
        lanes: priorities
            .iter()
            .map(|p| Lane {
                name: p.to_string(),
                priorities: vec![p.to_string()],
            })
            .collect(),
        default_lane: 3,
    };
    let rounds = n / 256;
    hand_off(rounds / 10, &mut batch, Some(&lanes));
    let (mut one, mut split) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..2 {
        one += hand_off(rounds / 2, &mut batch, None);
        split += hand_off(rounds / 2, &mut batch, Some(&lanes));
    }
    let lane_cost = per(split) - per(one);
    println!(
        "  priority lanes (4 lanes, batch of 256, into a sink keeping nothing): {lane_cost:>7.2} \
         us/msg over one write_batch"
    );
    println!(
        "  all four stages {:>7.2} us/msg; ratio all four/labels: {:.2}",
        per(ours) + lane_cost,
        (per(ours) + lane_cost) / per(base)
    );
}
