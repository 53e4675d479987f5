//! `svc replay` and `svc dlq redrive` into the other sinks, against a real nats-server: a
//! sequence range and a time range into an empty object-store bucket (moto) store exactly that
//! range, and a replay over it stores nothing twice ("already present"); a replay into the HTTP
//! sink sends the range with the idempotency keys `svc run` sends for the same messages; kill -9
//! mid-redrive then `--resume` delivers every dead letter once into PostgreSQL and empties the
//! dead-letter stream; `dlq redrive --fanout-child` stores into that child only.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::moto::Moto;
use crate::support::process::*;
use crate::support::receiver::Receiver;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const DLQ: &str = "DLQ";

fn config(server: &NatsServer, sink: Value) -> Value {
    json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER,
                 "subject": "orders.>"},
        "delivery": {"batch_size": 8, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "max_batch_wait_ms": 20, "shutdown_timeout_seconds": 10},
        "sink": sink,
        "dead_letter": {"enabled": true, "subject": "dlq.orders", "expected_stream": DLQ},
        "logging": {"level": "warn"}
    })
}

fn setup(n: usize) -> NatsServer {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream(DLQ, &["dlq.orders"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    publish(&server, n);
    server
}

fn publish(server: &NatsServer, n: usize) {
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
}

fn now_rfc3339() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128;
    svc::text::rfc3339::format_rfc3339_nanos(nanos)
}

fn object_sink(m: &Moto, bucket: &str) -> Value {
    json!({"type": "object_store", "bucket": bucket, "endpoint_url": m.endpoint(),
           "allow_http_for_local_testing": true, "credential_mode": "environment",
           "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
           "key_strategy": "stream_sequence"})
}

/// The stream sequences stored in `bucket`, each with its number of object versions.
fn objects(server: &NatsServer, m: &Moto, bucket: &str) -> BTreeMap<u64, usize> {
    let prefix = format!("stream-sequence/{STREAM}/{}/", server.incarnation(STREAM));
    m.versions(bucket)
        .into_iter()
        .map(|(key, n)| {
            let seq = key
                .strip_prefix(&prefix)
                .and_then(|k| k.strip_suffix(".json"))
                .unwrap_or_else(|| panic!("an unexpected object {key}"));
            (seq.parse().unwrap(), n)
        })
        .collect()
}

fn once(range: std::ops::RangeInclusive<u64>) -> BTreeMap<u64, usize> {
    range.map(|s| (s, 1)).collect()
}

#[test]
fn a_replay_into_the_object_store_stores_the_range_once() {
    let m = Moto::start();
    let env = m.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
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
    m.create_bucket("seq-range", true);
    m.create_bucket("time-range", true);
    let cfg = write_config(
        dir.path(),
        "svc.json",
        &config(&server, object_sink(&m, "seq-range")),
    );
    let c = cfg.to_str().unwrap();

    let (code, stdout, err) =
        svc_with_env(&["replay", c, "--start-seq", "5", "--end-seq", "14"], &env);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.contains("read 10, stored 10, already present 0"),
        "{stdout}"
    );
    assert_eq!(objects(&server, &m, "seq-range"), once(5..=14));

    // A wider replay over the bucket: the ten present are counted, not written again (a
    // rewrite would be a second version in this versioned bucket).
    let state = dir.path().join("wide.state");
    let (code, stdout, err) = svc_with_env(
        &[
            "replay",
            c,
            "--end-seq",
            "20",
            "--state",
            state.to_str().unwrap(),
        ],
        &env,
    );
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.contains("read 20, stored 10, already present 10"),
        "{stdout}"
    );
    assert_eq!(objects(&server, &m, "seq-range"), once(1..=20));

    // The time range into the other bucket (--sink).
    let sink = dir.path().join("sink.json");
    std::fs::write(&sink, object_sink(&m, "time-range").to_string()).unwrap();
    let state = dir.path().join("time.state");
    let args = [
        "replay",
        c,
        "--since",
        &since,
        "--until",
        &until,
        "--sink",
        sink.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ];
    let (code, stdout, err) = svc_with_env(&args, &env);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.contains("read 10, stored 10, already present 0"),
        "{stdout}"
    );
    assert_eq!(objects(&server, &m, "time-range"), once(11..=20));
    // The same again: all present, nothing rewritten.
    let again = dir.path().join("time2.state");
    let mut args = args;
    args[9] = again.to_str().unwrap();
    let (code, stdout, err) = svc_with_env(&args, &env);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.contains("read 10, stored 0, already present 10"),
        "{stdout}"
    );
    assert_eq!(objects(&server, &m, "time-range"), once(11..=20));
}

