//! atk52a: attacks on the fixes of atk51b (df7cab8..f49f433): `CheckpointStore::chain` /
//! `get`, the relational stores' keyset paging, the drain's "a checkpoint is put only where it
//! continues the target's chain" (`sink::spool::put::follows`), `svc spool set-aside` of a
//! checkpoint frame and the fallback runner's `refuse_handed_frames`, end to end with a real
//! broker, runner, file target, PostgreSQL and MariaDB.
//!
//! `fixed_...`: a finding's reproduction; each failed on the code it was found on (cb884be) and
//! passes since the fix its comment names. `held_...`: an attack that held (these pass).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::atk50b::wait_until_either;
use crate::atk50b::{edge, only_segment, out, sealed_checkpoint_frames, spool_cmd};
use crate::atk51b::run_edge;
use crate::custody_checkpoints::{case_with, records_in, Case};
use crate::support::protection::*;

/// An edge spool (every 3 records a checkpoint) run over `1..=n`, then one byte flipped in the
/// middle of checkpoint 1's sealed frame.
fn edge_with_checkpoint_1_damaged(n: u64) -> Case {
    let c = edge(3);
    run_edge(&c, "svc.log", (1, n));
    let seg = only_segment(&c);
    let mut data = std::fs::read(&seg).unwrap();
    let cps = sealed_checkpoint_frames(&data);
    assert_eq!(cps.len() as u64, n / 3, "one frame per 3 records");
    data[(cps[1].0 + cps[1].1) / 2] ^= 0x01;
    std::fs::write(&seg, &data).unwrap();
    c
}

/// The (segment, offset) of the checkpoint frame a stuck drain names (`... at segment S
/// offset O does not follow ...`).
fn stuck_at(drained: &str) -> Option<(String, String)> {
    let at = drained.find("does not follow")?;
    let before = &drained[..at];
    let seg = before.rfind("at segment ")?;
    let mut words = before[seg + "at segment ".len()..].split_whitespace();
    let segment = words.next()?.to_string();
    let _ = words.next(); // "offset"
    let offset = words
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .to_string();
    Some((segment, offset))
}

fn set_aside(c: &Case, (segment, offset): (&str, &str)) -> (i32, String) {
    let (code, o, e) = svc_env(
        &[
            "spool",
            "set-aside",
            c.cfg.to_str().unwrap(),
            "--segment",
            segment,
            "--offset",
            offset,
        ],
        None,
    );
    (code, o + &e)
}

/// FIXED (found by atk52a on cb884be; fixed in 014965e and the set-aside of the chain tail; class 3 / class 11, medium-high): one flipped byte in ONE checkpoint frame of an
/// edge spool holds every record after the next checkpoint frame undelivered. The drain stops
/// at checkpoint 2 (it does not follow the target's chain: the hole), as documented; the
/// documented way on is "set the frame aside". But then checkpoint 3 does not follow either
/// (checkpoint 2 is now missing from the target), nor 4, ...: the operator must set aside
/// every later checkpoint frame of the spool, one command each, and every record behind each
/// is held until then. 30 records, 10 frames, frame 1 damaged: the first drain delivers 9-10 of
/// 30, after the documented set-aside 12 of 30, and it takes 8 set-asides (one per later
/// frame) to deliver the 30 (measured on cb884be). A week's outage at
/// `every_seconds: 60` is about 10,000 frames. Before 5f0b3d4 the drain delivered all 30.
/// Expected: after the one documented decision (set aside the frame the drain stops at), the
/// drain delivers every record (e.g. a frame whose predecessor was set aside may be set
/// aside with it, or the records go on while the checkpoints wait).
#[test]
fn fixed_one_flipped_byte_in_a_checkpoint_frame_holds_every_later_record() {
    let c = edge_with_checkpoint_1_damaged(30);
    let (code, drained) = spool_cmd(&c, "drain");
    assert_eq!(code, 1, "{drained}");
    let first = records_in(&out(&c));
    let at = stuck_at(&drained).unwrap_or_else(|| panic!("{drained}"));
    let (code, text) = set_aside(&c, (&at.0, &at.1));
    assert_eq!(code, 0, "{text}");
    let (code, again) = spool_cmd(&c, "drain");
    let after_one = records_in(&out(&c));
    // How many set-asides it takes, for the figure.
    let mut asides = 1;
    let mut last = again.clone();
    while asides < 40 {
        let Some(at) = stuck_at(&last) else { break };
        let (code, text) = set_aside(&c, (&at.0, &at.1));
        assert_eq!(code, 0, "{text}");
        asides += 1;
        last = spool_cmd(&c, "drain").1;
    }
    let all = records_in(&out(&c));
    assert!(
        code == 0 && after_one == 30,
        "one flipped byte in checkpoint frame 1: the first drain delivered {first} of 30 \
         records; after setting aside the frame it stopped at, the drain exited {code} with \
         {after_one} of 30 delivered ({again}); it took {asides} set-asides in all to deliver \
         {all} of 30"
    );
}

