//! atk53a: attacks on the newest boundaries (669712e): the spool's drained head and the start's
//! check of it (issue 47: 4840dca, e6ba154, 669712e), and the JSON depth bound of the envelope
//! (304135b: `MAX_JSON_DEPTH` 127 -> 31, since MariaDB's `JSON_VALID` refuses 32 levels).
//!
//! `found_...`: a finding's reproduction; it fails on today's code (669712e) and says what it
//! expected. `held_...`: an attack that held (these pass).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::atk50b::{edge, out, spool_cmd, wait_until_either};
use crate::custody_checkpoints::{case_with, publish_range, records_in, verify, wait_acked, Case};
use crate::support::mysql::MyDb;
use crate::support::postgres::{envelope, parse_cfg};
use crate::support::protection::*;
use svc::config::RuntimeConfig;
use svc::message::envelope::{Envelope, Payload, PayloadFormat, RawMessage};
use svc::metrics::Metrics;
use svc::sink::relational::my_sink::MySqlSink;
use svc::sink::{Sink, WriteOutcome};

// ---------------------------------------------------------------------------------------------
// JSON depth: what the envelope keeps as JSON against what MariaDB's CHECK (JSON_VALID) takes.
// ---------------------------------------------------------------------------------------------

/// A MariaDB relational sink block on a fresh database.
fn mariadb_sink(db: &MyDb) -> Value {
    json!({
        "type": "relational_db", "engine": "mysql",
        "dsn": format!("mysql://root@127.0.0.1:3306/{}", db.name),
        "tls_mode": "disable", "table": "events", "auto_create_tables": true,
    })
}

/// `{"m":{"m":...{"m":1}...}}`: `depth` objects nested.
fn nested_objects(depth: usize) -> String {
    format!("{}1{}", "{\"m\":".repeat(depth), "}".repeat(depth))
}

/// Arrays and objects alternating, `depth` levels, an array outermost.
fn mixed(depth: usize) -> String {
    let (mut open, mut close) = (String::new(), String::new());
    for i in 0..depth {
        if i % 2 == 0 {
            open.push('[');
            close.insert(0, ']');
        } else {
            open.push_str("{\"k\":");
            close.insert(0, '}');
        }
    }
    format!("{open}1{close}")
}

fn shown_outcome(o: &WriteOutcome) -> String {
    format!("{o:?}").chars().take(240).collect()
}

/// FOUND (class 12, two views that disagree; class 11, an operator's honest mistake; severity
/// medium). 304135b bounds the *payload* at 31 levels because MariaDB's `JSON_VALID` (the
/// `CHECK` of every JSON column of the MySQL engine's table) refuses 32 or more, but the
/// mission metadata object goes into its own such column (`mission_metadata_json LONGTEXT NULL
/// CHECK (JSON_VALID(mission_metadata_json))`) and `mission_metadata.max_depth` may be set
/// up to 64 (docs/governance.md: "1 to 64"); the config with `engine: mysql` loads. A header a
/// publisher chooses, 32 to 64 objects deep, passes the mission stage and every row holding it
/// is refused by the server for good (value_rejected, permanent: dead-lettered, or NAKed until
/// `max_deliveries`); a `default` object that deep (checked at load with the same bound) makes
/// EVERY message without the header undeliverable. Expected: the config is refused (a
/// `max_depth` above 31, at least beside `engine: mysql`), or the mission stage refuses such
/// an object as `too_deep`, or the row is stored: never a mission object the stage accepted
/// that the sink can never store.
#[test]
fn found_mission_metadata_nested_32_to_64_deep_is_refused_by_mariadb_for_good() {
    let db = MyDb::new("atk53amission");
    let sink = mariadb_sink(&db);
    let load = |mission: Value| {
        let doc = json!({
            "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                     "subject": "o.>"},
            "sink": sink,
            "mission_metadata": mission,
        });
        RuntimeConfig::parse(&doc.to_string()).map_err(|e| e.to_string())
    };
    // 1. A header the publisher chooses, under max_depth 64.
    let cfg = match load(json!({"enabled": true, "max_depth": 64, "max_bytes": 8192})) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("max_depth 64 beside engine mysql refused at load (fixed): {e}");
            return;
        }
    };
    let mut batch: Vec<Envelope> = Vec::new();
    let mut depths = Vec::new();
    for (i, &d) in [8usize, 31, 32, 40, 64].iter().enumerate() {
        let seq = i as u64 + 1;
        let msg = RawMessage {
            headers: vec![("Svc-Mission-Metadata".into(), nested_objects(d))],
            ..RawMessage::sample("orders.a", seq, b"{}")
        };
        match cfg.mission_metadata.resolve(&msg) {
            Ok(v) => {
                let mut e = envelope("orders.a", seq, br#"{"k":1}"#);
                e.mission_metadata = v;
                batch.push(e);
                depths.push(d);
            }
            Err(r) => eprintln!(
                "depth {d}: refused by the mission stage ({})",
                r.problems.first().map_or("", |p| p.code)
            ),
        }
    }
    // 2. A configured default that deep (every message without the header gets it).
    let mut default_depth = None;
    match load(json!({"enabled": true, "max_depth": 64, "max_bytes": 8192,
                       "default": serde_json::from_str::<Value>(&nested_objects(40)).unwrap()}))
    {
        Ok(c) => {
            let msg = RawMessage::sample("orders.b", 100, b"{}");
            let v = c.mission_metadata.resolve(&msg).unwrap();
            let mut e = envelope("orders.b", 100, br#"{"k":2}"#);
            e.mission_metadata = v;
            batch.push(e);
            depths.push(40);
            default_depth = Some(40);
        }
        Err(e) => eprintln!("a default 40 deep refused at load: {e}"),
    }
    let s = MySqlSink::new(parse_cfg(&sink), Arc::new(Metrics::default())).unwrap();
    let outcomes = s.write_batch(&batch);
    let refused: Vec<(usize, String)> = depths
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| !o.is_durable())
        .map(|(d, o)| (*d, shown_outcome(o)))
        .collect();
    let figure = format!(
        "mission objects accepted by the stage at depths {depths:?} (default: {default_depth:?}); \
         refused by MariaDB: {:?}",
        refused.iter().map(|r| r.0).collect::<Vec<_>>()
    );
    eprintln!("{figure}");
    assert!(
        refused.is_empty(),
        "a mission metadata object the mission stage accepted (max_depth 64, a config that \
         loads beside engine mysql) was refused by MariaDB for good: {refused:?}"
    );
}

