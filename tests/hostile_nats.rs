//! Hostile brokers, each a fake on purpose (no real server misbehaves this way); they speak
//! just enough of the protocol (INFO, CONNECT, PING/PONG, SUB/PUB/MSG) for the client.
//!
//! - A NATS seed that speaks TLS and, in its INFO, advertises a rogue plaintext server
//!   (`connect_urls`) that records every byte it receives. Once the seed drops the
//!   connection, the client reconnects, among others to the rogue. The runner must never send
//!   its CONNECT (and so its credential) there: TLS, once asked for (a `tls://` URL or
//!   `tls_ca_file`), applies to every server, those learned from INFO included.
//! - A plaintext loopback seed that advertises a server off the host: with credentials, the
//!   runner refuses to start and sends the seed nothing.
//! - A lying broker whose `-ERR` and JetStream API error texts try to forge or flood log lines.
//! - `svc validate` on credentials that would cross a network in plaintext.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::broker::NatsServer;
use crate::support::certs::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

/// The rogue: accepts every connection, greets like a plaintext NATS server and records what
/// the client sends until it stops or half a second passes.
struct Rogue {
    port: u16,
    connections: Arc<AtomicUsize>,
    received: Arc<Mutex<Vec<u8>>>,
}

impl Rogue {
    fn start() -> Rogue {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (c, r) = (connections.clone(), received.clone());
        std::thread::Builder::new()
            .name("rogue".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(mut stream) = stream else { continue };
                    let info = format!(
                        "INFO {{\"server_id\":\"rogue\",\"version\":\"2.10.0\",\"proto\":1,\
                         \"host\":\"127.0.0.1\",\"port\":{port},\"max_payload\":1048576,\
                         \"headers\":true,\"auth_required\":true,\"client_id\":1,\"go\":\"go1.22\"}}\r\n"
                    );
                    let _ = stream.write_all(info.as_bytes());
                    stream
                        .set_read_timeout(Some(Duration::from_millis(500)))
                        .unwrap();
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        r.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                }
            })
            .unwrap();
        Rogue {
            port,
            connections,
            received,
        }
    }
}

/// The seed: one TLS session. Plaintext INFO (TLS required, the rogue advertised), then TLS,
/// CONNECT + PING answered with PONG; then it hangs up and stops listening, so the client's
/// reconnects go to the rogue. Returns the port and what the seed received inside TLS.
fn start_seed(tls: Arc<rustls::ServerConfig>, rogue_port: u16) -> (u16, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Arc::new(Mutex::new(Vec::new()));
    let r = received.clone();
    std::thread::Builder::new()
        .name("seed".into())
        .spawn(move || {
            let (mut tcp, _) = listener.accept().unwrap();
            drop(listener);
            let info = format!(
                "INFO {{\"server_id\":\"seed\",\"version\":\"2.10.0\",\"proto\":1,\
                 \"host\":\"127.0.0.1\",\"port\":{port},\"max_payload\":1048576,\
                 \"headers\":true,\"auth_required\":true,\"tls_required\":true,\"client_id\":1,\
                 \"go\":\"go1.22\",\
                 \"connect_urls\":[\"127.0.0.1:{rogue_port}\"]}}\r\n"
            );
            tcp.write_all(info.as_bytes()).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let conn = rustls::ServerConnection::new(tls).unwrap();
            let mut reader = BufReader::new(rustls::StreamOwned::new(conn, tcp));
            let mut line = String::new();
            // CONNECT, then PING: answer every PING. Hang up at the first request (the
            // runner's consumer lookup), so the client is connected when the seed goes.
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                let ping = line.starts_with("PING");
                let request = line.starts_with("PUB") || line.starts_with("HPUB");
                r.lock().unwrap().extend_from_slice(line.as_bytes());
                line.clear();
                if ping {
                    let _ = reader.get_mut().write_all(b"PONG\r\n");
                    let _ = reader.get_mut().flush();
                }
                if request {
                    break;
                }
            }
            // No close_notify: the crate's TLS reader waits forever after one (it stops
            // polling for input), so the seed just drops the TCP connection.
            let stream = reader.into_inner();
            let _ = stream.sock.shutdown(std::net::Shutdown::Both);
        })
        .unwrap();
    (port, received)
}