/// A direct MariaDB sink (`engine: mysql`) with custody checkpoints, a checkpoint every 3.
fn mariadb_case(db: &crate::support::mysql::MyDb) -> Case {
    let c = case_with(
        3,
        |_| crate::custody_checkpoints::mysql_sink(&db.name),
        serde_json::json!({}),
    );
    let (code, o, e) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{o}{e}");
    c
}

/// Rows of OTHER runners (`site-1` ..) in the shared checkpoint table: `n` tiny checkpoints,
/// index 0 each (what other sites' runners, or another account of the database, keep there).
const OTHER_ROWS: u64 = 100_001;

/// Starts the runner on `c`, returns whether it bound its consumer, the seconds it took and
/// its log; stops it.
fn start_and_stop(c: &Case, log: &str) -> (bool, f64, String) {
    let t = Instant::now();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join(log));
    let started = wait_until_either(&mut runner);
    let secs = t.elapsed().as_secs_f64();
    if started {
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(60));
    }
    (started, secs, runner.log_text())
}

/// FIXED (found by atk52a on cb884be; fixed in 014965e and the set-aside of the chain tail; class 8 / class 12, high): atk51b finding 4 fixed PostgreSQL's start to read its
/// own runner's chain (`PgStore::chain`, `WHERE runner_id = $1`), but MySQL/MariaDB's store
/// keeps the default `CheckpointStore::chain`, which reads EVERY runner's checkpoints
/// (`MyStore::checkpoints`), bounded by `MAX_AUDIT_CHECKPOINTS` (100,000 rows) and 1 GiB of
/// text. A shared MariaDB checkpoint table with 100,001 rows of other runners (10 sites at the
/// default `every_seconds: 60` for a week, or 11,500 default-size 94 KB checkpoints for the 1
/// GiB bound) stops every runner's start for good (6.7 s, then `custody checkpoints: cannot
/// read the chain back: ... more than 100000 rows: past the read-back bound`; measured on
/// cb884be). The same rows in
/// PostgreSQL do not (`held_a_postgresql_start_reads_its_own_chain_past_100000_other_rows`).
/// Expected: the runner starts (reads its own chain, as PostgreSQL's store does).
#[test]
fn fixed_a_mariadb_start_is_stopped_by_other_runners_checkpoints() {
    let db = crate::support::mysql::MyDb::new("atk52a");
    let c = mariadb_case(&db);
    other_mariadb_rows(&db);
    let (started, secs, log) = start_and_stop(&c, "svc.log");
    assert!(
        started,
        "a MariaDB runner with {OTHER_ROWS} checkpoints of other runners in the shared table \
         did not start ({secs:.1} s): {log}"
    );
}

/// Plants [`OTHER_ROWS`] tiny checkpoints of other runners into MariaDB's shared table.
fn other_mariadb_rows(db: &crate::support::mysql::MyDb) {
    db.rows(&format!(
        "INSERT INTO svc_custody_checkpoints (runner_id, checkpoint_index, checkpoint) \
         SELECT CONCAT('site-', seq), 0, CONCAT('{{\"signed\":\"{{\\\\\"runner_id\\\\\":\
         \\\\\"site-', seq, '\\\\\",\\\\\"index\\\\\":0}}\"}}') FROM seq_1_to_{OTHER_ROWS}"
    ));
}

