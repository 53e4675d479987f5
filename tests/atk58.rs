//! atk58: attacks on the newest custody-checkpoint fixes: a backlog cut in checkpoints of
//! `every_records` entries and retried after `RETRY_WAIT` (a73b6e4, `Writer::cut_backlog`),
//! gaps told while the checkpoint channel is full kept aside (dc313a4, `Feed::spilled`), a
//! held dead letter's gap told again on each redelivery (55f7152), and what they build on
//! (`pipeline/retried.rs`, `pipeline/gap_hold.rs`).
//!
//! `found_...`: a finding's reproduction; it fails on 4ed6a7d and says what it expected.
//! `held_...`: an attack that held (these pass). Each prints what it ran and what it saw
//! (`cargo test --test main -- atk58:: --nocapture`).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::custody_checkpoints::{publish_range, Case};
use crate::support::broker::durable_config;
use crate::support::postgres::TestDb;
use crate::support::protection::*;
use crate::support::*;

/// The gaps and the leaves' sequences of every checkpoint text in `texts`, and each
/// checkpoint's entry count (leaves and gaps).
fn listed(texts: &[String]) -> (BTreeSet<u64>, BTreeSet<u64>, Vec<usize>) {
    let (mut gaps, mut leaves, mut sizes) = (BTreeSet::new(), BTreeSet::new(), Vec::new());
    for t in texts {
        let cp: Value = serde_json::from_str(t).unwrap();
        let body: Value = serde_json::from_str(cp["signed"].as_str().unwrap()).unwrap();
        let g = body["gaps"].as_array().unwrap();
        let l = cp["leaves"].as_array().unwrap();
        gaps.extend(g.iter().map(|x| x[0].as_u64().unwrap()));
        leaves.extend(l.iter().map(|x| x[0].as_u64().unwrap()));
        sizes.push(g.len() + l.len());
    }
    (gaps, leaves, sizes)
}

/// The checkpoint texts a PostgreSQL sink's table holds, in index order.
fn pg_checkpoints(db: &TestDb) -> Vec<String> {
    db.rows("SELECT checkpoint FROM svc_custody_checkpoints ORDER BY checkpoint_index")
        .into_iter()
        .map(|r| r[0].clone().unwrap())
        .collect()
}

