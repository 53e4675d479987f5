//! Attack atk46c on `svc replay` and `svc dlq redrive` (issue 46). Each test here reproduces a
//! finding: it fails on the code as attacked and passes once the finding is fixed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

pub(crate) const STREAM: &str = "ORDERS";
pub(crate) const CONSUMER: &str = "svc";

pub(crate) fn config(url: &str, out: &Path, extra: serde_json::Value) -> serde_json::Value {
    let mut cfg = json!({
        "nats": {"url": url, "stream": STREAM, "consumer": CONSUMER, "subject": "orders.>"},
        "delivery": {"batch_size": 2, "fetch_expiry_ms": 200, "max_in_flight_batches": 4,
                     "max_batch_wait_ms": 20, "shutdown_timeout_seconds": 10},
        "sink": {"type": "file", "directory": out},
        "logging": {"level": "warn"}
    });
    if let serde_json::Value::Object(extra) = extra {
        for (k, v) in extra {
            cfg[k] = v;
        }
    }
    cfg
}

pub(crate) fn setup(n: usize) -> NatsServer {
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    server.publish_n(STREAM, "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    server
}

/// The stream sequences of the records a per_event file sink holds.
fn stored(out: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = files_below(out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let bytes = std::fs::read(out.join(&p)).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v["stream_sequence"].as_u64().unwrap()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

fn port_of(server: &NatsServer) -> u16 {
    server.url().rsplit(':').next().unwrap().parse().unwrap()
}

/// A broker in the middle: passes everything, but rewrites the publish-time token of the
/// JetStream ack subject of the delivery of stream sequence `target` to `time` (a hostile or
/// broken broker's word: the token is only ever the broker's).
fn start_time_rewriting_proxy(upstream: u16, target: u64, time: &'static str) -> u16 {
    start_ack_rewriting_proxy(upstream, target, 7, time)
}

/// [`start_time_rewriting_proxy`] for any token of the ack subject (`index` counts from `$JS`:
/// 5 the stream sequence, 7 the publish time, 8 the pending count).
fn start_ack_rewriting_proxy(upstream: u16, target: u64, index: usize, value: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (mut c_in, c_out) = (client.try_clone().unwrap(), client);
            let (s_in, mut s_out) = (server.try_clone().unwrap(), server);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_in, &mut s_out);
                let _ = s_out.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || rewrite_deliveries(s_in, c_out, target, index, value));
        }
    });
    port
}

/// `index` of [`start_ack_rewriting_proxy`] that drops every delivery from `target` on.
const DROP_FROM: usize = usize::MAX;

fn rewrite_deliveries(from: TcpStream, mut to: TcpStream, target: u64, index: usize, value: &str) {
    let mut r = BufReader::new(from);
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
            let _ = to.shutdown(std::net::Shutdown::Both);
            return;
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        let mut tokens: Vec<String> = text.split(' ').map(str::to_string).collect();
        let is_msg = tokens[0] == "MSG" || tokens[0] == "HMSG";
        if !is_msg {
            if to.write_all(&line).is_err() {
                return;
            }
            continue;
        }
        let body: usize = tokens.last().unwrap().parse().unwrap();
        let reply_at = 3;
        let with_reply = tokens.len() == if tokens[0] == "MSG" { 5 } else { 6 };
        if with_reply && tokens[reply_at].starts_with("$JS.ACK.") {
            let mut parts: Vec<&str> = tokens[reply_at].split('.').collect();
            // $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>
            let seq: u64 = parts.get(5).and_then(|s| s.parse().ok()).unwrap_or(0);
            if parts.len() == 9 && index == DROP_FROM && seq >= target {
                // Swallowed: the line and its body go nowhere.
                let mut payload = vec![0u8; body + 2];
                if r.read_exact(&mut payload).is_err() {
                    return;
                }
                continue;
            }
            if parts.len() == 9 && parts[5] == target.to_string() {
                parts[index] = value;
                tokens[reply_at] = parts.join(".");
            }
        }
        let mut out = tokens.join(" ").into_bytes();
        out.extend_from_slice(b"\r\n");
        let mut payload = vec![0u8; body + 2];
        if r.read_exact(&mut payload).is_err() {
            return;
        }
        out.extend_from_slice(&payload);
        if to.write_all(&out).is_err() {
            return;
        }
    }
}

