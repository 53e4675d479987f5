//! Hostile clients of `svc-observe scrape-http` (issue 13): the real binary on a free port with
//! a real snapshot, attacked with slow readers, pipelining floods, lenient and smuggling
//! heads, oversize heads, trickled and idle partial heads; plus snapshots that lie (dated in
//! the future, oversize). Each case asserts the secure outcome. No tight timing: latencies are
//! compared with the request timeout, which the old server exceeded several times over.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::observe::*;
use crate::support::{free_port, TempDir};

const FAMILIES: &[(&str, &str)] = &[
    ("a.>", "a"),
    ("b.>", "b"),
    ("c.>", "c"),
    ("d.>", "d"),
    ("e.>", "e"),
];
const FAMILY_POLICY: &str =
    r#""subject_metrics": {"enabled": true, "rules": [{"subject": ">", "label": "all"}]}"#;

/// Snapshot + policy (endpoint on a free port, `timeout` seconds) and a started server.
fn serve(dir: &TempDir, snap: &str, timeout: f64) -> (ChildGuard, SocketAddr) {
    let port = free_port();
    let s = dir.write("snap.json", snap);
    let extra = format!(
        r#"{{{FAMILY_POLICY}, "scrape": {{"http_endpoint": {{"request_timeout_seconds": {timeout}}}}}}}"#
    );
    let mut v: serde_json::Value = serde_json::from_str(&policy(&extra)).unwrap();
    v["scrape"]["http_endpoint"]["port"] = port.into();
    let p = dir.write("policy.json", &v.to_string());
    let child = start_http(&s, &p, &[], port);
    (child, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Sends `bytes` and reads until the server closes (EOF or reset), at most `limit`.
fn exchange(addr: SocketAddr, bytes: &[u8], limit: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(bytes).unwrap();
    read_until_closed(&mut s)
}

fn read_until_closed(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("connection still open ({e}) after {} bytes", all.len()),
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

const GET: &str = "GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n";

/// Clients that pipeline thousands of GETs and never read hold neither a worker nor the
/// I/O thread: honest scrapes, for several seconds after the hostile clients' windows are
/// full, complete in a quarter of the request timeout (the old server took 4.6-9.5 s with
/// four such clients, over 40 s with a 20 s timeout, so its time grows with the timeout). The
/// timeout is 60 s so that the 15 s bound is a deadline with a wide margin on a loaded
/// machine, not a speed figure.
#[test]
fn slow_readers_do_not_hold_honest_scrapes() {
    let dir = TempDir::new("hostile-slow");
    let timeout = Duration::from_secs(60);
    let (_child, addr) = serve(&dir, &snapshot(FAMILIES, 0.0), timeout.as_secs_f64());
    assert_eq!(get(addr, "/metrics").status, 200);

    // Each keeps pipelining as long as the server reads; none ever reads.
    let hostile: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let writers: Vec<_> = hostile
        .iter()
        .map(|s| {
            let s = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let flood = GET.repeat(1000);
                while (&s).write_all(flood.as_bytes()).is_ok() {}
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let until = Instant::now() + Duration::from_secs(8);
    let mut scrapes = 0;
    while Instant::now() < until {
        let t = Instant::now();
        let r = get(addr, "/metrics");
        let took = t.elapsed();
        assert_eq!(r.status, 200, "scrape {scrapes}");
        assert!(r.body.contains("svc_messages_written_total"));
        assert!(
            took < timeout / 4,
            "honest scrape {scrapes} took {took:?} beside 8 slow readers (request timeout {timeout:?})"
        );
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    for s in &hostile {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    for w in writers {
        w.join().unwrap();
    }
}

/// A client that pipelines and never reads is cut off at its response deadline.
#[test]
fn a_slow_reader_is_dropped_at_its_deadline() {
    let dir = TempDir::new("hostile-deadline");
    let (_child, addr) = serve(&dir, &snapshot(FAMILIES, 0.0), 1.0);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nonblocking(true).unwrap();
    let flood = GET.repeat(5000);
    let _ = s.write(flood.as_bytes());
    // Well past the 1 s deadline of the response that could not be written.
    std::thread::sleep(Duration::from_secs(3));
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let got = read_until_closed(&mut s);
    let answered = got.matches("HTTP/1.1 200 OK\r\n").count();
    assert!(answered < 100, "{answered} responses");
    assert_eq!(get(addr, "/metrics").status, 200);
}

/// Pipelined requests are answered one at a time, and the connection is closed after the
/// per-connection cap (the last response says `Connection: close`).
#[test]
fn pipelining_floods_stop_at_the_cap() {
    let dir = TempDir::new("hostile-pipeline");
    let (_child, addr) = serve(&dir, &snapshot(&[], 0.0), 10.0);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let writer = {
        let s = s.try_clone().unwrap();
        std::thread::spawn(move || {
            // The server stops reading after the cap: a failed write is expected.
            let _ = (&s).write_all(GET.repeat(150).as_bytes());
        })
    };
    let got = read_until_closed(&mut s);
    writer.join().unwrap();
    assert_eq!(got.matches("HTTP/1.1 200 OK\r\n").count(), 100);
    assert_eq!(got.matches("HTTP/1.1 ").count(), 100);
    assert_eq!(got.matches("Connection: keep-alive\r\n").count(), 99);
    let last = got.rfind("HTTP/1.1 200 OK\r\n").unwrap();
    assert!(got[last..].contains("Connection: close\r\n"));
}

/// Heads a lenient parser would accept (and a proxy might read differently) get 400, and the
/// bytes behind them are never run as a second request.
#[test]
fn lenient_and_smuggling_heads_get_400_and_nothing_more() {
    let dir = TempDir::new("hostile-heads");
    let (_child, addr) = serve(&dir, &snapshot(&[], 0.0), 10.0);
    let cases: &[(&str, &[u8])] = &[
        (
            "bare LF in a header line",
            b"GET /other HTTP/1.1\r\nHost: h\r\nX: y\nGET /metrics HTTP/1.1\r\nHost: h\r\n\r\n",
        ),
        ("bare LF line ends", b"GET /metrics HTTP/1.1\nHost: h\n\n"),
        (
            "bare CR",
            b"GET /metrics HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
        ),
        (
            "NUL",
            b"GET /metrics HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n",
        ),
        (
            "obs-fold",
            b"GET /metrics HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n",
        ),
        ("missing Host", b"GET /metrics HTTP/1.1\r\n\r\n"),
        (
            "duplicate Host",
            b"GET /metrics HTTP/1.1\r\nHost: h\r\nHost: evil\r\n\r\n",
        ),
        (
            "duplicate Content-Length",
            b"GET /metrics HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
        ),
        (
            "a body (chunked)",
            b"GET /metrics HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
    ];
    for (what, head) in cases {
        let mut bytes = head.to_vec();
        // A valid request right behind: it must never be answered.
        bytes.extend_from_slice(GET.as_bytes());
        let got = exchange(addr, &bytes, Duration::from_secs(10));
        assert!(
            got.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{what}: {got:?}"
        );
        assert_eq!(got.matches("HTTP/1.1 ").count(), 1, "{what}: {got:?}");
        assert!(got.contains("Connection: close\r\n"), "{what}");
    }
    assert_eq!(get(addr, "/metrics").status, 200);
}

/// A head of exactly 8192 bytes is served; one byte more gets 431.
#[test]
fn the_head_limit_is_exact() {
    let dir = TempDir::new("hostile-limit");
    let (_child, addr) = serve(&dir, &snapshot(&[], 0.0), 10.0);
    let head = |len: usize| {
        let start = "GET /metrics HTTP/1.1\r\nHost: h\r\nConnection: close\r\nX-Pad: ";
        let mut h = start.to_string();
        h.push_str(&"p".repeat(len - start.len() - 4));
        h.push_str("\r\n\r\n");
        assert_eq!(h.len(), len);
        h
    };
    let got = exchange(addr, head(8192).as_bytes(), Duration::from_secs(10));
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got:?}");
    let got = exchange(addr, head(8193).as_bytes(), Duration::from_secs(10));
    assert!(
        got.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{got:?}"
    );
    // Split so that the end of head arrives in the read that crosses the limit (the old
    // server accepted such heads up to ~12 KiB).
    let long = head(10_000);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&long.as_bytes()[..6000]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _ = s.write_all(&long.as_bytes()[6000..]);
    let got = read_until_closed(&mut s);
    assert!(got.starts_with("HTTP/1.1 431 "), "{got:?}");
    // An endless header line is refused at the limit, without waiting for its end.
    let got = exchange(
        addr,
        format!(
            "GET /metrics HTTP/1.1\r\nHost: h\r\nX: {}",
            "a".repeat(9000)
        )
        .as_bytes(),
        Duration::from_secs(10),
    );
    assert!(got.starts_with("HTTP/1.1 431 "), "{got:?}");
}

/// The head deadline is for the whole head: a client trickling bytes is cut off with 408 at
/// the deadline although it never stops sending; a silent one is closed without a response.
#[test]
fn trickled_and_idle_heads_are_cut_off_at_the_deadline() {
    let dir = TempDir::new("hostile-trickle");
    let timeout = Duration::from_secs(2);
    let (_child, addr) = serve(&dir, &snapshot(&[], 0.0), timeout.as_secs_f64());
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: h\r\nX-Slow: ")
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let trickler = {
        let (s, stop, sent) = (s.try_clone().unwrap(), stop.clone(), sent.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) && (&s).write_all(b"a").is_ok() {
                sent.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let idle = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(timeout * 5)).unwrap();
    let t = Instant::now();
    let got = read_until_closed(&mut s);
    let cut = t.elapsed();
    let sent_by_then = sent.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    trickler.join().unwrap();
    assert!(
        got.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{got:?}"
    );
    assert!(cut < timeout * 5, "cut off after {cut:?}");
    assert!(
        sent_by_then > 3,
        "the client kept sending ({sent_by_then} bytes)"
    );
    let mut idle = idle;
    idle.set_read_timeout(Some(timeout * 5)).unwrap();
    assert_eq!(read_until_closed(&mut idle), "");
}

/// 500 connections holding partial heads do not add threads, and a scrape is answered while
/// they are connected (all still held: none was evicted for it).
#[test]
fn many_partial_connections_cost_no_threads() {
    let dir = TempDir::new("hostile-many");
    let (child, addr) = serve(&dir, &snapshot(FAMILIES, 0.0), 30.0);
    let pid = child.pid();
    assert_eq!(get(addr, "/metrics").status, 200);
    let baseline = thread_count(pid);
    let partial: Vec<TcpStream> = (0..500)
        .map(|i| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: h{i}\r\n").as_bytes())
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200);
    assert!(r
        .body
        .contains("svc_messages_written_total{subject_family=\"all\"}"));
    assert_eq!(thread_count(pid), baseline, "threads grew");
    // Every partial connection is still open (none got a response or was closed).
    for s in partial.iter().step_by(50) {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let e = (&*s).read(&mut b).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
    }
    let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path().join("comm")).unwrap())
        .collect();
    assert!(
        names.iter().any(|n| n.trim() == "svc-observe-htt"),
        "{names:?}"
    );
}

/// A snapshot dated in the future would never go stale: it is invalid (503 here, exit 1 for
/// the textfile exporter); an oversize snapshot file is refused the same way.
#[test]
fn lying_snapshots_fail_closed() {
    let dir = TempDir::new("hostile-snapshot");
    let (_child, addr) = serve(&dir, &snapshot(&[], -3600.0), 10.0);
    let r = get(addr, "/metrics");
    assert_eq!((r.status, r.body.as_str()), (503, "snapshot invalid\n"));
    let o = observe(&[
        &"scrape-textfile",
        &dir.join("snap.json"),
        &dir.join("policy.json"),
        &"--dry-run",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("in the future"), "{}", stderr(&o));

    // Within the allowed skew it is served.
    std::fs::write(dir.join("snap.json"), snapshot(&[], -2.0)).unwrap();
    assert_eq!(get(addr, "/metrics").status, 200);

    // Valid JSON padded past the 1 MiB cap.
    let mut big = snapshot(&[], 0.0);
    big.push_str(&" ".repeat(1 << 20));
    std::fs::write(dir.join("snap.json"), &big).unwrap();
    let r = get(addr, "/metrics");
    assert_eq!((r.status, r.body.as_str()), (503, "snapshot invalid\n"));
    let o = observe(&[
        &"scrape-textfile",
        &dir.join("snap.json"),
        &dir.join("policy.json"),
        &"--dry-run",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("1048576-byte limit"), "{}", stderr(&o));
}