/// HELD (class 12). MariaDB 10.11's `JSON_VALID` counts nesting exactly as the envelope's
/// `compact` does: arrays and objects alike, mixed, an empty innermost container counting one,
/// brackets inside strings (and escapes) not counting, whitespace, top-level scalars, deep
/// siblings, the fast path (`count_bytes`) and the walk. Every payload kept as JSON (31 levels)
/// is stored, every one past it is wrapped as text and stored too: no permanent failure.
#[test]
fn held_mariadb_counts_payload_depth_as_the_envelope_does() {
    let db = MyDb::new("atk53adepth");
    let sink = mariadb_sink(&db);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "arrays 31",
            format!("{}1{}", "[".repeat(31), "]".repeat(31)),
            "json",
        ),
        ("objects 31", nested_objects(31), "json"),
        ("objects 32", nested_objects(32), "text"),
        ("mixed 31", mixed(31), "json"),
        ("mixed 32", mixed(32), "text"),
        (
            "empty innermost array, 31",
            format!("{}[]{}", "[".repeat(30), "]".repeat(30)),
            "json",
        ),
        (
            "empty innermost array, 32",
            format!("{}[]{}", "[".repeat(31), "]".repeat(31)),
            "text",
        ),
        (
            "empty innermost object, 31",
            format!("{}{{}}{}", "{\"m\":".repeat(30), "}".repeat(30)),
            "json",
        ),
        (
            "empty innermost object, 32",
            format!("{}{{}}{}", "{\"m\":".repeat(31), "}".repeat(31)),
            "text",
        ),
        (
            "brackets in a string",
            format!("[\"{}{}\"]", "[".repeat(100), "{".repeat(100)),
            "json",
        ),
        (
            "brackets in a string at depth 31",
            format!("{}\"[{{[{{\\\"\"{}", "[".repeat(31), "]".repeat(31)),
            "json",
        ),
        (
            "escape at depth 31",
            format!("{}\"\\u00e9\"{}", "[".repeat(31), "]".repeat(31)),
            "json",
        ),
        (
            "whitespace 31",
            format!("{} 1 {}", " [ \n".repeat(31), " ]\t".repeat(31)),
            "json",
        ),
        (
            "whitespace 32",
            format!("{} 1 {}", " [ \n".repeat(32), " ]\t".repeat(32)),
            "text",
        ),
        ("top-level string", "\"x\"".into(), "json"),
        ("top-level number", "12".into(), "json"),
        ("top-level null", " null ".into(), "json"),
        (
            "three siblings 31 deep",
            format!(
                "[{}]",
                vec![format!("{}1{}", "[".repeat(30), "]".repeat(30)); 3].join(",")
            ),
            "json",
        ),
        (
            "deep second member",
            format!("[1,{}1{}]", "[".repeat(30), "]".repeat(30)),
            "json",
        ),
        (
            "deep second member, 32",
            format!("[1,{}1{}]", "[".repeat(31), "]".repeat(31)),
            "text",
        ),
        (
            "16 arrays then 16 objects",
            format!(
                "{}{}1{}{}",
                "[".repeat(16),
                "{\"m\":".repeat(16),
                "}".repeat(16),
                "]".repeat(16)
            ),
            "text",
        ),
        (
            "many brackets, shallow (fast path off)",
            format!("[{}]", ["[]"; 40].join(",")),
            "json",
        ),
    ];
    let batch: Vec<Envelope> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, p, _))| envelope("a", i as u64 + 1, p.as_bytes()))
        .collect();
    let formats: Vec<(&str, &str)> = cases
        .iter()
        .zip(&batch)
        .map(|(c, e)| (c.0, e.payload_info.original_format.name()))
        .collect();
    let expected: Vec<(&str, &str)> = cases.iter().map(|c| (c.0, c.2)).collect();
    assert_eq!(formats, expected);
    let s = MySqlSink::new(parse_cfg(&sink), Arc::new(Metrics::default())).unwrap();
    let outcomes = s.write_batch(&batch);
    let refused: Vec<(&str, String)> = cases
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| !o.is_durable())
        .map(|(c, o)| (c.0, shown_outcome(o)))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
    eprintln!(
        "{} payloads stored by MariaDB, formats as expected",
        cases.len()
    );
}

