//! The spool with real components: a real nats-server, `svc run` as a child process, and the
//! downstreams the spool exists for (an object store in moto behind an outage proxy,
//! PostgreSQL behind one, the HTTP sink's receiver, a file sink whose directory vanishes).
//!
//! What is proven:
//! - downstream down under live publishing: acknowledgements continue (the ack floor moves),
//!   the broker's backlog stays small, and once the downstream is back every message arrives,
//!   none lost, none twice in an idempotent sink, in stream order where the sink shows order;
//! - kill -9 during spool writes and during a drain, several times: nothing lost;
//! - a spool on a full disk (2 MiB tmpfs): NAKs, nothing lost, recovers;
//! - a segment damaged by hand: quarantined, reported, the rest delivered;
//! - two runners on one spool directory: the second is refused, as is `svc spool drain`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::broker::*;
use crate::support::moto::{Moto, OutageProxy};
use crate::support::postgres::TestDb;
use crate::support::process::*;
use crate::support::receiver::Receiver;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";

/// A publisher at a steady rate on its own thread, until stopped; returns how many it sent.
struct Publisher {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Publisher {
    fn start(server: &NatsServer, per_second: u64) -> Publisher {
        Self::start_padded(server, per_second, 0)
    }

    /// Messages with `pad` bytes of filler each.
    fn start_padded(server: &NatsServer, per_second: u64, pad: usize) -> Publisher {
        let nc = server.connect();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            while !s.load(Ordering::SeqCst) {
                let due = started.elapsed().as_secs_f64() * per_second as f64;
                while (n.load(Ordering::SeqCst) as f64) < due {
                    let i = n.fetch_add(1, Ordering::SeqCst) + 1;
                    let filler = "x".repeat(pad);
                    nc.publish(
                        "orders.created",
                        format!("{{\"order\":{i},\"pad\":\"{filler}\"}}"),
                    )
                    .unwrap();
                }
                nc.flush().unwrap();
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Publisher {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Stops and waits until the stream holds everything sent.
    fn finish(mut self, server: &NatsServer) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        let n = self.sent();
        wait_until(
            Duration::from_secs(30),
            "stream holds every message",
            || server.stream_messages(STREAM) >= n,
        );
        n
    }
}

fn broker() -> NatsServer {
    let server = NatsServer::start();
    server.create_stream(STREAM, &[SUBJECT]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(30));
    server
}

/// One sink worker, so direct delivery keeps the stream's order too.
fn config(server: &NatsServer, dir: &Path, sink: Value, spool: Option<Value>) -> PathBuf {
    let mut cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER, "subject": SUBJECT},
        "delivery": {"batch_size": 50, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 10,
                     "nak_backoff": {"mode": "fixed", "initial_ms": 200, "jitter": "none"}},
        "sink": sink,
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    if let Some(s) = spool {
        cfg["spool"] = s;
    }
    write_config(dir, "c.json", &cfg)
}

fn spool_block(dir: &Path, after_seconds: f64) -> Value {
    json!({"dir": dir.join("spool"), "max_bytes": 64 << 20, "after_seconds": after_seconds,
           "allow_unencrypted": true,
           "segment_bytes": 65536, "max_backoff_seconds": 1})
}

fn start(config: &Path, log: &Path, env: &HashMap<String, String>) -> Runner {
    Runner::start_env(config, log, env)
}

fn ack_floor(server: &NatsServer) -> u64 {
    server
        .try_consumer_state(STREAM, CONSUMER)
        .map_or(0, |s| s.0)
}

/// Messages the broker holds for the consumer: not yet delivered plus awaiting an ACK.
fn backlog(server: &NatsServer) -> u64 {
    server
        .try_consumer_state(STREAM, CONSUMER)
        .map_or(0, |s| s.1 as u64 + s.2)
}

fn stop(mut runner: Runner) {
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(30))
        .expect("exits after SIGTERM");
    assert!(status.success(), "clean exit: {}", runner.log_text());
}

fn snapshot_gauge(path: &Path, name: &str) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["gauges"][name].as_f64())
        .unwrap_or(-1.0)
}

/// A downstream that can be taken away and given back, and read back.
trait Downstream {
    fn sink(&self) -> Value;
    fn take_down(&mut self);
    fn bring_back(&mut self);
    /// Stream sequences delivered, in the order the downstream shows (arrival order where it
    /// keeps one), repeats included.
    fn delivered(&self) -> Vec<u64>;
    /// The downstream shows arrival order.
    fn ordered(&self) -> bool;
    /// The downstream keeps one copy per sequence whatever is written twice.
    fn idempotent(&self) -> bool;
    fn env(&self) -> HashMap<String, String> {
        HashMap::new()
    }
}

/// The scenario every downstream goes through: live publishing, an outage of a few seconds,
/// recovery. Returns the log of the runner for extra checks.
fn outage_under_live_publishing(d: &mut dyn Downstream, after_seconds: f64) {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &server,
        dir.path(),
        d.sink(),
        Some(spool_block(dir.path(), after_seconds)),
    );
    let snapshot = dir.path().join("metrics.json");
    let runner = start(&cfg, &dir.path().join("svc.log"), &d.env());
    let publisher = Publisher::start(&server, 300);
    wait_until(Duration::from_secs(30), "direct delivery acks", || {
        ack_floor(&server) >= 300
    });

    d.take_down();
    let down_at = publisher.sent();
    wait_until(Duration::from_secs(30), "spooling starts", || {
        snapshot_counter(&snapshot, "spool_appended_total") > 0
    });
    // While the downstream is down: the ack floor keeps moving and the backlog stays small.
    let floor = ack_floor(&server);
    let mut worst = 0;
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        worst = worst.max(backlog(&server));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        ack_floor(&server) >= floor + 600,
        "acks continue while the downstream is down: {floor} -> {}",
        ack_floor(&server)
    );
    // 4 s of publishing is 1,200 messages: a spool that stopped taking them would pass that.
    // Smaller bounds failed on a loaded 2-core host (562 and 713) with the spool keeping up.
    assert!(worst < 1000, "the broker's backlog grew to {worst}");
    assert!(publisher.sent() > down_at + 1000);
    assert!(snapshot_gauge(&snapshot, "spool_records") > 0.0);

    d.bring_back();
    std::thread::sleep(Duration::from_secs(2));
    let n = publisher.finish(&server);
    wait_until(
        Duration::from_secs(90),
        "every message acknowledged",
        || ack_floor(&server) >= n,
    );
    // Generous: moto takes about 480 PUTs a second, fewer on a loaded host (90 s timed out
    // twice with four builds beside it; the drain itself was moving).
    wait_until(Duration::from_secs(240), "the spool drained", || {
        let got: BTreeSet<u64> = d.delivered().into_iter().collect();
        got.len() as u64 >= n && snapshot_gauge(&snapshot, "spool_records") == 0.0
    });
    let delivered = d.delivered();
    let unique: BTreeSet<u64> = delivered.iter().copied().collect();
    assert_eq!(
        unique,
        (1..=n).collect::<BTreeSet<u64>>(),
        "every message, none lost"
    );
    if d.idempotent() {
        assert_eq!(
            delivered.len() as u64,
            n,
            "no duplicate in an idempotent sink"
        );
    }
    if d.ordered() {
        let mut seen = BTreeSet::new();
        let first: Vec<u64> = delivered.into_iter().filter(|s| seen.insert(*s)).collect();
        let inversion = first.windows(2).position(|w| w[0] > w[1]);
        assert!(
            inversion.is_none(),
            "delivered in stream order; first inversion: {:?}",
            inversion.map(|i| &first[i.saturating_sub(3)..(i + 4).min(first.len())])
        );
    }
    assert!(snapshot_counter(&snapshot, "spool_drained_total") > 0);
    let log = runner.log_text();
    assert!(log.contains("drained; back to direct delivery"), "{log}");
    stop(runner);
}

/// The object store in moto behind an outage proxy (keys by stream sequence, If-None-Match).
struct ObjectStore {
    moto: Moto,
    proxy: OutageProxy,
}

impl Downstream for ObjectStore {
    fn sink(&self) -> Value {
        json!({"type": "object_store", "bucket": "spool", "endpoint_url": self.proxy.endpoint(),
               "allow_http_for_local_testing": true, "credential_mode": "environment",
               "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
               "key_strategy": "stream_sequence", "max_retries": 1, "retry_backoff_ms": 20,
               "request_timeout_seconds": 2})
    }
    fn take_down(&mut self) {
        self.proxy.take_down();
    }
    fn bring_back(&mut self) {
        self.proxy.bring_up();
    }
    fn delivered(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (key, versions) in self.moto.versions("spool") {
            // stream-sequence/ORDERS/<incarnation>/<seq>.json
            let seq = key.rsplit('/').next().unwrap().trim_end_matches(".json");
            for _ in 0..versions {
                out.push(seq.parse().unwrap());
            }
        }
        out
    }
    fn ordered(&self) -> bool {
        false
    }
    fn idempotent(&self) -> bool {
        true
    }
    fn env(&self) -> HashMap<String, String> {
        self.moto.env()
    }
}

