//! Custody checkpoints with `sink.type: spool` (an edge site), end to end: a real broker and
//! runner append records and CHECKPOINT frames to the spool, `svc spool drain` delivers the
//! records to a file target and puts each checkpoint into the target's store, and `svc
//! verify-custody --public-key` reads the spool and the target as one at every point.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::custody_checkpoints::{
    case_with, checkpoint_files, publish_range, records_in, verify, wait_acked, Case,
};
use crate::support::protection::*;
use crate::support::*;
use base64::Engine;
use serde_json::{json, Value};

/// A spool sink (encrypted, or in clear for the tests that rewrite frames) into a file target
/// at `<dir>/out`, checkpoints every `every` records.
fn edge_case(every: u64, encrypted: bool) -> Case {
    edge_case_with(every, encrypted, json!({}))
}

/// [`edge_case`] with more fields of the spool sink (`drain_batch`).
fn edge_case_with(every: u64, encrypted: bool, fields: Value) -> Case {
    case_with(
        every,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            let mut sink = json!({"type": "spool", "dir": dir.join("spool"),
                                  "max_bytes": 64 << 20,
                                  "target": {"type": "file", "directory": dir.join("out")}});
            for (k, v) in fields.as_object().unwrap() {
                sink[k] = v.clone();
            }
            if encrypted {
                let key = write_private(dir, "spool.key", &[7u8; 32]);
                sink["encryption"] = json!({"key_id": "k1", "key_file": key});
            } else {
                sink["allow_unencrypted"] = json!(true);
            }
            sink
        },
        json!({}),
    )
}

fn out(c: &Case) -> PathBuf {
    c.dir.path().join("out")
}

fn spool(c: &Case) -> PathBuf {
    c.dir.path().join("spool")
}

/// Runs the runner until `to` messages are acknowledged, then stops it (TERM).
fn run_until(c: &Case, log: &str, from: u64, to: u64) {
    let mut runner = start_runner(&c.cfg, &c.dir.path().join(log));
    publish_range(&c.server, from, to);
    wait_acked(&c.server, to);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
}

fn spool_cmd(c: &Case, action: &str) -> (i32, String) {
    let (code, o, e) = svc_env(&["spool", action, c.cfg.to_str().unwrap()], None);
    (code, o + &e)
}

fn verify_ok(c: &Case, records: u64) -> String {
    let (code, text) = verify(c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    let want = format!("{records} records intact, 0 altered, 0 missing, 0 in no checkpoint");
    assert!(text.contains(&want), "{text}");
    assert!(text.ends_with("COMPLETE\n"), "{text}");
    text
}

/// The record file of `seq` in the target.
fn record_file(out: &Path, seq: u64) -> PathBuf {
    files_below(out)
        .into_iter()
        .filter(|p| !p.starts_with(".svc-checkpoints"))
        .map(|p| out.join(p))
        .find(|p| {
            let v: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
            v["stream_sequence"] == seq
        })
        .unwrap()
}

/// (a) COMPLETE before any drain (everything in the spool); (b) `svc spool drain` puts the
/// records and then the checkpoints into the file target: COMPLETE again, and a record
/// deleted from the target is named MISSING, exactly its sequence; (d) a restart after
/// everything was drained (no checkpoint left in the spool, the head file) continues the
/// chain, and target + spool verify COMPLETE before and after the next drain.
#[test]
fn spool_sink_checkpoints_verify_before_and_after_the_drain_and_continue_after_it() {
    let c = edge_case(3, true);
    run_until(&c, "svc.log", 1, 7);
    assert_eq!(
        records_in(&out(&c)),
        0,
        "nothing delivered before the drain"
    );
    let (code, status) = spool_cmd(&c, "status");
    assert_eq!(code, 0, "{status}");
    assert!(status.contains("records: 7\n"), "{status}");
    assert!(
        status.contains("checkpoints: 3\n"),
        "3 + 3 + the last 1: {status}"
    );
    let (code, inspect) = spool_cmd(&c, "inspect");
    assert_eq!(code, 0, "{inspect}");
    assert_eq!(
        inspect.matches("\"kind\":\"checkpoint\"").count(),
        3,
        "{inspect}"
    );
    verify_ok(&c, 7);

    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("7 records delivered to sink file, 3 custody checkpoints put"),
        "{text}"
    );
    assert_eq!(records_in(&out(&c)), 7);
    assert_eq!(checkpoint_files(&out(&c)).len(), 3);
    let (_, status) = spool_cmd(&c, "status");
    assert!(status.contains("records: 0\n") && status.contains("checkpoints: 0\n"));
    verify_ok(&c, 7);

    let victim = record_file(&out(&c), 5);
    let saved = std::fs::read(&victim).unwrap();
    std::fs::remove_file(&victim).unwrap();
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 5: MISSING"), "{text}");
    assert_eq!(text.matches("MISSING").count(), 1, "{text}");
    std::fs::write(&victim, &saved).unwrap();

    // (d) Everything drained: the spool holds no checkpoint, the head file holds index 2.
    run_until(&c, "svc2.log", 8, 10);
    let log = std::fs::read_to_string(c.dir.path().join("svc2.log")).unwrap();
    // The spool holds none; the target's store holds the chain, read back with it.
    assert!(
        log.contains("custody checkpoints: chain read back to its head runner-cp-1:2:"),
        "{log}"
    );
    assert!(
        log.contains("custody checkpoint head runner-cp-1:3:"),
        "{log}"
    );
    verify_ok(&c, 10);
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert_eq!(checkpoint_files(&out(&c)).len(), 4);
    verify_ok(&c, 10);
}