/// FINDING 1 (high): a normalizer that dies (a panic in `svc-normalize`) ends the replay as
/// if the range were done: the reader ignores that its last batch could not be handed over,
/// the writer sees its channel close as "every batch settled", and `replay::run` marks the
/// state done (`next_seq = last + 1`) and exits 0. Here the trigger is a publish time of
/// i128::MIN in the broker's ack subject of sequence 3 (`received - source` in
/// `envelope::normalize` overflows: a panic in a debug build); any other panic in the
/// normalizer's stages does the same. Messages 3..5 are never stored, the state says done,
/// the exit code says every message settled.
#[test]
fn a_normalizer_panic_never_ends_a_replay_as_done() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(5);
    let proxy = start_time_rewriting_proxy(
        port_of(&server),
        3,
        "-170141183460469231731687303715884105728",
    );
    let out = dir.path().join("out");
    let url = format!("nats://127.0.0.1:{proxy}");
    let cfg = write_config(dir.path(), "svc.json", &config(&url, &out, json!({})));
    let state = dir.path().join("svc.json.replay-state");
    let (code, stdout, err) = svc(&["replay", cfg.to_str().unwrap(), "--timeout", "3"]);
    let got = stored(&out);
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap_or_default()).unwrap_or_default();
    let all: Vec<u64> = (1..=5).collect();
    assert!(
        got == all || (code != 0 && st["done"] != json!(true)),
        "exit {code}, stored {got:?} of 1..=5, state done={} next_seq={}: a replay that \
         stored only part of its range said it was done\n{stdout}{err}",
        st["done"],
        st["next_seq"]
    );
}

/// FINDING 3 (medium, classes 11/12): a replay stopped by `payload_encryption`'s per-key bound
/// is continued by `--resume` under the same key, as if nothing happened. docs/replay.md: "A
/// payload-encryption key at its message bound is not a refusal: the replay stops (exit 1) and
/// continues with `--resume` after the key is rotated" -- but the count is per process and a
/// replay keeps it nowhere (no metrics endpoint, not in the summary, not in the state file),
/// so `--resume` without a rotation starts from 0 and seals on; the operator's bound
/// ("the sum of `payload_encrypted_total` over every runner and restart") never sees a
/// replay's encryptions. Here `max_messages_per_key: 3`, five messages: the first run stops,
/// the resume without rotation stores all five under k1.
#[test]
fn resume_after_the_key_bound_does_not_seal_past_it_under_the_same_key() {
    use crate::support::protection::{write_private, AES_K1};
    let dir = tempfile::tempdir().unwrap();
    let server = setup(5);
    let out = dir.path().join("out");
    let k1 = write_private(dir.path(), "k1.key", &AES_K1);
    let mut cfg = config(&server.url(), &out, json!({}));
    cfg["payload_encryption"] = json!({"enabled": true,
        "keys": [{"key_id": "k1", "key_file": k1}], "active_key_id": "k1",
        "max_messages_per_key": 3, "default": "encrypt"});
    cfg["delivery"]["sink_workers"] = json!(1);
    let cfg = write_config(dir.path(), "svc.json", &cfg);
    let (code, stdout, err) = svc(&["replay", cfg.to_str().unwrap(), "--timeout", "3"]);
    assert_eq!(code, 1, "the key bound stops the replay\n{stdout}{err}");
    assert!(err.contains("max_messages_per_key"), "{err}");
    let (code, stdout, err) = svc(&["replay", cfg.to_str().unwrap(), "--resume"]);
    let sealed: usize = files_below(&out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join(p)).unwrap()).unwrap();
            v["payload"]["key_id"] == "k1"
        })
        .count();
    eprintln!("resume exit {code} sealed {sealed}\n{stdout}{err}");
    assert!(
        sealed <= 3,
        "--resume (exit {code}) without rotating k1 stored {sealed} records sealed under k1, \
         max_messages_per_key 3\n{stdout}{err}"
    );
}

