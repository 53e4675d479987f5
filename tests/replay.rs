//! `svc replay` against a real nats-server and real sinks: a sequence range and a time range
//! into an empty per_event file sink store exactly that range; a replay over a sink that holds
//! the records stores nothing twice and says "already present"; kill -9 mid-replay and
//! `--resume` ends with every message once; a replay beside a live `svc run` loses nothing;
//! refusals go to the DLQ marked as replayed; bad flags and foreign state files are refused
//! with errors naming the flag or the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";

fn config(
    server: &NatsServer,
    out: &Path,
    batch: usize,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": "orders.>"},
        "delivery": {"batch_size": batch, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "max_batch_wait_ms": 20, "shutdown_timeout_seconds": 10},
        "sink": {"type": "file", "directory": out},
        "logging": {"level": "warn"}
    });
    if let serde_json::Value::Object(extra) = extra {
        for (k, v) in extra {
            cfg[k] = v;
        }
    }
    cfg
}

fn setup(n: usize) -> NatsServer {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    publish(&server, n);
    server
}

fn publish(server: &NatsServer, n: usize) {
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
}

/// The stream sequences of the records a per_event file sink holds, each counted once per
/// file (a second file for one sequence would be a duplicate).
fn stored(out: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = files_below(out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let bytes = std::fs::read(out.join(&p)).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v["stream_sequence"].as_u64().unwrap()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

fn replay(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["replay", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    svc(&all)
}

fn now_rfc3339() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128;
    svc::text::rfc3339::format_rfc3339_nanos(nanos)
}

fn consumers(server: &NatsServer) -> usize {
    server
        .js()
        .stream_info(STREAM)
        .unwrap()
        .state
        .consumer_count
}

#[test]
fn a_sequence_range_and_a_time_range_store_exactly_that_range() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(10);
    std::thread::sleep(Duration::from_millis(300));
    let since = now_rfc3339();
    std::thread::sleep(Duration::from_millis(300));
    publish(&server, 10);
    std::thread::sleep(Duration::from_millis(300));
    let until = now_rfc3339();
    std::thread::sleep(Duration::from_millis(300));
    publish(&server, 10);
    let durable_before = server.consumer_state(STREAM, CONSUMER);
    let out = dir.path().join("out");
    let cfg = write_config(dir.path(), "svc.json", &config(&server, &out, 4, json!({})));

    let (code, stdout, err) = replay(&cfg, &["--start-seq", "5", "--end-seq", "14"]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert_eq!(stored(&out), (5..=14).collect::<Vec<_>>());
    assert!(
        stdout.contains("read 10, stored 10, already present 0"),
        "{stdout}"
    );
    // Not a terminal here: plain progress lines, and the state file says done.
    assert!(err.contains("replay: "), "{err}");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("svc.json.replay-state")).unwrap())
            .unwrap();
    assert_eq!(
        (state["done"].as_bool(), state["next_seq"].as_u64()),
        (Some(true), Some(15))
    );

    // The time range into another sink (--sink), with its own state file.
    let out2 = dir.path().join("out2");
    let sink = dir.path().join("sink.json");
    std::fs::write(
        &sink,
        json!({"type": "file", "directory": out2}).to_string(),
    )
    .unwrap();
    let state2 = dir.path().join("time.state");
    let (code, stdout, err) = replay(
        &cfg,
        &[
            "--since",
            &since,
            "--until",
            &until,
            "--sink",
            sink.to_str().unwrap(),
            "--state",
            state2.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stdout}{err}");
    assert_eq!(stored(&out2), (11..=20).collect::<Vec<_>>());
    assert!(stdout.contains("stored 10"), "{stdout}");

    // --dry-run writes nothing and says what would be stored.
    let out3 = dir.path().join("out3");
    std::fs::write(
        &sink,
        json!({"type": "file", "directory": out3}).to_string(),
    )
    .unwrap();
    let (code, stdout, err) = replay(
        &cfg,
        &[
            "--dry-run",
            "--end-seq",
            "7",
            "--sink",
            sink.to_str().unwrap(),
            "--state",
            dir.path().join("dry.state").to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(stdout.contains("read 7, would store 7"), "{stdout}");
    assert!(stored(&out3).is_empty() && !dir.path().join("dry.state").exists());

    // The durable consumer was never touched; no replay consumer is left behind.
    assert_eq!(server.consumer_state(STREAM, CONSUMER), durable_before);
    wait_until(Duration::from_secs(15), "replay consumers gone", || {
        consumers(&server) == 1
    });
}

#[test]
fn a_replay_over_an_existing_sink_stores_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(40);
    let out = dir.path().join("out");
    let cfg = write_config(dir.path(), "svc.json", &config(&server, &out, 8, json!({})));
    let mut runner = Runner::start(&cfg, &dir.path().join("run.log"));
    wait_until(Duration::from_secs(30), "the runner to store 40", || {
        stored(&out).len() == 40
    });
    runner.signal("TERM");
    runner.wait_timeout(Duration::from_secs(20)).unwrap();
    let before: Vec<(PathBuf, Vec<u8>)> = files_below(&out)
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(out.join(&p)).unwrap()))
        .collect();

    let (code, stdout, err) = replay(&cfg, &[]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.contains("read 40, stored 0, already present 40"),
        "{stdout}"
    );
    assert_eq!(stored(&out), (1..=40).collect::<Vec<_>>());
    let after: Vec<(PathBuf, Vec<u8>)> = files_below(&out)
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(out.join(&p)).unwrap()))
        .collect();
    assert_eq!(before, after, "a record was rewritten");

    // A range that starts beyond the stream is refused, not reported as "read 0".
    let beyond = dir.path().join("beyond.state");
    let (code, stdout, err) = replay(
        &cfg,
        &["--start-seq", "41", "--state", beyond.to_str().unwrap()],
    );
    assert_eq!(code, 1, "{stdout}{err}");
    assert!(
        err.contains("--start-seq 41 is beyond stream ORDERS's last sequence 40"),
        "{err}"
    );

    // A finished state file makes room for a new replay of the same range.
    let (code, stdout, err) = replay(&cfg, &["--start-seq", "30"]);
    assert_eq!(
        code, 1,
        "another range over the finished state: {stdout}{err}"
    );
    assert!(
        err.contains("belongs to another replay: --start-seq differ"),
        "{err}"
    );
    let (code, stdout, _) = replay(&cfg, &[]);
    assert_eq!(code, 0);
    assert!(stdout.contains("already present 40"), "{stdout}");
}

