//! `svc stream-plan`: the plan's permissions are exactly what `svc run` needs. A real
//! nats-server whose runner user holds exactly the planned permissions delivers everything
//! (DLQ, advisories and metrics on) after `svc stream-plan --apply` created the streams and
//! the consumer; and a server lacking any single one of them makes `svc run` stop with an
//! error naming that subject, never printing a secret.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::broker::*;
use crate::support::*;
use serde_json::{json, Value};

const RUNNER_PASSWORD: &str = "runner-pw-Secret-4711";
const ADMIN_PASSWORD: &str = "admin-pw-Secret-0815";
const DLQ_SUBJECT: &str = "dlq.orders";
const GOOD: usize = 5;

fn config(url: &str, dir: &Path) -> Value {
    json!({
        "nats": {"url": url, "stream": "ORDERS", "consumer": "svc", "subject": "orders.>",
                 "consumer_mode": "create",
                 "auth": {"mode": "user_password", "username_env": "SVC_TEST_RUNNER_USER",
                          "password_env": "SVC_TEST_RUNNER_PASSWORD"}},
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 200, "max_batch_wait_ms": 20,
                     "shutdown_timeout_seconds": 5},
        "sink": {"type": "file", "directory": dir.join("out")},
        "security_labels": {"enabled": true, "allowed_classifications": ["unclassified"]},
        "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "publish_timeout_ms": 2000},
        "advisories": {"enabled": true},
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    })
}

/// `svc <args>` with the administrator's (apply) and runner's credentials in the environment.
fn svc_env(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(args)
        .env("SVC_ADMIN_NATS_USER", "admin")
        .env("SVC_ADMIN_NATS_PASSWORD", ADMIN_PASSWORD)
        .output()
        .unwrap()
}

