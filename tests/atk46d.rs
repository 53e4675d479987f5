//! Attack atk46d on `svc replay` and `svc dlq redrive` (issue 46, third look). Each test here
//! reproduces a finding: it fails on the code as attacked and passes once the finding is fixed.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

use super::atk46c::{setup, CONSUMER, STREAM};

/// atk46c's configuration, one sink worker.
fn config(url: &str, out: &Path) -> serde_json::Value {
    let mut cfg = super::atk46c::config(url, out, json!({}));
    cfg["delivery"]["sink_workers"] = json!(1);
    cfg
}

/// FINDING 1 (medium, classes 11/12): docs/replay.md says "A payload-encryption key at its
/// message bound is not a refusal: the replay stops (exit 1) and continues with `--resume`
/// after the key is rotated". But the state file's `shape` digest covers the whole
/// `payload_encryption` block (its keys and `active_key_id`), so after the rotation (k2 added
/// and made active, k1 kept to read what it sealed) `--resume` is refused: "the sink or the
/// settings that shape a record ... differ". The documented way on does not exist; the operator
/// must start the range over (and the per-key counts of the state file are lost with it).
#[test]
fn a_replay_stopped_at_the_key_bound_goes_on_under_a_rotated_key() {
    use crate::support::protection::{write_private, AES_K1, AES_K2};
    let dir = tempfile::tempdir().unwrap();
    let server = setup(5);
    let out = dir.path().join("out");
    let k1 = write_private(dir.path(), "k1.key", &AES_K1);
    let k2 = write_private(dir.path(), "k2.key", &AES_K2);
    let mut cfg = config(&server.url(), &out);
    cfg["payload_encryption"] = json!({"enabled": true,
        "keys": [{"key_id": "k1", "key_file": k1}], "active_key_id": "k1",
        "max_messages_per_key": 3, "default": "encrypt"});
    let path = write_config(dir.path(), "svc.json", &cfg);
    let (code, stdout, err) = svc(&["replay", path.to_str().unwrap(), "--timeout", "3"]);
    assert_eq!(code, 1, "the key bound stops the replay\n{stdout}{err}");
    assert!(err.contains("max_messages_per_key"), "{err}");
    // The rotation docs/payload-protection.md describes: a new key, made active; the old one
    // kept so what it sealed stays readable.
    cfg["payload_encryption"]["keys"] = json!([{"key_id": "k1", "key_file": k1},
                                               {"key_id": "k2", "key_file": k2}]);
    cfg["payload_encryption"]["active_key_id"] = json!("k2");
    let path = write_config(dir.path(), "svc.json", &cfg);
    // Fixed in the docs (docs/replay.md): a rotation changes what shapes a record, so
    // `--resume` refuses it and says why; a new replay of the rest under the new key goes on.
    let (code, stdout, err) = svc(&["replay", path.to_str().unwrap(), "--resume"]);
    assert_ne!(
        code, 0,
        "--resume across a rotation is refused\n{stdout}{err}"
    );
    assert!(err.contains("shape a record"), "{err}");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("svc.json.replay-state")).unwrap())
            .unwrap();
    let next = state["next_seq"].as_u64().unwrap().to_string();
    let rest = dir.path().join("rest.state");
    let (code, stdout, err) = svc(&[
        "replay",
        path.to_str().unwrap(),
        "--start-seq",
        &next,
        "--state",
        rest.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "the rest under the new key\n{stdout}{err}");
    let names = files_below(&out).len();
    assert_eq!(names, 5, "every message stored once");
}

