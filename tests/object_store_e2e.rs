//! `svc` end to end into the object store: a real `nats-server -js`, moto (signature checking
//! enforced) and the `svc` binary. Commit first, ACK last, across store outages and a SIGKILL
//! of the runner; `svc test-sink` verdicts, including TLS.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::broker::NatsServer;
use crate::support::process::svc_run;
use crate::support::process::Runner;
use crate::support::{assert_no_secret_piece, snapshot_counter, wait_until, write_config};
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";

fn setup(n: usize) -> (NatsServer, tempfile::TempDir) {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    publish(&server, 0, n);
    (server, tempfile::tempdir().unwrap())
}

fn publish(server: &NatsServer, from: usize, n: usize) {
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{}}}", from + i).into_bytes()
    });
}

fn sink_block(endpoint: &str, bucket: &str, extra: Value) -> Value {
    let mut v = json!({
        "type": "object_store", "bucket": bucket, "endpoint_url": endpoint,
        "allow_http_for_local_testing": true, "credential_mode": "environment",
        "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
        "key_strategy": "stream_sequence",
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn config(server: &NatsServer, dir: &Path, sink: Value) -> PathBuf {
    let cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": SUBJECT},
        "delivery": {"batch_size": 64, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "sink_workers": 2, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 200, "jitter": "none"}},
        "sink": sink,
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    write_config(dir, "c.json", &cfg)
}

/// `svc run` with the sink's credentials in its environment.
fn start_runner(config: &Path, log: &Path, env: &HashMap<String, String>) -> Runner {
    Runner::start_env(config, log, env)
}

/// `svc test-sink` with the given environment: (exit code, stdout, stderr).
fn test_sink(config: &Path, env: &HashMap<String, String>) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("test-sink")
        .arg(config)
        .envs(env)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ack_floor(server: &NatsServer) -> u64 {
    server
        .try_consumer_state(STREAM, CONSUMER)
        .map(|s| s.0)
        .unwrap_or(0)
}

fn all_acked(server: &NatsServer, n: u64) -> bool {
    server.try_consumer_state(STREAM, CONSUMER) == Some((n, 0, 0))
}

/// Every sequence 1..=n has exactly one object version, and nothing else is in the bucket.
fn assert_stored_once(server: &NatsServer, m: &crate::support::moto::Moto, bucket: &str, n: u64) {
    let versions = m.versions(bucket);
    let incarnation = server.incarnation(STREAM);
    for seq in 1..=n {
        let key = format!("stream-sequence/{STREAM}/{incarnation}/{seq}.json");
        assert_eq!(
            versions.get(&key),
            Some(&1),
            "{key}: versions {:?}",
            versions.get(&key)
        );
    }
    assert_eq!(versions.len() as u64, n, "no other objects");
}

/// `logging.level: "trace"` with a bare `RUST_LOG=trace` too: the HTTP library's request
/// dump would print the session token (`X-Amz-Security-Token`) and the SigV4 signature; none
/// of the secret key, the session token or the key id reaches the log, in whole or in rows.
#[test]
fn at_trace_level_no_credential_of_the_sink_reaches_the_log() {
    let m = crate::support::moto::Moto::start();
    let (key_id, secret, token) = m.temporary_credentials(1).remove(0);
    for rust_log in [None, Some("trace")] {
        let n = 20;
        let (server, dir) = setup(n);
        let bucket = format!("e2e-trace-{}", if rust_log.is_some() { 1 } else { 0 });
        m.create_bucket(&bucket, false);
        let sink = sink_block(
            &m.endpoint(),
            &bucket,
            json!({"session_token_env": "T_TOKEN"}),
        );
        let mut cfg: Value = serde_json::from_str(
            &std::fs::read_to_string(config(&server, dir.path(), sink)).unwrap(),
        )
        .unwrap();
        cfg["logging"]["level"] = json!("trace");
        let cfg = write_config(dir.path(), "trace.json", &cfg);
        let mut cmd = svc_run(&cfg);
        cmd.env_remove("RUST_LOG")
            .env("T_KEY_ID", &key_id)
            .env("T_SECRET", &secret)
            .env("T_TOKEN", &token);
        if let Some(spec) = rust_log {
            cmd.env("RUST_LOG", spec);
        }
        let mut runner = Runner::spawn(&mut cmd, &dir.path().join("run.log"));
        wait_until(Duration::from_secs(60), "all acknowledged", || {
            all_acked(&server, n as u64)
        });
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(20)).expect("exits");
        let log = runner.log_text();
        assert!(log.contains("TRACE"), "{rust_log:?}: no trace line");
        assert_no_secret_piece(&log, &[&secret, &token, &key_id]);
    }
}

#[test]
fn store_outage_acks_nothing_until_it_returns_then_stores_once() {
    let n = 200;
    let (server, dir) = setup(n);
    let m = crate::support::moto::Moto::start();
    m.create_bucket("e2e-outage", true);
    let proxy = crate::support::moto::OutageProxy::start(m.port);
    let cfg = config(
        &server,
        dir.path(),
        sink_block(
            &proxy.endpoint(),
            "e2e-outage",
            json!({"request_timeout_seconds": 2, "max_retries": 1, "retry_backoff_ms": 50}),
        ),
    );
    let mut runner = start_runner(&cfg, &dir.path().join("svc.log"), &m.env());
    wait_until(Duration::from_secs(60), "first messages acked", || {
        all_acked(&server, n as u64)
    });

    // The store goes away; more messages arrive.
    proxy.take_down();
    publish(&server, n, n);
    let snap = dir.path().join("metrics.json");
    wait_until(Duration::from_secs(30), "write errors and NAKs", || {
        snapshot_counter(&snap, "sink_write_errors_total") >= n as u64
            && snapshot_counter(&snap, "messages_nacked_total") >= n as u64
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        ack_floor(&server),
        n as u64,
        "nothing acked while the store is down"
    );
    assert_eq!(snapshot_counter(&snap, "messages_acked_total"), n as u64);

    // Back: every message stored once and acked.
    proxy.bring_up();
    wait_until(
        Duration::from_secs(90),
        "everything acked after the outage",
        || all_acked(&server, 2 * n as u64),
    );
    assert_stored_once(&server, &m, "e2e-outage", 2 * n as u64);
    assert!(snapshot_counter(&snap, "sink_retries_total") > 0);
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20)).expect("exits");
    assert!(status.success(), "{}", runner.log_text());
    let log = runner.log_text();
    assert!(!log.contains(&m.secret), "secret in the log");
}