fn run_against_hostile_seed(
    nats: serde_json::Value,
    env: &[(&str, &str)],
    secret: &str,
    certs: &Path,
) {
    let rogue = Rogue::start();
    let (seed_port, seed_received) = start_seed(tls_server_config(certs), rogue.port);
    let dir = tempfile::tempdir().unwrap();
    let mut nats = nats;
    let url = nats["url"]
        .as_str()
        .unwrap()
        .replace("SEED", &seed_port.to_string());
    nats["url"] = json!(url);
    nats["stream"] = json!("ORDERS");
    nats["consumer"] = json!("svc");
    nats["subject"] = json!("orders.>");
    nats["tls_ca_file"] = json!(certs.join("ca.pem"));
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({"nats": nats, "sink": {"type": "file", "directory": dir.path().join("out")}}),
    );
    let log = dir.path().join("svc.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_svc"));
    cmd.arg("run").arg(&cfg).env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();

    // Several reconnect attempts reach the rogue well within the runner's 5 s JetStream
    // request timeout; wait for two of them (or the runner's exit).
    let deadline = Instant::now() + Duration::from_secs(30);
    while rogue.connections.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let log_text = std::fs::read_to_string(&log).unwrap();

    // The setup did what it claims: the seed got the credential inside TLS, and the client
    // went to the rogue it advertised.
    let seed_got = String::from_utf8_lossy(&seed_received.lock().unwrap()).into_owned();
    assert!(
        seed_got.starts_with("CONNECT ") && seed_got.contains(secret),
        "the seed should have been sent CONNECT over TLS: {seed_got:?}\n{log_text}"
    );
    assert!(
        rogue.connections.load(Ordering::SeqCst) >= 1,
        "the client never tried the advertised server\n{log_text}"
    );
    // The secure outcome: nothing readable, no CONNECT, no credential at the rogue. What it
    // got is a TLS ClientHello (record type 0x16).
    let rogue_got = rogue.received.lock().unwrap().clone();
    let text = String::from_utf8_lossy(&rogue_got);
    assert!(
        !text.contains("CONNECT") && !text.contains(secret),
        "plaintext CONNECT sent to the rogue: {text:?}"
    );
    assert!(
        rogue_got.is_empty() || rogue_got[0] == 0x16,
        "the rogue should only see TLS handshakes: {text:?}"
    );
    assert!(!log_text.contains(secret), "{log_text}");
}

#[test]
fn an_advertised_plaintext_server_never_gets_the_token() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let token = "tok-hostile-seed-never-in-clear";
    let auth = json!({"mode": "token", "token_env": "SVC_TEST_TOKEN"});
    // The reported case: a tls:// seed, tls_ca_file, tls_required at its default.
    run_against_hostile_seed(
        json!({"url": "tls://127.0.0.1:SEED", "auth": auth}),
        &[("SVC_TEST_TOKEN", token)],
        token,
        certs.path(),
    );
    // tls_ca_file alone (a nats:// seed whose INFO asks for TLS) is a TLS request too.
    run_against_hostile_seed(
        json!({"url": "nats://127.0.0.1:SEED", "auth": auth}),
        &[("SVC_TEST_TOKEN", token)],
        token,
        certs.path(),
    );
}

#[test]
fn an_advertised_plaintext_server_never_gets_the_password() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let password = "pw-hostile-seed-never-in-clear";
    run_against_hostile_seed(
        json!({"url": "tls://127.0.0.1:SEED",
               "auth": {"mode": "user_password", "username_env": "SVC_U", "password_env": "SVC_P"}}),
        &[("SVC_U", "svc"), ("SVC_P", password)],
        password,
        certs.path(),
    );
}

