//! A clean stop (SIGTERM) against a real `nats-server -js` (2.9.10, and the current release
//! through `SVC_NATS_SERVER`): the pull requests still open are forgotten by the broker, what
//! they delivered is handed back once per message (no delivery burnt, none left waiting for
//! AckWait), and the whole stop fits in `delivery.shutdown_timeout_seconds` from the signal.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::{json, Value};

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";
const SUBJECT: &str = "orders.>";

fn config(server: &NatsServer, dir: &Path, sink: Value, delivery: Value) -> std::path::PathBuf {
    let mut d = json!({"batch_size": 64, "fetch_expiry_ms": 5000, "max_in_flight_batches": 2,
                       "sink_workers": 1, "shutdown_timeout_seconds": 5});
    for (k, v) in delivery.as_object().unwrap() {
        d[k] = v.clone();
    }
    let cfg = json!({
        "nats": {"url": server.url(), "stream": STREAM, "consumer": CONSUMER,
                 "subject": SUBJECT, "consumer_mode": "bind"},
        "delivery": d,
        "sink": sink,
        "logging": {"level": "info"}
    });
    write_config(dir, "c.json", &cfg)
}

fn file_sink(dir: &Path) -> Value {
    json!({"type": "file", "directory": dir.join("out")})
}

/// A stream and a durable with a 30 s AckWait (a message left waiting for it is obvious) and
/// `max_deliver`.
fn server_with_consumer(max_deliver: i64) -> NatsServer {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    let config = nats::jetstream::ConsumerConfig {
        max_deliver,
        ..durable_config(CONSUMER, SUBJECT, Duration::from_secs(30), 20_000)
    };
    server.js().add_consumer(STREAM, config).unwrap();
    server
}

