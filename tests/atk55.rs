//! atk55: attacks on atk54's fixes (a9983ab, 7159d17): the hold's budget and last delivery
//! following the consumer's limits as the watch reads them (`broker::consumer_limits`,
//! `pipeline/gap_hold.rs`), `PutWatch`, `SignedGaps` remembering dead_lettered gaps
//! (`AckWorker::confirmed_before`), the put-begun and none-yet head files.
//!
//! `found_...`: a finding's reproduction; it fails on 7159d17 and says what it expected.
//! `held_...`: an attack that held (these pass). Each prints what it ran and what it saw
//! (`cargo test --test main -- atk55:: --nocapture`).

use std::path::Path;
use std::time::Duration;

use crate::custody_checkpoints::{publish_range, wait_acked, Case};
use crate::support::broker::durable_config;
use crate::support::protection::*;
use crate::support::*;

/// The records of the file sink at `out`, by stream sequence.
fn stored(out: &Path) -> Vec<u64> {
    records(out).keys().copied().collect()
}

/// A file sink with checkpoints (every 100 records), a pre-sink size limit of 20 bytes, a DLQ
/// on stream `DLQ`, a NAK backoff of 100 ms (atk54's `dlq_case`); the durable re-created with
/// `max_ack_pending`.
fn dlq_case(max_ack_pending: i64) -> Case {
    let c = crate::custody_checkpoints::case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            serde_json::json!({"type": "file", "directory": dir.join("out")})
        },
        serde_json::json!({"size_policy": {"enabled": true, "max_payload_bytes": 20},
               "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT,
                               "expected_stream": "DLQ", "publish_timeout_ms": 1000},
               "delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                            "jitter": "none"}}}),
    );
    let mut dlq = crate::support::broker::stream_config("DLQ", &[DLQ_SUBJECT]);
    dlq.duplicate_window = 120_000_000_000;
    c.server.js().add_stream(dlq).unwrap();
    let js = c.server.js();
    js.delete_consumer(STREAM, CONSUMER).unwrap();
    js.add_consumer(
        STREAM,
        durable_config(CONSUMER, "orders.>", Duration::from_secs(30), max_ack_pending),
    )
    .unwrap();
    c
}

/// FOUND (class 5, a consumer setting; severity medium: delivery stalls for as long as the
/// checkpoint store fails, the case the hold's budget exists for). `Hold::budget` is half the
/// consumer's `max_ack_pending`, "at least one" (`gap_hold.rs` `budget`: `(m / 2).max(1)`).
/// With `max_ack_pending` 1 (accepted by the config, 1..=1000000, and by the bind; or set by
/// the broker and followed by the watch since 7159d17) the budget is the consumer's whole
/// limit: "the other half stays for messages that can be delivered" is no half at all. One
/// message given up on while the store fails (a file planted at `.svc-checkpoints`) is held
/// (`held.len() >= budget` is false for the first), then on every redelivery
/// `held.contains(at)` with `held.len() > budget` false (1 > 1) -> `Wait`: it is NAKed for as
/// long as the store fails and fills the consumer, and the good messages published after it
/// are never delivered. Expected: with a failing store the hold never takes the consumer's
/// last slot (fix: budget `(m - 1) / 2`-style, i.e. 0 when `max_ack_pending` is 1, so the
/// message is settled unsigned, counted; or the decision for a held message compares with
/// `>=` when the budget is the whole limit).
#[test]
fn found_max_ack_pending_1_lets_one_held_refusal_stall_delivery_while_the_store_fails() {
    let c = dlq_case(1);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    publish_range(&c.server, 3, 5);
    let mut failed_cuts = 0;
    wait_until(
        Duration::from_secs(120),
        "a good message stored, or 10 failed cuts",
        || {
            failed_cuts = runner.log_text().matches("not written (kept").count();
            stored(&out).iter().any(|s| *s >= 3) || failed_cuts >= 10
        },
    );
    let seen = stored(&out);
    let state = c
        .server
        .try_consumer_state(STREAM, CONSUMER)
        .unwrap_or_default();
    let unsigned = snapshot_counter(
        &c.dir.path().join("metrics.json"),
        "checkpoint_gaps_settled_unsigned_total",
    );
    eprintln!(
        "atk55 max_ack_pending 1: store broken; 1 refusal then 3 good messages: {failed_cuts} \
         failed cuts; records stored {seen:?}; consumer (ack floor, ack pending, pending) \
         {state:?}; settled unsigned {unsigned}"
    );
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    wait_until(Duration::from_secs(60), "everything settled", || {
        c.server.try_consumer_state(STREAM, CONSUMER) == Some((5, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    assert!(
        seen.iter().any(|s| *s >= 3),
        "max_ack_pending 1: the hold's budget (at least one) is the consumer's whole limit; \
         one refusal held while the checkpoint store failed stalled delivery: good messages \
         3..=5, none delivered during {failed_cuts} failed cuts (stored {seen:?}, consumer \
         {state:?})"
    );
}
