//! Two runners (the real `svc` binary) on one durable of an R3 stream on a real 3-node
//! JetStream cluster, while (a) the stream leader is killed and restarted, (b) the node one
//! runner is connected to is killed and restarted, (c) one runner is killed with SIGKILL.
//!
//! Messages are published at a steady rate throughout (each confirmed by the stream), so
//! there is always work and the fault lands mid-stream. Afterwards: every message the stream
//! holds is stored exactly once (file sink, `per_event`, both runners writing one directory),
//! every message is acknowledged (consumer state), and no surviving runner went longer than
//! the ack wait plus a wide margin without acknowledging anything, beyond the time the
//! cluster itself took no messages (no stream leader: the publishers' confirmations say when).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::cluster::Cluster;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";
/// Short, so that a dead runner's messages come back quickly.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// Generous: progress is sampled from 1 s snapshots on a loaded machine.
const STALL_MARGIN: Duration = Duration::from_secs(5);
/// Steady publishing: a few thousand messages per case.
const PUBLISH_RATE: u64 = 300;
const PUBLISHERS: u64 = 2;
const PUBLISH_FOR: Duration = Duration::from_secs(10);
const FAULT_AT: Duration = Duration::from_secs(3);
const RECOVER_AT: Duration = Duration::from_secs(6);

/// Three 3-node clusters at once on a 2-core machine starve RAFT heartbeats: one at a time.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Scenario {
    cluster: Cluster,
    dir: tempfile::TempDir,
    out: PathBuf,
    runners: Vec<Runner>,
}

fn connection_name(i: usize) -> String {
    format!("svc-{i}")
}

fn snapshot_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("m{i}.json"))
}

fn start() -> Scenario {
    let cluster = Cluster::start(3);
    cluster.create_stream(STREAM, &[SUBJECT]);
    cluster.create_consumer(STREAM, CONSUMER, SUBJECT, ACK_WAIT, 20_000);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let runners = (0..2)
        .map(|i| {
            let cfg = json!({
                "nats": {"urls": cluster.urls(), "stream": STREAM, "consumer": CONSUMER,
                         "subject": SUBJECT, "connection_name": connection_name(i)},
                "delivery": {"batch_size": 32, "fetch_expiry_ms": 500, "max_in_flight_batches": 4,
                             "sink_workers": 2, "shutdown_timeout_seconds": 10},
                "sink": {"type": "file", "directory": out, "mode": "per_event"},
                "metrics": {"enabled": true, "snapshot_file": snapshot_path(dir.path(), i),
                            "write_interval_seconds": 1},
                "logging": {"level": "info"}
            });
            let cfg = write_config(dir.path(), &format!("c{i}.json"), &cfg);
            Runner::start(&cfg, &dir.path().join(format!("svc{i}.log")))
        })
        .collect::<Vec<_>>();
    for r in &runners {
        wait_until(Duration::from_secs(30), "runner bound", || {
            r.log_text().contains("bound to consumer")
        });
    }
    Scenario {
        cluster,
        dir,
        out,
        runners,
    }
}

/// Publishes at [`PUBLISH_RATE`] for [`PUBLISH_FOR`], [`PUBLISHERS`] threads each on its own
/// connection to every seed. Each message waits for the stream's acknowledgement and is
/// retried until it has one (the client's 5 ms flush floor caps one thread near 190/s): a
/// stream without a leader refuses publishes for a moment, and the stream must still receive
/// every message.
/// Each thread returns when each of its publishes was confirmed.
fn publisher(urls: Vec<String>) -> Vec<std::thread::JoinHandle<Vec<Instant>>> {
    (0..PUBLISHERS)
        .map(|t| {
            let urls = urls.clone();
            std::thread::spawn(move || {
                let nc = nats::Options::new()
                    .max_reconnects(None)
                    .connect(urls.join(",").as_str())
                    .unwrap();
                let js = nats::jetstream::new(nc);
                let start = Instant::now();
                let rate = PUBLISH_RATE / PUBLISHERS;
                let total = rate * PUBLISH_FOR.as_secs();
                let mut confirmed = Vec::with_capacity(total as usize);
                for i in 0..total {
                    let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let body = format!("{{\"publisher\":{t},\"order\":{i}}}");
                    // A deadline per attempt (the crate's default waits forever for a reply
                    // lost with a killed node) and a message ID, so a retry of a publish that
                    // was stored after all is dropped by the stream's duplicate window.
                    let opts = nats::jetstream::PublishOptions {
                        timeout: Some(Duration::from_secs(2)),
                        id: Some(format!("{t}-{i}")),
                        ..Default::default()
                    };
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while js
                        .publish_with_options("orders.created", &body, &opts)
                        .is_err()
                    {
                        assert!(Instant::now() < deadline, "publish refused for 60 s");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    confirmed.push(Instant::now());
                }
                confirmed
            })
        })
        .collect()
}

/// Samples each runner's `messages_acked_total` every 100 ms until stopped.
struct Progress {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<Vec<(Instant, u64)>>>,
}

impl Progress {
    fn start(snapshots: Vec<PathBuf>) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples = vec![Vec::new(); snapshots.len()];
            while !flag.load(Ordering::SeqCst) {
                for (i, p) in snapshots.iter().enumerate() {
                    samples[i].push((Instant::now(), snapshot_counter(p, "messages_acked_total")));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        });
        Progress { stop, handle }
    }

    fn finish(self) -> Vec<Vec<(Instant, u64)>> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().unwrap()
    }
}