/// FINDING 4 (medium, class 7): the redrive reads the source stream's incarnation once, at the
/// start, and compares each record's `original.stream_incarnation` with that; each
/// `STREAM.MSG.GET` then reads whatever stream has the name now. A source stream deleted and
/// created again during the redrive numbers from 1 again, and a record of the old stream whose
/// sequence now holds a message of the same subject and payload (identical payloads are common:
/// heartbeats, retries) is "delivered" -- a message of the new stream, stored under the old
/// incarnation -- and its record removed. docs/replay.md promises such records are counted
/// "original missing" and kept ("the stream was created again since the record (its
/// incarnation differs)"). The dead-letter stream's re-creation is checked before each
/// removal; the source stream's is not checked after the fetch.
#[test]
fn a_source_stream_created_again_mid_redrive_delivers_no_other_message() {
    const DLQ: &str = "DLQ";
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_stream(DLQ, &["dlq.orders"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let body = |i: usize| {
        if i % 2 == 0 {
            format!("{{\"big\":\"{}\"}}", "x".repeat(90)).into_bytes()
        } else {
            format!("{{\"n\":{i}}}").into_bytes()
        }
    };
    server.publish_n(STREAM, "orders.created", 6, body);
    let out = dir.path().join("out");
    let dl = json!({"enabled": true, "subject": "dlq.orders", "expected_stream": DLQ});
    let mut broken = config(&server.url(), &out, json!({"dead_letter": dl.clone()}));
    broken["size_policy"] = json!({"enabled": true, "max_payload_bytes": 50});
    let broken = write_config(dir.path(), "broken.json", &broken);
    let mut runner = crate::support::process::Runner::start(&broken, &dir.path().join("run.log"));
    wait_until(Duration::from_secs(20), "3 dead letters", || {
        server.stream_messages(DLQ) == 3
    });
    runner.signal("TERM");
    runner.wait_timeout(Duration::from_secs(20)).unwrap();
    let old = server.incarnation(STREAM);
    let fixed = write_config(
        dir.path(),
        "fixed.json",
        &config(&server.url(), &out, json!({"dead_letter": dl})),
    );
    let mut redrive = crate::support::process::Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "dlq",
            "redrive",
            fixed.to_str().unwrap(),
            "--max-rate",
            "1",
        ]),
        &dir.path().join("redrive.log"),
    );
    wait_until(
        Duration::from_secs(20),
        "the first dead letter stored",
        // The runner may have dead-lettered 3 before 1: whichever record came first.
        || stored(&out).len() == 4,
    );
    // Held while the stream is created again (it sleeps for its pace now): the next fetch
    // comes after, whatever the host's speed.
    redrive.signal("STOP");
    // Re-created with the same messages: the old records' sequences name new messages now.
    server.js().delete_stream(STREAM).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    server.create_stream(STREAM, &["orders.>"]);
    server.publish_n(STREAM, "orders.created", 6, body);
    assert_ne!(server.incarnation(STREAM), old);
    redrive.signal("CONT");
    let status = redrive.wait_timeout(Duration::from_secs(30)).unwrap();
    let log = redrive.log_text();
    let left = server.stream_messages(DLQ);
    assert!(
        left == 2 && stored(&out).len() == 4,
        "exit {status:?}; records of the old stream left {left} of 2, stored {:?} (old \
         incarnation {old}): messages of the re-created stream were stored as the old \
         stream's and their records removed\n{log}",
        stored(&out)
    );
}

/// FINDING 5 (low-medium, classes 5/12): the replay's end of range is the broker's word in each
/// delivery's ack subject: a pending count of 0 (or one that does not parse, read as 0 by
/// `AckSubject::parse`) before the range's last sequence ends the read as `Exhausted`, and the
/// replay marks the range done and exits 0. A pending count is advice for the runner
/// ("only advice", broker/mod.rs), but an end-of-range proof for the replay. Here the broker's
/// ack subject of sequence 2 of 5 says pending "x": 3..5 are never read, exit 0, state done.
#[test]
fn a_broker_pending_count_of_zero_does_not_end_a_replay_short() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(5);
    let proxy = start_ack_rewriting_proxy(port_of(&server), 2, 8, "x");
    let out = dir.path().join("out");
    let url = format!("nats://127.0.0.1:{proxy}");
    let cfg = write_config(dir.path(), "svc.json", &config(&url, &out, json!({})));
    let state = dir.path().join("svc.json.replay-state");
    let (code, stdout, err) = svc(&["replay", cfg.to_str().unwrap(), "--timeout", "3"]);
    let got = stored(&out);
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap_or_default()).unwrap_or_default();
    assert!(
        got == (1..=5).collect::<Vec<u64>>() || (code != 0 && st["done"] != json!(true)),
        "exit {code}, stored {got:?} of 1..=5, state done={}: a pending count the broker \
         wrote ended the range early\n{stdout}{err}",
        st["done"]
    );
}

