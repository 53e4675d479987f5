//! `svc dlq redrive` and `svc replay --fanout-child` against a real nats-server and real sinks:
//! dead letters of `svc run` (a size refusal) redriven before the cause is fixed are
//! dead-lettered anew (their old records removed), and after it is fixed land in a file sink
//! and in PostgreSQL, leaving the dead-letter stream empty; `--dry-run` changes nothing; a
//! record whose original was purged is reported and kept; a forged record naming another
//! stream never makes the redrive read that stream; a replay with `--fanout-child` stores into
//! that child only.

use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const DLQ: &str = "DLQ";

/// A configuration with `sink`; `size_limit`: the size policy that refuses the large messages.
fn config(server: &NatsServer, sink: Value, size_limit: Option<u64>) -> Value {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER,
                 "subject": "orders.>"},
        "delivery": {"batch_size": 4, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "max_batch_wait_ms": 20, "shutdown_timeout_seconds": 10},
        "sink": sink,
        "dead_letter": {"enabled": true, "subject": "dlq.orders", "expected_stream": DLQ},
        "logging": {"level": "warn"}
    });
    if let Some(limit) = size_limit {
        cfg["size_policy"] = json!({"enabled": true, "max_payload_bytes": limit});
    }
    cfg
}

fn file_sink(dir: &Path) -> Value {
    json!({"type": "file", "directory": dir})
}

/// Six messages: sequences 1, 3 and 5 are 100 bytes (refused by a 50-byte size policy).
fn setup() -> NatsServer {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream(DLQ, &["dlq.orders"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", 6, |i| {
        if i % 2 == 0 {
            format!("{{\"big\":\"{}\"}}", "x".repeat(90)).into_bytes()
        } else {
            format!("{{\"n\":{i}}}").into_bytes()
        }
    });
    server
}

/// `svc run` with `cfg` until the three refusals are in the dead-letter stream.
fn dead_letters_from_the_runner(server: &NatsServer, dir: &Path, cfg: &Path) {
    let mut runner = Runner::start(cfg, &dir.join("run.log"));
    wait_until(Duration::from_secs(20), "3 dead letters", || {
        server.stream_messages(DLQ) == 3
    });
    wait_until(
        Duration::from_secs(20),
        "every message acknowledged",
        || {
            server.consumer_state(STREAM, CONSUMER).1 == 0
                && server.consumer_state(STREAM, CONSUMER).0 == 6
        },
    );
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20)).unwrap();
    assert!(status.success(), "{}", runner.log_text());
}

