//! `broker-monitoring-poll` against a real `nats-server -m` started by the test, reached through
//! a counting forward proxy on loopback (it records every request target, so the test sees
//! that disallowed endpoints are never called); oversized, endless, failing and redirecting
//! monitoring answers from local receivers; every rendering checked with `promtool`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::broker::NatsServer;
use crate::support::http::read_head;
use crate::support::observe::{assert_promtool_clean, bin, stderr, stdout};
use crate::support::wait_until;
use crate::support::TempDir;
use serde_json::{json, Value};

/// A forward proxy on loopback: records each request target, forwards the request (with
/// `Connection: close`) to `upstream` and relays the answer. One named thread.
struct CountingProxy {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl CountingProxy {
    fn start(upstream: u16) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::Builder::new()
            .name("test-counting-proxy".into())
            .spawn(move || {
                while !stop2.load(Ordering::SeqCst) {
                    let Ok((mut client, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    client.set_nonblocking(false).unwrap();
                    client
                        .set_read_timeout(Some(Duration::from_secs(5)))
                        .unwrap();
                    let Ok(head) = read_head(&mut client) else {
                        continue;
                    };
                    let target = head.split(' ').nth(1).unwrap_or("").to_string();
                    seen2.lock().unwrap().push(target);
                    let mut lines: Vec<&str> = head
                        .trim_end()
                        .split("\r\n")
                        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
                        .collect();
                    lines.push("Connection: close");
                    let mut up = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                    up.write_all(format!("{}\r\n\r\n", lines.join("\r\n")).as_bytes())
                        .unwrap();
                    let mut answer = Vec::new();
                    let _ = up.read_to_end(&mut answer);
                    let _ = client.write_all(&answer);
                }
            })
            .unwrap();
        CountingProxy { port, seen, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn write_policy(dir: &TempDir, block: Value) -> String {
    let mut b = json!({"enabled": true, "scrape_enabled": true});
    for (k, v) in block.as_object().unwrap() {
        b[k] = v.clone();
    }
    let p = json!({"schema": "svc.observability.policy.v1", "enabled": true,
                   "broker_server_monitoring": b});
    dir.write("policy.json", &p.to_string())
        .to_str()
        .unwrap()
        .to_string()
}

fn poll(args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin())
        .arg("broker-monitoring-poll")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// `name value` of the sample lines.
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (n, v) = l.split_once(' ').unwrap();
            (n.to_string(), v.parse().unwrap())
        })
        .collect()
}

const FIELDS: &[&str] = &[
    "mem",
    "connections",
    "in_msgs",
    "jetstream.stats.memory",
    "jetstream.config.max_memory",
    "messages",
    "streams",
    "consumers",
    "status",
    "jetstream",
    "no.such.field",
];

#[test]
fn allowed_fields_of_allowed_endpoints_only_render_promtool_clean() {
    let nats = NatsServer::start();
    nats.create_stream("ORDERS", &["orders.>"]);
    nats.publish_n("ORDERS", "orders.eu.created", 25, |i| {
        format!("m{i}").into_bytes()
    });
    let proxy = CountingProxy::start(nats.monitor_port);
    let dir = TempDir::new("broker-real");
    let pol = write_policy(
        &dir,
        json!({"base_url": proxy.url(), "allowed_endpoints": ["/varz", "/jsz", "/healthz"],
               "allowed_fields": FIELDS}),
    );
    let out_file = dir.join("svc-broker.prom");
    let out = poll(&[&pol, "--output", out_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!(
            "broker-monitoring-poll: polled 3 endpoints, 8 of 33 field values numeric, wrote {} bytes to {}\n",
            std::fs::metadata(&out_file).unwrap().len(),
            out_file.display()
        )
    );
    // exactly the allowed endpoints, once each, in order
    assert_eq!(proxy.seen(), ["/varz", "/jsz", "/healthz"]);
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert_promtool_clean(&text);
    let got = samples(&text);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "svc_broker_jsz_consumers",
            "svc_broker_jsz_messages",
            "svc_broker_jsz_streams",
            "svc_broker_varz_connections",
            "svc_broker_varz_in_msgs",
            "svc_broker_varz_jetstream_config_max_memory",
            "svc_broker_varz_jetstream_stats_memory",
            "svc_broker_varz_mem",
        ]
    );
    let value = |n: &str| got.iter().find(|(m, _)| m == n).unwrap().1;
    assert_eq!(value("svc_broker_jsz_messages"), 25.0);
    assert_eq!(value("svc_broker_jsz_streams"), 1.0);
    assert!(value("svc_broker_varz_mem") > 0.0);
    assert!(value("svc_broker_varz_in_msgs") >= 25.0);
    assert!(text.contains(
        "# HELP svc_broker_jsz_messages Broker server monitoring: field messages of /jsz.\n# TYPE svc_broker_jsz_messages gauge\n"
    ));
    // nothing that identifies the server or its topology
    let varz: Value = serde_json::from_str(
        &crate::support::http_get(nats.monitor_port, "/varz")
            .unwrap()
            .1,
    )
    .unwrap();
    for s in [
        varz["server_id"].as_str().unwrap(),
        varz["server_name"].as_str().unwrap(),
        "127.0.0.1",
        &nats.port.to_string(),
        &nats.monitor_port.to_string(),
        &proxy.port.to_string(),
        "ORDERS",
        "orders",
    ] {
        assert!(!text.contains(s), "{s} exported:\n{text}");
    }

