//! `svc` end to end into the HTTP sink: a real `nats-server -js`, a Python receiver that stores
//! every request it gets (`tests/support/receivers/http_receiver.py`, verifying Standard Webhooks
//! signatures with the `standardwebhooks` package from PyPI), nginx in front of it for TLS and
//! mutual TLS, and the `svc` binary. Commit first, ACK last: a record is acknowledged only
//! after a success status for a request that held it.
//!
//! Needs python3 with `standardwebhooks` (the venv of `scripts/deps.sh`, `$SVC_TEST_VENV`,
//! default `~/.cache/svc-test-tools/venv`) and nginx (`scripts/deps.sh` installs both).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::broker::NatsServer;
use crate::support::process::svc_run;
use crate::support::process::Runner;
use crate::support::receiver::{records_of, Receiver};
use crate::support::{
    assert_no_secret_piece, free_port, snapshot_counter, wait_until, write_config,
};
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";
/// Signing secrets (two: a rotation in progress) and a bearer token: none may be printed.
const SECRET_NEW: &str = "whsec_c3ZjLXRlc3Qtc2lnbmluZy1zZWNyZXQtbmV3LTAx";
const SECRET_OLD: &str = "whsec_c3ZjLXRlc3Qtc2lnbmluZy1zZWNyZXQtb2xkLTAy";
const TOKEN: &str = "Bearer tok-3f9a77c1d2e4-very-secret";

fn setup(n: usize) -> (NatsServer, tempfile::TempDir) {
    let server = NatsServer::start();
    server.create_stream(STREAM, &[SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    if n > 0 {
        publish(&server, 0, n);
    }
    (server, tempfile::tempdir().unwrap())
}

fn publish(server: &NatsServer, from: usize, n: usize) {
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{}}}", from + i).into_bytes()
    });
}

fn sink(url: &str, extra: Value) -> Value {
    let mut v = json!({
        "type": "http", "url": url, "allow_http_for_local_testing": true,
        "request_timeout_seconds": 5, "retry_backoff_ms": 100, "retry_max_backoff_ms": 400,
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn config(server: &NatsServer, dir: &Path, sink: Value, extra: Value) -> PathBuf {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": SUBJECT},
        "delivery": {"batch_size": 64, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "sink_workers": 2, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 200, "jitter": "none"}},
        "sink": sink,
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    write_config(dir, "c.json", &cfg)
}

fn env() -> HashMap<String, String> {
    HashMap::from([
        ("T_WEBHOOK_NEW".to_string(), SECRET_NEW.to_string()),
        ("T_WEBHOOK_OLD".to_string(), SECRET_OLD.to_string()),
        ("T_TOKEN".to_string(), TOKEN.to_string()),
    ])
}

fn start_runner(config: &Path, log: &Path) -> Runner {
    Runner::start_env(
        config,
        log,
        env()
            .into_iter()
            .chain([("RUST_LOG".into(), "debug".into())]),
    )
}

fn test_sink(config: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("test-sink")
        .arg(config)
        .envs(env())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_secret(&text);
    (out.status.code().unwrap_or(-1), text)
}

fn stop(runner: &mut Runner) {
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20)).expect("exits");
    assert!(status.success(), "{status}: {}", runner.log_text());
    assert_no_secret(&runner.log_text());
}

/// No line holds a secret value, nor the key part of a signing secret.
fn assert_no_secret(text: &str) {
    for line in text.lines() {
        for s in [
            SECRET_NEW,
            SECRET_OLD,
            TOKEN,
            &SECRET_NEW[6..],
            &SECRET_OLD[6..],
            &TOKEN[7..],
        ] {
            assert!(!line.contains(s), "a secret in: {line}");
        }
    }
}

