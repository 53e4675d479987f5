//! Which messages a consumer the runner creates delivers, against a real `nats-server -js`
//! (2.9.10, and the current release through `SVC_NATS_SERVER`): several filter subjects
//! (`nats.subjects`, nats-server 2.10 and later: `filter_subjects`), refused with the server's
//! version by an older server, and where a new consumer starts (`nats.deliver_policy`). An
//! existing consumer is never changed or moved.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::consumer_shapes::consumer_json;
use crate::support::broker::*;
use crate::support::process::*;
use crate::support::protection::records;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";

/// Whether the server the tests run has `filter_subjects` (2.10 and later), read from the
/// version its INFO gives.
fn has_filter_subjects(server: &NatsServer) -> bool {
    let version = server.connect().server_version();
    let mut parts = version.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (2, 10)
}

/// `svc run` with a per-event file sink under `dir/out`, consumer `svc`, and `nats` fields
/// (`subject` or `subjects`, `consumer_mode`, `deliver_policy`, ...) merged in.
fn config(server: &NatsServer, dir: &Path, nats: Value) -> PathBuf {
    let mut n = json!({"url": server.url(), "stream": STREAM, "consumer": "svc"});
    for (k, v) in nats.as_object().unwrap() {
        n[k] = v.clone();
    }
    let cfg = json!({
        "nats": n,
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 500, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 5},
        "sink": {"type": "file", "directory": dir.join("out"), "mode": "per_event",
                 "key_strategy": "stream_sequence"},
        "logging": {"level": "info"}
    });
    write_config(dir, "c.json", &cfg)
}

/// Stored records: stream sequence -> subject.
fn stored(dir: &Path) -> BTreeMap<u64, String> {
    records(&dir.join("out"))
        .into_iter()
        .map(|(seq, (_, v))| (seq, v["subject"].as_str().unwrap_or("?").to_string()))
        .collect()
}