/// The CHECKPOINT frames of a spool in clear, each as (start, end) in the segment bytes.
fn frames(data: &[u8]) -> Vec<(usize, usize, bool)> {
    let mut at = 8;
    let mut out = Vec::new();
    while at + 12 <= data.len() {
        let len = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap()) as usize;
        let end = at + 12 + len;
        out.push((at, end, data[at + 12] == 0x43));
        at = end;
    }
    out
}

fn segment(spool: &Path) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("segment-")
        })
        .collect();
    v.sort();
    assert_eq!(v.len(), 1, "{v:?}");
    v.remove(0)
}

/// A checkpoint frame's body in clear: `0x43 | ms | runner id len | runner id | index | text`.
fn checkpoint_body(runner: &str, index: u64, text: &str) -> Vec<u8> {
    let mut b = vec![0x43];
    b.extend_from_slice(&1_700_000_000_000u64.to_le_bytes());
    b.push(runner.len() as u8);
    b.extend_from_slice(runner.as_bytes());
    b.extend_from_slice(&index.to_le_bytes());
    b.extend_from_slice(text.as_bytes());
    b
}

/// `text` (a stored checkpoint) signed again with another Ed25519 key, its body unchanged.
fn resigned(text: &str, seed: &[u8; 32]) -> String {
    let mut v: Value = serde_json::from_str(text).unwrap();
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(seed).unwrap();
    let sig = pair.sign(v["signed"].as_str().unwrap().as_bytes());
    v["signature"] = json!(B64.encode(sig.as_ref()));
    v.to_string() + "\n"
}

fn refused_start(c: &Case, log: &str) -> String {
    let mut runner = start_runner(&c.cfg, &c.dir.path().join(log));
    let status = runner
        .wait_timeout(Duration::from_secs(30))
        .expect("refused");
    assert!(!status.success());
    runner.log_text()
}

