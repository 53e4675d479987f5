//! Confirmed acknowledgements (`delivery.ack_confirmation`) against a real `nats-server -js`
//! (2.9.10, and the current release through `SVC_NATS_SERVER`), behind a proxy that can lose
//! the runner's ACKs on the wire and cut its connection.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "svc";

/// A proxy in front of a broker that, while `drop_acks` is set, forwards every operation of
/// the client but its publishes to `$JS.ACK.` subjects (lost on the wire), and can cut every
/// connection it carries.
struct AckLosingProxy {
    port: u16,
    drop_acks: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl AckLosingProxy {
    fn start(upstream: u16) -> AckLosingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = AckLosingProxy {
            port: listener.local_addr().unwrap().port(),
            drop_acks: Arc::new(AtomicBool::new(false)),
            dropped: Arc::new(AtomicU64::new(0)),
            open: Arc::new(Mutex::new(Vec::new())),
        };
        let (drop_acks, dropped, open) = (
            proxy.drop_acks.clone(),
            proxy.dropped.clone(),
            proxy.open.clone(),
        );
        std::thread::Builder::new()
            .name("ack-losing-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                        continue;
                    };
                    let mut held = open.lock().unwrap();
                    held.push(client.try_clone().unwrap());
                    held.push(server.try_clone().unwrap());
                    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let (d, n) = (drop_acks.clone(), dropped.clone());
                    std::thread::spawn(move || client_to_server(client, server, d, n));
                    std::thread::spawn(move || copy(s2, c2));
                }
            })
            .unwrap();
        proxy
    }

    /// Closes every connection: the client reconnects through the proxy.
    fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// Forwards the client's protocol operation by operation, leaving out `PUB $JS.ACK.…` while
