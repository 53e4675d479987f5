//! Message-metadata headers (`Svc-Priority`, `Svc-Classification`, `Svc-Labels`,
//! src/message/metadata.rs): a publisher controls them.
//!
//! Calls `MessageMetadataConfig::resolve` on a message whose headers come from the input
//! (`name: value` lines; the first byte picks separator, `max_labels` and `on_invalid`).
//! Properties: no panic; a rejection names field and header only (Display clean, no value);
//! accepted values are normalized (`normalize_value` is the identity on them: trimmed,
//! lowercase, within the grammar and 64 bytes), labels sorted, distinct and at most
//! `max_labels`; a field whose header is absent keeps the default.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use svc::message::envelope::RawMessage;
use svc::message::metadata::{normalize_value, MessageMetadataConfig, OnInvalid, MAX_VALUE_BYTES};
use svc_fuzz::{assert_clean_display, split_selector};

fn config(sel: u8) -> MessageMetadataConfig {
    MessageMetadataConfig {
        labels_separator: [',', ';', '|', ' '][(sel & 3) as usize],
        max_labels: [1, 4, 32, 256][((sel >> 2) & 3) as usize],
        on_invalid: if sel & 16 != 0 {
            OnInvalid::UseDefault
        } else {
            OnInvalid::Reject
        },
        ..MessageMetadataConfig::default()
    }
}

fn check_value(v: &str) {
    assert!(
        !v.is_empty() && v.len() <= MAX_VALUE_BYTES,
        "value length {}",
        v.len()
    );
    assert_eq!(
        normalize_value(v).as_deref(),
        Some(v),
        "value not in normal form: {v:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let cfg = config(sel);
    // Header lines; a short name `p`, `c` or `l` stands for the configured header names, so
    // the fuzzer reaches them without guessing the full names.
    let headers: Vec<(String, String)> = text
        .split('\n')
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| {
            let name = match k {
                "p" => cfg.priority_header.clone(),
                "c" => cfg.classification_header.clone(),
                "l" => cfg.labels_header.clone(),
                other => other.to_string(),
            };
            (name, v.to_string())
        })
        .collect();
    let msg = RawMessage {
        stream: Arc::from("ORDERS"),
        consumer: Arc::from("svc"),
        published_unix_nanos: None,
        headers,
        ..RawMessage::sample("orders.created", 1, b"")
    };
    match cfg.resolve(&msg) {
        Ok(meta) => {
            check_value(&meta.priority);
            check_value(&meta.classification);
            for l in &meta.labels {
                check_value(l);
            }
            assert!(
                meta.labels.windows(2).all(|w| w[0] < w[1]),
                "labels sorted and distinct"
            );
            assert!(meta.labels.len() <= cfg.max_labels);
            if msg.header(&cfg.priority_header).is_none() {
                assert_eq!(meta.priority, cfg.default_priority);
            }
            if msg.header(&cfg.classification_header).is_none() {
                assert_eq!(meta.classification, cfg.default_classification);
            }
            if !meta.fell_back.is_empty() {
                assert_eq!(cfg.on_invalid, OnInvalid::UseDefault);
            }
        }
        Err(e) => {
            assert_eq!(cfg.on_invalid, OnInvalid::Reject);
            let shown = e.to_string();
            assert_clean_display("metadata error", &shown, 512);
            assert!(shown.starts_with("message_metadata."));
        }
    }
});