/// Starts `svc run` and waits until it is bound; panics with its log when it exits first.
fn start_bound(cfg: &Path, dir: &Path) -> Runner {
    let mut runner = Runner::start(cfg, &dir.join("svc.log"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runner.log_text().contains("bound to consumer") {
        let gone = runner.child.try_wait().unwrap().is_some();
        assert!(
            !gone && Instant::now() < deadline,
            "not bound: {}",
            runner.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    runner
}

/// Waits until `n` records are stored and every delivery is acknowledged (nothing pending
/// for consumer `name`), then stops the runner; its log.
fn drain_and_stop(mut runner: Runner, server: &NatsServer, dir: &Path, n: usize) -> String {
    wait_until(
        Duration::from_secs(30),
        "records stored and acknowledged",
        || stored(dir).len() >= n && server.consumer_state(STREAM, "svc").1 == 0,
    );
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(15));
    let log = runner.log_text();
    assert!(status.expect("exits").success(), "{log}");
    log
}

/// Runs `svc run` until it exits (at most 30 s): its exit code and log.
fn run_to_exit(cfg: &Path, dir: &Path) -> (Option<i32>, String) {
    let mut runner = Runner::start(cfg, &dir.join("svc.log"));
    let status = runner.wait_timeout(Duration::from_secs(30));
    (status.and_then(|s| s.code()), runner.log_text())
}

/// Two filter subjects: each of their messages is stored once, and the third subject's,
/// published before, between and after them, never. The consumer carries exactly the two
/// as `filter_subjects`; a later run whose subjects differ is refused and changes nothing.
#[test]
fn two_filter_subjects_never_deliver_a_third() {
    let server = NatsServer::start();
    if !has_filter_subjects(&server) {
        eprintln!(
            "skipped: nats-server {} has no filter_subjects (2.10 and later; \
             a_server_without_filter_subjects_refuses_several covers it)",
            server.connect().server_version()
        );
        return;
    }
    server.create_stream(STREAM, &["orders.>"]);
    let dir = tempfile::tempdir().unwrap();
    let body = |i: usize| format!("{{\"n\":{i}}}").into_bytes();
    server.publish_n(STREAM, "orders.c", 3, body);
    server.publish_n(STREAM, "orders.a", 4, body);
    server.publish_n(STREAM, "orders.c", 3, body);
    server.publish_n(STREAM, "orders.b.eu", 2, body);
    let subjects = json!(["orders.a", "orders.b.>"]);
    let cfg = config(
        &server,
        dir.path(),
        json!({"subjects": subjects, "consumer_mode": "create"}),
    );
    let runner = start_bound(&cfg, dir.path());
    server.publish_n(STREAM, "orders.c", 3, body);
    server.publish_n(STREAM, "orders.b.us", 1, body);
    drain_and_stop(runner, &server, dir.path(), 7);
    let got = stored(dir.path());
    let wanted: BTreeMap<u64, String> = [
        (4, "orders.a"),
        (5, "orders.a"),
        (6, "orders.a"),
        (7, "orders.a"),
        (11, "orders.b.eu"),
        (12, "orders.b.eu"),
        (16, "orders.b.us"),
    ]
    .into_iter()
    .map(|(s, subject)| (s, subject.to_string()))
    .collect();
    assert_eq!(got, wanted);
    assert_eq!(server.consumer_state(STREAM, "svc"), (16, 0, 0));
    let consumer = consumer_json(&server);
    assert_eq!(consumer["filter_subjects"], subjects, "{consumer}");
    assert!(
        consumer["filter_subject"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{consumer}"
    );

    // Another filter set for the existing consumer: refused in every mode, never changed.
    for (mode, other) in [
        ("reconcile", json!(["orders.a"])),
        ("create", json!(["orders.a", "orders.b.>", "orders.c"])),
        ("bind", json!(["orders.b.>", "orders.a"])),
    ] {
        let cfg = config(
            &server,
            dir.path(),
            json!({"subjects": other, "consumer_mode": mode}),
        );
        if mode == "bind" {
            // The same set in another order is the same consumer: it binds and runs.
            let mut runner = start_bound(&cfg, dir.path());
            runner.signal("TERM");
            let status = runner.wait_timeout(Duration::from_secs(15));
            assert!(status.expect("exits").success(), "{}", runner.log_text());
            continue;
        }
        let (code, log) = run_to_exit(&cfg, dir.path());
        assert_eq!(code, Some(1), "{mode}: {log}");
        assert!(
            log.contains(
                "but the consumer filters subjects \"orders.a, orders.b.>\"; they must be equal"
            ) || log.contains(
                "but the consumer filters subject \"orders.a, orders.b.>\"; they must be equal"
            ),
            "{mode}: {log}"
        );
        assert_eq!(consumer_json(&server)["filter_subjects"], subjects);
    }
}

/// nats-server 2.9 has no `filter_subjects` (it would ignore the field and create a consumer
/// of the whole stream): several subjects stop the run at start, naming the server's
/// version, in every mode, and no consumer is created.
#[test]
fn a_server_without_filter_subjects_refuses_several() {
    let server = NatsServer::start();
    if has_filter_subjects(&server) {
        eprintln!(
            "skipped: nats-server {} has filter_subjects (the refusal is for 2.9 and older)",
            server.connect().server_version()
        );
        return;
    }
    let version = server.connect().server_version();
    server.create_stream(STREAM, &["orders.>"]);
    server.publish_n(STREAM, "orders.c", 2, |_| b"{}".to_vec());
    let dir = tempfile::tempdir().unwrap();
    for mode in ["create", "reconcile", "bind"] {
        let cfg = config(
            &server,
            dir.path(),
            json!({"subjects": ["orders.a", "orders.b"], "consumer_mode": mode}),
        );
        let (code, log) = run_to_exit(&cfg, dir.path());
        assert_eq!(code, Some(1), "{mode}: {log}");
        let said = format!(
            "nats.subjects names 2 subjects, which needs a consumer with filter_subjects \
             (nats-server 2.10 or later), but the server is nats-server {version}"
        );
        assert!(log.contains(&said), "{mode}: {log}");
        assert!(server.try_consumer_state(STREAM, "svc").is_none(), "{log}");
        assert!(stored(dir.path()).is_empty());
    }
}

/// Each `nats.deliver_policy` creates a consumer that starts where asked: the stored stream
/// sequences are exactly those from the start on, and the consumer reports the policy.
#[test]
fn each_deliver_policy_starts_where_asked() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    let body = |i: usize| format!("{{\"n\":{i}}}").into_bytes();
    // 1-5 on orders.a, 6-8 on orders.b; `mark` lies between 5 and 6.
    server.publish_n(STREAM, "orders.a", 5, body);
    std::thread::sleep(Duration::from_millis(50));
    let mark = svc::text::rfc3339::format_rfc3339_nanos(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128,
    );
    std::thread::sleep(Duration::from_millis(50));
    server.publish_n(STREAM, "orders.b", 3, body);
    for (nats, wanted) in [
        (json!({}), vec![1, 2, 3, 4, 5, 6, 7, 8]),
        (
            json!({"deliver_policy": "all"}),
            vec![1, 2, 3, 4, 5, 6, 7, 8],
        ),
        (
            json!({"deliver_policy": "by_start_sequence", "opt_start_seq": 4}),
            vec![4, 5, 6, 7, 8],
        ),
        (
            json!({"deliver_policy": "by_start_time", "opt_start_time": mark}),
            vec![6, 7, 8],
        ),
        (json!({"deliver_policy": "last_per_subject"}), vec![5, 8]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut n = json!({"subject": "orders.>", "consumer_mode": "create"});
        for (k, v) in nats.as_object().unwrap() {
            n[k] = v.clone();
        }
        let cfg = config(&server, dir.path(), n);
        let runner = start_bound(&cfg, dir.path());
        let log = drain_and_stop(runner, &server, dir.path(), wanted.len());
        let got: Vec<u64> = stored(dir.path()).into_keys().collect();
        assert_eq!(got, wanted, "{nats}: {log}");
        let policy = nats["deliver_policy"].as_str().unwrap_or("all");
        assert_eq!(consumer_json(&server)["deliver_policy"], policy, "{nats}");
        assert!(
            log.contains(&format!("starting at deliver_policy {policy}")),
            "{log}"
        );
        server.js().delete_consumer(STREAM, "svc").unwrap();
    }
    // `new`: nothing stored before the consumer, everything after.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &server,
        dir.path(),
        json!({"subject": "orders.>", "consumer_mode": "reconcile", "deliver_policy": "new"}),
    );
    let runner = start_bound(&cfg, dir.path());
    server.publish_n(STREAM, "orders.c", 2, body);
    drain_and_stop(runner, &server, dir.path(), 2);
    let got: Vec<u64> = stored(dir.path()).into_keys().collect();
    assert_eq!(got, [9, 10]);
    assert_eq!(consumer_json(&server)["deliver_policy"], "new");
}

/// An existing consumer is never moved: a different `nats.deliver_policy` is reported in the
/// log, the consumer keeps its start, and every message from there is delivered.
#[test]
fn an_existing_consumer_is_not_moved() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.publish_n(STREAM, "orders.a", 5, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    server.create_consumer(STREAM, "svc", "orders.>", Duration::from_secs(30));
    for mode in ["create", "reconcile"] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            &server,
            dir.path(),
            json!({"subject": "orders.>", "consumer_mode": mode,
                   "deliver_policy": "by_start_sequence", "opt_start_seq": 4}),
        );
        let runner = start_bound(&cfg, dir.path());
        let wanted: Vec<u64> = match mode {
            "create" => vec![1, 2, 3, 4, 5],
            // Acknowledged by the first run: nothing left.
            _ => vec![],
        };
        if wanted.is_empty() {
            server.publish_n(STREAM, "orders.a", 1, |_| b"{}".to_vec());
        }
        let log = drain_and_stop(runner, &server, dir.path(), wanted.len().max(1));
        let got: Vec<u64> = stored(dir.path()).into_keys().collect();
        if wanted.is_empty() {
            assert_eq!(got, [6], "{log}");
        } else {
            assert_eq!(got, wanted, "{log}");
        }
        assert!(
            log.contains(
                "exists and keeps its position: the consumer starts at deliver_policy all, \
                 not by_start_sequence (opt_start_seq 4)"
            ),
            "{mode}: {log}"
        );
        let consumer = consumer_json(&server);
        assert_eq!(consumer["deliver_policy"], "all", "{consumer}");
        assert!(consumer
            .get("opt_start_seq")
            .is_none_or(|s| s.is_null() || s == 0));
    }
}

/// Bad `nats.subjects` and start settings: `svc validate` names the field and the reason and
/// exits 2.
#[test]
fn bad_subjects_and_starts_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (nats, said) in [
        (
            json!({"subjects": ["orders.>", "orders.eu.*"], "consumer_mode": "create"}),
            "nats.subjects[1]: \"orders.eu.*\" overlaps subjects[0] \"orders.>\"",
        ),
        (
            json!({"subjects": [], "consumer_mode": "create"}),
            "nats.subjects: must name at least one subject",
        ),
        (
            json!({"subject": "orders.>", "consumer_mode": "create",
                   "deliver_policy": "by_start_time", "opt_start_seq": 3}),
            "nats.opt_start_seq: goes only with deliver_policy \"by_start_sequence\"",
        ),
        (
            json!({"subject": "orders.>", "consumer_mode": "bind", "deliver_policy": "new"}),
            "nats.deliver_policy: applies only to a consumer the runner creates",
        ),
    ] {
        let mut n = json!({"url": "nats://127.0.0.1:4222", "stream": STREAM, "consumer": "svc"});
        for (k, v) in nats.as_object().unwrap() {
            n[k] = v.clone();
        }
        let cfg = write_config(
            dir.path(),
            "c.json",
            &json!({"nats": n, "sink": {"type": "file", "directory": dir.path().join("out")}}),
        );
        let (code, _, err) = svc(&["validate", cfg.to_str().unwrap()]);
        assert_eq!(code, 2, "{nats}: {err}");
        assert!(err.contains(said), "{nats}: {err}");
    }
}