/// `stream_sequence -> idempotency keys` of the records a receiver accepted.
fn keys_by_sequence(r: &Receiver) -> BTreeMap<u64, Vec<String>> {
    let mut out: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for rec in r.records(200) {
        let seq = rec["stream_sequence"].as_u64().expect("stream_sequence");
        let key = rec["idempotency_key"].as_str().expect("idempotency_key");
        out.entry(seq).or_default().push(key.to_string());
    }
    out
}

#[test]
fn a_replay_into_the_http_sink_sends_the_keys_svc_run_sends() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(30);
    let live = Receiver::start(dir.path(), &[]);
    let replayed = Receiver::start(dir.path(), &[]);
    let http = |url: String| {
        json!({"type": "http", "url": url, "allow_http_for_local_testing": true,
               "request_timeout_seconds": 5, "retry_backoff_ms": 100,
               "retry_max_backoff_ms": 400})
    };
    let run_cfg = write_config(dir.path(), "run.json", &config(&server, http(live.url())));
    let mut runner = Runner::start(&run_cfg, &dir.path().join("run.log"));
    wait_until(Duration::from_secs(30), "all 30 acknowledged", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((30, 0, 0))
    });
    runner.signal("TERM");
    runner.wait_timeout(Duration::from_secs(20)).unwrap();
    let by_run = keys_by_sequence(&live);
    assert_eq!(
        by_run.keys().copied().collect::<Vec<_>>(),
        (1..=30).collect::<Vec<_>>()
    );

    let replay_cfg = write_config(
        dir.path(),
        "replay.json",
        &config(&server, http(replayed.url())),
    );
    let (code, stdout, err) = svc(&[
        "replay",
        replay_cfg.to_str().unwrap(),
        "--start-seq",
        "10",
        "--end-seq",
        "20",
    ]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(stdout.contains("read 11, stored 11"), "{stdout}");
    let by_replay = keys_by_sequence(&replayed);
    let expected: BTreeMap<u64, Vec<String>> = by_run
        .range(10..=20)
        .map(|(s, k)| (*s, k.clone()))
        .collect();
    assert_eq!(by_replay, expected, "the range, with svc run's keys");
    let incarnation = server.incarnation(STREAM);
    assert_eq!(
        by_replay[&10],
        vec![format!("nats:{STREAM}:{incarnation}:10")]
    );
}

/// `n` messages of 100 bytes, each refused by a 50-byte size policy: `n` dead letters.
fn dead_letters(server: &NatsServer, dir: &Path, sink: Value, n: u64) {
    let mut broken = config(server, sink);
    broken["size_policy"] = json!({"enabled": true, "max_payload_bytes": 50});
    let cfg = write_config(dir, "broken.json", &broken);
    let mut runner = Runner::start(&cfg, &dir.join("run.log"));
    wait_until(Duration::from_secs(60), "every dead letter", || {
        server.stream_messages(DLQ) == n
            && server.try_consumer_state(STREAM, CONSUMER) == Some((n, 0, 0))
    });
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20)).unwrap();
    assert!(status.success(), "{}", runner.log_text());
}