/// `svc validate` refuses credentials that would cross a network in plaintext, naming the
/// field, and accepts them over TLS, to loopback, or with the documented opt-in.
#[test]
fn validate_refuses_plaintext_credentials_to_remote_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, nats: serde_json::Value| {
        let mut n = json!({"stream": "ORDERS", "consumer": "svc", "subject": "orders.>"});
        for (k, v) in nats.as_object().unwrap() {
            n[k] = v.clone();
        }
        let cfg = write_config(
            dir.path(),
            name,
            &json!({"nats": n, "sink": {"type": "file", "directory": dir.path().join("out")}}),
        );
        let (code, out, err) = svc(&["validate", cfg.to_str().unwrap()]);
        (code, format!("{out}{err}"))
    };
    let token = json!({"mode": "token", "token_env": "SVC_TEST_TOKEN"});
    let (code, err) = check(
        "remote.json",
        json!({"url": "nats://broker.example.com:4222", "auth": token}),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("nats.url: would carry the nats.auth credentials in plaintext"),
        "{err}"
    );
    assert!(err.contains("nats.allow_plaintext_credentials"), "{err}");

    let creds = json!({"mode": "credentials_file", "credentials_file": "/etc/svc/svc.creds"});
    let (code, err) = check(
        "cluster.json",
        json!({"urls": ["nats://127.0.0.1:4222", "nats://10.0.0.7:4222"], "auth": creds}),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nats.urls[1]: would carry"), "{err}");
    assert!(!err.contains("nats.urls[0]"), "{err}");

    for (name, nats) in [
        (
            "tls.json",
            json!({"url": "tls://broker.example.com:4222", "auth": token}),
        ),
        (
            "ca.json",
            json!({"url": "nats://broker.example.com:4222", "tls_ca_file": "/etc/ca.pem", "auth": token}),
        ),
        (
            "loopback.json",
            json!({"urls": ["nats://127.0.0.1:4222", "nats://localhost", "nats://[::1]:4222"], "auth": token}),
        ),
        (
            "opt-in.json",
            json!({"url": "nats://broker.example.com:4222", "auth": token,
                   "allow_plaintext_credentials": true}),
        ),
        (
            "no-auth.json",
            json!({"url": "nats://broker.example.com:4222"}),
        ),
    ] {
        let (code, out) = check(name, nats);
        assert_eq!(code, 0, "{name}: {out}");
    }

    // TLS, once asked for, cannot be switched off again.
    let (code, err) = check(
        "contradiction.json",
        json!({"url": "tls://broker.example.com:4222", "tls_required": false}),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nats.tls_required: cannot be false"), "{err}");
}

/// A plaintext fake broker (loopback, no auth) that greets, answers PINGs, sends a forged
/// `-ERR` once the client subscribes, and answers the runner's consumer lookup with a
/// JetStream API error whose description is forged and huge.
fn start_lying_broker(forged: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::Builder::new()
        .name("liar".into())
        .spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut out = tcp.try_clone().unwrap();
            let info = format!(
                "INFO {{\"server_id\":\"liar\",\"version\":\"2.10.0\",\"proto\":1,\
                 \"host\":\"127.0.0.1\",\"port\":{port},\"max_payload\":8388608,\
                 \"headers\":true,\"client_id\":1,\"go\":\"go1.22\"}}\r\n"
            );
            out.write_all(info.as_bytes()).unwrap();
            let mut reader = BufReader::new(tcp);
            let mut subs: Vec<(String, String)> = Vec::new();
            let mut line = String::new();
            let mut erred = false;
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
                line.clear();
                match words.first().map(String::as_str) {
                    Some("PING") => out.write_all(b"PONG\r\n").unwrap(),
                    Some("SUB") if words.len() >= 3 => {
                        subs.push((words[1].clone(), words[words.len() - 1].clone()));
                        if !erred {
                            erred = true;
                            let err = format!("-ERR '{}'\r\n", forged.replace('\n', " "));
                            out.write_all(err.as_bytes()).unwrap();
                        }
                    }
                    Some("PUB") if words.len() == 4 => {
                        let mut body = vec![0; words[3].parse::<usize>().unwrap() + 2];
                        reader.read_exact(&mut body).unwrap();
                        let inbox = &words[2];
                        let sid = subs
                            .iter()
                            .find(|(s, _)| {
                                s == inbox
                                    || (s.ends_with(".*") && inbox.starts_with(&s[..s.len() - 1]))
                            })
                            .map(|(_, sid)| sid.clone())
                            .unwrap_or_else(|| "1".into());
                        // Under the 64 KiB bound of an API reply (a larger one is refused unread).
                        let description = format!("{forged}{}", "x".repeat(50_000));
                        let answer = json!({
                            "type": "io.nats.jetstream.api.v1.consumer_info_response",
                            "error": {"code": 500, "err_code": 10008, "description": description}
                        })
                        .to_string();
                        let msg = format!("MSG {inbox} {sid} {}\r\n{answer}\r\n", answer.len());
                        out.write_all(msg.as_bytes()).unwrap();
                    }
                    _ => {}
                }
            }
        })
        .unwrap();
    port
}