/// Longest time between two increases of the counter within `from..until`, also counting
/// from `from` to the first increase and from the last increase to `until`.
fn longest_stall(samples: &[(Instant, u64)], from: Instant, until: Instant) -> Duration {
    let mut last_change = from;
    let mut last_value = None;
    let mut longest = Duration::ZERO;
    for &(t, v) in samples {
        if t > until {
            break;
        }
        if last_value.is_some_and(|p| v > p) && t >= from {
            longest = longest.max(t - last_change);
            last_change = t;
        }
        last_value = Some(v);
    }
    longest.max(until.saturating_duration_since(last_change))
}

/// Runs one case: publishes, applies `fault` at [`FAULT_AT`] and `recover` at
/// [`RECOVER_AT`], then checks storage, acknowledgement and progress of `survivors`.
fn run_case<T>(
    name: &str,
    s: &mut Scenario,
    survivors: &[usize],
    fault: impl FnOnce(&mut Scenario) -> T,
    recover: impl FnOnce(&mut Scenario, T),
) {
    let snapshots = (0..s.runners.len())
        .map(|i| snapshot_path(s.dir.path(), i))
        .collect();
    let progress = Progress::start(snapshots);
    let t0 = Instant::now();
    let publishing = publisher(s.cluster.urls());
    std::thread::sleep(FAULT_AT);
    let what = fault(s);
    std::thread::sleep(RECOVER_AT.saturating_sub(t0.elapsed()));
    recover(s, what);
    let mut confirmed = publishing
        .into_iter()
        .flat_map(|p| p.join().unwrap())
        .collect::<Vec<_>>();
    confirmed.sort_unstable();
    let published_until = Instant::now();

    let mut last_seq = 0;
    wait_until(
        Duration::from_secs(60),
        "every message in the stream acknowledged",
        || {
            let Some((last, held)) = s.cluster.stream_state(STREAM) else {
                return false;
            };
            last_seq = last;
            held == last && s.cluster.consumer_state(STREAM, CONSUMER) == Some((last, 0, 0))
        },
    );
    let samples = progress.finish();

    // Every stream sequence exactly once, each file a complete record.
    let mut seqs = files_below(&s.out)
        .into_iter()
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .map(|p| {
            let bytes = std::fs::read(s.out.join(&p)).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{} is not a complete record: {e}", p.display()));
            v["stream_sequence"].as_u64().unwrap()
        })
        .collect::<Vec<_>>();
    seqs.sort_unstable();
    let mut dups = seqs.clone();
    dups.dedup();
    assert_eq!(
        dups.len(),
        seqs.len(),
        "{name}: a stream sequence stored twice"
    );
    assert_eq!(
        seqs,
        (1..=last_seq).collect::<Vec<_>>(),
        "{name}: every message of the stream stored once"
    );
    assert!(
        last_seq >= PUBLISH_RATE * PUBLISH_FOR.as_secs(),
        "{name}: the stream took only {last_seq} messages"
    );

    // A runner cannot make progress while the cluster takes no messages (no stream leader):
    // that time is the cluster's, measured from the publishers' confirmations.
    let window_start = t0 + Duration::from_secs(1);
    let stream_samples = confirmed
        .iter()
        .enumerate()
        .map(|(k, t)| (*t, k as u64))
        .collect::<Vec<_>>();
    let stream_stall = longest_stall(&stream_samples, window_start, published_until);
    for &i in survivors {
        let stall = longest_stall(&samples[i], window_start, published_until);
        eprintln!(
            "{name}: runner {i} longest stall {stall:?}, the stream's {stream_stall:?} (acked {})",
            samples[i].last().map_or(0, |s| s.1)
        );
        assert!(
            stall <= stream_stall + ACK_WAIT + STALL_MARGIN,
            "{name}: runner {i} acknowledged nothing for {stall:?} while messages arrived \
             (the stream took none for {stream_stall:?})\n{}",
            s.runners[i].log_text()
        );
    }
    for &i in survivors {
        let r = &mut s.runners[i];
        r.signal("TERM");
        let status = r
            .wait_timeout(Duration::from_secs(20))
            .expect("exits after SIGTERM");
        let log = r.log_text();
        assert!(status.success(), "{name}: runner {i} exit {status}\n{log}");
        assert!(!log.contains("panicked"), "{name}: {log}");
    }
}

#[test]
fn stream_leader_killed_and_restarted() {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut s = start();
    run_case(
        "leader",
        &mut s,
        &[0, 1],
        |s| {
            let l = s.cluster.stream_leader(STREAM).expect("a stream leader");
            s.cluster.kill(l);
            l
        },
        |s, l| s.cluster.restart(l),
    );
}

#[test]
fn node_of_one_runner_killed_and_restarted() {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut s = start();
    run_case(
        "node",
        &mut s,
        &[0, 1],
        |s| {
            let leader = s.cluster.stream_leader(STREAM);
            let nodes = (0..2)
                .map(|i| {
                    s.cluster
                        .node_of_connection(&connection_name(i))
                        .expect("runner connected")
                })
                .collect::<Vec<_>>();
            // Prefer a node that does not lead the stream: (a) covers the leader.
            let node = nodes
                .iter()
                .copied()
                .find(|n| Some(*n) != leader)
                .unwrap_or(nodes[0]);
            s.cluster.kill(node);
            node
        },
        |s, node| s.cluster.restart(node),
    );
}

#[test]
fn one_runner_killed_the_other_takes_over() {
    let _one = ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut s = start();
    run_case(
        "runner",
        &mut s,
        &[0],
        |s| s.runners[1].sigkill(),
        |_, ()| {},
    );
    // The dead runner's unacknowledged messages came back to the survivor after the ack
    // wait (run_case saw every one acknowledged); the survivor saw nothing wrong.
    let log = s.runners[0].log_text();
    assert!(!log.contains("ERROR"), "{log}");
}
