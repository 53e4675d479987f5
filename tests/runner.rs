//! The runner end to end against a real `nats-server -js`: commit first, ACK last.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";

/// A runner config for `server` writing files to `out` and a snapshot into `dir`.
fn config(
    server: &NatsServer,
    dir: &Path,
    out: &Path,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": SUBJECT},
        "delivery": {"batch_size": 64, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "sink_workers": 2, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": {"type": "file", "directory": out},
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"), "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    if let serde_json::Value::Object(extra) = extra {
        for (k, v) in extra {
            match (cfg.get_mut(&k), v) {
                (Some(serde_json::Value::Object(base)), serde_json::Value::Object(patch)) => {
                    base.extend(patch);
                }
                (_, v) => cfg[k] = v,
            }
        }
    }
    cfg
}

fn setup(n: usize) -> (NatsServer, tempfile::TempDir) {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    (server, tempfile::tempdir().unwrap())
}

/// Stream sequence -> file content, for every stored record.
fn stored(out: &Path) -> BTreeMap<u64, Vec<u8>> {
    files_below(out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let bytes = std::fs::read(out.join(&p)).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{} is not a complete JSON record: {e}", p.display()));
            (v["stream_sequence"].as_u64().unwrap(), bytes)
        })
        .collect()
}

/// The sequences still in a work-queue stream (never acknowledged), read through a new
/// consumer after the runner's durable is deleted (a work queue admits one consumer per
/// subject). Batched pulls: far faster than one direct get per sequence.
fn unacked_sequences(server: &NatsServer) -> BTreeSet<u64> {
    let js = server.js();
    js.delete_consumer(STREAM, CONSUMER).unwrap();
    let expected = server.stream_messages(STREAM) as usize;
    server.create_consumer(STREAM, "audit", SUBJECT, Duration::from_secs(60));
    let sub = js
        .pull_subscribe_with_options(
            SUBJECT,
            &nats::jetstream::PullSubscribeOptions::new()
                .bind_stream(STREAM.into())
                .durable_name("audit".into()),
        )
        .unwrap();
    let mut seen = BTreeSet::new();
    while seen.len() < expected {
        let before = seen.len();
        for m in sub.timeout_fetch(1000, Duration::from_secs(2)).unwrap() {
            let Ok(m) = m else { break };
            if let Some(info) = m.jetstream_message_info() {
                seen.insert(info.stream_seq);
            }
        }
        assert!(
            seen.len() > before,
            "audit stalled at {}/{expected}",
            seen.len()
        );
    }
    seen
}

fn all_acked(server: &NatsServer, n: u64) -> bool {
    server.try_consumer_state(STREAM, CONSUMER) == Some((n, 0, 0))
}

#[test]
fn n_published_are_n_stored_and_acked() {
    let n = 500;
    let (server, dir) = setup(n);
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), &out, json!({})),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));

    wait_until(Duration::from_secs(30), "every message acked", || {
        all_acked(&server, n as u64)
    });
    let records = stored(&out);
    assert_eq!(records.len(), n, "one file per message");
    assert_eq!(
        records.keys().copied().collect::<Vec<_>>(),
        (1..=n as u64).collect::<Vec<_>>()
    );
    let first: serde_json::Value = serde_json::from_slice(&records[&1]).unwrap();
    assert_eq!(first["payload"], json!({"order": 0}));
    assert_eq!(first["subject"], "orders.created");
    // Every thread has a name of its own (a thread dump reads), the broker client's too;
    // only the main thread is called `svc`.
    let tasks = format!("/proc/{}/task", runner.child.id());
    let names: Vec<String> = std::fs::read_dir(&tasks)
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    assert_eq!(names.iter().filter(|n| *n == "svc").count(), 1, "{names:?}");
    for name in [
        "svc-fetch",
        "svc-ack",
        "svc-sink-1",
        "nats-client",
        "nats-flusher",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }

    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits after SIGTERM");
    assert!(status.success(), "clean exit: {}", runner.log_text());
    assert!(
        !runner.log_text().contains("max_ack_pending"),
        "no limit warning for an unlimited consumer: {}",
        runner.log_text()
    );
    let snap = dir.path().join("metrics.json");
    assert_eq!(snapshot_counter(&snap, "messages_fetched_total"), n as u64);
    assert_eq!(snapshot_counter(&snap, "messages_written_total"), n as u64);
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), n as u64);
    assert_eq!(snapshot_counter(&snap, "sink_write_errors_total"), 0);
}

