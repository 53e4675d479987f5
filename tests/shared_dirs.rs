//! Directories the service shares with other accounts, attacked by a second real account
//! (`svc-attacker`, run with `setpriv`) while the release binaries run as root: planted
//! temporary names, links and FIFOs, a forged record, swapped directories, a default ACL,
//! planted key files. Each attack must fail, and every acknowledged message must be either in
//! a file that holds it or in the DLQ. See docs/security.md, "Shared directories".

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::accounts::*;
use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const DLQ_SUBJECT: &str = "svc.dlq.orders";
/// In every payload: it must never reach a DLQ record or a log line.
const MARK: &str = "PAYLOAD-MARK-51c2";

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A temporary directory the attacker can traverse (tempdirs are 0700).
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    dir
}

fn config(server: &NatsServer, out: &Path, snapshot: &Path, extra: Value) -> Value {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": "svc", "subject": "orders.>"},
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": {"type": "file", "directory": out, "file_mode": "0660",
                 "per_subject_directories": true, "duplicate_policy": "skip_existing"},
        "dead_letter": {"enabled": true, "subject": DLQ_SUBJECT, "expected_stream": "DLQ",
                        "publish_timeout_ms": 2000},
        "metrics": {"enabled": true, "snapshot_file": snapshot, "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    for (k, v) in extra.as_object().unwrap() {
        match (cfg.get_mut(k), v) {
            (Some(Value::Object(base)), Value::Object(patch)) => base.extend(patch.clone()),
            (_, v) => cfg[k] = v.clone(),
        }
    }
    cfg
}

fn broker() -> NatsServer {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream("DLQ", &[DLQ_SUBJECT]);
    server.create_consumer(STREAM, "svc", "orders.>", Duration::from_secs(30));
    server
}

fn publish(server: &NatsServer, subject: &str, n: u64) {
    server.publish_with_headers(
        subject,
        &[],
        format!("{{\"n\": {n}, \"mark\": \"{MARK}\"}}").as_bytes(),
    );
}

/// `svc run` under `umask`, logging to `log`.
fn start_with_umask(config: &Path, log: &Path, umask: &str) -> Runner {
    Runner::spawn(
        Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" run \"$1\""))
            .arg(env!("CARGO_BIN_EXE_svc"))
            .arg(config)
            .env("RUST_LOG", "info"),
        log,
    )
}

fn stop(runner: &mut Runner) {
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(15))
        .expect("svc exits after SIGTERM");
    assert!(status.success(), "{status}\n{}", runner.log_text());
}

