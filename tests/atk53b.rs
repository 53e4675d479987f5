//! Attack review atk53b of "Sign first, terminate last" (1d7316f): without a DLQ, `svc-ack`
//! sends the `+TERM` of a message given up on only once a stored custody checkpoint lists it
//! as a gap (`Feed::gap_signed`), NAKing it until then. Each `found_` test asserts what should
//! hold and fails on 1d7316f; each `held_` test passes (the boundary held). Every test prints
//! what it ran and what it saw (`cargo test --test main -- atk53b:: --nocapture`).
//!
//! Found: the TERM now depends on a checkpoint being stored, and a store that is slow, down or
//! confused about what it holds holds every message given up on (a committed INSERT without
//! an answer stalls the chain for the run; a start's rescan; a sink outage behind a fallback
//! spool; no metric says so); a kill -9 inside the first checkpoint's put keeps the runner
//! from starting; a consumer `max_deliver` equal to `max_deliveries` is never terminated.
//! Held: a kill -9 between the signed gap and its TERM, a stop while a gap waits, a broken
//! store recovered, a stream created again with the same sequences, a flood of refusals.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::custody_checkpoints::{case_with, checkpoint_files, publish_range, Case};
use crate::support::broker::*;
use crate::support::postgres::TestDb;
use crate::support::protection::*;
use crate::support::*;

/// What the proxy does to the connection carrying the n-th statement holding its needle.
#[derive(Clone, Copy)]
enum Fault {
    /// The statement reaches the server (which commits it); its answer is dropped and the
    /// connection is cut a second later: the client sees an error for a committed INSERT.
    CutAnswer,
    /// The statement reaches the server; its answer is held back for good (the client waits).
    HoldAnswer,
}