#[test]
fn kill_9_mid_replay_then_resume_ends_with_every_message_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(150);
    let out = dir.path().join("out");
    let cfg = write_config(dir.path(), "svc.json", &config(&server, &out, 5, json!({})));
    let state = dir.path().join("svc.json.replay-state");
    let mut child = Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--max-rate",
            "60",
        ]),
        &dir.path().join("replay.log"),
    );
    let next = || -> u64 {
        std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["next_seq"].as_u64())
            .unwrap_or(0)
    };
    wait_until(Duration::from_secs(30), "the replay to settle 40", || {
        next() > 40
    });
    child.sigkill();
    let at_kill = next();
    assert!(at_kill < 150, "the replay finished before the kill");

    // Without --resume an unfinished state is never overwritten.
    let (code, _, err) = replay(&cfg, &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("unfinished replay") && err.contains("--resume"),
        "{err}"
    );
    let (code, stdout, err) = replay(&cfg, &["--resume"]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert_eq!(
        stored(&out),
        (1..=150).collect::<Vec<_>>(),
        "each message once"
    );
    // The counts cover both runs: everything settled exactly once.
    assert!(stdout.contains("read 150, "), "{stdout}");
    let (code, stdout, _) = replay(&cfg, &["--resume"]);
    assert_eq!(code, 0, "a finished replay resumed is done: {stdout}");
}

#[test]
fn a_replay_beside_a_live_runner_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(200);
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "svc.json",
        &config(&server, &out, 16, json!({})),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("run.log"));
    let cfg_replay = cfg.clone();
    let replaying = std::thread::spawn(move || {
        replay(
            &cfg_replay,
            &["--end-seq", "200", "--state", "/dev/null/none"],
        )
    });
    let (code, _, err) = replaying.join().unwrap();
    assert_eq!(
        code, 1,
        "a state file that cannot be written is an error first: {err}"
    );
    let cfg_replay = cfg.clone();
    let replaying = std::thread::spawn(move || replay(&cfg_replay, &["--end-seq", "200"]));
    publish(&server, 200);
    let (code, stdout, err) = replaying.join().unwrap();
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(stdout.contains("read 200, "), "{stdout}");
    wait_until(
        Duration::from_secs(60),
        "the runner to store all 400",
        || stored(&out).len() >= 400,
    );
    assert_eq!(stored(&out), (1..=400).collect::<Vec<_>>());
    let (_, ack_pending, _) = server.consumer_state(STREAM, CONSUMER);
    runner.signal("TERM");
    runner.wait_timeout(Duration::from_secs(20)).unwrap();
    let _ = ack_pending;
    assert_eq!(
        server.consumer_state(STREAM, CONSUMER).0,
        400,
        "the durable delivered all"
    );
}

