//! The mission-metadata header (`Svc-Mission-Metadata`, src/message/mission.rs): one JSON
//! object a publisher chooses, read with the strict reader and checked against a profile.
//!
//! Calls `MissionMetadataConfig::resolve` on a message carrying the input as that header,
//! under one of two configs (the first byte picks): a profile with typed, bounded fields and
//! unknown fields forbidden, or an open profile with unknown fields allowed.
//! Properties: no panic; a refusal names field, text and code (Display clean and bounded) and
//! never quotes the header (a `ZQXJ` marker in the input never appears in it); an accepted
//! object is a JSON object within `max_bytes` in canonical form, and its canonical text reads
//! back to the same object.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use svc::config::RuntimeConfig;
use svc::document::canonical::value_to_string;
use svc::message::envelope::RawMessage;
use svc::message::mission::MissionMetadataConfig;
use svc_fuzz::{assert_clean_display, split_selector, MAX_ERROR_CHARS};

const MARK: &str = "ZQXJ";

fn config(block: Value) -> MissionMetadataConfig {
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
        "sink": {"type": "file", "directory": "/tmp/x"},
        "mission_metadata": block,
    });
    RuntimeConfig::parse(&doc.to_string())
        .expect("a valid fuzz config")
        .mission_metadata
}

fn configs() -> &'static [MissionMetadataConfig; 2] {
    static CONFIGS: OnceLock<[MissionMetadataConfig; 2]> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        [
            config(json!({
                "enabled": true, "max_bytes": 512, "max_depth": 4,
                "profiles": {"sortie.v1": {
                    "required_fields": {
                        "sortie_id": {"type": "string", "min_length": 1, "max_length": 16},
                        "wave": {"type": "integer", "min": 1, "max": 9}},
                    "optional_fields": {
                        "tags": {"type": "array", "max_length": 3},
                        "ratio": {"type": "number", "min": 0, "max": 1},
                        "area": {"type": "object", "max_length": 4},
                        "ok": {"type": "boolean"}},
                    "unknown_fields": "forbid"}},
                "allowed_profiles": ["sortie.v1"]
            })),
            config(json!({
                "enabled": true, "max_bytes": 2048, "max_depth": 8,
                "profiles": {"open.v1": {"unknown_fields": "allow"}}
            })),
        ]
    })
}

fn resolve(cfg: &MissionMetadataConfig, header: &str) -> Result<Option<Value>, String> {
    let msg = RawMessage {
        headers: vec![(cfg.header.clone(), header.to_string())],
        ..RawMessage::sample("o.x", 1, b"{}")
    };
    cfg.resolve(&msg).map_err(|e| e.to_string())
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let Ok(header) = std::str::from_utf8(rest) else {
        return;
    };
    let cfg = &configs()[(sel & 1) as usize];
    match resolve(cfg, header) {
        Ok(None) => panic!("a header present and accepted yields an object"),
        Ok(Some(v)) => {
            assert!(v.is_object(), "accepted a non-object");
            let text = value_to_string(&v);
            assert!(text.len() <= cfg.max_bytes, "canonical size {} over max_bytes", text.len());
            let again = resolve(cfg, &text).expect("its own canonical text is accepted");
            assert_eq!(again, Some(v), "canonical text reads back to the same object");
        }
        Err(shown) => {
            assert_clean_display("mission metadata refusal", &shown, MAX_ERROR_CHARS);
            assert!(!shown.contains(MARK), "the refusal quotes the header: {shown}");
        }
    }
});
