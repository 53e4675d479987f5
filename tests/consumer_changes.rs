//! The consumer changed under a running runner, against a real `nats-server -js`: deleted, or
//! its filter changed. The runner must stop with a clear error within a bounded time, and while
//! it notices it must not spin (no request/503 loop).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";
const CONNECTION: &str = "svc-watched";

fn setup() -> (NatsServer, tempfile::TempDir, Runner) {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>", "payments.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(5));
    let dir = tempfile::tempdir().unwrap();
    let cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER,
                 "subject": SUBJECT, "connection_name": CONNECTION},
        "delivery": {"batch_size": 16, "fetch_expiry_ms": 500, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 5},
        "sink": {"type": "file", "directory": dir.path().join("out")},
        "logging": {"level": "info"}
    });
    let cfg = write_config(dir.path(), "c.json", &cfg);
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(20), "runner bound", || {
        runner.log_text().contains("bound to consumer")
    });
    server.publish_n(STREAM, "orders.created", 20, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    wait_until(Duration::from_secs(20), "first messages acked", || {
        server.try_consumer_state(STREAM, CONSUMER) == Some((20, 0, 0))
    });
    (server, dir, runner)
}

/// Messages the broker has received from the runner's connection (pull requests, ACKs,
/// consumer checks), from the monitoring endpoint; None once the connection is gone.
fn runner_messages_in(server: &NatsServer) -> Option<u64> {
    let (_, body) = http_get(server.monitor_port, "/connz")?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["connections"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == CONNECTION)
        .and_then(|c| c["in_msgs"].as_u64())
}

/// CPU time (user + system) of a process so far, from /proc; None once it is gone.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

/// What the runner did from `change` until it exited.
struct Aftermath {
    exit_code: Option<i32>,
    took: Duration,
    messages_sent: u64,
    cpu: Duration,
}

/// Applies `change`, then samples the runner until it exits (at most `limit`).
fn watch_exit(
    server: &NatsServer,
    runner: &mut Runner,
    limit: Duration,
    change: impl FnOnce(),
) -> Aftermath {
    let pid = runner.child.id();
    let msgs_before = runner_messages_in(server).expect("runner connected");
    let cpu_before = cpu_time(pid).expect("runner alive");
    let (mut msgs_last, mut cpu_last) = (msgs_before, cpu_before);
    let start = Instant::now();
    change();
    let status = loop {
        if let Some(s) = runner.child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            break None;
        }
        if let Some(m) = runner_messages_in(server) {
            msgs_last = m;
        }
        if let Some(c) = cpu_time(pid) {
            cpu_last = c;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Aftermath {
        exit_code: status.and_then(|s| s.code()),
        took: start.elapsed(),
        messages_sent: msgs_last - msgs_before,
        cpu: cpu_last.saturating_sub(cpu_before),
    }
}

/// No spinning: a request/503 loop sends thousands of pull requests a second and keeps a
/// core busy. The bounds are wide (a loaded machine), but far below a loop's.
fn assert_calm(a: &Aftermath, log: &str) {
    let per_second = a.messages_sent as f64 / a.took.as_secs_f64().max(1.0);
    assert!(
        per_second < 100.0,
        "{} messages to the broker in {:?}: a busy loop\n{log}",
        a.messages_sent,
        a.took
    );
    assert!(
        a.cpu < a.took / 2,
        "{:?} CPU in {:?}: a busy loop\n{log}",
        a.cpu,
        a.took
    );
}

fn assert_log_once(log: &Path, needle: &str) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(text.contains(needle), "log lacks {needle:?}:\n{text}");
    assert!(
        !text.contains("Error {"),
        "a Debug-formatted error:\n{text}"
    );
    text
}

#[test]
fn deleted_consumer_stops_the_runner_with_a_clear_error() {
    let (server, dir, mut runner) = setup();
    let a = watch_exit(&server, &mut runner, Duration::from_secs(30), || {
        server.js().delete_consumer(STREAM, CONSUMER).unwrap();
    });
    let log = runner.log_text();
    assert_eq!(
        a.exit_code,
        Some(1),
        "exits non-zero in {:?}\n{log}",
        a.took
    );
    assert_log_once(
        &dir.path().join("svc.log"),
        "consumer ORDERS/svc was deleted while this runner was bound (the broker answers \
         \"consumer not found\"); stopping",
    );
    assert_calm(&a, &log);
}

