//! Fan-out tests: config rules with exact messages, the ACK gate with real file children and
//! scripted children (slow, failing, hanging, panicking), and every fan-out metric.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use crossbeam_channel::Receiver;
use serde_json::json;

use super::*;
use crate::document::reader::{ObjectReader, Problems};
use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};
use crate::message::subject::SubjectPattern;
use crate::sink::SinkConfig;

fn read_sink(v: &serde_json::Value) -> Result<SinkConfig, Vec<String>> {
    let problems = Problems::new();
    let cfg = SinkConfig::read(ObjectReader::at("sink".into(), v, &problems));
    let p: Vec<String> = problems.into_vec().iter().map(|p| p.to_string()).collect();
    match cfg {
        Some(c) if p.is_empty() => Ok(c),
        _ => Err(p),
    }
}

fn fanout_cfg(v: &serde_json::Value) -> FanoutConfig {
    match read_sink(v) {
        Ok(SinkConfig::Fanout(c)) => c,
        other => panic!("{other:?}"),
    }
}

fn env(subject: &str, seq: u64) -> Envelope {
    normalize(
        &RawMessage::sample(subject, seq, &format!("{{\"n\":{seq}}}").into_bytes()),
        0,
        &EnvelopeConfig::default(),
    )
    .0
}

fn count(m: &Metrics, name: &str) -> u64 {
    m.counters
        .values()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no counter {name}"))
        .1
}

/// A temp directory of its own, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "svc-fanout-{tag}-{}-{}",
            std::process::id(),
            crate::message::envelope::now_unix_nanos()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Files below `dir`, recursively.
fn files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                files(&p)
            } else {
                1
            }
        })
        .sum()
}

#[derive(Clone)]
enum Behavior {
    Durable,
    Transient,
    Permanent,
    Panic,
    /// Blocks until the test sends (or drops the sender).
    Hang(Receiver<()>),
    /// Waits (up to 10 s) until `n` children are inside `write_batch` at the same time; fails
    /// transiently otherwise.
    Rendezvous(Arc<(Mutex<usize>, std::sync::Condvar)>, usize),
}

/// A child whose behaviour the test scripts; records the sequences it was given.
struct Scripted {
    delay: Duration,
    behavior: Behavior,
    written: Mutex<Vec<u64>>,
    check_fails: bool,
}

impl Scripted {
    fn new(delay_ms: u64, behavior: Behavior) -> Arc<Scripted> {
        Arc::new(Scripted {
            delay: Duration::from_millis(delay_ms),
            behavior,
            written: Mutex::new(Vec::new()),
            check_fails: false,
        })
    }
    fn seqs(&self) -> Vec<u64> {
        self.written.lock().unwrap().clone()
    }
}

impl Sink for Scripted {
    fn kind(&self) -> &'static str {
        "scripted"
    }
    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        std::thread::sleep(self.delay);
        let o = match &self.behavior {
            Behavior::Durable => WriteOutcome::Durable,
            Behavior::Transient => WriteOutcome::Transient(SinkError::new("scripted", "down")),
            Behavior::Permanent => WriteOutcome::Permanent(SinkError::new("scripted", "rejected")),
            Behavior::Panic => panic!("scripted child panics"),
            Behavior::Hang(rx) => {
                let _ = rx.recv();
                WriteOutcome::Durable
            }
            Behavior::Rendezvous(pair, n) => {
                let (lock, cv) = &**pair;
                let mut inside = lock.lock().unwrap();
                *inside += 1;
                cv.notify_all();
                let (inside, _) = cv
                    .wait_timeout_while(inside, Duration::from_secs(10), |k| *k < *n)
                    .unwrap();
                if *inside >= *n {
                    WriteOutcome::Durable
                } else {
                    WriteOutcome::Transient(SinkError::new("scripted", "ran alone"))
                }
            }
        };
        self.written
            .lock()
            .unwrap()
            .extend(batch.iter().map(|e| e.stream_sequence));
        vec![o; batch.len()]
    }
    fn check(&self) -> Result<String, SinkError> {
        if self.check_fails {
            Err(SinkError::new("scripted", "unreachable"))
        } else {
            Ok("ready".into())
        }
    }
}

fn target(sink: &str, required: bool, min_ms: u64, timeout_ms: u64) -> Target {
    Target {
        sink: sink.into(),
        required,
        minimum_wait: Duration::from_millis(min_ms),
        timeout: Duration::from_millis(timeout_ms),
    }
}