/// (e) A checkpoint frame planted in the spool, written with another key under the runner's
/// id and the next index, is refused by the runner's start and by the verifier; a checkpoint
/// frame removed from the spool is a broken chain for both.
#[test]
fn a_forged_or_removed_checkpoint_frame_is_refused_by_the_start_and_the_verifier() {
    let c = edge_case(3, false);
    run_until(&c, "svc.log", 1, 7);
    let seg = segment(&spool(&c));
    let original = std::fs::read(&seg).unwrap();
    let cps: Vec<(usize, usize)> = frames(&original)
        .into_iter()
        .filter(|f| f.2)
        .map(|f| (f.0, f.1))
        .collect();
    assert_eq!(cps.len(), 3);
    let text = |(a, b): (usize, usize)| {
        let body = &original[a + 12..b];
        let skip = 1 + 8 + 1 + body[9] as usize + 8;
        String::from_utf8(body[skip..].to_vec()).unwrap()
    };

    // Forged: checkpoint 2's body signed with another key, planted as checkpoint 3.
    let forged = resigned(&text(cps[2]), &[0x55; 32]);
    let mut data = original.clone();
    data.extend(crate::spool::frame_of(&checkpoint_body(
        "runner-cp-1",
        3,
        &forged,
    )));
    std::fs::write(&seg, &data).unwrap();
    let log = refused_start(&c, "forged.log");
    assert!(
        log.contains("does not verify under this runner's key"),
        "{log}"
    );
    let (code, text_v) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 1, "{text_v}");
    assert!(text_v.contains(": refused:"), "{text_v}");
    assert!(text_v.contains("NOT complete"), "{text_v}");

    // Removed: checkpoint 1's frame cut out of the segment (a spool in clear: nothing is
    // bound to its offset).
    let mut data = original[..cps[1].0].to_vec();
    data.extend_from_slice(&original[cps[1].1..]);
    std::fs::write(&seg, &data).unwrap();
    let log = refused_start(&c, "removed.log");
    assert!(log.contains("is broken at checkpoint 2"), "{log}");
    let (code, text_v) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 1, "{text_v}");
    assert!(
        text_v.contains("BROKEN: checkpoints 1 to 1 are missing"),
        "{text_v}"
    );

    // Put back: the runner starts again and the audit is complete.
    std::fs::write(&seg, &original).unwrap();
    verify_ok(&c, 7);
    run_until(&c, "back.log", 8, 8);
    verify_ok(&c, 8);
}

/// (c) A drain that crashed after the target took a step (records and checkpoints) but
/// before the spool's position moved: the spool directory as it was before the drain is put
/// back over the drained one, and the drain runs again. The records are found durable, each
/// checkpoint is found stored with the same bytes (never a second copy), and the audit is
/// COMPLETE. A checkpoint the target holds under that name with other bytes stops the drain,
/// the frame kept.
#[test]
fn a_drain_repeated_after_a_crash_stores_each_checkpoint_once() {
    let c = edge_case(2, true);
    run_until(&c, "svc.log", 1, 9);
    let before = c.dir.path().join("spool.before");
    copy_dir(&spool(&c), &before);
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    let stored: Vec<(PathBuf, Vec<u8>)> = checkpoint_files(&out(&c))
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    assert_eq!(stored.len(), 5, "2 + 2 + 2 + 2 + the last 1");

    // The crash: the spool as before the drain, the target as after it.
    std::fs::remove_dir_all(spool(&c)).unwrap();
    copy_dir(&before, &spool(&c));
    verify_ok(&c, 9);
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    let again: Vec<(PathBuf, Vec<u8>)> = checkpoint_files(&out(&c))
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    assert_eq!(again, stored, "each checkpoint stored once, unchanged");
    assert_eq!(records_in(&out(&c)), 9);
    verify_ok(&c, 9);

    // Other bytes under checkpoint 3's name (its body signed with another key): the repeated
    // drain stops at its frame.
    std::fs::remove_dir_all(spool(&c)).unwrap();
    copy_dir(&before, &spool(&c));
    let other = resigned(std::str::from_utf8(&stored[3].1).unwrap(), &[0x55; 32]);
    std::fs::write(&stored[3].0, other).unwrap();
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("checkpoint 3 of runner runner-cp-1")
            && text.contains("differs from the checkpoint the target holds under that name"),
        "{text}"
    );
    let (_, status) = spool_cmd(&c, "status");
    assert!(
        status.contains("checkpoints: 2\n"),
        "3 and 4 kept: {status}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir(to).unwrap();
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700)).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() == "lock" {
            continue;
        }
        let dst = to.join(e.file_name());
        std::fs::copy(e.path(), &dst).unwrap();
    }
}