#[test]
fn sigkill_mid_run_and_restart_stores_every_message_once() {
    let n = 1500;
    let (server, dir) = setup(n);
    let m = crate::support::moto::Moto::start();
    m.create_bucket("e2e-kill", true);
    let cfg = config(
        &server,
        dir.path(),
        sink_block(&m.endpoint(), "e2e-kill", json!({"max_retries": 2})),
    );
    let mut runner = start_runner(&cfg, &dir.path().join("svc1.log"), &m.env());
    wait_until(Duration::from_secs(60), "some messages acked", || {
        ack_floor(&server) >= 200
    });
    runner.sigkill();
    let floor = ack_floor(&server);
    assert!(
        floor < n as u64,
        "killed mid-run (ack floor {floor} of {n})"
    );

    let mut runner = start_runner(&cfg, &dir.path().join("svc2.log"), &m.env());
    wait_until(Duration::from_secs(120), "all acked after restart", || {
        all_acked(&server, n as u64)
    });
    // One version per key: no object was ever written twice (with different bytes or not).
    assert_stored_once(&server, &m, "e2e-kill", n as u64);
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .success());
}

#[test]
fn test_sink_verdicts() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let m = crate::support::moto::Moto::start();
    m.create_bucket("e2e-check", false);
    let cfg = config(
        &server,
        dir.path(),
        sink_block(&m.endpoint(), "e2e-check", json!({})),
    );

    let (code, out, err) = test_sink(&cfg, &m.env());
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("Sink object_store is usable: bucket e2e-check at http://127.0.0.1:"),
        "{out}"
    );
    assert!(out.contains("is reachable and writable"), "{out}");

    let mut wrong = m.env();
    wrong.insert("T_SECRET".into(), "wrong-secret-value".into());
    let (code, out, err) = test_sink(&cfg, &wrong);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("Sink object_store is NOT usable"), "{err}");
    assert!(err.contains("403 SignatureDoesNotMatch"), "{err}");
    assert!(!err.contains("wrong-secret-value") && !out.contains("wrong-secret-value"));

    let (code, _, err) = test_sink(&cfg, &HashMap::new());
    assert_eq!(code, 1);
    assert!(
        err.contains("credential_mode environment: variable T_KEY_ID is not set or empty"),
        "{err}"
    );

    let missing = config(
        &server,
        dir.path(),
        sink_block(&m.endpoint(), "e2e-none", json!({})),
    );
    let (code, _, err) = test_sink(&missing, &m.env());
    assert_eq!(code, 1);
    assert!(err.contains("404 NoSuchBucket"), "{err}");

    // validate never contacts the store and names the sink.
    let (code, out, _) = crate::support::process::svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("Active sink: object_store"), "{out}");
    let bad = config(
        &server,
        dir.path(),
        json!({"type": "object_store", "bucket": "Bad_Bucket",
               "endpoint_url": "http://10.1.2.3:9000", "allow_http_for_local_testing": true,
               "metadata_mode": "sidecar", "duplicate_policy": "fail_existing"}),
    );
    let (code, _, err) = crate::support::process::svc(&["validate", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    for line in [
        "sink.bucket: must contain only lowercase letters, digits, '.' and '-'",
        "sink.endpoint_url: http is allowed only for the loopback hosts localhost, 127.0.0.1 and [::1]",
        "sink.metadata_mode: sidecar cannot be combined with duplicate_policy fail_existing",
    ] {
        assert!(err.contains(line), "{line} in {err}");
    }
}

/// A test CA, a server certificate for 127.0.0.1 signed by it, and a self-signed leaf.
fn certs(dir: &Path) {
    crate::support::certs::make_certs(dir);
}

#[test]
fn tls_verdicts_of_test_sink_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    certs(tmp.path());
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    publish(&server, 0, 20);

    // A self-signed server: a clean certificate error, never a panic.
    let s_server = crate::support::certs::TlsServer::start(
        &tmp.path().join("self.pem"),
        &tmp.path().join("self.key"),
    );
    let port = s_server.port;
    let env = HashMap::from([
        ("T_KEY_ID".to_string(), "AKIDEXAMPLE".to_string()),
        ("T_SECRET".to_string(), "secret".to_string()),
    ]);
    let dir = tmp.path().join("self");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = config(
        &server,
        &dir,
        sink_block(&format!("https://127.0.0.1:{port}"), "e2e-tls", json!({})),
    );
    let (code, out, err) = test_sink(&cfg, &env);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("tls: rustls: invalid peer certificate: UnknownIssuer"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    // `svc run` against it: errors, NAKs, nothing acked, no panic; exits cleanly on TERM.
    let mut runner = start_runner(&cfg, &dir.join("svc.log"), &env);
    let snap = dir.join("metrics.json");
    wait_until(
        Duration::from_secs(30),
        "certificate errors counted",
        || snapshot_counter(&snap, "sink_write_errors_total") >= 20,
    );
    assert_eq!(ack_floor(&server), 0, "nothing acked");
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20)).expect("exits");
    let log = runner.log_text();
    assert!(status.success(), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("invalid peer certificate"), "{log}");
    drop(s_server);

    // moto over TLS with the test CA configured: success, then the messages are stored.
    let m = crate::support::moto::Moto::start_tls(
        &tmp.path().join("server.pem"),
        &tmp.path().join("server.key"),
        &tmp.path().join("ca.pem"),
    );
    m.create_bucket("e2e-tls", false);
    let dir = tmp.path().join("ca");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = config(
        &server,
        &dir,
        sink_block(
            &m.endpoint(),
            "e2e-tls",
            json!({"ca_file": tmp.path().join("ca.pem")}),
        ),
    );
    let (code, out, err) = test_sink(&cfg, &m.env());
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("at https://127.0.0.1:"), "{out}");
    let mut runner = start_runner(&cfg, &dir.join("svc.log"), &m.env());
    wait_until(Duration::from_secs(60), "all acked over TLS", || {
        all_acked(&server, 20)
    });
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .success());
}

