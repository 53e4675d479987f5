//! Signed custody checkpoints into the file sink, end to end: a real broker and runner,
//! `svc verify-custody --public-key` naming a deleted record, refusing a forged checkpoint,
//! a chain with a checkpoint removed and an unknown key; a kill -9 between the records and
//! their checkpoint covered after the restart; every signature and root checked again by
//! Python `cryptography`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::postgres::TestDb;
use crate::support::protection::*;
use crate::support::python::python;
use crate::support::*;
use base64::Engine;
use serde_json::{json, Value};

pub(crate) const CP_SEED: [u8; 32] = [0x44; 32];

pub(crate) fn public_key_b64(seed: &[u8; 32]) -> String {
    use ring::signature::KeyPair;
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(seed).unwrap();
    B64.encode(pair.public_key().as_ref())
}

fn write_public(dir: &Path, name: &str, b64: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, b64).unwrap();
    p
}

pub(crate) struct Case {
    pub(crate) server: NatsServer,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) cfg: PathBuf,
    pub(crate) public: PathBuf,
}

fn case(every_records: u64) -> Case {
    case_into(every_records, |dir| {
        std::fs::create_dir(dir.join("out")).unwrap();
        json!({"type": "file", "directory": dir.join("out")})
    })
}

fn case_into(every_records: u64, sink: impl FnOnce(&Path) -> Value) -> Case {
    case_with(every_records, sink, json!({}))
}

/// [`case_into`] with more config blocks.
pub(crate) fn case_with(
    every_records: u64,
    sink: impl FnOnce(&Path) -> Value,
    extra: Value,
) -> Case {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let key = write_private(dir.path(), "cp.key", &CP_SEED);
    let public = write_public(dir.path(), "cp.pub", &public_key_b64(&CP_SEED));
    let mut blocks = json!({"custody": {
        "enabled": true, "runner_id": "runner-cp-1", "hmac_key_env": "PP_CUSTODY_KEY",
        "checkpoints": {"enabled": true, "every_records": every_records,
                        "every_seconds": 3600, "signing_key_file": key, "key_id": "cp1"}}});
    for (k, v) in extra.as_object().unwrap() {
        blocks[k] = v.clone();
    }
    let sink = sink(dir.path());
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&server, dir.path(), sink, blocks),
    );
    Case {
        server,
        dir,
        cfg,
        public,
    }
}

/// A file sink that refuses a record over 2048 bytes for good, no DLQ, `max_deliveries` 2, a
/// fixed NAK delay of `nak_ms`, one sink worker; a checkpoint only at the stop (every 100
/// records, every hour) or within a second of a gap.
pub(crate) fn refusing_case(nak_ms: u64) -> Case {
    case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "file", "directory": dir.join("out"), "max_record_bytes": 2048})
        },
        json!({"delivery": {"batch_size": 16, "fetch_expiry_ms": 200,
                            "max_in_flight_batches": 2, "sink_workers": 1,
                            "shutdown_timeout_seconds": 10, "max_deliveries": 2,
                            "nak_backoff": {"mode": "fixed", "initial_ms": nak_ms,
                                            "jitter": "none"}}}),
    )
}

/// Publishes `{"n":i}` on `orders.n<i>` for each i, a connection each (several tests'
/// set-ups count on the pace this gives: about one message per fetched batch).
pub(crate) fn publish_range(server: &NatsServer, from: u64, to: u64) {
    for i in from..=to {
        server.publish_with_headers(
            &format!("orders.n{i}"),
            &[],
            format!("{{\"n\":{i}}}").as_bytes(),
        );
    }
}

pub(crate) fn wait_acked(server: &NatsServer, n: u64) {
    wait_until(Duration::from_secs(60), "every message acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((n, 0, 0))
    });
}

pub(crate) fn verify(c: &Case, keys: &[&str]) -> (i32, String) {
    verify_env(c, keys, &Default::default())
}