/// A PostgreSQL sink with checkpoints (every 100 records, every hour), a pre-sink size limit
/// of 20 bytes, a DLQ on stream `DLQ` (duplicate window 2 minutes), a fixed NAK delay of
/// 100 ms, a statement timeout of 600 s; the durable created again with `max_ack_pending`.
fn pg_dlq_case(db: &TestDb, max_ack_pending: i64) -> Case {
    let sink = db.sink(json!({"statement_timeout_seconds": 600}));
    let c = crate::custody_checkpoints::case_with(
        100,
        move |_| sink,
        json!({"size_policy": {"enabled": true, "max_payload_bytes": 20},
               "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT,
                               "expected_stream": "DLQ", "publish_timeout_ms": 2000},
               "delivery": {"batch_size": 256, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 4, "sink_workers": 1,
                            "shutdown_timeout_seconds": 30,
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
    let (code, o, e) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{o}{e}");
    c
}

fn publish_refused(c: &Case, n: usize) {
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    c.server
        .publish_n(STREAM, "orders.big", n, |_| big.clone().into_bytes());
}

/// FOUND (class 8 amplification + class 6 a store that does not answer; severity medium:
/// messages the runner gave up on and acknowledged (their dead letters published) are listed
/// as a gap in no checkpoint, without any crash, and `svc verify-custody` calls the chain
/// COMPLETE). `Feed::spilled` (dc313a4) keeps a gap told while the checkpoint channel is
/// full, 65,536 at most, with no de-duplication, and since 55f7152 `svc-ack` tells a held dead
/// letter's gap again on every redelivery (without a DLQ `rejected` did so already). A put
/// that hangs (here a DBA's `LOCK TABLE svc_custody_checkpoints`; a slow object store does
/// the same) stops `svc-checkpoint` from reading its channel; after `PUT_HANGS_AFTER` the
/// hold's budget (half `max_ack_pending`: 2,000 of 4,000 here) applies. 2,000 refusals held,
/// each NAKed with a 100 ms delay, tell the same 2,000 gaps again about 10 times a second: the
/// 65,536-slot channel, then the 65,536 spilled gaps, fill with copies of those 2,000. A
/// refusal past the budget is then settled unsigned (`Settle::Unsigned`: acknowledged after
/// its dead letter) and its one and only gap is dropped ("this line is its only record"),
/// although the docs promise that such a gap is "still told and listed by the next cut, so
/// only a kill -9 before that cut loses it". Steps: PostgreSQL sink, DLQ, `max_ack_pending`
/// 4,000, 1 good message; the table locked; 2,000 refusals (held); once the log says the
/// thread is 65,536 gaps behind, 20 more refusals; the lock released; all settled; TERM.
/// Expected: every refused message's sequence listed as a gap. Fix: keep the spilled gaps in
/// a set (one entry per origin and sequence; a copy of a pending or spilled gap takes no
/// slot), or do not tell a held message's gap again while it is pending or spilled (tell it
/// again only once the thread has forgotten it: a signed-gap epoch older than 65,536 notes).
#[test]
fn found_told_again_gaps_fill_the_spill_and_an_unsigned_refusals_gap_is_dropped() {
    let db = TestDb::new("atk58_spill");
    let c = pg_dlq_case(&db, 4000);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    crate::custody_checkpoints::wait_acked(&c.server, 1);
    let mut lock = db.conn();
    lock.simple("BEGIN; LOCK TABLE svc_custody_checkpoints IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    publish_refused(&c, 2000);
    let behind = "gaps behind: this line is its only record";
    let full = wait_for(&runner, Duration::from_secs(300), |l| l.contains(behind));
    let dlq_before = c.server.stream_messages("DLQ");
    // Past the budget while the put hangs: settled unsigned (acknowledged, dead-lettered).
    publish_refused(&c, 20);
    let extra: Vec<u64> = (2002..=2021).collect();
    let settled = wait_for(&runner, Duration::from_secs(120), |l| {
        l.matches("settled before a custody checkpoint listed it")
            .count()
            >= 20
    });
    lock.simple("COMMIT").unwrap();
    wait_until(Duration::from_secs(300), "everything settled", || {
        c.server.try_consumer_state(STREAM, CONSUMER) == Some((2021, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(60)).is_some());
    let (gaps, leaves, sizes) = listed(&pg_checkpoints(&db));
    let unlisted: Vec<u64> = (2..=2021)
        .filter(|s| !gaps.contains(s) && !leaves.contains(s))
        .collect();
    let (code, text) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    let summary = text.lines().last().unwrap_or_default().to_string();
    let log = runner.log_text();
    eprintln!(
        "atk58 spill: table locked, 2000 refusals held (budget 2000); spill full seen {full}; \
         20 more refusals settled unsigned seen {settled} (DLQ {dlq_before} -> {}); \
         'only record' lines {}; checkpoints {} (entries {sizes:?}); gaps listed {}; \
         refused sequences listed nowhere {} (of the 20 past the budget: {}); \
         verify-custody exit {code}: {summary}",
        c.server.stream_messages("DLQ"),
        log.matches(behind).count(),
        sizes.len(),
        gaps.len(),
        unlisted.len(),
        extra.iter().filter(|s| unlisted.contains(s)).count(),
    );
    assert!(
        unlisted.is_empty(),
        "every message given up on (dead-lettered and acknowledged) is listed as a gap in a \
         signed checkpoint: {} refused sequences are listed nowhere, e.g. {:?} (the spill was \
         full of copies of the held messages' gaps); verify-custody exit {code}: {summary}",
        unlisted.len(),
        &unlisted[..unlisted.len().min(10)]
    );
}

/// Waits (up to `limit`) until `f` holds for the runner's log; whether it did.
fn wait_for(
    runner: &crate::support::process::Runner,
    limit: Duration,
    f: impl Fn(&str) -> bool,
) -> bool {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if f(&runner.log_text()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}