fn routing(routes: Vec<(&str, &str, Vec<Target>)>) -> Routing {
    Routing {
        enabled: true,
        target_sink_types: BTreeMap::new(),
        routes: routes
            .into_iter()
            .map(|(name, subject, targets)| Route {
                name: name.into(),
                subject: SubjectPattern::parse(subject).unwrap(),
                when: Conditions::default(),
                targets,
            })
            .collect(),
        unmatched: Unmatched::Reject,
        mode: Mode::First,
        subject_only: true,
    }
}

fn fanout(
    children: Vec<(&str, Arc<Scripted>)>,
    routing: Routing,
    max_in_flight: usize,
) -> (FanoutSink, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let children = children
        .into_iter()
        .map(|(n, s)| (n.to_string(), s as Arc<dyn Sink>))
        .collect();
    (
        FanoutSink::from_sinks(children, routing, max_in_flight, metrics.clone()).unwrap(),
        metrics,
    )
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------- configuration

#[test]
fn full_config_is_read_with_defaults() {
    let c = fanout_cfg(&json!({
        "type": "fanout",
        "sinks": {
            "archive": {"type": "file", "directory": "/tmp/a"},
            "mirror": {"type": "file", "directory": "/tmp/b"}
        },
        "routing": {
            "enabled": true,
            "target_sink_types": {"archive": "file", "mirror": "file"},
            "routes": [
                {"name": "orders", "match": {"subject": "orders.>"},
                 "targets": ["archive", {"sink": "mirror", "required": false}]},
                {"name": "rest", "match": {"subject": ">"},
                 "targets": [{"sink": "archive"},
                             {"sink": "mirror", "required": false, "minimum_wait_ms": 10, "timeout_ms": 20}]}
            ]
        }
    }));
    assert_eq!(c.sinks.len(), 2);
    assert_eq!(c.optional_max_in_flight, 4);
    assert!(c.routing.enabled);
    assert_eq!(c.routing.unmatched, Unmatched::Reject);
    let r = &c.routing.routes[0];
    assert_eq!(r.targets[0], target("archive", true, 0, 0));
    // An optional target of a non-object-store child: no extra wait, 5 s timeout.
    assert_eq!(r.targets[1], target("mirror", false, 0, 5000));
    let r = &c.routing.routes[1];
    assert_eq!(r.targets[0], target("archive", true, 0, 0));
    assert_eq!(r.targets[1], target("mirror", false, 10, 20));
}

#[test]
fn optional_object_store_targets_default_to_1000_and_5000_ms() {
    let c = fanout_cfg(&json!({
        "type": "fanout",
        "sinks": {
            "files": {"type": "file", "directory": "/tmp/a"},
            "archive": {"type": "object_store", "bucket": "event-archive"}
        },
        "routing": {
            "enabled": true,
            "target_sink_types": {"files": "file", "archive": "object_store"},
            "routes": [
                {"name": "a", "match": {"subject": "a.>"},
                 "targets": ["files", {"sink": "archive", "required": false}]},
                {"name": "b", "match": {"subject": "b.>"},
                 "targets": ["files", {"sink": "archive", "required": false, "timeout_ms": 800}]},
                {"name": "c", "match": {"subject": "c.>"},
                 "targets": [{"sink": "archive"}, {"sink": "files", "required": false}]}
            ]
        }
    }));
    let r = &c.routing.routes;
    assert_eq!(r[0].targets[1], target("archive", false, 1000, 5000));
    // An explicit timeout shorter than the default minimum wait caps the wait.
    assert_eq!(r[1].targets[1], target("archive", false, 800, 800));
    // A required object store needs no waits; an optional file target gets 0 / 5000.
    assert_eq!(r[2].targets[0], target("archive", true, 0, 0));
    assert_eq!(r[2].targets[1], target("files", false, 0, 5000));
}

#[test]
fn config_problems_are_all_reported() {
    let got = read_sink(&json!({
        "type": "fanout",
        "sinks": {
            "db": {"type": "file", "directory": "/tmp/x"},
            "nested": {"type": "fanout", "sinks": {}},
            "Bad Name": {"type": "file", "directory": "/tmp/y"},
            "broken": {"type": "file"}
        },
        "routing": {
            "enabled": true,
            "target_sink_types": {"db": "relational_db", "ghost": "file"},
            "unmatched": "drop",
            "routes": [
                {"name": "a", "match": {"subject": "a.>"},
                 "targets": [{"sink": "db", "required": false}]},
                {"name": "a", "match": {"subject": "a..b"}, "targets": ["ghost", "db", "db"]},
                {"name": "c", "match": {"subject": "c"},
                 "targets": [{"sink": "db", "timeout_ms": 5}, 7]},
                {"name": "d", "match": {"subject": "d"},
                 "targets": ["db", {"sink": "db", "required": false}]},
                {"name": "e", "match": {"subject": "e"},
                 "targets": [{"sink": "db", "required": false, "minimum_wait_ms": 50, "timeout_ms": 10}]},
                {"name": "f", "targets": []}
            ]
        },
        "optional_max_in_flight": 0
    }))
    .unwrap_err();
    assert_eq!(
        got,
        vec![
            "sink.sinks.Bad Name: child names must be 1 to 64 characters of a-z 0-9 _ -",
            "sink.sinks.broken.directory: is required",
            "sink.sinks.nested.type: a fan-out child must not itself be a fan-out sink",
            "sink.optional_max_in_flight: must be an integer from 1 to 64",
            "sink.routing.unmatched: must be one of: reject, all_required",
            "sink.routing.target_sink_types: db is declared relational_db but the child sink is file",
            "sink.routing.target_sink_types: ghost is not a child sink in sinks",
            "sink.routing.target_sink_types: must declare the type of Bad Name",
            "sink.routing.target_sink_types: must declare the type of broken",
            "sink.routing.routes[0].targets: must include at least one required target (optional \
             targets are not in the custody path)",
            "sink.routing.routes[1].name: is used by an earlier route",
            "sink.routing.routes[1].match.subject: must not contain empty tokens",
            "sink.routing.routes[1].targets[0]: ghost is not a child sink in sinks",
            "sink.routing.routes[1].targets[2]: names db twice in one route",
            "sink.routing.routes[2].targets[0].timeout_ms: applies only to optional targets \
             (required: false)",
            "sink.routing.routes[2].targets[1]: must be a child sink name or an object with sink, \
             required, minimum_wait_ms, timeout_ms",
            "sink.routing.routes[3].targets[1]: names db twice in one route",
            "sink.routing.routes[4].targets[0].minimum_wait_ms: must not exceed timeout_ms",
            "sink.routing.routes[4].targets: must include at least one required target (optional \
             targets are not in the custody path)",
            "sink.routing.routes[5].match: is required",
            "sink.routing.routes[5].targets: must be a non-empty array",
        ]
    );
}

#[test]
fn sinks_block_is_required_and_routing_needs_routes() {
    assert_eq!(
        read_sink(&json!({"type": "fanout"})).unwrap_err(),
        vec!["sink.sinks: is required"]
    );
    assert_eq!(
        read_sink(&json!({"type": "fanout", "sinks": {}})).unwrap_err(),
        vec!["sink.sinks: must name at least one child sink"]
    );
    assert_eq!(
        read_sink(&json!({"type": "fanout",
                          "sinks": {"a": {"type": "file", "directory": "/tmp/a"}},
                          "routing": {"enabled": true}}))
        .unwrap_err(),
        vec!["sink.routing.routes: must have at least one route when routing is enabled"]
    );
}

// ---------------------------------------------------------------- real file children

fn file_fanout(
    a: &Path,
    b: &Path,
    routing_json: serde_json::Value,
) -> (Arc<dyn Sink>, Arc<Metrics>) {
    let cfg = read_sink(&json!({
        "type": "fanout",
        "sinks": {
            "a": {"type": "file", "directory": a.to_str().unwrap()},
            "b": {"type": "file", "directory": b.to_str().unwrap()}
        },
        "routing": routing_json
    }))
    .unwrap();
    let metrics = Arc::new(Metrics::default());
    (cfg.build(metrics.clone()).unwrap(), metrics)
}

#[test]
fn routes_select_the_right_file_children_by_subject() {
    let (ta, tb) = (TempDir::new("ra"), TempDir::new("rb"));
    let (sink, m) = file_fanout(
        &ta.0,
        &tb.0,
        json!({
            "enabled": true,
            "routes": [
                {"name": "only-a", "match": {"subject": "orders.a.*"}, "targets": ["a"]},
                {"name": "only-b", "match": {"subject": "orders.b.*"}, "targets": ["b"]},
                {"name": "both", "match": {"subject": "orders.>"}, "targets": ["a", "b"]}
            ]
        }),
    );
    let batch = vec![
        env("orders.a.x", 1),
        env("orders.b.x", 2),
        env("orders.b.y", 3),
        env("orders.c.x", 4),
        env("misc", 5),
    ];
    let out = sink.write_batch(&batch);
    assert!(out[..4].iter().all(WriteOutcome::is_durable), "{out:?}");
    match &out[4] {
        WriteOutcome::Permanent(e) => assert_eq!(
            e.to_string(),
            "sink fanout: no fan-out route matches the message (no_match = reject)"
        ),
        o => panic!("unmatched message must not be durable: {o:?}"),
    }
    assert_eq!(files(&ta.0), 2, "a: seq 1 and 4");
    assert_eq!(files(&tb.0), 3, "b: seq 2, 3 and 4");
    assert_eq!(count(&m, "fanout_messages_routed_total"), 4);
    assert_eq!(count(&m, "fanout_child_sinks_selected_total"), 5);
    assert_eq!(count(&m, "fanout_required_child_success_total"), 5);
    assert_eq!(count(&m, "fanout_required_child_failure_total"), 0);
    assert_eq!(count(&m, "fanout_messages_acked_total"), 4);
    assert_eq!(count(&m, "fanout_messages_ack_blocked_total"), 1);
    assert_eq!(m.summaries()["fanout_ack_gate_wait_seconds"].count, 1);
}

#[test]
fn routing_disabled_or_all_required_writes_every_child() {
    let (ta, tb) = (TempDir::new("da"), TempDir::new("db"));
    let (sink, m) = file_fanout(&ta.0, &tb.0, json!({"enabled": false}));
    assert!(sink
        .write_batch(&[env("x", 1), env("y", 2)])
        .iter()
        .all(WriteOutcome::is_durable));
    assert_eq!((files(&ta.0), files(&tb.0)), (2, 2));
    assert_eq!(count(&m, "fanout_required_child_success_total"), 4);

    let (tc, td) = (TempDir::new("dc"), TempDir::new("dd"));
    let (sink, _) = file_fanout(
        &tc.0,
        &td.0,
        json!({"enabled": true, "unmatched": "all_required",
               "routes": [{"name": "a", "match": {"subject": "a"}, "targets": ["a"]}]}),
    );
    assert!(sink
        .write_batch(&[env("a", 1), env("zzz", 2)])
        .iter()
        .all(WriteOutcome::is_durable));
    assert_eq!((files(&tc.0), files(&td.0)), (2, 1));
}

#[test]
fn a_failing_required_file_child_blocks_ack() {
    let (ta, tb) = (TempDir::new("fa"), TempDir::new("fb"));
    let (sink, m) = file_fanout(&ta.0, &tb.0, json!({"enabled": false}));
    // Make child b's directory unusable after it was built: a regular file in its place.
    std::fs::remove_dir_all(&tb.0).unwrap();
    std::fs::write(&tb.0, b"not a directory").unwrap();
    let out = sink.write_batch(&[env("x", 1), env("x", 2)]);
    for o in &out {
        match o {
            WriteOutcome::Transient(e) => {
                assert!(e.message.starts_with("required child b: sink file:"), "{e}")
            }
            o => panic!("a required child failed: no durable outcome allowed, got {o:?}"),
        }
    }
    assert_eq!(
        files(&ta.0),
        2,
        "the healthy child still wrote (idempotent on redelivery)"
    );
    assert_eq!(count(&m, "fanout_required_child_success_total"), 2);
    assert_eq!(count(&m, "fanout_required_child_failure_total"), 2);
    assert_eq!(count(&m, "fanout_messages_acked_total"), 0);
    assert_eq!(count(&m, "fanout_messages_ack_blocked_total"), 2);
    std::fs::remove_file(&tb.0).unwrap();
}

#[test]
fn check_covers_every_child() {
    let ok = Scripted::new(0, Behavior::Durable);
    let bad = Arc::new(Scripted {
        delay: Duration::ZERO,
        behavior: Behavior::Durable,
        written: Mutex::new(Vec::new()),
        check_fails: true,
    });
    let r = routing(vec![("all", ">", vec![target("db", true, 0, 0)])]);
    let (sink, _) = fanout(vec![("db", ok.clone()), ("store", bad)], r.clone(), 4);
    assert_eq!(
        sink.check().unwrap_err().to_string(),
        "sink fanout: child store (scripted): sink scripted: unreachable"
    );
    let (sink, _) = fanout(vec![("db", ok.clone()), ("two", ok)], r, 4);
    assert_eq!(
        sink.check().unwrap(),
        "2 child sink(s) ready: db (scripted): ready; two (scripted): ready"
    );
}

// ---------------------------------------------------------------- the gate

#[test]
fn optional_child_slow_past_its_timeout_does_not_block_ack_and_is_counted() {
    let (release, hold) = crossbeam_channel::bounded::<()>(0);
    let fast = Scripted::new(0, Behavior::Durable);
    let slow = Scripted::new(0, Behavior::Hang(hold));
    let r = routing(vec![(
        "all",
        ">",
        vec![target("db", true, 0, 0), target("store", false, 100, 300)],
    )]);
    let (sink, m) = fanout(vec![("db", fast.clone()), ("store", slow.clone())], r, 4);
    let started = Instant::now();
    let out = sink.write_batch(&[env("a", 1), env("a", 2)]);
    assert_eq!(out, vec![WriteOutcome::Durable; 2]);
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "the minimum wait was granted"
    );
    assert!(
        slow.seqs().is_empty(),
        "ACK released while the optional write still runs"
    );
    assert_eq!(count(&m, "fanout_messages_acked_total"), 2);
    // The watcher counts the timeout once the 300 ms deadline passes, while the write runs.
    wait_for("the timeout count", || {
        count(&m, "fanout_optional_child_timeout_total") == 2
    });
    assert!(
        slow.seqs().is_empty(),
        "still running when the timeout was counted"
    );
    // When it finally finishes, its late result changes nothing.
    drop(release);
    wait_for("the slow write", || slow.seqs().len() == 2);
    wait_for("its thread to end", || {
        sink.children["store"]
            .optional_in_flight
            .load(Ordering::SeqCst)
            == 0
    });
    assert_eq!(count(&m, "fanout_optional_child_timeout_total"), 2);
    assert_eq!(count(&m, "fanout_optional_child_failure_total"), 0);
    assert_eq!(count(&m, "fanout_required_child_success_total"), 2);
    assert_eq!(fast.seqs(), vec![1, 2]);
}