/// FIXED (found by atk52a on cb884be; fixed in 014965e and the set-aside of the chain tail; the same finding, the drain's half): an edge spool drained into a MariaDB target
/// whose shared checkpoint table holds 100,001 rows of other sites: the drain's check that
/// checkpoint 0 begins this runner's chain (`put::follows` -> `MyStore::chain`, every
/// runner's rows) fails the read-back bound, and the drain is stuck at checkpoint 0 for good
/// (exit 1, "the target's checkpoints cannot be read ... the drain retries this step").
/// Expected: exit 0, every record and checkpoint in the target.
#[test]
fn fixed_a_drain_into_mariadb_is_stuck_at_checkpoint_0_by_other_runners_rows() {
    let db = crate::support::mysql::MyDb::new("atk52a");
    let c = case_with(
        3,
        |dir| {
            let key = write_private(dir, "spool.key", &[9u8; 32]);
            serde_json::json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
                   "encryption": {"key_id": "k1", "key_file": key},
                   "target": crate::custody_checkpoints::mysql_sink(&db.name)})
        },
        serde_json::json!({}),
    );
    let (code, o, e) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{o}{e}");
    run_edge(&c, "svc.log", (1, 6));
    other_mariadb_rows(&db);
    let t = Instant::now();
    let (code, drained) = spool_cmd(&c, "drain");
    assert_eq!(
        code,
        0,
        "the drain ({:.1} s) into MariaDB with {OTHER_ROWS} checkpoints of other runners: \
         {drained}",
        t.elapsed().as_secs_f64()
    );
}

/// Plants [`OTHER_ROWS`] tiny checkpoints of other runners into PostgreSQL's shared table.
fn other_postgresql_rows(db: &crate::support::postgres::TestDb) {
    db.rows(&format!(
        "INSERT INTO svc_custody_checkpoints (runner_id, checkpoint_index, checkpoint) \
         SELECT 'site-' || g, 0, '{{\"signed\":\"{{\\\"runner_id\\\":\\\"site-' || g || \
         '\\\",\\\"index\\\":0}}\"}}' FROM generate_series(1, {OTHER_ROWS}) g"
    ));
}

/// HELD (the PostgreSQL half of the finding above): the same 100,001 rows of other runners
/// in PostgreSQL's table; the start reads its own runner's chain and goes on.
#[test]
fn held_a_postgresql_start_reads_its_own_chain_past_100000_other_rows() {
    let db = crate::support::postgres::TestDb::new("atk52a");
    let c = case_with(3, |_| db.sink(serde_json::json!({})), serde_json::json!({}));
    let (code, o, e) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{o}{e}");
    other_postgresql_rows(&db);
    let (started, secs, log) = start_and_stop(&c, "svc.log");
    assert!(started, "{secs:.1} s: {log}");
}

/// Plants `n` checkpoints of OTHER runners (`site-1` ..., index 0, about `bytes` each, the
/// size of a default 1,000-record checkpoint) into the file target's `.svc-checkpoints`, as
/// other edge sites draining into the same central target leave them.
fn other_sites_files(target: &std::path::Path, n: u64, bytes: usize) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = target.join(".svc-checkpoints");
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    let pad = "x".repeat(bytes);
    for i in 1..=n {
        let runner = format!("site-{i}");
        let hex: String = runner.bytes().map(|b| format!("{b:02x}")).collect();
        let signed = serde_json::json!({"runner_id": runner, "index": 0}).to_string();
        let text = serde_json::json!({"signed": signed, "pad": pad}).to_string();
        std::fs::write(dir.join(format!("{hex}-{:020}.json", 0)), text).unwrap();
    }
    dir
}