fn big_messages(n: usize) -> NatsServer {
    let server = setup(0);
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(90)).into_bytes()
    });
    server
}

#[test]
fn kill_9_mid_redrive_then_resume_delivers_every_dead_letter_once() {
    use crate::support::postgres::TestDb;
    let n = 120;
    let db = TestDb::new("redrive_kill");
    let dir = tempfile::tempdir().unwrap();
    let server = big_messages(n as usize);
    let sink = db.sink(json!({"auto_create_tables": true}));
    dead_letters(&server, dir.path(), sink.clone(), n);
    // The sink creates its table when it first opens (the redrive).
    let rows = || -> Vec<u64> {
        let table = "SELECT 1 FROM information_schema.tables WHERE table_name = 'events'";
        if db.rows(table).is_empty() {
            return Vec::new();
        }
        db.rows("SELECT stream_sequence FROM events ORDER BY stream_sequence")
            .iter()
            .map(|r| r[0].as_deref().unwrap().parse().unwrap())
            .collect()
    };
    assert!(rows().is_empty());

    let fixed = write_config(dir.path(), "fixed.json", &config(&server, sink));
    let mut child = Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "dlq",
            "redrive",
            fixed.to_str().unwrap(),
            "--max-rate",
            "40",
        ]),
        &dir.path().join("redrive.log"),
    );
    wait_until(Duration::from_secs(30), "30 redriven", || {
        rows().len() >= 30
    });
    child.sigkill();
    let at_kill = rows().len();
    assert!(at_kill < n as usize, "the redrive finished before the kill");
    assert!(server.stream_messages(DLQ) > 0);

    let (code, _, err) = svc(&["dlq", "redrive", fixed.to_str().unwrap()]);
    assert_eq!(code, 1, "an unfinished redrive is never overwritten: {err}");
    assert!(err.contains("--resume"), "{err}");
    let (code, stdout, err) = svc(&["dlq", "redrive", fixed.to_str().unwrap(), "--resume"]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert_eq!(rows(), (1..=n).collect::<Vec<_>>(), "each dead letter once");
    assert_eq!(
        server.stream_messages(DLQ),
        0,
        "the dead-letter stream is empty"
    );
}

fn stored_files(out: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = files_below(out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let v: Value = serde_json::from_slice(&std::fs::read(out.join(&p)).unwrap()).unwrap();
            v["stream_sequence"].as_u64().unwrap()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

#[test]
fn a_redrive_with_fanout_child_stores_only_into_that_child() {
    let dir = tempfile::tempdir().unwrap();
    let server = big_messages(5);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let fanout = json!({"type": "fanout", "sinks": {
        "archive": {"type": "file", "directory": a},
        "restored": {"type": "file", "directory": b}}});
    dead_letters(&server, dir.path(), fanout.clone(), 5);
    let fixed = write_config(dir.path(), "fixed.json", &config(&server, fanout));
    let f = fixed.to_str().unwrap();

    let (code, _, err) = svc(&["dlq", "redrive", f, "--fanout-child", "nope"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--fanout-child nope: ") && err.contains("archive, restored"),
        "{err}"
    );
    let (code, _, err) = svc(&["dlq", "list", f, "--fanout-child", "a"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--fanout-child"), "{err}");
    let (code, _, err) = svc(&[
        "dlq",
        "redrive",
        f,
        "--sink",
        "s.json",
        "--fanout-child",
        "restored",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("at most one of --sink, --fanout-child"),
        "{err}"
    );
    assert_eq!(server.stream_messages(DLQ), 5);

    let (code, stdout, err) = svc(&["dlq", "redrive", f, "--fanout-child", "restored"]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(stdout.contains("read 5, stored 5"), "{stdout}");
    assert_eq!(stored_files(&b), (1..=5).collect::<Vec<_>>());
    assert!(files_below(&a).is_empty(), "the other child got nothing");
    assert_eq!(server.stream_messages(DLQ), 0);
}