#[test]
fn optional_child_within_its_minimum_wait_is_awaited_and_failures_counted() {
    let db = Scripted::new(0, Behavior::Durable);
    let store = Scripted::new(50, Behavior::Transient);
    let r = routing(vec![(
        "all",
        ">",
        vec![
            target("db", true, 0, 0),
            target("store", false, 60_000, 120_000),
        ],
    )]);
    let (sink, m) = fanout(vec![("db", db), ("store", store.clone())], r, 4);
    let started = Instant::now();
    let out = sink.write_batch(&[env("a", 1)]);
    let took = started.elapsed();
    assert_eq!(
        out,
        vec![WriteOutcome::Durable],
        "optional failure never blocks ACK"
    );
    assert!(
        took >= Duration::from_millis(50),
        "the gate awaited the optional result"
    );
    // A minimum wait of 60 s, far beyond any scheduling delay: returning before it proves the
    // gate released on the optional result, not on the minimum wait.
    assert!(
        took < Duration::from_secs(60),
        "released as soon as the optional finished, not after the 60 s minimum wait: {took:?}"
    );
    assert_eq!(
        store.seqs(),
        vec![1],
        "the optional write finished before the gate released"
    );
    assert_eq!(count(&m, "fanout_optional_child_failure_total"), 1);
    assert_eq!(count(&m, "fanout_optional_child_timeout_total"), 0);
    assert_eq!(count(&m, "fanout_messages_acked_total"), 1);
}

