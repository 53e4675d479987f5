//! `svc-observe scrape-http` as a process: status codes, stale and oversize snapshots, and
//! hostile clients (idle connections, half-sent requests) measured through /proc.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::support::observe::*;
use crate::support::{free_port, TempDir};

/// Writes snapshot + policy with the endpoint on a free port and starts the server.
fn serve(dir: &TempDir, snap: &str, extra_policy: &str, args: &[&str]) -> (ChildGuard, SocketAddr) {
    let port = free_port();
    let s = dir.write("snap.json", snap);
    let merged = policy(extra_policy);
    let mut v: serde_json::Value = serde_json::from_str(&merged).unwrap();
    v["scrape"]["http_endpoint"]["port"] = port.into();
    let p = dir.write("policy.json", &v.to_string());
    let child = start_http(&s, &p, args, port);
    (child, SocketAddr::from(([127, 0, 0, 1], port)))
}

#[test]
fn serves_the_exposition_with_documented_statuses() {
    let dir = TempDir::new("http-ok");
    let snap = snapshot(&[("orders.>", "orders")], 0.0);
    let (_child, addr) = serve(
        &dir,
        &snap,
        r#"{"subject_metrics": {"enabled": true, "rules": [{"subject": ">", "label": "all"}]}}"#,
        &[],
    );
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(
        r.header("Content-Length"),
        Some(r.body.len().to_string().as_str())
    );
    assert_eq!(r.header("Cache-Control"), Some("no-store"));
    assert_promtool_clean(&r.body);
    assert!(r
        .body
        .contains("svc_messages_written_total{subject_family=\"all\"} 10\n"));
    // The body equals the dry run.
    let o = observe(&[
        &"scrape-http",
        &dir.join("snap.json"),
        &dir.join("policy.json"),
        &"--dry-run",
    ]);
    assert_eq!(stdout(&o), r.body);
    // Queries are ignored; other paths 404; other methods 405 with Allow.
    assert_eq!(get(addr, "/metrics?debug=1").status, 200);
    for path in ["/", "/metrics/", "/metricsx", "/other"] {
        let r = get(addr, path);
        assert_eq!((r.status, r.body.as_str()), (404, "not found\n"), "{path}");
    }
    for method in ["POST", "PUT", "DELETE", "HEAD", "OPTIONS"] {
        let r = raw_request(
            addr,
            format!("{method} /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("Allow"), Some("GET"));
        assert_eq!(r.header("Connection"), Some("close"));
    }
    let r = raw_request(addr, b"GARBAGE\r\n\r\n");
    assert_eq!(r.status, 400);
    let r = raw_request(
        addr,
        b"GET /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody",
    );
    assert_eq!(r.status, 400);
    let r = raw_request(
        addr,
        format!(
            "GET /metrics HTTP/1.1\r\nX-Big: {}\r\n\r\n",
            "a".repeat(9000)
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 431);

    // Keep-alive: two pipelined requests on one connection, both answered.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\nGET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{text}");
}

#[test]
fn stale_snapshot_gets_503_unless_allow_stale() {
    let dir = TempDir::new("http-stale");
    let snap = snapshot(&[], 600.0);
    let (_child, addr) = serve(
        &dir,
        &snap,
        r#"{"scrape": {"stale_after_seconds": 60}}"#,
        &[],
    );
    let r = get(addr, "/metrics");
    assert_eq!((r.status, r.body.as_str()), (503, "snapshot is stale\n"));
    drop(_child);
    let (_child, addr) = serve(
        &dir,
        &snap,
        r#"{"scrape": {"stale_after_seconds": 60}}"#,
        &["--allow-stale"],
    );
    assert_eq!(get(addr, "/metrics").status, 200);
    // The snapshot is read per scrape: a fresh one makes the endpoint healthy again, a missing
    // one makes it unavailable.
    drop(_child);
    let (_child, addr) = serve(
        &dir,
        &snap,
        r#"{"scrape": {"stale_after_seconds": 60}}"#,
        &[],
    );
    assert_eq!(get(addr, "/metrics").status, 503);
    std::fs::write(dir.join("snap.json"), snapshot(&[], 0.0)).unwrap();
    assert_eq!(get(addr, "/metrics").status, 200);
    std::fs::remove_file(dir.join("snap.json")).unwrap();
    let r = get(addr, "/metrics");
    assert_eq!((r.status, r.body.as_str()), (503, "snapshot unavailable\n"));
}

#[test]
fn oversize_and_unsafe_renders_get_small_errors() {
    let dir = TempDir::new("http-big");
    let snap = snapshot(&[("a.>", "a"), ("b.>", "b"), ("c.>", "c")], 0.0);
    let (child, addr) = serve(
        &dir,
        &snap,
        r#"{"scrape": {"http_endpoint": {"response_max_bytes": 1024}}}"#,
        &[],
    );
    let r = get(addr, "/metrics");
    assert_eq!((r.status, r.body.as_str()), (503, "response too large\n"));
    drop(child);
    // The dry run fails the same way.
    let o = observe(&[
        &"scrape-http",
        &dir.join("snap.json"),
        &dir.join("policy.json"),
        &"--dry-run",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("over scrape.http_endpoint.response_max_bytes 1024"));

    let (_child, addr) = serve(
        &dir,
        &snap,
        r#"{"subject_metrics": {"enabled": true, "max_subject_families": 1, "overflow_action": "fail_closed",
            "rules": [{"subject": "a.>", "label": "a"}, {"subject": "b.>", "label": "b"}]}}"#,
        &[],
    );
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 500);
    assert_eq!(r.body, "unsafe render: subject families over the limit\n");
}

#[test]
fn hostile_clients_neither_block_scrapes_nor_grow_threads() {
    let dir = TempDir::new("http-hostile");
    let snap = snapshot(&[], 0.0);
    let (child, addr) = serve(
        &dir,
        &snap,
        r#"{"scrape": {"http_endpoint": {"request_timeout_seconds": 5}}}"#,
        &[],
    );
    let pid = child.pid();
    assert_eq!(get(addr, "/metrics").status, 200);
    let baseline = thread_count(pid);

    // 300 idle connections and 50 that send a partial request line.
    let mut idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    for _ in 0..50 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metr").unwrap();
        idle.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200);
    // Ordering, not speed: the scrape was answered while every hostile connection was still
    // held open (the server closes them only at the 5 s request timeout). A server that served
    // them first would have closed them (EOF) before answering.
    for (i, s) in idle.iter().enumerate() {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        match s.peek(&mut b) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("hostile connection {i} was no longer held open: {other:?}"),
        }
        s.set_nonblocking(false).unwrap();
    }
    let during = thread_count(pid);
    assert_eq!(during, baseline, "threads grew from {baseline} to {during}");

    // A half-sent request is cut off after request_timeout_seconds with 408.
    let mut half = TcpStream::connect(addr).unwrap();
    half.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: slow\r\n")
        .unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    half.read_to_end(&mut got).unwrap();
    let cut = t.elapsed();
    // Not before the 5 s timeout (a lower bound cannot flake on a slow machine); the upper
    // bound is the 60 s read timeout above, and the 408 says it was the request timeout.
    assert!(cut >= Duration::from_secs(4), "cut off after {cut:?}");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 408 Request Timeout\r\n"));

    // The idle ones were closed too (EOF), and the server still serves.
    for s in idle.iter_mut().take(20) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
    }
    assert_eq!(get(addr, "/metrics").status, 200);
    assert_eq!(thread_count(pid), baseline);
    let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| {
            std::fs::read_to_string(e.unwrap().path().join("comm"))
                .unwrap()
                .trim()
                .to_string()
        })
        .collect();
    for want in ["svc-observe-htt", "svc-observe"] {
        assert!(names.iter().any(|n| n.starts_with(want)), "{names:?}");
    }
}