#[test]
fn object_store_outage_spools_then_every_object_lands_once() {
    let moto = Moto::start();
    moto.create_bucket("spool", true);
    let proxy = OutageProxy::start(moto.port);
    outage_under_live_publishing(&mut ObjectStore { moto, proxy }, 1.0);
}

/// PostgreSQL behind an outage proxy (rows keyed by stream and sequence).
struct Postgres {
    db: TestDb,
    proxy: OutageProxy,
}

impl Downstream for Postgres {
    fn sink(&self) -> Value {
        let mut v = self.db.sink(json!({}));
        v["dsn"] = format!(
            "postgresql://postgres@127.0.0.1:{}/{}",
            self.proxy.port, self.db.name
        )
        .into();
        v
    }
    fn take_down(&mut self) {
        self.proxy.take_down();
    }
    fn bring_back(&mut self) {
        self.proxy.bring_up();
    }
    fn delivered(&self) -> Vec<u64> {
        let table = self.db.sink(json!({}))["table"]
            .as_str()
            .unwrap_or("svc_events")
            .to_string();
        self.db
            .conn()
            .query(
                &format!("SELECT stream_sequence FROM {table} ORDER BY stream_sequence"),
                &[],
            )
            .map(|r| {
                r.rows
                    .iter()
                    .map(|row| row[0].as_deref().unwrap().parse().unwrap())
                    .collect()
            })
            .unwrap_or_default()
    }
    fn ordered(&self) -> bool {
        false
    }
    fn idempotent(&self) -> bool {
        true
    }
}

#[test]
fn postgres_outage_spools_then_every_row_lands_once() {
    let db = TestDb::new("spool");
    let proxy = OutageProxy::start(5432);
    let pg = Postgres { db, proxy };
    let (code, out, err) = svc(&[
        "init-db",
        config(
            &broker(),
            tempfile::tempdir().unwrap().path(),
            pg.sink(),
            None,
        )
        .to_str()
        .unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let mut pg = pg;
    outage_under_live_publishing(&mut pg, 1.0);
}

/// The HTTP sink's receiver, killed and started again on the same port.
/// The HTTP sink's receiver, taken down and brought back on the same port.
struct Http(Receiver);

impl Http {
    fn start(dir: &Path) -> Http {
        Http(Receiver::start(dir, &[]))
    }
}

impl Downstream for Http {
    fn sink(&self) -> Value {
        json!({"type": "http", "url": self.0.url(),
               "allow_http_for_local_testing": true, "request_timeout_seconds": 2,
               "retry_backoff_ms": 50, "retry_max_backoff_ms": 100, "retry_budget_seconds": 1,
               // One request at a time: the sink itself then keeps the order it is given.
               "max_concurrent_requests": 1})
    }
    fn take_down(&mut self) {
        self.0.kill();
    }
    fn bring_back(&mut self) {
        self.0.launch();
    }
    fn delivered(&self) -> Vec<u64> {
        self.0
            .records(200)
            .iter()
            .filter_map(|r| r["stream_sequence"].as_u64())
            .collect()
    }
    fn ordered(&self) -> bool {
        true
    }
    fn idempotent(&self) -> bool {
        false
    }
}

#[test]
fn http_receiver_outage_spools_then_everything_arrives_in_stream_order() {
    let dir = tempfile::tempdir().unwrap();
    // Spooling at the first failure: no message is NAKed (a NAKed one would come back after
    // later ones), so the receiver must see the stream's order.
    outage_under_live_publishing(&mut Http::start(dir.path()), 0.0);
}

/// A file sink (one file per event, named by stream sequence) whose directory is moved away.
struct Files {
    dir: PathBuf,
    away: PathBuf,
}

impl Downstream for Files {
    fn sink(&self) -> Value {
        json!({"type": "file", "directory": self.dir, "mode": "per_event",
               "key_strategy": "stream_sequence"})
    }
    fn take_down(&mut self) {
        std::fs::rename(&self.dir, &self.away).unwrap();
    }
    fn bring_back(&mut self) {
        std::fs::rename(&self.away, &self.dir).unwrap();
    }
    fn delivered(&self) -> Vec<u64> {
        files_below(&self.dir)
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .filter_map(|p| {
                let text = std::fs::read_to_string(self.dir.join(p)).ok()?;
                serde_json::from_str::<Value>(&text).ok()?["stream_sequence"].as_u64()
            })
            .collect()
    }
    fn ordered(&self) -> bool {
        false
    }
    fn idempotent(&self) -> bool {
        true
    }
}

fn files_in(root: &Path) -> Files {
    let dir = root.join("out");
    std::fs::create_dir(&dir).unwrap();
    Files {
        dir,
        away: root.join("out.away"),
    }
}

#[test]
fn file_sink_directory_gone_spools_then_every_file_lands_once() {
    let root = tempfile::tempdir().unwrap();
    outage_under_live_publishing(&mut files_in(root.path()), 1.0);
}

/// Every sequence from 1 to `n` has its file, and nothing else is there.
fn assert_every_file(files: &Files, n: u64) {
    let got = files.delivered();
    let unique: BTreeSet<u64> = got.iter().copied().collect();
    assert_eq!(unique, (1..=n).collect::<BTreeSet<u64>>(), "none lost");
    assert_eq!(got.len() as u64, n, "one file per message");
}

/// The object store rather than the file sink here: a restarted runner makes a missing
/// output directory again (the file sink's start-up), which would end the outage.
#[test]
fn kill_9_during_spool_writes_and_during_drains_loses_nothing() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start();
    moto.create_bucket("spool", true);
    let proxy = OutageProxy::start(moto.port);
    let mut store = ObjectStore { moto, proxy };
    let cfg = config(
        &server,
        dir.path(),
        store.sink(),
        Some(spool_block(dir.path(), 0.0)),
    );
    let snapshot = dir.path().join("metrics.json");
    let env = store.env();
    let mut runs = 0;
    let mut run = || {
        runs += 1;
        let _ = std::fs::remove_file(&snapshot);
        start(&cfg, &dir.path().join(format!("svc-{runs}.log")), &env)
    };
    let publisher = Publisher::start(&server, 200);
    let mut runner = run();
    wait_until(Duration::from_secs(30), "direct delivery", || {
        ack_floor(&server) >= 200
    });
    store.take_down();
    // Killed while appending to the spool (the downstream is gone, every batch is spooled).
    for pause_ms in [700, 450, 900] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while snapshot_counter(&snapshot, "spool_appended_total") == 0 {
            assert!(
                Instant::now() < deadline,
                "no spooling: {}",
                runner.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(pause_ms));
        runner.sigkill();
        runner = run();
    }
    std::thread::sleep(Duration::from_secs(3));
    // Killed while draining into the store, back again.
    store.bring_back();
    for _ in 0..3 {
        wait_until(Duration::from_secs(60), "draining", || {
            snapshot_counter(&snapshot, "spool_drained_total") > 0
        });
        runner.sigkill();
        runner = run();
    }
    let n = publisher.finish(&server);
    wait_until(
        Duration::from_secs(120),
        "every message acknowledged",
        || ack_floor(&server) >= n,
    );
    wait_until(Duration::from_secs(180), "every object stored", || {
        store.delivered().len() as u64 >= n && snapshot_gauge(&snapshot, "spool_records") == 0.0
    });
    let got = store.delivered();
    let unique: BTreeSet<u64> = got.iter().copied().collect();
    assert_eq!(unique, (1..=n).collect::<BTreeSet<u64>>(), "none lost");
    assert_eq!(got.len() as u64, n, "no object written twice");
    let logs: String = (1..=runs)
        .map(|i| {
            std::fs::read_to_string(dir.path().join(format!("svc-{i}.log"))).unwrap_or_default()
        })
        .collect();
    assert!(logs.contains("records waiting"), "{logs}");
    stop(runner);
}

/// A small tmpfs, unmounted on drop.
pub(crate) struct SmallFs(PathBuf);

impl SmallFs {
    pub(crate) fn mount(at: &Path, size: &str) -> SmallFs {
        std::fs::create_dir(at).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs (the tests run as root)");
        SmallFs(at.to_path_buf())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_spool_disk_naks_loses_nothing_and_recovers() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let mut files = files_in(dir.path());
    let fs = SmallFs::mount(&dir.path().join("small"), "2m");
    let mut spool = spool_block(&fs.0, 0.0);
    spool["segment_bytes"] = json!(131072);
    let cfg = config(&server, dir.path(), files.sink(), Some(spool));
    let snapshot = dir.path().join("metrics.json");
    let runner = start(&cfg, &dir.path().join("svc.log"), &HashMap::new());
    let publisher = Publisher::start_padded(&server, 300, 1500);
    wait_until(Duration::from_secs(30), "direct delivery", || {
        ack_floor(&server) >= 300
    });
    files.take_down();
    wait_until(Duration::from_secs(60), "the spool's disk is full", || {
        runner.log_text().contains("No space left on device")
    });
    // Full: nothing more is acknowledged, every message stays with the broker (NAKed).
    std::thread::sleep(Duration::from_secs(1));
    let floor = ack_floor(&server);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(ack_floor(&server), floor, "no ACK without a durable copy");
    assert!(snapshot_counter(&snapshot, "messages_nacked_total") > 0);

    files.bring_back();
    let n = publisher.finish(&server);
    wait_until(
        Duration::from_secs(120),
        "every message acknowledged",
        || ack_floor(&server) >= n,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while (files.delivered().len() as u64) < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} files; {}",
            files.delivered().len(),
            runner.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_every_file(&files, n);
    stop(runner);
    drop(fs);
}

/// `sink.type: spool` (encrypted at rest) with a file sink as the drain's target.
fn spool_sink_config(server: &NatsServer, dir: &Path, files: &Files) -> PathBuf {
    let sink = json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
                      "encryption": spool_key(dir, "k1", 1),
                      "target": files.sink()});
    config(server, dir, sink, None)
}

