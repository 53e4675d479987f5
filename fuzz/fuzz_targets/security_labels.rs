//! Security-label header (`Svc-Security-Labels`, src/message/labels.rs): a publisher controls it.
//!
//! Calls `SecurityLabelsConfig::parse_header` and `SecurityLabelsConfig::resolve` (header
//! present) with a config chosen by the first input byte (size limit, vocabularies).
//! Properties: no panic; every rejection renders (Display) without control characters or
//! message content; an accepted profile fits `max_bytes` in canonical form, has the schema set,
//! and round-trips: its canonical JSON parses back (strictly) to the same value and is accepted
//! again unchanged.
#![no_main]

use std::collections::BTreeSet;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use svc::message::envelope::RawMessage;
use svc::message::labels::{
    canonical_json, parse_strict, LabelRejection, SecurityLabelsConfig, MAX_ERRORS, PROFILE_SCHEMA,
    ROOT_FIELDS,
};
use svc::message::metadata::MessageMetadata;
use svc_fuzz::{assert_clean_display, split_selector};

fn config(sel: u8) -> SecurityLabelsConfig {
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let mut cfg = SecurityLabelsConfig {
        enabled: true,
        max_bytes: [64, 512, 8192, 262_144][(sel & 3) as usize],
        ..SecurityLabelsConfig::default()
    };
    if sel & 4 != 0 {
        cfg.allowed_priorities = set(&["low", "normal", "high"]);
        cfg.allowed_classifications = set(&["unclassified", "secret"]);
        cfg.allowed_releasability = set(&["nato", "eu"]);
        cfg.allowed_handling_caveats = set(&["noforn"]);
        cfg.allowed_retention_categories = set(&["short", "long"]);
    }
    cfg
}

/// At most `MAX_ERRORS` problems, each on a field named from the allow-list (never a key or
/// value of the message), the whole text clean.
fn check_rejection(rej: &LabelRejection) {
    assert!(!rej.errors.is_empty() && rej.errors.len() <= MAX_ERRORS);
    for e in &rej.errors {
        let root = e.field.split('[').next().unwrap_or_default();
        assert!(
            root.is_empty() || ROOT_FIELDS.contains(&root),
            "error field {:?} is not an allow-listed name",
            e.field
        );
    }
    assert_clean_display("label rejection", &rej.to_string(), 4096);
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let cfg = config(sel);

    match cfg.parse_header(text) {
        Ok(profile) => {
            let value = Value::Object(profile.fields().clone());
            assert_eq!(
                profile.fields().get("profile"),
                Some(&Value::String(PROFILE_SCHEMA.into()))
            );
            let canonical = canonical_json(&value);
            let back = parse_strict(&canonical).expect("canonical JSON parses strictly");
            assert_eq!(back, value, "canonical JSON round-trips");
            let again = cfg
                .parse_header(&canonical)
                .expect("canonical form accepted");
            assert_eq!(
                again, profile,
                "re-parse of the canonical form is identical"
            );
        }
        Err(rej) => check_rejection(&rej),
    }

    let msg = RawMessage {
        stream: Arc::from("ORDERS"),
        consumer: Arc::from("svc"),
        headers: vec![(cfg.header.clone(), text.to_string())],
        ..RawMessage::sample("orders.created", 1, b"")
    };
    let meta = MessageMetadata {
        priority: "normal".into(),
        classification: "unclassified".into(),
        labels: vec!["pii".into()],
        fell_back: Vec::new(),
    };
    match cfg.resolve(&msg, &meta) {
        Ok(Some(v)) => {
            let canonical = canonical_json(&v);
            assert!(
                canonical.len() <= cfg.max_bytes,
                "resolved profile of {} bytes over max_bytes {}",
                canonical.len(),
                cfg.max_bytes
            );
            assert_eq!(
                serde_json::to_string(&v).unwrap(),
                canonical,
                "sinks write the canonical form"
            );
            for k in ["profile", "priority", "classification", "labels"] {
                assert!(v.get(k).is_some(), "resolved profile lacks {k}");
            }
        }
        Ok(None) => panic!("labels enabled and the header present: a profile or an error"),
        Err(rej) => check_rejection(&rej),
    }
});