fn verify_env(
    c: &Case,
    keys: &[&str],
    env: &std::collections::HashMap<String, String>,
) -> (i32, String) {
    let mut args = vec!["verify-custody", c.cfg.to_str().unwrap()];
    for k in keys {
        args.extend(["--public-key", k]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(&args)
        .envs(secrets_env())
        .envs(env)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

pub(crate) fn checkpoint_files(out: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(out.join(".svc-checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

/// Python `cryptography` checks each checkpoint's Ed25519 signature over its signed body and
/// recomputes its RFC 6962 root from its leaves; returns the leaves' sequences.
/// The gaps the checkpoint files list, `[sequence, reason]`, in file order.
fn gaps_in(files: &[PathBuf]) -> Vec<Value> {
    files
        .iter()
        .flat_map(|f| {
            let cp: Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            let body: Value = serde_json::from_str(cp["signed"].as_str().unwrap()).unwrap();
            body["gaps"].as_array().unwrap().clone()
        })
        .collect()
}

fn python_check(files: &[PathBuf], public_b64: &str) -> Vec<u64> {
    let script = r#"
import sys, json, base64, hashlib
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
pub = Ed25519PublicKey.from_public_bytes(base64.b64decode(sys.argv[1]))
def root(leaves):
    if not leaves: return hashlib.sha256(b"").digest()
    if len(leaves) == 1: return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < len(leaves): k *= 2
    return hashlib.sha256(b"\x01" + root(leaves[:k]) + root(leaves[k:])).digest()
seqs = []
prev = ""
for path in sys.argv[2:]:
    cp = json.load(open(path))
    pub.verify(base64.b64decode(cp["signature"]), cp["signed"].encode())
    body = json.loads(cp["signed"])
    leaves = [s.to_bytes(8, "big") + bytes.fromhex(d) for s, d in cp["leaves"]]
    assert root(leaves).hex() == body["root"], path
    assert body["previous"] == prev, path
    prev = hashlib.sha256(cp["signed"].encode()).hexdigest()
    seqs += [s for s, _ in cp["leaves"]]
print(json.dumps(seqs))
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(public_b64)
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The file holding the record of `seq` (the checkpoints' directory is not a record's).
fn record_path(out: &Path, seq: u64) -> PathBuf {
    files_below(out)
        .into_iter()
        .filter(|p| {
            !p.starts_with(".svc-checkpoints") && p.extension().is_some_and(|e| e == "json")
        })
        .map(|p| out.join(p))
        .find(|p| {
            let v: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
            v["stream_sequence"] == seq
        })
        .unwrap()
}

#[test]
fn a_deleted_record_is_named_and_forgery_removal_and_unknown_keys_refused() {
    let c = case(3);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 7);
    wait_acked(&c.server, 7);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let out = c.dir.path().join("out");
    let files = checkpoint_files(&out);
    assert_eq!(files.len(), 3, "3 + 3 + the last 1 at the stop");
    let public = c.public.to_str().unwrap();
    assert_eq!(
        python_check(&files, &public_key_b64(&CP_SEED)),
        (1..=7).collect::<Vec<u64>>()
    );

    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("7 records intact, 0 altered, 0 missing"),
        "{text}"
    );
    assert!(text.ends_with("COMPLETE\n"), "{text}");

    // One record deleted: exactly its sequence is named.
    let victim = record_path(&out, 5);
    let saved = std::fs::read(&victim).unwrap();
    std::fs::remove_file(&victim).unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 5: MISSING"), "{text}");
    assert_eq!(text.matches("MISSING").count(), 1, "{text}");
    assert!(
        text.contains("6 records intact, 0 altered, 1 missing"),
        "{text}"
    );
    std::fs::write(&victim, &saved).unwrap();

    // One record altered (its custody HMAC cannot be recomputed without the secret).
    let mut v: Value = serde_json::from_slice(&saved).unwrap();
    v["classification"] = json!("downgraded");
    std::fs::write(&victim, v.to_string()).unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 5 ("), "{text}");
    assert!(text.contains("ALTERED"), "{text}");
    std::fs::write(&victim, &saved).unwrap();

    // A checkpoint whose signed body was changed: forged.
    let cp1 = std::fs::read_to_string(&files[1]).unwrap();
    let forged = cp1.replacen("\\\"count\\\":3", "\\\"count\\\":2", 1);
    assert_ne!(forged, cp1);
    std::fs::write(&files[1], &forged).unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("refused: FORGED"), "{text}");
    std::fs::write(&files[1], &cp1).unwrap();

    // The middle checkpoint removed: the chain is broken.
    std::fs::remove_file(&files[1]).unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("BROKEN: checkpoints 1 to 1 are missing"),
        "{text}"
    );
    std::fs::write(&files[1], &cp1).unwrap();

    // Another key under the same id: every checkpoint forged; under another id: unknown.
    let other = write_public(c.dir.path(), "other.pub", &public_key_b64(&[9u8; 32]));
    let (code, text) = verify(&c, &[other.to_str().unwrap()]);
    assert_eq!((code, text.matches("FORGED").count()), (1, 3), "{text}");
    let other_id = format!("cp9={public}");
    let (code, text) = verify(&c, &[&other_id]);
    assert_eq!(code, 1, "{text}");
    assert_eq!(
        text.matches("unknown key (key id cp1)").count(),
        3,
        "{text}"
    );

    // Untouched again: complete.
    assert_eq!(verify(&c, &[public]).0, 0);
}

/// Kills `runner` (-9) once its `uncovered` records are stored: the audit names each as in no
/// checkpoint yet, none missing; a restarted runner delivers `then` and, stopped, leaves every
/// record up to `then`'s end covered.
fn killed_then_covered_after_restart(
    c: &Case,
    mut runner: crate::support::process::Runner,
    uncovered: usize,
    then: std::ops::RangeInclusive<u64>,
) {
    runner.sigkill();
    let public = c.public.to_str().unwrap();
    let (code, text) = verify(c, &[public]);
    assert_eq!(code, 1, "{text}");
    let shown = text.matches("in no checkpoint yet\n").count();
    assert_eq!(shown, uncovered, "{text}");
    assert!(!text.contains("MISSING"), "{text}");

    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    publish_range(&c.server, *then.start(), *then.end());
    wait_acked(&c.server, *then.end());
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(c, &[public]);
    assert_eq!(code, 0, "{text}");
    let complete = format!(
        "{} records intact, 0 altered, 0 missing, 0 in no checkpoint",
        then.end()
    );
    assert!(text.contains(&complete), "{text}");
}

#[test]
fn records_committed_before_a_kill_9_are_covered_after_the_restart() {
    let c = case(1000);
    let log = c.dir.path().join("svc.log");
    let runner = start_runner(&c.cfg, &log);
    publish_range(&c.server, 1, 4);
    wait_acked(&c.server, 4);
    killed_then_covered_after_restart(&c, runner, 4, 5..=6);
    let files = checkpoint_files(&c.dir.path().join("out"));
    assert_eq!(files.len(), 1);
    assert_eq!(
        python_check(&files, &public_key_b64(&CP_SEED)),
        (1..=6).collect::<Vec<u64>>()
    );
}

#[test]
fn a_deleted_postgresql_row_is_named() {
    let db = TestDb::new("cp");
    let c = case_into(2, |_| db.sink(json!({})));
    let cfg = c.cfg.to_str().unwrap();
    let (code, out, err) = svc_env(&["init-db", cfg], None);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(db.count("svc_custody_checkpoints"), 0);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 5);
    wait_acked(&c.server, 5);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let rows = db.rows("SELECT checkpoint FROM svc_custody_checkpoints ORDER BY checkpoint_index");
    assert_eq!(rows.len(), 3, "2 + 2 + the last 1 at the stop");
    let files: Vec<PathBuf> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let p = c.dir.path().join(format!("cp{i}.json"));
            std::fs::write(&p, r[0].as_deref().unwrap()).unwrap();
            p
        })
        .collect();
    assert_eq!(
        python_check(&files, &public_key_b64(&CP_SEED)),
        (1..=5).collect::<Vec<u64>>()
    );
    let public = c.public.to_str().unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("5 records intact, 0 altered, 0 missing"),
        "{text}"
    );

    db.conn()
        .simple("DELETE FROM events WHERE stream_sequence = 3")
        .unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 3: MISSING"), "{text}");
    assert_eq!(text.matches("MISSING").count(), 1, "{text}");

    // A checkpoint row deleted: the chain is broken.
    db.conn()
        .simple("DELETE FROM svc_custody_checkpoints WHERE checkpoint_index = 1")
        .unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("BROKEN"), "{text}");
}