    // --dry-run: the same rendering on stdout, a field report on stderr, nothing written
    std::fs::remove_file(&out_file).unwrap();
    let out = poll(&[&pol, "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(samples(&stdout(&out)).len(), 8);
    assert_promtool_clean(&stdout(&out));
    let report = stderr(&out);
    assert!(
        report
            .contains("broker-monitoring-poll --dry-run: /healthz status: string (not rendered)\n"),
        "{report}"
    );
    assert!(report.contains(
        "broker-monitoring-poll --dry-run: /varz jetstream: null (missing or not a scalar)\n"
    ));
    assert!(report.contains("broker-monitoring-poll --dry-run: /jsz messages: number 25\n"));
    assert!(report.contains(
        "broker-monitoring-poll --dry-run: /varz no.such.field: null (missing or not a scalar)\n"
    ));
    assert!(!report.contains("\"ok\"") && !report.contains(varz["server_id"].as_str().unwrap()));
    assert!(!out_file.exists());
    assert_eq!(proxy.seen().len(), 6);

    // without HELP and TYPE
    let pol = write_policy(
        &dir,
        json!({"base_url": proxy.url(), "allowed_endpoints": ["/jsz"],
               "allowed_fields": ["messages"], "include_help": false, "include_type": false}),
    );
    let out = poll(&[&pol, "--dry-run"]);
    assert_eq!(stdout(&out), "svc_broker_jsz_messages 25\n");
}

#[test]
fn switches_and_usage() {
    let proxy = CountingProxy::start(9); // nothing may be polled
    let dir = TempDir::new("broker-switches");
    let out_file = dir.join("b.prom");
    let out_path = out_file.to_str().unwrap();
    for (block, reason) in [
        (
            json!({"enabled": false}),
            "broker_server_monitoring.enabled=false",
        ),
        (
            json!({"scrape_enabled": false}),
            "broker_server_monitoring.scrape_enabled=false",
        ),
    ] {
        let mut b = json!({"base_url": proxy.url(), "allowed_endpoints": ["/varz"], "allowed_fields": ["mem"]});
        for (k, v) in block.as_object().unwrap() {
            b[k] = v.clone();
        }
        let pol = write_policy(&dir, b);
        let out = poll(&[&pol, "--output", out_path]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            std::fs::read_to_string(&out_file).unwrap(),
            format!("# svc-observe: broker server monitoring is disabled by policy ({reason})\n")
        );
    }
    let pol = dir.write(
        "off.json",
        r#"{"schema": "svc.observability.policy.v1", "broker_server_monitoring": {"enabled": true,
            "scrape_enabled": true, "base_url": "http://127.0.0.1:9", "allowed_endpoints": ["/varz"],
            "allowed_fields": ["mem"]}}"#,
    );
    let out = poll(&[pol.to_str().unwrap(), "--dry-run"]);
    assert_eq!(
        stdout(&out),
        "# svc-observe: broker server monitoring is disabled by policy (enabled=false)\n"
    );
    assert!(proxy.seen().is_empty());
    let pol = write_policy(
        &dir,
        json!({"base_url": proxy.url(), "allowed_endpoints": ["/varz"], "allowed_fields": ["mem"]}),
    );
    let out = poll(&[&pol]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "svc-observe broker-monitoring-poll: no output file: pass --output <path> (a .prom file) or --dry-run\n");
    let out = poll(&[&pol, "--output", dir.join("b.txt").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let out = poll(&[&pol, "--allow-stale"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("svc-observe: invalid option '--allow-stale'"),
        "{}",
        stderr(&out)
    );
    let bad = dir.write(
        "bad.json",
        r#"{"schema": "svc.observability.policy.v1", "broker_server_monitoring": {"base_url": "http://nats.example:8222"}}"#,
    );
    let out = poll(&[bad.to_str().unwrap(), "--dry-run"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "Observability policy is invalid:\n  broker_server_monitoring.base_url: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https\n");
    assert!(proxy.seen().is_empty());
}

/// A monitoring endpoint that answers every request with `answer(stream, bytes_sent)`.
/// A request it did not expect is recorded (an assert on its own thread would only kill that
/// thread) and fails the test when the fake is dropped.
struct FakeMonitor {
    port: u16,
    requests: Arc<AtomicUsize>,
    sent: Arc<AtomicUsize>,
    /// Answers that have returned (the endless one returns when the client is gone).
    answered: Arc<AtomicUsize>,
    unexpected: Arc<Mutex<Vec<String>>>,
}

impl Drop for FakeMonitor {
    fn drop(&mut self) {
        let unexpected = self.unexpected.lock().unwrap();
        if !std::thread::panicking() {
            assert!(unexpected.is_empty(), "unexpected requests: {unexpected:?}");
        }
    }
}

impl FakeMonitor {
    fn start(answer: fn(&mut TcpStream, &AtomicUsize)) -> FakeMonitor {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(AtomicUsize::new(0));
        let unexpected = Arc::new(Mutex::new(Vec::new()));
        let answered = Arc::new(AtomicUsize::new(0));
        let (r2, s2, u2, a2) = (
            requests.clone(),
            sent.clone(),
            unexpected.clone(),
            answered.clone(),
        );
        std::thread::Builder::new()
            .name("test-fake-monitor".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(mut s) = conn else { break };
                    let Ok(head) = read_head(&mut s) else {
                        continue;
                    };
                    if !head.starts_with("GET /varz HTTP/1.1\r\n") {
                        u2.lock().unwrap().push(head);
                        continue;
                    }
                    r2.fetch_add(1, Ordering::SeqCst);
                    answer(&mut s, &s2);
                    a2.fetch_add(1, Ordering::SeqCst);
                }
            })
            .unwrap();
        FakeMonitor {
            port,
            requests,
            sent,
            answered,
            unexpected,
        }
    }
}

fn big_json(s: &mut TcpStream, _: &AtomicUsize) {
    let body = format!(r#"{{"mem": 1, "pad": "{}"}}"#, "x".repeat(300_000));
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// No Content-Length: a body that never ends (until the client goes away).
fn endless(s: &mut TcpStream, sent: &AtomicUsize) {
    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"pad\": \"");
    let chunk = [b'x'; 16 * 1024];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if s.write_all(&chunk).is_err() {
            break;
        }
        sent.fetch_add(chunk.len(), Ordering::SeqCst);
    }
}

fn status_500(s: &mut TcpStream, _: &AtomicUsize) {
    let _ = s.write_all(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    );
}

fn redirect(s: &mut TcpStream, _: &AtomicUsize) {
    let _ = s.write_all(
        b"HTTP/1.1 302 Found\r\nLocation: /connz\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
}

fn not_json(s: &mut TcpStream, _: &AtomicUsize) {
    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
}

fn failing_poll(monitor: &FakeMonitor, dir: &TempDir, max: u64) -> (std::process::Output, String) {
    let pol = write_policy(
        dir,
        json!({"base_url": format!("http://127.0.0.1:{}", monitor.port),
               "allowed_endpoints": ["/varz"], "allowed_fields": ["mem"],
               "max_response_bytes": max, "timeout_seconds": 10}),
    );
    let out_file = dir.join("svc-broker.prom");
    std::fs::write(&out_file, "svc_broker_varz_mem 1\n").unwrap();
    let out = poll(&[&pol, "--output", out_file.to_str().unwrap()]);
    let left = std::fs::read_to_string(&out_file).unwrap();
    (out, left)
}

#[test]
fn oversized_endless_failing_and_redirecting_answers_fail_the_poll() {
    let dir = TempDir::new("broker-fail");
    let withheld = "# svc-observe: broker server monitoring withheld (poll failed)\n";

    let m = FakeMonitor::start(big_json);
    let (out, left) = failing_poll(&m, &dir, 262_144);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "svc-observe broker-monitoring-poll: broker_server_monitoring: poll of /varz failed: the response is larger than max_response_bytes 262144 (Content-Length 300021)\n");
    assert_eq!(left, withheld);

    // The poll's whole-request timeout is 10 s: the exact message below (the size limit, not a
    // timeout) is what proves the endless body was cut off at the limit; no clock needed.
    let m = FakeMonitor::start(endless);
    let (out, left) = failing_poll(&m, &dir, 65_536);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "svc-observe broker-monitoring-poll: broker_server_monitoring: poll of /varz failed: the response is larger than max_response_bytes 65536\n");
    assert_eq!(left, withheld);
    // the client stopped reading right after the limit: the server could not push much more
    // than the limit plus the socket buffers. Read the count once the endless answer has
    // returned (its write failed: the poll's connection is gone), not after a fixed sleep.
    wait_until(Duration::from_secs(30), "the endless answer to end", || {
        m.answered.load(Ordering::SeqCst) == 1
    });
    assert!(
        m.sent.load(Ordering::SeqCst) < 16 * 1024 * 1024,
        "{}",
        m.sent.load(Ordering::SeqCst)
    );

    let m = FakeMonitor::start(status_500);
    let (out, left) = failing_poll(&m, &dir, 262_144);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "svc-observe broker-monitoring-poll: broker_server_monitoring: poll of /varz failed: HTTP status 500\n");
    assert_eq!(left, withheld);

