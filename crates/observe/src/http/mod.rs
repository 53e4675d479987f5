//! The native scrape endpoint: a small HTTP/1.1 `GET` server on `std::net` and epoll, with a
//! fixed set of named threads, written for hostile clients.
//!
//! Why not tiny_http: its accept loop hands every connection to a task pool that spawns a new
//! thread whenever no worker is idle, and it sets no socket timeouts. Measured here with tiny_http
//! 0.12: 300 idle connections took the process from 8 to 291 threads, and a client that sent
//! half a request line was still connected 10 s later. Neither can be fixed from outside the
//! crate, because its accept loop is private.
//!
//! # Threads
//! - `svc-observe-http-io` (module `io`) owns the listener and every connection. It sleeps in
//!   `epoll_wait` (through rustix's safe wrapper) until a socket is ready, a worker hands back a
//!   response, or the earliest connection deadline passes: an idle or trickling connection
//!   costs no CPU between its bytes, and its partial head is scanned once, not once per wakeup.
//!   All socket I/O is non-blocking on this thread, so no client can make it wait.
//! - `svc-observe-http-0..N` ([`ServerConfig::workers`]) only render: read the snapshot,
//!   filter, render, and hand the bytes back. They never touch a socket, so slow readers cannot
//!   hold them.
//!
//! # Limits (each a constant below or a [`ServerConfig`] field)
//! - Head: strict parsing ([`head`]), at most [`MAX_HEAD_BYTES`] (exact) and [`MAX_HEADERS`]
//!   lines, complete within `request_timeout` of the connection (or of the previous response on
//!   a kept-alive connection), else `408`; a connection that sent nothing is closed silently.
//! - Response: one deadline for the whole of it, `request_timeout` after its head was complete
//!   (queueing, rendering and every write together); past it the connection is dropped.
//! - One request at a time per connection: bytes pipelined behind a head stay in the kernel
//!   until the response is written; after [`MAX_REQUESTS_PER_CONNECTION`] responses the
//!   connection is closed (`Connection: close` on the last).
//! - At most [`ServerConfig::max_connections`]; past that the connection nearest its
//!   deadline (the longest idle, or the slowest reader) is dropped for the new one.
//! - Rendered bytes waiting for slow readers: at most [`MAX_BUFFERED_RESPONSE_BYTES`] in
//!   total; past it new renders wait (every held response ends at its own deadline).
//! - After an error response the server stops reading requests, shuts down its side, and
//!   discards what the client still sends for at most [`LINGER`] or [`LINGER_MAX_BYTES`] before
//!   closing, so the client reads the error instead of a reset.
//!
//! # Responses
//! `GET <path>` (query ignored) -> `200` with the exposition; a snapshot that is missing,
//! invalid or stale (without `--allow-stale`) -> `503`; a body over `response_max_bytes` ->
//! `503`; an unsafe render (subject-family `fail_closed`) -> `500`. Another path -> `404`;
//! another method on the path -> `405` with `Allow: GET`; a malformed request or one with a body
//! -> `400`. Error bodies are one short line of plain text. Every response carries
//! `Content-Length`, `Cache-Control: no-store` and `X-Content-Type-Options: nosniff`.

pub mod head;
mod io;
#[cfg(test)]
mod tests;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};
use rustix::event::{eventfd, EventfdFlags};
use rustix::fd::OwnedFd;

use crate::exposition::CONTENT_TYPE;

pub use head::{parse_request_head, HeadError, RequestHead, MAX_HEADERS, MAX_HEAD_BYTES};

/// Render jobs queued per worker (the I/O thread keeps further requests in its own FIFO).
pub const WORKER_QUEUE: usize = 4;
/// Default number of worker threads.
pub const DEFAULT_WORKERS: usize = 4;
/// Default bound of open connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Responses served on one connection before it is closed.
pub const MAX_REQUESTS_PER_CONNECTION: u32 = 100;
/// Total rendered bytes held for clients that have not read them yet.
pub const MAX_BUFFERED_RESPONSE_BYTES: usize = 64 << 20;
/// How long a connection is drained after an error response before it is closed.
pub const LINGER: Duration = Duration::from_secs(2);
/// Most bytes drained from a connection after an error response.
pub const LINGER_MAX_BYTES: usize = 64 << 10;

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
    pub max_connections: usize,
}

/// A running endpoint.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
}

/// A render request from the I/O thread to a worker.
struct Job {
    token: u64,
    keep_alive: bool,
}

/// A rendered response from a worker back to the I/O thread.
struct Done {
    token: u64,
    bytes: Vec<u8>,
    keep_alive: bool,
}