/// HELD, with an upgrade note (class 12). A record the previous version spooled (a payload
/// nested 40 deep kept as JSON: `spool::codec` reads it back with `Payload::from_raw`, never
/// re-normalized, so its custody digest holds) reaches MariaDB on the drain after the upgrade:
/// the server refuses it for good, as it did before 304135b, and the outcome is `Permanent`
/// (not transient), so the drain keeps it in a `rejected-*` file and goes on: no drain stuck
/// for good. Such records are not delivered by the upgrade; the CHANGELOG could say so.
#[test]
fn held_a_record_the_previous_version_spooled_40_deep_is_refused_for_good_not_retried() {
    let db = MyDb::new("atk53aold");
    let sink = mariadb_sink(&db);
    let mut old = envelope("a", 1, br#"{"k":1}"#);
    let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
    old.payload = Payload::from_compact_json(deep.clone()).unwrap();
    old.payload_info.original_format = PayloadFormat::Json;
    old.payload_info.wrapped = false;
    old.payload_info.sha256 = svc::message::envelope::hex_sha256(deep.as_bytes());
    old.payload_info.size_bytes = deep.len() as u64;
    let new = envelope("a", 2, deep.as_bytes());
    assert_eq!(new.payload_info.original_format.name(), "text");
    let s = MySqlSink::new(parse_cfg(&sink), Arc::new(Metrics::default())).unwrap();
    let outcomes = s.write_batch(&[old, new]);
    eprintln!(
        "old record: {}; the same bytes normalized now: {}",
        shown_outcome(&outcomes[0]),
        shown_outcome(&outcomes[1])
    );
    assert!(
        matches!(outcomes[0], WriteOutcome::Permanent(_)),
        "{}",
        shown_outcome(&outcomes[0])
    );
    assert!(outcomes[1].is_durable(), "{}", shown_outcome(&outcomes[1]));
}

// ---------------------------------------------------------------------------------------------
// The drained head.
// ---------------------------------------------------------------------------------------------

/// The target's checkpoint store out of reach (a plain file at its directory's name); as
/// atk52c's.
fn target_unreadable(c: &Case) {
    let store = out(c).join(".svc-checkpoints");
    let aside = c.dir.path().join("checkpoints-aside");
    if store.exists() {
        std::fs::rename(&store, &aside).unwrap();
    } else {
        std::fs::create_dir(&aside).unwrap();
    }
    std::fs::write(&store, b"not a directory").unwrap();
}

/// The target's checkpoint store given back.
fn target_readable(c: &Case) {
    let store = out(c).join(".svc-checkpoints");
    std::fs::remove_file(&store).unwrap();
    std::fs::rename(c.dir.path().join("checkpoints-aside"), &store).unwrap();
}

/// Stops a runner that started (true) and returns its log.
fn stop(runner: &mut crate::support::process::Runner, started: bool) -> String {
    if started {
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(30));
    }
    runner.log_text()
}

