//! Runtime config text (`RuntimeConfig::parse`, src/config): the document `svc run` and
//! `svc validate-config` read.
//!
//! Properties: no panic; every problem renders (Display) without control characters and with a
//! field path or a reason; parsing is a function of the JSON value, not of its layout: the
//! same value printed compactly and pretty gives the identical result (the same config, or
//! the same problems in the same order).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::config::RuntimeConfig;
use svc::document::reader::Invalid;
use svc_fuzz::assert_clean_display;

fn check_problems(inv: &Invalid) {
    assert!(
        !inv.0.is_empty(),
        "an invalid config names at least one problem"
    );
    for p in &inv.0 {
        assert_clean_display("config problem", &p.to_string(), usize::MAX);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = RuntimeConfig::parse(text);
    if let Err(inv) = &first {
        check_problems(inv);
    }
    // Layout independence (only for JSON that parses: syntax errors carry positions).
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
        for again in [
            serde_json::to_string(&value).unwrap(),
            serde_json::to_string_pretty(&value).unwrap(),
        ] {
            assert_eq!(
                RuntimeConfig::parse(&again),
                first,
                "layout changed the result"
            );
        }
    }
});