/// `svc inspect` of a config with several subjects reads the messages of those subjects
/// only (as `filter_subjects`, 2.10 and later; refused naming the version before), and
/// `--subject` may narrow to within any one of them, never outside them.
#[test]
fn inspect_reads_the_configured_subjects_only() {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    for subject in [
        "orders.a",
        "orders.c",
        "orders.b.eu",
        "orders.c",
        "orders.a",
    ] {
        server.publish_n(STREAM, subject, 1, |_| b"{}".to_vec());
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &server,
        dir.path(),
        json!({"subjects": ["orders.a", "orders.b.>"], "consumer_mode": "create"}),
    );
    let inspect = |extra: &[&str]| {
        let mut args = vec!["inspect", cfg.to_str().unwrap(), "--last", "5", "--format"];
        args.push("jsonl");
        args.extend_from_slice(extra);
        svc(&args)
    };
    let sequences = |out: &str| -> Vec<u64> {
        out.lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["stream_sequence"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    let (code, out, err) = inspect(&[]);
    if !has_filter_subjects(&server) {
        assert_eq!(code, 1, "{out}{err}");
        assert!(
            err.contains(
                "needs a consumer with filter_subjects (nats-server 2.10 or later), \
                          but the server is nats-server 2.9"
            ),
            "{err}"
        );
        return;
    }
    assert_eq!(code, 0, "{err}");
    assert_eq!(sequences(&out), [1, 3, 5]);
    let (code, out, err) = inspect(&["--subject", "orders.b.*"]);
    assert_eq!((code, sequences(&out)), (0, vec![3]), "{err}");
    let (code, _, err) = inspect(&["--subject", "orders.c"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "--subject orders.c is not within the configured subjects orders.a, orders.b.>"
        ),
        "{err}"
    );
}

/// A fake broker (loopback, no auth, version 2.10.0) for one connection: the first
/// `$JS.API.CONSUMER.INFO` says "consumer not found", every later one and the consumer's
/// creation answer a consumer whose config is `config`, whatever was asked.
fn start_hostile_broker(config: Value) -> (u16, Arc<Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    std::thread::Builder::new()
        .name("hostile-consumer".into())
        .spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut out = tcp.try_clone().unwrap();
            let info = format!(
                "INFO {{\"server_id\":\"hostile\",\"version\":\"2.10.0\",\"proto\":1,\
                 \"host\":\"127.0.0.1\",\"port\":{port},\"max_payload\":1048576,\
                 \"headers\":true,\"client_id\":1,\"go\":\"go1.22\"}}\r\n"
            );
            out.write_all(info.as_bytes()).unwrap();
            let consumer = json!({
                "type": "io.nats.jetstream.api.v1.consumer_info_response",
                "stream_name": STREAM, "name": "svc", "created": "2026-11-28T10:00:00Z",
                "config": config, "delivered": {"consumer_seq": 0, "stream_seq": 0},
                "ack_floor": {"consumer_seq": 0, "stream_seq": 0}, "num_ack_pending": 0,
                "num_redelivered": 0, "num_waiting": 0, "num_pending": 0
            })
            .to_string();
            let missing = json!({"error": {"code": 404, "err_code": 10014,
                                           "description": "consumer not found"}})
            .to_string();
            let mut reader = BufReader::new(tcp);
            let (mut subs, mut line, mut looked_up) =
                (Vec::<(String, String)>::new(), String::new(), false);
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
                line.clear();
                match words.first().map(String::as_str) {
                    Some("PING") => out.write_all(b"PONG\r\n").unwrap(),
                    Some("SUB") if words.len() >= 3 => {
                        subs.push((words[1].clone(), words[words.len() - 1].clone()))
                    }
                    Some("PUB") if words.len() == 4 => {
                        let mut body = vec![0; words[3].parse::<usize>().unwrap() + 2];
                        reader.read_exact(&mut body).unwrap();
                        let (subject, inbox) = (&words[1], &words[2]);
                        seen.lock().unwrap().push(subject.clone());
                        let answer = if subject.starts_with("$JS.API.CONSUMER.INFO.") && !looked_up
                        {
                            looked_up = true;
                            &missing
                        } else {
                            &consumer
                        };
                        let sid = subs
                            .iter()
                            .find(|(s, _)| {
                                s == inbox
                                    || (s.ends_with(".*") && inbox.starts_with(&s[..s.len() - 1]))
                            })
                            .map(|(_, sid)| sid.clone())
                            .unwrap_or_else(|| "1".into());
                        let msg = format!("MSG {inbox} {sid} {}\r\n{answer}\r\n", answer.len());
                        out.write_all(msg.as_bytes()).unwrap();
                    }
                    _ => {}
                }
            }
        })
        .unwrap();
    (port, requests)
}