#[test]
fn changed_filter_stops_the_runner_with_a_clear_error() {
    let (server, dir, mut runner) = setup();
    let a = watch_exit(&server, &mut runner, Duration::from_secs(30), || {
        // nats-server 2.9 updates a durable's filter when it is created again with another.
        server
            .js()
            .add_consumer(
                STREAM,
                nats::jetstream::ConsumerConfig {
                    durable_name: Some(CONSUMER.into()),
                    ack_policy: nats::jetstream::AckPolicy::Explicit,
                    filter_subject: "payments.>".into(),
                    ack_wait: Duration::from_secs(5),
                    max_ack_pending: 20_000,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(
            server
                .js()
                .consumer_info(STREAM, CONSUMER)
                .unwrap()
                .config
                .filter_subject,
            "payments.>",
            "the broker changed the filter in place"
        );
    });
    let log = runner.log_text();
    assert_eq!(
        a.exit_code,
        Some(1),
        "exits non-zero in {:?}\n{log}",
        a.took
    );
    assert_log_once(
        &dir.path().join("svc.log"),
        "consumer ORDERS/svc now filters subject \"payments.>\" but nats.subject is \
         \"orders.>\"; stopping",
    );
    assert_calm(&a, &log);
}

#[test]
fn consumer_recreated_alike_is_used_again() {
    let (server, _dir, mut runner) = setup();
    server.js().delete_consumer(STREAM, CONSUMER).unwrap();
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(5));
    server.publish_n(STREAM, "orders.created", 10, |i| {
        format!("{{\"order\":{}}}", 20 + i).into_bytes()
    });
    // The new durable delivers the whole stream again: the sink's keys absorb the first 20.
    wait_until(
        Duration::from_secs(30),
        "every message acked by the recreated consumer",
        || server.try_consumer_state(STREAM, CONSUMER) == Some((30, 0, 0)),
    );
    // Past the next routine check and its confirmation: still running.
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        runner.child.try_wait().unwrap().is_none(),
        "stopped: {}",
        runner.log_text()
    );
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(15))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{}", runner.log_text());
}

/// What the broker itself does, so that an upgrade that changes it is noticed: a waiting pull
/// request of a deleted durable ends with `409 Consumer Deleted`; a later one gets no answer
/// at all on 2.9, not even its expiry, and `503` on current servers (hence the runner's
/// routine check, not only the statuses).
#[test]
fn broker_ends_pull_requests_of_a_deleted_consumer_with_409_then_silence() {
    use nats::jetstream::{BatchOptions, PullSubscribeOptions};
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, SUBJECT, Duration::from_secs(5));
    let nc = server.connect();
    let js = nats::jetstream::new(nc.clone());
    let sub = js
        .pull_subscribe_with_options(
            SUBJECT,
            &PullSubscribeOptions::new()
                .bind_stream(STREAM.into())
                .durable_name(CONSUMER.into()),
        )
        .unwrap();
    // A long expiry and an explicit flush: the request is surely waiting at the consumer when
    // it is deleted, however loaded the host (the client otherwise writes it up to 5 ms late).
    let request = |expires: Duration| {
        sub.request_batch(BatchOptions {
            batch: 10,
            expires: Some(expires.as_nanos() as usize),
            no_wait: false,
            max_bytes: None,
        })
        .unwrap();
        nc.flush().unwrap();
    };
    request(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    server.js().delete_consumer(STREAM, CONSUMER).unwrap();
    let ended = sub
        .next_timeout(Duration::from_secs(10))
        .expect("the waiting request is ended");
    let headers = ended.headers.expect("a status reply");
    // The broker's status, on the version line (never a header line a publisher could send).
    assert_eq!(headers.status(), Some("409"));
    assert_eq!(headers.description(), Some("Consumer Deleted"));
    request(Duration::from_secs(1));
    let later = sub.next_timeout(Duration::from_secs(3));
    // nats-server 2.9 never answers a later request, not even with a 408 after its 1 s
    // expiry; current servers answer at once with 503 (no responders). The runner takes
    // either as the end of the request and the consumer watch finds the consumer gone.
    let no_responders = |m: &nats::Message| {
        m.reply.is_none() && m.headers.as_ref().and_then(|h| h.status()) == Some("503")
    };
    assert!(
        matches!(&later, Err(e) if e.kind() == std::io::ErrorKind::TimedOut)
            || matches!(&later, Ok(m) if no_responders(m)),
        "a later request gets silence or no responders: {later:?}"
    );
}

/// A filter widened under the running runner while messages of the new subjects arrive: the
/// runner stores none of them (it stops at the first delivery outside its configured subject,
/// or when its watch sees the change, whichever comes first). On nats-server 2.15 it once
/// stored and acknowledged 800 of 800 such messages before the watch stopped it.
#[test]
fn a_widened_filter_delivers_nothing_of_the_new_subjects_to_the_sink() {
    let (server, dir, mut runner) = setup();
    let publishing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let a = watch_exit(&server, &mut runner, Duration::from_secs(30), || {
        server
            .js()
            .add_consumer(
                STREAM,
                nats::jetstream::ConsumerConfig {
                    durable_name: Some(CONSUMER.into()),
                    ack_policy: nats::jetstream::AckPolicy::Explicit,
                    filter_subject: ">".into(),
                    ack_wait: Duration::from_secs(5),
                    max_ack_pending: 20_000,
                    ..Default::default()
                },
            )
            .unwrap();
        let (url, on) = (server.url(), publishing.clone());
        std::thread::spawn(move || {
            let nc = nats::connect(&url).unwrap();
            let js = nats::jetstream::new(nc);
            while on.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = js.publish("payments.made", b"{\"paid\":1}");
            }
        });
    });
    publishing.store(false, std::sync::atomic::Ordering::SeqCst);
    let log = runner.log_text();
    assert_eq!(a.exit_code, Some(1), "{log}");
    let stored: Vec<_> = files_below(&dir.path().join("out"))
        .into_iter()
        .filter(|p| {
            let text = std::fs::read_to_string(dir.path().join("out").join(p)).unwrap_or_default();
            text.contains("payments.made")
        })
        .collect();
    assert!(stored.is_empty(), "{} payments stored: {log}", stored.len());
}