impl Server {
    /// Binds and starts the threads.
    pub fn start(cfg: ServerConfig, source: Arc<dyn Source>) -> std::io::Result<Server> {
        let listener = TcpListener::bind(&cfg.bind)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let workers = cfg.workers.max(1);
        // An eventfd, not a socket pair: the shipped unit allows only IP address families.
        let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let (job_tx, job_rx) = bounded::<Job>(WORKER_QUEUE * workers);
        let (done_tx, done_rx) = bounded::<Done>(WORKER_QUEUE * workers);
        let cfg = Arc::new(cfg);
        let event_loop = io::EventLoop::new(listener, wake.clone(), job_tx, done_rx, cfg.clone())?;
        let mut threads = Vec::with_capacity(workers + 1);
        {
            let stop = stop.clone();
            threads.push(
                thread::Builder::new()
                    .name("svc-observe-http-io".into())
                    .spawn(move || event_loop.run(&stop))?,
            );
        }
        for i in 0..workers {
            let (cfg, rx, tx, source) =
                (cfg.clone(), job_rx.clone(), done_tx.clone(), source.clone());
            let wake = wake.clone();
            threads.push(
                thread::Builder::new()
                    .name(format!("svc-observe-http-{i}"))
                    .spawn(move || worker_loop(rx, tx, wake, &cfg, source.as_ref()))?,
            );
        }
        Ok(Server {
            addr,
            stop,
            wake,
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
        wake_up(&self.wake);
        self.wait();
    }
}

/// Wakes the I/O thread (adds 1 to the eventfd counter; it cannot overflow in practice, and
/// a failed write means a wakeup is pending anyway).
fn wake_up(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Renders on request until the I/O thread goes away (its job sender is dropped).
fn worker_loop(
    rx: Receiver<Job>,
    tx: Sender<Done>,
    wake: Arc<OwnedFd>,
    cfg: &ServerConfig,
    source: &dyn Source,
) {
    for job in rx.iter() {
        // A panicking render must not take the worker (and its slot in the I/O thread's
        // in-flight count) with it: the client gets a 500.
        let rendered =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| render(cfg, source)));
        let (status, body) = rendered.unwrap_or_else(|_| (500, b"internal error\n".to_vec()));
        let keep_alive = job.keep_alive && status == 200;
        let content_type = if status == 200 {
            CONTENT_TYPE
        } else {
            "text/plain; charset=utf-8"
        };
        let bytes = response_bytes(status, content_type, &body, keep_alive, false);
        let done = Done {
            token: job.token,
            bytes,
            keep_alive,
        };
        if tx.send(done).is_err() {
            return;
        }
        wake_up(&wake);
    }
}

/// How the I/O thread answers a complete, parsed head.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// Hand to a worker.
    Render { keep_alive: bool },
    /// Answer at once with this status and body, then close.
    Error(u16, &'static str),
}

fn route(head: Result<&RequestHead<'_>, HeadError>, cfg: &ServerConfig) -> Route {
    let h = match head {
        Ok(h) => h,
        Err(HeadError::TooLarge | HeadError::TooManyHeaders) => {
            return Route::Error(431, "request header too large\n")
        }
        Err(HeadError::Malformed(_) | HeadError::Incomplete) => {
            return Route::Error(400, "bad request\n")
        }
    };
    let path = h.target.split('?').next().unwrap_or("");
    if path != cfg.path {
        return Route::Error(404, "not found\n");
    }
    if h.method != "GET" {
        return Route::Error(405, "method not allowed\n");
    }
    if h.has_body {
        return Route::Error(400, "a GET request carries no body\n");
    }
    Route::Render {
        keep_alive: h.keep_alive,
    }
}

/// Status and body of one scrape.
fn render(cfg: &ServerConfig, source: &dyn Source) -> (u16, Vec<u8>) {
    let text = |status: u16, body: &str| (status, body.as_bytes().to_vec());
    match source.render() {
        Reply::Metrics(body) if body.len() as u64 > cfg.response_max_bytes => {
            log::warn!(
                "svc-observe http: rendered {} bytes, over response_max_bytes {}; response suppressed",
                body.len(),
                cfg.response_max_bytes
            );
            text(503, "response too large\n")
        }
        Reply::Metrics(body) => (200, body.into_bytes()),
        Reply::Unavailable(why) => text(503, &format!("{why}\n")),
        Reply::Failed(why) => text(500, &format!("{why}\n")),
    }
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

/// An error response written by the I/O thread itself (always closes).
fn error_bytes(status: u16, body: &str) -> Vec<u8> {
    response_bytes(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes(),
        false,
        status == 405,
    )
}

/// The endpoint's source: reads the snapshot on every scrape and renders it with the policy.
pub struct SnapshotSource {
    pub snapshot: std::path::PathBuf,
    pub policy: crate::policy::Policy,
    pub allow_stale: bool,
}

impl Source for SnapshotSource {
    fn render(&self) -> Reply {
        use crate::textfile::{render_snapshot, RenderError, SnapshotError};
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
