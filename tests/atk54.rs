//! atk54: attacks on the newest fixes (ccb5d37, 43d96ff): the hold budget applied only while
//! the checkpoint store fails (`Feed::store_failing`, `pipeline/gap_hold.rs`), a held dead
//! letter not published again (`AckWorker::rejected`), the none-yet head file of a spool sink
//! (`Writer::check_drained`, `check_suffix_head`), the consumer's `max_deliver` from the bound
//! `Consumer`.
//!
//! `found_...`: a finding's reproduction; it fails on 43d96ff and says what it expected.
//! `held_...`: an attack that held (these pass). Each prints what it ran and what it saw
//! (`cargo test --test main -- atk54:: --nocapture`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::atk50b::{edge, out, wait_until_either};
use crate::custody_checkpoints::{publish_range, wait_acked, Case};
use crate::support::broker::{durable_config, NatsServer};
use crate::support::protection::*;
use crate::support::*;

/// The target's checkpoint store out of reach (a plain file at its directory's name); as
/// atk53c's.
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

/// Runs the runner of `cfg` over `from..=to` and stops it with TERM.
fn run(c: &Case, (from, to): (u64, u64), log: &str) {
    let mut runner = start_runner(&c.cfg, &c.dir.path().join(log));
    publish_range(&c.server, from, to);
    wait_acked(&c.server, to);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
}

/// A start of the runner: (bound, log).
fn start_once(c: &Case, log: &str) -> (bool, String) {
    let mut runner = start_runner(&c.cfg, &c.dir.path().join(log));
    let started = wait_until_either(&mut runner);
    if started {
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(30));
    }
    (started, runner.log_text())
}

fn head_file(c: &Case) -> PathBuf {
    c.dir.path().join("c.json.custody-head")
}

