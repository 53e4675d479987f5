//! atk53c: attacks on the newest fixes (13fa40d): the hold budget (`pipeline/gap_hold.rs`),
//! `Writer::take_stored`, the "no checkpoint yet" head file (`Head::none_yet`) and the drain's
//! `target_end`.
//!
//! `found_...`: a finding's reproduction; it fails on 13fa40d/5417255 and says what it
//! expected. `held_...`: an attack that held (these pass).

use std::path::Path;
use std::time::Duration;

use crate::atk50b::{edge, out, wait_until_either};
use crate::custody_checkpoints::{publish_range, wait_acked, Case};
use crate::support::protection::*;

/// The target's checkpoint store out of reach (a plain file at its directory's name); as
/// atk53a's.
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
fn run(c: &Case, cfg: &Path, (from, to): (u64, u64), log: &str) {
    let mut runner = start_runner(cfg, &c.dir.path().join(log));
    publish_range(&c.server, from, to);
    wait_acked(&c.server, to);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
}

/// A start of the runner of `cfg`: (bound, log).
fn start_once(c: &Case, cfg: &Path, log: &str) -> (bool, String) {
    let mut runner = start_runner(cfg, &c.dir.path().join(log));
    let started = wait_until_either(&mut runner);
    if started {
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(30));
    }
    (started, runner.log_text())
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

/// FOUND (class 11/12: an operator's ordinary restart; severity medium: an edge site cannot
/// start without its downstream, the one thing its spool is for). The first start of a runner
/// whose spool sink's target can be read writes the "no checkpoint yet" head file
/// (`Head::none_yet`, 13fa40d). Stopped before its first checkpoint (no traffic yet) and
/// started again while the target cannot be read, the start goes the suffix way
/// (`check_drained` -> `drained::check_without`): the spool holds no checkpoint and a head file
/// exists, so it refuses: "the spool holds no checkpoint of this runner (drained) ... start
/// again once the target can be read". Nothing was ever drained nor cut: before 13fa40d (no
/// head file) this start went on. Expected: a none-yet head beside an empty chain starts
/// (smallest fix: in `Writer::check_drained`, with `DrainedHead::None` (nothing ever drained
/// by this version) pass `stored.filter(|h| !h.is_none_yet())` to `check_without`; NOT for
/// `DrainedHead::Unvouched`: there a none-yet head must refuse as a missing one does (atk53a
/// finding 3), since the drain may have put checkpoint 0 into the target already).
#[test]
fn found_a_none_yet_head_file_keeps_an_edge_spool_from_starting_while_its_target_is_down() {
    let c = edge(3);
    let (started, log) = start_once(&c, &c.cfg, "svc1.log");
    assert!(started, "first start: {log}");
    let head = std::fs::read_to_string(head_file(&c)).unwrap_or_default();
    eprintln!("atk53c: the head file after a first start with no traffic: {head}");
    target_unreadable(&c);
    let (started, log) = start_once(&c, &c.cfg, "svc2.log");
    eprintln!(
        "atk53c: restart with the target down, no checkpoint ever cut: started {started}; {}",
        refusal(&log)
    );
    assert!(
        started,
        "a runner that never cut a checkpoint was REFUSED a start while its spool's target is \
         down (none-yet head file {head}): {}",
        refusal(&log)
    );
}

/// FOUND (class 1, a crash at the worst moment; severity medium: atk53b finding 3 again, for
/// a spool sink). The none-yet head file exists so that a kill -9 between the first
/// checkpoint's put and the head file's write (head file still none-yet, checkpoint 0 stored)
/// starts again. With a spool sink whose target cannot be read at that restart, the start goes
/// `check_suffix_head`, which compares the none-yet head (index 0, digest "") to the spool's
/// checkpoint 0 as any head: "holds another checkpoint 0", refused until the target is back or
/// an operator writes the head file by hand. The crash is reproduced by its result: the
/// none-yet head file of the first start put back after checkpoint 0 was cut into the spool
/// (exactly what the kill -9 leaves). Expected: the start goes on (the chain extends the
/// none-yet head by checkpoint 0; fix: in `check_suffix_head`, a none-yet head takes a
/// suffix beginning at checkpoint 0 with previous "", as `check_head` does).
#[test]
fn found_a_kill_9_before_the_first_head_file_of_a_spool_sink_refuses_while_its_target_is_down() {
    let c = edge(3);
    let (started, log) = start_once(&c, &c.cfg, "svc1.log");
    assert!(started, "first start: {log}");
    let none_yet = std::fs::read(head_file(&c)).unwrap();
    run(&c, &c.cfg, (1, 3), "svc2.log");
    let cut = std::fs::read_to_string(head_file(&c)).unwrap();
    eprintln!("atk53c: head after checkpoint 0 was cut into the spool: {cut}");
    std::fs::write(head_file(&c), &none_yet).unwrap();
    target_unreadable(&c);
    let (started, log) = start_once(&c, &c.cfg, "svc3.log");
    eprintln!(
        "atk53c: restart after the simulated kill -9 (checkpoint 0 in the spool, head file \
         none-yet), target down: started {started}; {}",
        refusal(&log)
    );
    assert!(
        started,
        "the crash the none-yet head file is for (kill -9 between checkpoint 0's put and the \
         head file's write) REFUSES the start of a spool sink whose target is down: {}",
        refusal(&log)
    );
}