    let m = FakeMonitor::start(redirect);
    let (out, _) = failing_poll(&m, &dir, 262_144);
    assert_eq!(stderr(&out), "svc-observe broker-monitoring-poll: broker_server_monitoring: poll of /varz failed: HTTP status 302\n");
    assert_eq!(
        m.requests.load(Ordering::SeqCst),
        1,
        "the redirect was followed"
    );

    let m = FakeMonitor::start(not_json);
    let (out, _) = failing_poll(&m, &dir, 262_144);
    assert_eq!(stderr(&out), "svc-observe broker-monitoring-poll: broker_server_monitoring: poll of /varz failed: the response is not valid JSON\n");

    // nobody listening
    let port = crate::support::free_port();
    let pol = write_policy(
        &dir,
        json!({"base_url": format!("http://127.0.0.1:{port}"), "allowed_endpoints": ["/varz"],
               "allowed_fields": ["mem"]}),
    );
    let out = poll(&[&pol, "--dry-run"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with(
            "svc-observe broker-monitoring-poll: broker_server_monitoring: poll of /varz failed: "
        ),
        "{}",
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains(&port.to_string()),
        "the base URL was printed"
    );
}

/// Numeric leaf paths of a JSON document (object keys only; arrays are not walked).
fn numeric_paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            if !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                continue;
            }
            let p = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match x {
                Value::Number(_) => out.push(p),
                Value::Object(_) => numeric_paths(x, &p, out),
                _ => {}
            }
        }
    }
}