#[test]
fn hung_optional_child_costs_a_bounded_number_of_threads() {
    let (release, hold) = crossbeam_channel::bounded::<()>(0);
    let db = Scripted::new(0, Behavior::Durable);
    let hung = Scripted::new(0, Behavior::Hang(hold));
    let r = routing(vec![(
        "all",
        ">",
        vec![target("db", true, 0, 0), target("hung", false, 0, 50)],
    )]);
    let (sink, m) = fanout(vec![("db", db), ("hung", hung.clone())], r, 2);
    for seq in 1..=5 {
        assert_eq!(
            sink.write_batch(&[env("a", seq)]),
            vec![WriteOutcome::Durable]
        );
        // The child hangs until released below: returning at all proves the gate did not wait
        // for it (no clock needed).
    }
    // Two writes run (the limit); three were skipped at once and counted as timeouts; the two
    // running ones time out at 50 ms.
    assert_eq!(
        sink.children["hung"]
            .optional_in_flight
            .load(Ordering::SeqCst),
        2
    );
    wait_for("five timeouts", || {
        count(&m, "fanout_optional_child_timeout_total") == 5
    });
    drop(release); // unblocks the hung writes
    wait_for("the hung threads to end", || {
        sink.children["hung"]
            .optional_in_flight
            .load(Ordering::SeqCst)
            == 0
    });
    let mut written = hung.seqs();
    written.sort();
    assert_eq!(written, vec![1, 2], "only the first two were started");
    assert_eq!(count(&m, "fanout_optional_child_timeout_total"), 5);
}