/// (stream sequence, DLQ reason) of every DLQ record.
fn dead_letters(server: &NatsServer) -> Vec<(u64, String)> {
    let js = server.js();
    (1..=server.stream_messages("DLQ"))
        .map(|seq| {
            let m = js.get_message("DLQ", seq).unwrap();
            let text = String::from_utf8(m.data.clone()).unwrap();
            assert!(!text.contains(MARK), "payload in the DLQ: {text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            (
                v["original"]["stream_sequence"].as_u64().unwrap(),
                v["failure"]["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Stream sequences of the records in the service's regular files below `dir` (links never
/// followed) that are at their own record's name.
fn stored_sequences(server: &NatsServer, dir: &Path) -> BTreeSet<u64> {
    let incarnation = server.incarnation(STREAM);
    let mut seqs = BTreeSet::new();
    for rel in files_below(dir) {
        let path = dir.join(&rel);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if !meta.file_type().is_file() || meta.uid() != 0 {
            continue;
        }
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let seq = v["stream_sequence"].as_u64().unwrap();
        // A file at another record's name (a planted hard link) stores nothing.
        let name = rel.file_name().unwrap().to_string_lossy().into_owned();
        if name == format!("s-{STREAM}-{incarnation}-{seq}.json") {
            seqs.insert(seq);
        }
    }
    seqs
}

/// Nothing acknowledged is lost: each of `1..=n` is stored (a file that holds it) or
/// dead-lettered, and the consumer has acknowledged all of them.
fn assert_nothing_lost(server: &NatsServer, out: &Path, n: u64) -> Vec<(u64, String)> {
    assert_eq!(server.consumer_state(STREAM, "svc"), (n, 0, 0));
    let stored = stored_sequences(server, out);
    let dlq = dead_letters(server);
    for seq in 1..=n {
        assert!(
            stored.contains(&seq) || dlq.iter().any(|(s, _)| *s == seq),
            "message {seq} acknowledged but neither stored nor dead-lettered \
             (stored {stored:?}, DLQ {dlq:?})"
        );
    }
    dlq
}

#[test]
fn planted_records_and_foreign_or_linked_directories_never_count_as_written() {
    attacker_uid();
    let server = broker();
    let dir = scratch();
    let out = dir.path().join("out");
    // A group-writable data tree: the attacker shares the service's group (gid 0 here).
    std::fs::create_dir(&out).unwrap();
    chmod(&out, 0o770);
    // The directory an earlier run created for orders.eu (the runner's, mode 0770).
    let eu = out.join("orders.eu/idempotency-key");
    std::fs::create_dir_all(&eu).unwrap();
    chmod(&out.join("orders.eu"), 0o770);
    chmod(&eu, 0o770);
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chmod(&theirs, 0o777);
    let snap = dir.path().join("metrics.json");
    let cfg = write_config(
        dir.path(),
        "svc.json",
        &config(&server, &out, &snap, json!({})),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    let settled = |n: u64| {
        wait_until(Duration::from_secs(30), &format!("{n} settled"), || {
            server.try_consumer_state(STREAM, "svc") == Some((n, 0, 0))
        })
    };
    publish(&server, "orders.eu", 1);
    settled(1);
    let key = format!("s-{STREAM}-{}", server.incarnation(STREAM));
    // A hard link to the service's own record 1 at record 2's name (the file is the
    // service's, and holds another record); a forged file of theirs at record 3's name; a
    // link and a directory of theirs in place of two subject directories.
    attacker_does(
        0,
        &format!(
            "ln {eu}/{key}-1.json {eu}/{key}-2.json && \
             printf '{{\"forged\":true}}' > {eu}/{key}-3.json && \
             ln -s {theirs} {out}/orders.link && mkdir {out}/orders.owned && \
             chmod 777 {out}/orders.owned",
            eu = eu.display(),
            key = key,
            theirs = theirs.display(),
            out = out.display()
        ),
    );
    // One per batch, so that each failure is the one the batch's log line names.
    for (n, subject) in [
        (2, "orders.eu"),
        (3, "orders.eu"),
        (4, "orders.link"),
        (5, "orders.owned"),
        (6, "orders.eu"),
    ] {
        publish(&server, subject, n);
        settled(n);
    }
    stop(&mut runner);

    let mut dlq = assert_nothing_lost(&server, &out, 6);
    dlq.sort();
    let reasons = [
        (2, "duplicate_exists"),
        (3, "duplicate_exists"),
        (4, "destination_conflict"),
        (5, "destination_conflict"),
    ];
    assert_eq!(
        dlq,
        reasons.map(|(s, r)| (s, r.to_string())).to_vec(),
        "{}",
        runner.log_text()
    );
    assert_eq!(stored_sequences(&server, &out), BTreeSet::from([1, 6]));
    // Their files are left as they were; nothing went through the link or into their directory.
    assert_eq!(
        std::fs::read(eu.join(format!("{key}-3.json"))).unwrap(),
        br#"{"forged":true}"#
    );
    assert!(files_below(&theirs).is_empty());
    assert!(files_below(&out.join("orders.owned")).is_empty());
    assert_eq!(snapshot_counter(&snap, "messages_written_total"), 2);
    assert_eq!(snapshot_counter(&snap, "messages_dlq_total"), 4);
    let log = runner.log_text();
    for reason in [
        format!("{key}-2.json exists and holds another record"),
        format!("{key}-3.json exists and is owned by uid"),
        "directory orders.link is a symbolic link".into(),
        "directory orders.owned is owned by uid".into(),
    ] {
        assert!(log.contains(&reason), "{reason}: {log}");
    }
    assert!(!log.contains(MARK), "{log}");
}

#[test]
fn directories_swapped_for_links_never_redirect_a_mode_change_or_a_record() {
    attacker_uid();
    let server = broker();
    let dir = scratch();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    chmod(&out, 0o770);
    // The runner's own 0600 key file, somewhere the attacker cannot even enter.
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    chmod(&private, 0o700);
    let key = private.join("key");
    std::fs::write(&key, "secret").unwrap();
    chmod(&key, 0o600);
    const N: u64 = 120;
    // One connection for all (a connection per message costs the client's start-up delay).
    let js = server.js();
    for n in 1..=N {
        let payload = format!("{{\"n\": {n}, \"mark\": \"{MARK}\"}}");
        js.publish(&format!("orders.s{n}"), payload).unwrap();
    }
    // The attacker swaps every new subject directory for a link to the key file, for as
    // long as the run lasts.
    let mut swapper = Command::new("setpriv")
        .arg(format!("--reuid={}", attacker_uid()))
        .args(["--regid=0", "--clear-groups", "sh", "-c"])
        .arg(format!(
            "i=0; while :; do for d in {out}/orders.s*; do \
             [ -L \"$d\" ] && continue; [ -d \"$d\" ] || continue; \
             mv -T \"$d\" {out}/moved.$i 2>/dev/null && ln -s {key} \"$d\"; i=$((i+1)); \
             done; done",
            out = out.display(),
            key = key.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let snap = dir.path().join("metrics.json");
    let cfg = write_config(
        dir.path(),
        "svc.json",
        &config(&server, &out, &snap, json!({})),
    );
    let started = Instant::now();
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(120), "all settled", || {
        server.try_consumer_state(STREAM, "svc") == Some((N, 0, 0))
    });
    eprintln!(
        "{N} messages settled in {:?} under the swapper",
        started.elapsed()
    );
    stop(&mut runner);
    let _ = swapper.kill();
    let _ = swapper.wait();

    let meta = std::fs::metadata(&key).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o600,
        "key mode changed"
    );
    assert_eq!(std::fs::read_to_string(&key).unwrap(), "secret");
    let dlq = assert_nothing_lost(&server, &out, N);
    assert!(
        dlq.iter().all(|(_, r)| r == "destination_conflict"),
        "{dlq:?}"
    );
    let swaps = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_symlink())
        .count();
    eprintln!(
        "{swaps} directories swapped for links; {} messages dead-lettered, {} stored",
        dlq.len(),
        stored_sequences(&server, &out).len()
    );
    assert!(
        swaps > 0,
        "the attacker never won a swap: the test proved nothing"
    );
}

/// The binary ACL of `setfacl -d -m u:<uid>:r-x`: owner rwx, the named user r-x, group r-x,
/// mask r-x, others none (`system.posix_acl_default`, version 2).
fn default_acl_naming(uid: u32) -> Vec<u8> {
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 5, uid),
        (0x04, 5, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    acl
}

#[test]
fn a_default_acl_never_lets_another_account_read_records_or_the_snapshot() {
    let uid = attacker_uid();
    let server = broker();
    let dir = scratch();
    let out = dir.path().join("out");
    let metrics = dir.path().join("metrics");
    for d in [&out, &metrics] {
        std::fs::create_dir(d).unwrap();
        chmod(d, 0o755);
        rustix::fs::setxattr(
            d.as_path(),
            "system.posix_acl_default",
            &default_acl_naming(uid),
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
    }
    for n in 1..=3 {
        publish(&server, "orders.eu", n);
    }
    let snap = metrics.join("metrics.json");
    let cfg = write_config(
        dir.path(),
        "svc.json",
        &config(&server, &out, &snap, json!({})),
    );
    let mut runner = start_with_umask(&cfg, &dir.path().join("svc.log"), "022");
    wait_until(Duration::from_secs(30), "all settled", || {
        server.try_consumer_state(STREAM, "svc") == Some((3, 0, 0))
    });
    wait_until(Duration::from_secs(10), "snapshot", || snap.exists());
    stop(&mut runner);

    // The sink refuses the directory: every message dead-lettered, no record written.
    let dlq = assert_nothing_lost(&server, &out, 3);
    assert_eq!(dlq.len(), 3, "{dlq:?}");
    assert!(dlq.iter().all(|(_, r)| r == "destination_conflict"));
    assert!(files_below(&out).is_empty());
    assert!(runner.log_text().contains("has a default ACL"));
    // The snapshot (written in place, the ACL stripped): 0640 and no ACL entry for them.
    let meta = std::fs::metadata(&snap).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    let mut acl = [0u8; 256];
    assert_eq!(
        rustix::fs::getxattr(snap.as_path(), "system.posix_acl_access", &mut acl[..]),
        Err(rustix::io::Errno::NODATA),
        "the snapshot kept the inherited ACL"
    );
    let read = as_attacker(65534, &format!("cat {}", snap.display()));
    assert!(!read.status.success(), "the attacker read the snapshot");
}

#[test]
fn a_fifo_at_a_temporary_name_neither_blocks_the_snapshot_nor_receives_it() {
    attacker_uid();
    let server = broker();
    let dir = scratch();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let snap = shared.join("metrics.json");
    let cfg = write_config(
        dir.path(),
        "svc.json",
        &config(&server, &out, &snap, json!({})),
    );
    // Under umask 000 the snapshot used to be 0666.
    let mut runner = start_with_umask(&cfg, &dir.path().join("svc.log"), "000");
    let pid = runner.child.id();
    wait_until(Duration::from_secs(10), "first snapshot", || snap.exists());
    // The name the runner used to write through, and nearby pids' names as links.
    attacker_does(
        65534,
        &format!(
            "mkfifo {s}/.metrics.json.tmp.{pid} && for p in $(seq {a} {b}); do \
             ln -s {out} {s}/.metrics.json.tmp.$p; done",
            s = shared.display(),
            a = pid + 1,
            b = pid + 50,
            out = out.display()
        ),
    );
    for n in 1..=5 {
        publish(&server, "orders.eu", n);
    }
    wait_until(Duration::from_secs(30), "acked", || {
        server.try_consumer_state(STREAM, "svc") == Some((5, 0, 0))
    });
    wait_until(Duration::from_secs(10), "snapshot keeps updating", || {
        snapshot_counter(&snap, "messages_acked_total") == 5
    });
    let started = Instant::now();
    stop(&mut runner);
    assert!(started.elapsed() < Duration::from_secs(10));
    let meta = std::fs::symlink_metadata(&snap).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640, "umask 000");
    assert_eq!(meta.uid(), 0);
    assert_nothing_lost(&server, &out, 5);
    // Only the snapshot and the attacker's own plants are in the directory.
    for e in std::fs::read_dir(&shared).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            name == "metrics.json" || e.metadata().unwrap().uid() != 0,
            "left behind: {name}"
        );
    }
}

#[test]
fn scrape_textfile_as_root_never_writes_through_a_planted_link() {
    attacker_uid();
    let dir = scratch();
    let textdir = dir.path().join("textfile");
    std::fs::create_dir(&textdir).unwrap();
    chmod(&textdir, 0o777);
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    chmod(&private, 0o700);
    let victim = private.join("shadow");
    std::fs::write(&victim, "root:keep\n").unwrap();
    chmod(&victim, 0o600);
    let snap = dir.path().join("snap.json");
    std::fs::write(&snap, crate::support::observe::snapshot(&[], 0.0)).unwrap();
    let prom = textdir.join("svc.prom");
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        crate::support::observe::policy(&format!(
            r#"{{"scrape": {{"output_file": "{}"}}}}"#,
            prom.display()
        )),
    )
    .unwrap();
    // Links at the names the next few hundred pids would have used.
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    attacker_does(
        65534,
        &format!(
            "for p in $(seq {a} {b}); do ln -s {v} {t}/.svc.prom.tmp.$p; done",
            a = last + 1,
            b = last + 400,
            v = victim.display(),
            t = textdir.display()
        ),
    );
    for umask in ["000", "077"] {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask} && exec \"$0\" scrape-textfile \"$1\" \"$2\""
            ))
            .arg(crate::support::observe::bin())
            .arg(&snap)
            .arg(&policy)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let meta = std::fs::symlink_metadata(&prom).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644, "umask {umask}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root:keep\n");
    assert_eq!(
        std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // The node exporter's user (any other account) can read it.
    let read = as_attacker(65534, &format!("cat {}", prom.display()));
    assert!(read.status.success());
    assert!(String::from_utf8_lossy(&read.stdout).contains("svc_"));
}