/// What the broker says reaches the log bounded and escaped: a forged `-ERR` and a forged,
/// 50 KB JetStream API error description cannot start a new log line, drive the terminal or
/// make a megabyte line, with the client crate's own lines turned on too.
#[test]
fn broker_text_cannot_forge_or_flood_log_lines() {
    const FORGED: &str =
        "boom\r\n2026-01-01T00:00:00.000Z INFO  [svc-ack] all acknowledged\x1b[2J\u{202e}";
    let port = start_lying_broker(FORGED);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({"nats": {"url": format!("nats://127.0.0.1:{port}"), "stream": "ORDERS",
                         "consumer": "svc", "subject": "orders.>"},
                "sink": {"type": "file", "directory": dir.path().join("out")}}),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("run")
        .arg(&cfg)
        .env("RUST_LOG", "info,nats=error")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let log = String::from_utf8(out.stderr).unwrap() + &String::from_utf8(out.stdout).unwrap();
    // Both peer texts arrived and were shown, escaped.
    assert!(
        log.contains("broker: asynchronous error: boom\\r"),
        "the -ERR should be logged, escaped: {log}"
    );
    assert!(
        log.contains("broker: look up consumer ORDERS/svc: ") && log.contains("boom\\r\\n2026"),
        "the API error should be shown, escaped: {log}"
    );
    assert!(!log.contains(['\x1b', '\u{202e}', '\r']), "{log:?}");
    for line in log.lines() {
        assert!(!line.starts_with("2026-01-01T"), "a forged line: {line}");
        assert!(line.len() <= 2048, "a {} byte line", line.len());
    }
}

/// Credentials over plaintext go to loopback seeds only; a seed that advertises servers off
/// the host would hand them the credentials in clear on a reconnect, so the runner refuses to
/// start, having sent the seed nothing.
#[test]
fn a_plaintext_seed_advertising_remote_servers_is_refused_before_connect() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Arc::new(Mutex::new(Vec::new()));
    let r = received.clone();
    std::thread::Builder::new()
        .name("advertiser".into())
        .spawn(move || {
            // Every connection: the INFO, then record what comes until it hangs up.
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let info = format!(
                    "INFO {{\"server_id\":\"seed\",\"version\":\"2.10.0\",\"proto\":1,\
                     \"host\":\"127.0.0.1\",\"port\":{port},\"max_payload\":1048576,\
                     \"client_id\":1,\"go\":\"go1.22\",\"auth_required\":true,\
                     \"connect_urls\":[\"127.0.0.1:{port}\",\"10.255.0.1:4222\"]}}\r\n"
                );
                let _ = stream.write_all(info.as_bytes());
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    r.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            }
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token = "tok-loopback-only-never-remote";
    let nats = json!({"url": format!("nats://127.0.0.1:{port}"), "stream": "ORDERS",
                      "consumer": "svc", "subject": "orders.>",
                      "auth": {"mode": "token", "token_env": "SVC_TEST_TOKEN"}});
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({"nats": nats, "sink": {"type": "file", "directory": dir.path().join("out")}}),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("run")
        .arg(&cfg)
        .env("SVC_TEST_TOKEN", token)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains("advertises servers off this host (10.255.0.1:4222)")
            && log.contains("nats.allow_plaintext_credentials"),
        "{log}"
    );
    assert!(!log.contains(token), "{log}");
    let got = received.lock().unwrap().clone();
    assert!(
        got.is_empty(),
        "the seed was sent {:?}",
        String::from_utf8_lossy(&got)
    );

    // With the documented opt-in the operator accepts it: the runner goes on to CONNECT.
    let mut opted = nats.clone();
    opted["allow_plaintext_credentials"] = json!(true);
    let cfg = write_config(
        dir.path(),
        "opt-in.json",
        &json!({"nats": opted, "sink": {"type": "file", "directory": dir.path().join("out")}}),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("run")
        .arg(&cfg)
        .env("SVC_TEST_TOKEN", token)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "CONNECT at the seed", || {
        String::from_utf8_lossy(&received.lock().unwrap()).contains("CONNECT")
    });
    let _ = child.kill();
    let _ = child.wait();
}

/// How a hostile broker behaves once a client connects.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// Accepts and never sends a byte.
    Silent,
    /// Sends INFO, reads everything, never answers the PING.
    InfoThenNoPong,
    /// Sends INFO, then PINGs as fast as it can, never a PONG.
    PingFlood,
    /// Sends an INFO line that never ends.
    EndlessInfo,
    /// Asks for TLS in its INFO, then never answers the client's TLS hello.
    SilentTls,
    /// Completes the handshake, then answers nothing (its PONG was the last word).
    PongThenSilent,
    /// Completes the handshake, then floods PINGs and never reads again: the client's PONGs
    /// fill the socket and its writes stall.
    PongThenUnreadPings,
    /// Completes the handshake, then sends INFO lines naming 20,000 new servers each.
    PongThenHugeInfo,
}

