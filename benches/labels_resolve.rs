//! Cost of message metadata + security labels per message, against the envelope
//! normalization it rides on (baseline measured in the same run), and the share of that
//! baseline spent reading the payload strictly. Prints figures only.
//!
//! Run: `cargo bench --bench labels_resolve`.

use std::hint::black_box;
use std::time::Instant;

use svc::message::envelope::{normalize, EnvelopeConfig, RawMessage};
use svc::message::labels::SecurityLabelsConfig;
use svc::message::metadata::MessageMetadataConfig;

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench labels_resolve`"
        );
    }
    // `cargo test --all-targets` runs this unoptimized as a smoke test: keep it short there.
    let n = if cfg!(debug_assertions) {
        2_000
    } else {
        200_000
    };
    let profile = r#"{"owner":"team-a","originator":"billing","releasability":["nato","eu"],
        "handling_caveats":["no-export"],"policy_id":"pol-7","retention_category":"standard",
        "extensions":{"site":"eu-1","ticket":{"id":"T-42","tags":["a","b"]}}}"#;
    let msg = RawMessage {
        published_unix_nanos: Some(1_700_000_000_000_000_000),
        headers: vec![
            ("Svc-Priority".into(), "High".into()),
            ("Svc-Classification".into(), "restricted".into()),
            ("Svc-Labels".into(), "eu,pii,orders".into()),
            ("Svc-Security-Labels".into(), profile.into()),
        ],
        ..RawMessage::sample(
            "orders.eu.created",
            1,
            br#"{"order":42,"amount":"12.30","currency":"EUR","items":[1,2,3]}"#,
        )
    };
    let env_cfg = EnvelopeConfig::default();
    let meta_cfg = MessageMetadataConfig::default();
    let labels = SecurityLabelsConfig {
        enabled: true,
        allowed_classifications: ["restricted".to_string(), "unclassified".to_string()].into(),
        allowed_releasability: ["nato".to_string(), "eu".to_string()].into(),
        ..Default::default()
    };

    let t = Instant::now();
    for i in 0..n {
        black_box(normalize(black_box(&msg), i as i128, &env_cfg));
    }
    let base = t.elapsed();

    let t = Instant::now();
    for _ in 0..n {
        let meta = meta_cfg.resolve(black_box(&msg)).unwrap();
        black_box(labels.resolve(&msg, &meta).unwrap());
    }
    let ours = t.elapsed();

    // Part of the baseline since payloads are read strictly (duplicate keys, long numbers,
    // U+0000): the strict reader alone, on the same payload.
    let payload = std::str::from_utf8(&msg.data).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        black_box(svc::document::canonical::parse(black_box(payload)).is_ok());
    }
    let strict = t.elapsed();

    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!(
        "labels_resolve: {n} messages, {} B profile header",
        profile.len()
    );
    println!(
        "  envelope normalize (baseline)      {:>7.2} us/msg",
        per(base)
    );
    println!(
        "  message_metadata + security_labels {:>7.2} us/msg",
        per(ours)
    );
    println!("  ratio labels/normalize: {:.2}", per(ours) / per(base));
    println!(
        "  strict payload reading, in the baseline {:>7.2} us/msg ({:.0}% of it)",
        per(strict),
        100.0 * per(strict) / per(base)
    );
}