/// The planned `authorization` block's runner permissions (publish, subscribe subjects).
fn planned_permissions(cfg: &Path) -> (Vec<String>, Vec<String>) {
    let out = svc_env(&["stream-plan", cfg.to_str().unwrap(), "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let perms = &plan["authorization"]["users"][0]["permissions"];
    let list = |v: &Value| -> Vec<String> {
        v["allow"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    (list(&perms["publish"]), list(&perms["subscribe"]))
}

/// A server whose `runner` user has exactly `publish`/`subscribe`, and an unrestricted admin.
fn server_with(dir: &Path, name: &str, publish: &[String], subscribe: &[String]) -> NatsServer {
    let block = json!({"users": [
        {"user": "runner", "password": RUNNER_PASSWORD,
         "permissions": {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}},
        {"user": "admin", "password": ADMIN_PASSWORD}
    ]});
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(&conf, format!("authorization: {block}\n")).unwrap();
    NatsServer::start_with(&["-c", conf.to_str().unwrap()])
}

fn admin(server: &NatsServer) -> nats::Connection {
    nats::Options::with_user_pass("admin", ADMIN_PASSWORD)
        .connect(server.url().as_str())
        .unwrap()
}

/// `GOOD` messages and one whose security labels are invalid (it goes to the DLQ).
fn publish(server: &NatsServer) {
    let js = nats::jetstream::new(admin(server));
    for i in 0..GOOD {
        js.publish("orders.created", format!("{{\"n\":{i}}}"))
            .unwrap();
    }
    let mut h = nats::HeaderMap::new();
    h.insert("Svc-Security-Labels", "{\"classification\":\"nonsense\"}");
    let bad = nats::Message::new("orders.created", None, b"{\"bad\":1}", Some(h));
    js.publish_message(&bad).unwrap();
}

fn apply(cfg: &Path) -> (bool, String) {
    let out = svc_env(&["stream-plan", cfg.to_str().unwrap(), "--apply"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains(ADMIN_PASSWORD), "a secret was printed: {err}");
    (out.status.success(), err)
}

fn start_runner(cfg: &Path, log: &Path) -> std::process::Child {
    let file = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("run")
        .arg(cfg)
        .env("SVC_TEST_RUNNER_USER", "runner")
        .env("SVC_TEST_RUNNER_PASSWORD", RUNNER_PASSWORD)
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap()
}

fn setup(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    // The URL is patched per server; the plan itself does not depend on it.
    let cfg = write_config(
        dir.path(),
        &format!("{name}.json"),
        &config("nats://127.0.0.1:4222", dir.path()),
    );
    (dir, cfg)
}

fn config_for(server: &NatsServer, dir: &Path, name: &str) -> PathBuf {
    write_config(dir, name, &config(&server.url(), dir))
}

#[test]
fn exactly_the_planned_permissions_deliver_everything() {
    let (dir, plan_cfg) = setup("plan");
    let (publish_perms, subscribe_perms) = planned_permissions(&plan_cfg);
    let server = server_with(dir.path(), "exact", &publish_perms, &subscribe_perms);
    let cfg = config_for(&server, dir.path(), "run.json");

    // A wrong administrator password: refused, and neither password is printed.
    let wrong = "wrong-admin-Secret-1234";
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["stream-plan", cfg.to_str().unwrap(), "--apply"])
        .env("SVC_ADMIN_NATS_USER", "admin")
        .env("SVC_ADMIN_NATS_PASSWORD", wrong)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("svc: stream-plan --apply: broker: connect"),
        "{err}"
    );
    let printed = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
    assert!(
        !printed.contains(wrong) && !printed.contains(ADMIN_PASSWORD),
        "{printed}"
    );

    let (ok, report) = apply(&cfg);
    assert!(ok, "{report}");
    for what in ["stream ORDERS", "stream ORDERS_DLQ", "consumer ORDERS/svc"] {
        assert!(
            report.contains(&format!("applied: {what} created")),
            "{report}"
        );
    }
    // Idempotent: the second run finds everything as planned.
    let (ok, report) = apply(&cfg);
    assert!(ok, "{report}");
    assert_eq!(report.matches("exists as planned").count(), 3, "{report}");

    publish(&server);
    let log = dir.path().join("run.log");
    let mut child = start_runner(&cfg, &log);
    let snap = dir.path().join("metrics.json");
    let js = nats::jetstream::new(admin(&server));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stored = files_below(&dir.path().join("out")).len();
        let dlq = js.stream_info("ORDERS_DLQ").unwrap().state.messages;
        if stored >= GOOD
            && dlq == 1
            && snapshot_counter(&snap, "messages_acked_total") > GOOD as u64
        {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "svc run exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "not delivered: {stored} stored, {dlq} dead-lettered; {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let info = js.consumer_info("ORDERS", "svc").unwrap();
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(info.num_pending, 0);
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}: {text}");
    assert!(!text.contains("ermission"), "{text}");
    assert!(!text.contains("asynchronous error"), "{text}");
    assert!(
        !text.contains(RUNNER_PASSWORD),
        "a secret was printed: {text}"
    );
}

/// Runs `svc run` against a server lacking `missing`; returns its exit code and output.
fn run_without(missing: &str, publish_subject: bool) -> (Option<i32>, String) {
    let (dir, plan_cfg) = setup("plan");
    let (mut publish_perms, mut subscribe_perms) = planned_permissions(&plan_cfg);
    let list = if publish_subject {
        &mut publish_perms
    } else {
        &mut subscribe_perms
    };
    let before = list.len();
    list.retain(|s| s != missing);
    assert_eq!(list.len() + 1, before, "{missing} is not in the plan");
    let server = server_with(dir.path(), "less", &publish_perms, &subscribe_perms);
    let cfg = config_for(&server, dir.path(), "run.json");
    let (ok, report) = apply(&cfg);
    assert!(ok, "{report}");
    if missing.starts_with("$JS.API.CONSUMER.DURABLE.CREATE.") {
        // The runner needs it only for a consumer it must create.
        let js = nats::jetstream::new(admin(&server));
        js.delete_consumer("ORDERS", "svc").unwrap();
    }
    publish(&server);
    if missing.starts_with("$JS.API.STREAM.MSG.GET.") {
        // The runner needs it only to read back a record the DLQ stream calls a duplicate:
        // one is there first under the id of the bad message's record.
        let nc = admin(&server);
        let inc = svc::broker::incarnation::read(&nc, "ORDERS").unwrap();
        let mut h = nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("svc-dlq:ORDERS:{inc}:{}", GOOD + 1));
        let first = nats::Message::new("dlq.orders", None, b"{}", Some(h));
        nats::jetstream::new(nc).publish_message(&first).unwrap();
    }
    let log = dir.path().join("run.log");
    let mut child = start_runner(&cfg, &log);
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    (status.and_then(|s| s.code()), text)
}

#[test]
fn each_planned_permission_is_needed() {
    let (_dir, plan_cfg) = setup("plan");
    let (publish_perms, subscribe_perms) = planned_permissions(&plan_cfg);
    let cases = publish_perms
        .iter()
        .map(|s| (s.clone(), true))
        .chain(subscribe_perms.iter().map(|s| (s.clone(), false)));
    for (missing, is_publish) in cases {
        let (code, text) = run_without(&missing, is_publish);
        // The operator's view of each case, for `--nocapture`.
        eprintln!("without {missing}: {}", text.lines().last().unwrap_or(""));
        assert_eq!(code, Some(1), "without {missing}: {text}");
        let verb = if is_publish {
            "publish"
        } else {
            "subscription to"
        };
        // The subject as the broker named it: an ACK's subject is one of the pattern.
        let named = missing.trim_end_matches('>');
        assert!(
            text.contains("permission denied") && text.contains(verb) && text.contains(named),
            "without {missing}: {text}"
        );
        assert!(
            !text.contains(RUNNER_PASSWORD),
            "a secret was printed: {text}"
        );
    }
}

/// `--apply` creates only what is missing: an existing stream or consumer that differs from
/// the plan is reported (exit 1) and left as it is.
#[test]
fn apply_reports_what_differs_and_changes_nothing() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut value = config(&server.url(), dir.path());
    value["nats"].as_object_mut().unwrap().remove("auth");
    let cfg = write_config(dir.path(), "open.json", &value);
    let js = server.js();
    js.add_stream(nats::jetstream::StreamConfig {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .unwrap();
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(7));
    // No administrator variables: a server without authentication.
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args([
            "stream-plan",
            cfg.to_str().unwrap(),
            "--apply",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Standard output stays one JSON document.
    serde_json::from_slice::<Value>(&out.stdout).unwrap();
    assert!(
        err.contains("applied: stream ORDERS exists and DIFFERS from the plan (left unchanged)")
            && err.contains("max_age_s 0 -> 604800")
            && err.contains("discard old -> new"),
        "{err}"
    );
    assert!(err.contains("applied: stream ORDERS_DLQ created"), "{err}");
    assert!(
        err.contains("applied: consumer ORDERS/svc exists and DIFFERS")
            && err.contains("ack_wait 7 s -> 30 s"),
        "{err}"
    );
    let stream = js.stream_info("ORDERS").unwrap().config;
    assert_eq!(stream.max_age, Duration::ZERO);
    assert_eq!(
        js.consumer_info("ORDERS", "svc").unwrap().config.ack_wait,
        Duration::from_secs(7)
    );
}

/// The JSON plan is what the JetStream API takes: its requests, sent as they are, create what
/// `--apply` then finds exactly as planned.
#[test]
fn the_planned_json_requests_are_what_apply_creates() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut value = config(&server.url(), dir.path());
    value["nats"].as_object_mut().unwrap().remove("auth");
    let cfg = write_config(dir.path(), "open.json", &value);
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["stream-plan", cfg.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let nc = server.connect();
    for part in ["stream", "dead_letter_stream", "consumer"] {
        let api = plan[part]["api"].as_str().unwrap();
        let body = serde_json::to_vec(&plan[part]["request"]).unwrap();
        let reply = nc
            .request_timeout(api, body, Duration::from_secs(5))
            .unwrap();
        let answer: Value = serde_json::from_slice(&reply.data).unwrap();
        assert!(answer.get("error").is_none(), "{part}: {answer}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["stream-plan", cfg.to_str().unwrap(), "--apply"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("exists as planned").count(), 3, "{err}");
}

/// An open server's config for `--apply` without a DLQ, and the `ORDERS` stream created with
/// the broker's own JSON: as planned in every planned field, plus `extra`. The broker's
/// answer (its config of the stream).
fn stream_as_planned_plus(server: &NatsServer, dir: &Path, extra: Value) -> (PathBuf, Value) {
    let mut value = config(&server.url(), dir);
    value["nats"].as_object_mut().unwrap().remove("auth");
    value["dead_letter"]["enabled"] = json!(false);
    let cfg = write_config(dir, "open.json", &value);
    let mut stream = json!({"name": "ORDERS", "subjects": ["orders.>"], "storage": "file",
        "num_replicas": 1, "retention": "limits", "discard": "new",
        "duplicate_window": 120_000_000_000u64, "max_age": 604_800_000_000_000u64,
        "max_bytes": 1u64 << 30, "max_msgs": -1, "max_consumers": -1});
    for (k, v) in extra.as_object().unwrap() {
        stream[k] = v.clone();
    }
    let reply = server
        .connect()
        .request_timeout(
            "$JS.API.STREAM.CREATE.ORDERS",
            serde_json::to_vec(&stream).unwrap(),
            Duration::from_secs(5),
        )
        .unwrap();
    let answer: Value = serde_json::from_slice(&reply.data).unwrap();
    assert!(answer.get("error").is_none(), "{answer}");
    (cfg, answer["config"].clone())
}

/// `--apply`'s exit code and its line about the stream `ORDERS`.
fn apply_stream_line(cfg: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["stream-plan", cfg.to_str().unwrap(), "--apply"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("applied: stream ORDERS "))
        .unwrap_or_else(|| panic!("no line about the stream: {err}"))
        .to_string();
    (out.status.code(), line)
}

/// A stream that keeps one message per subject or honours a publisher's `Nats-Rollup`
/// header dropped 4-5 of 5-6 messages before delivery, and `--apply` called it "as planned"
/// (it compared nine fields). Now every field the plan sets and each setting that changes
/// what reaches the consumer or a replay is compared, from the broker's own JSON.
#[test]
fn apply_reports_stream_settings_that_drop_or_keep_messages() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    // As planned in every planned field, and lossy in the others.
    let (cfg, _) = stream_as_planned_plus(
        &server,
        dir.path(),
        json!({"max_msgs_per_subject": 1, "allow_rollup_hdrs": true, "deny_delete": true,
               "max_msg_size": 1000, "no_ack": true}),
    );
    let (code, line) = apply_stream_line(&cfg);
    assert_eq!(code, Some(1), "{line}");
    assert!(line.contains("DIFFERS"), "{line}");
    for said in [
        "max_msgs_per_subject 1 -> -1",
        "allow_rollup_hdrs true -> false",
        "deny_delete true -> false",
        "max_msg_size 1000 -> -1",
        "no_ack true -> false",
    ] {
        assert!(line.contains(said), "{said}: {line}");
    }
    // Nothing else: the planned fields match.
    assert_eq!(line.matches(" -> ").count(), 5, "{line}");
}

/// nats-server 2.11+ settings `--apply` called "as planned" (review 51): with
/// `allow_msg_ttl` a publisher's `Nats-TTL: 1s` removed all 5 messages before delivery, and a
/// `subject_transform` to `moved.>` stored all 5 where the consumer's `orders.>` filter never
/// delivers them. Each is now a difference (exit 1), and so is the server's `async`
/// persistence. A server that does not know a setting (2.9.10 ignores it) is skipped for it.
#[test]
fn apply_reports_newer_server_settings_that_lose_or_move_messages() {
    let cases = [
        (
            json!({"allow_msg_ttl": true}),
            "allow_msg_ttl",
            "allow_msg_ttl true -> false",
        ),
        (
            json!({"subject_transform": {"src": "orders.>", "dest": "moved.>"}}),
            "subject_transform",
            "subject_transform {\"dest\":\"moved.>\",\"src\":\"orders.>\"} -> none",
        ),
        (
            json!({"persist_mode": "async"}),
            "persist_mode",
            "persist_mode async -> default",
        ),
        (
            json!({"allow_msg_ttl": true, "subject_delete_marker_ttl": 5_000_000_000u64}),
            "subject_delete_marker_ttl",
            "subject_delete_marker_ttl_s 5 -> 0",
        ),
    ];
    let mut checked = 0;
    for (extra, field, said) in cases {
        let server = NatsServer::start();
        let dir = tempfile::tempdir().unwrap();
        let (cfg, created) = stream_as_planned_plus(&server, dir.path(), extra);
        if created.get(field).is_none() {
            eprintln!(
                "{}: the server does not know {field}; skipped",
                nats_server()
            );
            continue;
        }
        let (code, line) = apply_stream_line(&cfg);
        assert_eq!(code, Some(1), "{field}: {line}");
        assert!(
            line.contains("DIFFERS") && line.contains(said),
            "{field}: {line}"
        );
        checked += 1;
    }
    // The same stream without them is as planned (the harmless fields 2.15 reports too).
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = stream_as_planned_plus(&server, dir.path(), json!({}));
    let (code, line) = apply_stream_line(&cfg);
    assert_eq!(code, Some(0), "{line}");
    assert!(line.contains("exists as planned"), "{line}");
    eprintln!("{}: {checked} of 4 settings checked", nats_server());
}

/// The administrator permissions docs/operations.md gives, read from its sentence: the
/// subjects in backquotes after "administrator's user publishes to", and after "subscribes
/// to", up to "nothing else".
fn documented_admin_permissions() -> (Vec<String>, Vec<String>) {
    let doc = std::fs::read_to_string(crate::support::kit::repo("docs/operations.md")).unwrap();
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = flat
        .find("administrator's user publishes to")
        .expect("the sentence is in docs/operations.md");
    let sentence = &flat[start..];
    let sentence = &sentence[..sentence.find("nothing else").expect("its end")];
    let (publish, subscribe) = sentence.split_once("subscribes to").expect("both parts");
    let quoted = |text: &str| -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    (quoted(publish), quoted(subscribe))
}

/// The documented administrator permissions (`$JS.API.CONSUMER.INFO.*` once) could not create
/// the consumer: its look-up is `$JS.API.CONSUMER.INFO.<stream>.<consumer>`. `--apply`, run
/// twice under exactly what the documentation says, creates everything and then finds it as
/// planned.
#[test]
fn apply_works_with_exactly_the_documented_administrator_permissions() {
    let (publish, subscribe) = documented_admin_permissions();
    assert!(
        publish.len() >= 4 && subscribe == ["_INBOX.>"],
        "{publish:?} {subscribe:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let block = json!({"users": [
        {"user": "admin", "password": ADMIN_PASSWORD,
         "permissions": {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}}
    ]});
    let conf = dir.path().join("admin.conf");
    std::fs::write(&conf, format!("authorization: {block}\n")).unwrap();
    let server = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    let cfg = config_for(&server, dir.path(), "run.json");
    let (ok, report) = apply(&cfg);
    assert!(ok, "{report}");
    for what in ["stream ORDERS", "stream ORDERS_DLQ", "consumer ORDERS/svc"] {
        assert!(
            report.contains(&format!("applied: {what} created")),
            "{report}"
        );
    }
    let (ok, report) = apply(&cfg);
    assert!(ok, "{report}");
    assert_eq!(report.matches("exists as planned").count(), 3, "{report}");
    assert!(!report.contains("ermission"), "{report}");
}

/// Several filter subjects and a start (`nats.subjects`, `nats.deliver_policy`): the plan
/// prints both, `--apply` creates the consumer so (nats-server 2.10 and later; refused naming
/// the version before, nothing created), and the runner under exactly the planned permissions
/// stores the planned subjects' messages from the planned start, never a third subject's.
#[test]
fn several_subjects_and_a_start_under_the_planned_permissions() {
    let dir = tempfile::tempdir().unwrap();
    let with_subjects = |url: &str, name: &str| {
        let mut c = config(url, dir.path());
        let n = c["nats"].as_object_mut().unwrap();
        n.remove("subject");
        n.insert("subjects".into(), json!(["orders.created", "orders.paid"]));
        n.insert("deliver_policy".into(), json!("by_start_sequence"));
        n.insert("opt_start_seq".into(), json!(2));
        write_config(dir.path(), name, &c)
    };
    let plan_cfg = with_subjects("nats://127.0.0.1:4222", "plan.json");
    let out = svc_env(&["stream-plan", plan_cfg.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for line in [
        "  subjects          orders.created, orders.paid",
        "  filter subjects   orders.created, orders.paid",
        "  deliver policy    by_start_sequence (opt_start_seq 2) (when created; an existing \
         consumer is never moved)",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
    let out = svc_env(&[
        "stream-plan",
        plan_cfg.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let consumer = &plan["consumer"]["request"]["config"];
    assert_eq!(
        consumer["filter_subjects"],
        json!(["orders.created", "orders.paid"])
    );
    assert_eq!(consumer["deliver_policy"], "by_start_sequence");
    assert_eq!(consumer["opt_start_seq"], 2);
    assert!(consumer.get("filter_subject").is_none(), "{consumer}");

    let (publish_perms, subscribe_perms) = planned_permissions(&plan_cfg);
    let server = server_with(dir.path(), "exact", &publish_perms, &subscribe_perms);
    let cfg = with_subjects(&server.url(), "run.json");
    let version = admin(&server).server_version();
    let (ok, report) = apply(&cfg);
    if !version.starts_with("2.") || version.split('.').nth(1).unwrap().parse::<u64>().unwrap() < 10
    {
        assert!(!ok, "{report}");
        assert!(
            report.contains(&format!(
                "needs a consumer with filter_subjects (nats-server 2.10 or later), but the \
                 server is nats-server {version}"
            )),
            "{report}"
        );
        let js = nats::jetstream::new(admin(&server));
        assert!(
            js.consumer_info("ORDERS", "svc").is_err(),
            "nothing created"
        );
        return;
    }
    assert!(ok, "{report}");
    let js = nats::jetstream::new(admin(&server));
    // The stream captures exactly the two subjects: a third is not stored at all. Sequences:
    // created 1, paid 2, created 3, paid 4.
    for subject in [
        "orders.created",
        "orders.paid",
        "orders.created",
        "orders.paid",
    ] {
        js.publish(subject, "{}").unwrap();
    }
    assert!(js.publish("orders.other", "{}").is_err());
    let log = dir.path().join("run.log");
    let mut child = start_runner(&cfg, &log);
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = || {
        let info = js.consumer_info("ORDERS", "svc").unwrap();
        !files_below(&dir.path().join("out")).is_empty()
            && info.num_ack_pending == 0
            && info.num_pending == 0
            && info.delivered.stream_seq == 4
    };
    while !done() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "svc run exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let info = js.consumer_info("ORDERS", "svc").unwrap();
    assert_eq!(info.ack_floor.stream_seq, 4);
    assert_eq!(info.delivered.consumer_seq, 3, "sequences 2, 3 and 4 only");
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}: {text}");
    assert!(!text.contains("ermission"), "{text}");
}

/// The planned `replay_authorization` block's permissions (publish, subscribe subjects).
fn planned_replay_permissions(cfg: &Path) -> (Vec<String>, Vec<String>) {
    let out = svc_env(&["stream-plan", cfg.to_str().unwrap(), "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let perms = &plan["replay_authorization"]["users"][0]["permissions"];
    let list = |v: &Value| -> Vec<String> {
        v["allow"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    (list(&perms["publish"]), list(&perms["subscribe"]))
}

/// `svc replay` as the `runner` user of [`server_with`] (whatever permissions it was given).
fn replay_as_runner(cfg: &Path, state: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["replay", cfg.to_str().unwrap(), "--timeout", "3", "--state"])
        .arg(state)
        .env("SVC_TEST_RUNNER_USER", "runner")
        .env("SVC_TEST_RUNNER_PASSWORD", RUNNER_PASSWORD)
        .output()
        .unwrap()
}

/// A replay user with exactly the planned replay permissions replays everything (the invalid
/// message to the DLQ: exit 3); none of the runner's consumer or ACK subjects is among them;
/// without the stream info or the consumer create the replay fails (exit 1), and
/// the durable consumer is never touched.
#[test]
fn the_planned_replay_permissions_replay_everything_and_each_core_one_is_needed() {
    let (dir, plan_cfg) = setup("replay-plan");
    let (publish_perms, subscribe_perms) = planned_replay_permissions(&plan_cfg);
    assert!(
        !publish_perms.iter().any(|s| s.starts_with("$JS.ACK")
            || s.contains("MSG.NEXT")
            || s.contains("DURABLE.CREATE")),
        "{publish_perms:?}"
    );
    let run = |name: &str, pub_allow: &[String], sub_allow: &[String]| -> (Output, PathBuf) {
        let server = server_with(dir.path(), name, pub_allow, sub_allow);
        let cfg = config_for(&server, dir.path(), &format!("{name}.json"));
        let (ok, err) = apply(&cfg);
        assert!(ok, "{err}");
        publish(&server);
        let before = admin_consumer_state(&server);
        let out = replay_as_runner(&cfg, &dir.path().join(format!("{name}.state")));
        assert_eq!(
            admin_consumer_state(&server),
            before,
            "the durable was touched"
        );
        (out, dir.path().join("out"))
    };
    let (out, sink) = run("replay-exact", &publish_perms, &subscribe_perms);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(stdout.contains(&format!("stored {GOOD}, ")), "{stdout}");
    assert!(stdout.contains("dead-lettered 1"), "{stdout}");
    assert!(files_below(&sink).len() >= GOOD);
    // (An empty subscribe list is no restriction to nats-server: `_INBOX.>`, the only one,
    // cannot be taken away alone.)
    for missing in [
        "$JS.API.STREAM.INFO.ORDERS",
        "$JS.API.CONSUMER.CREATE.ORDERS",
    ] {
        let keep = |all: &[String]| -> Vec<String> {
            all.iter().filter(|s| *s != missing).cloned().collect()
        };
        let name = format!("replay-without-{}", missing.replace(['$', '.', '>'], "_"));
        let (out, _) = run(&name, &keep(&publish_perms), &keep(&subscribe_perms));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "without {missing}: {out:?}");
        // A failed replay is never recorded as done: `--resume` would skip the range.
        if let Ok(bytes) = std::fs::read(dir.path().join(format!("{name}.state"))) {
            let state: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(state["done"], json!(false), "without {missing}: {state}");
        }
        assert!(
            !err.contains(RUNNER_PASSWORD),
            "a secret was printed: {err}"
        );
    }
    // A `--subject` whose last message comes before the stream's end: the read ends on the
    // broker's pending count of 0, which the consumer's info confirms (CONSUMER.INFO needed).
    let info = "$JS.API.CONSUMER.INFO.ORDERS.*".to_string();
    assert!(publish_perms.contains(&info), "{publish_perms:?}");
    for (name, allow, code) in [
        ("replay-subject", publish_perms.clone(), 3),
        (
            "replay-subject-without-info",
            publish_perms
                .iter()
                .filter(|s| **s != info)
                .cloned()
                .collect(),
            1,
        ),
    ] {
        let server = server_with(dir.path(), name, &allow, &subscribe_perms);
        let cfg = config_for(&server, dir.path(), &format!("{name}.json"));
        assert!(apply(&cfg).0);
        publish(&server);
        nats::jetstream::new(admin(&server))
            .publish("orders.other", "{\"o\":1}")
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_svc"))
            .args([
                "replay",
                cfg.to_str().unwrap(),
                "--timeout",
                "3",
                "--subject",
            ])
            .arg("orders.created")
            .arg("--state")
            .arg(dir.path().join(format!("{name}.state")))
            .env("SVC_TEST_RUNNER_USER", "runner")
            .env("SVC_TEST_RUNNER_PASSWORD", RUNNER_PASSWORD)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{name}: {out:?}");
    }
}

/// The durable consumer's (delivered stream sequence, ack pending, ack floor) as the admin sees
/// them.
fn admin_consumer_state(server: &NatsServer) -> (u64, usize, u64) {
    let info = nats::jetstream::new(admin(server))
        .consumer_info("ORDERS", "svc")
        .unwrap();
    (
        info.delivered.stream_seq,
        info.num_ack_pending,
        info.ack_floor.stream_seq,
    )
}

/// The planned `redrive_authorization` block's permissions (publish, subscribe subjects).
fn planned_redrive_permissions(cfg: &Path) -> (Vec<String>, Vec<String>) {
    let out = svc_env(&["stream-plan", cfg.to_str().unwrap(), "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let perms = &plan["redrive_authorization"]["users"][0]["permissions"];
    let list = |v: &Value| -> Vec<String> {
        v["allow"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    (list(&perms["publish"]), list(&perms["subscribe"]))
}

/// A dead-letter record for `ORDERS` sequence `seq`, published by the administrator.
fn dead_letter_record(server: &NatsServer, seq: u64, payload: &[u8]) {
    let incarnation = svc::broker::incarnation::read(&admin(server), "ORDERS").unwrap();
    let record = json!({"schema": "svc.dead-letter.v1",
        "failed_at": "2026-11-28T00:00:00Z",
        "failure": {"stage": "security_labels", "reason": "not_in_vocabulary"},
        "original": {"subject": "orders.created", "stream": "ORDERS", "stream_sequence": seq,
                     "stream_incarnation": &*incarnation, "published_at": published_at(&admin(server), "ORDERS", seq),
                     "consumer_sequence": seq, "delivery_count": 1},
        "payload": {"sha256": svc::message::envelope::hex_sha256(payload),
                    "size_bytes": payload.len()}});
    let js = nats::jetstream::new(admin(server));
    js.publish(DLQ_SUBJECT, record.to_string()).unwrap();
}

/// A redrive user with exactly the planned redrive permissions redrives (one record stored
/// and removed, one refused again: dead-lettered anew, its old record removed; exit 3) without
/// a consumer on the source stream or any ACK; without the original's MSG.GET, the record's
/// MSG.DELETE or the stream lookup it fails (exit 1) and keeps the records; the durable
/// consumer is never touched.
#[test]
fn the_planned_redrive_permissions_redrive_and_each_core_one_is_needed() {
    let (dir, plan_cfg) = setup("redrive-plan");
    let (publish_perms, subscribe_perms) = planned_redrive_permissions(&plan_cfg);
    assert!(
        !publish_perms.iter().any(|s| s.starts_with("$JS.ACK")
            || s.contains("MSG.NEXT")
            || s.contains("DURABLE.CREATE")
            || s.starts_with("$JS.API.CONSUMER.CREATE.ORDERS.")
            || s == "$JS.API.CONSUMER.CREATE.ORDERS"),
        "{publish_perms:?}"
    );
    let run = |name: &str, pub_allow: &[String]| -> (Output, u64, NatsServer) {
        let server = server_with(dir.path(), name, pub_allow, &subscribe_perms);
        let cfg = config_for(&server, dir.path(), &format!("{name}.json"));
        let (ok, err) = apply(&cfg);
        assert!(ok, "{err}");
        publish(&server);
        dead_letter_record(&server, 1, b"{\"n\":0}");
        dead_letter_record(&server, GOOD as u64 + 1, b"{\"bad\":1}");
        let before = admin_consumer_state(&server);
        let out = Command::new(env!("CARGO_BIN_EXE_svc"))
            .args(["dlq", "redrive", cfg.to_str().unwrap(), "--timeout", "3"])
            .env("SVC_TEST_RUNNER_USER", "runner")
            .env("SVC_TEST_RUNNER_PASSWORD", RUNNER_PASSWORD)
            .output()
            .unwrap();
        assert_eq!(
            admin_consumer_state(&server),
            before,
            "the durable was touched"
        );
        let js = nats::jetstream::new(admin(&server));
        let dlq = js.stream_info("ORDERS_DLQ").unwrap().state.messages;
        (out, dlq, server)
    };
    let (out, dlq, _server) = run("redrive-exact", &publish_perms);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        stdout.contains("read 2, stored 1, already present 0, refused by governance 1"),
        "{stdout}"
    );
    assert!(stdout.contains("dead-lettered 1,"), "{stdout}");
    assert!(stdout.contains("removed 2"), "{stdout}");
    assert_eq!(dlq, 1, "only the new record of the message refused again");
    for missing in [
        "$JS.API.STREAM.MSG.GET.ORDERS",
        "$JS.API.STREAM.MSG.DELETE.ORDERS_DLQ",
        "$JS.API.STREAM.NAMES",
    ] {
        let keep: Vec<String> = publish_perms
            .iter()
            .filter(|s| *s != missing)
            .cloned()
            .collect();
        let name = format!("redrive-without-{}", missing.replace(['$', '.', '>'], "_"));
        let (out, dlq, _server) = run(&name, &keep);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "without {missing}: {out:?}");
        assert_eq!(dlq, 2, "without {missing}: a record was removed");
        assert!(
            !err.contains(RUNNER_PASSWORD),
            "a secret was printed: {err}"
        );
    }
}