#[test]
fn refusals_go_to_the_dlq_marked_replayed_and_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(0);
    server.create_stream("DLQ", &["dlq.orders"]);
    let nc = server.connect();
    for i in 0..6 {
        let body = if i % 2 == 0 {
            "x".repeat(100)
        } else {
            format!("{{\"n\":{i}}}")
        };
        nc.publish("orders.created", body).unwrap();
    }
    nc.flush().unwrap();
    wait_until(Duration::from_secs(10), "6 stored", || {
        server.stream_messages(STREAM) == 6
    });
    let out = dir.path().join("out");
    let extra = json!({
        "size_policy": {"enabled": true, "max_payload_bytes": 50},
        "dead_letter": {"enabled": true, "subject": "dlq.orders", "expected_stream": "DLQ"}
    });
    let cfg = write_config(dir.path(), "svc.json", &config(&server, &out, 4, extra));
    let (code, stdout, err) = replay(&cfg, &[]);
    assert_eq!(code, 3, "{stdout}{err}");
    assert!(
        stdout.contains(
            "read 6, stored 3, already present 0, refused by governance 3, refused \
                         by the sink 0, dead-lettered 3"
        ),
        "{stdout}"
    );
    assert_eq!(stored(&out), vec![2, 4, 6]);
    assert_eq!(server.stream_messages("DLQ"), 3);
    for seq in 1..=3u64 {
        let reply = nc
            .request(
                "$JS.API.STREAM.MSG.GET.DLQ",
                json!({"seq": seq}).to_string(),
            )
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&reply.data).unwrap();
        use base64::Engine;
        let data = base64::engine::general_purpose::STANDARD
            .decode(v["message"]["data"].as_str().unwrap())
            .unwrap();
        let record: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(record["replayed"], json!(true), "{record}");
        assert_eq!(record["failure"]["reason"], "payload_too_large", "{record}");
        assert_eq!(record["original"]["consumer"], CONSUMER, "{record}");
    }
}

