//! atk57: attacks on 3cd538a (with custody checkpoints the runner lists each stream sequence a
//! `MAX_DELIVERIES` advisory of its consumer names as a gap `abandoned_at_max_deliver`:
//! `broker::advisory::Watch`, `pipeline::tell_abandoned`). The advisory subject is a core NATS
//! subject: any client of the account allowed to publish on `$JS.EVENT.ADVISORY.>` can send
//! the runner a body the broker never sent. docs/payload-protection.md says such a forged
//! advisory can add a gap for a sequence, nothing more. Attacked here: what a *flood* of them
//! does to the checkpoint writer, its store and the gaps the runner tells for real.
//!
//! `found_...`: a finding's reproduction; it fails on 67fbd95 and says what it expected.
//! Found: a flood while the store fails writes an unreadable checkpoint (high); a flood drops
//! real gaps (medium, rate-dependent); a flood evicts a dead letter's signed gap and the message
//! is NAKed for good (medium).
//! `held_...`: an attack that held (passes). Each prints what it ran and what it saw
//! (`cargo test --test main -- atk57:: --nocapture`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::atk55::{gaps_with_reasons, stored};
use crate::custody_checkpoints::{checkpoint_files, publish_range, wait_acked, Case};
use crate::support::broker::durable_config;
use crate::support::protection::*;
use crate::support::snapshot_counter;

/// The largest stored checkpoint any reader takes (`MAX_CHECKPOINT_BYTES`, 16 MiB).
const MAX_CHECKPOINT_BYTES: u64 = 16 << 20;

/// A file sink (records over 2048 bytes refused for good, no DLQ) with checkpoints every
/// `every_records`, advisories counted (the forged ones the runner took show in its metrics),
/// the durable re-created with `max_deliver`.
fn case(every_records: u64, max_deliver: i64) -> Case {
    let c = crate::custody_checkpoints::case_with(
        every_records,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            serde_json::json!({"type": "file", "directory": dir.join("out"),
                               "max_record_bytes": 2048})
        },
        serde_json::json!({"advisories": {"enabled": true},
                           "delivery": crate::atk55::last_delivery_pace()}),
    );
    let js = c.server.js();
    js.delete_consumer(STREAM, CONSUMER).unwrap();
    let mut cc = durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 1000);
    cc.max_deliver = max_deliver;
    js.add_consumer(STREAM, cc).unwrap();
    c
}

fn out(c: &Case) -> std::path::PathBuf {
    c.dir.path().join("out")
}

/// Polls `cond` every 100 ms for at most `limit`; whether it came true (reported, not asserted).
fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    cond()
}

/// The MAX_DELIVERIES advisories the runner took as its consumer's (its metrics snapshot).
fn counted(c: &Case) -> u64 {
    snapshot_counter(
        &c.dir.path().join("metrics.json"),
        "advisory_max_deliveries_total",
    )
}

/// A forged `max_deliver` advisory of the runner's own stream and consumer, naming `seq`.
fn forged(seq: u64) -> Vec<u8> {
    format!(
        "{{\"type\":\"io.nats.jetstream.advisory.v1.max_deliver\",\"id\":\"x\",\
         \"timestamp\":\"2026-11-30T00:00:00Z\",\"stream\":\"{STREAM}\",\"consumer\":\
         \"{CONSUMER}\",\"stream_seq\":{seq},\"deliveries\":1}}"
    )
    .into_bytes()
}

fn advisory_subject() -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.{CONSUMER}")
}

/// A second client of the account publishes forged advisories, sequences `from`, `from + 1`,
/// ..., in chunks of 2000 (flushed), until `stop` says so; returns how many it published.
fn flood(c: &Case, from: u64, mut stop: impl FnMut(u64) -> bool) -> u64 {
    let nc = c.server.connect();
    let subject = advisory_subject();
    let mut n = 0u64;
    loop {
        for _ in 0..2000 {
            nc.publish(&subject, forged(from + n)).unwrap();
            n += 1;
        }
        nc.flush().unwrap();
        if stop(n) {
            return n;
        }
    }
}