/// Waits until the consumer acknowledged all `n` messages; on timeout, shows the run's log.
fn wait_all_acked(server: &NatsServer, runner: &Runner, n: u64, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while acked(server) != (n, 0, 0) {
        if Instant::now() > deadline {
            let log = runner.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "not all {n} acknowledged: {:?}; log tail:\n{}",
                acked(server),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn acked(server: &NatsServer) -> (u64, usize, u64) {
    server
        .try_consumer_state(STREAM, CONSUMER)
        .unwrap_or((0, 0, 0))
}

/// `sequence -> times received` from the per-record idempotency keys of accepted requests.
fn accepted_keys(r: &Receiver) -> BTreeMap<String, usize> {
    let mut keys = BTreeMap::new();
    for rec in r.records(200) {
        let key = rec["idempotency_key"].as_str().unwrap().to_string();
        *keys.entry(key).or_insert(0) += 1;
    }
    keys
}

/// The idempotency key of message `seq` of the test stream (its incarnation included).
fn key(server: &NatsServer, seq: u64) -> String {
    format!("nats:{STREAM}:{}:{seq}", server.incarnation(STREAM))
}

fn expected_keys(server: &NatsServer, n: u64) -> BTreeSet<String> {
    let incarnation = server.incarnation(STREAM);
    (1..=n)
        .map(|s| format!("nats:{STREAM}:{incarnation}:{s}"))
        .collect()
}

#[test]
fn signed_batches_verify_with_standardwebhooks_and_a_tampered_one_is_refused() {
    let n = 300;
    let (server, dir) = setup(n);
    let receiver = Receiver::start(dir.path(), &["--secret", SECRET_OLD]);
    let sink = sink(
        &receiver.url(),
        json!({"batching": "json_array", "max_batch_messages": 50, "gzip": true,
               "signing_secrets_env": ["T_WEBHOOK_NEW", "T_WEBHOOK_OLD"],
               "headers": {"X-Team": "payments"},
               "headers_env": {"Authorization": "T_TOKEN"}}),
    );
    // No `sink_workers`: batches of 64 in requests of at most 50 are 2 requests each, so 8
    // request threads need 4 batches at once, and a fifth worker prepares the next.
    let delivery = json!({"batch_size": 64, "fetch_expiry_ms": 200, "max_in_flight_batches": 8,
                          "shutdown_timeout_seconds": 10});
    let cfg = config(&server, dir.path(), sink, json!({ "delivery": delivery }));
    let (code, text) = test_sink(&cfg);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("answered 204 to OPTIONS"), "{text}");

    let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
    wait_all_acked(&server, &runner, n as u64, 60);
    stop(&mut runner);
    assert!(
        runner
            .log_text()
            .contains("batch 64 x 8 in flight, 5 sink workers"),
        "{}",
        runner.log_text()
    );

    let requests = receiver.requests();
    assert!(requests.len() >= 6, "batched: {} requests", requests.len());
    assert!(
        requests.len() < n / 10,
        "batched: {} requests",
        requests.len()
    );
    for r in &requests {
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["status"], 200);
        let h = &r["headers"];
        assert_eq!(h["authorization"], TOKEN);
        assert_eq!(h["x-team"], "payments");
        assert_eq!(h["content-encoding"], "gzip");
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["idempotency-key"], h["webhook-id"]);
        assert_eq!(
            h["webhook-signature"].as_str().unwrap().split(' ').count(),
            2
        );
    }
    let keys = accepted_keys(&receiver);
    assert_eq!(
        keys.keys().cloned().collect::<BTreeSet<_>>(),
        expected_keys(&server, n as u64)
    );
    let rec = &receiver.records(200)[0];
    assert_eq!(rec["schema"], "svc.file.message.v1");
    assert_eq!(rec["stream"], STREAM);
    let snap = dir.path().join("metrics.json");
    assert_eq!(
        snapshot_counter(&snap, "http_requests_2xx_total"),
        requests.len() as u64
    );
    assert!(snapshot_counter(&snap, "http_request_bytes_total") > 0);
    assert!(!std::fs::read_to_string(&snap).unwrap().contains("tok-3f9a"));

    // The first request again with one byte of its body changed: refused by the verifier.
    let first = &requests[0];
    let mut body = serde_json::to_vec(&records_of(first)).unwrap();
    body[1] = b' ';
    let h = &first["headers"];
    let mut s = TcpStream::connect(("127.0.0.1", receiver.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         webhook-id: {}\r\nwebhook-timestamp: {}\r\nwebhook-signature: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        h["webhook-id"].as_str().unwrap(),
        h["webhook-timestamp"].as_str().unwrap(),
        h["webhook-signature"].as_str().unwrap(),
        body.len()
    )
    .unwrap();
    s.write_all(&body).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert_eq!(receiver.requests().last().unwrap()["verified"], false);
}

#[test]
fn retry_after_is_waited_for_then_the_message_is_committed() {
    let (server, dir) = setup(1);
    let receiver = Receiver::start(dir.path(), &["--mode", "retry_after", "--count", "1"]);
    let sink = sink(
        &receiver.url(),
        json!({"batching": "none", "method": "PUT"}),
    );
    let cfg = config(&server, dir.path(), sink, json!({}));
    let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
    wait_all_acked(&server, &runner, 1, 30);
    stop(&mut runner);
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0]["status"], 503);
    assert_eq!(requests[1]["status"], 200);
    assert!(requests.iter().all(|r| r["method"] == "PUT"));
    let waited = requests[1]["at"].as_f64().unwrap() - requests[0]["at"].as_f64().unwrap();
    assert!(waited >= 1.9, "Retry-After: 2 honoured, waited {waited} s");
    // Same key on the retry: the receiver can drop a repeat.
    assert_eq!(
        requests[0]["headers"]["idempotency-key"],
        requests[1]["headers"]["idempotency-key"]
    );
    assert_eq!(
        requests[1]["headers"]["idempotency-key"],
        key(&server, 1).as_str()
    );
    let snap = dir.path().join("metrics.json");
    assert_eq!(snapshot_counter(&snap, "http_retry_after_waits_total"), 1);
    assert_eq!(snapshot_counter(&snap, "http_requests_5xx_total"), 1);
    assert_eq!(snapshot_counter(&snap, "messages_nacked_total"), 0);
}