#[test]
fn failing_sink_acks_nothing_then_redelivery_stores_once() {
    let n = 50;
    let (server, dir) = setup(n);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // A regular file where the key namespace directory must go: every write fails.
    let blocker = out.join("idempotency-key");
    std::fs::write(&blocker, b"in the way").unwrap();
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), &out, json!({})),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));

    let snap = dir.path().join("metrics.json");
    wait_until(Duration::from_secs(20), "write errors and NAKs", || {
        snapshot_counter(&snap, "sink_write_errors_total") >= n as u64
            && snapshot_counter(&snap, "messages_nacked_total") >= n as u64
    });
    let (floor, _, _) = server.consumer_state(STREAM, CONSUMER);
    assert_eq!(floor, 0, "nothing acknowledged while the sink fails");
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), 0);

    std::fs::remove_file(&blocker).unwrap();
    wait_until(Duration::from_secs(30), "redelivered and acked", || {
        all_acked(&server, n as u64)
    });
    assert_eq!(stored(&out).len(), n, "each message stored once");
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .unwrap()
        .success());
}

#[test]
fn sigkill_and_restart_stores_everything_without_rewriting() {
    let n = 3000;
    let (server, dir) = setup(n);
    let out = dir.path().join("out");
    let cfg_value = config(
        &server,
        dir.path(),
        &out,
        json!({"delivery": {"batch_size": 32, "max_in_flight_batches": 2}}),
    );
    let cfg = write_config(dir.path(), "c.json", &cfg_value);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc1.log"));
    wait_until(Duration::from_secs(30), "some files written", || {
        files_below(&out).len() >= 300
    });
    runner.sigkill();
    let before = stored(&out);
    assert!(
        before.len() < n,
        "killed mid-stream ({} of {n} stored)",
        before.len()
    );

    let mut runner = Runner::start(&cfg, &dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(60), "all acked after restart", || {
        all_acked(&server, n as u64)
    });
    let after = stored(&out);
    assert_eq!(after.len(), n, "every message has its file");
    for (seq, bytes) in &before {
        assert_eq!(
            &after[seq], bytes,
            "file of sequence {seq} rewritten with different bytes"
        );
    }
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .unwrap()
        .success());
}

#[test]
fn broker_killed_and_restarted_mid_stream() {
    let n = 3000;
    let (mut server, dir) = setup(n);
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(
            &server,
            dir.path(),
            &out,
            json!({"delivery": {"batch_size": 16, "max_in_flight_batches": 2}}),
        ),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "some files written", || {
        files_below(&out).len() >= 200
    });
    server.kill();
    std::thread::sleep(Duration::from_millis(500));
    server.restart();
    wait_until(
        Duration::from_secs(90),
        "all acked after broker restart",
        || all_acked(&server, n as u64),
    );
    assert_eq!(stored(&out).len(), n, "every message stored");
    let snap = dir.path().join("metrics.json");
    wait_until(Duration::from_secs(5), "reconnect counted", || {
        snapshot_counter(&snap, "broker_connection_reconnects_total") >= 1
    });
    runner.signal("TERM");
    assert!(
        runner
            .wait_timeout(Duration::from_secs(15))
            .unwrap()
            .success(),
        "{}",
        runner.log_text()
    );
}

