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

use crate::atk50b::{out, wait_until_either};
use crate::custody_checkpoints::{publish_range, wait_acked, Case};
use crate::support::broker::durable_config;
use crate::support::protection::*;
use crate::support::*;

/// The records of the file sink at `out`, by stream sequence.
pub(crate) fn stored(out: &Path) -> Vec<u64> {
    records(out).keys().copied().collect()
}

/// A file sink with checkpoints (every 100 records), a pre-sink size limit of 20 bytes, a DLQ
/// on stream `DLQ`, a NAK backoff of 100 ms (atk54's `dlq_case`); the durable re-created with
/// `max_ack_pending`.
pub(crate) fn dlq_case(max_ack_pending: i64) -> Case {
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
        durable_config(
            CONSUMER,
            "orders.>",
            Duration::from_secs(30),
            max_ack_pending,
        ),
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
///
/// Fixed: the budget is half the limit, none for a limit of 1 (`Hold::budget`): the one held
/// refusal goes (settled unsigned, counted) while the store fails.
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

/// The target's checkpoint store out of reach (a plain file at its directory's name); as
/// atk54's.
fn target_unreadable(c: &Case) {
    let store = out(c).join(".svc-checkpoints");
    let aside = c.dir.path().join("checkpoints-aside");
    if store.exists() {
        std::fs::rename(&store, &aside).unwrap();
    } else {
        std::fs::create_dir(&aside).unwrap();
    }
    std::fs::write(&store, b"not a directory").unwrap();
}

/// The target's checkpoint store given back.
fn target_readable(c: &Case) {
    let store = out(c).join(".svc-checkpoints");
    std::fs::remove_file(&store).unwrap();
    std::fs::rename(c.dir.path().join("checkpoints-aside"), &store).unwrap();
}

fn head_file(c: &Case) -> std::path::PathBuf {
    c.dir.path().join("c.json.custody-head")
}

fn refusal(log: &str) -> String {
    log.lines()
        .filter(|l| l.contains("custody checkpoints"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// An edge spool (atk50b's, a checkpoint every 3 records): first start (the none-yet head
/// file written, kept as an operator's backup), records 1..=3 (checkpoint 0 cut), drained to
/// the target; the head file restored from the backup, the spool's drained-head file removed
/// when `remove_drained` (what a drain by a version before drained heads leaves: `DrainedHead::
/// None`), the target down; a start. Returns (started, what the drain and the audit said then).
fn restored_none_yet_backup(c: &Case, remove_drained: bool) -> (bool, String) {
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc1.log"));
    assert!(wait_until_either(&mut runner), "first start");
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let backup = std::fs::read(head_file(c)).unwrap();
    assert!(
        String::from_utf8_lossy(&backup).contains("\"index\":0,\"digest\":\"\""),
        "not a none-yet head"
    );
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    publish_range(&c.server, 1, 3);
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = crate::atk50b::spool_cmd(c, "drain");
    assert_eq!(code, 0, "{text}");
    std::fs::write(head_file(c), &backup).unwrap();
    if remove_drained {
        let spool = c.dir.path().join("spool");
        let mut removed = 0;
        for e in std::fs::read_dir(&spool).unwrap() {
            let p = e.unwrap().path();
            if p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("drained-head-")
            {
                std::fs::remove_file(p).unwrap();
                removed += 1;
            }
        }
        assert_eq!(removed, 1, "no drained head recorded by the drain");
    }
    target_unreadable(c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc3.log"));
    let started = wait_until_either(&mut runner);
    let mut after = String::new();
    if started {
        publish_range(&c.server, 4, 6);
        wait_acked(&c.server, 6);
        runner.signal("TERM");
        assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
        target_readable(c);
        let (code, text) = crate::atk50b::spool_cmd(c, "drain");
        let (vcode, vtext) = crate::custody_checkpoints::verify(c, &[c.public.to_str().unwrap()]);
        after = format!(
            "drain exit {code}: {}; verify-custody exit {vcode}: {}",
            text.lines().last().unwrap_or_default(),
            vtext
                .lines()
                .filter(|l| l.contains("FORK")
                    || l.contains("checkpoints (")
                    || l.contains("COMPLETE"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    eprintln!(
        "atk55 restored none-yet backup (drained head removed: {remove_drained}): started \
         {started}; {}; {after}",
        refusal(&runner.log_text())
    );
    (started, after)
}

/// HELD (class 11, an operator's restored backup). The head file put back from a backup taken
/// at the first start (none-yet, index 0) after checkpoint 0 was cut and drained, the target
/// down: the drained head (vouched) becomes the chain read back, and the none-yet head with a
/// suffix of checkpoint 0 alone extends it; the start goes on from checkpoint 0 and the next
/// checkpoint is 1: the drain puts it and the audit finds no fork.
#[test]
fn held_a_restored_none_yet_head_backup_beside_a_drained_head_continues_the_chain() {
    let c = crate::atk50b::edge(3);
    let (started, after) = restored_none_yet_backup(&c, false);
    assert!(started, "the start refused");
    assert!(
        !after.contains("FORK") && after.contains("verify-custody exit 0"),
        "a restored none-yet head beside a drained head forked or broke the chain: {after}"
    );
}

// One finding stays open, its reproduction kept in commit f99d4e1 (not in the suite: it fails
// until fixed; docs/payload-protection.md names it):
// - found_a_restored_none_yet_head_backup_and_no_drained_head_fork_the_chain_at_checkpoint_0
//   (low): a head file restored from a backup taken at the first start (none-yet) after
//   checkpoint 0 was cut and drained, with no drained head (removed, or a drain by an older
//   version) and the target down: the start signs a second checkpoint 0. The audit names the
//   fork (FORKED), so nothing is hidden; two files put back or removed by hand are needed.

/// FOUND, fixed (class 5 with class 12, a consumer setting and two views; medium-low: a
/// message stored nowhere, listed nowhere, and `svc verify-custody` said COMPLETE; the
/// broker's MAX_DELIVERIES advisory, counted, was the only trace). A `retry` rejection (here
/// the encryption key at its message bound; any transient failure alike) on the consumer's
/// last delivery was simply NAKed: the broker delivers it no more, and the runner told no
/// gap. Here the key bound is 1 message, the consumer's `max_deliver` 3: message 2 is refused
/// on deliveries 1..=3 and dropped by the broker (ack floor stays 1, nothing pending). Now
/// `svc-ack` tells its gap (`abandoned_at_max_deliver`) when it NAKs the last delivery, and the
/// next checkpoint lists it (failed on f3b6ae0: "gaps []").
#[test]
fn found_a_message_nakked_on_the_consumers_last_delivery_is_dropped_and_the_audit_says_complete() {
    let key = tempfile::tempdir().unwrap();
    let k1 = write_private(key.path(), "k1.key", &AES_K1);
    let c = crate::custody_checkpoints::case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            serde_json::json!({"type": "file", "directory": dir.join("out")})
        },
        serde_json::json!({"payload_encryption": {"enabled": true,
                               "keys": [{"key_id": "k1", "key_file": k1}],
                               "active_key_id": "k1", "max_messages_per_key": 1,
                               "default": "encrypt"},
               "delivery": last_delivery_pace()}),
    );
    max_deliver_3(&c);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 2);
    let gaps = abandoned_gap_of_2(&c, &out, &mut runner);
    let seen = stored(&out);
    assert_eq!(seen, vec![1], "only message 1 fits under the key's bound");
    assert_eq!(
        gaps,
        vec![(2, "abandoned_at_max_deliver".to_string())],
        "message 2 (refused at the encryption key's bound, a retry) was NAKed on the \
         consumer's last delivery (max_deliver 3) and dropped by the broker: its gap must be \
         listed"
    );
}

/// FOUND with the one above, fixed the same way (a transient *sink* failure, the same hole:
/// the sink's verdict carried no place for a gap). The file sink's records' directory
/// replaced by a file after message 1: message 2 fails transiently on every delivery, the
/// broker drops it after the consumer's third; the checkpoint store still works and lists
/// it as `abandoned_at_max_deliver`; the audit counts it as a runner-caused gap, exit 0.
#[test]
fn a_transient_sink_failure_on_the_consumers_last_delivery_is_listed_as_a_gap() {
    let c = crate::custody_checkpoints::case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            serde_json::json!({"type": "file", "directory": dir.join("out")})
        },
        serde_json::json!({"delivery": last_delivery_pace()}),
    );
    max_deliver_3(&c);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let away = crate::atk47e::block_records(&out);
    publish_range(&c.server, 2, 2);
    let gaps = abandoned_gap_of_2(&c, &out, &mut runner);
    crate::atk47e::unblock_records(&out, &away);
    assert_eq!(stored(&out), vec![1]);
    assert_eq!(gaps, vec![(2, "abandoned_at_max_deliver".to_string())]);
    let (vcode, vtext) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(vcode, 0, "{vtext}");
    assert!(vtext.contains("1 runner-caused gaps"), "{vtext}");
}

/// Fast NAKs (100 ms), no `max_deliveries` of the runner's own: only the consumer's
/// `max_deliver` ends the deliveries.
pub(crate) fn last_delivery_pace() -> serde_json::Value {
    serde_json::json!({"batch_size": 16, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                       "sink_workers": 1, "shutdown_timeout_seconds": 10,
                       "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}})
}

/// The durable re-created with `max_deliver` 3.
fn max_deliver_3(c: &Case) {
    let js = c.server.js();
    js.delete_consumer(STREAM, CONSUMER).unwrap();
    let mut cc = durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 1000);
    cc.max_deliver = 3;
    js.add_consumer(STREAM, cc).unwrap();
}

/// Waits (30 s at most) until a checkpoint lists message 2 as a gap, stops the runner, and
/// returns every gap listed with its reason; checks that the broker dropped message 2
/// unacknowledged (ack floor 1, nothing pending or in flight).
fn abandoned_gap_of_2(
    c: &Case,
    out: &Path,
    runner: &mut crate::support::process::Runner,
) -> Vec<(u64, String)> {
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < end && !gaps_with_reasons(out).iter().any(|g| g.0 == 2) {
        std::thread::sleep(Duration::from_millis(100));
    }
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let state = c.server.try_consumer_state(STREAM, CONSUMER);
    let log = runner.log_text();
    eprintln!(
        "atk55 last delivery: consumer {state:?}; log:\n{}",
        log.lines()
            .filter(|l| l.contains("sequence 2") || l.contains("max_deliver"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        state.map(|s| s.0),
        Some(1),
        "message 2 was settled after all"
    );
    assert!(
        log.contains("sequence 2: not delivered on the consumer's last delivery (3"),
        "{log}"
    );
    gaps_with_reasons(out)
}

/// The gaps the checkpoints of the file sink at `out` list, with their reasons.
pub(crate) fn gaps_with_reasons(out: &Path) -> Vec<(u64, String)> {
    if !out.join(".svc-checkpoints").is_dir() {
        return Vec::new();
    }
    crate::custody_checkpoints::checkpoint_files(out)
        .iter()
        .flat_map(|f| {
            let cp: serde_json::Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            let body: serde_json::Value =
                serde_json::from_str(cp["signed"].as_str().unwrap()).unwrap();
            body["gaps"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|g| Some((g[0].as_u64()?, g[1].as_str()?.to_string())))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The sequences the checkpoints of the file sink at `out` list as gaps.
fn gaps_listed(out: &Path) -> Vec<u64> {
    gaps_with_reasons(out).into_iter().map(|g| g.0).collect()
}

/// HELD (class 7, ids that repeat, against `AckWorker::confirmed_before`). A message whose
/// `dead_lettered` gap a stored checkpoint lists is acknowledged without publishing again
/// (a9983ab). The stream deleted and re-created numbers from 1 again: the new message 2,
/// refused by the sink for good, must not be taken for the old one (its dead letter never
/// published). `SignedGaps` is keyed by stream and incarnation: the new one is dead-lettered
/// (two dead letters in all) and its gap listed under the new incarnation.
#[test]
fn held_a_reused_sequence_after_the_stream_is_re_created_is_dead_lettered_again() {
    let c = crate::custody_checkpoints::case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            serde_json::json!({"type": "file", "directory": dir.join("out"),
                               "max_record_bytes": 2048})
        },
        serde_json::json!({"dead_letter": {"enabled": true, "subject": DLQ_SUBJECT,
                               "expected_stream": "DLQ", "publish_timeout_ms": 1000},
               "delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                            "jitter": "none"}}}),
    );
    let mut dlq = crate::support::broker::stream_config("DLQ", &[DLQ_SUBJECT]);
    dlq.duplicate_window = 1_000_000_000;
    c.server.js().add_stream(dlq).unwrap();
    let out = c.dir.path().join("out");
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    wait_acked(&c.server, 2);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let before = c.server.stream_messages("DLQ");
    let js = c.server.js();
    js.delete_stream(STREAM).unwrap();
    c.server.create_stream(STREAM, &["orders.>"]);
    c.server
        .create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    publish_range(&c.server, 1, 1);
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < end
        && c.server.try_consumer_state(STREAM, CONSUMER).map(|s| s.0) != Some(2)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let after = c.server.stream_messages("DLQ");
    let state = c.server.try_consumer_state(STREAM, CONSUMER);
    let listed = gaps_listed(&out);
    eprintln!(
        "atk55 reused sequence: dead letters {before} after the first incarnation, {after} after \
         the second; consumer {state:?}; gaps listed {listed:?}"
    );
    assert_eq!(before, 1, "the first message 2 was not dead-lettered");
    assert_eq!(
        after, 2,
        "the re-created stream's message 2 was acknowledged as the old one's dead letter \
         (consumer {state:?})"
    );
}

/// HELD (class 5, a consumer setting at its extreme: `max_deliver` 1, every delivery the
/// last). The hold settles each message given up on at once (`Settle::Last`, counted) with a
/// healthy store, but its gap is told before and listed by the next cut: after a TERM the
/// chain lists the dead-lettered message 2, one dead letter, the audit COMPLETE.
#[test]
fn held_max_deliver_1_settles_at_once_but_still_lists_the_gap() {
    let c = crate::custody_checkpoints::case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            serde_json::json!({"type": "file", "directory": dir.join("out"),
                               "max_record_bytes": 2048})
        },
        serde_json::json!({"dead_letter": {"enabled": true, "subject": DLQ_SUBJECT,
                               "expected_stream": "DLQ", "publish_timeout_ms": 1000},
               "delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                            "jitter": "none"}}}),
    );
    let mut dlq = crate::support::broker::stream_config("DLQ", &[DLQ_SUBJECT]);
    dlq.duplicate_window = 1_000_000_000;
    c.server.js().add_stream(dlq).unwrap();
    let js = c.server.js();
    js.delete_consumer(STREAM, CONSUMER).unwrap();
    let mut cc = durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 1000);
    cc.max_deliver = 1;
    js.add_consumer(STREAM, cc).unwrap();
    let out = c.dir.path().join("out");
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    publish_range(&c.server, 3, 3);
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let unsigned = snapshot_counter(
        &c.dir.path().join("metrics.json"),
        "checkpoint_gaps_settled_unsigned_total",
    );
    let listed = gaps_listed(&out);
    let dead = c.server.stream_messages("DLQ");
    let (vcode, vtext) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    let summary = vtext
        .lines()
        .filter(|l| l.contains("checkpoints ("))
        .collect::<Vec<_>>()
        .join(" | ");
    eprintln!(
        "atk55 max_deliver 1: settled unsigned {unsigned}; gaps listed {listed:?}; dead \
         letters {dead}; verify-custody exit {vcode}: {summary}"
    );
    assert_eq!(
        (listed.contains(&2), dead, vcode),
        (true, 1, 0),
        "max_deliver 1: the gap of 2 unlisted, or its dead letter lost ({summary})"
    );
}
