//! HTTP sink benchmark against a local receiver (`tests/support/receivers/http_receiver.py`,
//! keep-alive, one thread per connection), started here.
//!
//! Prints, measured in the same run against the same receiver:
//! 1. receiver capacity: records/s of requests with the sink's shape (json_array bodies of B
//!    envelope records of 205-byte payloads, the sink's headers) sent at concurrency C from
//!    the sink's own client, right before and right after the run;
//! 2. end to end: records/s of `svc run` (real nats-server, pipeline, ACKs; from process start
//!    to the last ACK) into the receiver with `max_batch_messages` = B and
//!    `max_concurrent_requests` = C, and the ratio to the capacity around it (aim: >= 0.8);
//! 3. the reference shape: one request per message, in sequence, a new connection each time
//!    (`Connection: close`), and the end-to-end ratio to it (aim: >= 20).
//!
//! Run: `cargo bench --bench http_sink` (args: message count, default 300000, or 2000 as a
//! smoke pass under `cargo test --all-targets`; env SVC_BENCH_BATCH, default 100;
//! SVC_BENCH_CONCURRENCY, default 8; SVC_BENCH_RECEIVER: `store`, the default, the tests'
//! receiver storing every request durably, `verify`, a receiver doing real work: it verifies
//! every request's Standard Webhooks signature (svc signs, `signing_secrets_env`) and parses
//! the body, or `discard`; SVC_BENCH_DELIVERY=defaults runs svc with the `delivery` block's
//! defaults instead of batches of B, or a JSON object is the `delivery` block). Needs nats-server and python3 (the test venv's, with the
//! `standardwebhooks` package for `verify`, when `scripts/deps.sh` made it).
//!
//! `SVC_BENCH_PIN=1` gives the receiver a CPU of its own (the last one) and the bench's client,
//! nats-server and svc the others, as when the receiver runs on its own host: on a 2-core
//! machine a CPU-bound receiver otherwise competes with the runner it is measured against.
//!
//! With `verify` the receiver also says how busy svc kept it during the run: the share of the
//! run's wall time with at least one request in a handler, and the mean number in handlers.
//!
//! `SVC_BENCH_WRAPPER="valgrind --tool=callgrind ..."` runs `svc` under that tool: runs of
//! 4,000 and 12,000 messages give the runner's marginal instructions per message
//! (docs/sinks/http.md, "The runner's CPU per record, by instruction count").

#[path = "../tests/support/python.rs"]
mod python;
mod support;

use python::{python, script};

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use svc::config::RuntimeConfig;
use svc::message::envelope::{normalize, Envelope, EnvelopeConfig, RawMessage};
use svc::sink::http::client::Client;
use svc::sink::http::config::HttpSinkConfig;
use svc::sink::http::request;
use svc::sink::http::signature::Signer;
use svc::sink::SinkConfig;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Receiver {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Receiver {
    /// `store`: the tests' receiver (parses, stores each request as a line, fsync before the
    /// answer); `verify`: verifies the signature and parses the body, stores nothing;
    /// `discard`: reads the body and answers (the receiver costs next to nothing, which
    /// measures the runner's own ceiling).
    fn start(mode: &str, cpu: Option<usize>) -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let port = support::net::free_port();
        let script = script("receivers/http_receiver.py");
        let mut command = match cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpu.to_string()]).arg(python());
                c
            }
            None => Command::new(python()),
        };
        let child = command
            .arg(script)
            .args(["--port", &port.to_string()])
            .args(match mode {
                "discard" => &["--no-store"][..],
                "verify" => &["--mode", "verify", "--secret", SECRET][..],
                _ => &[][..],
            })
            .arg("--out")
            .arg(dir.path().join("received.jsonl"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "receiver did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Receiver {
            port,
            child,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// `verify` mode's account: (requests, busy seconds, seconds at each number of requests
    /// in handlers at once, Unix time of the first request since the last call and of the
    /// last answer).
    fn stats(&self) -> Stats {
        let text = ureq::get(&format!("http://127.0.0.1:{}/stats", self.port))
            .call()
            .unwrap()
            .into_body()
            .read_to_string()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let at = v["seconds_at"].as_array().unwrap();
        (
            v["requests"].as_u64().unwrap(),
            v["busy_seconds"].as_f64().unwrap(),
            at.iter().map(|s| s.as_f64().unwrap()).collect(),
            v["first_request_at"].as_f64(),
            v["last_answer_at"].as_f64(),
        )
    }
}

type Stats = (u64, f64, Vec<f64>, Option<f64>, Option<f64>);

/// The signing secret of `verify` runs (a test value), given to svc through this variable.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SECRET_ENV: &str = "SVC_BENCH_SIGNING_SECRET";

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn envelope(seq: u64) -> Envelope {
    normalize(
        &RawMessage {
            published_unix_nanos: Some(1_700_000_000_000_000_000),
            ..RawMessage::sample("orders.created", seq, &support::body(seq as usize, 205))
        },
        1_700_000_001_000_000_000,
        &EnvelopeConfig::default(),
    )
    .0
}

fn sink_config(sink: serde_json::Value) -> HttpSinkConfig {
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "a.>"},
        "sink": sink,
    });
    let SinkConfig::Http(cfg) = RuntimeConfig::parse(&doc.to_string()).unwrap().sink else {
        unreachable!()
    };
    *cfg
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Records/s the receiver takes: `requests` requests of `per` records each, at concurrency
/// `conc`, with the sink's client and headers.
fn capacity(cfg: &Arc<HttpSinkConfig>, requests: usize, conc: usize) -> f64 {
    let client = Client::new(cfg.clone()).unwrap();
    let records: Vec<_> = (1..=cfg.max_batch_messages as u64)
        .map(|s| request::record(cfg, &envelope(s)).unwrap())
        .collect();
    let refs: Vec<_> = records.iter().collect();
    let req = request::build(cfg, &refs).unwrap();
    let signer = Signer::from_env(&cfg.signing_secrets_env, |n| std::env::var(n).ok()).unwrap();
    let headers = request::headers(cfg, &[], signer.as_ref(), &req, unix_now());
    let rate = support::parallel("bench-capacity", conc, requests, |_| {
        client.send(&headers, &req.body).unwrap();
    });
    rate * cfg.max_batch_messages as f64
}