pub(crate) fn mysql_sink(database: &str) -> Value {
    json!({"type": "relational_db", "engine": "mysql", "tls_mode": "disable",
           "dsn": format!("mysql://root@127.0.0.1:3306/{database}"), "table": "events"})
}

/// The MySQL engine keeps its checkpoints in `svc_custody_checkpoints` as PostgreSQL does
/// (created by `svc init-db`), against the real MariaDB: an untouched run verifies complete,
/// one deleted row is named by exactly its sequence, a deleted checkpoint row breaks the chain.
#[test]
fn a_deleted_mysql_row_is_named() {
    let db = crate::support::mysql::MyDb::new("cp");
    let c = case_into(2, |_| mysql_sink(&db.name));
    let cfg = c.cfg.to_str().unwrap();
    let (code, out, err) = svc_env(&["init-db", "--print", cfg], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("CREATE TABLE IF NOT EXISTS `svc_custody_checkpoints`"),
        "{out}"
    );
    let (code, out, err) = svc_env(&["init-db", cfg], None);
    assert_eq!(code, 0, "{out}{err}");
    let count = |sql: &str| db.rows(sql)[0][0].clone().unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM svc_custody_checkpoints"), "0");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 5);
    wait_acked(&c.server, 5);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let rows = db.rows("SELECT checkpoint FROM svc_custody_checkpoints ORDER BY checkpoint_index");
    assert_eq!(rows.len(), 3, "2 + 2 + the last 1 at the stop");
    let files: Vec<PathBuf> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let p = c.dir.path().join(format!("cp{i}.json"));
            std::fs::write(&p, r[0].as_deref().unwrap()).unwrap();
            p
        })
        .collect();
    assert_eq!(
        python_check(&files, &public_key_b64(&CP_SEED)),
        (1..=5).collect::<Vec<u64>>()
    );
    let public = c.public.to_str().unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.ends_with(
            "3 checkpoints (0 refused, 0 chain problems), 5 records intact, 0 altered, 0 \
             missing, 0 in no checkpoint yet, 0 runner-caused gaps: COMPLETE\n"
        ),
        "{text}"
    );

    db.conn()
        .query("DELETE FROM events WHERE stream_sequence = 3")
        .unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 3: MISSING"), "{text}");
    assert_eq!(text.matches("MISSING").count(), 1, "{text}");
    assert!(
        text.contains("4 records intact, 0 altered, 1 missing"),
        "{text}"
    );

    // A checkpoint row deleted: the chain is broken.
    db.conn()
        .query("DELETE FROM svc_custody_checkpoints WHERE checkpoint_index = 1")
        .unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("BROKEN: checkpoints 1 to 1 are missing"),
        "{text}"
    );
    // Past one listing page (10,000 keys) and many fetches (1,000 rows each): 10,001 copies of
    // record 1 under other keys and 10,001 unreadable checkpoint rows of another runner, every
    // one read back.
    let cols = db.rows(
        "SELECT GROUP_CONCAT(column_name ORDER BY ordinal_position) FROM \
         information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'events' \
         AND column_name <> 'idempotency_key'",
    )[0][0]
        .clone()
        .unwrap();
    let picked: Vec<String> = cols.split(',').map(|c| format!("e.{c}")).collect();
    let mut conn = db.conn();
    conn.query(&format!(
        "INSERT INTO events (idempotency_key, {cols}) SELECT CONCAT(e.idempotency_key, '-', \
         s.seq), {} FROM events e JOIN seq_1_to_10001 s WHERE e.stream_sequence = 1",
        picked.join(", ")
    ))
    .unwrap();
    conn.query(
        "INSERT INTO svc_custody_checkpoints (runner_id, checkpoint_index, checkpoint) \
         SELECT 'filler', seq, 'x' FROM seq_1_to_10001",
    )
    .unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1);
    let summary = text.lines().last().unwrap();
    assert!(
        summary.starts_with(
            "10003 checkpoints (10001 refused, 1 chain problems), 10004 records intact"
        ),
        "{summary}"
    );
}

/// The MySQL store's rescan (records read back as the custody export's JSON objects, each
/// checked against its custody seal): rows committed before a kill -9 are signed after the
/// restart.
#[test]
fn mysql_rows_committed_before_a_kill_9_are_covered_after_the_restart() {
    let db = crate::support::mysql::MyDb::new("cpk");
    let c = case_into(1000, |_| mysql_sink(&db.name));
    let (code, out, err) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{out}{err}");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 3);
    wait_acked(&c.server, 3);
    runner.sigkill();
    let public = c.public.to_str().unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert_eq!(text.matches("in no checkpoint yet\n").count(), 3, "{text}");

    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    publish_range(&c.server, 4, 4);
    wait_acked(&c.server, 4);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("4 records intact, 0 altered, 0 missing, 0 in no checkpoint"),
        "{text}"
    );
}

/// Deletes the object holding `seq` from moto (boto3) and returns every checkpoint object's
/// text, in key order.
fn moto_op(m: &crate::support::moto::Moto, bucket: &str, delete_seq: u64) -> Vec<String> {
    let script = r#"
import sys, json, boto3
ep, kid, sec, bucket, seq = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id=kid, aws_secret_access_key=sec,
                  region_name="us-east-1")
cps = []
for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
    body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().decode()
    if o["Key"].startswith("_svc-custody/checkpoints/"):
        cps.append(body)
    elif not o["Key"].endswith(".metadata.json") and json.loads(body)["stream_sequence"] == int(seq):
        s3.delete_object(Bucket=bucket, Key=o["Key"])