/// (c) kill -9 of `svc spool drain` at three points of a long drain (3,000 records, a
/// checkpoint every 100, steps of 5 records: most points fall between a step's records and
/// the checkpoint frame after them), then a drain to the end: every checkpoint stored once
/// (the drain that finds one stored under its name with other bytes stops, and this one
/// exits 0), and the audit is COMPLETE between the kills (spool and target as one), beside the
/// last drain and after it. Between them a runner starts on what is left in the spool (a
/// suffix of the chain, its first checkpoints drained) and continues the chain.
#[test]
fn kill_9_of_svc_spool_drain_then_drain_again_is_complete() {
    const N: u64 = 3000;
    let c = edge_case_with(100, true, json!({"drain_batch": 5}));
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    c.server.publish_n(STREAM, "orders.bulk", N as usize, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    wait_acked(&c.server, N);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(60)).is_some());
    let (_, status) = spool_cmd(&c, "status");
    assert!(status.contains("checkpoints: 30\n"), "{status}");
    for at_least in [2, 8, 14] {
        let mut drain = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
            .args(["spool", "drain", c.cfg.to_str().unwrap()])
            .envs(secrets_env())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        wait_until(
            Duration::from_secs(120),
            "checkpoints put by the drain",
            || {
                out(&c).join(".svc-checkpoints").is_dir()
                    && checkpoint_files(&out(&c)).len() >= at_least
            },
        );
        drain.kill().unwrap(); // SIGKILL
        drain.wait().unwrap();
    }
    let stored = checkpoint_files(&out(&c)).len();
    assert!(
        (14..30).contains(&stored),
        "killed before the end: {stored}"
    );
    // Mid-drain (killed): the spool and the target together hold everything.
    verify_ok(&c, N);
    // The runner starts on the spool's suffix of the chain (the first checkpoints drained)
    // and continues it.
    run_until(&c, "svc2.log", N + 1, N + 3);
    let log = std::fs::read_to_string(c.dir.path().join("svc2.log")).unwrap();
    assert!(
        log.contains("chain read back to its head runner-cp-1:29:"),
        "{log}"
    );
    assert!(
        log.contains("custody checkpoint head runner-cp-1:30:"),
        "{log}"
    );
    verify_ok(&c, N + 3);
    // The last drain, with an audit run beside it.
    let drain = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["spool", "drain", c.cfg.to_str().unwrap()])
        .envs(secrets_env())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    let drained = drain.wait_with_output().unwrap();
    assert_eq!(code, 0, "{text}");
    assert!(text.ends_with("COMPLETE\n"), "{text}");
    assert!(drained.status.success(), "{drained:?}");
    assert_eq!(checkpoint_files(&out(&c)).len(), 31);
    assert_eq!(records_in(&out(&c)), N as usize + 3);
    verify_ok(&c, N + 3);
}

/// A PostgreSQL target: `svc init-db` creates the target's tables (events and checkpoints),
/// the audit is COMPLETE before and after `svc spool drain`, which puts every checkpoint into
/// `svc_custody_checkpoints`, and a row deleted from the target afterwards is named MISSING.
#[test]
fn a_postgresql_target_takes_the_checkpoints_and_a_deleted_row_is_named() {
    let db = crate::support::postgres::TestDb::new("cpspool");
    let c = case_with(
        2,
        |dir| {
            let key = write_private(dir, "spool.key", &[9u8; 32]);
            json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
                   "encryption": {"key_id": "k1", "key_file": key},
                   "target": db.sink(json!({}))})
        },
        json!({}),
    );
    let (code, o, e) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{o}{e}");
    assert_eq!(db.count("svc_custody_checkpoints"), 0);
    run_until(&c, "svc.log", 1, 5);
    assert_eq!(db.count("events"), 0);
    verify_ok(&c, 5);
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert_eq!(db.count("events"), 5);
    assert_eq!(db.count("svc_custody_checkpoints"), 3, "2 + 2 + the last 1");
    verify_ok(&c, 5);
    db.conn()
        .simple("DELETE FROM events WHERE stream_sequence = 4")
        .unwrap();
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 4: MISSING"), "{text}");
    assert_eq!(text.matches("MISSING").count(), 1, "{text}");

    // A target that cannot be reached: an error, no verdict from the spool alone.
    let gone = c.dir.path().join("gone.json");
    let cfg = std::fs::read_to_string(&c.cfg).unwrap();
    std::fs::write(&gone, cfg.replace("127.0.0.1:5432/", "127.0.0.1:1/")).unwrap();
    let (code, o, e) = svc_env(
        &[
            "verify-custody",
            gone.to_str().unwrap(),
            "--public-key",
            c.public.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 1, "{o}{e}");
    assert!(e.contains("the spool's target cannot be read"), "{o}{e}");
    assert!(!o.contains("COMPLETE"), "{o}{e}");
}