#[test]
fn a_record_refused_with_400_alone_is_dead_lettered_the_rest_of_its_batch_committed() {
    let (server, dir) = setup(0);
    server.create_stream("DLQ", &["svc.dlq.orders"]);
    server.publish_n(STREAM, "orders.created", 20, |i| {
        if i == 13 {
            b"{\"order\":\"POISON\"}".to_vec()
        } else {
            format!("{{\"order\":{i}}}").into_bytes()
        }
    });
    let receiver = Receiver::start(dir.path(), &["--mode", "reject_marker"]);
    let sink = sink(&receiver.url(), json!({"batching": "ndjson"}));
    let dlq = json!({"dead_letter": {"enabled": true, "subject": "svc.dlq.orders",
                                     "expected_stream": "DLQ", "publish_timeout_ms": 2000}});
    let cfg = config(&server, dir.path(), sink, dlq);
    let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
    wait_all_acked(&server, &runner, 20, 30);
    stop(&mut runner);
    assert_eq!(server.stream_messages("DLQ"), 1);
    let m = server.js().get_message("DLQ", 1).unwrap();
    let v: Value = serde_json::from_slice(&m.data).unwrap();
    assert_eq!(v["failure"]["reason"], "http_400");
    assert_eq!(v["original"]["stream_sequence"], 14);
    let keys = accepted_keys(&receiver);
    let mut want = expected_keys(&server, 20);
    want.remove(&key(&server, 14));
    assert_eq!(keys.keys().cloned().collect::<BTreeSet<_>>(), want);
    let log = runner.log_text();
    assert!(log.contains("status 400: refused: bad record"), "{log}");
}

#[test]
fn a_receiver_quoting_the_token_back_never_gets_it_printed() {
    let (server, dir) = setup(1);
    let receiver = Receiver::start(dir.path(), &["--mode", "echo"]);
    let sink = sink(
        &receiver.url(),
        json!({"batching": "none", "headers_env": {"Authorization": "T_TOKEN"}}),
    );
    let cfg = config(&server, dir.path(), sink, json!({}));
    let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
    let snap = dir.path().join("metrics.json");
    wait_until(Duration::from_secs(30), "a permanent failure", || {
        snapshot_counter(&snap, "sink_permanent_failures_total") >= 1
    });
    // `stop` scans every log line for the token, whole and without its scheme word.
    stop(&mut runner);
    let log = runner.log_text();
    assert!(log.contains("status 400: denied for <redacted>"), "{log}");
}