/// The abstract name `StateFile::lock_name` binds for a state file at `path` (absolute).
fn lock_name(path: &Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(path.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("svc-replay-state:{hex}")
}

/// FINDING 2 (low-medium, classes 4/11): the state lock's abstract Unix socket name is
/// `svc-replay-state:<sha256 of the state path>`, predictable from the path (the default is
/// `<config>.replay-state`), and abstract names are shared by every account of the network
/// namespace. Any local account that binds it first blocks every replay and redrive of that
/// state file for as long as it likes, and svc tells the operator "another replay or redrive
/// is using it ... wait for it to end" -- no replay holds the lock file, nothing will end. The
/// message should at least say who holds the name (SO_PEERCRED: uid and pid of the binder)
/// and that the lock file itself is free. Here the test process (standing for the other
/// account) binds the name; no replay runs.
#[test]
fn a_squatted_lock_name_is_not_reported_as_another_replay() {
    use std::os::linux::net::SocketAddrExt;
    let dir = tempfile::tempdir().unwrap();
    let server = setup(3);
    let out = dir.path().join("out");
    let path = write_config(dir.path(), "svc.json", &config(&server.url(), &out));
    let state = std::path::absolute(dir.path().join("svc.json.replay-state")).unwrap();
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(lock_name(&state)).unwrap();
    let squatter = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let (code, stdout, err) = svc(&["replay", path.to_str().unwrap(), "--timeout", "3"]);
    drop(squatter);
    assert_ne!(
        code, 0,
        "the replay ran although its name was taken\n{stdout}{err}"
    );
    assert!(
        !err.contains("another replay or redrive is using it") || err.contains("pid"),
        "a name bound by a process that is no replay (no one holds the lock file) is \
         reported as another replay to wait for, without naming the holder:\n{err}"
    );
}

/// FINDING 3 (low, class 4): the abstract name is the SHA-256 of `std::path::absolute(state)`,
/// which keeps `..` and does not resolve symbolic links, so one state file has many names
/// (`d/sub/../s`, `d/s`, `d/link-to-d/s`). The name exists for one case: another account that
/// can write the directory unlinks `<state>.lock` under a running replay, so a second replay
/// creates and flocks a new lock file. With two spellings of the path, the second replay then
/// passes both checks and two processes write one state file and one sink range. Here replay A
/// runs with `--state d/sub/../s` (slowed by --max-rate), its `s.lock` is removed, and replay B
/// `--resume --state d/s` starts: it should be refused.
#[test]
fn one_state_file_has_one_lock_name() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(40);
    let out = dir.path().join("out");
    let path = write_config(dir.path(), "svc.json", &config(&server.url(), &out));
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let spelled = dir.path().join("sub").join("..").join("s");
    let state = dir.path().join("s");
    let mut first = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["replay", path.to_str().unwrap(), "--state"])
        .arg(&spelled)
        .args(["--max-rate", "4", "--timeout", "5"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !state.exists() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(state.exists(), "replay A wrote no state");
    // Another account that can write the directory.
    std::fs::remove_file(dir.path().join("s.lock")).unwrap();
    let (code, stdout, err) = svc(&[
        "replay",
        path.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--resume",
        "--max-rate",
        "1000",
    ]);
    let a_running = first.try_wait().unwrap().is_none();
    let _ = first.kill();
    let _ = first.wait();
    assert!(
        !a_running || code != 0,
        "replay B (--state {}) ran to exit {code} while replay A (--state {}) held the same \
         state file\n{stdout}{err}",
        state.display(),
        spelled.display()
    );
}

/// FINDING 4 (high, classes 12/6): any publisher on the stream's subjects stops every replay
/// (and `svc inspect`) of a range for good with one message: an empty payload with a
/// `Nats-Msg-Size` header of its own. `svc run` takes such a message for a possible
/// `headers_only` delivery, asks the broker whether the consumer is `headers_only`, and
/// delivers it when it is not (tests/consumer_shapes.rs); `inspect::Reading::check` has no
/// such confirmation and ends the read with "the read's consumer was changed under it". The
/// replay stops at the batch before it, and every `--resume` stops there again: the rest of
/// the range can never be replayed. Here message 3 of 6 is that message.
#[test]
fn an_empty_message_with_its_own_size_header_does_not_stop_a_replay_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(2);
    server.publish_with_headers("orders.created", &[("Nats-Msg-Size", "60")], b"");
    server.publish_n(STREAM, "orders.created", 3, |i| {
        format!("{{\"order\":{}}}", i + 10).into_bytes()
    });
    let out = dir.path().join("out");
    let path = write_config(dir.path(), "svc.json", &config(&server.url(), &out));
    let (code, stdout, err) = svc(&["replay", path.to_str().unwrap(), "--timeout", "3"]);
    let (code2, stdout2, err2) = svc(&["replay", path.to_str().unwrap(), "--resume"]);
    let stored = files_below(&out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .count();
    assert!(
        code == 0 || code2 == 0,
        "a publisher's empty message with a Nats-Msg-Size header stops the replay and every \
         --resume (exit {code}, then {code2}; {stored} of 6 stored)\n{stdout}{err}\n\
         {stdout2}{err2}"
    );
}

/// FINDING 5 (medium, class 12): a range the stream no longer holds is refused or reported
/// when a replay starts (`gone_before`), but `--resume` never looks: a replay stopped with
/// Ctrl-C, whose remaining messages are then purged or aged out (`max_age`, a purge by an
/// operator), resumes, reads nothing, marks its state done and exits 0 with no word about the
/// messages it never replayed. Here 100 messages, Ctrl-C after more than 20, the stream
/// purged, `--resume`: exit 0 and silence, with most of the range never replayed.
#[test]
fn resume_over_a_purged_rest_of_the_range_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(100);
    let out = dir.path().join("out");
    let cfg = write_config(dir.path(), "svc.json", &config(&server.url(), &out));
    let state = dir.path().join("svc.json.replay-state");
    let mut child = Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--max-rate",
            "40",
        ]),
        &dir.path().join("replay.log"),
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
    let stored_before = files_below(&out).len();
    server.js().purge_stream(STREAM).unwrap();
    let (code, stdout, err) = svc(&["replay", cfg.to_str().unwrap(), "--resume"]);
    assert!(
        code != 0 || err.contains("no longer holds"),
        "--resume over a purged rest of the range exited {code} without a word \
         ({stored_before} of 100 replayed)\n{stdout}{err}"
    );
}