/// FINDING 6 (medium, class 6): `--timeout` ("bounds ... the wait for each message from the
/// broker") does not bound a replay whose broker sends only idle heartbeats: `read_while`
/// resets its clock on every status message (heartbeats, flow control) before `continue`, so a
/// consumer that delivers nothing more -- a stalled flow control whose request was lost, a
/// broker in the middle swallowing deliveries, a hostile broker -- keeps the replay waiting for
/// good (the heartbeat every 2 s is younger than any timeout). The heartbeat's own
/// `Nats-Last-Consumer` header, which would show the deliveries missed, is not read. Here the
/// deliveries from sequence 3 on never arrive; with `--timeout 3` the replay should end with
/// exit 1 within seconds, and is still running after 25 s.
#[test]
fn heartbeats_alone_do_not_keep_a_replay_waiting_past_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(5);
    let proxy = start_ack_rewriting_proxy(port_of(&server), 3, DROP_FROM, "");
    let out = dir.path().join("out");
    let url = format!("nats://127.0.0.1:{proxy}");
    let cfg = write_config(dir.path(), "svc.json", &config(&url, &out, json!({})));
    let mut replay = crate::support::process::Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--timeout",
            "3",
        ]),
        &dir.path().join("replay.log"),
    );
    let ended = replay.wait_timeout(Duration::from_secs(25));
    if ended.is_none() {
        replay.signal("KILL");
        let _ = replay.wait_timeout(Duration::from_secs(10));
    }
    assert!(
        ended.is_some_and(|s| s.code() == Some(1)),
        "with --timeout 3 and no delivery after sequence 2, the replay {}\n{}",
        match ended {
            None => "was still waiting after 25 s".to_string(),
            Some(s) => format!("ended with {s}"),
        },
        replay.log_text()
    );
}

/// FINDING 7 (low-medium, classes 6/11): Ctrl-C does not stop a replay that waits on the
/// broker. The stop flag is read only when a message is handed to the reader's callback;
/// `read_while` waits in `next_timeout` and skips status messages, so a replay waiting for a
/// delivery (a slow or stalled broker; with finding 6, for good) ignores SIGINT/SIGTERM
/// (documented: "the reader stops ... and the replay exits 4"), and the two messages it
/// already read sit in an unshipped batch (`max_batch_wait` is only looked at when a message
/// arrives). Here the deliveries from sequence 3 on never arrive and SIGINT is sent after 4 s.
#[test]
fn sigint_stops_a_replay_waiting_on_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(5);
    let proxy = start_ack_rewriting_proxy(port_of(&server), 3, DROP_FROM, "");
    let out = dir.path().join("out");
    let url = format!("nats://127.0.0.1:{proxy}");
    let cfg = write_config(dir.path(), "svc.json", &config(&url, &out, json!({})));
    let mut replay = crate::support::process::Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--timeout",
            "300",
        ]),
        &dir.path().join("replay.log"),
    );
    std::thread::sleep(Duration::from_secs(4));
    replay.signal("INT");
    let ended = replay.wait_timeout(Duration::from_secs(15));
    if ended.is_none() {
        replay.signal("KILL");
        let _ = replay.wait_timeout(Duration::from_secs(10));
    }
    assert!(
        ended.is_some_and(|s| s.code() == Some(4)) && stored(&out) == vec![1, 2],
        "SIGINT while waiting on the broker: {}, stored {:?} (1 and 2 were read)\n{}",
        match ended {
            None => "still running 15 s later".to_string(),
            Some(s) => format!("ended with {s}"),
        },
        stored(&out),
        replay.log_text()
    );
}

/// A replay at 50 msg/s of the stream into `out`, and its ephemeral consumer changed in place
/// after 2 s by `edit` (as anyone allowed to create consumers on the stream can); the
/// broker's answer to the change.
fn replay_with_its_consumer_changed(
    server: &NatsServer,
    dir: &Path,
    out: &Path,
    edit: impl Fn(&mut serde_json::Value),
) -> (crate::support::process::Runner, String) {
    let cfg = write_config(dir, "svc.json", &config(&server.url(), out, json!({})));
    let replay = crate::support::process::Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--max-rate",
            "50",
        ]),
        &dir.join("replay.log"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let nc = server.connect();
    let names = nc
        .request(&format!("$JS.API.CONSUMER.NAMES.{STREAM}"), "{}")
        .unwrap();
    let names: serde_json::Value = serde_json::from_slice(&names.data).unwrap();
    let ephemeral = names["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .find(|n| *n != CONSUMER)
        .expect("the replay's consumer")
        .to_string();
    let info = nc
        .request(&format!("$JS.API.CONSUMER.INFO.{STREAM}.{ephemeral}"), "")
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.data).unwrap();
    let mut changed = info["config"].clone();
    edit(&mut changed);
    let answer = nc
        .request(
            &format!("$JS.API.CONSUMER.CREATE.{STREAM}.{ephemeral}"),
            json!({"stream_name": STREAM, "config": changed}).to_string(),
        )
        .unwrap();
    (replay, String::from_utf8_lossy(&answer.data).to_string())
}

