//! The native scrape endpoint: a small HTTP/1.1 `GET` server on `std::net` with a fixed set of
//! named threads, written for hostile clients.
//!
//! Why not tiny_http: its accept loop hands every connection to a task pool that spawns a new
//! thread whenever no worker is idle, and it sets no socket timeouts. Measured here with tiny_http
//! 0.12: 300 idle connections took the process from 8 to 291 threads, and a client that sent
//! half a request line was still connected 10 s later. Neither can be fixed from outside the
//! crate, because its accept loop is private.
//!
//! # Threads
//! - `svc-observe-http-accept` blocks in `accept`, makes each socket non-blocking and hands it
//!   with its deadline (`now + request_timeout_seconds`) to the reader over a bounded channel
//!   ([`ACCEPT_QUEUE`]); when that channel is full the connection is closed at once.
//! - `svc-observe-http-read` owns every connection that has not yet sent a complete request
//!   head (at most [`ServerConfig::max_pending`]; past that the connection closest to its
//!   deadline is dropped). It sweeps them with non-blocking reads, sleeping with an adaptive
//!   backoff (50 µs doubling up to 10 ms) while nothing moves and waking at once when a
//!   connection arrives. A connection whose head is not complete by its deadline gets `408` and
//!   is closed; a head over [`MAX_HEAD_BYTES`] gets `431`. A complete head goes to the workers
//!   over a bounded channel ([`WORKER_QUEUE`] per worker).
//! - `svc-observe-http-0..N` ([`ServerConfig::workers`]) route, render and write the response
//!   with a write timeout of `request_timeout_seconds`. A kept-alive connection goes back to the
//!   reader with a fresh deadline, so an idle keep-alive client never holds a worker.
//!
//! Idle or slow clients therefore cost one socket and a few bytes each, never a thread, and a
//! scrape is served within one sweep however many idle connections exist.
//!
//! # Responses
//! `GET <path>` (query ignored) -> `200` with the exposition; a snapshot that is missing,
//! invalid or stale (without `--allow-stale`) -> `503`; a body over `response_max_bytes` ->
//! `503`; an unsafe render (subject-family `fail_closed`) -> `500`. Another path -> `404`;
//! another method on the path -> `405` with `Allow: GET`; a malformed request or one with a body
//! -> `400`. Error bodies are one short line of plain text. Every response carries
//! `Content-Length`, `Cache-Control: no-store` and `X-Content-Type-Options: nosniff`.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};

use crate::observe::exposition::CONTENT_TYPE;

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD_BYTES: usize = 8192;
/// Capacity of the accept -> reader channel.
pub const ACCEPT_QUEUE: usize = 256;
/// Capacity of the reader -> workers channel, per worker.
pub const WORKER_QUEUE: usize = 4;
/// Default number of worker threads.
pub const DEFAULT_WORKERS: usize = 4;
/// Default bound of connections waiting for their request head.
pub const DEFAULT_MAX_PENDING: usize = 512;
/// How often idle threads look at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
const MIN_BACKOFF: Duration = Duration::from_micros(50);
const MAX_BACKOFF: Duration = Duration::from_millis(10);

/// What the endpoint serves on its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `200` with this exposition body.
    Metrics(String),
    /// `503` with this short reason (snapshot missing, invalid or stale).
    Unavailable(&'static str),
    /// `500` with this short reason (unsafe render).
    Failed(&'static str),
}

/// Produces the body for each scrape. Called on worker threads.
pub trait Source: Send + Sync + 'static {
    fn render(&self) -> Reply;
}

/// Listener settings (from `scrape.http_endpoint`).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `host:port`.
    pub bind: String,
    pub path: String,
    pub request_timeout: Duration,
    pub response_max_bytes: u64,
    pub workers: usize,
    pub max_pending: usize,
}

/// A running endpoint.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// A connection owned by the reader or a worker.
struct Conn {
    stream: TcpStream,
    /// Bytes received and not yet consumed (a partial head, or a pipelined next request).
    buf: Vec<u8>,
    deadline: Instant,
}