/// FINDING 4b (medium, same cause as FINDING 4): `svc dlq redrive` reads the dead-letter stream
/// through the same `read_while`, so one empty message with a `Nats-Msg-Size` header published
/// on the dead-letter subject (anyone the broker lets publish there) stops every redrive at it,
/// for good: the records after it are never redriven. A record that is not a record is
/// otherwise counted "kept" and passed over. Here the stray message is the dead-letter
/// stream's first, the runner's three records follow.
#[test]
fn an_empty_message_with_its_own_size_header_does_not_stop_a_redrive_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream("DLQ", &["dlq.orders"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.publish_with_headers("dlq.orders", &[("Nats-Msg-Size", "60")], b"");
    server.publish_n(STREAM, "orders.created", 4, |i| {
        if i % 2 == 0 {
            format!("{{\"big\":\"{}\"}}", "x".repeat(90)).into_bytes()
        } else {
            format!("{{\"n\":{i}}}").into_bytes()
        }
    });
    let out = dir.path().join("out");
    let mut cfg = config(&server.url(), &out);
    cfg["dead_letter"] = json!({"enabled": true, "subject": "dlq.orders",
                                "expected_stream": "DLQ"});
    cfg["size_policy"] = json!({"enabled": true, "max_payload_bytes": 50});
    let path = write_config(dir.path(), "svc.json", &cfg);
    let mut runner = Runner::start(&path, &dir.path().join("run.log"));
    wait_until(Duration::from_secs(20), "the stray and 2 records", || {
        server.stream_messages("DLQ") == 3
    });
    runner.signal("TERM");
    let _ = runner.wait_timeout(Duration::from_secs(20));
    // The cause fixed: the redrive should now deliver both.
    cfg["size_policy"] = json!({"enabled": false});
    let path = write_config(dir.path(), "svc.json", &cfg);
    let (code, stdout, err) = svc(&["dlq", "redrive", path.to_str().unwrap(), "--timeout", "3"]);
    let (code2, stdout2, err2) = svc(&["dlq", "redrive", path.to_str().unwrap(), "--resume"]);
    // Fixed: the stray is no record, so it is kept (exit 3, as for any record kept) and the
    // two real ones behind it are redriven and removed; a resume has nothing left to do.
    assert!(
        stdout.contains("stored 2") && stdout.contains("kept 1, removed 2") && code2 != 1,
        "an empty message with a Nats-Msg-Size header on the dead-letter subject stops the \
         redrive and every --resume (exit {code}, then {code2}; {} left in the DLQ)\n\
         {stdout}{err}\n{stdout2}{err2}",
        server.stream_messages("DLQ")
    );
    assert_eq!(server.stream_messages("DLQ"), 1, "only the stray is left");
}

/// FINDING 6 (low, class 12): a range the stream no longer holds is refused or reported when it
/// is given by sequence (`--start-seq`, `gone_before`), but not when it is given by time:
/// `--since T` over messages purged or aged out since T replays what is left, exits 0 and says
/// nothing of the rest (the stream's `first_ts` tells that messages stored after T are gone).
/// Here 10 messages, the stream purged, 3 more published, `--since` a time before all of them.
#[test]
fn a_since_range_partly_purged_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let since = time::OffsetDateTime::now_utc() - time::Duration::seconds(5);
    let since = since
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let server = setup(10);
    server.js().purge_stream(STREAM).unwrap();
    server.publish_n(STREAM, "orders.created", 3, |i| {
        format!("{{\"order\":{}}}", i + 10).into_bytes()
    });
    let out = dir.path().join("out");
    let path = write_config(dir.path(), "svc.json", &config(&server.url(), &out));
    let (code, stdout, err) = svc(&[
        "replay",
        path.to_str().unwrap(),
        "--since",
        &since,
        "--timeout",
        "3",
    ]);
    assert!(
        code != 0 || err.contains("no longer holds"),
        "--since {since} over a purged stream exited {code} without a word about the 10 \
         messages gone\n{stdout}{err}"
    );
}