/// Runs the runner of `cfg` over `from..=to` and stops it with TERM.
fn run(c: &Case, cfg: &Path, (from, to): (u64, u64), log: &str) {
    let mut runner = start_runner(cfg, &c.dir.path().join(log));
    publish_range(&c.server, from, to);
    wait_acked(&c.server, to);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
}

/// A start of the runner of `cfg`: (bound, log).
fn start_once(c: &Case, cfg: &Path, log: &str) -> (bool, String) {
    let mut runner = start_runner(cfg, &c.dir.path().join(log));
    let started = wait_until_either(&mut runner);
    (started, stop(&mut runner, started))
}

fn head_index(c: &Case) -> u64 {
    let text = std::fs::read_to_string(c.dir.path().join("c.json.custody-head")).unwrap();
    serde_json::from_str::<Value>(&text).unwrap()["index"]
        .as_u64()
        .unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// An encrypted edge spool: 1..6 drained; 7..9 spooled (their checkpoints waiting) and the
/// spool directory backed up whole (frames, position, drained head: consistent with each
/// other); 10..12 spooled and drained. Then the backup is put back: a spool older than the
/// target and the head file. Returns the case and the head file's index before the backup
/// and at the end.
fn restored_older_spool() -> (Case, u64, u64) {
    let c = edge(3);
    let cfg = c.cfg.clone();
    run(&c, &cfg, (1, 6), "svc1.log");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    run(&c, &cfg, (7, 9), "svc2.log");
    let backed_up = head_index(&c);
    let spool = c.dir.path().join("spool");
    let backup = c.dir.path().join("spool-backup");
    copy_dir(&spool, &backup);
    run(&c, &cfg, (10, 12), "svc3.log");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert_eq!(records_in(&out(&c)), 12, "{text}");
    let newest = head_index(&c);
    assert!(newest > backed_up, "{backed_up} {newest}");
    std::fs::remove_dir_all(&spool).unwrap();
    copy_dir(&backup, &spool);
    (c, backed_up, newest)
}

/// HELD (class 1/3: a whole spool directory restored from an older backup, frames, position
/// and drained head consistent with each other but older than the target and the head file).
/// With the target unreadable the start refuses (`is TRUNCATED`: the head file is further on):
/// no fork, no hidden loss. With the target back the start takes the whole chain (target and
/// spool, a checkpoint in both counted once), the drain delivers the restored records again
/// (the file target finds them stored) and puts nothing twice, and `svc verify-custody` says
/// COMPLETE.
#[test]
fn held_a_spool_restored_from_an_older_backup_is_refused_while_the_target_cannot_be_read() {
    let (c, backed_up, newest) = restored_older_spool();
    target_unreadable(&c);
    let (started, log) = start_once(&c, &c.cfg, "svc4.log");
    assert!(
        !started && log.contains("is TRUNCATED"),
        "restored spool (head file {newest}, spool's chain to {backed_up}), target \
         unreadable: {log}"
    );
    target_readable(&c);
    let (started, log) = start_once(&c, &c.cfg, "svc5.log");
    assert!(started, "target readable: {log}");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert_eq!(records_in(&out(&c)), 12, "{text}");
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    eprintln!("verify-custody after the restored spool drained: exit {code}: {text}");
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("COMPLETE"), "{text}");
}

/// FOUND (class 12, two views that disagree; severity low: a refused start that should not
/// be). The drained head is never checked to move forward only: the drain records every
/// checkpoint it finds stored already (`put::Follows::Stored`) as the drained head, also one
/// far behind the target's end. A spool restored from an older backup (see above) and drained
/// again with the target readable moves the drained head BACK to the backup's checkpoint,
/// while the target holds the chain to the head file's head and the spool holds nothing:
/// everything intact, `svc verify-custody` COMPLETE. The next start while the target cannot be
/// read takes the stale drained head for the chain's end and refuses: `is TRUNCATED ...
/// records and checkpoints were removed`, untrue, and the edge site cannot start without its
/// downstream until a later drain moves the head on. Expected: the start goes on (the drain
/// keeps the drained head where it is when the checkpoint it finds stored is older than it).
#[test]
fn found_a_restored_spool_drained_again_moves_the_drained_head_back_and_a_start_is_refused() {
    let (c, backed_up, newest) = restored_older_spool();
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    let (code, audit) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{audit}");
    target_unreadable(&c);
    let (started, log) = start_once(&c, &c.cfg, "svc4.log");
    assert!(
        started,
        "the start REFUSED an intact chain (target to checkpoint {newest}, head file \
         {newest}, the spool empty after a restored backup (to {backed_up}) was drained \
         again and verify-custody said COMPLETE); the drained head moved back. Log:\n{log}"
    );
}