/// FINDING 8 (medium, class 5): the replay's ephemeral consumer is never checked after it is
/// created. Anyone allowed `$JS.API.CONSUMER.CREATE.<stream>.>` (an administrator's tool, a
/// second operator) can update it in place to `headers_only: true`; the reader takes the
/// header-only deliveries (empty data, `Nats-Msg-Size`) as messages and the replay stores
/// records with empty payloads and exits 0. `svc run` guards its own consumer against exactly
/// this (`broker::maybe_headers_only`, `pipeline/fetch.rs` checks the consumer before a
/// suspect batch ships); `svc replay` and `svc dlq redrive` do not. Here the consumer is
/// switched after about 2 s of a 50 msg/s replay of 400 messages of 200 KB (more than the
/// broker pushes ahead of flow control).
#[test]
fn a_replay_consumer_switched_to_headers_only_stores_no_empty_record() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let pad = "p".repeat(200_000);
    server.publish_n(STREAM, "orders.created", 400, |i| {
        format!("{{\"order\":{i},\"pad\":\"{pad}\"}}").into_bytes()
    });
    let out = dir.path().join("out");
    let (mut replay, answer) = replay_with_its_consumer_changed(&server, dir.path(), &out, |c| {
        c["headers_only"] = json!(true)
    });
    assert!(answer.contains("\"headers_only\":true"), "{answer}");
    let status = replay.wait_timeout(Duration::from_secs(60)).unwrap();
    let empty: Vec<u64> = files_below(&out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join(&p)).unwrap()).unwrap();
            let payload = v["payload"].to_string();
            (!payload.contains("order")).then(|| v["stream_sequence"].as_u64().unwrap())
        })
        .collect();
    assert!(
        empty.is_empty(),
        "replay ended with {status}; {} records stored without their payload, from sequence \
         {:?}\n{}",
        empty.len(),
        empty.iter().min(),
        replay.log_text()
    );
}

/// FINDING 9 (low-medium, class 11): `--max-rate N` ("at most N messages per second, so a
/// replay does not starve the live runner's sink") is an average since the start, not a
/// ceiling: the reader sleeps until `count / N` seconds after the start, so after any pause
/// (a sink that was slow or retrying for a minute and held the pipeline back, a stopped
/// process, a slow broker) the replay reads and writes the missed share at full speed. Here a
/// replay at 5 msg/s is stopped (SIGSTOP) for 8 s: on SIGCONT about 40 messages go at once.
#[test]
fn max_rate_is_a_ceiling_after_a_pause_too() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(80);
    let out = dir.path().join("out");
    let mut cfg = config(&server.url(), &out, json!({}));
    cfg["delivery"]["sink_workers"] = json!(1);
    cfg["delivery"]["batch_size"] = json!(1);
    let cfg = write_config(dir.path(), "svc.json", &cfg);
    let mut replay = crate::support::process::Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--max-rate",
            "5",
            "--timeout",
            "60",
        ]),
        &dir.path().join("replay.log"),
    );
    std::thread::sleep(Duration::from_secs(2));
    replay.signal("STOP");
    std::thread::sleep(Duration::from_secs(8));
    let before = stored(&out).len();
    replay.signal("CONT");
    std::thread::sleep(Duration::from_secs(1));
    let burst = stored(&out).len() - before;
    replay.signal("TERM");
    let _ = replay.wait_timeout(Duration::from_secs(20));
    assert!(
        burst <= 10,
        "--max-rate 5: {burst} messages stored in the second after a pause of 8 s"
    );
}