print(json.dumps(cps))
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .args([&m.endpoint(), &m.key_id, &m.secret, bucket])
        .arg(delete_seq.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_deleted_object_is_named() {
    let m = crate::support::moto::Moto::start();
    m.create_bucket("custody-cp", false);
    let c = case_into(2, |_| {
        json!({
            "type": "object_store", "bucket": "custody-cp", "endpoint_url": m.endpoint(),
            "allow_http_for_local_testing": true, "credential_mode": "environment",
            "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
            "key_strategy": "stream_sequence", "metadata_mode": "sidecar",
        })
    });
    let mut runner = start_runner_env(&c.cfg, &c.dir.path().join("svc.log"), &m.env());
    publish_range(&c.server, 1, 5);
    wait_acked(&c.server, 5);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let public = c.public.to_str().unwrap();
    let (code, text) = verify_env(&c, &[public], &m.env());
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("5 records intact, 0 altered, 0 missing"),
        "{text}"
    );

    let cps = moto_op(&m, "custody-cp", 2);
    assert_eq!(cps.len(), 3, "2 + 2 + the last 1 at the stop");
    let files: Vec<PathBuf> = cps
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let p = c.dir.path().join(format!("cp{i}.json"));
            std::fs::write(&p, t).unwrap();
            p
        })
        .collect();
    assert_eq!(
        python_check(&files, &public_key_b64(&CP_SEED)),
        (1..=5).collect::<Vec<u64>>()
    );
    let (code, text) = verify_env(&c, &[public], &m.env());
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 2: MISSING"), "{text}");
    assert_eq!(text.matches("MISSING").count(), 1, "{text}");
    assert!(
        text.contains("4 records intact, 0 altered, 1 missing"),
        "{text}"
    );
}

#[test]
fn a_message_the_runner_refused_is_a_listed_gap_not_a_missing_record() {
    let c = case_with(
        100,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "file", "directory": dir.join("out")})
        },
        json!({"size_policy": {"enabled": true, "max_payload_bytes": 20}}),
    );
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    publish_range(&c.server, 3, 3);
    // Without a DLQ the refused message is NAKed until TERM; sequence 3 stored means the
    // refusal of 2 (same or earlier batch) was told to the checkpoint thread.
    wait_until(Duration::from_secs(60), "1 and 3 stored", || {
        matches!(
            c.server.try_consumer_state(STREAM, CONSUMER),
            Some((_, _, 0))
        ) && records(&c.dir.path().join("out")).len() == 2
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    // One checkpoint, or two when the gap's cut (within a second of it) came before 3 was
    // committed: the gap is listed once either way.
    let files = checkpoint_files(&c.dir.path().join("out"));
    assert!((1..=2).contains(&files.len()), "{files:?}");
    let gaps = gaps_in(&files);
    assert_eq!(gaps, vec![json!([2, "refused_before_sink"])]);
    assert_eq!(python_check(&files, &public_key_b64(&CP_SEED)), vec![1, 3]);
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 records intact, 0 altered, 0 missing, 0 in no checkpoint yet, 1 runner-caused gaps: COMPLETE"), "{text}");
}

/// A checkpoint store that refuses every put (a regular file planted at `.svc-checkpoints`)
/// with `every_records` pending is asked again once a second, not on every record that
/// arrives (before, 300 records meant about 300 refused puts and log lines); the records are
/// delivered meanwhile, and once the store works again they are signed and verify.
#[test]
fn a_refusing_checkpoint_store_is_asked_again_once_a_second_not_on_every_record() {
    let c = case(1);
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    wait_until(Duration::from_secs(60), "checkpoint 0 stored", || {
        checkpoint_files(&out).len() == 1
    });
    let kept = c.dir.path().join("checkpoints-kept");
    std::fs::rename(out.join(".svc-checkpoints"), &kept).unwrap();
    std::fs::write(out.join(".svc-checkpoints"), b"planted").unwrap();
    let js = c.server.js();
    for i in 2..=301 {
        js.publish(&format!("orders.n{i}"), format!("{{\"n\":{i}}}"))
            .unwrap();
    }
    wait_acked(&c.server, 301);
    let refused = runner
        .log_text()
        .matches("not written (kept for the next one)")
        .count();
    assert!(refused >= 1, "no cut was refused: {}", runner.log_text());
    assert!(
        refused < 100,
        "{refused} refused cuts for 300 records: the writer asks a refusing store again on \
         every record"
    );
    std::fs::remove_file(out.join(".svc-checkpoints")).unwrap();
    std::fs::rename(&kept, out.join(".svc-checkpoints")).unwrap();
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("301 records intact, 0 altered, 0 missing, 0 in no checkpoint yet"),
        "{text}"
    );
}

/// A message the sink refuses for good (a record over the file sink's `max_record_bytes`),
/// without a DLQ: NAKed, then terminated at `delivery.max_deliveries`, and listed as a
/// `terminated` gap, so the verifier reads it as the runner's choice, not as missing.
#[test]
fn a_message_the_sink_refused_until_terminated_is_a_listed_gap() {
    let c = refusing_case(100);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    publish_range(&c.server, 3, 3);
    wait_until(
        Duration::from_secs(60),
        "1 and 3 stored, 2 terminated",
        || {
            matches!(
                c.server.try_consumer_state(STREAM, CONSUMER),
                Some((3, 0, 0))
            ) && records(&c.dir.path().join("out")).len() == 2
        },
    );
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let files = checkpoint_files(&c.dir.path().join("out"));
    let gaps = gaps_in(&files);
    assert_eq!(gaps, vec![json!([2, "terminated"])], "{files:?}");
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("2 records intact, 0 altered, 0 missing, 0 in no checkpoint yet, 1 runner-caused gaps: COMPLETE"),
        "{text}"
    );
}

/// Sign first, terminate last: a message the sink refuses on its last delivery without a DLQ
/// is `+TERM`ed only once a stored checkpoint lists it as a gap (cut within a second of the
/// gap). Before, the `+TERM` went at once and the gap waited in memory for the next cut (with
/// these settings only at the stop): a kill -9 between the two left a terminated message no
/// checkpoint listed, which the audit then called missing. Now a kill -9 finds it either
/// listed or not terminated (the broker delivers it again and the restarted runner lists it).
#[test]
fn a_message_terminated_without_a_dlq_is_listed_after_a_kill_9() {
    let c = refusing_case(100);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-1.log"));
    publish_range(&c.server, 1, 1);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    publish_range(&c.server, 3, 3);
    wait_until(
        Duration::from_secs(60),
        "1 and 3 stored, 2 refused on its last delivery",
        || {
            records(&c.dir.path().join("out")).len() == 2
                && runner
                    .log_text()
                    .contains("stream sequence 2 failed permanently on delivery 2")
        },
    );
    // What svc-ack does with the verdict it just logged (a +TERM, before) has happened.
    std::thread::sleep(Duration::from_millis(300));
    runner.sigkill();

    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc-2.log"));
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("2 records intact, 0 altered, 0 missing, 0 in no checkpoint yet, 1 runner-caused gaps: COMPLETE"),
        "{text}"
    );
}