/// A broker that stalls every connection its own way (each in its own thread, which ends when
/// the client goes away). Returns its port.
fn start_stalling_broker(stall: Stall) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::Builder::new()
        .name(format!("stall-{stall:?}"))
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                std::thread::spawn(move || stall_one(stream, stall, port));
            }
        })
        .unwrap();
    port
}

fn stall_one(mut stream: std::net::TcpStream, stall: Stall, port: u16) {
    let info = format!(
        "INFO {{\"server_id\":\"stall\",\"version\":\"2.10.0\",\"proto\":1,\"host\":\"127.0.0.1\",\
         \"port\":{port},\"max_payload\":1048576,\"headers\":true,\"client_id\":1,\"go\":\"go1.22\"}}\r\n"
    );
    if let Stall::PongThenSilent | Stall::PongThenUnreadPings | Stall::PongThenHugeInfo = stall {
        return after_handshake(stream, stall, &info);
    }
    let mut reader = stream.try_clone().unwrap();
    // Reads (and drops) what the client sends until it hangs up.
    let drain = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
    });
    match stall {
        Stall::Silent => {}
        Stall::InfoThenNoPong => {
            let _ = stream.write_all(info.as_bytes());
        }
        Stall::PingFlood => {
            let _ = stream.write_all(info.as_bytes());
            let pings = b"PING\r\n".repeat(1000);
            while stream.write_all(&pings).is_ok() {}
        }
        Stall::SilentTls => {
            let tls = info.replace("\"client_id\":1", "\"client_id\":1,\"tls_required\":true");
            let _ = stream.write_all(tls.as_bytes());
        }
        Stall::EndlessInfo => {
            let _ = stream.write_all(b"INFO {\"server_id\":\"");
            let chunk = vec![b'x'; 64 * 1024];
            while stream.write_all(&chunk).is_ok() {}
        }
        _ => {}
    }
    let _ = drain.join();
}

/// Greets, answers the client's CONNECT + PING with a PONG, then misbehaves as `stall` says
/// until the client goes away.
fn after_handshake(mut stream: std::net::TcpStream, stall: Stall, info: &str) {
    let _ = stream.write_all(info.as_bytes());
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(6).any(|w| w == b"PING\r\n") {
        match stream.read(&mut buf) {
            Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => return,
        }
    }
    if stream.write_all(b"PONG\r\n").is_err() {
        return;
    }
    match stall {
        Stall::PongThenUnreadPings => {
            let pings = b"PING\r\n".repeat(1000);
            while stream.write_all(&pings).is_ok() {}
        }
        Stall::PongThenHugeInfo => {
            for round in 0.. {
                let urls: Vec<String> = (0..20_000)
                    .map(|i| format!("\"10.{}.{}.{}:4222\"", round % 250, i / 250, i % 250))
                    .collect();
                let line = format!(
                    "INFO {{\"server_id\":\"x\",\"connect_urls\":[{}]}}\r\n",
                    urls.join(",")
                );
                if stream.write_all(line.as_bytes()).is_err() {
                    return;
                }
            }
        }
        _ => {
            // Reads (and drops) what the client sends until it hangs up.
            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        }
    }
}

/// A config for `orders.>` of stream ORDERS through durable `svc` at `urls`, files into `dir`.
fn config_at(dir: &Path, urls: &[String]) -> std::path::PathBuf {
    write_config(
        dir,
        "c.json",
        &json!({"nats": {"urls": urls, "stream": "ORDERS", "consumer": "svc",
                         "subject": "orders.>"},
                "sink": {"type": "file", "directory": dir.join("out")}}),
    )
}