/// A spool sink kept in clear (`allow_unencrypted`) into a file target, a checkpoint every 3.
fn clear_edge() -> Case {
    case_with(
        3,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
                   "allow_unencrypted": true,
                   "target": {"type": "file", "directory": dir.join("out")}})
        },
        json!({}),
    )
}

fn drained_heads(c: &Case) -> Vec<PathBuf> {
    std::fs::read_dir(c.dir.path().join("spool"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("drained-head-")
        })
        .collect()
}

/// FOUND (class 11, an operator's honest mistake, with e6ba154; severity low-medium: a forked
/// chain begun silently, a drain then stopped for good). A spool kept in clear, drained whole
/// (the target holds checkpoints 0.. of the runner; the spool none, its drained-head file
/// present). The configuration file is renamed (or copied to a new host): the default head
/// file, `<config file>.custody-head`, is then not found. With the target readable the start
/// refuses (`the head file ... is missing`), and an encrypted spool's drained head does the
/// same with the target out of reach; but since e6ba154 a clear spool's drained head is
/// ignored, so with the target unreadable the spool looks like a new one: no chain, no drained
/// head, no head file. The runner starts and signs a second checkpoint 0 of the same runner id
/// (a fork); the next drain delivers the records before it and stops at it for good (`does not
/// follow the target's chain (it holds checkpoints of that runner already)`). Expected: refused
/// (the spool shows it was drained: a drained-head file of this runner is there, even if it
/// cannot vouch for where the chain ends), as the other two cases are.
#[test]
fn found_a_drained_clear_spool_under_a_renamed_config_forks_the_chain() {
    let c = clear_edge();
    run(&c, &c.cfg, (1, 6), "svc1.log");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert_eq!(drained_heads(&c).len(), 1, "{text}");
    let moved = c.dir.path().join("edge.json");
    std::fs::copy(&c.cfg, &moved).unwrap();
    // The same check with the target readable: refused (the contrast).
    let (started, log) = start_once(&c, &moved, "svc2.log");
    assert!(
        !started && log.contains("missing"),
        "target readable: {log}"
    );
    target_unreadable(&c);
    let mut runner = start_runner(&moved, &c.dir.path().join("svc3.log"));
    let started = wait_until_either(&mut runner);
    if started {
        publish_range(&c.server, 7, 9);
        wait_acked(&c.server, 9);
    }
    let log = stop(&mut runner, started);
    if started {
        target_readable(&c);
        let (code, o, e) = svc_env(&["spool", "drain", moved.to_str().unwrap()], None);
        let drain = o + &e;
        eprintln!(
            "after the start: drain exit {code}: {}",
            drain.lines().last().unwrap_or("")
        );
        let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
        eprintln!("verify-custody: exit {code}: {text}");
    }
    assert!(
        !started,
        "the runner STARTED on a drained clear spool with its head file not found (config \
         renamed) and the target unreadable, beginning a second chain at checkpoint 0. Log:\n\
         {log}"
    );
}

/// `svc spool drain <cfg>` under strace, killed (SIGKILL injected) at the entry of its `n`th
/// rename: (exit code or -1 when killed, output).
fn drain_killed_at_rename(c: &Case, n: u32) -> (i32, String) {
    let out = std::process::Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=rename,renameat,renameat2",
        ])
        .arg("-e")
        .arg(format!(
            "inject=rename,renameat,renameat2:signal=KILL:when={n}"
        ))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_svc"))
        .args(["spool", "drain", c.cfg.to_str().unwrap()])
        .envs(secrets_env())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// HELD (class 1: a kill -9 between the checkpoint's put, the drained head's write and the