#[test]
fn bad_flags_subjects_and_sink_files_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_value = json!({
        "nats": {"url": "nats://127.0.0.1:1", "stream": STREAM, "consumer": CONSUMER,
                 "subject": "orders.>"},
        "sink": {"type": "file", "directory": dir.path().join("out")}
    });
    let cfg = write_config(dir.path(), "svc.json", &cfg_value);
    for (args, needle) in [
        (&["--end-seq", "zero"][..], "--end-seq must be an integer"),
        (
            &["--since", "last tuesday"],
            "--since must be an RFC 3339 time",
        ),
        (&["--max-rate", "-3"], "--max-rate"),
        (&["--subject", "payments.>"], "--subject: "),
        (
            &["--sink", "/nonexistent/sink.json"],
            "--sink /nonexistent/sink.json: cannot open",
        ),
        (&["--frobnicate"], "--frobnicate"),
    ] {
        let (code, out, err) = replay(&cfg, args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let sink = dir.path().join("sink.json");
    std::fs::write(&sink, r#"{"type": "file", "directroy": "/tmp/x"}"#).unwrap();
    let (code, _, err) = replay(&cfg, &["--sink", sink.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("sink.directroy") || err.contains("directroy"),
        "{err}"
    );
    let (code, out, _) = svc(&["replay", "--help"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("Usage: svc replay <config_file>") && out.contains("Exit codes:"));
}

/// A keyed relational sink (PostgreSQL): a replay over rows that exist stores none twice and
/// counts them as already present.
#[test]
fn a_replay_into_postgresql_counts_existing_rows_already_present() {
    use crate::support::postgres::TestDb;
    let dir = tempfile::tempdir().unwrap();
    let server = setup(60);
    let db = TestDb::new("replay");
    let sink = db.sink(json!({"auto_create_tables": true}));
    let mut value = config(&server, &dir.path().join("unused"), 8, json!({}));
    value["sink"] = sink;
    let cfg = write_config(dir.path(), "svc.json", &value);
    let state = dir.path().join("first.state");
    let (code, stdout, err) = replay(
        &cfg,
        &["--end-seq", "30", "--state", state.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.contains("read 30, stored 30, already present 0"),
        "{stdout}"
    );
    let (code, stdout, err) = replay(&cfg, &[]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.contains("read 60, stored 30, already present 30"),
        "{stdout}"
    );
    let seqs: Vec<u64> = db
        .rows("SELECT stream_sequence FROM events ORDER BY stream_sequence")
        .iter()
        .map(|r| r[0].as_deref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(seqs, (1..=60).collect::<Vec<_>>(), "each row once");
}

/// Starts `svc replay` of `cfg` slowly, stops it with Ctrl-C (SIGINT) once more than 20
/// messages are settled, and checks it exits 4 saying `--resume`.
fn interrupt_replay(dir: &Path, cfg: &Path) {
    let state = dir.join("svc.json.replay-state");
    let mut child = Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--max-rate",
            "40",
        ]),
        &dir.join("replay.log"),
    );
    wait_until(Duration::from_secs(30), "a settled batch", || {
        std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["next_seq"].as_u64())
            .is_some_and(|n| n > 20)
    });
    child.signal("INT");
    let status = child.wait_timeout(Duration::from_secs(20)).expect("exits");
    assert_eq!(status.code(), Some(4), "{}", child.log_text());
    assert!(
        child.log_text().contains("--resume"),
        "{}",
        child.log_text()
    );
}

/// Ctrl-C (SIGINT) settles what was read, records it, exits 4; `--resume` finishes the range.
#[test]
fn sigint_stops_with_exit_4_and_resume_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(100);
    let out = dir.path().join("out");
    let cfg = write_config(dir.path(), "svc.json", &config(&server, &out, 5, json!({})));
    interrupt_replay(dir.path(), &cfg);
    let partial = stored(&out);
    assert!(!partial.is_empty() && partial.len() < 100, "{partial:?}");
    let (code, stdout, err) = replay(&cfg, &["--resume"]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert_eq!(stored(&out), (1..=100).collect::<Vec<_>>());
}

/// `--resume` continues only the replay its state file was written for (found by the attack
/// on replay): after the sink block was edited it would continue into the new sink (the
/// messages before the stop never reach it), and after the stream was deleted and created
/// again its recorded position would name other messages (the new ones below it never
/// replayed). Both are refused, naming what changed, and nothing is written.
#[test]
fn resume_refuses_an_edited_sink_and_a_recreated_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(100);
    let out = dir.path().join("out");
    let original = config(&server, &out, 5, json!({}));
    let cfg = write_config(dir.path(), "svc.json", &original);
    interrupt_replay(dir.path(), &cfg);
    let partial = stored(&out);

    let elsewhere = dir.path().join("elsewhere");
    write_config(
        dir.path(),
        "svc.json",
        &config(&server, &elsewhere, 5, json!({})),
    );
    let (code, stdout, err) = replay(&cfg, &["--resume"]);
    assert_eq!(code, 1, "{stdout}{err}");
    assert!(
        err.contains("the sink or the settings that shape a record"),
        "{err}"
    );
    assert!(!elsewhere.exists(), "nothing written into the edited sink");

    write_config(dir.path(), "svc.json", &original);
    server.js().delete_stream(STREAM).unwrap();
    server.create_stream(STREAM, &["orders.>"]);
    publish(&server, 6);
    let (code, stdout, err) = replay(&cfg, &["--resume"]);
    assert_eq!(code, 1, "{stdout}{err}");
    assert!(err.contains("the stream's incarnation"), "{err}");
    assert_eq!(stored(&out), partial, "nothing written");

    // Started over, the new stream's six are replayed (their keys name the new incarnation).
    std::fs::remove_file(dir.path().join("svc.json.replay-state")).unwrap();
    let (code, stdout, err) = replay(&cfg, &[]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert_eq!(stored(&out).len(), partial.len() + 6);
}