#[test]
fn every_numeric_field_of_every_endpoint_renders_promtool_clean() {
    let nats = NatsServer::start();
    nats.create_stream("ORDERS", &["orders.>"]);
    nats.publish_n("ORDERS", "orders.eu.created", 5, |i| {
        format!("m{i}").into_bytes()
    });
    let endpoints = [
        "/varz",
        "/connz",
        "/routez",
        "/subsz",
        "/accountz",
        "/accstatz",
        "/jsz",
        "/healthz",
    ];
    let mut fields: Vec<String> = Vec::new();
    for e in endpoints {
        let (status, body) = crate::support::http_get(nats.monitor_port, e).unwrap();
        assert_eq!(status, 200, "{e}");
        let mut paths = Vec::new();
        numeric_paths(&serde_json::from_str(&body).unwrap(), "", &mut paths);
        for p in paths {
            if !svc::observe::policy::broker_server::is_identity_field(&p) && !fields.contains(&p) {
                fields.push(p);
            }
        }
    }
    assert!(fields.len() > 40 && fields.len() <= 100, "{}", fields.len());
    let dir = TempDir::new("broker-all");
    let pol = write_policy(
        &dir,
        json!({"base_url": format!("http://127.0.0.1:{}", nats.monitor_port),
               "allowed_endpoints": endpoints, "allowed_fields": fields}),
    );
    let out = poll(&[&pol, "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(samples(&text).len() > 40, "{text}");
    assert_promtool_clean(&text);
    // and without HELP/TYPE lines the samples alone still parse
    let pol = write_policy(
        &dir,
        json!({"base_url": format!("http://127.0.0.1:{}", nats.monitor_port),
               "allowed_endpoints": endpoints, "allowed_fields": fields,
               "include_help": false, "include_type": false}),
    );
    let out = poll(&[&pol, "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bare = stdout(&out);
    // The same samples as with HELP/TYPE (promtool accepts an empty input, so count first).
    assert_eq!(samples(&bare).len(), samples(&text).len(), "{bare}");
    assert!(
        !bare.contains("# HELP") && !bare.contains("# TYPE"),
        "{bare}"
    );
    let (code, findings) = crate::support::observe::promtool(&bare);
    // promtool's only findings without HELP are "no help text" lints, never parse errors
    assert!(
        code == 0
            || findings
                .lines()
                .all(|l| l.contains("no help text") || l.trim().is_empty()),
        "{findings}"
    );
}