/// position's move). An encrypted edge spool with checkpoint frames waiting; `svc spool drain`
/// killed at the entry of its 1st, 2nd, ... rename (the drained head's temporary name renamed
/// in, a rejected or quarantine file, the first position), each time followed by a start while
/// the target cannot be read: every start takes the chain (the frame stays until the position
/// moves past it, the drained head is the old one or the new one), a left temporary name
/// blocks nothing, and the last drain exits 0 with every record delivered, the chain COMPLETE.
#[test]
fn held_a_drain_killed_at_each_rename_leaves_a_chain_the_start_takes() {
    let c = edge(3);
    run(&c, &c.cfg, (1, 9), "svc1.log");
    let mut killed = Vec::new();
    for n in 1..=6u32 {
        let (code, text) = drain_killed_at_rename(&c, n);
        if code != -1 {
            eprintln!("rename {n}: not reached (drain exit {code})");
            assert_eq!(code, 0, "{text}");
            break;
        }
        killed.push(n);
        target_unreadable(&c);
        let (started, log) = start_once(&c, &c.cfg, &format!("svc-k{n}.log"));
        target_readable(&c);
        assert!(
            started,
            "after a drain killed at rename {n}, the start with the target unreadable \
             refused: {log}"
        );
    }
    let figure = format!("drain killed at renames {killed:?}");
    eprintln!("{figure}");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert_eq!(records_in(&out(&c)), 9, "{text}");
    target_unreadable(&c);
    let (started, log) = start_once(&c, &c.cfg, "svc-end.log");
    target_readable(&c);
    assert!(started, "{log}");
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("COMPLETE"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Gaps.
// ---------------------------------------------------------------------------------------------

/// HELD (class 1, a crash at the worst moment). No DLQ, `max_deliveries: 2`: message 2 is
/// over the file sink's `max_record_bytes`, NAKed, then terminated and listed as a `terminated`
/// gap; a kill -9 right after the broker shows it settled. `svc-ack` signs first and settles
/// last (`AckWorker::signed`: the `+TERM` waits for a stored checkpoint listing the gap), so
/// after the restart `svc verify-custody` says `3 records intact, ..., 1 runner-caused gaps:
/// COMPLETE`.
#[test]
fn held_a_message_terminated_without_a_dlq_then_a_kill_9_is_a_listed_gap() {
    let c = crate::custody_checkpoints::refusing_case(100);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    publish_range(&c.server, 3, 3);
    crate::support::wait_until(
        Duration::from_secs(60),
        "1 and 3 stored, 2 terminated",
        || {
            matches!(
                c.server.try_consumer_state(STREAM, CONSUMER),
                Some((3, 0, 0))
            ) && records_in(&out(&c)) == 2
        },
    );
    runner.sigkill();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    publish_range(&c.server, 4, 4);
    wait_acked(&c.server, 4);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    eprintln!("verify-custody after TERM of 2 and a kill -9: exit {code}: {text}");
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("3 records intact") && text.contains("1 runner-caused gaps: COMPLETE"),
        "sequence 2 (terminated without a DLQ, then a kill -9) is not the listed gap: {text}"
    );
}

/// HELD (class 4, another account in the spool's directory; class 8, a bound). A drained,
/// encrypted edge spool (its chain wholly in the target), the target then unreadable. Its
/// drained-head file replaced by: one owned by another account (`nobody`), one with a second
/// name (a hard link elsewhere in the directory), one of exactly the 16 MiB bound (junk), one a
/// byte over it. Each start refuses naming the file, at once, its memory bounded (the file is
/// read up to the bound only); the genuine file put back, the start goes on.
#[test]
fn held_a_drained_head_of_another_owner_a_second_name_or_the_size_bound_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let c = edge(3);
    run(&c, &c.cfg, (1, 3), "svc1.log");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    let heads = drained_heads(&c);
    assert_eq!(heads.len(), 1, "{text}");
    let head = heads[0].clone();
    let genuine = std::fs::read(&head).unwrap();
    target_unreadable(&c);
    let put = |bytes: &[u8]| {
        let _ = std::fs::remove_file(&head);
        std::fs::write(&head, bytes).unwrap();
        std::fs::set_permissions(&head, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    // Another owner (the tests run as root here; skipped where chown is not allowed).
    put(&genuine);
    let chowned = std::process::Command::new("chown")
        .args(["nobody", head.to_str().unwrap()])
        .status()
        .is_ok_and(|s| s.success());
    if chowned {
        let (started, log) = start_once(&c, &c.cfg, "svc-owner.log");
        assert!(!started && log.contains("drained head"), "owner: {log}");
    }
    // A second name.
    put(&genuine);
    let link = c.dir.path().join("spool").join("again");
    std::fs::hard_link(&head, &link).unwrap();
    let (started, log) = start_once(&c, &c.cfg, "svc-link.log");
    assert!(!started && log.contains("drained head"), "link: {log}");
    std::fs::remove_file(&link).unwrap();
    // The size bound, and one byte over it.
    for (n, what) in [(16usize << 20, "bound"), ((16 << 20) + 1, "over")] {
        put(&vec![b'x'; n]);
        let t = std::time::Instant::now();
        let (started, log) = start_once(&c, &c.cfg, &format!("svc-{what}.log"));
        eprintln!("drained head of {n} bytes: refused={} in {}", !started, {
            let e = t.elapsed();
            format!("{}.{:03} s", e.as_secs(), e.subsec_millis())
        });
        assert!(!started && log.contains("drained head"), "{what}: {log}");
    }
    put(&genuine);
    let (started, log) = start_once(&c, &c.cfg, "svc-genuine.log");
    assert!(started, "genuine: {log}");
}

/// The file sink (per_event, the default `skip_existing`) of a fresh directory.
fn file_sink(dir: &Path) -> Arc<dyn Sink> {
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
        "sink": {"type": "file", "directory": dir},
    });
    let cfg = RuntimeConfig::parse(&doc.to_string()).unwrap();
    cfg.sink.build(Arc::new(Metrics::default())).unwrap()
}