/// A broker that stalls the handshake costs a connect its one deadline, never more: `svc
/// inspect --timeout 2` against a silent server, one that sends INFO and never PONG, one that
/// floods PINGs, one whose INFO line never ends and one that asks for TLS and never answers
/// the hello, exits 1 within about its timeout, naming the connect. (The client once waited
/// forever in each, and read an endless INFO line into memory without bound.)
#[test]
fn a_stalling_broker_costs_inspect_its_timeout_only() {
    const DEADLINE: &str = "the server did not complete the handshake in time";
    for (stall, why) in [
        (Stall::Silent, DEADLINE),
        (Stall::InfoThenNoPong, DEADLINE),
        (Stall::PingFlood, "the server sent PINGs but no PONG"),
        (
            Stall::EndlessInfo,
            "the server's INFO line is longer than 64 KiB",
        ),
        (Stall::SilentTls, DEADLINE),
    ] {
        let port = start_stalling_broker(stall);
        let dir = tempfile::tempdir().unwrap();
        let cfg = config_at(dir.path(), &[format!("nats://127.0.0.1:{port}")]);
        let started = Instant::now();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_svc"));
        cmd.arg("inspect").arg(&cfg).args(["--timeout", "2"]);
        let mut inspect = Runner::spawn(&mut cmd, &dir.path().join("inspect.log"));
        let status = inspect.wait_timeout(Duration::from_secs(15));
        let elapsed = started.elapsed();
        let log = inspect.log_text();
        let status = status.unwrap_or_else(|| panic!("{stall:?}: inspect still running\n{log}"));
        assert_eq!(status.code(), Some(1), "{stall:?}: {log}");
        assert!(
            elapsed < Duration::from_secs(5),
            "{stall:?}: {elapsed:?} for --timeout 2\n{log}"
        );
        assert!(
            log.contains("svc: broker: connect: ") && log.contains(why),
            "{stall:?}: {log}"
        );
    }
}

/// A broker that completes the handshake and then misbehaves costs `svc inspect --timeout 2`
/// a bounded time: one that answers nothing more (the connect's own round trip once waited
/// 10 s), one that floods PINGs and stops reading (the client's write of a PONG blocked with
/// its write lock held, and inspect never ended), one whose INFO lines name 20,000 new
/// servers each (peak RSS once grew to 677 MiB in 5 s).
#[test]
fn a_broker_that_misbehaves_after_the_handshake_costs_a_bounded_time() {
    for (stall, bound) in [
        (Stall::PongThenSilent, 5),
        (Stall::PongThenUnreadPings, 15),
        (Stall::PongThenHugeInfo, 15),
    ] {
        let port = start_stalling_broker(stall);
        let dir = tempfile::tempdir().unwrap();
        let cfg = config_at(dir.path(), &[format!("nats://127.0.0.1:{port}")]);
        let started = Instant::now();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_svc"));
        cmd.arg("inspect").arg(&cfg).args(["--timeout", "2"]);
        let mut inspect = Runner::spawn(&mut cmd, &dir.path().join("inspect.log"));
        let pid = inspect.child.id();
        let mut peak_kib = 0;
        let status = loop {
            if let Some(status) = inspect.wait_timeout(Duration::from_millis(100)) {
                break Some(status);
            }
            peak_kib = peak_kib.max(vm_hwm_kib(pid));
            if started.elapsed() > Duration::from_secs(30) {
                break None;
            }
        };
        let log = inspect.log_text();
        let status = status.unwrap_or_else(|| panic!("{stall:?}: inspect still running\n{log}"));
        assert_eq!(status.code(), Some(1), "{stall:?}: {log}");
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(bound),
            "{stall:?}: {elapsed:?} for --timeout 2\n{log}"
        );
        assert!(peak_kib < 64 * 1024, "{stall:?}: peak RSS {peak_kib} KiB");
    }
}

/// Peak resident memory of a running process (`VmHWM`), 0 once it is gone.
fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `svc run` with three seeds, two of which accept and never answer, reaches the healthy one
/// (whichever order the client tries them in) and delivers; the client once stayed in the
/// first hung seed for good.
#[test]
fn run_with_hung_seeds_reaches_the_healthy_one() {
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(30));
    server.publish_n("ORDERS", "orders.created", 3, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    let hung: Vec<String> = (0..2)
        .map(|_| format!("nats://127.0.0.1:{}", start_stalling_broker(Stall::Silent)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut urls = hung.clone();
    urls.insert(1, server.url());
    let cfg = config_at(dir.path(), &urls);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    // Two hung seeds at 5 s each at most, then the healthy one.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.try_consumer_state("ORDERS", "svc") != Some((3, 0, 0)) {
        assert!(
            Instant::now() < deadline,
            "not delivered from the healthy seed\n{}",
            runner.log_text()
        );
        assert!(
            runner.child.try_wait().unwrap().is_none(),
            "{}",
            runner.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(15)).is_some());
    let stored = files_below(&dir.path().join("out"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .count();
    assert_eq!(stored, 3);
}

/// A proxy in front of a real broker that adds `entry` to the `connect_urls` of every INFO
/// greeting it passes on. Returns its port and the client-side sockets, to cut them.
fn start_info_rewriting_proxy(
    upstream: u16,
    entry: &'static str,
) -> (u16, Arc<Mutex<Vec<std::net::TcpStream>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let clients = Arc::new(Mutex::new(Vec::new()));
    let kept = clients.clone();
    std::thread::Builder::new()
        .name("info-proxy".into())
        .spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                kept.lock().unwrap().push(client.try_clone().unwrap());
                let (mut c_in, mut c_out) = (client.try_clone().unwrap(), client);
                let (mut s_in, mut s_out) = (server.try_clone().unwrap(), server);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(std::net::Shutdown::Both);
                });
                std::thread::spawn(move || {
                    let mut greeting = Vec::new();
                    let mut byte = [0u8];
                    while !greeting.ends_with(b"\r\n") {
                        if s_in.read_exact(&mut byte).is_err() {
                            return;
                        }
                        greeting.push(byte[0]);
                    }
                    let text = String::from_utf8(greeting).unwrap().replacen(
                        "INFO {",
                        &format!("INFO {{\"connect_urls\":[\"{entry}\"],"),
                        1,
                    );
                    let _ = c_out.write_all(text.as_bytes());
                    let _ = std::io::copy(&mut s_in, &mut c_out);
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                });
            }
        })
        .unwrap();
    (port, clients)
}