#[test]
fn a_segment_damaged_by_hand_is_quarantined_and_the_rest_delivered() {
    use std::os::unix::fs::PermissionsExt;
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let cfg = spool_sink_config(&server, dir.path(), &files);
    let cfg_arg = cfg.to_str().unwrap();
    server.publish_n(STREAM, "orders.created", 200, |i| {
        format!("{{\"order\":{}}}", i + 1).into_bytes()
    });
    let runner = start(&cfg, &dir.path().join("svc.log"), &HashMap::new());
    wait_until(Duration::from_secs(30), "all spooled and acked", || {
        ack_floor(&server) >= 200
    });
    stop(runner);
    assert!(files.delivered().is_empty(), "the spool sink only spools");

    let spool = dir.path().join("spool");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&spool), 0o700);
    let segment = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "spool"))
        .expect("a segment");
    assert_eq!(mode(&segment), 0o600);

    let (code, out, err) = svc(&["spool", "status", cfg_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("records: 200\n"), "{out}");
    let (code, out, _) = svc(&["spool", "inspect", cfg_arg]);
    assert_eq!(code, 0);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 201, "a line per record, then the summary");
    assert!(lines[..200].iter().all(|l| l["state"] == "waiting"));
    assert_eq!(lines[200]["state"], "summary");
    assert_eq!(lines[0]["stream_sequence"], 1);
    assert!(lines[0].get("payload").is_none(), "no payload unless asked");
    let (_, out, _) = svc(&["spool", "inspect", cfg_arg, "--payload"]);
    assert!(
        out.lines()
            .next()
            .unwrap()
            .contains("\"payload\":{\"order\":1}"),
        "{out}"
    );

    // One byte in the middle of the segment flipped by hand.
    let mut data = std::fs::read(&segment).unwrap();
    let at = data.len() / 2;
    data[at] ^= 0x5a;
    std::fs::write(&segment, &data).unwrap();
    let (_, out, _) = svc(&["spool", "status", cfg_arg]);
    assert!(out.contains("records: 199\n"), "{out}");
    assert!(out.contains("damaged_not_yet_quarantined: 1\n"), "{out}");

    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("199 records delivered"), "{out}");
    assert!(err.contains("moved to quarantine-"), "reported: {err}");
    let (_, out, _) = svc(&["spool", "status", cfg_arg]);
    assert!(out.contains("records: 0\n"), "{out}");
    assert!(out.contains("quarantined_files: 1\n"), "{out}");
    let got: BTreeSet<u64> = files.delivered().into_iter().collect();
    assert_eq!(got.len(), 199);
    assert!(got.iter().all(|s| (1..=200).contains(s)));
    let quarantined = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "bad"))
        .expect("a quarantine file");
    assert_eq!(mode(&quarantined), 0o600);
}

#[test]
fn a_second_runner_or_drain_on_the_same_spool_is_refused() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let cfg = config(
        &server,
        dir.path(),
        files.sink(),
        Some(spool_block(dir.path(), 1.0)),
    );
    let first = start(&cfg, &dir.path().join("svc-1.log"), &HashMap::new());
    wait_until(
        Duration::from_secs(20),
        "the first runner holds the spool",
        || first.log_text().contains("records waiting"),
    );
    let mut second = start(&cfg, &dir.path().join("svc-2.log"), &HashMap::new());
    let status = second
        .wait_timeout(Duration::from_secs(20))
        .expect("the second runner stops at once");
    assert_eq!(status.code(), Some(1));
    assert!(
        second.log_text().contains("another process"),
        "{}",
        second.log_text()
    );
    let cfg_arg = cfg.to_str().unwrap();
    let (code, _, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 1);
    assert!(err.contains("another process"), "{err}");
    let (code, out, err) = svc(&["spool", "status", cfg_arg]);
    assert_eq!(code, 0, "status reads beside a runner: {err}");
    assert!(out.contains("records: 0\n"), "{out}");
    stop(first);
}

/// The HTTP sink one record per request, no retry in the call: the receiver's refusal of the
/// marked record is a permanent outcome of that record alone.
fn http_target(receiver: &Receiver) -> Value {
    json!({"type": "http", "url": receiver.url(), "allow_http_for_local_testing": true,
           "batching": "none", "retry_budget_seconds": 0, "request_timeout_seconds": 5})
}

/// The sequence the receiver refuses: in the first drain step, so the drain position's first
/// write after the opening one is that step's.
const POISON: u64 = 5;

/// 60 messages spooled by a runner with `sink.type: spool` (drain steps of 8 records), the
/// [`POISON`]th marked for the receiver to refuse (400).
fn spool_sixty_with_a_poison(
    server: &NatsServer,
    dir: &Path,
    spool_dir: &Path,
    receiver: &Receiver,
) -> PathBuf {
    // Encrypted at rest: the rejected files hold sealed frames, read back by their names.
    let sink = json!({"type": "spool", "dir": spool_dir, "max_bytes": 1 << 20,
                      "encryption": spool_key(dir, "k1", 1),
                      "drain_batch": 8, "target": http_target(receiver)});
    let cfg = config(server, dir, sink, None);
    server.publish_n(STREAM, "orders.created", 60, |i| {
        let order = if i as u64 + 1 == POISON {
            json!("POISON")
        } else {
            json!(i + 1)
        };
        json!({ "order": order }).to_string().into_bytes()
    });
    let runner = start(&cfg, &dir.join("svc.log"), &HashMap::new());
    wait_until(Duration::from_secs(30), "all spooled and acked", || {
        ack_floor(server) >= 60
    });
    stop(runner);
    cfg
}

/// Sequences the receiver accepted (200), repeats included.
fn accepted(receiver: &Receiver) -> Vec<u64> {
    receiver
        .records(200)
        .iter()
        .filter_map(|r| r["stream_sequence"].as_u64())
        .collect()
}

/// The spool's rejected files and the records (frames) each holds.
fn rejected_files(spool: &Path) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = std::fs::read_dir(spool)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rejected-"))
        .map(|n| {
            let data = std::fs::read(spool.join(&n)).unwrap();
            let marks = data
                .windows(4)
                .filter(|w| *w == [0xF5, b'S', b'R', 0x0A])
                .count();
            (n, marks)
        })
        .collect();
    out.sort();
    out
}

/// After the interrupted drain: a plain `svc spool drain` delivers every accepted record (at
/// most the one repeated step twice), keeps the refused one in one rejected file, and leaves
/// the spool empty; a further drain has nothing to do.
fn assert_a_drain_finishes(cfg: &Path, spool: &Path, receiver: &Receiver) {
    let cfg_arg = cfg.to_str().unwrap();
    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(
        code, 0,
        "the drain after the interruption completes: {out}{err}"
    );
    let got = accepted(receiver);
    let unique: BTreeSet<u64> = got.iter().copied().collect();
    let want: BTreeSet<u64> = (1..=60).filter(|s| *s != POISON).collect();
    assert_eq!(unique, want, "every accepted record delivered");
    assert!(
        got.len() <= 59 + 7,
        "repeats at most the refusing step: {}",
        got.len()
    );
    assert_eq!(
        rejected_files(spool),
        vec![(dir_name_of_rejection(spool), 1)],
        "the refused record kept once, whole"
    );
    let (_, out, _) = svc(&["spool", "status", cfg_arg]);
    assert!(out.contains("records: 0\n"), "{out}");
    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(" 0 records delivered"), "{out}");
    assert_eq!(
        accepted(receiver).len(),
        got.len(),
        "nothing delivered twice later"
    );
}