/// A file sink with checkpoints (every 100 records), a pre-sink size limit of 20 bytes, a DLQ
/// on stream `DLQ` with a duplicate window of `window_ns`, a NAK backoff of 100 ms.
fn dlq_case(window_ns: i64) -> Case {
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
    dlq.duplicate_window = window_ns;
    c.server.js().add_stream(dlq).unwrap();
    c
}

/// FOUND (class 7/12, ids that repeat; severity medium: the DLQ is the record of what was
/// given up on, and its readers, replays and `svc dlq redrive` see a message dead-lettered
/// several times; `messages_dlq_total` counts each copy). Sign first, settle last NAKs a
/// dead-lettered message until a checkpoint lists its gap, and each redelivery publishes its
/// dead letter again, relying on the DLQ stream's duplicate window (`Nats-Msg-Id`) to drop the
/// copy. The window is the stream's setting (2 minutes by default; nothing checks it), the
/// hold lasts as long as the checkpoint store fails: every window that passes while the
/// message is held adds one more copy. Here: the checkpoint store broken (a file planted at
/// `.svc-checkpoints`, as atk53b's), a DLQ stream with a 1 s window, one refused message held
/// 6 s: several dead letters of one message. Expected: one (smallest fix: in
/// `AckWorker::rejected`, a message the hold holds already (its dead letter confirmed in this
/// run) is not published again; `Hold` keeps what it needs; or refuse/warn at the start of a
/// DLQ stream whose duplicate window is shorter than the hold can last).
#[test]
fn found_a_dead_letter_held_for_its_checkpoint_is_stored_again_each_duplicate_window() {
    let c = dlq_case(1_000_000_000);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    crate::support::wait_until(Duration::from_secs(60), "a dead letter", || {
        c.server.stream_messages("DLQ") >= 1
    });
    std::thread::sleep(Duration::from_secs(6));
    let while_held = c.server.stream_messages("DLQ");
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    wait_acked(&c.server, 2);
    let after = c.server.stream_messages("DLQ");
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    eprintln!(
        "atk53c dlq: one refused message, checkpoint store broken about 6 s, DLQ duplicate \
         window 1 s: {while_held} dead letters while held, {after} once acked"
    );
    assert_eq!(
        after, 1,
        "one message given up on was dead-lettered {after} times while held for its checkpoint"
    );
}

/// FOUND (class 1 made by a publisher; severity medium: the audit's one guarantee, every
/// sequence a record or a listed gap, lost without any fault of the checkpoint store). The
/// hold budget (half the consumer's `max_ack_pending`) is meant for a failing checkpoint
/// store, but a gap waits up to `GAP_WAIT` (1 s) for its checkpoint even when the store is
/// healthy: a publisher sending more refused messages in that second than the budget settles
/// the rest unsigned ("this line is its only record"), and a kill -9 before the next cut
/// loses their gaps for good, and `svc verify-custody` still says COMPLETE (a sequence in no
/// checkpoint at all, neither record nor gap, is invisible to it). Measured: 200 refused, 64
/// settled unsigned before the kill -9, the audit lists 136 gaps and says COMPLETE. Here: a file
/// sink refusing records over 2048 bytes (no DLQ, `max_deliveries` 2), `max_ack_pending` 64
/// (budget 32), 200 refused messages published at once, kill -9 at the first unsigned
/// settlement (150 ms later), a restart to settle the rest, then the audit. Expected: all 200
/// listed as gaps (smallest
/// fix: while the store is healthy, i.e. the last put succeeded, cut at once when the hold is
/// full instead of settling unsigned: `Hold::decide` returns `Wait` and the writer is nudged
/// (a `Feed` flag checked like `overflowed`); the budget's unsigned settlement only after a
/// put failed).
#[test]
fn found_a_flood_of_refusals_past_the_hold_budget_lets_a_kill_9_lose_their_gaps() {
    let cc = crate::support::broker::durable_config(
        crate::support::protection::CONSUMER,
        "orders.>",
        Duration::from_secs(30),
        64,
    );
    let c = crate::atk53b::file_case(Some(cc));

    let n = 200;
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    for _ in 0..n {
        c.server
            .publish_with_headers("orders.big", &[], big.as_bytes());
    }
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    // Killed 150 ms after the first unsigned settlement, or (fixed: none while the store is
    // healthy) in the middle of the flood, half of it settled.
    crate::support::wait_until(
        Duration::from_secs(120),
        "an unsigned settlement, or half the flood settled",
        || {
            runner
                .log_text()
                .contains("settled before a custody checkpoint listed it")
                || c.server
                    .try_consumer_state(
                        crate::support::protection::STREAM,
                        crate::support::protection::CONSUMER,
                    )
                    .is_some_and(|s| s.0 >= n / 2)
        },
    );
    // Its +TERM sent (the batch's verbs go out together), well before the next cut (1 s).
    std::thread::sleep(Duration::from_millis(150));
    runner.sigkill();
    let unsigned = runner
        .log_text()
        .matches("settled before a custody checkpoint listed it")
        .count();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    wait_acked(&c.server, n);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .rev()
        .take(6)
        .collect();
    eprintln!(
        "atk53c flood: {n} refused messages, max_ack_pending 64 (budget 32), healthy store: \
         {unsigned} settled unsigned before the kill -9; verify-custody exit {code}: {}",
        summary.join(" | ")
    );
    assert!(
        text.contains(&format!(" {n} runner-caused gaps")),
        "after a publisher's flood of refusals and a kill -9, {unsigned} messages were settled \
         unsigned and the audit does not list all {n} sequences as gaps (and still says \
         COMPLETE: it cannot see a sequence that is in no checkpoint at all): {text}"
    );
}