/// FINDING 10 (low-medium, exit codes vs what happened): a range the stream no longer holds
/// (aged out, purged) is reported as a success. `--start-seq` past the stream's end is refused
/// ("not reported as read 0"), but a range before its first sequence reads nothing and exits 0
/// with "read 0" -- the operator who restores a sink from a backup and replays the gap is told
/// it is replayed. Here sequences 1..6 are purged and `--start-seq 1 --end-seq 5` is asked.
#[test]
fn a_range_the_stream_no_longer_holds_is_not_reported_as_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(10);
    let nc = server.connect();
    let answer = nc
        .request(
            &format!("$JS.API.STREAM.PURGE.{STREAM}"),
            json!({"seq": 7}).to_string(),
        )
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answer.data).contains("\"success\":true"),
        "{}",
        String::from_utf8_lossy(&answer.data)
    );
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "svc.json",
        &config(&server.url(), &out, json!({})),
    );
    let (code, stdout, err) = svc(&[
        "replay",
        cfg.to_str().unwrap(),
        "--start-seq",
        "1",
        "--end-seq",
        "5",
    ]);
    assert!(
        code != 0,
        "a range of purged messages: exit {code}, nothing said\n{stdout}{err}"
    );
}

/// FINDING 8b (medium, class 5, same cause as finding 8): the replay's consumer updated to
/// another `filter_subject` mid-run makes the replay store messages outside `nats.subjects`
/// (and outside `--subject`): the reader checks no delivered subject against the filter it
/// asked for. Here the stream also holds `audit.>` messages the configuration never reads;
/// the consumer is switched to `audit.>` after about 2 s: the 20 audit messages are stored,
/// the orders not yet delivered are never read, and the replay exits 0.
#[test]
fn a_replay_consumer_switched_to_another_filter_stores_nothing_outside_the_subjects() {
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start();
    server.create_stream(STREAM, &["orders.>", "audit.>"]);
    server.create_consumer(STREAM, CONSUMER, "orders.>", Duration::from_secs(30));
    let pad = "p".repeat(200_000);
    server.publish_n(STREAM, "orders.created", 300, |i| {
        format!("{{\"order\":{i},\"pad\":\"{pad}\"}}").into_bytes()
    });
    server.publish_n(STREAM, "audit.secret", 20, |i| {
        format!("{{\"audit\":{i}}}").into_bytes()
    });
    let out = dir.path().join("out");
    let (mut replay, answer) = replay_with_its_consumer_changed(&server, dir.path(), &out, |c| {
        c["filter_subject"] = json!("audit.>")
    });
    assert!(
        serde_json::from_str::<serde_json::Value>(&answer).unwrap()["config"]["filter_subject"]
            == "audit.>",
        "{answer}"
    );
    let status = replay.wait_timeout(Duration::from_secs(60)).unwrap();
    let foreign = files_below(&out)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join(p)).unwrap()).unwrap();
            v["subject"] != "orders.created"
        })
        .count();
    let orders = stored(&out).len() - foreign;
    assert!(
        foreign == 0 && (orders == 300 || status.code() != Some(0)),
        "replay ended with {status}; {foreign} records of subjects outside nats.subjects \
         stored, {orders} of the 300 orders\n{}",
        replay.log_text()
    );
}

/// FINDING 11 (low, class 4): the one-replay-per-state-file lock is a `flock` on
/// `<state>.lock` taken by name. Another account that can write the directory (the threat
/// the state file's own checks are for) unlinks the lock file while a replay holds it; the
/// next replay creates a new `<state>.lock`, locks that, and runs beside the first on the same
/// state file (both write the sink and the state). The lock holder never checks that its lock
/// is still the file at the name. Here a replay at 2 msg/s holds the lock, the lock file is
/// removed, and a `--resume` of the same state is started.
#[test]
fn an_unlinked_lock_file_does_not_let_a_second_replay_share_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let server = setup(40);
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "svc.json",
        &config(&server.url(), &out, json!({})),
    );
    let mut first = crate::support::process::Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg.to_str().unwrap(),
            "--max-rate",
            "2",
        ]),
        &dir.path().join("first.log"),
    );
    let lock = dir.path().join("svc.json.replay-state.lock");
    wait_until(Duration::from_secs(10), "the first replay's lock", || {
        lock.exists()
    });
    std::thread::sleep(Duration::from_secs(2));
    std::fs::remove_file(&lock).unwrap();
    let (code, stdout, err) = svc(&[
        "replay",
        cfg.to_str().unwrap(),
        "--resume",
        "--max-rate",
        "1000",
    ]);
    first.signal("TERM");
    let _ = first.wait_timeout(Duration::from_secs(20));
    assert!(
        code == 1 && err.contains("another replay or redrive"),
        "a second replay of the state file while the first still ran: exit {code}\n{stdout}{err}"
    );
}