fn dir_name_of_rejection(spool: &Path) -> String {
    rejected_files(spool)
        .first()
        .map(|(n, _)| n.clone())
        .unwrap_or_default()
}

/// Kill -9 (strace: the drain position's second write, the first after the drain began, fails
/// and SIGKILL follows at once) in the drain step that kept a refused record: the next drain
/// finds the complete rejected file, counts it as kept and goes on.
#[test]
fn kill_9_in_a_drain_step_with_a_refused_record_then_a_drain_delivers_everything_once() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), &["--mode", "reject_marker"]);
    let spool = dir.path().join("spool");
    let cfg = spool_sixty_with_a_poison(&server, dir.path(), &spool, &receiver);
    let trace = dir.path().join("strace.txt");
    let status = Command::new("strace")
        .args(["-f", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=pwrite64",
            "-e",
            "inject=pwrite64:error=EIO:signal=SIGKILL:when=2",
            env!("CARGO_BIN_EXE_svc"),
            "spool",
            "drain",
        ])
        .arg(&cfg)
        .output()
        .expect("strace (Debian package strace)");
    let text = std::fs::read_to_string(&trace).unwrap_or_default();
    assert!(
        text.contains("+++ killed by SIGKILL"),
        "killed: {text}\n{status:?}"
    );
    assert!(
        !rejected_files(&spool).is_empty(),
        "killed after the refusal was kept"
    );
    assert!(
        accepted(&receiver).len() < 59,
        "killed before the drain finished: {}",
        accepted(&receiver).len()
    );
    assert_a_drain_finishes(&cfg, &spool, &receiver);
}

/// The spool's disk full when the refused record is written: that drain stops with the
/// reason, and once there is room again a drain keeps it and delivers the rest.
#[test]
fn a_full_disk_while_keeping_a_refused_record_then_a_drain_delivers_everything_once() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path(), &["--mode", "reject_marker"]);
    let fs = SmallFs::mount(&dir.path().join("small"), "2m");
    let spool = fs.0.join("spool");
    let cfg = spool_sixty_with_a_poison(&server, dir.path(), &spool, &receiver);
    let filler = fs.0.join("filler");
    fill(&filler);
    let (code, out, err) = svc(&["spool", "drain", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        std::fs::read_dir(&spool).unwrap().count() > 0 && accepted(&receiver).len() < 59,
        "stopped at the refusal"
    );
    std::fs::remove_file(&filler).unwrap();
    assert_a_drain_finishes(&cfg, &spool, &receiver);
    drop(fs);
}

/// Writes `path` until the disk refuses (ENOSPC).
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 4096];
    loop {
        match f.write_all(&block) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("fill {}: {e}", path.display()),
        }
    }
    let _ = f.sync_all();
}

/// 50 messages spooled by `sink.type: spool` (a file target), the runner stopped; returns the
/// config, the file target and the one segment.
fn fifty_spooled(server: &NatsServer, dir: &Path) -> (PathBuf, Files, PathBuf) {
    let files = files_in(dir);
    let cfg = spool_sink_config(server, dir, &files);
    server.publish_n(STREAM, "orders.created", 50, |i| {
        format!("{{\"order\":{}}}", i + 1).into_bytes()
    });
    let runner = start(&cfg, &dir.join("svc.log"), &HashMap::new());
    wait_until(Duration::from_secs(30), "all spooled and acked", || {
        ack_floor(server) >= 50
    });
    stop(runner);
    let segment = std::fs::read_dir(dir.join("spool"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "spool"))
        .expect("a segment");
    (cfg, files, segment)
}

fn flip(file: &Path, at: impl Fn(usize) -> usize) {
    let mut data = std::fs::read(file).unwrap();
    let i = at(data.len());
    data[i] ^= 0x20;
    std::fs::write(file, &data).unwrap();
}

fn quarantine_files(spool: &Path) -> Vec<Vec<u8>> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bad"))
        .collect();
    names.sort();
    names.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// One flipped byte in a segment's header: every record is still delivered, the damaged
/// header bytes are quarantined and counted.
#[test]
fn a_flipped_segment_header_byte_loses_no_record() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, files, segment) = fifty_spooled(&server, dir.path());
    flip(&segment, |_| 3);
    let cfg_arg = cfg.to_str().unwrap();
    let (_, out, _) = svc(&["spool", "status", cfg_arg]);
    assert!(out.contains("records: 50\n"), "{out}");
    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("50 records delivered"), "{out}{err}");
    assert_every_file(&files, 50);
    let q = quarantine_files(&dir.path().join("spool"));
    assert_eq!(
        q,
        vec![b"SVCsPL01".to_vec()],
        "the header bytes quarantined"
    );
}

/// One flipped byte in the body of the last record (its declared length fits in the file):
/// quarantined and counted, never cut off as a torn tail; the other 49 delivered.
#[test]
fn a_flipped_byte_in_the_last_record_is_quarantined_not_cut() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, files, segment) = fifty_spooled(&server, dir.path());
    let whole = std::fs::read(&segment).unwrap();
    let last = whole
        .windows(4)
        .rposition(|w| w == [0xF5, b'S', b'R', 0x0A])
        .unwrap();
    flip(&segment, |len| len - 3);
    let (code, out, err) = svc(&["spool", "drain", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("49 records delivered"), "{out}{err}");
    assert!(!err.contains("torn tail"), "{err}");
    assert!(err.contains("moved to quarantine-"), "{err}");
    let mut damaged = whole[last..].to_vec();
    let n = damaged.len();
    damaged[n - 3] ^= 0x20;
    let q = quarantine_files(&dir.path().join("spool"));
    assert_eq!(q, vec![damaged], "the whole damaged record kept");
    let got: BTreeSet<u64> = files.delivered().into_iter().collect();
    assert_eq!(got, (1..=49).collect::<BTreeSet<u64>>());
}

/// A segment whose first write hit ENOSPC (a full 2 MiB tmpfs) is used once there is room
/// again: before any of its records is acknowledged, the spool directory is fsynced, so the
/// segment's name is durable (strace of the runner: an `fsync` of the directory between the
/// disk's return and the first `+ACK`).
#[test]
fn a_segment_whose_first_write_hit_enospc_has_its_name_fsynced_before_the_ack() {
    use crate::durability::Injector;
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let fs = SmallFs::mount(&dir.path().join("small"), "2m");
    let spool = fs.0.join("spool");
    let sink = json!({"type": "spool", "dir": spool, "max_bytes": 1 << 20,
                      "allow_unencrypted": true,
                      "target": files.sink()});
    let cfg = config(&server, dir.path(), sink, None);
    let mut runner = start(&cfg, &dir.path().join("svc.log"), &HashMap::new());
    wait_until(
        Duration::from_secs(20),
        "the runner holds the spool",
        || runner.log_text().contains("bound to consumer"),
    );
    let filler = fs.0.join("filler");
    fill(&filler);
    server.publish_n(STREAM, "orders.created", 20, |i| {
        format!("{{\"order\":{}}}", i + 1).into_bytes()
    });
    wait_until(
        Duration::from_secs(30),
        "the first write hits ENOSPC",
        || runner.log_text().contains("No space left on device"),
    );
    assert_eq!(ack_floor(&server), 0, "nothing acked on a full disk");
    let trace_dir = dir.path().join("trace");
    std::fs::create_dir(&trace_dir).unwrap();
    let mut inj = Injector::attach(
        runner.child.id(),
        &trace_dir,
        "fsync,fdatasync,write,writev,sendto,sendmsg",
        &[],
    );
    std::fs::remove_file(&filler).unwrap();
    wait_until(Duration::from_secs(30), "acked once there is room", || {
        ack_floor(&server) >= 20
    });
    inj.detach();
    let trace = inj.trace_text();
    let first_ack = trace
        .lines()
        .position(|l| l.contains("+ACK"))
        .unwrap_or_else(|| panic!("no +ACK in the trace: {trace}"));
    let dir_sync = "fsync(";
    let spool_dir = format!("<{}>", spool.display());
    // strace -f splits a call another thread interrupts into `<unfinished ...>` and a
    // `resumed` line; a sync begun before the ACK and not failed counts (the ACK comes after
    // the sync returned).
    let done = |l: &str| {
        let l = l.trim_end();
        l.ends_with("= 0") || l.ends_with("<unfinished ...>")
    };
    let synced = trace
        .lines()
        .take(first_ack)
        .any(|l| l.contains(dir_sync) && l.contains(&spool_dir) && done(l));
    let segment_synced = trace
        .lines()
        .take(first_ack)
        .any(|l| l.contains("fdatasync(") && l.contains("segment-") && done(l));
    assert!(
        segment_synced,
        "the segment's data fsynced before the ACK: {trace}"
    );
    assert!(
        synced,
        "the spool directory fsynced before the first ACK: {trace}"
    );
    runner.signal("TERM");
    let _ = runner.wait_timeout(Duration::from_secs(30));
    drop(fs);
}

