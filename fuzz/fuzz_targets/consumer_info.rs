//! The broker's consumer-info replies (src/broker/consumer_watch.rs): the JSON that whatever
//! answers on the broker's address sends to `$JS.API.CONSUMER.INFO`, read by `svc-fetch`'s
//! consumer watch, and the pull-request end statuses it reads.
//!
//! Calls `classify_info` (expected filter from the first input byte) on the rest of the input,
//! and `consumer_unavailable` on it as a status line.
//!
//! Properties: no panic; classification is total and agrees with the reply: `Fine` only for
//! JSON without `error` whose `config.filter_subject` is the expected filter, `NotFound` only
//! for `error.err_code` 10014, `FilterChanged` only for a reply with `config` and a filter
//! other than the expected one; every text (the changed filter, the inconclusive reason) is
//! clean and bounded (the filter by `PeerText`: 256 characters, each escaped to at most 10).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use svc::broker::consumer_watch::{classify_info, consumer_unavailable, InfoAnswer};
use svc_fuzz::{assert_clean_display, split_selector, MAX_ERROR_CHARS};

const FILTERS: &[&str] = &["orders.>", "", "a.*.b", "payments.eu.>"];

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let expected = FILTERS[(sel & 3) as usize];
    let status = String::from_utf8_lossy(rest);
    let unavailable = consumer_unavailable(&status);
    if unavailable {
        assert!(status.trim_start().starts_with("503") || status.trim_start().starts_with("409"));
    }
    let answer = classify_info(rest, expected);
    let doc = serde_json::from_slice::<Value>(rest).ok();
    match &answer {
        InfoAnswer::Fine => {
            let doc = doc.expect("Fine: the reply is JSON");
            assert!(doc.get("error").is_none(), "Fine with an error");
            let filter = doc
                .get("config")
                .expect("Fine: the reply has a config")
                .get("filter_subject")
                .and_then(Value::as_str)
                .unwrap_or_default();
            assert_eq!(filter, expected);
        }
        InfoAnswer::NotFound => {
            let doc = doc.expect("NotFound: the reply is JSON");
            assert_eq!(doc["error"]["err_code"].as_u64(), Some(10014));
        }
        InfoAnswer::FilterChanged(filter) => {
            let doc = doc.expect("FilterChanged: the reply is JSON");
            assert!(doc.get("error").is_none() && doc.get("config").is_some());
            let raw = doc["config"]
                .get("filter_subject")
                .and_then(Value::as_str)
                .unwrap_or_default();
            assert_ne!(raw, expected, "FilterChanged to the expected filter");
            // Empty is a possible filter (none); otherwise the text is clean and bounded.
            if !filter.is_empty() {
                assert_clean_display("filter", filter, 256 * 10 + 3);
            }
            // The operator's message quotes it (`check_if_due`).
            let msg = format!(
                "broker: consumer ORDERS/svc now filters subject \"{filter}\" but nats.subject \
                 is \"{expected}\"; stopping"
            );
            assert_clean_display("filter changed", &msg, MAX_ERROR_CHARS);
        }
        InfoAnswer::Inconclusive(why) => {
            assert_clean_display("inconclusive", why, MAX_ERROR_CHARS);
            if let Some(doc) = &doc {
                let not_found = doc
                    .get("error")
                    .is_some_and(|e| e.get("err_code").and_then(Value::as_u64) == Some(10014));
                assert!(!not_found, "10014 is not inconclusive");
                assert!(
                    doc.get("error").is_some() || doc.get("config").is_none(),
                    "a config without error is not inconclusive"
                );
            }
        }
    }
});