fn key_config(server: &NatsServer, dir: &Path, key_file: &Path, public_key_file: &Path) -> PathBuf {
    let out = dir.join("out");
    let _ = std::fs::create_dir(&out);
    let extra = json!({
        "payload_encryption": {
            "enabled": true, "keys": [{"key_id": "k1", "key_file": key_file}],
            "active_key_id": "k1", "digest_key_id": "k1", "default": "encrypt"
        },
        "authenticity": {
            "enabled": true,
            "keys": [{"key_id": "ed1", "public_key_file": public_key_file}],
            "rules": [{"subject": "orders.ed.>", "required": true}]
        }
    });
    write_config(
        dir,
        "keys.json",
        &config(server, &out, &dir.join("metrics.json"), extra),
    )
}

#[test]
fn planted_or_foreign_key_files_are_refused_at_once() {
    attacker_uid();
    let server = broker();
    let dir = scratch();
    let shared = dir.path().join("keys");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    let good = dir.path().join("good.key");
    std::fs::write(&good, "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n").unwrap();
    chmod(&good, 0o600);
    // An Ed25519 public key (any 32 bytes decode; only ownership is in question here).
    let good_pub = dir.path().join("good.pub");
    std::fs::write(&good_pub, "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\n").unwrap();
    chmod(&good_pub, 0o644);
    let s = shared.display();
    attacker_does(
        65534,
        &format!(
            "mkfifo -m 600 {s}/fifo.key && ln -s {good} {s}/link.key && \
             (umask 077 && echo BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc= > {s}/theirs.key) && \
             cp {s}/theirs.key {s}/theirs.pub && chmod 644 {s}/theirs.pub",
            good = good.display()
        ),
    );
    let cases: [(&str, PathBuf, PathBuf, &str); 4] = [
        (
            "fifo",
            shared.join("fifo.key"),
            good_pub.clone(),
            "is not a regular file",
        ),
        (
            "link",
            shared.join("link.key"),
            good_pub.clone(),
            "is a symbolic link",
        ),
        (
            "foreign key",
            shared.join("theirs.key"),
            good_pub.clone(),
            "is owned by uid",
        ),
        (
            "foreign public key",
            good.clone(),
            shared.join("theirs.pub"),
            "is owned by uid",
        ),
    ];
    for (what, key, public, expected) in cases {
        let cfg = key_config(&server, dir.path(), &key, &public);
        let log = dir.path().join(format!("{}.log", what.replace(' ', "-")));
        let mut runner = Runner::start(&cfg, &log);
        let status = runner
            .wait_timeout(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{what}: svc run still running (blocked?)"));
        assert!(!status.success(), "{what}");
        let text = runner.log_text();
        assert!(text.contains(expected), "{what}: {text}");
        assert!(!text.contains("BwcHBwcH"), "{what}: key in the log: {text}");
    }
    // Positive control: the service's own files start the runner.
    let cfg = key_config(&server, dir.path(), &good, &good_pub);
    let mut runner = Runner::start(&cfg, &dir.path().join("good.log"));
    publish(&server, "orders.eu", 1);
    wait_until(Duration::from_secs(30), "acked", || {
        server.try_consumer_state(STREAM, "svc") == Some((1, 0, 0))
    });
    stop(&mut runner);
}

#[test]
fn planted_segment_names_neither_exhaust_nor_redirect_jsonl_segments() {
    attacker_uid();
    let server = broker();
    let dir = scratch();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    chmod(&out, 0o777);
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    chmod(&victim, 0o644);
    let mut cfg = config(&server, &out, &dir.path().join("metrics.json"), json!({}));
    cfg["sink"] = json!({"type": "file", "directory": out, "mode": "jsonl",
                         "segment_max_age_seconds": 1});
    let cfg = write_config(dir.path(), "svc.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    let pid = runner.child.id();
    // Every name the runner's counter would reach in the next seconds under the old,
    // predictable scheme (1,100 counters per second: over its 1,000 attempts), as links.
    attacker_does(
        65534,
        &format!(
            "python3 -c 'import os, time; t = time.time(); \
             [os.symlink(\"{victim}\", \"{out}/segment-%s-{pid}-%06d.jsonl\" \
             % (time.strftime(\"%Y%m%dT%H%M%SZ\", time.gmtime(t + s)), c)) \
             for s in range(6) for c in range(1, 1101)]'",
            victim = victim.display(),
            out = out.display()
        ),
    );
    for round in 0..3u64 {
        for n in 1..=3 {
            publish(&server, "orders.eu", round * 3 + n);
        }
        wait_until(Duration::from_secs(30), "round settled", || {
            server.try_consumer_state(STREAM, "svc") == Some(((round + 1) * 3, 0, 0))
        });
        std::thread::sleep(Duration::from_millis(1100));
    }
    stop(&mut runner);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    let mut seqs = BTreeSet::new();
    let mut segments = 0;
    for e in std::fs::read_dir(&out).unwrap() {
        let e = e.unwrap();
        let meta = std::fs::symlink_metadata(e.path()).unwrap();
        if meta.file_type().is_symlink() {
            continue;
        }
        assert_eq!(meta.uid(), 0);
        segments += 1;
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            seqs.insert(v["stream_sequence"].as_u64().unwrap());
        }
    }
    assert!(segments >= 2, "{segments} segments");
    assert_eq!(seqs, (1..=9).collect::<BTreeSet<u64>>());
    assert!(!runner.log_text().contains("no free segment name"));
}

#[test]
fn a_snapshot_from_another_account_or_with_absurd_values_is_withheld() {
    attacker_uid();
    let dir = scratch();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let prom = dir.path().join("svc.prom");
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        crate::support::observe::policy(&format!(
            r#"{{"scrape": {{"output_file": "{}"}}}}"#,
            prom.display()
        )),
    )
    .unwrap();
    let good = crate::support::observe::snapshot(&[], 0.0);
    let scrape = |snap: &Path| {
        Command::new(crate::support::observe::bin())
            .arg("scrape-textfile")
            .arg(snap)
            .arg(&policy)
            .output()
            .unwrap()
    };
    // The attacker's own, fresh and well-formed snapshot in the shared directory.
    let theirs = shared.join("metrics.json");
    std::fs::write(dir.path().join("good.json"), &good).unwrap();
    chmod(&dir.path().join("good.json"), 0o644);
    attacker_does(
        65534,
        &format!(
            "cp {} {}",
            dir.path().join("good.json").display(),
            theirs.display()
        ),
    );
    let o = scrape(&theirs);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("refused as possibly forged"), "{err}");
    assert!(std::fs::read_to_string(&prom)
        .unwrap()
        .starts_with("# svc-observe: metrics withheld"));
    // The service's own file with an absurd value.
    let absurd = dir.path().join("absurd.json");
    let mut v: Value = serde_json::from_str(&good).unwrap();
    v["gauges"]["last_sink_success_epoch_seconds"] = json!(1e308);
    std::fs::write(&absurd, v.to_string()).unwrap();
    let o = scrape(&absurd);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("outside the plausible range"));
    // Positive control: the service's own, plausible snapshot.
    let o = scrape(&dir.path().join("good.json"));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // `expected_owner` names the one account whose snapshot counts.
    let with_owner = |uid: u32| {
        crate::support::observe::policy(&format!(
            r#"{{"expected_owner": {uid}, "scrape": {{"output_file": "{}"}}}}"#,
            prom.display()
        ))
    };
    std::fs::write(&policy, with_owner(attacker_uid())).unwrap();
    let o = scrape(&dir.path().join("good.json"));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not to expected_owner"));
    std::fs::write(&policy, with_owner(0)).unwrap();
    let o = scrape(&dir.path().join("good.json"));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