/// `svc spool inspect --payload` streams: its peak memory (`/usr/bin/time -f %M`) stays near
/// one segment's bytes on a 64 MiB spool (8 segments of 8 MiB, the frames of 200 real
/// records repeated), where collecting the lines first held every payload at once.
#[test]
fn spool_inspect_streams_in_the_memory_of_one_segment() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let cfg = spool_sink_config(&server, dir.path(), &files);
    let pad = "x".repeat(1000);
    server.publish_n(STREAM, "orders.created", 200, |i| {
        format!("{{\"order\":{},\"pad\":\"{pad}\"}}", i + 1).into_bytes()
    });
    let runner = start(&cfg, &dir.path().join("svc.log"), &HashMap::new());
    wait_until(Duration::from_secs(30), "all spooled and acked", || {
        ack_floor(&server) >= 200
    });
    stop(runner);
    let spool = dir.path().join("spool");
    let segment = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "spool"))
        .unwrap();
    let data = std::fs::read(&segment).unwrap();
    let frames = &data[8..];
    let mut big = data[..8].to_vec();
    while big.len() < 8 << 20 {
        big.extend_from_slice(frames);
    }
    let per_segment = (big.len() - 8) / frames.len() * 200;
    let first = svc_segment_id(&segment);
    for id in first..first + 8 {
        use std::os::unix::fs::OpenOptionsExt;
        let path = spool.join(format!("segment-{id:016}.spool"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .unwrap();
        std::io::Write::write_all(&mut f, &big).unwrap();
    }
    let out = Command::new("/usr/bin/time")
        .args([
            "-f",
            "peak_kib=%M",
            env!("CARGO_BIN_EXE_svc"),
            "spool",
            "inspect",
        ])
        .arg(&cfg)
        .arg("--payload")
        .output()
        .expect("/usr/bin/time (Debian package time)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines = text
        .lines()
        .filter(|l| l.contains("\"state\":\"waiting\""))
        .count();
    assert_eq!(lines, 8 * per_segment, "every record printed");
    let err = String::from_utf8_lossy(&out.stderr);
    let peak: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("peak_kib="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak in {err}"));
    // The output is about 64 MiB; one segment is 8 MiB.
    assert!(
        peak < 40 * 1024,
        "peak RSS {peak} KiB for {} bytes of output",
        out.stdout.len()
    );
}

fn svc_segment_id(path: &Path) -> u64 {
    let name = path.file_name().unwrap().to_str().unwrap();
    name["segment-".len().."segment-".len() + 16]
        .parse()
        .unwrap()
}

/// SIGTERM while the drain is in a sink write that retries for its whole budget (an HTTP
/// receiver answering 503 with Retry-After, a 60 s retry budget): the runner exits within
/// `delivery.shutdown_timeout_seconds` (3 s here) and every record stays spooled.
#[test]
fn sigterm_stops_the_drain_within_the_shutdown_timeout() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let spool_cfg = spool_sink_config(&server, dir.path(), &files);
    server.publish_n(STREAM, "orders.created", 30, |i| {
        format!("{{\"order\":{}}}", i + 1).into_bytes()
    });
    let runner = start(&spool_cfg, &dir.path().join("svc-1.log"), &HashMap::new());
    wait_until(Duration::from_secs(30), "all spooled", || {
        ack_floor(&server) >= 30
    });
    stop(runner);

    let receiver = Receiver::start(dir.path(), &["--mode", "retry_after", "--count", "1000000"]);
    let sink = json!({"type": "http", "url": receiver.url(), "allow_http_for_local_testing": true,
                      "retry_budget_seconds": 60, "request_timeout_seconds": 5});
    // The same key as the spool sink's: the records are sealed under it.
    let spool = json!({"dir": dir.path().join("spool"), "max_bytes": 1 << 20,
                       "encryption": spool_key(dir.path(), "k1", 1),
                       "after_seconds": 0});
    let cfg = config(&server, dir.path(), sink, Some(spool));
    let mut text: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    text["delivery"]["shutdown_timeout_seconds"] = json!(3);
    let cfg = write_config(dir.path(), "fallback.json", &text);
    let mut runner = start(&cfg, &dir.path().join("svc-2.log"), &HashMap::new());
    wait_until(
        Duration::from_secs(30),
        "the drain writes to the receiver",
        || !receiver.requests().is_empty(),
    );
    std::thread::sleep(Duration::from_secs(1));
    let asked = Instant::now();
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(90))
        .expect("exits after SIGTERM");
    let took = asked.elapsed();
    assert!(status.success(), "{}", runner.log_text());
    assert!(
        took < Duration::from_secs(8),
        "exit took {took:?} with a 3 s shutdown timeout: {}",
        runner.log_text()
    );
    let (_, out, _) = svc(&["spool", "status", cfg.to_str().unwrap()]);
    assert!(
        out.contains("records: 30\n"),
        "every record still spooled: {out}"
    );
}

/// Damage found when the disk is full cannot be quarantined: the drain stops there ("drain
/// stuck") instead of moving past bytes it could not keep; with room again the damaged
/// record is quarantined and the other 49 delivered.
#[test]
fn damage_that_cannot_be_quarantined_stops_the_drain_until_it_can() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let fs = SmallFs::mount(&dir.path().join("spool"), "2m");
    let (cfg, files, segment) = fifty_spooled(&server, dir.path());
    flip(&segment, |len| len / 2);
    let filler = fs.0.join("filler");
    fill(&filler);
    let cfg_arg = cfg.to_str().unwrap();
    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("drain stuck"), "{err}");
    assert!(quarantine_files(&fs.0).is_empty());
    std::fs::remove_file(&filler).unwrap();
    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(quarantine_files(&fs.0).len(), 1, "the damage kept: {err}");
    let got: BTreeSet<u64> = files.delivered().into_iter().collect();
    assert_eq!(got.len(), 49, "the other records delivered");
    drop(fs);
}

/// A spool directory the runner creates itself has its entry in the parent fsynced before the
/// runner binds (under the crash model a power cut could otherwise lose the whole spool with
/// every record ACKed into it): strace shows the `mkdir` and then an `fsync` of the parent.
#[test]
fn a_spool_directory_the_runner_creates_is_fsynced_into_its_parent() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let parent = dir.path().join("parent");
    std::fs::create_dir(&parent).unwrap();
    let sink = json!({"type": "spool", "dir": parent.join("spool"), "max_bytes": 1 << 20,
                      "allow_unencrypted": true,
                      "target": files.sink()});
    let cfg = config(&server, dir.path(), sink, None);
    let trace = dir.path().join("trace");
    let log = std::fs::File::create(dir.path().join("svc.log")).unwrap();
    // Its own process group: killing strace alone would detach svc and leave it running.
    use std::os::unix::process::CommandExt;
    let mut child = Command::new("strace")
        .process_group(0)
        .args(["-f", "-y", "-e", "trace=mkdir,mkdirat,fsync", "-o"])
        .arg(&trace)
        .arg(env!("CARGO_BIN_EXE_svc"))
        .arg("run")
        .arg(&cfg)
        .stderr(log)
        .spawn()
        .expect("strace (Debian package strace)");
    wait_until(Duration::from_secs(30), "the runner binds", || {
        std::fs::read_to_string(dir.path().join("svc.log"))
            .is_ok_and(|l| l.contains("bound to consumer"))
    });
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.wait();
    let text = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let made = lines
        .iter()
        .position(|l| l.contains("mkdir") && l.contains("/parent/spool\"") && l.ends_with("= 0"))
        .unwrap_or_else(|| panic!("no mkdir of the spool: {text}"));
    let parent_tag = format!("<{}>", parent.display());
    assert!(
        lines[made..]
            .iter()
            .any(|l| l.contains("fsync(") && l.contains(&parent_tag) && l.ends_with("= 0")),
        "no fsync of {} after the spool's mkdir: {text}",
        parent.display()
    );
}