/// Peak resident set of a process (`VmHWM`, KiB), 0 when unknown.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn audit(c: &Case) -> (i32, String) {
    let (code, text) = crate::custody_checkpoints::verify(c, &[c.public.to_str().unwrap()]);
    let summary = text
        .lines()
        .filter(|l| l.contains("checkpoints (") || l.contains("refused"))
        .take(3)
        .collect::<Vec<_>>()
        .join(" | ");
    (code, summary)
}

fn sizes(o: &Path) -> Vec<u64> {
    if !o.join(".svc-checkpoints").is_dir() {
        return Vec::new();
    }
    checkpoint_files(o)
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .collect()
}

/// FOUND (class 8, amplification, with class 2: a store outage at the worst moment. Severity
/// high: a client of the account allowed to publish on `$JS.EVENT.ADVISORY.>` stops the runner
/// for good, and the only way back breaks the audited chain). Each forged `max_deliver`
/// advisory is one gap held in memory by `svc-checkpoint` (`Writer::gaps`, no bound) until a
/// checkpoint is stored; while the checkpoint store fails (here a file planted at
/// `.svc-checkpoints`, as atk56 did; a database or object store down does the same) nothing
/// leaves. Once the store is back, every gap goes into ONE checkpoint, written whatever its size
/// (`FileStore::put` has no bound), larger than `MAX_CHECKPOINT_BYTES` (16 MiB) that every
/// reader enforces: the restart cannot read its own chain back and refuses to start, and
/// `svc verify-custody` refuses the checkpoint. Expected: every stored checkpoint within the
/// bound and the runner starting again. Fix: bound the gaps one checkpoint lists (cut several
/// checkpoints, each within the bound, or stop taking gaps past a bound while the store fails,
/// counted and logged), and bound what a forged flood can add at all: keep at most one
/// advisory gap per sequence the runner has seen delivered, or at or below the consumer's
/// delivered stream sequence (a gap past the stream's last sequence is forged).
#[test]
fn found_a_forged_advisory_flood_while_the_store_fails_writes_a_checkpoint_no_start_can_read() {
    let c = case(100, -1);
    let o = out(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    // No checkpoint yet (every 100 records): the store fails from its first put.
    std::fs::write(o.join(".svc-checkpoints"), b"planted").unwrap();
    let target = 480_000u64;
    let begun = Instant::now();
    let mut checked = Instant::now();
    let published = flood(&c, 1_000_000_000_000_000_000, |n| {
        if checked.elapsed() >= Duration::from_secs(1) {
            checked = Instant::now();
            if counted(&c) >= target || begun.elapsed() > Duration::from_secs(300) {
                return true;
            }
        }
        // Stay near the runner's pace: the client's queue drops what it cannot hold.
        if n > counted(&c) + 200_000 {
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    let flood_secs = begun.elapsed().as_secs_f64();
    within(Duration::from_secs(5), || false);
    let taken = counted(&c);
    std::fs::remove_file(o.join(".svc-checkpoints")).unwrap();
    let cut = within(Duration::from_secs(120), || !sizes(&o).is_empty());
    let rss = peak_rss_kib(runner.child.id());
    runner.signal("TERM");
    let stopped = runner.wait_timeout(Duration::from_secs(120));
    let sz = sizes(&o);
    let (vcode, summary) = audit(&c);
    let mut again = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    let exited = again.wait_timeout(Duration::from_secs(30));
    let refusal = again
        .log_text()
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("error"))
        .take(2)
        .collect::<Vec<_>>()
        .join(" | ");
    eprintln!(
        "atk57 forged flood while the store fails: published {published} in {flood_secs:.1} s, \
         taken by the runner {taken}; store back, checkpoint cut {cut}; runner peak RSS {rss} \
         KiB; stop {stopped:?}; checkpoint sizes {sz:?} (bound {MAX_CHECKPOINT_BYTES}); \
         verify-custody exit {vcode}: {summary}; restart: exited {exited:?}: {refusal}"
    );
    if exited.is_none() {
        again.signal("TERM");
        again.wait_timeout(Duration::from_secs(60));
    }
    assert!(
        cut,
        "no checkpoint stored after the store came back (setup)"
    );
    assert!(
        sz.iter().all(|s| *s <= MAX_CHECKPOINT_BYTES) && exited.is_none(),
        "{taken} forged max_deliver advisories taken while the checkpoint store failed: stored \
         checkpoint sizes {sz:?} (readers take {MAX_CHECKPOINT_BYTES} at most); verify-custody \
         exit {vcode}: {summary}; the restart exited {exited:?}: {refusal}"
    );
}

/// FOUND (class 8, amplification, with class 12: the advisories the runner took against the
/// gaps it listed. Severity medium: a client of the account allowed to publish on
/// `$JS.EVENT.ADVISORY.>` makes real gaps vanish: messages stored nowhere, listed nowhere, the
/// audit COMPLETE). The forged advisories go into the checkpoint thread's bounded channel
/// (`Feed::send`, 65,536 events) as fast as the observer parses them; full, it drops events
/// silently (`Feed::dropped` is exported nowhere, not logged). A dropped record is found again
/// by the rescan the overflow starts; a dropped gap is not (the rescan reads records only).
/// Here checkpoints every record (a store whose put takes milliseconds, as a remote one does),
/// a consumer with `max_deliver` 1, no DLQ, and ten messages the sink refuses for good (over
/// `max_record_bytes`) published during a flood: each is told three times (the refusal, the
/// NAK on the last delivery, the broker's real advisory), and all three tells can be dropped.
/// Rate-dependent: on 67fbd95 one run (three tests at once) dropped 255 events and lost none;
/// the next (alone) dropped 19,815 and lost 7..=11; with an 8 s warm-up, 40,268 dropped, 10
/// and 11 lost. Expected: every refused message listed.
/// Fix: never drop a gap (keep gaps apart from the records' channel, or re-tell until
/// `gap_signed`), export `Feed::dropped`, and keep a forged flood out of the channel the sink
/// workers use (an advisory gap for a sequence never delivered to this runner is forged).
#[test]
fn found_a_forged_advisory_flood_drops_the_gaps_of_real_refusals() {
    let c = case(1, 1);
    let o = out(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    std::thread::scope(|s| {
        let (stop2, published2, c2) = (stop.clone(), published.clone(), &c);
        s.spawn(move || {
            let n = flood(c2, 1_000_000_000_000, |_| stop2.load(Ordering::Relaxed));
            published2.store(n, Ordering::Relaxed);
        });
        // The flood has filled the channel by now; then ten refusals, 2..=11.
        std::thread::sleep(Duration::from_secs(8));
        for _ in 0..10 {
            c.server
                .publish_with_headers("orders.big", &[], big.as_bytes());
            std::thread::sleep(Duration::from_millis(300));
        }
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
    });
    let drained = within(Duration::from_secs(120), || {
        c.server
            .try_consumer_state(STREAM, CONSUMER)
            .is_some_and(|s| s.1 == 0 && s.2 == 0)
    });
    let taken = counted(&c);
    runner.signal("TERM");
    let stopped = runner.wait_timeout(Duration::from_secs(300));
    let gaps = gaps_with_reasons(&o);
    let forged_listed = gaps.iter().filter(|g| g.0 >= 1_000_000_000_000).count();
    let kept = stored(&o);
    let lost: Vec<u64> = (2..=11)
        .filter(|s| !kept.contains(s) && !gaps.iter().any(|g| g.0 == *s))
        .collect();
    let (vcode, summary) = audit(&c);
    eprintln!(
        "atk57 forged flood over real refusals (max_deliver 1, no DLQ): published {}, taken by \
         the runner {taken}, forged gaps listed {forged_listed} ({} dropped); consumer {:?} \
         (drained {drained}); stop {stopped:?}; refusals 2..=11 lost {lost:?}; verify-custody \
         exit {vcode}: {summary}",
        published.load(Ordering::Relaxed),
        taken.saturating_sub(forged_listed as u64),
        c.server.try_consumer_state(STREAM, CONSUMER)
    );
    assert!(
        lost.is_empty(),
        "refused messages {lost:?} (max_deliver 1, no DLQ) were given up on during a flood of \
         forged advisories: stored nowhere, listed as a gap by no checkpoint ({} forged gaps \
         taken were not listed either: the channel dropped them); verify-custody exit {vcode}: \
         {summary}",
        taken.saturating_sub(forged_listed as u64)
    );
}

/// HELD (class 12 with class 7: names that almost match). Forged `max_deliver` advisories on
/// the runner's subject whose body names the stream or consumer in another case (`orders`,
/// `SVC`), another consumer, a wildcard (`*`), a sequence 0, negative, fractional, as a
/// string, or over 4 KiB: none is listed as a gap (`abandoned_sequence` compares exactly).
/// One well-formed forgery among them is listed, as the docs say.
#[test]
fn held_forged_advisories_with_near_names_are_ignored() {
    let c = case(100, -1);
    let o = out(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let nc = c.server.connect();
    let subject = advisory_subject();
    let body = |stream: &str, consumer: &str, seq: &str, pad: usize| {
        format!(
            "{{\"type\":\"io.nats.jetstream.advisory.v1.max_deliver\",\"stream\":\"{stream}\",\
             \"consumer\":\"{consumer}\",\"stream_seq\":{seq},\"deliveries\":1,\"pad\":\"{}\"}}",
            "x".repeat(pad)
        )
    };
    let bad = [
        body("orders", CONSUMER, "101", 0),
        body(STREAM, "SVC", "102", 0),
        body(STREAM, "other", "103", 0),
        body("*", CONSUMER, "104", 0),
        body(STREAM, "*", "105", 0),
        body(STREAM, CONSUMER, "0", 0),
        body(STREAM, CONSUMER, "-106", 0),
        body(STREAM, CONSUMER, "107.5", 0),
        body(STREAM, CONSUMER, "\"108\"", 0),
        body(STREAM, CONSUMER, "109", 5000),
    ];
    for b in &bad {
        nc.publish(&subject, b).unwrap();
    }
    nc.publish(&subject, body(STREAM, CONSUMER, "110", 0))
        .unwrap();
    nc.flush().unwrap();
    let listed = within(Duration::from_secs(30), || {
        gaps_with_reasons(&o).iter().any(|g| g.0 == 110)
    });
    runner.signal("TERM");
    runner.wait_timeout(Duration::from_secs(60));
    let gaps = gaps_with_reasons(&o);
    let (vcode, summary) = audit(&c);
    eprintln!(
        "atk57 near-name forgeries: well-formed 110 listed {listed}; gaps {gaps:?}; \
         verify-custody exit {vcode}: {summary}"
    );
    assert!(listed, "the well-formed forgery 110 was not listed (setup)");
    let wrong: Vec<&(u64, String)> = gaps.iter().filter(|g| g.0 != 110).collect();
    assert!(wrong.is_empty(), "near-name forgeries listed: {wrong:?}");
}

/// FOUND (class 8, amplification, with class 12: the signed gaps in memory against the chain.
/// Severity medium: a client of the account allowed to publish on `$JS.EVENT.ADVISORY.>`
/// makes a dead-lettered message stay unacknowledged for good, redelivered and NAKed without
/// end, holding one of the consumer's `max_ack_pending` slots; a flood repeated pins them
/// all). `svc-ack` acknowledges a dead-lettered message once `Feed::gap_signed` says a stored
/// checkpoint lists it; until then it is held and NAKed (`gap_hold.rs`), and its gap is told
/// once only (a redelivery of a held message is not published or told again:
/// `AckWorker::confirmed_before`). `SignedGaps` remembers the newest 65,536 signed gaps: a
/// flood of forged advisories signed between the dead letter's checkpoint and the message's
/// next delivery pushes its gap out, and every delivery after that finds it held and not
/// signed: NAKed again, forever (the consumer's `max_deliver` is unlimited here, the default).
/// Here a DLQ, a NAK delay of 45 s, message 2 refused (over `size_policy`) and dead-lettered,
/// its gap signed; then 70,000 forged advisories before its redelivery. Expected: 2
/// acknowledged once its redelivery comes (its gap is in a stored checkpoint). On 67fbd95:
/// 82,074 forged gaps listed, 2 NAKed on each of 4 deliveries in 150 s, never acknowledged;
/// the control (the same run with about 26,000 forged gaps, under the 65,536 remembered)
/// acknowledged 2 at its first redelivery. Fix: a held
/// message whose gap is no longer remembered must be told again (the writer lists it once
/// more, cheap) or looked up in what the writer knows was stored; better, keep forged gaps out
/// of `SignedGaps` (advisory gaps for sequences never delivered to this runner are forged).
#[test]
fn found_a_forged_advisory_flood_leaves_a_dead_lettered_message_unacknowledged_for_good() {
    let c = crate::custody_checkpoints::case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            serde_json::json!({"type": "file", "directory": dir.join("out")})
        },
        serde_json::json!({"advisories": {"enabled": true},
               "size_policy": {"enabled": true, "max_payload_bytes": 20},
               "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT,
                               "expected_stream": "DLQ", "publish_timeout_ms": 1000},
               "delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 45000,
                                            "jitter": "none"}}}),
    );
    let mut dlq = crate::support::broker::stream_config("DLQ", &[DLQ_SUBJECT]);
    dlq.duplicate_window = 120_000_000_000;
    c.server.js().add_stream(dlq).unwrap();
    let o = out(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    let signed = within(Duration::from_secs(30), || {
        gaps_with_reasons(&o).iter().any(|g| g.0 == 2)
    });
    let before = counted(&c);
    let begun = Instant::now();
    let mut checked = Instant::now();
    let published = flood(&c, 1_000_000_000_000, |n| {
        if checked.elapsed() >= Duration::from_secs(1) {
            checked = Instant::now();
            if counted(&c) >= before + 70_000 || begun.elapsed() > Duration::from_secs(40) {
                return true;
            }
        }
        if n > counted(&c) + 100_000 {
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    let flood_secs = begun.elapsed().as_secs_f64();
    let taken = counted(&c) - before;
    let acked = within(Duration::from_secs(150), || {
        c.server.try_consumer_state(STREAM, CONSUMER) == Some((2, 0, 0))
    });
    let state = c.server.try_consumer_state(STREAM, CONSUMER);
    let metrics = c.dir.path().join("metrics.json");
    runner.signal("TERM");
    runner.wait_timeout(Duration::from_secs(120));
    let listed = gaps_with_reasons(&o);
    let two: Vec<&(u64, String)> = listed.iter().filter(|g| g.0 == 2).collect();
    let forged_listed = listed.iter().filter(|g| g.0 >= 1_000_000_000_000).count();
    eprintln!(
        "atk57 dead letter then forged flood: 2's gap signed {signed} ({two:?}); flood \
         published {published} in {flood_secs:.1} s, taken {taken}, forged gaps listed \
         {forged_listed}; after the 45 s NAK delay: acknowledged {acked}, consumer {state:?}; \
         NAKs {}, gap waits {}, DLQ copies {}",
        snapshot_counter(&metrics, "messages_nacked_total"),
        snapshot_counter(&metrics, "checkpoint_gap_waits_total"),
        c.server.stream_messages("DLQ"),
    );
    assert!(signed, "2's dead_lettered gap was never signed (setup)");
    assert!(
        acked,
        "message 2, dead-lettered and its gap signed ({two:?}), was never acknowledged after \
         {taken} forged advisories were signed before its redelivery: consumer {state:?} (it \
         is held, NAKed on each delivery, without end)"
    );
}