/// The heads the runner logged (`custody checkpoint head RUNNER:INDEX:DIGEST`), in order.
fn logged_heads(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.split("custody checkpoint head ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap().to_string())
        .collect()
}

fn verify_heads(c: &Case, heads: &[&str]) -> (i32, String) {
    let mut args = vec![
        "verify-custody",
        c.cfg.to_str().unwrap(),
        "--public-key",
        c.public.to_str().unwrap(),
    ];
    for h in heads {
        args.extend(["--head", h]);
    }
    let (code, out, err) = svc_env(&args, None);
    (code, out + &err)
}

/// A restarted runner that must refuse to start; returns its log.
fn refused_start(c: &Case, log_name: &str) -> String {
    let log = c.dir.path().join(log_name);
    let mut runner = start_runner(&c.cfg, &log);
    let status = runner
        .wait_timeout(Duration::from_secs(30))
        .expect("the runner refuses to start");
    assert!(!status.success(), "{}", runner.log_text());
    runner.log_text()
}

#[test]
fn a_cut_tail_a_removed_chain_and_an_emptied_sink_are_named_and_never_continued() {
    let c = case(3);
    let log = c.dir.path().join("svc.log");
    let mut runner = start_runner(&c.cfg, &log);
    publish_range(&c.server, 1, 7);
    wait_acked(&c.server, 7);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let heads = logged_heads(&runner.log_text());
    assert_eq!(heads.len(), 3, "{}", runner.log_text());
    assert!(heads[2].starts_with("runner-cp-1:2:"), "{heads:?}");
    // The runner's own copy, beside the configuration, 0600, equal to the last logged head.
    let head_file = c.dir.path().join("c.json.custody-head");
    let held: Value = serde_json::from_slice(&std::fs::read(&head_file).unwrap()).unwrap();
    assert_eq!(
        format!(
            "{}:{}:{}",
            held["runner_id"].as_str().unwrap(),
            held["index"],
            held["digest"].as_str().unwrap()
        ),
        heads[2]
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&head_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let (code, text) = verify_heads(&c, &[&heads[2]]);
    assert_eq!(code, 0, "{text}");

    // The tail cut off: the last checkpoint and the record it covers.
    let out = c.dir.path().join("out");
    let files = checkpoint_files(&out);
    let last_cp = std::fs::read(&files[2]).unwrap();
    let victim = record_path(&out, 7);
    let saved = std::fs::read(&victim).unwrap();
    std::fs::remove_file(&files[2]).unwrap();
    std::fs::remove_file(&victim).unwrap();
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(
        code, 0,
        "without a held head the cut cannot be seen: {text}"
    );
    let (code, text) = verify_heads(&c, &[&heads[2]]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("chain of runner runner-cp-1: TRUNCATED: the chain ends at checkpoint 1"),
        "{text}"
    );
    let text = refused_start(&c, "svc2.log");
    assert!(text.contains("TRUNCATED"), "{text}");
    assert_eq!(
        checkpoint_files(&out).len(),
        2,
        "nothing continued from the cut"
    );

    // A checkpoint at the head's index that is not the head: DIFFERS, refused.
    let (code, text) = verify_heads(&c, &[&format!("runner-cp-1:1:{}", "0".repeat(64))]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("DIFFERS"), "{text}");

    // The whole chain removed with its records (the sink emptied): MISSING, refused.
    let emptied = c.dir.path().join("emptied");
    std::fs::rename(&out, &emptied).unwrap();
    std::fs::create_dir(&out).unwrap();
    let (code, text) = verify_heads(&c, &[&heads[2]]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("runner-cp-1: MISSING"), "{text}");
    let text = refused_start(&c, "svc3.log");
    assert!(text.contains("TRUNCATED"), "{text}");
    assert!(!out.join(".svc-checkpoints").exists());

    // Put back whole: it continues.
    std::fs::remove_dir(&out).unwrap();
    std::fs::rename(&emptied, &out).unwrap();
    std::fs::write(&files[2], &last_cp).unwrap();
    std::fs::write(&victim, &saved).unwrap();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc4.log"));
    publish_range(&c.server, 8, 8);
    wait_acked(&c.server, 8);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let heads = logged_heads(&runner.log_text());
    assert_eq!(heads.len(), 1, "{}", runner.log_text());
    assert!(heads[0].starts_with("runner-cp-1:3:"), "{heads:?}");
    let (code, text) = verify_heads(&c, &[&heads[0]]);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn an_unreadable_or_unverifiable_chain_stops_the_runner_instead_of_restarting_at_0() {
    let c = case(2);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 4);
    wait_acked(&c.server, 4);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let out = c.dir.path().join("out");
    let files = checkpoint_files(&out);
    assert_eq!(files.len(), 2);

    // The last checkpoint made unverifiable.
    let saved = std::fs::read_to_string(&files[1]).unwrap();
    std::fs::write(
        &files[1],
        saved.replacen("\\\"count\\\":2", "\\\"count\\\":1", 1),
    )
    .unwrap();
    let text = refused_start(&c, "svc2.log");
    assert!(
        text.contains("does not verify under this runner's key"),
        "{text}"
    );
    std::fs::write(&files[1], &saved).unwrap();

    // The checkpoint directory unreadable (a file in its place).
    let cps = out.join(".svc-checkpoints");
    let aside = c.dir.path().join("cps-aside");
    std::fs::rename(&cps, &aside).unwrap();
    std::fs::write(&cps, b"not a directory").unwrap();
    let text = refused_start(&c, "svc3.log");
    assert!(text.contains("cannot read the chain back"), "{text}");
    std::fs::remove_file(&cps).unwrap();

    // A link in its place (to the real chain): not followed.
    std::os::unix::fs::symlink(&aside, &cps).unwrap();
    let text = refused_start(&c, "svc4.log");
    assert!(text.contains("a link or a file at that name"), "{text}");
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("a link or a file at that name"), "{text}");
    std::fs::remove_file(&cps).unwrap();
    std::fs::rename(&aside, &cps).unwrap();
    assert_eq!(
        checkpoint_files(&out),
        files,
        "no checkpoint 0 written over the chain"
    );
}

#[test]
fn the_rescan_never_signs_a_planted_or_altered_record() {
    let c = case(1000);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 4);
    wait_acked(&c.server, 4);
    runner.sigkill();
    let out = c.dir.path().join("out");
    // Planted before its first checkpoint: a copy of record 4 as sequence 9 with another
    // payload, and record 3 altered in place; both carry this runner's id.
    let four: Value =
        serde_json::from_slice(&std::fs::read(record_path(&out, 4)).unwrap()).unwrap();
    let mut planted = four.clone();
    planted["stream_sequence"] = json!(9);
    planted["payload"] = json!({"n": 999});
    std::fs::write(out.join("planted.json"), planted.to_string()).unwrap();
    let three_path = record_path(&out, 3);
    let mut three: Value = serde_json::from_slice(&std::fs::read(&three_path).unwrap()).unwrap();
    three["payload"] = json!({"n": 333});
    std::fs::write(&three_path, three.to_string()).unwrap();

    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    publish_range(&c.server, 5, 6);
    wait_acked(&c.server, 6);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let log = runner.log_text();
    assert!(
        log.contains("2 records of this runner refused by the rescan"),
        "{log}"
    );
    let files = checkpoint_files(&out);
    assert_eq!(files.len(), 1);
    assert_eq!(
        python_check(&files, &public_key_b64(&CP_SEED)),
        vec![1, 2, 4, 5, 6],
        "neither the planted 9 nor the altered 3 is signed"
    );
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("sequence 9 (planted.json, stream ORDERS incarnation "),
        "{text}"
    );
    assert!(text.contains("sequence 3 ("), "{text}");
    assert!(text.contains("in no checkpoint yet"), "{text}");
}