/// A spool that refuses batches (full by `max_records`) while the broker redelivers them: the
/// spool logs the refusal at warn once for the outage, not on every NAK cycle, and every
/// refused batch is still counted.
#[test]
fn a_spool_refusing_batches_warns_once_per_outage() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let sink = json!({"type": "spool", "dir": dir.path().join("spool"), "max_bytes": 64 << 20,
                      "allow_unencrypted": true,
                      "max_records": 20, "target": files.sink()});
    let cfg = config(&server, dir.path(), sink, None);
    server.publish_n(STREAM, "orders.created", 100, |i| {
        format!("{{\"order\":{}}}", i + 1).into_bytes()
    });
    let runner = start(&cfg, &dir.path().join("svc.log"), &HashMap::new());
    let snapshot = dir.path().join("metrics.json");
    wait_until(Duration::from_secs(60), "several refused batches", || {
        snapshot_counter(&snapshot, "spool_full_refusals_total") >= 5
    });
    let refused = snapshot_counter(&snapshot, "spool_full_refusals_total");
    let log = runner.log_text();
    stop(runner);
    let warned = log
        .lines()
        .filter(|l| l.contains("full (") && l.contains("WARN"))
        // The sink worker's line per failed batch is the pipeline's, for every sink.
        .filter(|l| !l.contains("writes in batch"))
        .count();
    // A redelivered batch small enough to fit ends the outage (the spool takes it), and the
    // next refusal starts another: one warning per outage, however many refusals (the last
    // "takes batches again" may come with no refusal after it).
    // The warning itself says "until the spool takes batches again": count the INFO lines.
    let ended = log
        .lines()
        .filter(|l| l.ends_with(": takes batches again"))
        .count();
    assert!(
        warned >= 1 && (ended..=ended + 1).contains(&warned),
        "one warning per outage ({warned} warnings, {ended} ended): {log}"
    );
    assert!(
        (warned as u64) < refused,
        "{warned} warnings for {refused} refusals: {log}"
    );
    assert!(
        log.contains("logged once until the spool takes batches again"),
        "{log}"
    );
}

/// Peak RSS (KiB) of `svc <args> <cfg>`, and its exit code and output.
fn peak_of(args: &[&str], cfg: &Path) -> (u64, i32, String, String) {
    let out = Command::new("/usr/bin/time")
        .args(["-f", "peak_kib=%M", env!("CARGO_BIN_EXE_svc")])
        .args(args)
        .arg(cfg)
        .output()
        .expect("/usr/bin/time (Debian package time)");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let peak = err
        .lines()
        .find_map(|l| l.strip_prefix("peak_kib="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak in {err}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (peak, out.status.code().unwrap_or(-1), stdout, err)
}

/// A segment far larger than `segment_bytes` (a bug, or a file put there): recovery and the
/// survey read it a window at a time, so their memory does not grow with it (whole, it took
/// more than its 96 MiB).
#[test]
fn an_oversized_segment_is_read_in_bounded_memory() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, segment) = fifty_spooled(&server, dir.path());
    let data = std::fs::read(&segment).unwrap();
    let frames = &data[8..];
    let mut big = data[..8].to_vec();
    while big.len() < 96 << 20 {
        big.extend_from_slice(frames);
    }
    let n = (big.len() - 8) / frames.len() * 50;
    std::fs::write(&segment, &big).unwrap();
    let size = big.len() as u64;
    drop(big);
    // A target that refuses at once (nothing listens): the drain recovers, fails its probes
    // and exits, the records left spooled.
    let target = json!({"type": "http", "url": "http://127.0.0.1:9/in",
                        "allow_http_for_local_testing": true, "batching": "none",
                        "retry_budget_seconds": 0, "request_timeout_seconds": 2});
    // The key `fifty_spooled` sealed the records with.
    let sink = json!({"type": "spool", "dir": dir.path().join("spool"), "max_bytes": 64 << 20,
                      "encryption": spool_key(dir.path(), "k1", 1),
                      "max_backoff_seconds": 1, "target": target});
    let cfg = config(&server, dir.path(), sink, None);
    let (peak, code, out, err) = peak_of(&["spool", "status"], &cfg);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("records: {n}\n")), "{out}");
    assert!(peak < 48 * 1024, "status: peak RSS {peak} KiB");
    let (peak, code, out, err) = peak_of(&["spool", "drain"], &cfg);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!("{n} records remain spooled")),
        "{err}"
    );
    assert!(peak < 48 * 1024, "drain: peak RSS {peak} KiB");
    assert_eq!(
        std::fs::metadata(&segment).unwrap().len(),
        size,
        "nothing cut"
    );
}