/// A TCP forwarder to PostgreSQL that hurts one statement: the `nth` (from 0) client write
/// holding `needle`.
struct StatementProxy {
    port: u16,
    /// Client writes holding the needle seen so far.
    seen: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl StatementProxy {
    fn start(target: u16, needle: &'static [u8], nth: u64, fault: Fault) -> StatementProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::Builder::new()
            .name("atk53b-proxy".into())
            .spawn(move || {
                while !stop2.load(Ordering::SeqCst) {
                    let Ok((client, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    client.set_nonblocking(false).unwrap();
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                        continue;
                    };
                    let mute = Arc::new(AtomicBool::new(false));
                    let up = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let cut = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let (seen, mute2) = (seen2.clone(), mute.clone());
                    std::thread::spawn(move || {
                        let (mut from, mut to) = up;
                        let mut buf = [0u8; 65536];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let hit = buf[..n].windows(needle.len()).any(|w| w == needle);
                            if hit && seen.fetch_add(1, Ordering::SeqCst) == nth {
                                mute2.store(true, Ordering::SeqCst);
                                if let Fault::CutAnswer = fault {
                                    let (c, s) =
                                        (cut.0.try_clone().unwrap(), cut.1.try_clone().unwrap());
                                    std::thread::spawn(move || {
                                        std::thread::sleep(Duration::from_secs(1));
                                        let _ = c.shutdown(Shutdown::Both);
                                        let _ = s.shutdown(Shutdown::Both);
                                    });
                                }
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Write);
                    });
                    std::thread::spawn(move || {
                        let (mut from, mut to) = (server, client);
                        let mut buf = [0u8; 65536];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if mute.load(Ordering::SeqCst) {
                                continue; // the answer is lost
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        if !mute.load(Ordering::SeqCst) {
                            let _ = to.shutdown(Shutdown::Write);
                        }
                    });
                }
            })
            .unwrap();
        StatementProxy { port, seen, stop }
    }
}

impl Drop for StatementProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

const CHECKPOINT_INSERT: &[u8] = b"INSERT INTO \"svc_custody_checkpoints\"";

/// A PostgreSQL sink through `proxy`, checkpoints every record, a pre-sink size limit of 20
/// bytes (a bigger payload is refused before the sink), no DLQ, `max_deliveries` 2.
fn pg_case(db: &TestDb, proxy: &StatementProxy) -> Case {
    let dsn = format!("postgresql://postgres@127.0.0.1:{}/{}", proxy.port, db.name);
    let sink = db.sink(json!({"dsn": dsn, "statement_timeout_seconds": 2}));
    let c = case_with(
        1,
        move |_| sink,
        json!({"size_policy": {"enabled": true, "max_payload_bytes": 20},
               "delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10, "max_deliveries": 2,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                            "jitter": "none"}}}),
    );
    let (code, out, err) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{out}{err}");
    c
}

fn publish_big(server: &NatsServer) {
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    server.publish_with_headers("orders.big", &[], big.as_bytes());
}

/// Polls `cond` up to `limit`; true when it held.
fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// A consumer state as `(ack floor, ack pending, pending)`, for the figures printed.
fn shown_state(s: (u64, usize, u64)) -> String {
    format!("({}, {}, {})", s.0, s.1, s.2)
}

fn state(c: &Case) -> (u64, usize, u64) {
    c.server
        .try_consumer_state(STREAM, CONSUMER)
        .unwrap_or_default()
}

/// Found (medium). A checkpoint INSERT that PostgreSQL committed but whose answer the runner
/// never saw (a connection cut after the commit: a network blip, a failover proxy, a client
/// deadline) is "not written" to the writer, which keeps its head and cuts the same index
/// again for the rest of the run (a second after a gap, and on every event once
/// `every_records` are pending: 154 refused INSERTs in 30 s here): each is refused (the
/// primary key holds the first). So no checkpoint is stored again in that run, and with sign first, terminate last
/// no message given up on without a DLQ is terminated again: each is NAKed for as long as the
/// runner runs, holding a slot of `max_ack_pending`. The writer never asks the store whether
/// the checkpoint it believes failed is there (`CheckpointStore::get`). Fix: on a failed put,
/// read back (runner, index) and take it as stored when its bytes are the ones just sealed.
#[test]
fn found_a_checkpoint_insert_committed_without_an_answer_stalls_every_termination() {
    let db = TestDb::new("atk53b_cut");
    // The second checkpoint INSERT (checkpoint 1) is committed and its answer lost.
    let proxy = StatementProxy::start(5432, CHECKPOINT_INSERT, 1, Fault::CutAnswer);
    let c = pg_case(&db, &proxy);
    let log = c.dir.path().join("svc.log");
    let runner = start_runner(&c.cfg, &log);
    publish_range(&c.server, 1, 1);
    wait_until(Duration::from_secs(60), "checkpoint 0 stored", || {
        db.count("svc_custody_checkpoints") == 1 && state(&c).0 == 1
    });
    publish_range(&c.server, 2, 2);
    wait_until(
        Duration::from_secs(60),
        "checkpoint 1 committed, its answer lost",
        || {
            db.count("svc_custody_checkpoints") == 2
                && (runner
                    .log_text()
                    .contains("custody checkpoint 1 not written")
                    || runner
                        .log_text()
                        .contains("custody checkpoint 1: the store refused it"))
        },
    );
    publish_big(&c.server); // sequence 3: refused before the sink, a gap
    publish_range(&c.server, 4, 4);
    let terminated = within(Duration::from_secs(30), || state(&c) == (4, 0, 0));
    let text = runner.log_text();
    let not_written = text.matches("not written (kept for the next one)").count();
    eprintln!(
        "atk53b cut: checkpoint INSERTs seen {}, rows {}, consumer (ack floor, ack pending, \
         pending) {} 30 s after sequence 3 was refused; {not_written} lines 'custody \
         checkpoint 1 not written'; sequence 3 terminated: {terminated}",
        proxy.seen.load(Ordering::SeqCst),
        db.count("svc_custody_checkpoints"),
        shown_state(state(&c))
    );
    assert!(
        terminated,
        "sequence 3 (refused before the sink, max_deliveries 2) never terminated: the writer \
         cuts checkpoint 1 again and again, refused; consumer {}; log tail: {}",
        shown_state(state(&c)),
        text.lines().rev().take(6).collect::<Vec<_>>().join(" | ")
    );
}

/// Found (medium). A kill -9 between the FIRST checkpoint's put and its head file's write
/// (the docs: "a crash between the two is fine: the chain then extends the head") leaves a
/// chain of one checkpoint and no head file, which the start reads as "the head file is
/// missing" and refuses for good: the runner does not start again until an operator writes the
/// head file by hand. Here the put is held (its INSERT committed, the answer held back) and the
/// runner killed then. Fix: write the head file (no checkpoint yet) at the first start, so a
/// missing head file beside a chain still means lost, and a chain one checkpoint past the
/// "none yet" head extends it.
#[test]
fn found_a_kill_9_before_the_first_head_file_keeps_the_runner_from_starting_again() {
    let db = TestDb::new("atk53b_hold");
    let proxy = StatementProxy::start(5432, CHECKPOINT_INSERT, 0, Fault::HoldAnswer);
    let c = pg_case(&db, &proxy);
    let head = c.dir.path().join("c.json.custody-head");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    wait_until(Duration::from_secs(60), "checkpoint 0 committed", || {
        db.count("svc_custody_checkpoints") == 1
    });
    runner.sigkill();
    assert!(
        !head.exists()
            || std::fs::read_to_string(&head)
                .unwrap()
                .contains("\"digest\":\"\""),
        "the head file was written with checkpoint 0 before the kill"
    );

    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    publish_range(&c.server, 2, 2);
    let acked = within(Duration::from_secs(30), || {
        state(&c).0 == 2 || runner.child.try_wait().unwrap().is_some()
    }) && state(&c).0 == 2;
    let text = runner.log_text();
    eprintln!(
        "atk53b hold: after a kill -9 inside checkpoint 0's put (row stored, no head file), \
         the restart acked through {}; exited: {}",
        state(&c).0,
        runner
            .child
            .try_wait()
            .unwrap()
            .map_or("no".to_string(), |s| s.to_string())
    );
    if runner.child.try_wait().unwrap().is_none() {
        runner.signal("TERM");
        let _ = runner.wait_timeout(Duration::from_secs(30));
    }
    assert!(
        acked,
        "the runner did not start again after a crash between checkpoint 0 and its head file: {}",
        text.lines()
            .filter(|l| l.contains("head file"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// File sink with checkpoints, a record limit of 2048 bytes (the sink refuses a bigger one for
/// good), no DLQ, `max_deliveries` 2; `consumer` replaces the test consumer.
pub(crate) fn file_case(consumer: Option<nats::jetstream::ConsumerConfig>) -> Case {
    let c = crate::custody_checkpoints::refusing_case(100);
    if let Some(cc) = consumer {
        let js = c.server.js();
        js.delete_consumer(STREAM, CONSUMER).unwrap();
        js.add_consumer(STREAM, cc).unwrap();
    }
    c
}

fn publish_sink_refused(server: &NatsServer) {
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    server.publish_with_headers("orders.big", &[], big.as_bytes());
}

fn gaps_listed(out: &Path) -> Vec<Value> {
    match std::fs::read_dir(out.join(".svc-checkpoints")) {
        Ok(_) => checkpoint_files(out)
            .iter()
            .flat_map(|f| {
                let cp: Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
                let body: Value = serde_json::from_str(cp["signed"].as_str().unwrap()).unwrap();
                body["gaps"].as_array().unwrap().clone()
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Found (low). The consumer's own `max_deliver` equal to `delivery.max_deliveries` (both 2
/// here): the docs promise `+TERM once the delivery count reaches delivery.max_deliveries`
/// (docs/delivery-semantics.md), but the last delivery is now NAKed (its gap not signed yet)
/// and the broker delivers it no more, so it is never terminated: it stays unacknowledged in
/// the stream (`advisory_max_deliveries_total`, not `messages_terminated_total`), and the log
/// says "until a stored custody checkpoint lists it as a gap, then terminated". Fix: hold the
/// handle (in-progress acks) until `gap_signed` instead of NAKing the last delivery, then
/// `+TERM` it; or refuse/warn in validate when `max_deliver` <= `max_deliveries` with
/// checkpoints.
#[test]
fn found_a_message_given_up_at_the_consumers_max_deliver_is_never_terminated() {
    let mut cc = durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 20_000);
    cc.max_deliver = 2;
    let c = file_case(Some(cc));
    let out = c.dir.path().join("out");
    let metrics = c.dir.path().join("metrics.json");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    publish_sink_refused(&c.server);
    publish_range(&c.server, 3, 3);
    wait_until(
        Duration::from_secs(60),
        "sequence 2 listed as a gap",
        || gaps_listed(&out) == vec![json!([2, "terminated"])],
    );
    let terminated = within(Duration::from_secs(15), || {
        snapshot_counter(&metrics, "messages_terminated_total") == 1
    });
    eprintln!(
        "atk53b max_deliver: gap of 2 signed; terminated_total {} nacked_total {} \
         failed_total {} 15 s later; consumer (ack floor, ack pending, pending) {}",
        snapshot_counter(&metrics, "messages_terminated_total"),
        snapshot_counter(&metrics, "messages_nacked_total"),
        snapshot_counter(&metrics, "messages_failed_total"),
        shown_state(state(&c))
    );
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    assert!(
        terminated,
        "sequence 2, refused by the sink on its delivery 2 (= max_deliveries = the consumer's \
         max_deliver), was never terminated: {}",
        runner
            .log_text()
            .lines()
            .filter(|l| l.contains("stream sequence 2"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// Held. The checkpoint store broken while a message is given up on (a regular file planted
/// at `.svc-checkpoints` after the start: every put fails): the message is NAKed, not
/// terminated, and the log says why every second; once the store works again the next cut
/// lists it and the next delivery terminates it. The verifier then reads it as a gap.
#[test]
fn held_a_broken_checkpoint_store_holds_the_term_until_a_checkpoint_lists_the_gap() {
    let c = file_case(None);
    let out = c.dir.path().join("out");
    let log = c.dir.path().join("svc.log");
    let mut runner = start_runner(&c.cfg, &log);
    publish_range(&c.server, 1, 1);
    wait_until(Duration::from_secs(60), "sequence 1 acked", || {
        state(&c) == (1, 0, 0)
    });
    // No checkpoint yet (every_records 100, every_seconds 3600): the first put meets the file.
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    publish_sink_refused(&c.server);
    wait_until(Duration::from_secs(60), "a cut refused", || {
        runner
            .log_text()
            .contains("not written (kept for the next one)")
    });
    std::thread::sleep(Duration::from_secs(4));
    let while_broken = state(&c);
    let failed_lines = runner
        .log_text()
        .matches("not written (kept for the next one)")
        .count();
    eprintln!(
        "atk53b broken store: consumer {} with the store broken; {failed_lines} 'not \
         written' lines in about 4 s",
        shown_state(while_broken)
    );
    assert_eq!(while_broken.0, 1, "sequence 2 terminated unsigned");
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    wait_until(Duration::from_secs(60), "sequence 2 terminated", || {
        state(&c) == (2, 0, 0)
    });
    assert_eq!(gaps_listed(&out), vec![json!([2, "terminated"])]);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("1 runner-caused gaps: COMPLETE"), "{text}");
}

/// The gaps listed by every checkpoint in `out`, with the incarnation of the checkpoint.
fn gaps_by_incarnation(out: &Path) -> Vec<(String, Value)> {
    checkpoint_files(out)
        .iter()
        .flat_map(|f| {
            let cp: Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            let body: Value = serde_json::from_str(cp["signed"].as_str().unwrap()).unwrap();
            let inc = body["stream_incarnation"].as_str().unwrap().to_string();
            let gaps = body["gaps"].as_array().unwrap().clone();
            gaps.into_iter().map(move |g| (inc.clone(), g))
        })
        .collect()
}

/// Held. A kill -9 after the checkpoint listing the gap is stored but before the `+TERM` (the
/// NAK of the last delivery waits 5 s): the restart reads the gap back from the chain and
/// terminates the message on its next delivery, without listing it a second time.
#[test]
fn held_a_kill_9_after_the_gap_is_signed_before_the_term_terminates_it_once_listed() {
    let c = crate::custody_checkpoints::refusing_case(5000);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    publish_sink_refused(&c.server);
    publish_range(&c.server, 3, 3);
    wait_until(Duration::from_secs(60), "sequence 2 listed", || {
        gaps_listed(&out) == vec![json!([2, "terminated"])]
    });
    runner.sigkill();
    let before = state(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    wait_until(Duration::from_secs(60), "sequence 2 terminated", || {
        state(&c) == (3, 0, 0)
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let text = runner.log_text();
    eprintln!(
        "atk53b kill after the cut: consumer {} at the kill, (3, 0, 0) after the restart; \
         gaps listed {}",
        shown_state(before),
        Value::from(gaps_listed(&out))
    );
    assert!(
        text.contains("stream sequence 2 failed permanently on delivery 3"),
        "{text}"
    );
    assert!(text.contains("terminated (delivery.max_deliveries reached)"));
    assert_eq!(gaps_listed(&out), vec![json!([2, "terminated"])]);
    let (code, text) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("1 runner-caused gaps: COMPLETE"), "{text}");
}

/// Held. The stream deleted and created again with the same sequences: the new incarnation's
/// sequence 2, refused by the sink like the old one's, is not terminated on the strength of
/// the old incarnation's signed gap (read back from the chain at start): it is listed again,
/// under its own incarnation, before its `+TERM`.
#[test]
fn held_a_gap_signed_for_an_old_incarnation_does_not_terminate_the_new_ones_message() {
    let c = file_case(None);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    publish_sink_refused(&c.server);
    publish_range(&c.server, 3, 3);
    wait_until(Duration::from_secs(60), "old 2 terminated", || {
        state(&c) == (3, 0, 0)
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let old = c.server.incarnation(STREAM);

    let js = c.server.js();
    js.delete_stream(STREAM).unwrap();
    c.server.create_stream(STREAM, &["orders.>"]);
    c.server
        .create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let new = c.server.incarnation(STREAM);
    assert_ne!(old, new);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    publish_range(&c.server, 1, 1);
    publish_sink_refused(&c.server);
    publish_range(&c.server, 3, 3);
    wait_until(Duration::from_secs(60), "new 2 terminated", || {
        state(&c) == (3, 0, 0)
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let text = runner.log_text();
    let gaps = gaps_by_incarnation(&out);
    let listed: Vec<String> = gaps.iter().map(|(i, g)| format!("{i} {g}")).collect();
    eprintln!(
        "atk53b incarnations: old {old}, new {new}; gaps listed {}",
        listed.join(", ")
    );
    assert!(
        text.contains("stream sequence 2 failed permanently on delivery 2")
            && text.contains("until a stored custody checkpoint lists it as a gap"),
        "{text}"
    );
    assert_eq!(
        gaps,
        vec![
            (old, json!([2, "terminated"])),
            (new, json!([2, "terminated"]))
        ]
    );
    let (code, text) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 runner-caused gaps: COMPLETE"), "{text}");
}

/// Held (figures). A flood of 2,000 messages refused before the sink (`max_deliveries` 1,
/// `every_records` 1000, no DLQ): each NAKed once, listed once, then terminated; the
/// checkpoints stay few (cut at 1000 entries or a second after a gap) and no gap is listed
/// twice.
#[test]
fn held_a_flood_of_refusals_is_listed_once_each_in_few_checkpoints() {
    let c = case_with(
        1000,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "file", "directory": dir.join("out")})
        },
        json!({"size_policy": {"enabled": true, "max_payload_bytes": 20},
               "delivery": {"batch_size": 256, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 4, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10, "max_deliveries": 1,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                            "jitter": "none"}}}),
    );
    let out = c.dir.path().join("out");
    let n = 2000u64;
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    let started = Instant::now();
    c.server.publish_n(STREAM, "orders.flood", n as usize, |i| {
        format!("{{\"pad\":\"{}\",\"i\":{i}}}", "x".repeat(40)).into_bytes()
    });
    wait_until(Duration::from_secs(120), "every refusal terminated", || {
        state(&c) == (n, 0, 0)
    });
    let took = started.elapsed();
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let files = checkpoint_files(&out);
    let gaps = gaps_listed(&out);
    let mut seqs: Vec<u64> = gaps.iter().map(|g| g[0].as_u64().unwrap()).collect();
    seqs.sort();
    seqs.dedup();
    let metrics = c.dir.path().join("metrics.json");
    eprintln!(
        "atk53b flood: {n} refusals terminated in {:.1} s; {} checkpoints, {} gaps listed \
         ({} distinct); terminated_total {}, nacked_total {}",
        took.as_secs_f64(),
        files.len(),
        gaps.len(),
        seqs.len(),
        snapshot_counter(&metrics, "messages_terminated_total"),
        snapshot_counter(&metrics, "messages_nacked_total"),
    );
    assert_eq!(seqs, (1..=n).collect::<Vec<u64>>());
    assert_eq!(gaps.len() as u64, n, "a gap listed twice");
    let (code, text) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2000 runner-caused gaps: COMPLETE"), "{text}");
}

/// Found (low-medium). With sign first, terminate last a checkpoint store that fails (here a
/// file planted at `.svc-checkpoints`; a PostgreSQL role without INSERT on the checkpoint
/// table, a full spool) holds every message given up on in the consumer's
/// `max_ack_pending`: 4 refusals fill a `max_ack_pending` of 4 and the good message after
/// them is not delivered until the store works again. Holding is the design (the `+TERM`
/// waits for its signature); but nothing a monitor reads says why: no counter or gauge of
/// checkpoints not written or of gaps waiting for one (only an error line a second), while
/// the figures it does read (`messages_failed_total`, `messages_nacked_total`) look like any
/// poison message. Fix: a counter of checkpoints not written (and a gauge of gaps waiting for a
/// checkpoint), in the snapshot and the alert rules.
#[test]
fn found_a_broken_checkpoint_store_stalls_delivery_and_no_metric_says_why() {
    let cc = durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 4);
    let c = file_case(Some(cc));
    let out = c.dir.path().join("out");
    let metrics = c.dir.path().join("metrics.json");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_until(Duration::from_secs(60), "sequence 1 acked", || {
        state(&c) == (1, 0, 0)
    });
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    for _ in 2..=5 {
        publish_sink_refused(&c.server);
    }
    publish_range(&c.server, 6, 6);
    wait_until(
        Duration::from_secs(60),
        "4 refusals past their last delivery",
        || {
            runner
                .log_text()
                .matches("until a stored custody checkpoint lists it as a gap")
                .count()
                >= 4
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    let stalled = state(&c);
    let stored: Vec<u64> = records(&out).keys().copied().collect();
    let snapshot: Value =
        serde_json::from_str(&std::fs::read_to_string(&metrics).unwrap()).unwrap();
    let about_checkpoints: Vec<(String, Value)> = snapshot["counters"]
        .as_object()
        .into_iter()
        .chain(snapshot["gauges"].as_object())
        .flat_map(|m| m.iter())
        .filter(|(k, _)| k.contains("checkpoint"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let not_written = runner.log_text().matches("not written (kept").count();
    eprintln!(
        "atk53b stall: store broken: consumer {}, records stored {} (6 published after the \
         4 refusals), {not_written} 'not written' lines; failed_total {} nacked_total {} \
         terminated_total {}; metrics named checkpoint: {}",
        shown_state(stalled),
        Value::from(stored.clone()),
        snapshot_counter(&metrics, "messages_failed_total"),
        snapshot_counter(&metrics, "messages_nacked_total"),
        snapshot_counter(&metrics, "messages_terminated_total"),
        about_checkpoints.len(),
    );
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    wait_until(Duration::from_secs(60), "everything settled", || {
        state(&c) == (6, 0, 0)
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    assert!(
        about_checkpoints
            .iter()
            .any(|(_, v)| v.as_u64().is_some_and(|n| n > 0)),
        "the checkpoint store failed {not_written} times and held 4 messages (and the good one \
         behind them: consumer {}, stored {}), and no counter or gauge of the snapshot says \
         so ({} named checkpoint)",
        shown_state(stalled),
        Value::from(stored),
        about_checkpoints.len()
    );
}

/// Held. A stop (SIGTERM) while a gap waits for a checkpoint the store cannot take: the stop's
/// last cut fails too, the message is left NAKed (not terminated), and the next start, with
/// the store working, lists it and terminates it on its next delivery.
#[test]
fn held_a_stop_while_a_gap_waits_leaves_the_message_for_the_next_start() {
    let c = file_case(None);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    wait_until(Duration::from_secs(60), "sequence 1 acked", || {
        state(&c) == (1, 0, 0)
    });
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    publish_sink_refused(&c.server);
    wait_until(Duration::from_secs(60), "a cut refused", || {
        runner
            .log_text()
            .contains("not written (kept for the next one)")
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let first = runner.log_text();
    let after_stop = state(&c);
    assert_eq!(after_stop.0, 1, "sequence 2 terminated unsigned: {first}");
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    wait_until(Duration::from_secs(60), "sequence 2 terminated", || {
        state(&c) == (2, 0, 0)
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    eprintln!(
        "atk53b stop: consumer {} after the stop with the store broken ({} 'not written' \
         lines in run 1), (2, 0, 0) after the next start; gaps {}",
        shown_state(after_stop),
        first.matches("not written (kept").count(),
        Value::from(gaps_listed(&out))
    );
    assert_eq!(gaps_listed(&out), vec![json!([2, "terminated"])]);
    let (code, text) = crate::custody_checkpoints::verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("1 runner-caused gaps: COMPLETE"), "{text}");
}

/// Found (medium). The checkpoint thread reads the whole store back (`Writer::rescan`) before
/// it cuts its first checkpoint, and svc-ack now waits for a cut to terminate: every message
/// given up on after a start is held for as long as that read takes. Made long here by a lock
/// a DBA's `ALTER TABLE`/`VACUUM FULL` takes on a route's table (the read waits up to
/// `statement_timeout_seconds`, 30 s by default, then fails); a store of millions of records
/// takes minutes to read without any lock (each page under its own timeout). Meanwhile the
/// sink is written and ACKed as usual, so only the refused messages pile up in the consumer's
/// ack pending. Fix: let the thread cut the gaps it is told during the rescan (gap-only
/// checkpoints need nothing the rescan finds), or run the rescan in steps between events.
#[test]
fn found_the_start_rescan_holds_every_termination_for_as_long_as_it_reads() {
    let db = TestDb::new("atk53b_rescan");
    let sink = db.sink(json!({"routes": [{"subject": "orders.archive.>", "table": "archive"}]}));
    let c = case_with(
        100,
        move |_| sink,
        json!({"size_policy": {"enabled": true, "max_payload_bytes": 20},
               "delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10, "max_deliveries": 1,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                            "jitter": "none"}}}),
    );
    let (code, out, err) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{out}{err}");
    let mut lock = db.conn();
    lock.simple("BEGIN; LOCK TABLE archive IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let started = Instant::now();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    publish_big(&c.server);
    publish_range(&c.server, 3, 3);
    wait_until(Duration::from_secs(60), "1 and 3 stored", || {
        db.count("events") == 2
    });
    let stored_after = started.elapsed();
    let terminated = within(Duration::from_secs(15), || state(&c) == (3, 0, 0));
    let held = state(&c);
    lock.simple("COMMIT").unwrap();
    wait_until(Duration::from_secs(60), "sequence 2 terminated", || {
        state(&c) == (3, 0, 0)
    });
    let took = started.elapsed();
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let text = runner.log_text();
    eprintln!(
        "atk53b rescan: 1 and 3 stored {:.1} s after the start; consumer {} 15 s later with \
         the route table locked; sequence 2 terminated {:.1} s after the start, once the lock \
         was gone; rescan failed: {}",
        stored_after.as_secs_f64(),
        shown_state(held),
        took.as_secs_f64(),
        text.contains("the rescan of the records failed")
    );
    assert!(
        terminated,
        "sequence 2, refused before the sink on its last delivery, waited for the start's \
         rescan (blocked on the locked route table) while 1 and 3 were written and ACKed: \
         consumer {}",
        shown_state(held)
    );
}

/// Found (medium). A fallback `spool` block keeps the runner taking messages while its sink is
/// down; but the sink's checkpoint store is down with it, so with sign first, terminate last
/// every message given up on during the outage is NAKed until the sink is back. They pile up
/// in the consumer's `max_ack_pending` (4 here; at the default 2048, one refusal in a thousand
/// fills it after about two million messages of an outage) and then the broker delivers
/// nothing more: the spool, there for the outage, takes no good message. Before 1d7316f each
/// was terminated at `max_deliveries`. Fix: with a spool block, a checkpoint the sink's store
/// refuses goes into the spool as a CHECKPOINT frame (as with `sink.type: spool`), put into
/// the store by the drain; or gap-only checkpoints go there.
#[test]
fn found_a_sink_outage_with_a_fallback_spool_stalls_on_refusals_waiting_for_a_checkpoint() {
    let c = case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "file", "directory": dir.join("out")})
        },
        json!({"spool": {"max_bytes": 64 << 20, "after_seconds": 0, "allow_unencrypted": true,
                         "max_backoff_seconds": 1, "dir": "SPOOL"},
               "size_policy": {"enabled": true, "max_payload_bytes": 20},
               "delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10, "max_deliveries": 1,
                            "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                            "jitter": "none"}}}),
    );
    let spool = c.dir.path().join("spool");
    let text = std::fs::read_to_string(&c.cfg).unwrap();
    std::fs::write(&c.cfg, text.replace("\"SPOOL\"", &json!(spool).to_string())).unwrap();
    let js = c.server.js();
    js.delete_consumer(STREAM, CONSUMER).unwrap();
    js.add_consumer(
        STREAM,
        durable_config(CONSUMER, "orders.>", Duration::from_secs(30), 4),
    )
    .unwrap();
    let out = c.dir.path().join("out");
    let away = c.dir.path().join("out.away");
    let metrics = c.dir.path().join("metrics.json");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_until(Duration::from_secs(60), "sequence 1 acked", || {
        state(&c) == (1, 0, 0)
    });
    std::fs::rename(&out, &away).unwrap(); // the sink (and its checkpoint store) is down
    for _ in 2..=5 {
        publish_big(&c.server);
    }
    publish_range(&c.server, 6, 8);
    let spooled = within(Duration::from_secs(15), || {
        snapshot_counter(&metrics, "spool_appended_total") >= 3
    });
    let during = state(&c);
    let appended = snapshot_counter(&metrics, "spool_appended_total");
    let not_written = runner.log_text().matches("not written (kept").count();
    std::fs::rename(&away, &out).unwrap();
    wait_until(Duration::from_secs(60), "everything settled", || {
        state(&c) == (8, 0, 0)
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    eprintln!(
        "atk53b spool: sink down 15 s: consumer {}, spool_appended_total {appended} (3 good \
         published after 4 refusals), {not_written} 'not written' lines; all settled once the \
         sink was back",
        shown_state(during)
    );
    assert!(
        spooled,
        "during the outage the 4 refusals, waiting for a checkpoint the sink's store could not \
         take, filled max_ack_pending and the spool took none of the 3 good messages after \
         them: consumer {}, spool_appended_total {appended}",
        shown_state(during)
    );
}