#[test]
fn outcome_precedence_permanent_then_transient() {
    let r = |n: Vec<&str>| {
        routing(vec![(
            "all",
            ">",
            n.into_iter().map(|s| target(s, true, 0, 0)).collect(),
        )])
    };
    let (sink, m) = fanout(
        vec![
            ("t", Scripted::new(0, Behavior::Transient)),
            ("p", Scripted::new(0, Behavior::Permanent)),
            ("d", Scripted::new(0, Behavior::Durable)),
        ],
        r(vec!["t", "p", "d"]),
        4,
    );
    match &sink.write_batch(&[env("a", 1)])[0] {
        WriteOutcome::Permanent(e) => assert_eq!(
            e.to_string(),
            "sink fanout: required child p: sink scripted: rejected"
        ),
        o => panic!("{o:?}"),
    }
    assert_eq!(count(&m, "fanout_required_child_failure_total"), 2);
    assert_eq!(count(&m, "fanout_required_child_success_total"), 1);

    let (sink, _) = fanout(
        vec![
            ("t", Scripted::new(0, Behavior::Transient)),
            ("d", Scripted::new(0, Behavior::Durable)),
        ],
        r(vec!["d", "t"]),
        4,
    );
    assert!(matches!(
        &sink.write_batch(&[env("a", 1)])[0],
        WriteOutcome::Transient(e) if e.message == "required child t: sink scripted: down"
    ));
}