/// Issue 47 attack finding 4: a stream deleted and created again numbers its messages from 1
/// again. Records 1 to 3 of the new incarnation (found by the restart's rescan after a kill -9)
/// are signed for their own incarnation, never taken as covered by the old one's checkpoint;
/// the verifier matches each record to its stream incarnation, notes the change in the chain
/// and names a deleted old record by its incarnation.
#[test]
fn a_stream_created_again_has_its_sequences_signed_for_its_own_incarnation() {
    let c = case(1000);
    let old = c.server.incarnation(STREAM);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 3);
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());

    c.server.js().delete_stream(STREAM).unwrap();
    c.server.create_stream(STREAM, &["orders.>"]);
    c.server
        .create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let new = c.server.incarnation(STREAM);
    assert_ne!(old, new);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    publish_range(&c.server, 1, 3);
    wait_acked(&c.server, 3);
    runner.sigkill();
    // The thread rescans before it takes anything, and writes what is pending at the stop.
    let log3 = c.dir.path().join("svc3.log");
    let mut runner = start_runner(&c.cfg, &log3);
    wait_until(Duration::from_secs(30), "the restart's rescan", || {
        std::fs::read_to_string(&log3)
            .is_ok_and(|l| l.contains("3 committed records in no checkpoint yet"))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());

    let public = c.public.to_str().unwrap();
    let (code, text) = verify(&c, &[public]);
    let log = std::fs::read_to_string(c.dir.path().join("svc3.log")).unwrap_or_default();
    assert_eq!(code, 0, "{text}{log}");
    assert!(
        text.contains("6 records intact, 0 altered, 0 missing, 0 in no checkpoint"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "note: checkpoint 1 (.svc-checkpoints/{}-00000000000000000001.json) is of stream \
             {STREAM} incarnation {new}, the one before it of stream {STREAM} incarnation {old}",
            hex_lower(b"runner-cp-1")
        )),
        "{text}"
    );

    // The old incarnation's record 2 deleted: named with its incarnation, although the new
    // incarnation's record 2 is there.
    let victim = files_below(&c.dir.path().join("out"))
        .into_iter()
        .map(|p| c.dir.path().join("out").join(p))
        .find(|p| {
            p.extension().is_some_and(|e| e == "json")
                && !p.to_string_lossy().contains(".svc-checkpoints")
                && serde_json::from_slice::<Value>(&std::fs::read(p).unwrap()).is_ok_and(|v| {
                    v["stream_sequence"] == 2 && v["stream_incarnation"] == old.as_str()
                })
        })
        .unwrap();
    std::fs::remove_file(&victim).unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert_eq!(text.matches("MISSING").count(), 1, "{text}");
    assert!(
        text.contains(&format!(
            "sequence 2: MISSING (signed in checkpoint 0 of runner runner-cp-1 for stream \
             {STREAM} incarnation {old}, no record)"
        )),
        "{text}"
    );
}