/// A wrong token, a moved endpoint, a proxy or a redirect says the sink is unusable, not that
/// a message is bad: the messages are NAKed and wait (never dead-lettered), the refusal is
/// counted and said once, and once the receiver is fixed every message arrives.
#[test]
fn statuses_that_refuse_the_sink_nak_and_never_dead_letter() {
    for (args, status) in [
        (vec!["--mode", "status", "--status", "401"], 401),
        (vec!["--mode", "status", "--status", "403"], 403),
        (vec!["--mode", "status", "--status", "404"], 404),
        (vec!["--mode", "status", "--status", "407"], 407),
        (vec!["--mode", "redirect"], 301),
    ] {
        let n = 5;
        let (server, dir) = setup(n);
        server.create_stream("DLQ", &["svc.dlq.orders"]);
        let mut receiver = Receiver::start(dir.path(), &args);
        let sink = sink(&receiver.url(), json!({"batching": "none"}));
        let dlq = json!({"dead_letter": {"enabled": true, "subject": "svc.dlq.orders",
                                         "expected_stream": "DLQ", "publish_timeout_ms": 2000}});
        let cfg = config(&server, dir.path(), sink, dlq);
        let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
        let snap = dir.path().join("metrics.json");
        wait_until(Duration::from_secs(30), "redeliveries after NAKs", || {
            snapshot_counter(&snap, "http_sink_unusable_total") >= 2 * n as u64
                && snapshot_counter(&snap, "messages_nacked_total") >= n as u64
        });
        assert_eq!(acked(&server).0, 0, "{status}");
        assert_eq!(server.stream_messages("DLQ"), 0, "{status}");
        assert_eq!(snapshot_counter(&snap, "sink_permanent_failures_total"), 0);
        assert!(snapshot_counter(&snap, "sink_write_errors_total") >= n as u64);
        assert!(receiver.requests().iter().all(|r| r["path"] == "/hook"));
        let log = runner.log_text();
        let said = log.matches("the receiver refuses the sink:").count();
        assert_eq!(said, 1, "{status}: said {said} times:\n{log}");
        assert!(log.contains(&format!("status {status}")), "{log}");
        // The operator fixes the receiver: every message arrives, none was lost to a DLQ.
        receiver.relaunch_with(&["--mode", "ok"]);
        wait_all_acked(&server, &runner, n as u64, 30);
        stop(&mut runner);
        let keys: BTreeSet<String> = receiver
            .requests()
            .iter()
            .filter(|r| r["status"] == 200)
            .map(|r| {
                r["headers"]["idempotency-key"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(keys, expected_keys(&server, n as u64));
        assert_eq!(server.stream_messages("DLQ"), 0);
        assert!(runner
            .log_text()
            .contains("the receiver accepts requests again"));
    }
}

/// A receiver answering 400 to every request (a wrong Standard Webhooks signing secret, a
/// proxy) judges the sink, not the records: nothing is acknowledged or dead-lettered, the
/// refusal is counted and said once, and once the receiver is fixed every message arrives once.
#[test]
fn a_receiver_refusing_every_record_with_400_naks_and_never_dead_letters() {
    for batching in ["none", "ndjson"] {
        let n = 20;
        let (server, dir) = setup(n);
        server.create_stream("DLQ", &["svc.dlq.orders"]);
        let mut receiver = Receiver::start(dir.path(), &["--mode", "status", "--status", "400"]);
        let sink = sink(&receiver.url(), json!({"batching": batching}));
        let dlq = json!({"dead_letter": {"enabled": true, "subject": "svc.dlq.orders",
                                         "expected_stream": "DLQ", "publish_timeout_ms": 2000}});
        let cfg = config(&server, dir.path(), sink, dlq);
        let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
        let snap = dir.path().join("metrics.json");
        wait_until(Duration::from_secs(30), "redeliveries after NAKs", || {
            snapshot_counter(&snap, "http_sink_unusable_total") >= 2
                && snapshot_counter(&snap, "messages_nacked_total") >= n as u64
        });
        assert_eq!(acked(&server).0, 0, "{batching}");
        assert_eq!(server.stream_messages("DLQ"), 0, "{batching}");
        assert_eq!(snapshot_counter(&snap, "sink_permanent_failures_total"), 0);
        let log = runner.log_text();
        let said = log.matches("the receiver refuses the sink:").count();
        assert_eq!(said, 1, "{batching}: said {said} times:\n{log}");
        receiver.relaunch_with(&["--mode", "ok"]);
        wait_all_acked(&server, &runner, n as u64, 30);
        stop(&mut runner);
        let keys = if batching == "ndjson" {
            accepted_keys(&receiver)
        } else {
            let mut keys = BTreeMap::new();
            for r in receiver.requests().iter().filter(|r| r["status"] == 200) {
                let key = r["headers"]["idempotency-key"].as_str().unwrap();
                *keys.entry(key.to_string()).or_insert(0) += 1;
            }
            keys
        };
        assert_eq!(
            keys.keys().cloned().collect::<BTreeSet<_>>(),
            expected_keys(&server, n as u64)
        );
        assert!(keys.values().all(|c| *c == 1), "{batching}: {keys:?}");
        assert_eq!(server.stream_messages("DLQ"), 0);
    }
}

/// `logging.level: "trace"` (and a bare `RUST_LOG=trace`): ureq logs the URL with its query
/// and ureq-proto hex-dumps every request byte at trace; neither the query's token, the
/// `headers_env` Authorization value nor a signing secret may reach the log, in whole or in
/// the 16-byte rows of a dump. Naming the module in `RUST_LOG` still opens it.
#[test]
fn at_trace_level_no_secret_of_the_sink_reaches_the_log() {
    const QUERY_TOKEN: &str = "q-7c1e5a9d3b2f-query-secret";
    for rust_log in [None, Some("trace"), Some("trace,ureq_proto=trace")] {
        let n = 20;
        let (server, dir) = setup(n);
        let receiver = Receiver::start(dir.path(), &["--secret", SECRET_NEW]);
        let url = format!("{}?token={QUERY_TOKEN}", receiver.url());
        let sink = sink(
            &url,
            json!({"headers_env": {"Authorization": "T_TOKEN"},
                   "signing_secrets_env": ["T_WEBHOOK_NEW", "T_WEBHOOK_OLD"]}),
        );
        let cfg = config(
            &server,
            dir.path(),
            sink,
            json!({"logging": {"level": "trace"}}),
        );
        let mut cmd = svc_run(&cfg);
        cmd.envs(env()).env_remove("RUST_LOG");
        if let Some(spec) = rust_log {
            cmd.env("RUST_LOG", spec);
        }
        let mut runner = Runner::spawn(&mut cmd, &dir.path().join("run.log"));
        wait_all_acked(&server, &runner, n as u64, 30);
        // svc's trace line is a pull request's end: idle ones expire after fetch_expiry_ms
        // (200). A run that settled everything sooner had none (a flaky "no trace line").
        std::thread::sleep(Duration::from_millis(1000));
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(20)).expect("exits");
        let log = runner.log_text();
        // Trace is on: svc's own trace lines and ureq's debug lines are there.
        assert!(log.contains("TRACE"), "{rust_log:?}: no trace line");
        assert!(log.contains("Return to pool"), "{rust_log:?}: no ureq line");
        assert!(receiver.requests().iter().all(|r| r["verified"] == true));
        let secrets = [
            QUERY_TOKEN,
            TOKEN,
            &TOKEN[7..],
            &SECRET_NEW[6..],
            &SECRET_OLD[6..],
        ];
        if rust_log == Some("trace,ureq_proto=trace") {
            // The operator named the module: its dump is there (and holds the token).
            let dumped = std::panic::catch_unwind(|| assert_no_secret_piece(&log, &secrets));
            assert!(dumped.is_err(), "ureq_proto=trace did not open the dump");
        } else {
            assert_no_secret_piece(&log, &secrets);
        }
    }
}

/// A 401 that quotes back a key header (`X-Auth-Key`, from `headers_env`) and a static one
/// (`X-Tenant`): neither value reaches a log line; static headers named like keys are refused.
#[test]
fn a_401_quoting_every_configured_header_never_gets_one_printed() {
    const KEY: &str = "k-5e0f3a7b9c1d-auth-key";
    const TENANT: &str = "tenant-2b8e6f4a";
    let (server, dir) = setup(2);
    let receiver = Receiver::start(
        dir.path(),
        &[
            "--mode",
            "status",
            "--status",
            "401",
            "--quote",
            "x-auth-key,x-tenant",
        ],
    );
    let refused = sink(&receiver.url(), json!({"headers": {"X-Auth-Key": KEY}}));
    let cfg = config(&server, dir.path(), refused, json!({}));
    let (code, text) = test_sink(&cfg);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("sink.headers.X-Auth-Key: looks like a secret-bearing header"),
        "{text}"
    );
    assert!(!text.contains(KEY), "{text}");
    let sink = sink(
        &receiver.url(),
        json!({"batching": "none", "headers": {"X-Tenant": TENANT},
               "headers_env": {"X-Auth-Key": "T_KEY"}}),
    );
    let cfg = config(&server, dir.path(), sink, json!({}));
    let mut runner = Runner::start_env(
        &cfg,
        &dir.path().join("run.log"),
        env().into_iter().chain([
            ("T_KEY".into(), KEY.into()),
            ("RUST_LOG".into(), "debug".into()),
        ]),
    );
    let snap = dir.path().join("metrics.json");
    wait_until(Duration::from_secs(30), "refusals", || {
        snapshot_counter(&snap, "http_sink_unusable_total") >= 4
    });
    stop(&mut runner);
    let quoted = receiver.requests();
    assert!(quoted.iter().any(|r| r["headers"]["x-auth-key"] == KEY));
    let log = runner.log_text();
    assert!(
        log.contains("status 401: refused, you sent x-auth-key: <redacted>; x-tenant: <redacted>"),
        "{log}"
    );
    assert_no_secret_piece(&log, &[KEY, TENANT]);
}

#[test]
fn a_slow_receiver_times_out_and_a_cut_answer_is_retried_never_acknowledged() {
    for (mode, expect) in [("slow", "timeout"), ("close", "receiver unavailable")] {
        let (server, dir) = setup(2);
        let receiver = Receiver::start(dir.path(), &["--mode", mode, "--delay", "5"]);
        let sink = sink(
            &receiver.url(),
            json!({"request_timeout_seconds": 1, "retry_budget_seconds": 2}),
        );
        let cfg = config(&server, dir.path(), sink, json!({}));
        let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
        let snap = dir.path().join("metrics.json");
        wait_until(Duration::from_secs(30), "failed requests", || {
            snapshot_counter(&snap, "http_request_failures_total") >= 2
                && snapshot_counter(&snap, "messages_nacked_total") >= 2
        });
        assert_eq!(acked(&server).0, 0, "{mode}");
        stop(&mut runner);
        assert_eq!(acked(&server).0, 0, "{mode}");
        assert!(snapshot_counter(&snap, "http_retries_total") >= 1, "{mode}");
        let log = runner.log_text();
        assert!(log.contains(expect), "{mode}: {log}");
    }
}

#[test]
fn a_gigabyte_answer_is_read_only_to_the_bound() {
    let (server, dir) = setup(1);
    let receiver = Receiver::start(dir.path(), &["--mode", "huge"]);
    let sink = sink(&receiver.url(), json!({}));
    let cfg = config(&server, dir.path(), sink, json!({}));
    let started = Instant::now();
    let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
    wait_all_acked(&server, &runner, 1, 30);
    let took = started.elapsed();
    stop(&mut runner);
    // Success decided by the status; the body read stops at 64 KiB and the connection is
    // dropped, so the receiver's writes fail long before 1 GiB.
    let sent = receiver.huge_sent();
    assert!(sent < 256 << 20, "the receiver wrote {sent} bytes");
    println!("1 GiB answer: acknowledged after {took:?}, receiver wrote {sent} bytes");
}

impl Receiver {
    /// Bytes of the huge answer the receiver managed to write before the client went away.
    fn huge_sent(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(v) = self
                .requests()
                .iter()
                .find_map(|r| r.get("huge_sent").and_then(Value::as_u64))
            {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver never stopped writing"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn kill_9_of_the_runner_and_a_receiver_restart_lose_nothing() {
    let n: u64 = 3000;
    let (server, dir) = setup(n as usize);
    let mut receiver = Receiver::start(dir.path(), &[]);
    let sink = sink(
        &receiver.url(),
        json!({"max_batch_messages": 20, "max_concurrent_requests": 4}),
    );
    let cfg = config(&server, dir.path(), sink, json!({}));
    let mut runner = start_runner(&cfg, &dir.path().join("run1.log"));
    wait_until(Duration::from_secs(60), "some delivered", || {
        receiver.records(200).len() > 300
    });
    runner.sigkill();
    receiver.kill();
    // Acknowledgements the runner wrote before it died reach the broker meanwhile.
    std::thread::sleep(Duration::from_millis(500));
    let floor_at_kill = acked(&server).0;
    // Every acknowledged message had been received before the kill.
    let keys = accepted_keys(&receiver);
    let incarnation = server.incarnation(STREAM);
    for seq in 1..=floor_at_kill {
        assert!(
            keys.contains_key(&format!("nats:{STREAM}:{incarnation}:{seq}")),
            "{seq} acked unsent"
        );
    }
    let mut runner = start_runner(&cfg, &dir.path().join("run2.log"));
    // Receiver down: nothing can be committed.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        acked(&server).0,
        floor_at_kill,
        "nothing acknowledged while the receiver is down"
    );
    receiver.launch();
    wait_all_acked(&server, &runner, n, 120);
    stop(&mut runner);
    let keys = accepted_keys(&receiver);
    assert_eq!(
        keys.keys().cloned().collect::<BTreeSet<_>>(),
        expected_keys(&server, n)
    );
    let repeats: usize = keys.values().map(|c| c - 1).sum();
    println!(
        "{n} messages: {} distinct keys, {repeats} repeats dropped by key",
        keys.len()
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl.
fn make_pki(dir: &Path) {
    crate::support::certs::make_certs(dir);
    let sh = |args: &str| {
        let ok = Command::new("sh")
            .arg("-c")
            .arg(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{args}: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
    };
    sh("openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=svc-client");
    sh("printf 'extendedKeyUsage=clientAuth\\n' > client.ext && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 -extfile client.ext");
    // X.509 v1 (no extensions): rustls refuses it; the sink must say so, not panic.
    sh("openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client-v1.pem -days 2");
    sh("chmod 600 client.key");
}

/// nginx terminating TLS on its own port (client certificates required when `mtls`) and
/// proxying to the receiver. Stopped on drop.
struct Nginx {
    port: u16,
    child: Child,
}

impl Nginx {
    fn start(dir: &Path, upstream: u16, mtls: bool) -> Nginx {
        let port = free_port();
        let verify = if mtls {
            format!(
                "ssl_client_certificate {}; ssl_verify_client on;",
                dir.join("ca.pem").display()
            )
        } else {
            String::new()
        };
        let d = dir.display();
        let conf = format!(
            "daemon off; master_process off; worker_processes 1; pid {d}/nginx-{port}.pid;
             error_log {d}/nginx-{port}.err warn;
             events {{ worker_connections 256; }}
             http {{
               access_log off;
               client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
               uwsgi_temp_path {d}; scgi_temp_path {d};
               server {{
                 listen 127.0.0.1:{port} ssl;
                 ssl_certificate {d}/server.pem; ssl_certificate_key {d}/server.key;
                 {verify}
                 location / {{ proxy_pass http://127.0.0.1:{upstream}; proxy_http_version 1.1;
                              proxy_set_header Connection \"\"; }}
               }}
             }}"
        );
        let path = dir.join(format!("nginx-{port}.conf"));
        std::fs::write(&path, conf).unwrap();
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx (scripts/deps.sh installs it)");
        wait_until(Duration::from_secs(10), "nginx listening", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Nginx { port, child }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn tls_and_mutual_tls_through_nginx() {
    let (server, dir) = setup(5);
    let d = dir.path();
    make_pki(d);
    let receiver = Receiver::start(d, &[]);
    let tls = Nginx::start(d, receiver.port, false);
    let mtls = Nginx::start(d, receiver.port, true);
    let https = |port: u16| format!("https://127.0.0.1:{port}/hook");
    let ca = d.join("ca.pem");
    let client =
        json!({"tls_cert_file": d.join("client.pem"), "tls_key_file": d.join("client.key")});
    let check = |url: String, extra: Value| {
        let mut s = sink(&url, json!({"tls_ca_file": ca}));
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        s.as_object_mut()
            .unwrap()
            .retain(|k, v| !(k == "tls_ca_file" && v.is_null()));
        test_sink(&config(&server, d, s, json!({})))
    };

    // Server TLS with the CA from the config: the receiver answers the probe.
    let (code, text) = check(https(tls.port), json!({}));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("answered 204 to OPTIONS"), "{text}");
    // The system trust store does not know the test CA: a certificate error, not a panic.
    let (code, text) = check(https(tls.port), json!({"tls_ca_file": null}));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("tls") && text.contains("UnknownIssuer"),
        "{text}"
    );
    // mTLS without a client certificate: nginx refuses (400), never usable.
    let (code, text) = check(https(mtls.port), json!({}));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("answered 400"), "{text}");
    // With it: accepted.
    let (code, text) = check(https(mtls.port), client.clone());
    assert_eq!(code, 0, "{text}");
    // A certificate rustls cannot use: a clean error at start, not a panic on first use.
    let v1 =
        json!({"tls_cert_file": d.join("client-v1.pem"), "tls_key_file": d.join("client.key")});
    let (code, text) = check(https(mtls.port), v1);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("not usable as a client certificate") && !text.contains("panicked"),
        "{text}"
    );
    // A key file others can read is refused before any request (the broker's key rule).
    std::fs::set_permissions(
        d.join("client.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let (code, text) = check(https(mtls.port), client.clone());
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("readable or writable by group or others"),
        "{text}"
    );
    std::fs::set_permissions(
        d.join("client.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();

    // Delivery through mTLS.
    let mut s = sink(&https(mtls.port), json!({"tls_ca_file": ca}));
    for (k, v) in client.as_object().unwrap() {
        s[k] = v.clone();
    }
    let cfg = config(&server, d, s, json!({}));
    let mut runner = start_runner(&cfg, &d.join("run.log"));
    wait_all_acked(&server, &runner, 5, 30);
    stop(&mut runner);
    assert_eq!(accepted_keys(&receiver).len(), 5);
}

#[test]
fn as_a_fanout_child_beside_a_file_sink() {
    let (server, dir) = setup(10);
    let receiver = Receiver::start(dir.path(), &[]);
    let out = dir.path().join("files");
    let fan = json!({
        "type": "fanout",
        "sinks": {"files": {"type": "file", "directory": out},
                  "hook": sink(&receiver.url(), json!({"body": "payload"}))},
        "routing": {"enabled": true,
                    "target_sink_types": {"files": "file", "hook": "http"},
                    "routes": [{"name": "all", "match": {"subject": ">"},
                                "targets": ["files", "hook"]}]}
    });
    let cfg = config(&server, dir.path(), fan, json!({}));
    let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
    wait_all_acked(&server, &runner, 10, 30);
    stop(&mut runner);
    let records = receiver.records(200);
    assert_eq!(records.len(), 10);
    let orders: BTreeSet<u64> = records
        .iter()
        .map(|r| r["payload"]["order"].as_u64().unwrap())
        .collect();
    assert_eq!(orders, (0..10).collect());
}

#[test]
fn kept_nats_headers_are_forwarded_and_no_proxy_bypasses_the_proxy() {
    let (server, dir) = setup(0);
    server.publish_with_headers(
        "orders.created",
        &[("Trace-Id", "trace-77")],
        b"{\"order\":1}",
    );
    let receiver = Receiver::start(dir.path(), &[]);
    // Nothing listens on the proxy's port: a request through it cannot succeed.
    let proxy = format!("http://127.0.0.1:{}", free_port());
    let direct = sink(
        &receiver.url(),
        json!({"batching": "none", "keep_headers": ["Trace-Id"], "proxy": proxy,
               "no_proxy": ["127.0.0.1"]}),
    );
    let envelope = json!({"envelope": {"keep_headers": ["Trace-Id"]}});
    let cfg = config(&server, dir.path(), direct, envelope.clone());
    let (code, text) = test_sink(&cfg);
    assert_eq!(code, 0, "{text}");
    let mut runner = start_runner(&cfg, &dir.path().join("run.log"));
    wait_all_acked(&server, &runner, 1, 30);
    stop(&mut runner);
    let requests = receiver.requests();
    assert_eq!(requests[0]["headers"]["trace-id"], "trace-77");
    assert!(requests[0]["body"]
        .as_str()
        .unwrap()
        .starts_with("{\"schema\":\"svc.file.message.v1\""));

    let proxied = sink(&receiver.url(), json!({"proxy": proxy}));
    let (code, text) = test_sink(&config(&server, dir.path(), proxied, envelope));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("got no answer"), "{text}");
    assert_eq!(
        receiver.requests().len(),
        1,
        "the probe went through the proxy"
    );
}

#[test]
fn test_sink_reports_the_probe_status_and_never_success_without_an_answer() {
    let (server, dir) = setup(0);
    let mut receiver = Receiver::start(dir.path(), &[]);
    let probe = format!("http://127.0.0.1:{}/health", receiver.port);
    for (method, want) in [
        ("GET", "answered 200 to GET"),
        ("HEAD", "answered 200 to HEAD"),
    ] {
        let s = sink(
            &receiver.url(),
            json!({"probe_method": method, "probe_url": probe}),
        );
        let (code, text) = test_sink(&config(&server, dir.path(), s, json!({})));
        assert_eq!(code, 0, "{text}");
        assert!(text.contains(want), "{text}");
    }
    receiver.kill();
    let (code, text) = test_sink(&config(
        &server,
        dir.path(),
        sink(&receiver.url(), json!({})),
        json!({}),
    ));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("OPTIONS got no answer"), "{text}");
    assert!(
        receiver.requests().is_empty(),
        "probes are never stored as deliveries"
    );
}