/// Messages/s of the reference shape: one request per message, in sequence, a new
/// connection each time.
fn one_by_one(sink: &serde_json::Value, n: usize) -> f64 {
    let mut sink = sink.clone();
    sink["batching"] = json!("none");
    let cfg = Arc::new(sink_config(sink));
    let signer = Signer::from_env(&cfg.signing_secrets_env, |n| std::env::var(n).ok()).unwrap();
    let client = Client::new(cfg.clone()).unwrap();
    let start = Instant::now();
    for seq in 1..=n as u64 {
        let rec = request::record(&cfg, &envelope(seq)).unwrap();
        let req = request::build(&cfg, &[&rec]).unwrap();
        let mut headers = request::headers(&cfg, &[], signer.as_ref(), &req, unix_now());
        headers.push(("connection".into(), "close".into()));
        client.send(&headers, &req.body).unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let (benching, n) = support::bench_count(300_000, 2_000);
    let batch = env_num("SVC_BENCH_BATCH", 100);
    let conc = env_num("SVC_BENCH_CONCURRENCY", 8);
    let mode = std::env::var("SVC_BENCH_RECEIVER").unwrap_or_else(|_| "store".into());
    let receiver_cpu = pin_receiver();
    let receiver = Receiver::start(&mode, receiver_cpu);
    let mut sink = json!({
        "type": "http", "url": receiver.url(), "allow_http_for_local_testing": true,
        "batching": "json_array", "max_batch_messages": batch, "max_concurrent_requests": conc,
    });
    if mode == "verify" {
        // Read by svc (a child, inheriting it) and by the capacity runs' headers.
        std::env::set_var(SECRET_ENV, SECRET);
        sink["signing_secrets_env"] = json!([SECRET_ENV]);
    }
    // `defaults`, or a JSON object: the `delivery` block to run with.
    let delivery = match std::env::var("SVC_BENCH_DELIVERY").ok().as_deref() {
        Some("defaults") => Some(json!({})),
        Some(text) => Some(serde_json::from_str(text).expect("SVC_BENCH_DELIVERY: JSON")),
        None => None,
    };
    let cfg = Arc::new(sink_config(sink.clone()));
    println!(
        "http sink: {n} messages of 205-byte payloads, json_array of {batch} envelope records \
         per request, concurrency {conc}, receiver mode {mode}, delivery {}{}",
        match &delivery {
            Some(d) => format!("{d} (other fields default)"),
            None => "batches of B, 8 in flight, 4 sink workers".into(),
        },
        if benching { "" } else { " (smoke pass)" }
    );
    // At least a few seconds of requests: shorter runs varied by a factor of six here.
    let requests = (n / batch).max(if benching { 20_000 } else { conc * 10 });
    capacity(&cfg, conc * 4, conc);
    let (cpu0, t0) = (
        support::process_cpu_seconds(receiver.child.id()),
        Instant::now(),
    );
    let stats0 = (mode == "verify").then(|| receiver.stats());
    let before = capacity(&cfg, requests, conc);
    let capacity_wall = t0.elapsed().as_secs_f64();
    let capacity_load = (support::process_cpu_seconds(receiver.child.id()) - cpu0) / capacity_wall;
    let capacity_busy = stats0.map(|s| (s, receiver.stats()));
    println!("  receiver capacity, same shape (before)  {before:9.0} records/s");

    let broker = support::start_broker();
    let url = broker.url.clone();
    support::create_stream(&url, "HTTP", &["http.>"]).unwrap();
    support::publish(&url, "HTTP", "http.orders", n, 205).unwrap();
    support::create_consumer(&url, "HTTP", "svc", "http.>", Duration::from_secs(60)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("svc.json");
    let mut doc = json!({
        "nats": {"url": url, "stream": "HTTP", "consumer": "svc", "subject": "http.>"},
        "delivery": {"batch_size": batch.max(64), "max_in_flight_batches": 8,
                     "sink_workers": 4},
        "sink": sink,
        "logging": {"level": "warn"}
    });
    if let Some(d) = delivery {
        doc["delivery"] = d;
    }
    std::fs::write(&cfg_path, serde_json::to_vec(&doc).unwrap()).unwrap();
    let mut acks = support::AckWatch::start(&url, "HTTP", "svc");
    let broker_cpu = broker.cpu_seconds();
    let receiver_cpu0 = support::process_cpu_seconds(receiver.child.id());
    let busy_before = (mode == "verify").then(|| receiver.stats());
    let start = Instant::now();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut child = support::spawn_svc_run(&cfg_path);
    acks.wait(n, |_| {
        assert!(child.try_wait().unwrap().is_none(), "svc exited early");
    });
    let wall = start.elapsed().as_secs_f64();
    let ended_unix = started_unix + wall;
    let rate = n as f64 / wall;
    let svc_cpu = support::process_cpu_seconds(child.id());
    let threads = support::thread_cpu(child.id());
    let receiver_cpu = support::process_cpu_seconds(receiver.child.id()) - receiver_cpu0;
    let busy_after = busy_before.as_ref().map(|_| receiver.stats());
    support::terminate(child);
    let after = capacity(&cfg, requests, conc);
    println!("  receiver capacity, same shape (after)   {after:9.0} records/s");
    let around = (before + after) / 2.0;
    println!(
        "  svc run end to end                      {rate:9.0} records/s   ratio {:.2} to the \
         capacity around it ({around:.0})",
        rate / around
    );
    println!(
        "    (cpu seconds: svc {svc_cpu:.2}, nats-server {:.2}, receiver {receiver_cpu:.2}; \
         wall {wall:.2}; receiver load: {:.2} cores during the run, {capacity_load:.2} during \
         the capacity run before)",
        broker.cpu_seconds() - broker_cpu,
        receiver_cpu / wall
    );
    let top: Vec<String> = threads
        .iter()
        .take(6)
        .map(|(name, cpu)| format!("{name} {cpu:.2}"))
        .collect();
    println!("    (svc threads by cpu seconds: {})", top.join(", "));
    if let (Some(b), Some(a)) = (busy_before, busy_after) {
        print_busy("the run", &b, &a, wall);
        if let (Some(first), Some(last)) = (a.3, a.4) {
            println!(
                "    (from svc's start to its first request {:.3} s; from the last answer to \
                 the last ACK seen {:.3} s)",
                first - started_unix,
                ended_unix - last
            );
        }
    }
    if let Some((b, a)) = capacity_busy {
        print_busy("the capacity run before", &b, &a, capacity_wall);
    }
    let m = (n / 20).clamp(200, 3000);
    let reference = one_by_one(&sink, m);
    println!(
        "  one request per message, in sequence, new connection each ({m} messages) \
         {reference:9.0} messages/s   svc run is {:.1}x that",
        rate / reference
    );
}

/// `SVC_BENCH_PIN=1`: the receiver alone on the last CPU, this process (the capacity client)
/// and everything it starts later (nats-server, `svc run`) on the others, as with a receiver
/// on its own host. Returns the receiver's CPU.
fn pin_receiver() -> Option<usize> {
    let last = support::pin_off_last_cpu()?;
    println!(
        "pinned: the receiver on CPU {last}, the bench, nats-server and svc on CPUs 0-{}",
        last - 1
    );
    Some(last)
}

/// How busy svc kept the receiver during its run (the difference of two `stats`).
fn print_busy(what: &str, before: &Stats, after: &Stats, wall: f64) {
    let at: Vec<f64> = (0..after.2.len())
        .map(|i| after.2[i] - before.2.get(i).copied().unwrap_or(0.0))
        .collect();
    let total: f64 = at.iter().sum();
    let mean = at
        .iter()
        .enumerate()
        .map(|(i, s)| i as f64 * s)
        .sum::<f64>()
        / total.max(1e-9);
    let shares: Vec<String> = at
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{i}: {:.0}%", 100.0 * s / total.max(1e-9)))
        .collect();
    println!(
        "    (receiver during {what}: {} requests, busy {:.0}% of the wall time, {:.2} requests \
         in handlers on average; time at each count {})",
        after.0 - before.0,
        100.0 * (after.1 - before.1) / wall,
        mean,
        shares.join(", ")
    );
}