/// A batch held in the sink longer than AckWait must be kept alive with in-progress acks,
/// not redelivered: moto is paused (SIGSTOP) with puts in flight for three times AckWait.
#[test]
fn batches_held_past_ack_wait_get_in_progress_acks_not_redelivery() {
    let n = 40;
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(2));
    let dir = tempfile::tempdir().unwrap();
    let m = crate::support::moto::Moto::start();
    m.create_bucket("e2e-progress", true);
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({
            "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": SUBJECT},
            "delivery": {"batch_size": 64, "max_batch_wait_ms": 20, "in_progress_fraction": 0.25,
                         "shutdown_timeout_seconds": 10},
            "sink": sink_block(&m.endpoint(), "e2e-progress", json!({"request_timeout_seconds": 60})),
            "metrics": {"enabled": true, "snapshot_file": dir.path().join("metrics.json"),
                        "write_interval_seconds": 1},
            "logging": {"level": "info"}
        }),
    );
    let mut runner = start_runner(&cfg, &dir.path().join("svc.log"), &m.env());
    wait_until(Duration::from_secs(20), "runner bound", || {
        runner.log_text().contains("bound to consumer")
    });
    let snap = dir.path().join("metrics.json");
    m.pause();
    publish(&server, 0, n);
    wait_until(Duration::from_secs(20), "messages in flight", || {
        snapshot_counter(&snap, "messages_fetched_total") >= n as u64
    });
    // Three times AckWait with the puts hanging.
    std::thread::sleep(Duration::from_secs(6));
    m.resume();
    wait_until(Duration::from_secs(60), "all acked", || {
        all_acked(&server, n as u64)
    });
    assert_stored_once(&server, &m, "e2e-progress", n as u64);
    let info = server.js().consumer_info(STREAM, CONSUMER).unwrap();
    assert_eq!(info.num_redelivered, 0, "nothing redelivered");
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .success());
    assert_eq!(snapshot_counter(&snap, "messages_fetched_total"), n as u64);
    assert!(
        snapshot_counter(&snap, "messages_in_progress_total") >= 2 * n as u64,
        "in-progress acks sent repeatedly"
    );
}