fn refusal(log: &str) -> String {
    log.lines()
        .filter(|l| l.contains("custody checkpoints"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// FOUND (class 1, a crash at the worst moment; severity medium: an edge site, the one place a
/// spool sink is for, cannot start again without its downstream or an operator writing the
/// head file by hand). The none-yet head file (`Head::none_yet`, 13fa40d) exists so that a
/// kill -9 between the first checkpoint's put and the head file's write starts again, and
/// ccb5d37 made a spool sink's suffix from checkpoint 0 extend it (atk53c finding 2). But
/// `Writer::start` writes it only on the whole-chain branch (`if suffix {..} else { check_head;
/// if chain.is_empty() && stored.is_none() { write none_yet } }`): an edge spool whose target
/// cannot be read at its FIRST start (the ordinary case for an edge site: no downstream yet)
/// gets no head file at all. Its first checkpoint frame appended, a kill -9 before the head
/// file's write leaves checkpoint 0 in the spool and no head file, and every start after that
/// refuses ("the sink holds a chain of runner .. up to checkpoint 0 but the head file .. is
/// missing"): atk53b finding 3 again. The crash is reproduced by its result: the head file
/// the first start left (none) restored after checkpoint 0 was cut into the spool. Expected:
/// the start goes on (fix: write `Head::none_yet` at the first start on the suffix branch too,
/// when the spool chain is empty, no head file exists and the store records no drained head
/// (`DrainedHead::None`); with an unvouched one the start refuses already).
#[test]
fn found_an_edge_spool_first_started_with_its_target_down_has_no_none_yet_head_and_a_kill_9_refuses(
) {
    let c = edge(3);
    target_unreadable(&c);
    let (started, log) = start_once(&c, "svc1.log");
    assert!(
        started,
        "first start with the target down: {}",
        refusal(&log)
    );
    let first_head = std::fs::read(head_file(&c)).ok();
    eprintln!(
        "atk54 edge: head file after a first start with the target down: {}",
        first_head
            .as_deref()
            .map_or("(none)".into(), |b| String::from_utf8_lossy(b).into_owned())
    );
    run(&c, (1, 3), "svc2.log");
    let cut = std::fs::read_to_string(head_file(&c)).unwrap_or_default();
    eprintln!("atk54 edge: head file after checkpoint 0 was cut into the spool: {cut}");
    assert!(cut.contains("\"index\":0"), "checkpoint 0 not cut: {cut}");
    // What a kill -9 between checkpoint 0's append and the head file's write leaves.
    match &first_head {
        Some(b) => std::fs::write(head_file(&c), b).unwrap(),
        None => std::fs::remove_file(head_file(&c)).unwrap(),
    }
    let (started, log) = start_once(&c, "svc3.log");
    eprintln!(
        "atk54 edge: restart after the simulated kill -9, target still down: started \
         {started}; {}",
        refusal(&log)
    );
    assert!(
        started,
        "an edge spool first started while its target was down got no none-yet head file \
         ({}), so a kill -9 inside its first checkpoint REFUSES every start: {}",
        if first_head.is_some() {
            "it had one"
        } else {
            "none written"
        },
        refusal(&log)
    );
}

/// The records of the file sink at `out`, by stream sequence.
fn stored(out: &Path) -> Vec<u64> {
    records(out).keys().copied().collect()
}

fn publish_sink_refused(server: &NatsServer) {
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    server.publish_with_headers("orders.big", &[], big.as_bytes());
}

/// FOUND (class 6/1, a store that does not answer, with a publisher's refusals; severity
/// medium-high: atk53b findings 1 and 5 back, delivery stalls for as long as the checkpoint
/// store hangs or fails). Since ccb5d37 the hold's budget (half `max_ack_pending`) applies
/// only `while feed.store_failing()`, a flag set when a put has FAILED (`cut_origin`). A put
/// that hangs (here a DBA's `LOCK TABLE svc_custody_checkpoints` taken while the runner runs:
/// the INSERT waits up to `statement_timeout_seconds`, 20 s here, 30 s by default, up to 3600)
/// leaves it false, and every message given up on meanwhile is held with no bound; when the
/// put finally fails and the flag is set, `Hold::decide` only stops adding: what it holds
/// stays held (`held.contains(at)` -> `Wait`) for as long as the store fails. 16 messages
/// refused before the sink (`max_deliveries` 1, no DLQ) with `max_ack_pending` 16 (budget 8)
/// fill the consumer: the broker delivers nothing else, and the 4 good messages published
/// after them are not stored while the table is locked (2 failed cuts, about 40 s, observed).
/// Expected: at most the budget held (the good messages flow, the rest settled unsigned,
/// counted), as 13fa40d did. Fix: treat a cut in progress for longer than `GAP_WAIT` as a
/// failing store (set the flag when a cut starts, clear it when a put succeeds), and when the
/// flag is set with `held.len() > budget`, settle the excess unsigned on their next delivery
/// instead of `Wait`.
#[test]
fn found_refusals_held_while_a_checkpoint_put_hangs_stall_delivery_past_the_budget() {
    let db = crate::support::postgres::TestDb::new("atk54_hang");
    let sink = db.sink(serde_json::json!({"statement_timeout_seconds": 20}));
    let c = crate::custody_checkpoints::case_with(
        100,
        move |_| sink,
        serde_json::json!({"size_policy": {"enabled": true, "max_payload_bytes": 20},
               "delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10, "max_deliveries": 1,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                            "jitter": "none"}}}),
    );
    let js = c.server.js();
    js.delete_consumer(STREAM, CONSUMER).unwrap();
    js.add_consumer(
        STREAM,
        durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 16),
    )
    .unwrap();
    let (code, o, e) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{o}{e}");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let mut lock = db.conn();
    lock.simple("BEGIN; LOCK TABLE svc_custody_checkpoints IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    for _ in 2..=17 {
        c.server
            .publish_with_headers("orders.big", &[], big.as_bytes());
    }
    publish_range(&c.server, 18, 21);
    let mut failed_cuts = 0;
    wait_until(
        Duration::from_secs(180),
        "a good message stored, or 2 failed cuts",
        || {
            failed_cuts = runner.log_text().matches("not written (kept").count();
            db.count("events") >= 2 || failed_cuts >= 2
        },
    );
    let rows = db.count("events");
    let state = c
        .server
        .try_consumer_state(STREAM, CONSUMER)
        .unwrap_or_default();
    let metrics = c.dir.path().join("metrics.json");
    let unsigned = snapshot_counter(&metrics, "checkpoint_gaps_settled_unsigned_total");
    eprintln!(
        "atk54 hang: checkpoint table locked, 16 refusals then 4 good messages, \
         max_ack_pending 16 (budget 8): {failed_cuts} failed cuts; rows stored {rows} (of 5); \
         consumer (ack floor, ack pending, pending) {state:?}; settled unsigned {unsigned}"
    );
    lock.simple("COMMIT").unwrap();
    wait_until(Duration::from_secs(90), "everything settled", || {
        c.server.try_consumer_state(STREAM, CONSUMER) == Some((21, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    assert!(
        rows >= 2,
        "refusals held while a checkpoint put hung (store_failing still false: no budget) \
         fill max_ack_pending and stay held once it failed: none of the good messages \
         18..=21 was stored during {failed_cuts} failed cuts ({rows} rows, consumer {state:?})"
    );
}

/// FOUND (class 5/12, a server setting changed under a running runner; severity low: one
/// message given up on stays unsettled in the stream for good, its gap listed). Since 43d96ff
/// the hold takes the consumer's `max_deliver` from the bound `Consumer`, parsed once at bind;
/// the consumer watch (`broker/consumer_watch.rs`) stops the run on a filter change or
/// `headers_only`, not on `max_deliver`, and nothing reads it again. An operator (or the
/// reconcile of another runner's configuration) lowering the durable's `max_deliver` to
/// `delivery.max_deliveries` while the runner runs brings atk53b finding 6 back: the message
/// given up on at its delivery 2 is NAKed to wait for its checkpoint (`Settle::Wait`: the
/// hold believes there is no last delivery), the broker never delivers it again, and the
/// `+TERM` the docs promise never comes (the broker's max-deliveries advisory instead). Here:
/// unlimited `max_deliver` at bind, updated to 2 (nats-server 2.9 updates a durable created
/// again), `max_deliveries` 2, one message the file sink refuses. Expected: terminated, as at
/// a bind with `max_deliver` 2 (fix: read `max_deliver` from each consumer info the watch
/// fetches anyway and hand it to `Hold`, or warn/stop when it changes as for the filter).
///
/// Fixed: the consumer watch hands the `max_deliver` of each consumer info to the hold
/// (`broker::consumer_limits`, logged at info when it changes); the refusal is published once
/// the runner logged the change (a change made less than a check, 5 s, before the give-up
/// is not seen in time: the hold goes by the answer it has).
#[test]
fn found_a_max_deliver_lowered_after_bind_leaves_a_message_given_up_on_unterminated() {
    let cc = durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 20_000);
    let c = crate::atk53b::file_case(Some(cc.clone()));
    let metrics = c.dir.path().join("metrics.json");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let mut lowered = cc;
    lowered.max_deliver = 2;
    c.server.js().add_consumer(STREAM, lowered).unwrap();
    let now = c.server.js().consumer_info(STREAM, CONSUMER).unwrap();
    assert_eq!(now.config.max_deliver, 2, "the durable was not updated");
    wait_until(
        Duration::from_secs(30),
        "the runner saw max_deliver 2",
        || runner.log_text().contains("max_deliver unlimited -> 2"),
    );
    publish_sink_refused(&c.server);
    publish_range(&c.server, 3, 3);
    let out = c.dir.path().join("out");
    wait_until(
        Duration::from_secs(90),
        "sequence 2 listed as a gap and 3 stored",
        || gaps_listed(&out).contains(&2) && stored(&out).contains(&3),
    );
    // A runner that knew the consumer's max_deliver settled 2 on its delivery 2 (unsigned,
    // counted), before the gap was listed: the next metrics snapshot shows it.
    let written = || std::fs::metadata(&metrics).and_then(|m| m.modified()).ok();
    let before = written();
    wait_until(Duration::from_secs(30), "a fresh metrics snapshot", || {
        written() != before
    });
    let terminated = snapshot_counter(&metrics, "messages_terminated_total");
    let state = c
        .server
        .try_consumer_state(STREAM, CONSUMER)
        .unwrap_or_default();
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    eprintln!(
        "atk54 max_deliver: lowered to 2 after bind; gap of 2 listed, 3 stored: \
         terminated_total {terminated}; consumer (ack floor, ack pending, pending) {state:?}"
    );
    assert_eq!(
        terminated,
        1,
        "sequence 2, given up on at delivery 2 = the consumer's max_deliver lowered after bind, \
         was never terminated (the hold kept max_deliver as bound: unlimited; the broker \
         dropped it at its max_deliver instead, consumer {state:?}): {}",
        runner
            .log_text()
            .lines()
            .filter(|l| l.contains("stream sequence 2"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// The sequences the checkpoints of the file sink at `out` list as gaps.
fn gaps_listed(out: &Path) -> Vec<u64> {
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
                .filter_map(|g| g[0].as_u64())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A file sink with checkpoints (every 100 records), a pre-sink size limit of 20 bytes, a DLQ
/// on stream `DLQ` (duplicate window 2 minutes), a NAK backoff of 100 ms; as atk53c's; the
/// consumer's `max_ack_pending` when given.
fn dlq_case(max_ack_pending: Option<i64>) -> Case {
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
    if let Some(m) = max_ack_pending {
        let js = c.server.js();
        js.delete_consumer(STREAM, CONSUMER).unwrap();
        js.add_consumer(
            STREAM,
            durable_config(CONSUMER, "orders.>", Duration::from_secs(30), m),
        )
        .unwrap();
    }
    c
}

/// HELD (class 1: a held dead letter and a kill -9). A message refused before the sink, its
/// dead letter confirmed, held for its checkpoint (the store broken: a file planted at
/// `.svc-checkpoints`) and no longer published on its redeliveries (ccb5d37): kill -9 while
/// it is held (the hold is memory only), the store repaired, a restart. The restart delivers
/// it again (never ACKed), publishes its dead letter again (dropped by the duplicate
/// window), lists the gap and ACKs it: one dead letter, the gap listed, the audit COMPLETE.
#[test]
fn held_a_dead_letter_held_at_a_kill_9_is_listed_once_and_stored_once_after_the_restart() {
    let c = dlq_case(None);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    wait_until(Duration::from_secs(60), "the dead letter held", || {
        c.server.stream_messages("DLQ") >= 1
            && runner.log_text().matches("not written (kept").count() >= 2
    });
    runner.sigkill();
    let held = c
        .server
        .try_consumer_state(STREAM, CONSUMER)
        .unwrap_or_default();
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    publish_range(&c.server, 3, 3);
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let dead = c.server.stream_messages("DLQ");
    let (code, text) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    eprintln!(
        "atk54 held dlq: consumer at the kill -9 {held:?}; dead letters after the restart \
         {dead}; verify-custody exit {code}: {}",
        text.lines().last().unwrap_or_default()
    );
    assert_eq!(dead, 1, "the held dead letter was stored {dead} times");
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(" 2 records intact") && text.contains(" 1 runner-caused gaps: COMPLETE"),
        "{text}"
    );
}

/// The target's checkpoint store given back.
fn target_readable(c: &Case) {
    let store = out(c).join(".svc-checkpoints");
    std::fs::remove_file(&store).unwrap();
    std::fs::rename(c.dir.path().join("checkpoints-aside"), &store).unwrap();
}

/// FOUND (class 4 with class 1: another account in the spool directory, after a kill -9;
/// severity low-medium: a broken chain, the drain stuck for good; before ccb5d37 this start
/// was refused). ccb5d37 made `check_drained` take a none-yet head file as no head when the
/// spool records no drained head (`DrainedHead::None`), so an edge spool that never cut a
/// checkpoint starts while its target is down (atk53c finding 1). But a none-yet head file is
/// also what a kill -9 between checkpoint 0's append and the head file's write leaves (the
/// very crash the file is for), and `svc spool drain` then puts that checkpoint 0 into the
/// target and records it as the drained head. Whoever can write the spool directory removes
/// the `drained-head-...` file (atk52c finding 2's move): with the target down, the start finds
/// an empty spool chain, no drained head and a none-yet head, takes it as "nothing ever cut"
/// and goes on. Observed: it signs checkpoint 1 with `previous` "" (the none-yet head taken
/// as checkpoint 0, see the next test), which does not follow the drained checkpoint 0: the
/// drain stops there for good and the audit says NOT complete; with that fixed it would sign
/// a second checkpoint 0, a fork. Expected: refused, as with any other head file beside an
/// empty spool chain and no drained head ("start again once the target can be read"): the
/// target decides (fix: in `Writer::check_drained`, take a none-yet head as no head only when
/// the spool shows no drain ever happened, e.g. no segment removed and its drain position at
/// the spool's start).
///
/// Fixed: before checkpoint 0's put the runner writes the head "checkpoint 0's put begun"
/// (`Head::first_put_begun`, index 1 and no digest); a start that finds it beside an empty
/// spool chain, no drained head and the target unreadable refuses (checkpoint 0 may be in the
/// target). The none-yet head (index 0) still means nothing was put.
#[test]
fn found_a_none_yet_head_after_a_kill_9_and_a_removed_drained_head_breaks_the_chain() {
    let c = edge(3);
    let (started, log) = start_once(&c, "svc1.log");
    assert!(started, "first start: {}", refusal(&log));
    let none_yet = String::from_utf8(std::fs::read(head_file(&c)).unwrap()).unwrap();
    assert!(
        none_yet.contains("\"index\":0,\"digest\":\"\""),
        "{none_yet}"
    );
    run(&c, (1, 3), "svc2.log");
    // What a kill -9 between checkpoint 0's append and the head file's write leaves: since
    // the fix, the head the runner writes before that put (checkpoint 0's put begun).
    let begun = none_yet.replace("\"index\":0,", "\"index\":1,");
    std::fs::write(head_file(&c), begun).unwrap();
    let (code, text) = crate::atk50b::spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
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
    target_unreadable(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc3.log"));
    let started = wait_until_either(&mut runner);
    let mut forked = String::new();
    if started {
        publish_range(&c.server, 4, 6);
        wait_acked(&c.server, 6);
        runner.signal("TERM");
        assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
        target_readable(&c);
        let (code, text) = crate::atk50b::spool_cmd(&c, "drain");
        let (vcode, vtext) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
        forked = format!(
            "drain exit {code}: {}; verify-custody exit {vcode}: {}",
            text.lines().last().unwrap_or_default(),
            vtext
                .lines()
                .filter(|l| l.contains("FORK") || l.contains("checkpoints ("))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    eprintln!(
        "atk54 fork: none-yet head after checkpoint 0 was drained, drained head removed, target \
         down: started {started}; {}; {forked}",
        refusal(&runner.log_text())
    );
    assert!(
        !started,
        "a start with the target down, an empty spool chain, the drained head removed and a \
         none-yet head (left by a kill -9 inside checkpoint 0) went on and signed a checkpoint \
         that does not follow the drained checkpoint 0: {forked}"
    );
}

/// FOUND (class 12, two views that disagree, on an operator's ordinary restart; severity
/// high: an edge site's chain is broken from its first checkpoint, the drain stops at it for
/// good, the audit says NOT complete, and once the target is back the runner never starts
/// again ("the chain of runner .. is broken at checkpoint 1"), with no attacker and no crash). atk53c
/// finding 1's fix (ccb5d37) lets an edge spool whose first start wrote the none-yet head file
/// (`{"index":0,"digest":""}`) start again while its target is down. But `Writer::start` then
/// takes that file for a real head: with no checkpoint in the spool it goes `else if let
/// Some(h) = stored.filter(|_| suffix)` -> `self.head = Some((0, ""))` ("the chain goes on
/// from the head file's head runner-cp-1:0:"), so the first checkpoint it cuts is index 1
/// with `previous` "" : there is no checkpoint 0. `svc spool drain` refuses to put it ("does
/// not follow the target's chain: it holds no checkpoint 0"), the records behind it are never
/// drained past it, `svc verify-custody` reports the chain broken, and a start that can read
/// the target refuses the chain (it does not begin at 0). Here: first start with
/// the target readable (none-yet head written), stopped with no traffic; restarted with the
/// target down, 3 records (a checkpoint every 3); target back, drain, audit. Expected: that
/// checkpoint is 0, the drain puts it, the audit is COMPLETE (fix: in `Writer::start`, a
/// none-yet head file is no head: `stored.filter(|h| suffix && !h.is_none_yet())`).
#[test]
fn found_an_edge_spool_restarted_with_its_target_down_before_any_checkpoint_signs_no_checkpoint_0()
{
    let c = edge(3);
    let (started, log) = start_once(&c, "svc1.log");
    assert!(started, "first start: {}", refusal(&log));
    let none_yet = std::fs::read_to_string(head_file(&c)).unwrap();
    target_unreadable(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    assert!(
        wait_until_either(&mut runner),
        "{}",
        refusal(&runner.log_text())
    );
    publish_range(&c.server, 1, 3);
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let head = std::fs::read_to_string(head_file(&c)).unwrap();
    target_readable(&c);
    let (dcode, dtext) = crate::atk50b::spool_cmd(&c, "drain");
    let (vcode, vtext) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    let (again, log) = start_once(&c, "svc3.log");
    eprintln!(
        "atk54 none-yet: a start with the target back: started {again}: {}",
        refusal(&log)
    );
    eprintln!(
        "atk54 none-yet: head file after the first start {}; after a restart with the target \
         down and 3 records: {}; start said: {}; drain exit {dcode}: {}; verify-custody exit \
         {vcode}: {}",
        none_yet.trim(),
        head.trim(),
        refusal(&runner.log_text()),
        dtext.lines().last().unwrap_or_default(),
        vtext
            .lines()
            .filter(|l| l.contains("chain") || l.contains("checkpoints ("))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    assert!(
        head.contains("\"index\":0,") && dcode == 0 && vcode == 0 && again,
        "an edge spool restarted while its target is down after a first start that cut \
         nothing took the none-yet head file for checkpoint 0 and signed checkpoint 1 first \
         (head {}): the drain is stuck (exit {dcode}: {}), the audit fails (exit {vcode}), a \
         start with the target back: {again}",
        head.trim(),
        dtext.lines().last().unwrap_or_default()
    );
}

/// FOUND (class 7, ids that repeat, on an ordinary restart; severity low-medium: a second
/// dead letter of one message, which `svc dlq redrive` and the DLQ's readers see twice). A
/// message refused before the sink is dead-lettered and held for its checkpoint; the runner is
/// stopped (TERM) after the checkpoint listing its gap (`dead_lettered`) was stored but before
/// its redelivery settled it. The restart reads that gap back as signed (`Writer::start` notes
/// the chain's gaps), yet `AckWorker::rejected` publishes the dead letter again before it asks
/// the hold (`hold.holds` is memory only, and `signed()` comes after `dlq.publish`): past the
/// DLQ stream's duplicate window (the stop lasting longer than it; 2 minutes by default, 1 s
/// here) the stream stores a second copy, though the signed gap says the first one was
/// confirmed. Expected: one dead letter (fix: in `rejected`, with checkpoints, a message whose
/// gap `Feed::gap_signed` says is listed as `dead_lettered` is acknowledged without
/// publishing again; the docs' "the checkpoint store was failing that long" then stays the
/// only case).
///
/// Fixed for a message the sink refused (as here: a record over the file sink's
/// `max_record_bytes`, its gap `dead_lettered`): `AckWorker::rejected` acknowledges a message
/// whose gap a stored checkpoint lists as `dead_lettered` without publishing again
/// (`Feed::gap_dead_lettered`). Open for a message refused before the sink: its gap is
/// `refused_before_sink` with or without a DLQ, so a signed one does not prove a dead letter
/// (the DLQ may have been configured since); it is published again (docs/payload-protection.md).
#[test]
fn found_a_dead_letter_whose_gap_was_signed_before_a_stop_is_stored_again_after_the_restart() {
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
                            "nak_backoff": {"mode": "fixed", "initial_ms": 20000,
                                            "jitter": "none"}}}),
    );
    let mut dlq = crate::support::broker::stream_config("DLQ", &[DLQ_SUBJECT]);
    dlq.duplicate_window = 1_000_000_000;
    c.server.js().add_stream(dlq).unwrap();
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    // Its gap listed; its redelivery (NAK delay 20 s) not come yet.
    wait_until(Duration::from_secs(60), "the gap of 2 listed", || {
        gaps_listed(&out).contains(&2)
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let before = c.server.stream_messages("DLQ");
    let pending = c
        .server
        .try_consumer_state(STREAM, CONSUMER)
        .unwrap_or_default();
    // Its redelivery comes 20 s after its NAK: past the DLQ stream's duplicate window (1 s),
    // as after any stop longer than the window.
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    publish_range(&c.server, 3, 3);
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let after = c.server.stream_messages("DLQ");
    eprintln!(
        "atk54 restart dlq: gap of 2 signed before the stop, consumer then {pending:?}; dead \
         letters {before} before the restart, {after} after it"
    );
    assert_eq!(
        after, 1,
        "a message whose dead_lettered gap was signed before a stop was dead-lettered again \
         after the restart ({after} dead letters)"
    );
}

/// FOUND (class 5, a server setting changed under a running runner; severity medium: with the
/// checkpoint store failing, delivery stalls although the hold has a budget for exactly that).
/// The hold's budget is half the `max_ack_pending` the consumer had at bind (43d96ff: from the
/// bound `Consumer`), never read again, and the consumer watch does not stop the run when it
/// changes. Lowered while the runner runs (here from 1000 at bind to 16: budget still 500),
/// a failing checkpoint store (a file planted at `.svc-checkpoints`) holds every refusal up to
/// the consumer's real limit: 16 refusals fill it, and the good messages published after them
/// are not delivered while the store fails. Expected: at most half the consumer's current
/// limit held, the rest settled unsigned (counted), good messages delivered (fix: take
/// `max_ack_pending` from each consumer info the watch fetches anyway and hand it to the
/// hold, or warn/stop when it changes, as for the filter).
///
/// Fixed: the consumer watch hands the `max_ack_pending` of each consumer info to the hold
/// (`broker::consumer_limits`, logged at info when it changes), whose budget is half the
/// current one; the store is broken and the refusals published once the runner logged the
/// change (a check comes every 5 s).
#[test]
fn found_a_max_ack_pending_lowered_after_bind_lets_the_hold_fill_the_consumer() {
    let c = dlq_case(Some(1000));
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    c.server
        .js()
        .add_consumer(
            STREAM,
            durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 16),
        )
        .unwrap();
    let now = c.server.js().consumer_info(STREAM, CONSUMER).unwrap();
    assert_eq!(
        now.config.max_ack_pending, 16,
        "the durable was not updated"
    );
    wait_until(
        Duration::from_secs(30),
        "the runner saw max_ack_pending 16",
        || runner.log_text().contains("max_ack_pending 1000 -> 16"),
    );
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    for _ in 2..=17 {
        c.server
            .publish_with_headers("orders.big", &[], big.as_bytes());
    }
    publish_range(&c.server, 18, 21);
    let mut failed_cuts = 0;
    wait_until(
        Duration::from_secs(180),
        "a good message stored, or 20 failed cuts",
        || {
            failed_cuts = runner.log_text().matches("not written (kept").count();
            stored(&out).iter().any(|s| *s >= 18) || failed_cuts >= 20
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
        "atk54 max_ack_pending: 1000 at bind, 16 after; store broken; 16 refusals then 4 good \
         messages: {failed_cuts} failed cuts; records stored {seen:?}; consumer (ack floor, \
         ack pending, pending) {state:?}; settled unsigned {unsigned}"
    );
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    wait_until(Duration::from_secs(60), "everything settled", || {
        c.server.try_consumer_state(STREAM, CONSUMER) == Some((21, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    assert!(
        seen.iter().any(|s| *s >= 18),
        "max_ack_pending lowered to 16 after bind: the hold kept the budget of 1000 (500) \
         and filled the consumer with refusals while the checkpoint store failed; good \
         messages 18..=21, none delivered during {failed_cuts} failed cuts (stored {seen:?}, \
         consumer {state:?})"
    );
}

/// HELD (`Feed::store_failing` does not stick). The flag is set by a failed cut and cleared by
/// the next stored one: a store that failed (a file planted at `.svc-checkpoints`, refusals
/// settled unsigned past the budget meanwhile) and was repaired holds the next flood of
/// refusals again instead of settling them unsigned: after the repair, 30 refusals with
/// `max_ack_pending` 16 (budget 8), none settled unsigned, each listed as a gap.
#[test]
fn held_a_repaired_store_holds_the_next_flood_instead_of_settling_it_unsigned() {
    let c = dlq_case(Some(16));
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    for _ in 2..=13 {
        c.server
            .publish_with_headers("orders.big", &[], big.as_bytes());
    }
    let unsigned_line = "settled before a custody checkpoint listed it";
    wait_until(
        Duration::from_secs(120),
        "a refusal settled unsigned",
        || runner.log_text().contains(unsigned_line),
    );
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    wait_acked(&c.server, 13);
    let unsigned_before = runner.log_text().matches(unsigned_line).count();
    for _ in 14..=43 {
        c.server
            .publish_with_headers("orders.big", &[], big.as_bytes());
    }
    wait_until(Duration::from_secs(120), "the flood settled", || {
        c.server.try_consumer_state(STREAM, CONSUMER) == Some((43, 0, 0))
    });
    let unsigned_after = runner.log_text().matches(unsigned_line).count() - unsigned_before;
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let listed = gaps_listed(&out);
    let flood_listed = (14..=43).filter(|s| listed.contains(s)).count();
    eprintln!(
        "atk54 repaired: {unsigned_before} settled unsigned while the store failed; after the \
         repair a flood of 30: {unsigned_after} settled unsigned, {flood_listed} listed"
    );
    assert!(unsigned_before > 0, "the store never counted as failing");
    assert_eq!(
        (unsigned_after, flood_listed),
        (0, 30),
        "store_failing stuck after the repair"
    );
}