/// `svc spool status` and `svc spool inspect` show what the drain will not deliver: records
/// kept in rejected files (counted), quarantine files (named, escaped: anything may have been
/// put in the directory), damage between records and at the end of a segment (no write in
/// progress: the last record's body flipped).
#[test]
fn spool_status_and_inspect_show_rejected_records_quarantine_and_tail_damage() {
    use std::os::unix::fs::OpenOptionsExt;
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _, segment) = fifty_spooled(&server, dir.path());
    let spool = dir.path().join("spool");
    let data = std::fs::read(&segment).unwrap();
    let marks: Vec<usize> = (8..data.len() - 4)
        .filter(|&i| data[i..i + 4] == [0xF5, b'S', b'R', 0x0A])
        .collect();
    assert_eq!(marks.len(), 50);
    let id = svc_segment_id(&segment);
    let keep = |name: &str, bytes: &[u8]| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(spool.join(name))
            .unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
    };
    keep(
        &format!("rejected-{id:016}-{:012}.spool", marks[0]),
        &data[marks[0]..marks[1]],
    );
    keep("quarantine-\u{1b}[31mred.bad", b"x");
    flip(&segment, |_| marks[10] + 20);
    flip(&segment, |len| len - 3);
    let cfg_arg = cfg.to_str().unwrap();

    let (code, out, err) = svc(&["spool", "status", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    for want in [
        "records: 48\n",
        "rejected_files: 1\n",
        "rejected_records: 1\n",
        "quarantined_files: 1\n",
        "damaged_not_yet_quarantined: 2\n",
        "quarantined_file: quarantine-\\u{1b}[31mred.bad (1 bytes)\n",
        &format!("damaged: segment {id} offset {} (", marks[10]),
        &format!("damaged: segment {id} offset {} (", marks[49]),
    ] {
        assert!(out.contains(want), "{want:?} in:\n{out}");
    }
    assert!(!out.contains('\u{1b}'), "no raw escape: {out:?}");

    let (code, out, err) = svc(&["spool", "status", cfg_arg, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains('\u{1b}'), "no raw escape: {out:?}");
    let status: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(status["records"], 48, "{out}");
    assert_eq!(status["rejected_records"], 1, "{out}");
    assert_eq!(status["damaged_not_yet_quarantined"], 2, "{out}");
    assert_eq!(
        status["quarantined"][0]["file"],
        "quarantine-\u{1b}[31mred.bad"
    );
    assert_eq!(status["rejected"][0]["records"], 1, "{out}");
    assert_eq!(status["damaged"][1]["offset"], marks[49] as u64, "{out}");

    let (code, out, err) = svc(&["spool", "inspect", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains('\u{1b}'), "no raw escape: {out:?}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let state = |s: &str| lines.iter().filter(|l| l["state"] == s).collect::<Vec<_>>();
    assert_eq!(state("waiting").len(), 48);
    let rejected = state("rejected");
    assert_eq!(rejected.len(), 1, "{out}");
    assert_eq!(rejected[0]["stream_sequence"], 1);
    let quarantined = state("quarantined");
    assert_eq!(quarantined.len(), 1, "{out}");
    assert_eq!(quarantined[0]["file"], "quarantine-\u{1b}[31mred.bad");
    let damaged: Vec<u64> = state("damaged")
        .iter()
        .map(|d| d["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(damaged, vec![marks[10] as u64, marks[49] as u64]);
    let summary = state("summary");
    assert_eq!(summary[0]["rejected_records"], 1, "{out}");
    assert_eq!(summary[0]["damaged_not_yet_quarantined"], 2, "{out}");
}

/// `svc spool inspect` with an HTTP target flags the records that sink would refuse as too
/// large (its own `max_request_bytes` check), instead of listing them as deliverable.
#[test]
fn spool_inspect_flags_records_over_the_http_sinks_max_request_bytes() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let target = json!({"type": "http", "url": "http://127.0.0.1:9/in",
                        "allow_http_for_local_testing": true, "batching": "none",
                        "max_batch_bytes": 1024, "max_request_bytes": 4096});
    let sink = json!({"type": "spool", "dir": dir.path().join("spool"), "max_bytes": 1 << 20,
                      "allow_unencrypted": true,
                      "target": target});
    let cfg = config(&server, dir.path(), sink, None);
    let pad = "x".repeat(6000);
    server.publish_n(STREAM, "orders.created", 10, |i| {
        let pad = if i % 2 == 0 { "" } else { pad.as_str() };
        format!("{{\"order\":{},\"pad\":\"{pad}\"}}", i + 1).into_bytes()
    });
    let runner = start(&cfg, &dir.path().join("svc.log"), &HashMap::new());
    wait_until(Duration::from_secs(30), "all spooled and acked", || {
        ack_floor(&server) >= 10
    });
    stop(runner);
    let (code, out, err) = svc(&["spool", "inspect", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let refused: Vec<u64> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["state"] == "waiting")
        .filter(|l| {
            l["sink_refuses"]
                .as_str()
                .is_some_and(|w| w.contains("over max_request_bytes (4096)"))
        })
        .map(|l| l["stream_sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(refused, vec![2, 4, 6, 8, 10], "{out}");
}

/// A fallback spool full while its sink is down: the spool's refusal is logged at warn once for
/// the outage; once the sink is back and the drain emptied the spool, one info line says the
/// spool takes batches again, and every message lands.
#[test]
fn a_full_fallback_spool_warns_once_and_says_when_it_takes_batches_again() {
    let server = broker();
    let root = tempfile::tempdir().unwrap();
    let mut files = files_in(root.path());
    let spool = json!({"dir": root.path().join("spool"), "max_bytes": 64 << 20,
                       "allow_unencrypted": true,
                       "max_records": 100, "after_seconds": 0, "segment_bytes": 65536,
                       "max_backoff_seconds": 1});
    let cfg = config(&server, root.path(), files.sink(), Some(spool));
    let runner = start(&cfg, &root.path().join("svc.log"), &HashMap::new());
    let snapshot = root.path().join("metrics.json");
    // Down after the start (a starting runner makes a missing output directory again).
    wait_until(Duration::from_secs(30), "the runner up", || {
        snapshot.exists()
    });
    files.take_down();
    server.publish_n(STREAM, "orders.created", 300, |i| {
        format!("{{\"order\":{}}}", i + 1).into_bytes()
    });
    wait_until(
        Duration::from_secs(60),
        "the full spool refused batches",
        || snapshot_counter(&snapshot, "spool_full_refusals_total") >= 3,
    );
    files.bring_back();
    wait_until(
        Duration::from_secs(120),
        "every message acknowledged",
        || ack_floor(&server) >= 300,
    );
    wait_until(Duration::from_secs(60), "every file", || {
        files.delivered().iter().collect::<BTreeSet<_>>().len() >= 300
    });
    let log = runner.log_text();
    stop(runner);
    let warned = log
        .lines()
        .filter(|l| l.contains("full (") && l.contains("WARN"))
        .filter(|l| !l.contains("writes in batch"))
        .count();
    // At least 3 refusals before the sink came back; a second, brief outage is possible
    // while the drain and new batches race for the last places.
    assert!((1..=2).contains(&warned), "one warning per outage: {log}");
    let again = log
        .lines()
        .filter(|l| l.contains("INFO") && l.ends_with(": takes batches again"))
        .count();
    assert_eq!(again, warned, "said when each outage ended: {log}");
    assert_every_file(&files, 300);
}

/// A key file of 32 bytes of `byte` (base64, mode 0600) in `dir`.
fn spool_key(dir: &Path, id: &str, byte: u8) -> Value {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("{id}.key"));
    std::fs::write(
        &path,
        base64::engine::general_purpose::STANDARD.encode([byte; 32]),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    json!({"key_id": id, "key_file": path})
}

/// `sink.type: spool` encrypted with `current` (and `old` keys for reading), written to
/// `name` in `dir`.
fn sealed_spool_config(
    server: &NatsServer,
    dir: &Path,
    files: &Files,
    name: &str,
    (current, old): (&Value, &[&Value]),
) -> PathBuf {
    let mut encryption = current.clone();
    encryption["old_keys"] = json!(old);
    let sink = json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
                      "encryption": encryption, "target": files.sink()});
    let written = config(server, dir, sink, None);
    let to = dir.join(name);
    std::fs::rename(&written, &to).unwrap();
    to
}

fn all_segment_bytes(spool: &Path) -> Vec<u8> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("segment-"))
        })
        .collect();
    names.sort();
    names
        .iter()
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect()
}

fn holds(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The spool encrypted at rest through a real runner and broker: the segments hold no payload
/// text, `inspect` decrypts with the configured keys and names a record's key by id, a record
/// copied to another offset is quarantined and never delivered, and after a key rotation the
/// drain delivers everything once the old key is configured for reading (and stops, keeping
/// every record, while it is not).
#[test]
fn an_encrypted_spool_holds_no_payload_text_and_drains_after_a_key_rotation() {
    const MARKER: &str = "MARKER-9d2e-at-rest";
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let (k1, k2) = (
        spool_key(dir.path(), "k1", 1),
        spool_key(dir.path(), "k2", 2),
    );
    let publish = |from: u64| {
        server.publish_n(STREAM, "orders.created", 30, |i| {
            format!("{{\"order\":{},\"secret\":\"{MARKER}\"}}", from + i as u64).into_bytes()
        });
    };
    let spool_for = |cfg: &Path, acked: u64| {
        let runner = start(cfg, &dir.path().join("svc.log"), &HashMap::new());
        wait_until(Duration::from_secs(30), "all spooled and acked", || {
            ack_floor(&server) >= acked
        });
        stop(runner);
    };
    let first = sealed_spool_config(&server, dir.path(), &files, "k1.json", (&k1, &[]));
    publish(1);
    spool_for(&first, 30);
    let spool = dir.path().join("spool");
    let disk = all_segment_bytes(&spool);
    assert!(disk.len() > 30 * 200, "{} bytes", disk.len());
    assert!(!holds(&disk, MARKER), "payload text at rest");
    assert!(!holds(&disk, "orders.created"), "subject at rest");

    let (code, out, err) = svc(&["spool", "inspect", first.to_str().unwrap(), "--payload"]);
    assert_eq!(code, 0, "{err}");
    let line: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(line["key_id"], "k1");
    assert_eq!(line["payload"]["secret"], MARKER);

    // Rotated: k2 seals, k1 reads; the first records stay as they are.
    let rotated = sealed_spool_config(&server, dir.path(), &files, "k2.json", (&k2, &[&k1]));
    publish(31);
    spool_for(&rotated, 60);
    let disk = all_segment_bytes(&spool);
    assert!(!holds(&disk, MARKER));

    // A record's frame copied, checksum and all, to the end of the last segment.
    let last = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "spool"))
        .max()
        .unwrap();
    let mut data = std::fs::read(&last).unwrap();
    let len = u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize;
    let frame = data[8..8 + 12 + len].to_vec();
    data.extend_from_slice(&frame);
    std::fs::write(&last, &data).unwrap();

    // Without k1, the drain delivers nothing and keeps every record; inspect names the key id.
    let k2_only = sealed_spool_config(&server, dir.path(), &files, "k2only.json", (&k2, &[]));
    let (code, out, _) = svc(&["spool", "inspect", k2_only.to_str().unwrap()]);
    assert_eq!(code, 0);
    let first_line: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first_line["key_id"], "k1");
    assert!(
        first_line["unreadable"]
            .as_str()
            .unwrap()
            .contains("key id \"k1\", which is not configured"),
        "{first_line}"
    );
    assert!(!out.contains(&k1["key_file"].as_str().unwrap().to_string()));
    let (code, out, err) = svc(&["spool", "drain", k2_only.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("drain stuck"), "{err}");
    assert!(err.contains("key id \"k1\""), "{err}");
    assert!(files.delivered().is_empty());
    let (_, out, _) = svc(&["spool", "status", k2_only.to_str().unwrap()]);
    assert!(out.contains("records: 61\n"), "kept, the copy too: {out}");

    let (code, out, err) = svc(&["spool", "drain", rotated.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("60 records delivered"), "{out}");
    assert!(
        err.contains("does not decrypt at this segment and offset"),
        "the copy is reported: {err}"
    );
    let mut got = files.delivered();
    got.sort_unstable();
    assert_eq!(got, (1..=60).collect::<Vec<u64>>(), "every record once");
    let quarantined = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("quarantine-"))
        .count();
    assert_eq!(quarantined, 1);
}

/// `svc validate` refuses a spool that is neither encrypted nor explicitly in clear, naming
/// the field; a key file others can read, or another account's, is refused at start.
#[test]
fn a_spool_without_keys_or_allow_unencrypted_and_a_loose_key_file_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let sink = json!({"type": "spool", "dir": dir.path().join("spool"), "max_bytes": 1 << 20,
                      "target": files.sink()});
    let bare = config(&server, dir.path(), sink, None);
    let (code, out, err) = svc(&["validate", bare.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("sink.encryption: is required"), "{err}");
    assert!(err.contains("allow_unencrypted: true"), "{err}");

    let k1 = spool_key(dir.path(), "k1", 1);
    let cfg = sealed_spool_config(&server, dir.path(), &files, "k1.json", (&k1, &[]));
    let (code, _, err) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let key = PathBuf::from(k1["key_file"].as_str().unwrap());
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    for args in [["spool", "drain"], ["spool", "inspect"]] {
        let (code, _, err) = svc(&[args[0], args[1], cfg.to_str().unwrap()]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("encryption key \"k1\""), "{err}");
        assert!(err.contains("mode 0644"), "{err}");
    }
    let mut runner = start(&cfg, &dir.path().join("svc.log"), &HashMap::new());
    let status = runner.wait_timeout(Duration::from_secs(20));
    assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    let text = runner.log_text();
    assert!(text.contains("mode 0644"), "{text}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    if test_uid() == 0 {
        std::os::unix::fs::chown(&key, Some(65534), None).unwrap();
        let (code, _, err) = svc(&["spool", "drain", cfg.to_str().unwrap()]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("is owned by uid 65534"), "{err}");
    }
}

/// The test process's uid (root in the test container).
fn test_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    })
}