/// A `connect_urls` entry that is not a server address is skipped, reported once, and the
/// client goes on: it delivers, and after the connection is cut it reconnects and delivers
/// again. (It once ended the client's thread for good: the runner stayed up, said
/// "reconnecting" and delivered nothing.)
#[test]
fn a_malformed_advertised_server_is_skipped_and_the_client_reconnects() {
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(30));
    let upstream: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
    let (port, clients) = start_info_rewriting_proxy(upstream, "127.0.0.1:99999\\u001b[2J");
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_at(dir.path(), &[format!("nats://127.0.0.1:{port}")]);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    let delivered = |n: u64, runner: &mut Runner| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.try_consumer_state("ORDERS", "svc") != Some((n, 0, 0)) {
            assert!(
                Instant::now() < deadline,
                "{n} not delivered\n{}",
                runner.log_text()
            );
            assert!(
                runner.child.try_wait().unwrap().is_none(),
                "{}",
                runner.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    server.publish_n("ORDERS", "orders.created", 2, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    delivered(2, &mut runner);
    for c in clients.lock().unwrap().drain(..) {
        let _ = c.shutdown(std::net::Shutdown::Both);
    }
    server.publish_n("ORDERS", "orders.created", 2, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    delivered(4, &mut runner);
    runner.signal("TERM");
    assert_eq!(
        runner.wait_timeout(Duration::from_secs(15)).unwrap().code(),
        Some(0)
    );
    let log = runner.log_text();
    assert_eq!(
        log.matches("skipped a connect_urls entry").count(),
        1,
        "reported once: {log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "the entry is shown escaped: {log:?}"
    );
}

/// `svc run` stops on SIGTERM within `shutdown_timeout_seconds` while the broker is gone: the
/// final flush waits for its PONG no longer than its timeout, and the client's reconnect loop
/// ends when the client is closed. (The flush once waited for a PONG forever, and closing the
/// client waited for a reconnect loop that never ends while the broker is down.)
#[test]
fn run_stops_on_sigterm_while_the_broker_is_unreachable() {
    let mut server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(30));
    server.publish_n("ORDERS", "orders.created", 2, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({"nats": {"url": server.url(), "stream": "ORDERS", "consumer": "svc",
                         "subject": "orders.>"},
                "delivery": {"shutdown_timeout_seconds": 5},
                "sink": {"type": "file", "directory": dir.path().join("out")}}),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "2 delivered", || {
        server.try_consumer_state("ORDERS", "svc") == Some((2, 0, 0))
    });
    server.kill();
    wait_until(Duration::from_secs(30), "the runner to notice", || {
        runner.log_text().contains("connection lost")
    });
    let started = Instant::now();
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20));
    let elapsed = started.elapsed();
    let log = runner.log_text();
    assert!(status.is_some(), "still running 20 s after SIGTERM\n{log}");
    // The budget runs from the signal to the end of `run`; the process's exit and this
    // test's wait add a few milliseconds (clean_stop allows 800 ms for the same reason).
    assert!(
        elapsed <= Duration::from_millis(5000 + 800),
        "{elapsed:?} from SIGTERM to exit, shutdown_timeout_seconds 5\n{log}"
    );
}