impl Server {
    /// Binds and starts the threads.
    pub fn start(cfg: ServerConfig, source: Arc<dyn Source>) -> io::Result<Server> {
        let listener = TcpListener::bind(&cfg.bind)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let workers = cfg.workers.max(1);
        let (conn_tx, conn_rx) = bounded::<Conn>(ACCEPT_QUEUE);
        let (job_tx, job_rx) = bounded::<Conn>(WORKER_QUEUE * workers);
        let cfg = Arc::new(cfg);
        let mut threads = Vec::with_capacity(workers + 2);

        {
            let (stop, tx, cfg) = (stop.clone(), conn_tx.clone(), cfg.clone());
            threads.push(
                thread::Builder::new()
                    .name("svc-observe-http-accept".into())
                    .spawn(move || accept_loop(listener, tx, &cfg, &stop))?,
            );
        }
        {
            let (stop, cfg) = (stop.clone(), cfg.clone());
            threads.push(
                thread::Builder::new()
                    .name("svc-observe-http-read".into())
                    .spawn(move || read_loop(conn_rx, job_tx, &cfg, &stop))?,
            );
        }
        for i in 0..workers {
            let (stop, cfg, rx, back, source) = (
                stop.clone(),
                cfg.clone(),
                job_rx.clone(),
                conn_tx.clone(),
                source.clone(),
            );
            threads.push(
                thread::Builder::new()
                    .name(format!("svc-observe-http-{i}"))
                    .spawn(move || worker_loop(rx, back, &cfg, source.as_ref(), &stop))?,
            );
        }
        Ok(Server {
            addr,
            stop,
            threads,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (it runs until the process ends).
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Stops every thread and waits for them.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept thread.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        self.wait();
    }
}

fn accept_loop(listener: TcpListener, tx: Sender<Conn>, cfg: &ServerConfig, stop: &AtomicBool) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and similar: the backlog keeps the clients; retry soon.
                log::warn!("svc-observe http: accept failed: {e}");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            stream,
            buf: Vec::new(),
            deadline: Instant::now() + cfg.request_timeout,
        };
        match tx.try_send(conn) {
            Ok(()) => {}
            Err(TrySendError::Full(c)) => drop(c), // closes the socket
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// Is there a complete request head (`\r\n\r\n`) in the buffer? Returns its length.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Writes a small response without blocking (best effort) and closes.
fn reject(mut conn: Conn, status: u16, body: &str) {
    let bytes = response_bytes(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes(),
        false,
        false,
    );
    let _ = conn.stream.write(&bytes);
    let _ = conn.stream.shutdown(Shutdown::Write);
}

fn read_loop(rx: Receiver<Conn>, jobs: Sender<Conn>, cfg: &ServerConfig, stop: &AtomicBool) {
    let mut pending: Vec<Conn> = Vec::new();
    let mut backoff = MIN_BACKOFF;
    let mut chunk = [0u8; 4096];
    loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let wait = if pending.is_empty() {
            STOP_POLL
        } else {
            backoff
        };
        match rx.recv_timeout(wait) {
            Ok(c) => pending.push(c),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(c) = rx.try_recv() {
            pending.push(c);
        }
        while pending.len() > cfg.max_pending {
            // Drop the connection closest to its deadline: the longest-idle one.
            let oldest = (0..pending.len())
                .min_by_key(|&i| pending[i].deadline)
                .expect("pending is not empty");
            drop(pending.swap_remove(oldest));
        }

        let now = Instant::now();
        let mut progress = false;
        let mut i = 0;
        while i < pending.len() {
            let c = &mut pending[i];
            let mut closed = false;
            if head_end(&c.buf).is_none() {
                match c.stream.read(&mut chunk) {
                    Ok(0) => closed = true,
                    Ok(n) => {
                        progress = true;
                        c.buf.extend_from_slice(&chunk[..n]);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => closed = true,
                }
            }
            if closed {
                drop(pending.swap_remove(i));
                continue;
            }
            let c = &pending[i];
            if head_end(&c.buf).is_some() {
                let c = pending.swap_remove(i);
                match jobs.send_timeout(c, Duration::from_millis(100)) {
                    Ok(()) => {}
                    Err(crossbeam_channel::SendTimeoutError::Timeout(c)) => {
                        reject(c, 503, "busy\n")
                    }
                    Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => return,
                }
                progress = true;
                continue;
            }
            if c.buf.len() >= MAX_HEAD_BYTES {
                reject(pending.swap_remove(i), 431, "request header too large\n");
                continue;
            }
            if now >= c.deadline {
                let c = pending.swap_remove(i);
                // A kept-alive connection that stays silent is closed without a response.
                if c.buf.is_empty() {
                    drop(c);
                } else {
                    reject(c, 408, "request timeout\n");
                }
                continue;
            }
            i += 1;
        }
        backoff = if progress {
            MIN_BACKOFF
        } else {
            (backoff * 2).min(MAX_BACKOFF)
        };
    }
}

fn worker_loop(
    rx: Receiver<Conn>,
    back: Sender<Conn>,
    cfg: &ServerConfig,
    source: &dyn Source,
    stop: &AtomicBool,
) {
    loop {
        match rx.recv_timeout(STOP_POLL) {
            Ok(conn) => serve(conn, &back, cfg, source),
            Err(RecvTimeoutError::Timeout) => {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
struct Head<'a> {
    method: &'a str,
    target: &'a str,
    keep_alive: bool,
    has_body: bool,
}

fn parse_head(head: &[u8]) -> Option<Head<'_>> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut parts = lines.next()?.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !target.starts_with('/')
        || target.bytes().any(|b| b <= b' ' || b == 0x7f)
    {
        return None;
    }
    let mut keep_alive = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return None,
    };
    let mut has_body = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        if name.is_empty() || name.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return None;
        }
        let value = value.trim();
        if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") && version == "HTTP/1.1" {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || (name.eq_ignore_ascii_case("content-length") && value != "0")
        {
            has_body = true;
        }
    }
    Some(Head {
        method,
        target,
        keep_alive,
        has_body,
    })
}

/// Fuzzing entry point (`fuzz/fuzz_targets/http_head.rs`): [`parse_head`] as plain values
/// `(method, target, keep_alive, has_body)`.
#[doc(hidden)]
pub fn fuzz_parse_head(head: &[u8]) -> Option<(&str, &str, bool, bool)> {
    parse_head(head).map(|h| (h.method, h.target, h.keep_alive, h.has_body))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

fn response_bytes(
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
    allow: bool,
) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: {}\r\n",
        reason(status),
        body.len(),
        if keep_alive { "keep-alive" } else { "close" },
    );
    if allow {
        head.push_str("Allow: GET\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Decides the response for one request head.
fn respond(
    head: Option<&Head<'_>>,
    cfg: &ServerConfig,
    source: &dyn Source,
) -> (u16, Vec<u8>, bool) {
    let text = |status: u16, body: &str| (status, body.as_bytes().to_vec(), false);
    let Some(h) = head else {
        return text(400, "bad request\n");
    };
    let path = h.target.split('?').next().unwrap_or("");
    if path != cfg.path {
        return text(404, "not found\n");
    }
    if h.method != "GET" {
        return text(405, "method not allowed\n");
    }
    if h.has_body {
        return text(400, "a GET request carries no body\n");
    }
    match source.render() {
        Reply::Metrics(body) if body.len() as u64 > cfg.response_max_bytes => {
            log::warn!(
                "svc-observe http: rendered {} bytes, over response_max_bytes {}; response suppressed",
                body.len(),
                cfg.response_max_bytes
            );
            text(503, "response too large\n")
        }
        Reply::Metrics(body) => (200, body.into_bytes(), true),
        Reply::Unavailable(why) => text(503, &format!("{why}\n")),
        Reply::Failed(why) => text(500, &format!("{why}\n")),
    }
}

fn serve(mut conn: Conn, back: &Sender<Conn>, cfg: &ServerConfig, source: &dyn Source) {
    let Some(end) = head_end(&conn.buf) else {
        return;
    };
    let rest = conn.buf.split_off(end);
    let head = parse_head(&conn.buf[..end - 4]);
    let (status, body, ok) = respond(head.as_ref(), cfg, source);
    let keep_alive = ok && head.as_ref().is_some_and(|h| h.keep_alive);
    let allow = status == 405;
    let content_type = if status == 200 {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let bytes = response_bytes(status, content_type, &body, keep_alive, allow);
    let written = conn.stream.set_nonblocking(false).is_ok()
        && conn
            .stream
            .set_write_timeout(Some(cfg.request_timeout))
            .is_ok()
        && conn.stream.write_all(&bytes).is_ok();
    if !written {
        return; // the client is gone or too slow: drop the connection
    }
    if keep_alive && conn.stream.set_nonblocking(true).is_ok() {
        conn.buf = rest;
        conn.deadline = Instant::now() + cfg.request_timeout;
        if let Err(TrySendError::Full(c) | TrySendError::Disconnected(c)) = back.try_send(conn) {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
    } else {
        let _ = conn.stream.shutdown(Shutdown::Write);
    }
}

/// The endpoint's source: reads the snapshot on every scrape and renders it with the policy.
pub struct SnapshotSource {
    pub snapshot: std::path::PathBuf,
    pub policy: crate::observe::policy::Policy,
    pub allow_stale: bool,
}

impl Source for SnapshotSource {
    fn render(&self) -> Reply {
        use crate::observe::textfile::{render_snapshot, RenderError, SnapshotError};
        match render_snapshot(&self.snapshot, &self.policy, self.allow_stale) {
            Ok(body) => Reply::Metrics(body),
            Err(e) => {
                log::warn!("svc-observe http: {e}");
                match e {
                    RenderError::Snapshot(SnapshotError::Read { .. }) => {
                        Reply::Unavailable("snapshot unavailable")
                    }
                    RenderError::Snapshot(SnapshotError::Invalid { .. }) => {
                        Reply::Unavailable("snapshot invalid")
                    }
                    RenderError::Stale(_) => Reply::Unavailable("snapshot is stale"),
                    RenderError::Overflow(_) => {
                        Reply::Failed("unsafe render: subject families over the limit")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let h = parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close").unwrap();
        assert_eq!(
            h,
            Head {
                method: "GET",
                target: "/metrics",
                keep_alive: false,
                has_body: false
            }
        );
        assert!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x")
                .unwrap()
                .keep_alive
        );
        assert!(!parse_head(b"GET /metrics HTTP/1.0").unwrap().keep_alive);
        assert!(
            parse_head(b"GET /m HTTP/1.1\r\nContent-Length: 3")
                .unwrap()
                .has_body
        );
        assert!(
            parse_head(b"GET /m HTTP/1.1\r\nTransfer-Encoding: chunked")
                .unwrap()
                .has_body
        );
        for bad in [
            &b"GET /metrics"[..],
            b"GET metrics HTTP/1.1",
            b"GET /m HTTP/2",
            b"get /m HTTP/1.1",
            b"GET /m HTTP/1.1\r\nno colon",
            b"GET  /m HTTP/1.1",
            b"GET /m HTTP/1.1 extra",
            b"\xff\xfe",
        ] {
            assert!(
                parse_head(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    struct Fixed(Reply);
    impl Source for Fixed {
        fn render(&self) -> Reply {
            self.0.clone()
        }
    }

    fn cfg(max: u64) -> ServerConfig {
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            path: "/metrics".into(),
            request_timeout: Duration::from_secs(1),
            response_max_bytes: max,
            workers: 1,
            max_pending: 4,
        }
    }

    #[test]
    fn routing_and_statuses() {
        let ok = Fixed(Reply::Metrics("a_total 1\n".into()));
        let status =
            |h: &[u8], src: &dyn Source, max| respond(parse_head(h).as_ref(), &cfg(max), src).0;
        assert_eq!(status(b"GET /metrics HTTP/1.1", &ok, 1024), 200);
        assert_eq!(status(b"GET /metrics?x=1 HTTP/1.1", &ok, 1024), 200);
        assert_eq!(status(b"GET /other HTTP/1.1", &ok, 1024), 404);
        assert_eq!(status(b"GET /metrics/ HTTP/1.1", &ok, 1024), 404);
        assert_eq!(status(b"POST /metrics HTTP/1.1", &ok, 1024), 405);
        assert_eq!(status(b"HEAD /metrics HTTP/1.1", &ok, 1024), 405);
        assert_eq!(
            status(b"GET /metrics HTTP/1.1\r\nContent-Length: 5", &ok, 1024),
            400
        );
        assert_eq!(status(b"GET /metrics HTTP/1.1", &ok, 4), 503);
        assert_eq!(
            status(
                b"GET /metrics HTTP/1.1",
                &Fixed(Reply::Unavailable("stale")),
                1024
            ),
            503
        );
        assert_eq!(
            status(
                b"GET /metrics HTTP/1.1",
                &Fixed(Reply::Failed("unsafe")),
                1024
            ),
            500
        );
        assert_eq!(respond(None, &cfg(1024), &ok).0, 400);
    }

    /// Past `max_pending`, the longest-waiting connection is dropped and a fresh scrape is
    /// still served.
    #[test]
    fn pending_bound_evicts_the_oldest() {
        let server = Server::start(
            cfg(1 << 20),
            Arc::new(Fixed(Reply::Metrics("a_total 1\n".into()))),
        )
        .unwrap();
        let addr = server.local_addr();
        let idle: Vec<TcpStream> = (0..10).map(|_| TcpStream::connect(addr).unwrap()).collect();
        thread::sleep(Duration::from_millis(100));
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\na_total 1\n"));
        // The first idle connections were closed by the server.
        let mut first = &idle[0];
        first
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 1];
        assert_eq!(first.read(&mut b).unwrap(), 0);
        server.stop();
    }
}