/// FOUND (class 12 across an upgrade, class 1: a crash between the write and the ACK; severity
/// low: payloads exactly 127 levels deep). The previous version kept a payload nested 127 deep
/// as JSON and wrote its record (the payload at levels 2 to 128 of the record); a kill -9
/// before the ACK, then the upgrade: the broker delivers the message again, 304135b wraps the
/// same bytes as text, so the file at the record's name no longer holds the very bytes the
/// sink means to write, and `skip_existing` reads the stored record to see whether it is the
/// same message (`sink::file::existing`): `serde_json::Value` stops at 128 levels, so the
/// stored record "holds no JSON record" and the redelivery fails for good (dead-lettered, a
/// false `dead_lettered` gap, or NAKed until terminated) although the message is stored. At
/// 126 levels (and before the upgrade, the same bytes) it is `AlreadyDurable`. Expected:
/// `AlreadyDurable` at 127 too (read the stored record without serde's recursion limit, e.g.
/// `document::canonical`'s 256, or compare only the fields the key and digest need).
#[test]
fn found_a_record_the_previous_version_stored_127_deep_fails_for_good_when_redelivered() {
    let d = tempfile::tempdir().unwrap();
    let sink = file_sink(d.path());
    let mut outcomes = Vec::new();
    for (seq, depth) in [(1u64, 126usize), (2, 127)] {
        let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let now = envelope("orders.a", seq, deep.as_bytes());
        assert_eq!(now.payload_info.original_format.name(), "text");
        let mut before = now.clone();
        before.payload = Payload::from_compact_json(deep.clone()).unwrap();
        before.payload_info.original_format = PayloadFormat::Json;
        before.payload_info.wrapped = false;
        let first = sink.write_batch(std::slice::from_ref(&before));
        assert!(first[0].is_durable(), "{}", shown_outcome(&first[0]));
        let again = sink.write_batch(std::slice::from_ref(&now));
        let figure = format!(
            "depth {depth}: stored by the previous version, redelivered now: {}",
            shown_outcome(&again[0])
        );
        eprintln!("{figure}");
        outcomes.push((depth, again[0].clone()));
    }
    let failed: Vec<(usize, String)> = outcomes
        .iter()
        .filter(|(_, o)| !o.is_durable())
        .map(|(d, o)| (*d, shown_outcome(o)))
        .collect();
    assert!(
        failed.is_empty(),
        "a message the previous version stored, redelivered after the upgrade, failed: {failed:?}"
    );
}

/// FOUND (class 12, two views that disagree; severity medium: default settings, a header any
/// publisher sets). The envelope wraps a payload holding U+0000 as text because "PostgreSQL
/// refuses `\u0000` in `jsonb`, so the message was never stored" (`readable_alike`), but the
/// mission metadata stage checks only its KEYS for control characters and the security
/// labels stage does not look at the string values under `extensions`: a header
/// `Svc-Mission-Metadata: {"note":"a\u0000b"}` (mission metadata enabled, every bound at its
/// default) or `Svc-Security-Labels: {..., "extensions": {"note": "a\u0000b"}}` passes its
/// stage, and PostgreSQL refuses the row for good (`mission_metadata_json`,
/// `security_labels_json` and `metadata_json` are `jsonb`: "unsupported Unicode escape
/// sequence"): dead-lettered, or NAKed until terminated; never stored. Expected: refused by
/// the stage (a reason code, as for a control character in a key), or stored.
#[test]
fn found_u0000_in_mission_metadata_or_label_extension_values_is_refused_by_postgresql() {
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
        "sink": {"type": "file", "directory": "/tmp/unused"},
        "mission_metadata": {"enabled": true},
        "security_labels": {"enabled": true},
    });
    let cfg = RuntimeConfig::parse(&doc.to_string()).unwrap();
    let mut batch = Vec::new();
    let mut what = Vec::new();
    let mission = RawMessage {
        headers: vec![(
            "Svc-Mission-Metadata".into(),
            r#"{"note":"a\u0000b"}"#.into(),
        )],
        ..RawMessage::sample("orders.a", 1, b"{}")
    };
    match cfg.mission_metadata.resolve(&mission) {
        Ok(v) => {
            let mut e = envelope("orders.a", 1, br#"{"k":1}"#);
            e.mission_metadata = v;
            batch.push(e);
            what.push("mission metadata value");
        }
        Err(r) => eprintln!(
            "mission metadata with U+0000 refused by the stage ({})",
            r.problems.first().map_or("", |p| p.code)
        ),
    }
    let labels = r#"{"profile":"svc.security-label.v1","classification":"restricted","extensions":{"note":"a\u0000b"}}"#;
    match cfg.security_labels.parse_header(labels) {
        Ok(p) => {
            let mut e = envelope("orders.a", 2, br#"{"k":2}"#);
            svc::message::labels::apply_to(&mut e, Some(Value::Object(p.fields().clone())));
            batch.push(e);
            what.push("security label extension value");
        }
        Err(_) => eprintln!("a label extension value with U+0000 refused by the stage"),
    }
    let db = crate::support::postgres::TestDb::new("atk53anul");
    let (s, _) = db.relational_sink(json!({"auto_create_tables": true}));
    let outcomes = s.write_batch(&batch);
    let refused: Vec<(&str, String)> = what
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| !o.is_durable())
        .map(|(w, o)| (*w, shown_outcome(o)))
        .collect();
    let figure = format!(
        "accepted by their stage: {what:?}; refused by PostgreSQL: {:?}",
        refused.iter().map(|r| r.0).collect::<Vec<_>>()
    );
    eprintln!("{figure}");
    assert!(
        refused.is_empty(),
        "a header value the stage accepted (U+0000 in a string) was refused by PostgreSQL for \
         good: {refused:?}"
    );
}

