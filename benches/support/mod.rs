//! Shared by the benchmarks and `jsctl`: broker set-up, publishing, and the raw fetch+ack
//! baseline measured with the same client and technique as `svc-fetch`.
#![allow(dead_code)]

#[path = "../../tests/support/broker.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
pub mod broker;
#[path = "../../tests/support/net.rs"]
#[allow(dead_code)] // shared with the tests, which use the rest
pub mod net;

use std::io;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn connect(url: &str) -> io::Result<nats::Connection> {
    nats::Options::new().max_reconnects(None).connect(url)
}

pub fn create_stream(url: &str, stream: &str, subjects: &[&str]) -> io::Result<()> {
    let js = nats::jetstream::new(connect(url)?);
    if js.stream_info(stream).is_ok() {
        return Ok(());
    }
    js.add_stream(broker::stream_config(stream, subjects))
        .map(|_| ())
}

pub fn create_consumer(
    url: &str,
    stream: &str,
    name: &str,
    filter: &str,
    ack_wait: Duration,
) -> io::Result<()> {
    let js = nats::jetstream::new(connect(url)?);
    js.add_consumer(
        stream,
        broker::durable_config(name, filter, ack_wait, 100_000),
    )
    .map(|_| ())
}

/// A JSON body of about `size` bytes, distinct per message.
pub fn body(i: usize, size: usize) -> Vec<u8> {
    let head = format!("{{\"order\":{i},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    let mut b = head.into_bytes();
    b.extend(std::iter::repeat_n(b'x', pad));
    b.extend_from_slice(b"\"}");
    b
}

/// Publishes `count` messages and waits until the stream holds them; returns msg/s.
pub fn publish(
    url: &str,
    stream: &str,
    subject: &str,
    count: usize,
    size: usize,
) -> io::Result<f64> {
    let nc = connect(url)?;
    let js = nats::jetstream::new(nc.clone());
    let before = js.stream_info(stream)?.state.messages;
    let start = Instant::now();
    for i in 0..count {
        nc.publish(subject, body(i, size))?;
        if i % 5000 == 4999 {
            // Keep the server's ingest from falling far behind our socket buffer.
            nc.flush()?;
            while js.stream_info(stream)?.state.messages + 20_000 < before + i as u64 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    nc.flush()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while js.stream_info(stream)?.state.messages < before + count as u64 {
        if Instant::now() > deadline {
            return Err(io::Error::other(
                "stream did not receive every published message",
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

pub fn consumer_state(url: &str, stream: &str, consumer: &str) -> io::Result<(u64, usize, u64)> {
    let js = nats::jetstream::new(connect(url)?);
    let i = js.consumer_info(stream, consumer)?;
    Ok((i.ack_floor.stream_seq, i.num_ack_pending, i.num_pending))
}

/// The limit: fetch and ack `count` messages with no sink, using the same technique as
/// `svc-fetch` (two outstanding pull requests, flush after each request, ack without waiting).
/// `pause`: hold each batch that long before acknowledging it (standing in for a sink's
/// writes); zero acknowledges each message as it arrives. A request that expired after
/// delivering part of its batch may end without a status (slow deliveries), so a second
/// without a delivery sends a new request; 30 such seconds in a row are a stall.
pub fn raw_fetch_ack(
    url: &str,
    stream: &str,
    consumer: &str,
    subject: &str,
    count: usize,
    batch: usize,
    pause: Duration,
) -> io::Result<f64> {
    let nc = connect(url)?;
    let js = nats::jetstream::new(nc.clone());
    let sub = js.pull_subscribe_with_options(
        subject,
        &nats::jetstream::PullSubscribeOptions::new()
            .bind_stream(stream.into())
            .durable_name(consumer.into()),
    )?;
    let request = |sub: &nats::jetstream::PullSubscription| -> io::Result<()> {
        sub.request_batch(nats::jetstream::BatchOptions {
            batch,
            expires: Some(Duration::from_secs(1).as_nanos() as usize),
            no_wait: false,
            max_bytes: None,
        })?;
        nc.flush()
    };
    let start = Instant::now();
    let (mut done, mut in_request, mut idle) = (0, 0, 0);
    let mut held = Vec::new();
    request(&sub)?;
    request(&sub)?;
    while done < count {
        let m = match sub.next_timeout(Duration::from_secs(1)) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                idle += 1;
                if idle >= 30 {
                    return Err(io::Error::other(format!(
                        "raw drain stalled at {done}/{count}"
                    )));
                }
                request(&sub)?;
                continue;
            }
            Err(_) => {
                request(&sub)?;
                continue;
            }
        };
        idle = 0;
        if m.data.is_empty()
            && m.headers
                .as_ref()
                .is_some_and(|h| h.get("Status").is_some())
        {
            request(&sub)?;
            continue;
        }
        in_request += 1;
        if pause.is_zero() {
            m.ack()?;
            done += 1;
        } else {
            held.push(m);
        }
        if in_request == batch || done + held.len() == count {
            in_request = 0;
            if !held.is_empty() {
                std::thread::sleep(pause);
                done += held.len();
                for m in held.drain(..) {
                    m.ack()?;
                }
                nc.flush()?;
            }
            if done < count {
                request(&sub)?;
            }
        }
    }
    nc.flush()?;
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// A throw-away JetStream server on a free loopback port with a temporary store.
/// A throw-away JetStream server on free loopback ports with a temporary store: the tests'
/// [`broker::NatsServer`] (the same binary choice, `SVC_NATS_SERVER`, and start-up checks).
pub struct Broker {
    server: broker::NatsServer,
    pub url: String,
}

impl Broker {
    /// CPU seconds (user + system) the broker process has used so far.
    pub fn cpu_seconds(&self) -> f64 {
        self.server.pid().map_or(0.0, process_cpu_seconds)
    }
}

/// CPU seconds (user + system) a process has used so far, from /proc (0 when unreadable).
pub fn process_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(close) = stat.rfind(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0 // USER_HZ on Linux
}

/// The store goes below the system temp directory, or `SVC_BENCH_BROKER_DIR` when set (for
/// example a tmpfs, to keep the broker's own writes off the disk a file sink is measured on).
pub fn start_broker() -> Broker {
    start_broker_with_config("")
}

/// [`start_broker`] with extra lines of nats-server configuration (e.g. `max_payload`).
pub fn start_broker_with_config(config: &str) -> Broker {
    let store = match std::env::var_os("SVC_BENCH_BROKER_DIR") {
        Some(base) => tempfile::tempdir_in(base).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let mut extra = Vec::new();
    if !config.is_empty() {
        let file = store.path().join("nats-server.conf");
        std::fs::write(&file, config).unwrap();
        extra.push("-c".to_string());
        extra.push(file.display().to_string());
    }
    // SVC_BENCH_BROKER_PROFILE=<port>: the broker serves Go's pprof (CPU profiles, goroutine
    // dumps) on that loopback port, to see where its time goes during a run.
    if let Ok(profile) = std::env::var("SVC_BENCH_BROKER_PROFILE") {
        extra.push("--profile".to_string());
        extra.push(profile);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let server = broker::NatsServer::start_in(store, &extra);
    Broker {
        url: server.url(),
        server,
    }
}

/// Waits for svc to acknowledge a whole backlog without disturbing the broker while it
/// delivers: start it before svc, then [`AckWatch::wait`].
///
/// Asking the broker while it delivers is not free. nats-server 2.9.10 answers
/// `$JS.API.CONSUMER.INFO` by recounting the consumer's pending messages
/// (`consumer.streamNumPending` -> `fileStore.FilteredState`), and when the consumer is in
/// the first half of the stream's last block that count comes back without its last
/// sequence (`msgBlock.filteredPendingLocked` scans the messages before the consumer and
/// never sets it). That marks the count stale, so every later delivery recounts, scanning
/// the block's messages before the consumer, until it passes the middle. Polled every 25 ms,
/// as the benches did, the broker spent 10-14 CPU-s per 20,000 deliveries instead of
/// 0.3-0.4 and delivered 6-8x slower (`cargo bench --bench file_capacity -- broker`);
/// whether a run was hit depended on where the consumer was when a poll landed.
///
/// Listening to every ack instead (a plain subscription to `$JS.ACK.<stream>.<consumer>.>`
/// gets a copy of each) costs the broker about 11 us per ack for the extra delivery:
/// 2.2 CPU-s per 200,000, which halved jsonl's rate on two cores. So the watch listens only
/// to acks of deliveries the broker made with nothing left pending (the ack subject's last
/// token is `0`): the end of the backlog. From then on nothing remains to be delivered, the
/// broker answers an info request without scanning, and the watch asks every 25 ms until
/// every message is acknowledged. [`AckWatch::counting`] listens to every ack, for the
/// timeline diagnostics.
pub struct AckWatch {
    nc: nats::Connection,
    sub: nats::Subscription,
    stream: String,
    consumer: String,
    /// Stream sequences acknowledged (`+ACK`) or terminated (`+TERM`), when counting.
    settled: Option<std::collections::HashSet<u64>>,
    /// [`AckWatch::timing_first`]: every ack until the first one comes, then unsubscribed.
    first: Option<nats::Subscription>,
    /// The first ack came ([`AckWatch::timing_first`]).
    first_seen: bool,
    /// A delivery with nothing pending after it was acknowledged: the backlog is delivered.
    end_seen: bool,
}

/// How often [`AckWatch::wait`] calls its callback, and asks the broker once the backlog is
/// delivered.
const POLL: Duration = Duration::from_millis(25);
/// How often [`AckWatch::wait`] asks the broker before that, in case the end went unseen
/// (the client drops messages for a slow subscriber).
const BACKSTOP: Duration = Duration::from_secs(30);

impl AckWatch {
    /// Listens for the end of the backlog only.
    pub fn start(url: &str, stream: &str, consumer: &str) -> AckWatch {
        // `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`
        Self::listen(url, stream, consumer, "*.*.*.*.0", None)
    }

    /// Also counts every ack (see the type's comment for what that costs the broker).
    pub fn counting(url: &str, stream: &str, consumer: &str) -> AckWatch {
        Self::listen(url, stream, consumer, ">", Some(Default::default()))
    }

    /// Listens for the end of the backlog, and to every ack only until the first one (then
    /// unsubscribes): the first ack timed without the broker copying every later ack to this
    /// process (about 11 us of broker CPU each, above), which on a shared 2-core host comes
    /// out of the measured run's share. `wait` reports `Some(1)` once it came.
    pub fn timing_first(url: &str, stream: &str, consumer: &str) -> AckWatch {
        let mut w = Self::listen(url, stream, consumer, "*.*.*.*.0", None);
        w.first = Some(
            w.nc.subscribe(&format!("$JS.ACK.{stream}.{consumer}.>"))
                .unwrap(),
        );
        w.nc.flush().unwrap();
        w
    }

    fn listen(
        url: &str,
        stream: &str,
        consumer: &str,
        tail: &str,
        settled: Option<std::collections::HashSet<u64>>,
    ) -> AckWatch {
        let nc = connect(url).unwrap();
        let sub = nc
            .subscribe(&format!("$JS.ACK.{stream}.{consumer}.{tail}"))
            .unwrap();
        // The subscription is in place on the broker before anything can ack.
        nc.flush().unwrap();
        AckWatch {
            nc,
            sub,
            stream: stream.into(),
            consumer: consumer.into(),
            settled,
            first: None,
            first_seen: false,
            end_seen: false,
        }
    }

    /// What `wait` hands its callback: the acks counted, or whether the first came.
    fn seen(&self) -> Option<usize> {
        match &self.settled {
            Some(s) => Some(s.len()),
            None => self.first_seen.then_some(1),
        }
    }

    /// Waits until the broker reports all `n` messages of the stream (sequences 1..=n)
    /// acknowledged, calling `each_poll` every 25 ms with the acks counted so far (`None`
    /// unless [`AckWatch::counting`]); the svc runs sample their RSS or timeline there.
    pub fn wait(&mut self, n: usize, mut each_poll: impl FnMut(Option<usize>)) {
        let js = nats::jetstream::new(self.nc.clone());
        let (stream, consumer) = (self.stream.clone(), self.consumer.clone());
        let all_acked = || {
            js.consumer_info(&stream, &consumer)
                .is_ok_and(|i| i.ack_floor.stream_seq as usize >= n && i.num_ack_pending == 0)
        };
        let (mut next_poll, mut next_ask) = (Instant::now(), Instant::now() + BACKSTOP);
        loop {
            let now = Instant::now();
            if now >= next_poll {
                each_poll(self.seen());
                next_poll = now + POLL;
            }
            let ask_now = self.end_seen || self.sub.dropped_messages().unwrap_or(0) > 0;
            if ask_now || now >= next_ask {
                if all_acked() {
                    return;
                }
                next_ask = now + if ask_now { POLL } else { BACKSTOP };
            }
            let until = next_poll.min(next_ask);
            let wait = until.saturating_duration_since(Instant::now());
            if let Some(first) = self.first.take() {
                // Before the first ack nothing can end the backlog: wait on the first alone.
                match first.next_timeout(wait.max(Duration::from_millis(1))) {
                    Ok(_) => {
                        self.first_seen = true;
                        let _ = first.unsubscribe();
                        each_poll(self.seen());
                    }
                    Err(_) => self.first = Some(first),
                }
                continue;
            }
            if let Ok(m) = self.sub.next_timeout(wait.max(Duration::from_millis(1))) {
                self.note(&m);
                while let Some(m) = self.sub.try_next() {
                    self.note(&m);
                }
            }
        }
    }

    /// An ack (`+ACK`, or an empty body) or a termination (`+TERM`) settles its message;
    /// `-NAK` and `+WPI` settle nothing.
    fn note(&mut self, m: &nats::Message) {
        if !(m.data.is_empty() || m.data.starts_with(b"+ACK") || m.data.starts_with(b"+TERM")) {
            return;
        }
        let tokens: Vec<&str> = m.subject.split('.').collect();
        if tokens.get(8) == Some(&"0") {
            self.end_seen = true;
        }
        if let (Some(settled), Some(seq)) = (&mut self.settled, tokens.get(5)) {
            if let Ok(seq) = seq.parse() {
                settled.insert(seq);
            }
        }
    }
}

/// Peak resident set (VmHWM) of a running process, in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) of every thread of a process, by thread name.
pub fn thread_cpu(pid: u32) -> Vec<(String, f64)> {
    let ticks = 100.0; // USER_HZ on Linux
    let mut by_name: std::collections::BTreeMap<String, f64> = Default::default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let cpu: f64 = fields
            .get(11)
            .and_then(|u| u.parse::<f64>().ok())
            .unwrap_or(0.0)
            + fields
                .get(12)
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(0.0);
        let name = name
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .to_string();
        *by_name.entry(name).or_default() += cpu / ticks;
    }
    let mut v: Vec<_> = by_name.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

/// Starts `svc run <config>` with its log on this process's stderr. `SVC_BENCH_SVC=<path>`
/// runs another build of svc instead (an A/B comparison of two commits in one bench run);
/// `SVC_BENCH_WRAPPER="valgrind --tool=callgrind"` runs it under that command (its rates are
/// then the tool's; its instruction counts are what to read).
pub fn spawn_svc_run(config: &std::path::Path) -> Child {
    let svc = std::env::var_os("SVC_BENCH_SVC").unwrap_or(env!("CARGO_BIN_EXE_svc").into());
    let wrapper = std::env::var("SVC_BENCH_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let mut command = match words.next() {
        Some(tool) => {
            let mut c = Command::new(tool);
            c.args(words).arg(svc);
            c
        }
        None => Command::new(svc),
    };
    command
        .arg("run")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// SIGTERM, then waits for the exit. A failed SIGTERM would leave the wait hanging: fail
/// loudly instead.
pub fn terminate(mut child: Child) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill (Debian package procps)");
    assert!(sent.success(), "kill -TERM: {sent}");
    let _ = child.wait();
}

/// Runs `threads` threads named `<name>-<t>` until `work` has been called for every index
/// below `n`, each thread taking the next index; returns calls per second.
pub fn parallel(name: &str, threads: usize, n: usize, work: impl Fn(usize) + Sync) -> f64 {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (next, work) = (&next, &work);
            std::thread::Builder::new()
                .name(format!("{name}-{t}"))
                .spawn_scoped(s, move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    work(i);
                })
                .unwrap();
        }
    });
    n as f64 / start.elapsed().as_secs_f64()
}

/// Whether this is a benchmark run (`cargo bench`, which passes `--bench`) rather than the
/// smoke pass of `cargo test --all-targets`, and the message count: the first numeric
/// argument, else `bench` or `smoke`.
pub fn bench_count(bench: usize, smoke: usize) -> (bool, usize) {
    let benching = std::env::args().any(|a| a == "--bench");
    let n = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(if benching { bench } else { smoke });
    (benching, n)
}

/// `n` envelopes of one order event each (a ~200-byte JSON payload, stream sequences 1..=n),
/// what the file-sink and spool benches write.
pub fn order_envelopes(n: usize) -> Vec<svc::message::envelope::Envelope> {
    use svc::message::envelope::{normalize, EnvelopeConfig, RawMessage};
    let payload = format!(
        r#"{{"order_id":"ORD-000000","customer":"c-42","amount":{{"value":1999,"currency":"EUR"}},"items":[{{"sku":"SKU-1","qty":2}},{{"sku":"SKU-2","qty":1}}],"note":"{}"}}"#,
        "x".repeat(64)
    );
    (1..=n as u64)
        .map(|seq| {
            let msg = RawMessage {
                published_unix_nanos: Some(1_700_000_000_000_000_000),
                headers: vec![("Nats-Msg-Id".into(), format!("m-{seq}"))],
                ..RawMessage::sample("orders.created", seq, payload.as_bytes())
            };
            normalize(&msg, 1_700_000_001_000_000_000, &EnvelopeConfig::default()).0
        })
        .collect()
}

/// `SVC_BENCH_PIN=1` on a host of two or more CPUs: this process, and every thread and child it
/// makes later, on all CPUs but the last, which is left to the peer under test (a receiver, a
/// database), as on a host of its own. Returns that last CPU; `None` when not asked or on one
/// CPU. Call it before any thread starts (threads made earlier keep their mask).
pub fn pin_off_last_cpu() -> Option<usize> {
    if std::env::var("SVC_BENCH_PIN").ok().as_deref() != Some("1") {
        return None;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        println!("SVC_BENCH_PIN: one CPU, nothing pinned");
        return None;
    }
    let last = cpus - 1;
    let status = std::process::Command::new("taskset")
        .args([
            "-pc",
            &format!("0-{}", last - 1),
            &std::process::id().to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("taskset (util-linux)");
    assert!(status.success(), "taskset failed");
    Some(last)
}