fn hex_lower(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `svc validate` refuses `custody.checkpoints` with a sink that has no checkpoint store, and
/// with `sink.type: spool` whose target has none (http), naming the field and the reason (not
/// only the runner at its start); a file sink passes, with a fallback `spool` block too, and
/// a spool sink into a file target.
#[test]
fn validate_refuses_checkpoints_where_no_store_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let key = write_private(dir.path(), "cp.key", &CP_SEED);
    let out = dir.path().join("out");
    let file = json!({"type": "file", "directory": out});
    let http = json!({"type": "http", "url": "https://receiver.example/hook"});
    let fanout = json!({"type": "fanout", "sinks": {"a": file.clone(), "b": http.clone()}});
    let spool = json!({"dir": dir.path().join("spool"), "max_bytes": 64 << 20,
                       "allow_unencrypted": true});
    let spool_sink = json!({"type": "spool", "dir": dir.path().join("spool2"),
                            "max_bytes": 64 << 20, "allow_unencrypted": true,
                            "target": file.clone()});
    let spool_http = json!({"type": "spool", "dir": dir.path().join("spool3"),
                            "max_bytes": 64 << 20, "allow_unencrypted": true,
                            "target": http.clone()});
    let cases = [
        (
            "http",
            http,
            None,
            "not available for sink type http: it has no checkpoint store",
        ),
        (
            "fanout",
            fanout,
            None,
            "not available for sink type fanout: it has no checkpoint store",
        ),
        // A fallback spool beside a sink with a store: the drain tells the checkpoints.
        ("spool", file.clone(), Some(spool), ""),
        // The spool as the sink: its checkpoints go to the target's store on the drain.
        ("spool sink", spool_sink, None, ""),
        (
            "spool sink into http",
            spool_http,
            None,
            "sink type spool keeps its checkpoints in the spool until svc spool drain puts \
             them into its target's checkpoint store, and its target type http has none",
        ),
        ("file", file, None, ""),
        ("mysql", mysql_sink("svc_validate_only"), None, ""),
    ];
    for (name, sink, spool, why) in cases {
        let mut cfg = json!({
            "nats": {"url": "nats://127.0.0.1:4222", "stream": STREAM, "consumer": CONSUMER,
                     "subject": "orders.>"},
            "sink": sink,
            "custody": {"enabled": true, "runner_id": "runner-cp-1",
                        "hmac_key_env": "PP_CUSTODY_KEY",
                        "checkpoints": {"enabled": true, "signing_key_file": key,
                                        "key_id": "cp1"}}});
        if let Some(s) = spool {
            cfg["spool"] = s;
        }
        let path = write_config(dir.path(), &format!("{name}.json"), &cfg);
        let (code, stdout, err) = svc_env(&["validate", path.to_str().unwrap()], None);
        if why.is_empty() {
            assert_eq!(code, 0, "{name}: {stdout}{err}");
            continue;
        }
        assert_eq!(code, 2, "{name}: {stdout}{err}");
        assert!(
            err.contains(&format!("custody.checkpoints.enabled: {why}")),
            "{name}: {err}"
        );
    }
}

/// A file sink with a fallback spool that spools at the first transient failure (so the
/// spool keeps the stream's order), and its output and spool directories.
fn spooled_case(every_records: u64) -> (Case, PathBuf, PathBuf) {
    let c = spooled_case_into(every_records, |dir| {
        std::fs::create_dir(dir.join("out")).unwrap();
        json!({"type": "file", "directory": dir.join("out")})
    });
    let (out, spool) = (c.dir.path().join("out"), c.dir.path().join("spool"));
    (c, out, spool)
}

/// [`case_into`] with a fallback spool (at `<dir>/spool`) spooling at the first transient
/// failure.
fn spooled_case_into(every_records: u64, sink: impl FnOnce(&Path) -> Value) -> Case {
    let c = case_with(
        every_records,
        sink,
        json!({"spool": {"max_bytes": 64 << 20, "after_seconds": 0, "allow_unencrypted": true,
                         "max_backoff_seconds": 1, "dir": "SPOOL"}}),
    );
    // The directory is known once the case made it.
    let spool = c.dir.path().join("spool");
    let text = std::fs::read_to_string(&c.cfg).unwrap();
    std::fs::write(&c.cfg, text.replace("\"SPOOL\"", &json!(spool).to_string())).unwrap();
    c
}

/// Record files (not checkpoints) in the file sink's output.
pub(crate) fn records_in(out: &Path) -> usize {
    files_below(out)
        .iter()
        .filter(|p| {
            !p.starts_with(".svc-checkpoints") && p.extension().is_some_and(|e| e == "json")
        })
        .count()
}

/// The output directory taken away (the file sink fails transiently), `from..=to` published
/// and acknowledged (spooled), then given back.
fn spool_an_outage(
    c: &Case,
    out: &Path,
    runner: &crate::support::process::Runner,
    (from, to): (u64, u64),
) {
    let away = c.dir.path().join("out.away");
    std::fs::rename(out, &away).unwrap();
    publish_range(&c.server, from, to);
    wait_acked(&c.server, to);
    assert!(
        runner.log_text().contains("committed to the spool"),
        "{}",
        runner.log_text()
    );
    std::fs::rename(&away, out).unwrap();
}

/// A spooled batch is ACKed before it is in the sink: the sink workers do not tell the
/// checkpoint thread of it; the drain does once the sink holds it, so after the outage and the
/// drain every sequence is covered (no restart rescan in between), and a record deleted after
/// the drain is named missing.
#[test]
fn spooled_records_are_signed_after_the_drain_and_a_deleted_one_is_named() {
    let (c, out, _spool) = spooled_case(4);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 4);
    wait_acked(&c.server, 4);
    spool_an_outage(&c, &out, &runner, (5, 16));
    wait_until(Duration::from_secs(60), "the spool drained", || {
        records_in(&out) == 16
    });
    // Checkpoints are cut every 4 records: the drained ones are signed while the runner runs.
    wait_until(
        Duration::from_secs(30),
        "the drained records signed",
        || verify(&c, &[c.public.to_str().unwrap()]).0 == 0,
    );
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let public = c.public.to_str().unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("16 records intact, 0 altered, 0 missing, 0 in no checkpoint"),
        "{text}"
    );
    let files = checkpoint_files(&out);
    assert_eq!(
        python_check(&files, &public_key_b64(&CP_SEED)),
        (1..=16).collect::<Vec<u64>>()
    );
    std::fs::remove_file(record_path(&out, 9)).unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 9: MISSING"), "{text}");
    assert!(
        text.contains("15 records intact, 0 altered, 1 missing"),
        "{text}"
    );
}

/// kill -9 after a drain step and before its checkpoint: the drained records are in the sink,
/// in no checkpoint yet (never missing); the next runner's rescan signs them.
#[test]
fn records_drained_before_a_kill_9_are_covered_after_the_restart() {
    let (c, out, _spool) = spooled_case(1000);
    let runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 2);
    wait_acked(&c.server, 2);
    spool_an_outage(&c, &out, &runner, (3, 8));
    wait_until(Duration::from_secs(60), "the spool drained", || {
        records_in(&out) == 8
    });
    killed_then_covered_after_restart(&c, runner, 8, 9..=9);
}