/// FIXED (found by atk52a on cb884be; fixed in 014965e and the set-aside of the chain tail; class 8, high): the drain's new check that a checkpoint follows the target's chain
/// (`put::follows`, 5f0b3d4) reads by name with `CheckpointStore::get`, which the file and
/// object stores do not implement: the default reads the WHOLE store (`chain` ->
/// `checkpoints()`: every checkpoint file of every runner, each text whole, up to 1 GiB held)
/// to find one. The drain calls it twice per checkpoint frame (N, then N-1), so a drain of K
/// frames into a file target holding S checkpoints reads about 2 x K x S files: quadratic in
/// a long outage (a week at `every_seconds: 60` is 10,000 frames into a store that grows by
/// each), and an object store pays a GET per stored checkpoint per call. Here a central
/// file target holds 1,000 checkpoints of other sites (94 KB each, the default 1,000-record
/// size: 94 MB), and an edge spool of 20 records with a checkpoint after each is drained:
/// 35-59 s on this host (2,000 files and 40 frames: 206 s, about 4 x, as 2 x K x S
/// says; measured on cb884be). The same drain into an empty target takes about a second.
/// Expected: the drain reads the stored checkpoints by name (two files per frame, as
/// PostgreSQL's and MariaDB's `get` read one row), well under 10 s here.
#[test]
fn fixed_a_drain_reads_the_whole_file_store_twice_per_checkpoint_frame() {
    let c = edge(1);
    run_edge(&c, "svc.log", (1, 20));
    other_sites_files(&out(&c), 1_000, 94_000);
    let t = Instant::now();
    let (code, drained) = spool_cmd(&c, "drain");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(code, 0, "{drained}");
    assert_eq!(records_in(&out(&c)), 20);
    assert!(
        secs < 10.0,
        "the drain of 20 checkpoint frames into a file target holding 1,000 checkpoints of \
         other runners (94 MB) took {secs:.1} s: {drained}"
    );
}

/// HELD (the PostgreSQL half of the drain's finding): an edge spool drained into a
/// PostgreSQL target whose shared table holds 100,001 rows of other sites: `PgStore::chain`
/// and `get` read this runner's rows only; exit 0, both checkpoints put.
#[test]
fn held_a_drain_into_postgresql_past_100000_other_rows_puts_every_checkpoint() {
    let db = crate::support::postgres::TestDb::new("atk52a");
    let c = case_with(
        3,
        |dir| {
            let key = write_private(dir, "spool.key", &[9u8; 32]);
            serde_json::json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
                   "encryption": {"key_id": "k1", "key_file": key},
                   "target": db.sink(serde_json::json!({}))})
        },
        serde_json::json!({}),
    );
    let (code, o, e) = svc_env(&["init-db", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{o}{e}");
    run_edge(&c, "svc.log", (1, 6));
    other_postgresql_rows(&db);
    let (code, drained) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{drained}");
    assert!(drained.contains("2 custody checkpoints put"), "{drained}");
    let own =
        db.int("SELECT count(*) FROM svc_custody_checkpoints WHERE runner_id = 'runner-cp-1'");
    assert_eq!(own, 2);
}

/// The edge's configuration turned into one with a fallback `spool` block (the edge's spool)
/// in front of the same file target, the custody block kept, written to a new file.
fn handed_to_a_fallback_runner(c: &Case) -> PathBuf {
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&c.cfg).unwrap()).unwrap();
    let sink = cfg["sink"].clone();
    cfg["sink"] = sink["target"].clone();
    cfg["spool"] = serde_json::json!({"dir": sink["dir"], "max_bytes": sink["max_bytes"],
                                      "encryption": sink["encryption"]});
    let fallback = c.dir.path().join("fallback.json");
    std::fs::write(&fallback, cfg.to_string()).unwrap();
    fallback
}

/// Flips one byte in the middle of the frame `[start, end)` of the edge's only segment.
fn flip(c: &Case, (start, end): (usize, usize)) {
    let seg = only_segment(c);
    let mut data = std::fs::read(&seg).unwrap();
    data[(start + end) / 2] ^= 0x01;
    std::fs::write(&seg, &data).unwrap();
}

