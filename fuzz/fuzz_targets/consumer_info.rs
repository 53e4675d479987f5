//! The broker's consumer-info replies (src/broker/consumer_watch.rs): the JSON that whatever
//! answers on the broker's address sends to `$JS.API.CONSUMER.INFO`, read by `svc-fetch`'s
//! consumer watch, and the pull-request end statuses it reads.
//!
//! Calls `classify_info` (expected filters from the first input byte) on the rest of the
//! input, and `consumer_unavailable` on it as a status line.
//!
//! Properties: no panic; classification is total and agrees with the reply: `Fine` only for
//! JSON without `error` whose `config.filter_subject` and `config.filter_subjects` together are
//! the expected filters (its limits those of the config, each positive or none), `NotFound` only for `error.err_code` 10014, `FilterChanged` only for a
//! reply with `config`; every text (the changed filter, the reason a consumer changed, the
//! inconclusive reason) is clean and bounded (the filter by `PeerText`: 256 characters, each
//! escaped to at most 10).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use svc::broker::consumer_watch::{classify_info, consumer_unavailable, InfoAnswer};
use svc_fuzz::{assert_clean_display, split_selector, MAX_ERROR_CHARS};

const FILTERS: &[&[&str]] = &[&["orders.>"], &[], &["a.*.b"], &["payments.eu.>", "orders.>"]];

/// The filters a consumer config reports, sorted: `filter_subject` (when not empty) and
/// `filter_subjects`.
fn reported(config: &Value) -> Vec<String> {
    let mut all: Vec<String> = config
        .get("filter_subject")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .into_iter()
        .collect();
    if let Some(many) = config.get("filter_subjects").and_then(Value::as_array) {
        all.extend(many.iter().filter_map(Value::as_str).map(str::to_string));
    }
    all.sort();
    all
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let expected: Vec<String> = FILTERS[(sel & 3) as usize]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut wanted = expected.clone();
    wanted.sort();
    let status = String::from_utf8_lossy(rest);
    let unavailable = consumer_unavailable(&status);
    if unavailable {
        assert!(status.trim_start().starts_with("503") || status.trim_start().starts_with("409"));
    }
    let answer = classify_info(rest, &expected);
    let doc = serde_json::from_slice::<Value>(rest).ok();
    match &answer {
        InfoAnswer::Fine(limits) => {
            let doc = doc.expect("Fine: the reply is JSON");
            assert!(doc.get("error").is_none(), "Fine with an error");
            let config = doc.get("config").expect("Fine: the reply has a config");
            assert_eq!(reported(config), wanted);
            for (name, limit) in [
                ("max_ack_pending", limits.max_ack_pending),
                ("max_deliver", limits.max_deliver),
            ] {
                let given = config.get(name).and_then(Value::as_i64).filter(|n| *n > 0);
                assert_eq!(limit, given.map(|n| n as u64), "{name}");
            }
        }
        InfoAnswer::NotFound => {
            let doc = doc.expect("NotFound: the reply is JSON");
            assert_eq!(doc["error"]["err_code"].as_u64(), Some(10014));
        }
        InfoAnswer::FilterChanged(filter) => {
            let doc = doc.expect("FilterChanged: the reply is JSON");
            assert!(doc.get("error").is_none() && doc.get("config").is_some());
            // Empty is a possible filter (none); otherwise the text is clean and bounded.
            if !filter.is_empty() {
                assert_clean_display("filter", filter, 256 * 10 + 3);
            }
            // The operator's message quotes it (`check_if_due`).
            let msg = format!(
                "broker: consumer ORDERS/svc now filters subject \"{filter}\" but nats.subject \
                 is \"{}\"; stopping",
                expected.join(", ")
            );
            assert_clean_display("filter changed", &msg, MAX_ERROR_CHARS);
        }
        InfoAnswer::Changed(why) => {
            let doc = doc.expect("Changed: the reply is JSON");
            assert!(doc.get("error").is_none() && doc.get("config").is_some());
            assert_clean_display("changed", why, MAX_ERROR_CHARS);
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