/// A wrong token: the broker's refusal is shown as the broker said it, in Display, not as the
/// client's `Debug` of its parsed operation (`Err("Authorization Violation")`).
#[test]
fn a_refused_connect_shows_the_brokers_words_not_debug() {
    let server = NatsServer::start_with(&["--auth", "the-right-token"]);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({"nats": {"url": server.url(), "stream": "ORDERS", "consumer": "svc",
                         "subject": "orders.>",
                         "auth": {"mode": "token", "token_env": "SVC_TEST_TOKEN"}},
                "sink": {"type": "file", "directory": dir.path().join("out")}}),
    );
    let (code, out, err) = svc_with_env(
        &["run", cfg.to_str().unwrap()],
        &[("SVC_TEST_TOKEN", "a-wrong-token")],
    );
    let log = format!("{out}{err}");
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains("broker: connect: the server answered -ERR 'Authorization Violation'"),
        "{log}"
    );
    assert!(!log.contains("Err(\""), "{log}");
    assert!(!log.contains("a-wrong-token"), "{log}");
}

/// A proxy in front of a real broker that, once `frozen` is set, forwards nothing either way
/// and keeps every connection open: a broker that stopped answering (a black hole).
fn start_freezable_proxy(upstream: u16) -> (u16, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::AtomicBool;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let frozen = Arc::new(AtomicBool::new(false));
    let f = frozen.clone();
    let pump =
        |mut from: std::net::TcpStream, mut to: std::net::TcpStream, frozen: Arc<AtomicBool>| {
            let mut buf = [0u8; 16 * 1024];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                // Frozen: what arrives is read and dropped, never answered.
                if !frozen.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        };
    std::thread::Builder::new()
        .name("freezable-proxy".into())
        .spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (f1, f2) = (f.clone(), f.clone());
                std::thread::spawn(move || pump(client, server, f1));
                std::thread::spawn(move || pump(s2, c2, f2));
            }
        })
        .unwrap();
    (port, frozen)
}

/// `svc run` stops on SIGTERM within `shutdown_timeout_seconds` when the broker's connection
/// is open but nothing answers any more: the final flush's PING is written, and its PONG is
/// waited for no longer than the flush's timeout (it was waited for forever).
#[test]
fn run_stops_on_sigterm_while_the_broker_no_longer_answers() {
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(30));
    server.publish_n("ORDERS", "orders.created", 2, |i| {
        format!("{{\"n\":{i}}}").into_bytes()
    });
    let upstream: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
    let (port, frozen) = start_freezable_proxy(upstream);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({"nats": {"url": format!("nats://127.0.0.1:{port}"), "stream": "ORDERS",
                         "consumer": "svc", "subject": "orders.>"},
                "delivery": {"shutdown_timeout_seconds": 5},
                "sink": {"type": "file", "directory": dir.path().join("out")}}),
    );
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(Duration::from_secs(30), "2 delivered", || {
        server.try_consumer_state("ORDERS", "svc") == Some((2, 0, 0))
    });
    frozen.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20));
    let elapsed = started.elapsed();
    let log = runner.log_text();
    assert!(status.is_some(), "still running 20 s after SIGTERM\n{log}");
    // The budget runs from the signal to the end of `run`; the process's exit and this
    // test's wait add a few milliseconds (clean_stop allows 800 ms for the same reason).
    assert!(
        elapsed <= Duration::from_millis(5000 + 800),
        "{elapsed:?} from SIGTERM to exit, shutdown_timeout_seconds 5\n{log}"
    );
}

/// Two seeds, one of which completes the handshake (its PONG) and then answers nothing: the
/// connect reaches the healthy one whichever the client tries first, every time. (The client
/// picks its first server at random and gave up when that one left the first round trip
/// unanswered: half of the starts failed.)
#[test]
fn a_seed_silent_after_its_handshake_does_not_fail_the_connect() {
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(30));
    let silent = format!(
        "nats://127.0.0.1:{}",
        start_stalling_broker(Stall::PongThenSilent)
    );
    let dir = tempfile::tempdir().unwrap();
    let mut tried_silent_first = 0;
    for (i, urls) in [
        [silent.clone(), server.url()],
        [server.url(), silent.clone()],
    ]
    .iter()
    .cycle()
    .take(10)
    .enumerate()
    {
        let cfg = config_at(dir.path(), urls);
        let started = Instant::now();
        let (code, out, err) = svc(&["inspect", cfg.to_str().unwrap(), "--timeout", "2"]);
        assert_eq!(code, 0, "start {i}: {out}{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "start {i}");
        tried_silent_first += usize::from(err.contains("trying each server first in turn"));
    }
    // Positive control: the silent seed was met first in some of the starts.
    assert!(
        tried_silent_first > 0,
        "the silent seed was never tried first"
    );
}