/// The mission half end to end (`svc run`, a real broker, PostgreSQL, no DLQ,
/// `max_deliveries: 2`): a mission metadata header with U+0000 in a value (mission metadata
/// enabled, every bound at its default) passes the stage and is refused by the database
/// (`22P05 (untranslatable_character)`) on every delivery, then terminated: never stored.
/// The contrast (held): a kept header (`envelope.keep_headers`) holding a NUL byte is refused
/// before any sink with its reason (`envelope.keep_headers holds U+0000, which no sink can
/// store as text`), the same for every sink. Expected: the mission value treated as the kept
/// header is (refused by its stage, with a reason, whatever the sink), or stored; never a
/// row the database refuses.
#[test]
fn found_svc_run_a_mission_value_with_u0000_is_refused_by_postgresql_not_by_its_stage() {
    use crate::support::broker::NatsServer;
    use crate::support::process::Runner;
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "pg", "orders.>", Duration::from_secs(30));
    server.raw_publish(b"orders.a", &[], br#"{"n":1}"#);
    server.raw_publish(
        b"orders.b",
        &[(b"Svc-Mission-Metadata", br#"{"note":"a\u0000b"}"#)],
        br#"{"n":2}"#,
    );
    server.raw_publish(b"orders.c", &[(b"X-H", b"a\x00b")], br#"{"n":3}"#);
    let pg = crate::support::postgres::TestDb::new("atk53arun");
    let dir = tempfile::tempdir().unwrap();
    let cfg = json!({
        "nats": {"url": server.url(), "stream": "ORDERS", "consumer": "pg",
                 "subject": "orders.>"},
        "envelope": {"keep_headers": ["X-H"]},
        "mission_metadata": {"enabled": true},
        "delivery": {"batch_size": 64, "fetch_expiry_ms": 200, "shutdown_timeout_seconds": 10,
                     "max_deliveries": 2,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
        "sink": pg.sink(json!({"auto_create_tables": true})),
        "logging": {"level": "info"}
    });
    let cfg = crate::support::write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    crate::support::wait_until(Duration::from_secs(60), "3 messages settled", || {
        server.try_consumer_state("ORDERS", "pg") == Some((3, 0, 0))
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(20)).is_some());
    let stored: Vec<String> = pg
        .rows("SELECT stream_sequence FROM events ORDER BY stream_sequence")
        .into_iter()
        .map(|r| r[0].clone().unwrap_or_default())
        .collect();
    let log = runner.log_text();
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("permanent") || l.contains("terminated"))
        .collect();
    let figure = format!("rows stored by PostgreSQL for sequences {stored:?}");
    eprintln!("{figure}");
    assert!(
        log.contains("keep_headers holds U+0000"),
        "the kept header's NUL: {}",
        refusals.join("\n")
    );
    assert!(
        !log.contains("22P05"),
        "message 2 (a mission metadata value holding U+0000) passed its stage and was refused \
         by PostgreSQL for good:\n{}",
        refusals.join("\n")
    );
}