/// `svc spool drain` (no runner) signs nothing: what it delivers is in no checkpoint yet,
/// visible, until the next runner's restart rescan signs it.
#[test]
fn records_svc_spool_drain_delivers_are_signed_by_the_next_runner() {
    let (c, out, _spool) = spooled_case(1000);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 2);
    wait_acked(&c.server, 2);
    let away = c.dir.path().join("out.away");
    std::fs::rename(&out, &away).unwrap();
    publish_range(&c.server, 3, 7);
    wait_acked(&c.server, 7);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    std::fs::rename(&away, &out).unwrap();
    assert_eq!(records_in(&out), 2);
    let (code, stdout, err) = svc_env(&["spool", "drain", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{stdout}{err}");
    assert_eq!(records_in(&out), 7);
    let public = c.public.to_str().unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    // 1 and 2 too: the first runner's last checkpoint found the output directory away.
    assert_eq!(text.matches("in no checkpoint yet\n").count(), 7, "{text}");
    assert!(!text.contains("MISSING"), "{text}");

    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(30), "the rescan", || {
        runner
            .log_text()
            .contains("7 committed records in no checkpoint yet")
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("7 records intact, 0 altered, 0 missing, 0 in no checkpoint"),
        "{text}"
    );
}

/// The same through PostgreSQL behind a proxy taken down and brought back: the drain hands
/// the sink decoded envelopes, and the digest the drain tells (from the record as the spool
/// stored it) is the one `svc verify-custody` recomputes from the row.
#[test]
fn spooled_postgresql_rows_are_signed_after_the_drain_and_a_deleted_one_is_named() {
    let db = TestDb::new("cpspool");
    let proxy = crate::support::moto::OutageProxy::start(5432);
    let c = spooled_case_into(4, |_| {
        let mut v = db.sink(json!({}));
        v["dsn"] = format!("postgresql://postgres@127.0.0.1:{}/{}", proxy.port, db.name).into();
        v
    });
    let (code, out, err) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{out}{err}");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 4);
    wait_acked(&c.server, 4);
    proxy.take_down();
    publish_range(&c.server, 5, 12);
    wait_acked(&c.server, 12);
    assert!(runner.log_text().contains("committed to the spool"));
    proxy.bring_up();
    wait_until(Duration::from_secs(60), "the spool drained", || {
        db.count("events") == 12
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let public = c.public.to_str().unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("12 records intact, 0 altered, 0 missing, 0 in no checkpoint"),
        "{text}"
    );
    db.conn()
        .simple("DELETE FROM events WHERE stream_sequence = 7")
        .unwrap();
    let (code, text) = verify(&c, &[public]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("sequence 7: MISSING"), "{text}");
    assert_eq!(text.matches("MISSING").count(), 1, "{text}");
}

/// A record planted in the spool (someone who can write the spool directory, a spool in clear:
/// a spooled record copied under another sequence) is delivered by the drain but never
/// signed: its custody seal does not verify under the runner's custody key. It stays `in no
/// checkpoint yet`, visible.
#[test]
fn a_record_planted_in_the_spool_is_delivered_but_never_signed() {
    let (c, out, spool) = spooled_case(1000);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let away = c.dir.path().join("out.away");
    std::fs::rename(&out, &away).unwrap();
    publish_range(&c.server, 2, 4);
    wait_acked(&c.server, 4);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let segment = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".spool"))
        .unwrap();
    let mut data = std::fs::read(&segment).unwrap();
    // The first record's body (after the 8-byte header and the 12-byte frame head), in clear:
    // a flag byte and the append time, then the record.
    let len = u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize;
    let record = String::from_utf8(data[29..20 + len].to_vec()).unwrap();
    let planted = record.replacen("\"stream_sequence\":2,", "\"stream_sequence\":41,", 1);
    assert_ne!(planted, record);
    let body = [&data[20..29], planted.as_bytes()].concat();
    data.extend_from_slice(&crate::spool::frame_of(&body));
    std::fs::write(&segment, &data).unwrap();
    std::fs::rename(&away, &out).unwrap();

    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(60), "the spool drained", || {
        records_in(&out) == 5
    });
    wait_until(Duration::from_secs(10), "the refusal logged", || {
        runner.log_text().contains("custody seal refused")
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let log = runner.log_text();
    assert!(log.contains("drained record at spool segment"), "{log}");
    assert_eq!(log.matches("never signed").count(), 1, "{log}");
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("4 records intact, 0 altered, 0 missing, 1 in no checkpoint yet"),
        "{text}"
    );
    assert!(text.contains("sequence 41 ("), "{text}");
}

/// A backlog built while the checkpoint store failed (9 records committed, the store's
/// directory replaced by a file) is cut, once the store is back, into checkpoints of at most
/// `every_records` (2) entries, not one holding them all: unbounded, a long outage (or a
/// flood of refusals, atk57 finding 1: 493,051 gaps, 25 MB) made a checkpoint no reader takes
/// (16 MiB), and no start could read the chain back. Before the fix: one checkpoint of 9.
#[test]
fn a_backlog_built_while_the_store_fails_is_cut_in_checkpoints_of_every_records() {
    let c = case_with(
        2,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "file", "directory": dir.join("out")})
        },
        json!({}),
    );
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 2);
    wait_acked(&c.server, 2);
    wait_until(Duration::from_secs(30), "checkpoint 0", || {
        checkpoint_files(&out).len() == 1
    });
    let store = out.join(".svc-checkpoints");
    let aside = c.dir.path().join("checkpoints-aside");
    std::fs::rename(&store, &aside).unwrap();
    std::fs::write(&store, b"in the way").unwrap();
    publish_range(&c.server, 3, 11);
    wait_acked(&c.server, 11);
    wait_until(Duration::from_secs(30), "a failed cut", || {
        runner.log_text().contains("not written")
    });
    std::fs::remove_file(&store).unwrap();
    std::fs::rename(&aside, &store).unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while checkpoint_files(&out).len() < 6 && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let sizes: Vec<u64> = checkpoint_files(&out)
        .iter()
        .map(|f| {
            let cp: Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            let body: Value = serde_json::from_str(cp["signed"].as_str().unwrap()).unwrap();
            body["count"].as_u64().unwrap() + body["gaps"].as_array().unwrap().len() as u64
        })
        .collect();
    assert!(
        sizes.iter().all(|n| *n <= 2) && sizes.iter().sum::<u64>() == 11,
        "entries per checkpoint {sizes:?} (every_records 2, 11 records)\n{}",
        runner.log_text()
    );
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
}