#[test]
fn sigterm_mid_stream_exits_cleanly_and_never_acks_unwritten() {
    // A work-queue stream deletes a message when it is acknowledged: afterwards the stream
    // tells exactly which sequences were acked, and each of those must have its record.
    let n = 20_000;
    let server = NatsServer::start();
    server
        .js()
        .add_stream(nats::jetstream::StreamConfig {
            name: STREAM.into(),
            subjects: vec!["orders.>".into()],
            retention: nats::jetstream::RetentionPolicy::WorkQueue,
            storage: nats::jetstream::StorageType::File,
            ..Default::default()
        })
        .unwrap();
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), &out, json!({})),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "some files written", || {
        files_below(&out).len() >= 500
    });
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(15))
        .expect("bounded shutdown");
    assert!(status.success(), "{}", runner.log_text());
    let records = stored(&out);
    let left = unacked_sequences(&server);
    let acked: Vec<u64> = (1..=n as u64).filter(|seq| !left.contains(seq)).collect();
    // The stop landed mid-stream: some messages were acked, and some were not even written.
    assert!(!acked.is_empty(), "nothing acked before the stop");
    assert!(
        records.len() < n && server.stream_messages(STREAM) > 0,
        "the run finished before SIGTERM: {} records, nothing left to prove",
        records.len()
    );
    for seq in &acked {
        assert!(
            records.contains_key(seq),
            "sequence {seq} acked but not written"
        );
    }
    let snap = dir.path().join("metrics.json");
    assert_eq!(
        snapshot_counter(&snap, "messages_acked_total"),
        acked.len() as u64
    );
    assert!(runner.log_text().contains("stop requested"));
}

#[test]
fn two_runners_share_one_durable_consumer() {
    let n = 4000;
    // Publish only once both runners are bound: at full speed one runner drains 4000
    // messages before a second one started later has even connected.
    let (server, dir) = setup(0);
    let out = dir.path().join("out");
    let mut runners = Vec::new();
    for i in 0..2 {
        let mut c = config(
            &server,
            dir.path(),
            &out,
            json!({"delivery": {"batch_size": 32}}),
        );
        c["metrics"]["snapshot_file"] = json!(dir.path().join(format!("m{i}.json")));
        let cfg = write_config(dir.path(), &format!("c{i}.json"), &c);
        runners.push(Runner::start(&cfg, &dir.path().join(format!("svc{i}.log"))));
    }
    for r in &runners {
        wait_until(Duration::from_secs(20), "runner bound", || {
            r.log_text().contains("bound to consumer")
        });
    }
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    wait_until(Duration::from_secs(60), "all acked", || {
        all_acked(&server, n as u64)
    });
    assert_eq!(stored(&out).len(), n, "every message stored once");
    for r in &runners {
        r.signal("TERM");
    }
    let mut acked = Vec::new();
    for (i, r) in runners.iter_mut().enumerate() {
        assert!(r.wait_timeout(Duration::from_secs(15)).unwrap().success());
        acked.push(snapshot_counter(
            &dir.path().join(format!("m{i}.json")),
            "messages_acked_total",
        ));
    }
    assert!(
        acked.iter().all(|a| *a > 0),
        "both runners took part: {acked:?}"
    );
    assert!(acked.iter().sum::<u64>() >= n as u64, "{acked:?}");
}

#[test]
fn sigusr1_logs_a_pipeline_dump_without_stopping() {
    let (server, dir) = setup(10);
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), &out, json!({})),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(20), "acked", || all_acked(&server, 10));
    runner.signal("USR1");
    wait_until(Duration::from_secs(5), "dump in the log", || {
        runner.log_text().contains("pipeline dump")
    });
    let log = runner.log_text();
    for needle in [
        "svc-fetch",
        "svc-normalize",
        "svc-sink-1",
        "svc-ack",
        "svc-fetch -> svc-normalize",
        "batches in flight",
        "last ack",
    ] {
        assert!(log.contains(needle), "dump lacks {needle:?}:\n{log}");
    }
    server.publish_n(STREAM, "orders.created", 5, |_| b"{}".to_vec());
    wait_until(
        Duration::from_secs(20),
        "still delivering after the dump",
        || all_acked(&server, 15),
    );
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .unwrap()
        .success());
}