/// A broker that creates the consumer with a filter set or a start other than asked would
/// deliver other messages: the runner refuses it before its first pull request, and deletes
/// the consumer it made (left behind, it would hold messages on an interest or work-queue
/// stream).
#[test]
fn a_consumer_created_otherwise_than_asked_is_refused() {
    let pull = json!({"durable_name": "svc", "ack_policy": "explicit", "replay_policy": "instant",
                      "ack_wait": 30_000_000_000u64, "max_ack_pending": 2048, "max_deliver": -1});
    let with = |extra: Value| {
        let mut c = pull.clone();
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    for (asked, answered, said) in [
        (
            json!({"subjects": ["orders.a", "orders.b"]}),
            with(json!({"deliver_policy": "all",
                        "filter_subjects": ["orders.a", "orders.b", "orders.c"]})),
            "nats.subjects are \"orders.a, orders.b\" but the consumer filters subjects \
             \"orders.a, orders.b, orders.c\"; they must be equal",
        ),
        (
            json!({"subject": "orders.>", "deliver_policy": "new"}),
            with(json!({"deliver_policy": "all", "filter_subject": "orders.>"})),
            "the consumer starts at deliver_policy all, not new",
        ),
    ] {
        let (port, requests) = start_hostile_broker(answered);
        let dir = tempfile::tempdir().unwrap();
        let mut n = json!({"url": format!("nats://127.0.0.1:{port}"), "stream": STREAM,
                           "consumer": "svc", "consumer_mode": "create"});
        for (k, v) in asked.as_object().unwrap() {
            n[k] = v.clone();
        }
        let cfg = write_config(
            dir.path(),
            "c.json",
            &json!({"nats": n, "sink": {"type": "file", "directory": dir.path().join("out")}}),
        );
        let (code, out, err) = svc(&["run", cfg.to_str().unwrap()]);
        assert_eq!(code, 1, "{asked}: {out}{err}");
        let log = format!("{out}{err}");
        assert!(
            log.contains("broker: consumer ORDERS/svc: ") && log.contains(said),
            "{asked}: {log}"
        );
        assert!(files_below(&dir.path().join("out")).is_empty());
        let requests = requests.lock().unwrap();
        assert!(
            requests
                .iter()
                .any(|r| r == "$JS.API.CONSUMER.DELETE.ORDERS.svc"),
            "{asked}: the refused consumer was not deleted: {requests:?}"
        );
    }
}