#[test]
fn a_panicking_required_child_is_transient() {
    let r = routing(vec![(
        "all",
        ">",
        vec![target("ok", true, 0, 0), target("boom", true, 0, 0)],
    )]);
    let (sink, m) = fanout(
        vec![
            ("ok", Scripted::new(0, Behavior::Durable)),
            ("boom", Scripted::new(0, Behavior::Panic)),
        ],
        r,
        4,
    );
    let out = sink.write_batch(&[env("a", 1), env("a", 2)]);
    assert!(
        out.iter().all(
            |o| matches!(o, WriteOutcome::Transient(e) if e.message.contains("child boom panicked"))
        ),
        "{out:?}"
    );
    assert_eq!(count(&m, "fanout_messages_ack_blocked_total"), 2);
}

#[test]
fn required_children_run_in_parallel() {
    // Each child only succeeds when both are inside write_batch at once.
    let meet = Arc::new((Mutex::new(0usize), std::sync::Condvar::new()));
    let a = Scripted::new(0, Behavior::Rendezvous(meet.clone(), 2));
    let b = Scripted::new(0, Behavior::Rendezvous(meet, 2));
    let r = routing(vec![(
        "all",
        ">",
        vec![target("a", true, 0, 0), target("b", true, 0, 0)],
    )]);
    let (sink, m) = fanout(vec![("a", a), ("b", b)], r, 4);
    let out = sink.write_batch(&[env("a", 1)]);
    assert_eq!(
        out,
        vec![WriteOutcome::Durable],
        "children ran one after the other"
    );
    let wait = m.summaries()["fanout_ack_gate_wait_seconds"];
    assert_eq!(wait.count, 1);
    assert!(wait.last > 0.0, "{wait:?}");
}

#[test]
fn a_subset_route_writes_only_its_messages_to_each_child() {
    let a = Scripted::new(0, Behavior::Durable);
    let b = Scripted::new(0, Behavior::Durable);
    let r = routing(vec![
        (
            "a",
            "x.*",
            vec![target("a", true, 0, 0), target("b", false, 0, 1000)],
        ),
        ("b", "y.*", vec![target("b", true, 0, 0)]),
    ]);
    let (sink, _) = fanout(vec![("a", a.clone()), ("b", b.clone())], r, 4);
    let out = sink.write_batch(&[env("x.1", 1), env("y.1", 2), env("x.2", 3)]);
    assert!(out.iter().all(WriteOutcome::is_durable));
    assert_eq!(a.seqs(), vec![1, 3]);
    wait_for("optional writes", || b.seqs().len() == 3);
    let mut got = b.seqs();
    got.sort();
    assert_eq!(got, vec![1, 2, 3]);
}

mod routing;