#[test]
fn missing_consumer_is_a_clear_error_or_created_on_request() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), &out, json!({})),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    let status = runner.wait_timeout(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(1));
    assert!(
        runner
            .log_text()
            .contains("does not exist (create it, or set nats.consumer_mode to \"create\")"),
        "{}",
        runner.log_text()
    );

    let cfg = write_config(
        dir.path(),
        "c2.json",
        &config(
            &server,
            dir.path(),
            &out,
            // 100 < 4 batches x 64 in flight: works, with a warning at start.
            json!({"nats": {"create_consumer": true, "ack_wait_seconds": 7, "max_ack_pending": 100}}),
        ),
    );
    server.publish_n(STREAM, "orders.created", 3, |_| b"{}".to_vec());
    let mut runner = Runner::start(&cfg, &dir.path().join("svc2.log"));
    wait_until(
        Duration::from_secs(20),
        "acked via created consumer",
        || all_acked(&server, 3),
    );
    let info = server.js().consumer_info(STREAM, CONSUMER).unwrap();
    assert_eq!(info.config.ack_wait, Duration::from_secs(7));
    assert_eq!(info.config.max_ack_pending, 100);
    assert!(
        runner.log_text().contains(
            "allows 100 unacknowledged messages (max_ack_pending), fewer than this runner may \
             hold in flight (4 x 64 = 256)"
        ),
        "{}",
        runner.log_text()
    );
    assert_eq!(info.config.filter_subject, SUBJECT);
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .unwrap()
        .success());
}

/// `consumer_mode: reconcile` brings AckWait, MaxAckPending, MaxDeliver and BackOff of an
/// existing consumer to the config (once: a second start finds nothing to change), and
/// refuses, without touching it, a consumer whose filter subject differs.
#[test]
fn reconcile_updates_the_consumer_settings_and_never_its_filter() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", 5, |_| b"{}".to_vec());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let settings = json!({"consumer_mode": "reconcile", "ack_wait_seconds": 7,
                          "max_ack_pending": 300, "max_deliver": 5, "backoff_seconds": [2, 4]});
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), &out, json!({ "nats": settings })),
    );
    for start in 0..2 {
        let mut runner = Runner::start(&cfg, &dir.path().join(format!("svc{start}.log")));
        wait_until(Duration::from_secs(20), "all acked", || {
            all_acked(&server, 5)
        });
        let info = server.js().consumer_info(STREAM, CONSUMER).unwrap().config;
        // With a backoff list the broker's AckWait is its first delay.
        assert_eq!(info.ack_wait, Duration::from_secs(2));
        assert_eq!(info.max_ack_pending, 300);
        assert_eq!(info.max_deliver, 5);
        assert_eq!(
            info.backoff,
            [Duration::from_secs(2), Duration::from_secs(4)]
        );
        assert_eq!(info.filter_subject, SUBJECT);
        let updated = runner.log_text().contains("updated to the config");
        assert_eq!(updated, start == 0, "{}", runner.log_text());
        if start == 0 {
            assert!(
                runner.log_text().contains(
                    "ack_wait 30 s -> 2 s, max_ack_pending 20000 -> 300, max_deliver -1 -> 5, \
                     backoff [] -> [2, 4] s"
                ),
                "{}",
                runner.log_text()
            );
        }
        runner.signal("TERM");
        assert!(runner
            .wait_timeout(Duration::from_secs(15))
            .unwrap()
            .success());
    }

    // Another filter: refused, and the consumer keeps it.
    server.create_consumer(STREAM, "narrow", "orders.eu", Duration::from_secs(30));
    let cfg = write_config(
        dir.path(),
        "narrow.json",
        &config(
            &server,
            dir.path(),
            &out,
            json!({"nats": {"consumer": "narrow", "consumer_mode": "reconcile",
                            "max_ack_pending": 300}}),
        ),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("narrow.log"));
    let status = runner.wait_timeout(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(1));
    assert!(
        runner.log_text().contains(
            "nats.subject is \"orders.>\" but the consumer filters subject \"orders.eu\""
        ),
        "{}",
        runner.log_text()
    );
    let info = server.js().consumer_info(STREAM, "narrow").unwrap().config;
    assert_eq!(info.filter_subject, "orders.eu");
    assert_ne!(info.max_ack_pending, 300, "not reconciled either");
}