/// FINDING 7 (low, class 3): the counts of a state file are summed with `+=`: a state file whose
/// `counts.read` is near `u64::MAX` (edited by hand, or damaged in the one byte that matters
/// and still valid JSON) makes `--resume` panic in a debug build (overflow) and wrap silently in
/// a release build (no `overflow-checks`), so the summary and the state lie. The state file is
/// read with every other field checked (`next_seq` in range, schema); its counts are not. Here
/// a replay stopped with Ctrl-C, its `counts.read` set to `u64::MAX`, then `--resume`: it
/// should refuse the file naming the field, or finish; it should not panic.
#[test]
fn a_state_file_with_huge_counts_is_refused_or_finished_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(100);
    let out = dir.path().join("out");
    let cfg = write_config(dir.path(), "svc.json", &config(&server.url(), &out));
    let state = dir.path().join("svc.json.replay-state");
    let mut child = Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--max-rate",
            "40",
        ]),
        &dir.path().join("replay.log"),
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
    let mut st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    st["counts"]["read"] = json!(u64::MAX);
    // The service's own file, rewritten in place (mode and owner kept).
    std::fs::write(&state, serde_json::to_vec_pretty(&st).unwrap()).unwrap();
    let (code, stdout, err) = svc(&["replay", cfg.to_str().unwrap(), "--resume"]);
    let after: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap_or_default()).unwrap_or_default();
    assert!(
        !err.contains("panicked") && (code == 0 || err.contains("counts")),
        "--resume of a state file with counts.read = u64::MAX: exit {code}, state now read={} \
         done={}\n{stdout}{err}",
        after["counts"]["read"],
        after["done"]
    );
}