/// Starts a fallback runner on `cfg` and returns whether it started, and its log.
fn fallback_start(c: &Case, cfg: &std::path::Path, log: &str) -> (bool, String) {
    let mut runner = start_runner(cfg, &c.dir.path().join(log));
    let started = wait_until_either(&mut runner);
    if started {
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(30));
    }
    (started, runner.log_text())
}

/// HELD (class 3 against `refuse_handed_frames`): an edge spool handed to a fallback runner
/// whose FIRST checkpoint frame (and so the first frame the scan would stop at) has one byte
/// flipped: the scan reads on by the frame marks, finds checkpoint 1 intact, and the runner
/// refuses to start, naming `svc spool drain`; nothing is put into the target.
#[test]
fn held_a_damaged_first_checkpoint_frame_does_not_hide_the_next_from_the_start() {
    let c = edge(3);
    run_edge(&c, "svc.log", (1, 6));
    let data = std::fs::read(only_segment(&c)).unwrap();
    let cps = sealed_checkpoint_frames(&data);
    assert_eq!(cps.len(), 2);
    flip(&c, cps[0]);
    let fallback = handed_to_a_fallback_runner(&c);
    let (started, log) = fallback_start(&c, &fallback, "svc2.log");
    assert!(!started, "{log}");
    assert!(
        log.contains("holds custody checkpoint frames") && log.contains("svc spool drain"),
        "{log}"
    );
    assert!(!out(&c).join(".svc-checkpoints").exists(), "{log}");
}

/// HELD (class 3): the edge's first RECORD frame damaged (a frame before every checkpoint
/// frame): still refused, the checkpoint frames behind it found.
#[test]
fn held_a_damaged_record_before_the_checkpoint_frames_does_not_hide_them() {
    let c = edge(3);
    run_edge(&c, "svc.log", (1, 6));
    let data = std::fs::read(only_segment(&c)).unwrap();
    // The first frame of the segment (after its 8-byte header) is record 1.
    let len = u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize;
    flip(&c, (8, 8 + 12 + len));
    let fallback = handed_to_a_fallback_runner(&c);
    let (started, log) = fallback_start(&c, &fallback, "svc2.log");
    assert!(!started, "{log}");
    assert!(log.contains("holds custody checkpoint frames"), "{log}");
}

/// FIXED (found by atk52a on cb884be; fixed in 014965e and the set-aside of the chain tail; class 8, the same root as the file store's `get` above, high): once a file target
/// holds more than 1 GiB of checkpoint text of ALL runners together (`MAX_AUDIT_CHECKPOINT_BYTES`;
/// about 11,500 default-size checkpoints of 94 KB: one busy site for 8 days at
/// `every_seconds: 60`, or a few sites sharing a central target for 2 days), every read by
/// name the drain makes fails the bound, and the drain is stuck at its first checkpoint frame
/// for good ("the target's checkpoints cannot be read (... more than 1073741824 bytes of
/// checkpoints ...); the drain retries this step"), holding 1 GiB in memory on each try. Here
/// 70 checkpoint files of other runners of 15.5 MiB each (under the 16 MiB a checkpoint may
/// be; sparse files, so the test writes no GiB) and an edge spool of 6 records, 2 frames.
/// Measured on cb884be: stuck at checkpoint 0 after 9.3 s, exit 1, peak RSS 1,081,836 KiB
/// (`/usr/bin/time -f %M`). Before 5f0b3d4 the drain read nothing of the store unless a put
/// was refused. Expected: exit 0, both checkpoints put (read by name, as PostgreSQL's `get`).
#[test]
fn fixed_a_drain_into_a_file_target_past_1_gib_of_checkpoints_is_stuck() {
    let c = edge(3);
    run_edge(&c, "svc.log", (1, 6));
    let dir = other_sites_files(&out(&c), 70, 10);
    for e in std::fs::read_dir(&dir).unwrap() {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(e.unwrap().path())
            .unwrap();
        f.set_len(31 << 19).unwrap(); // 15.5 MiB, sparse
    }
    let t = Instant::now();
    let out_ = std::process::Command::new("/usr/bin/time")
        .args(["-f", "peak RSS %M KiB", env!("CARGO_BIN_EXE_svc")])
        .args(["spool", "drain", c.cfg.to_str().unwrap()])
        .envs(secrets_env())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out_.stdout).into_owned() + &String::from_utf8_lossy(&out_.stderr);
    assert!(
        out_.status.success() && records_in(&out(&c)) == 6,
        "the drain ({:.1} s) into a file target holding 70 checkpoints of other runners \
         (1.06 GiB): {text}",
        t.elapsed().as_secs_f64()
    );
}