/// The stream sequences of the records a per_event file sink holds.
fn stored(out: &Path) -> Vec<u64> {
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

fn redrive(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["dlq", "redrive", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    svc(&all)
}

/// The records the dead-letter stream holds (sequence, record), read by the admin.
fn records(server: &NatsServer) -> Vec<(u64, Value)> {
    use base64::Engine;
    let nc = server.connect();
    let info = server.js().stream_info(DLQ).unwrap();
    let mut out = Vec::new();
    for seq in info.state.first_seq..=info.state.last_seq {
        let reply = nc
            .request(
                &format!("$JS.API.STREAM.MSG.GET.{DLQ}"),
                json!({ "seq": seq }).to_string(),
            )
            .unwrap();
        let v: Value = serde_json::from_slice(&reply.data).unwrap();
        let Some(data) = v["message"]["data"].as_str() else {
            continue;
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        out.push((seq, serde_json::from_slice(&bytes).unwrap()));
    }
    out
}

/// Redriven before the cause is fixed, each message is refused again: a new record (marked
/// replayed, naming the old one) replaces the old, exit 3. After the fix (the size policy
/// lifted), every dead letter is stored and the stream is empty, exit 0.
fn redrive_after_the_fix(sink: impl Fn(&Path) -> Value, stored_in: impl Fn(&Path) -> Vec<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let server = setup();
    let out = dir.path().join("out");
    let stored_seqs = || stored_in(&out);
    let broken = write_config(
        dir.path(),
        "broken.json",
        &config(&server, sink(&out), Some(50)),
    );
    dead_letters_from_the_runner(&server, dir.path(), &broken);
    assert_eq!(stored_seqs(), vec![2, 4, 6]);
    let before: Vec<u64> = records(&server).iter().map(|r| r.0).collect();
    assert_eq!(before, vec![1, 2, 3]);

    let (code, stdout, err) = redrive(&broken, &[]);
    assert_eq!(code, 3, "{stdout}{err}");
    assert!(
        stdout.contains(
            "redrive: read 3, stored 0, already present 0, refused by governance 3, refused by \
             the sink 0, dead-lettered 3, original missing 0, kept 0, removed 3"
        ),
        "{stdout}"
    );
    let again = records(&server);
    assert_eq!(again.len(), 3, "{again:?}");
    for ((seq, record), old) in again.iter().zip(&before) {
        assert!(*seq > 3, "the old records are gone: {again:?}");
        assert_eq!(record["redriven_from"], json!(old), "{record}");
        assert_eq!(record["replayed"], json!(true), "{record}");
    }

    let fixed = write_config(dir.path(), "fixed.json", &config(&server, sink(&out), None));
    let (code, stdout, err) = redrive(&fixed, &[]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(
        stdout.contains("read 3, stored 3, already present 0"),
        "{stdout}"
    );
    assert!(stdout.contains("removed 3"), "{stdout}");
    assert_eq!(
        server.stream_messages(DLQ),
        0,
        "the dead-letter stream is empty"
    );
    assert_eq!(
        stored_seqs(),
        (1..=6).collect::<Vec<_>>(),
        "each message once"
    );
    let (code, stdout, _) = redrive(&fixed, &[]);
    assert_eq!(code, 0);
    assert!(stdout.contains("redrive: read 0, stored 0"), "{stdout}");
}

#[test]
fn a_redrive_after_the_fix_delivers_every_dead_letter_into_a_file_sink() {
    redrive_after_the_fix(file_sink, stored);
}

#[test]
fn a_redrive_after_the_fix_delivers_every_dead_letter_into_postgresql() {
    use crate::support::postgres::TestDb;
    let db = TestDb::new("redrive");
    redrive_after_the_fix(
        |_| db.sink(json!({"auto_create_tables": true})),
        |_| {
            db.rows("SELECT stream_sequence FROM events ORDER BY stream_sequence")
                .iter()
                .map(|r| r[0].as_deref().unwrap().parse().unwrap())
                .collect()
        },
    );
}

/// `--dry-run` writes and removes nothing; a record whose original was purged is reported by
/// sequence and kept (exit 3) while the others are delivered and removed; a forged record
/// naming another stream is kept and that stream is never read; filters select records.
#[test]
fn dry_run_changes_nothing_and_a_purged_original_is_reported_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup();
    let out = dir.path().join("out");
    let broken = write_config(
        dir.path(),
        "broken.json",
        &config(&server, file_sink(&out), Some(50)),
    );
    let (code, stdout, err) = svc(&["replay", broken.to_str().unwrap()]);
    assert_eq!(code, 3, "{stdout}{err}");
    assert_eq!(server.stream_messages(DLQ), 3);
    // A forged record, as anyone allowed to publish on the dead-letter subject can write.
    server.create_stream("SECRETS", &["secrets.>"]);
    server.publish_n("SECRETS", "secrets.key", 3, |_| b"{\"secret\":1}".to_vec());
    let forged = json!({"schema": "svc.dead-letter.v1",
        "failure": {"stage": "size_policy", "reason": "payload_too_large"},
        "original": {"subject": "secrets.key", "stream": "SECRETS", "stream_sequence": 2,
                     "stream_incarnation": "20261129T000000Z",
                     "published_at": "2026-11-29T00:00:01Z", "consumer_sequence": 7,
                     "delivery_count": 1},
        "payload": {"sha256": "00".repeat(32), "size_bytes": 12}});
    let nc = server.connect();
    nc.publish("dlq.orders", forged.to_string()).unwrap();
    nc.flush().unwrap();
    wait_until(Duration::from_secs(10), "forged record", || {
        server.stream_messages(DLQ) == 4
    });

    let fixed_out = dir.path().join("fixed-out");
    let fixed = write_config(
        dir.path(),
        "fixed.json",
        &config(&server, file_sink(&fixed_out), None),
    );
    let (code, stdout, err) = redrive(&fixed, &["--dry-run", "--class", "size_policy"]);
    assert_eq!(code, 3, "{stdout}{err}");
    assert!(
        stdout.contains("read 4, would store 3, already present 0"),
        "{stdout}"
    );
    assert!(stdout.contains("kept 1, removed 0"), "{stdout}");
    assert!(
        err.contains("names stream SECRETS, not the configured stream ORDERS"),
        "{err}"
    );
    assert_eq!(server.stream_messages(DLQ), 4, "a dry run removes nothing");
    assert!(
        files_below(&fixed_out).is_empty(),
        "a dry run writes nothing"
    );
    assert!(!fixed.with_file_name("fixed.json.redrive-state").exists());

    // Another filter is another redrive: its own state file (as replay's ranges).
    let other_state = dir.path().join("other.state");
    let (code, stdout, _) = redrive(
        &fixed,
        &[
            "--reason",
            "no_such_reason",
            "--state",
            other_state.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("redrive: read 0,"), "{stdout}");
    assert_eq!(server.stream_messages(DLQ), 4);

    // The original of the first record (stream sequence 1) is purged.
    let reply = nc
        .request(
            &format!("$JS.API.STREAM.MSG.DELETE.{STREAM}"),
            json!({"seq": 1}).to_string(),
        )
        .unwrap();
    assert!(String::from_utf8_lossy(&reply.data).contains("true"));
    let (code, stdout, err) = redrive(&fixed, &[]);
    assert_eq!(code, 3, "{stdout}{err}");
    assert!(
        stdout.contains("read 4, stored 2, already present 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("original missing 1, kept 1, removed 2"),
        "{stdout}"
    );
    assert!(
        err.contains("original ORDERS sequence 1 is no longer in the stream"),
        "{err}"
    );
    assert_eq!(stored(&fixed_out), vec![3, 5]);
    let left = records(&server);
    let originals: Vec<(String, u64)> = left
        .iter()
        .map(|(_, r)| {
            (
                r["original"]["stream"].as_str().unwrap().to_string(),
                r["original"]["stream_sequence"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        originals,
        vec![("ORDERS".to_string(), 1), ("SECRETS".to_string(), 2)],
        "the purged one's record and the forged one are kept"
    );
    for f in files_below(&fixed_out) {
        let text = std::fs::read_to_string(fixed_out.join(f)).unwrap();
        assert!(!text.contains("secret"), "another stream was read: {text}");
    }
}

/// The stream sequences of the records a jsonl file sink holds, one per line, in order.
fn stored_lines(out: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = files_below(out)
        .into_iter()
        .flat_map(|p| {
            let text = std::fs::read_to_string(out.join(p)).unwrap();
            text.lines()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["stream_sequence"]
                        .as_u64()
                        .unwrap()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

fn jsonl_sink(dir: &Path) -> Value {
    json!({"type": "file", "directory": dir, "mode": "jsonl"})
}

/// [`setup`], and `svc run` into a jsonl sink under a 50-byte size policy until the three large
/// messages are dead-lettered: (dir, server, output directory, that configuration).
fn refused_into_jsonl() -> (
    tempfile::TempDir,
    NatsServer,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let server = setup();
    let out = dir.path().join("out");
    let broken = write_config(
        dir.path(),
        "broken.json",
        &config(&server, jsonl_sink(&out), Some(50)),
    );
    dead_letters_from_the_runner(&server, dir.path(), &broken);
    (dir, server, out, broken)
}

/// Review of issue 46 (atk46b): records a publisher on the dead-letter subject forged never
/// deliver a message twice into a sink without keys. A record without its original's
/// incarnation and payload digest (naming a delivered message) is kept; one with the right
/// incarnation and a wrong digest is kept; a second copy of a real record (re-published past the
/// duplicate window) is removed without a second delivery.
#[test]
fn forged_and_doubled_records_never_deliver_a_message_twice() {
    let (dir, server, out, _) = refused_into_jsonl();
    assert_eq!(stored_lines(&out), vec![2, 4, 6]);
    let incarnation = server.incarnation(STREAM);
    let nc = server.connect();
    let bare = json!({"schema": "svc.dead-letter.v1",
        "failure": {"stage": "size_policy", "reason": "payload_too_large"},
        "original": {"subject": "orders.created", "stream": STREAM, "stream_sequence": 2}});
    let mut wrong_digest = bare.clone();
    wrong_digest["original"]["stream_sequence"] = json!(4);
    wrong_digest["original"]["stream_incarnation"] = json!(incarnation);
    wrong_digest["original"]["published_at"] = json!(published_at(&server.connect(), STREAM, 4));
    wrong_digest["original"]["consumer_sequence"] = json!(9);
    wrong_digest["original"]["delivery_count"] = json!(1);
    wrong_digest["payload"] = json!({"sha256": "00".repeat(32), "size_bytes": 7});
    let copy = records(&server)[0].1.clone();
    assert_eq!(copy["original"]["stream_sequence"], json!(1));
    for forged in [&bare, &wrong_digest, &copy] {
        nc.publish("dlq.orders", forged.to_string()).unwrap();
    }
    nc.flush().unwrap();
    wait_until(Duration::from_secs(10), "6 records", || {
        server.stream_messages(DLQ) == 6
    });

    let fixed = write_config(
        dir.path(),
        "fixed.json",
        &config(&server, jsonl_sink(&out), None),
    );
    let (code, stdout, err) = redrive(&fixed, &[]);
    assert_eq!(code, 3, "{stdout}{err}");
    assert!(
        stdout.contains("read 5, stored 3, already present 1"),
        "{stdout}"
    );
    assert!(stdout.contains("kept 2, removed 4"), "{stdout}");
    assert!(
        err.contains("not a dead-letter record (original.stream_incarnation missing"),
        "{err}"
    );
    assert!(
        err.contains("ORDERS sequence 4 holds a payload whose SHA-256 is not the record's"),
        "{err}"
    );
    assert_eq!(
        stored_lines(&out),
        (1..=6).collect::<Vec<_>>(),
        "each message once"
    );
    let left: Vec<Value> = records(&server).into_iter().map(|r| r.1).collect();
    assert_eq!(left, vec![bare, wrong_digest], "the forgeries are kept");
}

/// A dead-letter stream deleted and created again during a redrive: the records the redrive
/// had already been handed name sequences of the old stream, and removing "sequence 2" would
/// remove another record. The redrive stops instead, and the new stream keeps every record.
#[test]
fn a_dead_letter_stream_created_again_mid_redrive_loses_no_record() {
    let (dir, server, out, _) = refused_into_jsonl();
    let fixed = write_config(
        dir.path(),
        "fixed.json",
        &config(&server, jsonl_sink(&out), None),
    );
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["dlq", "redrive", fixed.to_str().unwrap(), "--max-rate", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // At most 2: a loaded machine may poll past the first removal (one per second).
    wait_until(Duration::from_secs(20), "the first removal", || {
        server.stream_messages(DLQ) <= 2
    });
    let js = server.js();
    js.delete_stream(DLQ).unwrap();
    server.create_stream(DLQ, &["dlq.orders"]);
    let nc = server.connect();
    for i in 0..3 {
        nc.publish("dlq.orders", format!("{{\"other\":{i}}}"))
            .unwrap();
    }
    nc.flush().unwrap();
    wait_until(
        Duration::from_secs(5),
        "3 records in the new stream",
        || server.stream_messages(DLQ) == 3,
    );
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_ne!(done.status.code(), Some(0), "{err}");
    assert_eq!(
        server.stream_messages(DLQ),
        3,
        "no record of the new stream removed: {err}"
    );
    // Which check sees it first depends on when the redrive looks: between the deletion and
    // the creation the stream is missing, after it the stream is another.
    assert!(
        err.contains("was created again (incarnation")
            || err.contains("stream DLQ: stream not found"),
        "{err}"
    );
}

/// `--fanout-child NAME` stores into that child only; an unknown child, or a sink that is not a
/// fan-out, is refused naming the flag and the children.
#[test]
fn a_replay_with_fanout_child_stores_only_into_that_child() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", 8, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let mut value = config(&server, json!({}), None);
    value["sink"] = json!({"type": "fanout", "sinks": {
        "archive": file_sink(&a), "restored": file_sink(&b)}});
    let cfg = write_config(dir.path(), "svc.json", &value);
    let (code, stdout, err) = svc(&[
        "replay",
        cfg.to_str().unwrap(),
        "--fanout-child",
        "restored",
    ]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(stdout.contains("read 8, stored 8"), "{stdout}");
    assert_eq!(stored(&b), (1..=8).collect::<Vec<_>>());
    assert!(files_below(&a).is_empty(), "the other child got nothing");

    let (code, _, err) = svc(&["replay", cfg.to_str().unwrap(), "--fanout-child", "nope"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--fanout-child nope: ") && err.contains("archive, restored"),
        "{err}"
    );
    let plain = write_config(
        dir.path(),
        "plain.json",
        &config(&server, file_sink(&a), None),
    );
    let (code, _, err) = svc(&["replay", plain.to_str().unwrap(), "--fanout-child", "a"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--fanout-child a: ") && err.contains("not fanout"),
        "{err}"
    );
}

/// A subject whose payloads are encrypted: the runner's records carry the keyed digest
/// (`payload.hmac_sha256`), never the plain SHA-256, and a redrive checks it with the payload
/// key. A copy of a real record naming the plain digest instead, or another keyed digest, is
/// kept; the real records are delivered, encrypted as `svc run` stores them.
#[test]
fn records_of_encrypted_subjects_are_checked_by_their_keyed_digest() {
    use crate::support::protection::{secrets_env, svc_env, write_private, AES_K1};
    let dir = tempfile::tempdir().unwrap();
    let server = setup();
    let out = dir.path().join("out");
    let k1 = write_private(dir.path(), "k1.key", &AES_K1);
    let protect = |mut cfg: Value| {
        cfg["payload_encryption"] = json!({"enabled": true,
            "keys": [{"key_id": "k1", "key_file": k1}], "active_key_id": "k1",
            "digest_key_id": "k1", "default": "encrypt"});
        cfg["custody"] =
            json!({"enabled": true, "runner_id": "redrive-1", "hmac_key_env": "PP_CUSTODY_KEY"});
        cfg
    };
    let broken = write_config(
        dir.path(),
        "broken.json",
        &protect(config(&server, file_sink(&out), Some(50))),
    );
    let mut runner = Runner::start_env(&broken, &dir.path().join("run.log"), secrets_env());
    wait_until(Duration::from_secs(20), "3 dead letters", || {
        server.stream_messages(DLQ) == 3
    });
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .success());
    let real = records(&server);
    let first = real[0].1.clone();
    assert!(first["payload"]["sha256"].is_null(), "{first}");
    let keyed = first["payload"]["hmac_sha256"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(keyed.len(), 64);
    let mut plain = first.clone();
    plain["payload"] = json!({"sha256": keyed.clone(), "size_bytes": 100});
    let mut other_keyed = first.clone();
    other_keyed["payload"]["hmac_sha256"] = json!("0".repeat(64));
    let nc = server.connect();
    for forged in [&plain, &other_keyed] {
        nc.publish("dlq.orders", forged.to_string()).unwrap();
    }
    nc.flush().unwrap();
    wait_until(Duration::from_secs(10), "5 records", || {
        server.stream_messages(DLQ) == 5
    });

    let fixed = write_config(
        dir.path(),
        "fixed.json",
        &protect(config(&server, file_sink(&out), None)),
    );
    let (code, stdout, err) = svc_env(&["dlq", "redrive", fixed.to_str().unwrap()], None);
    assert_eq!(code, 3, "{stdout}{err}");
    assert!(
        stdout.contains("read 5, stored 3, already present 0"),
        "{stdout}"
    );
    assert!(stdout.contains("kept 2, removed 3"), "{stdout}");
    assert!(
        err.contains("is of a subject whose payloads are encrypted, and the record names a plain"),
        "{err}"
    );
    assert!(
        err.contains("holds a payload whose keyed digest is not the record's"),
        "{err}"
    );
    assert_eq!(stored(&out), (1..=6).collect::<Vec<_>>());
    // The key's budget is the operator's sum over every process that sealed under it.
    assert!(
        err.contains("this replay (with its earlier runs) sealed 3 records under key k1"),
        "{err}"
    );
    for f in files_below(&out) {
        let text = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(!text.contains("xxxxxxxx"), "stored encrypted: {text}");
    }
}

/// Redriven while the cause is not fixed, two records of one refused message (a real one and
/// its copy, re-published or forged) leave one new dead letter, not two; a record naming a
/// delivery the broker cannot have made (delivery 5 at consumer sequence 2) is kept; the
/// plain progress lines are the redrive's own.
#[test]
fn a_still_refused_message_is_dead_lettered_once_and_impossible_deliveries_are_kept() {
    let (_dir, server, out, broken) = refused_into_jsonl();
    let real = records(&server);
    let copy = real[0].1.clone();
    let mut impossible = real[1].1.clone();
    impossible["original"]["consumer_sequence"] = json!(2);
    impossible["original"]["delivery_count"] = json!(5);
    let nc = server.connect();
    for forged in [&copy, &impossible] {
        nc.publish("dlq.orders", forged.to_string()).unwrap();
    }
    nc.flush().unwrap();
    wait_until(Duration::from_secs(10), "5 records", || {
        server.stream_messages(DLQ) == 5
    });

    let (code, stdout, err) = redrive(&broken, &[]);
    assert_eq!(code, 3, "{stdout}{err}");
    assert!(
        stdout.contains("read 4, stored 0, already present 0, refused by governance 3"),
        "{stdout}"
    );
    assert!(
        stdout.contains("dead-lettered 3, original missing 0, kept 1, removed 4"),
        "{stdout}"
    );
    assert!(
        err.contains("original ORDERS sequence 1 was refused again and dead-lettered anew"),
        "{err}"
    );
    assert!(
        err.contains("original.delivery_count is above original.consumer_sequence"),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("redrive: ") && l.contains("msgs")),
        "{err}"
    );
    assert!(!err.lines().any(|l| l.starts_with("replay: ")), "{err}");
    let left = records(&server);
    let mut originals: Vec<u64> = left
        .iter()
        .map(|(_, r)| r["original"]["stream_sequence"].as_u64().unwrap())
        .collect();
    originals.sort_unstable();
    assert_eq!(originals, vec![1, 3, 3, 5], "{left:?}");
    let replayed = left.iter().filter(|(_, r)| r["replayed"] == json!(true));
    assert_eq!(replayed.count(), 3, "one new record per refused message");
    assert!(left.iter().any(|(_, r)| r == &impossible), "kept");
    assert_eq!(stored_lines(&out), vec![2, 4, 6]);
}

/// On a work-queue stream every acknowledged message is gone, the dead-lettered ones too: the
/// redrive says why before it reports each record's original missing (and keeps them).
#[test]
fn a_redrive_from_a_work_queue_stream_says_why_the_originals_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start();
    server
        .js()
        .add_stream(nats::jetstream::StreamConfig {
            retention: nats::jetstream::RetentionPolicy::WorkQueue,
            ..stream_config(STREAM, &["orders.>"])
        })
        .unwrap();
    server.create_stream(DLQ, &["dlq.orders"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", 2, |i| {
        format!("{{\"big\":\"{}\",\"n\":{i}}}", "x".repeat(90)).into_bytes()
    });
    let out = dir.path().join("out");
    let broken = write_config(
        dir.path(),
        "broken.json",
        &config(&server, jsonl_sink(&out), Some(50)),
    );
    let mut runner = Runner::start(&broken, &dir.path().join("run.log"));
    wait_until(
        Duration::from_secs(20),
        "2 dead letters, originals gone",
        || server.stream_messages(DLQ) == 2 && server.stream_messages(STREAM) == 0,
    );
    runner.signal("TERM");
    assert!(runner
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .success());

    let fixed = write_config(
        dir.path(),
        "fixed.json",
        &config(&server, jsonl_sink(&out), None),
    );
    let (code, stdout, err) = redrive(&fixed, &[]);
    assert_eq!(code, 3, "{stdout}{err}");
    assert!(
        err.contains("stream ORDERS has retention workqueue: it removes every message once it is acknowledged"),
        "{err}"
    );
    assert!(
        stdout.contains("original missing 2, kept 0, removed 0"),
        "{stdout}"
    );
    assert_eq!(server.stream_messages(DLQ), 2, "the records are kept");
}