fn wait_bound(runner: &mut Runner) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runner.log_text().contains("bound to consumer") {
        let gone = runner.child.try_wait().unwrap().is_some();
        assert!(
            !gone && Instant::now() < deadline,
            "not bound: {}",
            runner.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Takes every message the consumer still has, within 3 s, acknowledging each: a message left
/// waiting for its 30 s AckWait is not among them. Returns (taken, acks pending, still to
/// deliver) afterwards.
fn take_the_rest(server: &NatsServer) -> (usize, usize, u64) {
    let nc = server.connect();
    let js = nats::jetstream::new(nc.clone());
    let opts = nats::jetstream::PullSubscribeOptions::new()
        .bind_stream(STREAM.into())
        .durable_name(CONSUMER.into());
    let sub = js.pull_subscribe_with_options(SUBJECT, &opts).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut taken = 0;
    sub.request_batch(nats::jetstream::BatchOptions {
        batch: 100_000,
        expires: Some(2_500_000_000),
        no_wait: false,
        max_bytes: None,
    })
    .unwrap();
    nc.flush().unwrap();
    while Instant::now() < deadline {
        match sub.next_timeout(Duration::from_millis(100)) {
            Ok(m) if m.reply.is_some() => {
                m.respond(b"+ACK").unwrap();
                taken += 1;
            }
            _ => {}
        }
    }
    nc.flush().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (_, acks_pending, to_deliver) = server.consumer_state(STREAM, CONSUMER);
    (taken, acks_pending, to_deliver)
}

/// Four quick SIGTERMs during a 20k backlog left 255, 9, 12 and 8 messages waiting a whole
/// AckWait after exit (delivered into pull requests still open at the stop). Now nothing
/// waits: two seconds after exit every message not stored is available at once.
#[test]
fn sigterm_during_a_backlog_leaves_nothing_waiting_for_ack_wait() {
    for after_ms in [500u64, 2000] {
        let server = server_with_consumer(-1);
        server.publish_n(STREAM, "orders.created", 20_000, |i| {
            format!("{{\"order\":{i}}}").into_bytes()
        });
        let dir = tempfile::tempdir().unwrap();
        // The default delivery settings.
        let defaults = json!({"batch_size": 256, "fetch_expiry_ms": 1000,
                              "max_in_flight_batches": 8});
        let cfg = config(&server, dir.path(), file_sink(dir.path()), defaults);
        let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
        wait_bound(&mut runner);
        std::thread::sleep(Duration::from_millis(after_ms));
        runner.signal("TERM");
        let status = runner.wait_timeout(Duration::from_secs(20));
        let log = runner.log_text();
        assert!(status.is_some_and(|s| s.success()), "{log}");
        std::thread::sleep(Duration::from_secs(2));
        let (taken, acks_pending, to_deliver) = take_the_rest(&server);
        assert_eq!(
            (acks_pending, to_deliver),
            (0, 0),
            "after {after_ms} ms: {taken} taken at once, the rest waits for AckWait\n{log}"
        );
    }
}

/// A sole runner stopped while 5 messages arrived sent 512 NAKs in 0.6 s (each went back into
/// its own open pull requests), every message reached `max_deliver` 5 and the next runner
/// stored 0 of 5; the log said "stop: 512 messages". Then, with the NAKs once per message but
/// without delay, the broker (which may hold a request after its UNSUB) still delivered them
/// back into the stopping runner's requests: at `max_deliver` 2 one message of 5 was lost in 2
/// of 3 tries. Now the NAK waits until those requests have expired: the next runner stores 5
/// of 5 at `max_deliver` 2, whenever the messages arrive during the stop, and the log counts
/// messages.
#[test]
fn a_runner_stopped_as_messages_arrive_burns_no_delivery() {
    for offset in [0, 30, 100] {
        stopped_as_messages_arrive(Duration::from_millis(offset));
    }
}

fn stopped_as_messages_arrive(offset: Duration) {
    let server = server_with_consumer(2);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&server, dir.path(), file_sink(dir.path()), json!({}));
    let mut first = Runner::start(&cfg, &dir.path().join("first.log"));
    wait_bound(&mut first);
    std::thread::sleep(Duration::from_millis(500));
    first.signal("TERM");
    std::thread::sleep(offset);
    let nc = server.connect();
    for i in 0..5 {
        nc.publish("orders.created", format!("{{\"order\":{i}}}"))
            .unwrap();
    }
    nc.flush().unwrap();
    let status = first.wait_timeout(Duration::from_secs(20));
    let log = first.log_text();
    assert!(status.is_some_and(|s| s.success()), "{log}");
    for line in log.lines().filter(|l| l.contains("stop: ")) {
        let n: usize = line
            .split("stop: ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX);
        assert!(n <= 5, "messages, not deliveries: {line}");
    }
    let mut next = Runner::start(&cfg, &dir.path().join("next.log"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.consumer_state(STREAM, CONSUMER) != (5, 0, 0) {
        assert!(
            Instant::now() < deadline,
            "{offset:?}: the next runner did not store 5 of 5: {:?}\nfirst: {log}\nnext: {}",
            server.consumer_state(STREAM, CONSUMER),
            next.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    next.signal("TERM");
    assert!(next.wait_timeout(Duration::from_secs(15)).is_some());
    let stored = files_below(&dir.path().join("out"))
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .count();
    assert_eq!(
        stored, 5,
        "{offset:?}: 5 records, none lost at max_deliver 2"
    );
}

/// The shutdown bound held only after the open pull requests had expired, and a 2 s flush
/// followed: with `fetch_expiry_ms` 10000 and a receiver that never answers, SIGTERM to exit
/// took 11.6 s with a 2 s timeout. Now one clock runs from the signal.
#[test]
fn the_shutdown_timeout_holds_from_the_signal() {
    let server = server_with_consumer(-1);
    // A receiver that takes connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/ingest", listener.local_addr().unwrap());
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
            let _ = seen_tx.send(());
        }
    });
    server.publish_n(STREAM, "orders.created", 5, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    let dir = tempfile::tempdir().unwrap();
    let sink = json!({"type": "http", "url": url, "allow_http_for_local_testing": true,
                      "request_timeout_seconds": 60});
    let delivery = json!({"fetch_expiry_ms": 10000, "shutdown_timeout_seconds": 2});
    let cfg = config(&server, dir.path(), sink, delivery);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_bound(&mut runner);
    seen_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the sink reached the receiver");
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(30));
    let took = signalled.elapsed();
    let log = runner.log_text();
    // The figure for docs/delivery-semantics.md (`--nocapture`).
    eprintln!("SIGTERM to exit: {took:?} (shutdown_timeout_seconds 2)");
    assert!(status.is_some(), "{log}");
    assert!(
        took <= Duration::from_millis(2000 + 800),
        "SIGTERM to exit took {took:?} with shutdown_timeout_seconds 2\n{log}"
    );
}