/// Puts `n` small checkpoints of other runners (`site-1` ..., index 0) under the bucket's
/// `_svc-custody/checkpoints/`, as other sites draining into the same bucket leave them.
fn other_sites_objects(m: &crate::support::moto::Moto, bucket: &str, n: u64) {
    let script = r#"
import sys, json, boto3
ep, kid, sec, bucket, n = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=ep, aws_access_key_id=kid, aws_secret_access_key=sec,
                  region_name="us-east-1")
for i in range(1, int(n) + 1):
    runner = "site-%d" % i
    body = json.dumps({"signed": json.dumps({"runner_id": runner, "index": 0})})
    key = "_svc-custody/checkpoints/%s-%020d.json" % (runner.encode().hex(), 0)
    s3.put_object(Bucket=bucket, Key=key, Body=body.encode())
"#;
    let out = std::process::Command::new(crate::support::python::python())
        .arg("-c")
        .arg(script)
        .args([&m.endpoint(), &m.key_id, &m.secret, bucket])
        .arg(n.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// FIXED (found by atk52a on cb884be; fixed in 014965e and the set-aside of the chain tail; class 8, the object store's half of the file store's `get`): `ObjectStore` keeps
/// the default `CheckpointStore::get` too: each read by name LISTS the bucket's checkpoints
/// and GETs every one of them (every runner's), and the drain makes two per checkpoint frame.
/// An edge spool of 10 records (a checkpoint after each) drained into an object-store target
/// whose bucket holds 200 checkpoints of other sites: about 2 x 10 x 200 = 4,000 GETs for 10
/// checkpoints (and a PUT each): 37.2 s against moto on this host (measured on cb884be).
/// Expected: a read by name is one GET (of the key the name gives), the drain well under 10 s
/// here.
#[test]
fn fixed_a_drain_into_an_object_store_gets_every_checkpoint_twice_per_frame() {
    let m = crate::support::moto::Moto::start();
    m.create_bucket("atk52a", false);
    let c = case_with(
        1,
        |dir| {
            let key = write_private(dir, "spool.key", &[9u8; 32]);
            serde_json::json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
                "encryption": {"key_id": "k1", "key_file": key},
                "target": {
                    "type": "object_store", "bucket": "atk52a", "endpoint_url": m.endpoint(),
                    "allow_http_for_local_testing": true, "credential_mode": "environment",
                    "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
                    "key_strategy": "stream_sequence", "metadata_mode": "sidecar"}})
        },
        serde_json::json!({}),
    );
    let mut runner = start_runner_env(&c.cfg, &c.dir.path().join("svc.log"), &m.env());
    crate::custody_checkpoints::publish_range(&c.server, 1, 10);
    crate::custody_checkpoints::wait_acked(&c.server, 10);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    other_sites_objects(&m, "atk52a", 200);
    let t = Instant::now();
    let out_ = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["spool", "drain", c.cfg.to_str().unwrap()])
        .envs(secrets_env())
        .envs(m.env())
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let text =
        String::from_utf8_lossy(&out_.stdout).into_owned() + &String::from_utf8_lossy(&out_.stderr);
    assert!(out_.status.success(), "{text}");
    assert!(
        secs < 10.0,
        "the drain of 10 checkpoint frames into an object store holding 200 checkpoints of \
         other runners took {secs:.1} s: {text}"
    );
}