/// `drop_acks` is set.
fn client_to_server(
    mut from: TcpStream,
    mut to: TcpStream,
    drop_acks: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some((len, is_ack)) = next_operation(&pending) {
            if is_ack && drop_acks.load(Ordering::SeqCst) {
                dropped.fetch_add(1, Ordering::SeqCst);
            } else if to.write_all(&pending[..len]).is_err() {
                return;
            }
            pending.drain(..len);
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// The length of the first whole client operation in `buf` and whether it publishes to an ack
/// subject; `None` until it is whole.
fn next_operation(buf: &[u8]) -> Option<(usize, bool)> {
    let eol = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[..eol]).unwrap_or("");
    let words: Vec<&str> = line.split_ascii_whitespace().collect();
    let body = match words.first().map(|w| w.to_ascii_uppercase()).as_deref() {
        Some("PUB") => words.last()?.parse::<usize>().ok()? + 2,
        Some("HPUB") => words.last()?.parse::<usize>().ok()? + 2,
        _ => 0,
    };
    let len = eol + 2 + body;
    (buf.len() >= len).then(|| (len, words.get(1).is_some_and(|s| s.starts_with("$JS.ACK."))))
}

fn config(url: &str, dir: &Path) -> PathBuf {
    let cfg = json!({
        "nats": {"url": url, "stream": STREAM, "consumer": CONSUMER, "subject": "orders.>",
                 "consumer_mode": "bind"},
        "delivery": {"batch_size": 25, "fetch_expiry_ms": 500, "max_in_flight_batches": 2,
                     "sink_workers": 1, "shutdown_timeout_seconds": 5,
                     "ack_confirmation": true, "ack_confirmation_timeout_ms": 300},
        "sink": {"type": "file", "directory": dir.join("out")},
        "metrics": {"enabled": true, "snapshot_file": dir.join("metrics.json"),
                    "write_interval_seconds": 1},
        "logging": {"level": "info"}
    });
    write_config(dir, "c.json", &cfg)
}

/// A broker with `n` messages for a consumer of `ack_wait`, and a runner with confirmed ACKs
/// behind a proxy that loses every ACK until told otherwise.
struct Losing {
    server: NatsServer,
    proxy: AckLosingProxy,
    dir: tempfile::TempDir,
    snapshot: PathBuf,
    cfg: PathBuf,
    runner: Runner,
}

fn start_losing_acks(ack_wait: Duration, n: usize) -> Losing {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", ack_wait);
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    let upstream: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
    let proxy = AckLosingProxy::start(upstream);
    proxy.drop_acks.store(true, Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("metrics.json");
    let cfg = config(&format!("nats://127.0.0.1:{}", proxy.port), dir.path());
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    Losing {
        server,
        proxy,
        dir,
        snapshot,
        cfg,
        runner,
    }
}

/// ACKs lost on the wire and a connection cut between ACK and confirmation: nothing counts as
/// acknowledged before the broker confirms it, the runner holds no more than its credits
/// meanwhile, and after the cut every ACK is sent again and confirmed, with no redelivery and
/// one file per message. Then live traffic is confirmed as it flows.
#[test]
fn lost_acks_are_sent_again_until_the_broker_confirms_them() {
    // A 60 s AckWait: nothing below is settled by a redelivery.
    let Losing {
        server,
        proxy,
        dir,
        snapshot,
        mut runner,
        ..
    } = start_losing_acks(Duration::from_secs(60), 100);

    // Its credits (2 batches of 25) are all held by unconfirmed ACKs: 50 written, no more.
    wait_until(Duration::from_secs(30), "ACKs lost and sent again", || {
        snapshot_counter(&snapshot, "messages_written_total") >= 50
            && snapshot_counter(&snapshot, "acks_resent_total") >= 100
    });
    std::thread::sleep(Duration::from_millis(1200));
    let c = |name| snapshot_counter(&snapshot, name);
    assert_eq!(c("messages_written_total"), 50, "{}", runner.log_text());
    assert_eq!(c("messages_acked_total"), 0, "{}", runner.log_text());
    assert_eq!(c("ack_confirmations_total"), 0);
    assert!(proxy.dropped.load(Ordering::SeqCst) >= 150);
    let (floor, pending, _) = server.consumer_state(STREAM, CONSUMER);
    assert_eq!((floor, pending), (0, 50), "no ACK reached the broker");

    proxy.drop_acks.store(false, Ordering::SeqCst);
    proxy.cut();
    wait_until(Duration::from_secs(30), "every message confirmed", || {
        c("ack_confirmations_total") >= 100 && server.consumer_state(STREAM, CONSUMER).0 == 100
    });
    server.publish_n(STREAM, "orders.created", 200, |i| {
        format!("{{\"later\":{i}}}").into_bytes()
    });
    wait_until(Duration::from_secs(30), "live traffic confirmed", || {
        c("ack_confirmations_total") >= 300
    });
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(10))
        .expect("stopped");
    let log = runner.log_text();
    assert!(status.success(), "{log}");
    assert!(c("broker_connection_reconnects_total") >= 1, "{log}");
    assert_eq!(c("messages_acked_total"), 300, "{log}");
    assert_eq!(c("ack_confirmations_total"), 300, "{log}");
    assert_eq!(c("ack_confirmations_abandoned_total"), 0, "{log}");
    let info = server.js().consumer_info(STREAM, CONSUMER).unwrap();
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(info.num_redelivered, 0, "a lost ACK became a redelivery");
    assert_eq!(files_below(&dir.path().join("out")).len(), 300);
}

/// A stop while the broker confirms nothing: the runner stops within its shutdown timeout,
/// says how many ACKs were unconfirmed, and counts none of them as acknowledged; what they did
/// not settle is delivered again to the next runner and stored once.
#[test]
fn a_stop_gives_up_unconfirmed_acks_and_nothing_is_lost() {
    let Losing {
        server,
        proxy,
        dir,
        snapshot,
        cfg,
        mut runner,
    } = start_losing_acks(Duration::from_secs(2), 30);
    wait_until(Duration::from_secs(30), "30 written", || {
        snapshot_counter(&snapshot, "messages_written_total") >= 30
    });
    runner.signal("TERM");
    let status = runner
        .wait_timeout(Duration::from_secs(10))
        .expect("stopped");
    let log = runner.log_text();
    assert!(status.success(), "{log}");
    assert!(log.contains("were not confirmed before the stop"), "{log}");
    assert_eq!(
        snapshot_counter(&snapshot, "messages_acked_total"),
        0,
        "{log}"
    );

    // The next runner, with ACKs reaching the broker, stores nothing twice.
    proxy.drop_acks.store(false, Ordering::SeqCst);
    let mut second = Runner::start(&cfg, &dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(30), "every message settled", || {
        server.consumer_state(STREAM, CONSUMER).0 == 30
    });
    second.signal("TERM");
    assert!(second.wait_timeout(Duration::from_secs(10)).is_some());
    assert_eq!(files_below(&dir.path().join("out")).len(), 30);
}