/// One frame holding `body` (the spool's framing: mark, length, CRC-32 of length and body).
pub(crate) fn frame_of(body: &[u8]) -> Vec<u8> {
    let len = (body.len() as u32).to_le_bytes();
    let mut h = crc32fast::Hasher::new();
    h.update(&len);
    h.update(body);
    let mut out = vec![0xF5, b'S', b'R', 0x0A];
    out.extend_from_slice(&len);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Issue 47, attack finding 3: 64 bytes planted by anyone who can write the spool directory
/// (no key: a "sealed" frame under a key id never configured) stop the drain; it names the
/// place and the command, `svc spool set-aside` moves exactly that record into a quarantine
/// file, and the drain then delivers everything after it.
#[test]
fn a_forged_record_under_an_unknown_key_is_set_aside_and_the_drain_goes_on() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, files, segment) = fifty_spooled(&server, dir.path());
    let cfg_arg = cfg.to_str().unwrap();
    // Flag 0x81, a time, key id "evil", then 8 + 16 + 12 + 16 bytes of anything.
    let mut body = vec![0x81];
    body.extend_from_slice(&1u64.to_le_bytes());
    body.push(4);
    body.extend_from_slice(b"evil");
    body.extend_from_slice(&[0x33; 52]);
    let forged = frame_of(&body);
    assert_eq!(forged.len(), 12 + 66);
    let mut data = std::fs::read(&segment).unwrap();
    let offset = data.len();
    data.extend_from_slice(&forged);
    std::fs::write(&segment, &data).unwrap();
    // 50 more after it (a new segment: every start begins one).
    server.publish_n(STREAM, "orders.created", 50, |i| {
        format!("{{\"order\":{}}}", i + 51).into_bytes()
    });
    let runner = start(&cfg, &dir.path().join("svc-2.log"), &HashMap::new());
    wait_until(Duration::from_secs(30), "all spooled and acked", || {
        ack_floor(&server) >= 100
    });
    stop(runner);

    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("key id \"evil\""), "{err}");
    let place = format!("--segment 1 --offset {offset}");
    assert!(
        err.contains(&format!("svc spool set-aside <config_file> {place}")),
        "{err}"
    );
    assert_eq!(files.delivered().len(), 50, "delivered up to it");

    // A place holding no record start is refused.
    let wrong = (offset + 1).to_string();
    let (code, _, err) = svc(&[
        "spool",
        "set-aside",
        cfg_arg,
        "--segment",
        "1",
        "--offset",
        &wrong,
    ]);
    assert_eq!(code, 1);
    let named = format!("no intact record starts at segment 1 offset {wrong}");
    assert!(err.contains(&named), "{err}");

    let offset_arg = offset.to_string();
    let args = [
        "spool",
        "set-aside",
        cfg_arg,
        "--segment",
        "1",
        "--offset",
        &offset_arg,
    ];
    let (code, out, err) = svc(&args);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("set aside"), "{out}");
    let spool = dir.path().join("spool");
    assert_eq!(
        quarantine_files(&spool),
        vec![forged.clone()],
        "its bytes kept"
    );
    assert_eq!(
        std::fs::read(&segment).unwrap().len(),
        data.len(),
        "offsets unchanged"
    );
    let (code, _, err) = svc(&args);
    assert_eq!(code, 1);
    assert!(err.contains("set aside already"), "{err}");
    // `status` and `inspect` count the set-aside frame (not among the 50 waiting records).
    let (code, out, err) = svc(&["spool", "status", cfg_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("records: 50\n"), "{out}");
    assert!(out.contains("set_aside_records: 1\n"), "{out}");
    let (_, out, _) = svc(&["spool", "status", cfg_arg, "--json"]);
    let status: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(status["set_aside_records"], 1, "{status}");
    let (_, out, _) = svc(&["spool", "inspect", cfg_arg]);
    let summary: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(summary["state"], "summary");
    assert_eq!(summary["set_aside_records"], 1, "{summary}");

    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("50 records delivered"), "{out}");
    let got: BTreeSet<u64> = files.delivered().into_iter().collect();
    assert_eq!(got, (1..=100).collect::<BTreeSet<u64>>());
    assert_eq!(quarantine_files(&spool).len(), 1);
}

/// Issue 47, attack finding 3: a record in clear planted in a spool that never allowed one
/// stops its opening; the error names the place and the command, and after `set-aside` the
/// spool opens and drains.
#[test]
fn a_planted_clear_record_that_stops_the_opening_is_set_aside() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    // A spool without a meta file (as a version before it left one) and one clear record.
    let spool = dir.path().join("spool");
    std::fs::create_dir(&spool).unwrap();
    std::fs::set_permissions(&spool, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut body = vec![0u8];
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(b"{\"not\":\"a record\"}\n");
    let mut data = b"SVCSPL01".to_vec();
    data.extend_from_slice(&frame_of(&body));
    let segment = spool.join("segment-0000000000000001.spool");
    std::fs::write(&segment, &data).unwrap();
    std::fs::set_permissions(
        &segment,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let cfg = spool_sink_config(&server, dir.path(), &files);
    let cfg_arg = cfg.to_str().unwrap();
    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("stored unencrypted"), "{err}");
    assert!(
        err.contains("svc spool set-aside <config_file> --segment 1 --offset 8"),
        "{err}"
    );
    let (code, out, err) = svc(&[
        "spool",
        "set-aside",
        cfg_arg,
        "--segment",
        "1",
        "--offset",
        "8",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("0 records delivered"), "{out}");
    assert_eq!(quarantine_files(&spool).len(), 1);
}

/// Issue 47: the spool's `meta` file is authenticated under its key. A byte of it changed
/// (here the first sealed segment, which says where records in clear may be read) stops
/// `svc spool drain` and `inspect`, naming the file and the key id; nothing is delivered or
/// changed, and with the file restored the drain delivers everything.
#[test]
fn a_meta_file_altered_by_hand_stops_the_drain_naming_it() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, files, _) = fifty_spooled(&server, dir.path());
    let cfg_arg = cfg.to_str().unwrap();
    let meta = dir.path().join("spool").join("meta");
    let good = std::fs::read(&meta).unwrap();
    assert_eq!(&good[..8], b"SVCMETA2");
    let mut bad = good.clone();
    bad[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&meta, &bad).unwrap();
    for action in ["drain", "inspect"] {
        let (code, out, err) = svc(&["spool", action, cfg_arg]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(
            err.contains(": meta: does not authenticate under key id \"k1\""),
            "{err}"
        );
    }
    assert!(files.delivered().is_empty());
    assert_eq!(std::fs::read(&meta).unwrap(), bad, "nothing was changed");
    std::fs::write(&meta, &good).unwrap();
    let (code, out, err) = svc(&["spool", "drain", cfg_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("50 records delivered"), "{out}");
}

/// atk47e finding 3: `meta` is authenticated but can be rolled back by whoever can write the
/// spool directory, which matters only while `allow_unencrypted` is set beside the key. An
/// opening that finds no record in clear left to drain says to remove it; without it, nothing
/// is said.
#[test]
fn allow_unencrypted_left_beside_a_key_with_nothing_in_clear_is_said_at_the_opening() {
    let server = broker();
    let dir = tempfile::tempdir().unwrap();
    let files = files_in(dir.path());
    let k1 = spool_key(dir.path(), "k1", 1);
    let cfg = sealed_spool_config(&server, dir.path(), &files, "sealed.json", (&k1, &[]));
    let said = "allow_unencrypted is set beside the key, but no record in clear is left to drain";
    let (code, out, err) = svc(&["spool", "drain", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains(said), "{err}");

    let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["sink"]["allow_unencrypted"] = json!(true);
    std::fs::write(&cfg, v.to_string()).unwrap();
    let (code, out, err) = svc(&["spool", "drain", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains(said), "{err}");
}