/// Unacknowledged messages the broker counts for the consumer now.
fn ack_pending(server: &NatsServer) -> usize {
    server
        .try_consumer_state(STREAM, CONSUMER)
        .map(|s| s.1)
        .unwrap_or(0)
}

/// The most unacknowledged messages seen over `span`, sampled every 100 ms.
fn max_ack_pending_over(server: &NatsServer, span: Duration) -> usize {
    let end = std::time::Instant::now() + span;
    let mut max = 0;
    while std::time::Instant::now() < end {
        max = max.max(ack_pending(server));
        std::thread::sleep(Duration::from_millis(100));
    }
    max
}

/// `delivery.max_in_flight_bytes` bounds what the runner holds in bytes, whatever its message
/// credits allow (256 here): with the store hung, a backlog of 256 KiB messages stops at the
/// few that fit 1 MiB. A message larger than the bound (3 MiB, the broker takes 4 MiB) is
/// fetched alone: nothing else is delivered while it is held. Everything arrives once the
/// store answers again.
#[test]
fn the_byte_bound_holds_in_flight_payload_and_a_larger_message_flows_alone() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats-server.conf");
    std::fs::write(&conf, "max_payload: 4194304\n").unwrap();
    let server = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    let body = |i: usize, size: usize| {
        let mut b = format!("{{\"order\":{i},\"pad\":\"").into_bytes();
        b.resize(size - 2, b'x');
        b.extend_from_slice(b"\"}");
        b
    };
    let small = 256 * 1024;
    server.publish_n(STREAM, "orders.created", 40, |i| body(i, small));
    let m = crate::support::moto::Moto::start();
    m.create_bucket("bound", false);
    m.pause();
    let mut cfg: Value = serde_json::from_slice(
        &std::fs::read(config(
            &server,
            dir.path(),
            sink_block(&m.endpoint(), "bound", json!({})),
        ))
        .unwrap(),
    )
    .unwrap();
    cfg["delivery"]["max_in_flight_bytes"] = json!(1024 * 1024);
    let cfg = write_config(dir.path(), "bound.json", &cfg);
    let mut runner = start_runner(&cfg, &dir.path().join("svc.log"), &m.env());

    wait_until(Duration::from_secs(20), "first deliveries", || {
        ack_pending(&server) > 0
    });
    let held = max_ack_pending_over(&server, Duration::from_secs(3));
    // 1 MiB holds three messages of 256 KiB and their subjects; the message credits would
    // allow every one of the 40.
    assert!(
        (1..=4).contains(&held),
        "{held} messages of 256 KiB unacknowledged under a 1 MiB bound"
    );
    m.resume();
    wait_until(Duration::from_secs(60), "the backlog acknowledged", || {
        all_acked(&server, 40)
    });

    m.pause();
    server.publish_n(STREAM, "orders.created", 1, |_| body(40, 3 * 1024 * 1024));
    server.publish_n(STREAM, "orders.created", 5, |i| body(41 + i, small));
    wait_until(
        Duration::from_secs(20),
        "the large message delivered",
        || ack_pending(&server) > 0,
    );
    let held = max_ack_pending_over(&server, Duration::from_secs(3));
    assert_eq!(held, 1, "the message over the bound is held alone");
    m.resume();
    wait_until(Duration::from_secs(60), "everything acknowledged", || {
        all_acked(&server, 46)
    });
    assert_stored_once(&server, &m, "bound", 46);
    assert!(
        runner
            .log_text()
            .contains("the next message is larger than a pull request's allowance of 1048576"),
        "{}",
        runner.log_text()
    );
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(15))
        .unwrap()
        .success());
}