/// Nothing left waiting at a clean stop: deliveries into pull requests still open when
/// SIGTERM arrived are handed back at once (NAK, no delay) instead of waiting out their
/// AckWait (60 s here) before another runner may have them.
///
/// First quick stop/start cycles in a backlog, as a rolling restart has them; whether such a
/// stop meets late deliveries depends on timing. Then a stop that certainly does: the runner
/// is caught up (its pull requests are open and waiting), it is frozen (SIGSTOP), messages are
/// published into its open requests, and SIGTERM is queued before it resumes. After both, the
/// next runner delivers everything well within one AckWait.
#[test]
fn a_clean_stop_leaves_no_delivery_waiting_for_its_ack_wait() {
    let n = 10_000;
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(60));
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // Long pull requests, as a busy consumer has them: at a stop they stay open a while.
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(
            &server,
            dir.path(),
            &out,
            json!({"delivery": {"batch_size": 256, "fetch_expiry_ms": 3000,
                                "max_in_flight_batches": 4, "sink_workers": 2,
                                "shutdown_timeout_seconds": 10}}),
        ),
    );
    let stop = |mut runner: Runner| {
        runner.signal("TERM");
        let status = runner
            .wait_timeout(Duration::from_secs(20))
            .expect("bounded shutdown");
        let log = runner.log_text();
        assert!(status.success(), "{log}");
        log.contains("released for redelivery in")
    };
    for cycle in 0..3 {
        let runner = Runner::start(&cfg, &dir.path().join(format!("svc{cycle}.log")));
        let before = files_below(&out).len();
        wait_until(Duration::from_secs(30), "some files written", || {
            files_below(&out).len() >= before + 300
        });
        stop(runner);
    }

    // A frozen runner cannot take its deliveries before the stop: the ones in its open
    // requests are certainly late. The first signal after SIGCONT is the stop, but svc-fetch
    // may still win the race for every delivery: a few tries.
    let mut total = n;
    let mut released = false;
    for attempt in 0..4 {
        let runner = Runner::start(&cfg, &dir.path().join(format!("frozen{attempt}.log")));
        wait_until(Duration::from_secs(40), "caught up", || {
            server.try_consumer_state(STREAM, CONSUMER) == Some((total as u64, 0, 0))
        });
        runner.signal("STOP");
        server.publish_n(STREAM, "orders.created", 1000, |i| {
            format!("{{\"late\":{i}}}").into_bytes()
        });
        total += 1000;
        runner.signal("TERM");
        runner.signal("CONT");
        if stop(runner) {
            eprintln!("a frozen stop released deliveries at try {}", attempt + 1);
            released = true;
            break;
        }
    }
    assert!(released, "no stop met an open pull request: nothing proven");
    let runner = Runner::start(&cfg, &dir.path().join("last.log"));
    // Well within the 60 s AckWait: nothing was left waiting for it.
    wait_until(
        Duration::from_secs(25),
        "every message acknowledged",
        || server.try_consumer_state(STREAM, CONSUMER) == Some((total as u64, 0, 0)),
    );
    drop(runner);
}
