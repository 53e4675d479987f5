//! The I/O thread of the scrape endpoint: one epoll loop that owns the listener and every
//! connection, with non-blocking sockets only.
//!
//! Each connection is a small state machine (reading its head, queued for a worker, being
//! rendered, writing, lingering after an error) with one deadline kept in an ordered set, so
//! the loop sleeps until a socket is ready, a worker wakes it, or the earliest deadline: no
//! sweep, no polling interval. Readiness is level-triggered and the interest follows the state
//! (read while reading a head or lingering, write while writing, nothing while queued or
//! rendering), so a client that pipelines requests and never reads leaves its bytes in the
//! kernel and its one response in [`State::Writing`] until its deadline.
//!
//! Tokens carry a slot index and the slot's generation: a worker's answer for a connection
//! closed meanwhile (deadline passed, client gone) finds a newer generation and is dropped.

use std::collections::{BTreeSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, Timespec};
use rustix::fd::OwnedFd;

use super::head::{self, Scan, MAX_HEAD_BYTES};
use super::{
    error_bytes, route, Done, Job, Route, ServerConfig, LINGER, LINGER_MAX_BYTES,
    MAX_BUFFERED_RESPONSE_BYTES, MAX_REQUESTS_PER_CONNECTION, WORKER_QUEUE,
};

const LISTENER: u64 = u64::MAX;
const WAKE: u64 = u64::MAX - 1;
/// Connections accepted per readiness event of the listener (fairness with open ones).
const ACCEPT_BATCH: usize = 64;
const READ_CHUNK: usize = 4096;
/// Pause of the listener after an accept error such as EMFILE (it would stay readable).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

enum State {
    /// Reading a request head (or idle between kept-alive requests).
    Reading,
    /// Complete head, waiting in the FIFO for a worker.
    Queued { keep_alive: bool },
    /// A worker renders its response.
    Rendering,
    /// Writing `out[pos..]`; `held` when `out` counts in the buffered-bytes bound.
    Writing {
        out: Vec<u8>,
        pos: usize,
        keep_alive: bool,
        held: bool,
    },
    /// After an error response: our side shut, input discarded until EOF or the deadline.
    Lingering { drained: usize },
}

struct Conn {
    stream: TcpStream,
    /// Received, not yet consumed: a partial head, or bytes pipelined behind one.
    buf: Vec<u8>,
    /// `buf[..scanned]` was scanned without finding the end of the head.
    scanned: usize,
    state: State,
    deadline: Instant,
    /// Request heads received on this connection.
    requests: u32,
    interest: epoll::EventFlags,
}

struct Slot {
    generation: u32,
    conn: Option<Conn>,
}

pub(super) struct EventLoop {
    epoll: OwnedFd,
    listener: TcpListener,
    accept_paused_until: Option<Instant>,
    wake: Arc<OwnedFd>,
    jobs: Sender<Job>,
    done: Receiver<Done>,
    cfg: Arc<ServerConfig>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    open: usize,
    deadlines: BTreeSet<(Instant, u64)>,
    /// Connections in [`State::Queued`], oldest first (one entry per connection at most).
    queue: VecDeque<u64>,
    /// Jobs sent whose answer has not come back.
    in_flight: usize,
    /// Bytes of rendered responses held in [`State::Writing`].
    buffered: usize,
}

fn token_of(index: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | index as u64
}

impl EventLoop {
    pub(super) fn new(
        listener: TcpListener,
        wake: Arc<OwnedFd>,
        jobs: Sender<Job>,
        done: Receiver<Done>,
        cfg: Arc<ServerConfig>,
    ) -> std::io::Result<EventLoop> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let data = epoll::EventData::new_u64;
        epoll::add(&ep, &listener, data(LISTENER), epoll::EventFlags::IN)?;
        epoll::add(&ep, &*wake, data(WAKE), epoll::EventFlags::IN)?;
        Ok(EventLoop {
            epoll: ep,
            listener,
            accept_paused_until: None,
            wake,
            jobs,
            done,
            cfg,
            slots: Vec::new(),
            free: Vec::new(),
            open: 0,
            deadlines: BTreeSet::new(),
            queue: VecDeque::new(),
            in_flight: 0,
            buffered: 0,
        })
    }

    /// Runs until `stop` is set (and the wake socket written); dropping `self` then closes
    /// every connection and the job channel, which ends the workers.
    pub(super) fn run(mut self, stop: &AtomicBool) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let timeout = self.next_timeout();
            events.clear();
            match epoll::wait(&self.epoll, spare_capacity(&mut events), timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    log::error!("svc-observe http: epoll_wait failed: {e}; endpoint stopped");
                    return;
                }
            }
            for ev in events.iter().copied() {
                let (token, flags) = (ev.data.u64(), ev.flags);
                match token {
                    LISTENER => self.accept(),
                    WAKE => self.drain_wake(),
                    _ => self.on_event(token, flags),
                }
            }
            while let Ok(done) = self.done.try_recv() {
                self.on_done(done);
            }
            self.dispatch();
            self.expire(Instant::now());
        }
    }

    /// Time until the earliest deadline, rounded up to the next millisecond (epoll's
    /// resolution), so the loop never wakes just before it and spins.
    fn next_timeout(&self) -> Option<Timespec> {
        let first = self.deadlines.first().map(|(when, _)| *when);
        let earliest = match (first, self.accept_paused_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        let wait = earliest.saturating_duration_since(Instant::now()) + Duration::from_millis(1);
        Some(Timespec {
            tv_sec: wait.as_secs() as _,
            tv_nsec: wait.subsec_nanos() as _,
        })
    }

    fn drain_wake(&mut self) {
        // Reading an eventfd returns its counter and resets it.
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&*self.wake, &mut b);
    }

    fn accept(&mut self) {
        for _ in 0..ACCEPT_BATCH {
            match self.listener.accept() {
                Ok((stream, _)) => self.add(stream),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // Out of descriptors and similar: the listener stays readable, so stop
                    // watching it for a moment instead of spinning; the backlog keeps clients.
                    log::warn!("svc-observe http: accept failed: {e}; pausing accepts");
                    let none = epoll::EventFlags::empty();
                    let _ = epoll::modify(
                        &self.epoll,
                        &self.listener,
                        epoll::EventData::new_u64(LISTENER),
                        none,
                    );
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    fn add(&mut self, stream: TcpStream) {
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let _ = stream.set_nodelay(true);
        if self.open >= self.cfg.max_connections.max(1) {
            self.evict();
        }
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Slot {
                generation: 0,
                conn: None,
            });
            self.slots.len() - 1
        });
        let token = token_of(index, self.slots[index].generation);
        let interest = epoll::EventFlags::IN;
        if epoll::add(
            &self.epoll,
            &stream,
            epoll::EventData::new_u64(token),
            interest,
        )
        .is_err()
        {
            self.free.push(index);
            return;
        }
        let deadline = Instant::now() + self.cfg.request_timeout;
        self.slots[index].conn = Some(Conn {
            stream,
            buf: Vec::new(),
            scanned: 0,
            state: State::Reading,
            deadline,
            requests: 0,
            interest,
        });
        self.deadlines.insert((deadline, token));
        self.open += 1;
    }

    /// Drops the connection nearest its deadline: the longest-idle or slowest one, whatever
    /// its state (a worker's answer for it is then dropped), so a newcomer always gets in.
    fn evict(&mut self) {
        let victim = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.conn.as_ref().map(|c| (i, c.deadline)))
            .min_by_key(|(_, deadline)| *deadline)
            .map(|(i, _)| i);
        if let Some(i) = victim {
            self.close(i);
        }
    }

    /// The slot index of a live token.
    fn lookup(&self, token: u64) -> Option<usize> {
        let index = (token & 0xffff_ffff) as usize;
        let slot = self.slots.get(index)?;
        (slot.generation == (token >> 32) as u32 && slot.conn.is_some()).then_some(index)
    }

    fn conn(&mut self, index: usize) -> &mut Conn {
        self.slots[index]
            .conn
            .as_mut()
            .expect("looked-up slot holds a connection")
    }

    fn token(&self, index: usize) -> u64 {
        token_of(index, self.slots[index].generation)
    }

    fn close(&mut self, index: usize) {
        let token = self.token(index);
        let slot = &mut self.slots[index];
        let Some(conn) = slot.conn.take() else {
            return;
        };
        slot.generation = slot.generation.wrapping_add(1);
        self.deadlines.remove(&(conn.deadline, token));
        if let State::Writing {
            out, held: true, ..
        } = &conn.state
        {
            self.buffered -= out.len();
        }
        let _ = epoll::delete(&self.epoll, &conn.stream);
        self.free.push(index);
        self.open -= 1;
    }

    fn set_deadline(&mut self, index: usize, deadline: Instant) {
        let token = self.token(index);
        let c = self.conn(index);
        let old = std::mem::replace(&mut c.deadline, deadline);
        self.deadlines.remove(&(old, token));
        self.deadlines.insert((deadline, token));
    }

    /// Sets the readiness interest; false (and the connection closed) when epoll refuses.
    fn set_interest(&mut self, index: usize, flags: epoll::EventFlags) -> bool {
        let token = self.token(index);
        let Some(c) = self.slots[index].conn.as_mut() else {
            return false;
        };
        if c.interest == flags {
            return true;
        }
        c.interest = flags;
        let data = epoll::EventData::new_u64(token);
        if epoll::modify(&self.epoll, &c.stream, data, flags).is_err() {
            self.close(index);
            return false;
        }
        true
    }

    fn on_event(&mut self, token: u64, flags: epoll::EventFlags) {
        let Some(index) = self.lookup(token) else {
            return;
        };
        if flags.intersects(epoll::EventFlags::ERR | epoll::EventFlags::HUP) {
            // Reset or both directions shut: nothing more can be read or written.
            self.close(index);
            return;
        }
        match self.conn(index).state {
            State::Reading if flags.contains(epoll::EventFlags::IN) => self.read_head(index),
            State::Writing { .. } if flags.contains(epoll::EventFlags::OUT) => self.write(index),
            State::Lingering { .. } if flags.contains(epoll::EventFlags::IN) => self.drain(index),
            _ => {}
        }
    }

    fn read_head(&mut self, index: usize) {
        let mut chunk = [0u8; READ_CHUNK];
        let c = self.conn(index);
        // Never more than the head limit: the scan decides at exactly MAX_HEAD_BYTES.
        let room = MAX_HEAD_BYTES.saturating_sub(c.buf.len()).min(READ_CHUNK);
        match c.stream.read(&mut chunk[..room]) {
            Ok(0) => self.close(index),
            Ok(n) => {
                c.buf.extend_from_slice(&chunk[..n]);
                self.advance(index);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(_) => self.close(index),
        }
    }

    /// Scans what arrived; on a complete head routes it.
    fn advance(&mut self, index: usize) {
        let cfg = self.cfg.clone();
        let c = self.conn(index);
        match head::scan(&c.buf, c.scanned) {
            Scan::Incomplete(at) => {
                c.scanned = at;
                self.set_interest(index, epoll::EventFlags::IN);
            }
            Scan::Refused(e) => {
                if let Route::Error(status, body) = route(Err(e), &cfg) {
                    self.respond_error(index, status, body);
                }
            }
            Scan::Complete(end) => {
                let routed = route(
                    head::parse_complete(&c.buf[..end]).as_ref().map_err(|e| *e),
                    &cfg,
                );
                c.buf.drain(..end);
                c.scanned = 0;
                c.requests += 1;
                let last = c.requests >= MAX_REQUESTS_PER_CONNECTION;
                // One deadline for the whole response: queue, render and every write.
                self.set_deadline(index, Instant::now() + cfg.request_timeout);
                match routed {
                    Route::Render { keep_alive } => {
                        self.conn(index).state = State::Queued {
                            keep_alive: keep_alive && !last,
                        };
                        if self.set_interest(index, epoll::EventFlags::empty()) {
                            let token = self.token(index);
                            self.queue.push_back(token);
                        }
                    }
                    Route::Error(status, body) => self.respond_error(index, status, body),
                }
            }
        }
    }

    fn respond_error(&mut self, index: usize, status: u16, body: &str) {
        self.conn(index).state = State::Writing {
            out: error_bytes(status, body),
            pos: 0,
            keep_alive: false,
            held: false,
        };
        self.write(index);
    }

    /// Writes what the socket takes now; the rest when it is writable again.
    fn write(&mut self, index: usize) {
        let c = self.conn(index);
        let State::Writing { out, pos, .. } = &mut c.state else {
            return;
        };
        loop {
            match c.stream.write(&out[*pos..]) {
                Ok(0) => break,
                Ok(n) => {
                    *pos += n;
                    if *pos == out.len() {
                        self.finish(index);
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.set_interest(index, epoll::EventFlags::OUT);
                    return;
                }
                Err(_) => break,
            }
        }
        self.close(index);
    }

    /// A response is fully written: next request, or close.
    fn finish(&mut self, index: usize) {
        let state = std::mem::replace(&mut self.conn(index).state, State::Reading);
        let State::Writing {
            out,
            keep_alive,
            held,
            ..
        } = state
        else {
            return;
        };
        if held {
            self.buffered -= out.len();
        }
        if keep_alive {
            self.set_deadline(index, Instant::now() + self.cfg.request_timeout);
            // A pipelined head may already be here.
            self.advance(index);
        } else {
            let c = self.conn(index);
            let _ = c.stream.shutdown(Shutdown::Write);
            c.state = State::Lingering { drained: 0 };
            c.buf = Vec::new();
            self.set_deadline(index, Instant::now() + LINGER);
            self.set_interest(index, epoll::EventFlags::IN);
        }
    }

    fn drain(&mut self, index: usize) {
        let mut chunk = [0u8; READ_CHUNK];
        let c = self.conn(index);
        let State::Lingering { drained } = &mut c.state else {
            return;
        };
        match c.stream.read(&mut chunk) {
            Ok(n) if n > 0 && *drained + n <= LINGER_MAX_BYTES => *drained += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            _ => self.close(index),
        }
    }

    fn on_done(&mut self, done: Done) {
        self.in_flight -= 1;
        let Some(index) = self.lookup(done.token) else {
            return; // closed meanwhile (deadline, client gone)
        };
        self.buffered += done.bytes.len();
        self.conn(index).state = State::Writing {
            out: done.bytes,
            pos: 0,
            keep_alive: done.keep_alive,
            held: true,
        };
        self.write(index);
    }

    /// Hands queued requests to the workers while they have room and the buffered bytes
    /// are under their bound.
    fn dispatch(&mut self) {
        let capacity = WORKER_QUEUE * self.cfg.workers.max(1);
        while self.in_flight < capacity && self.buffered < MAX_BUFFERED_RESPONSE_BYTES {
            let Some(token) = self.queue.pop_front() else {
                return;
            };
            let Some(index) = self.lookup(token) else {
                continue;
            };
            let State::Queued { keep_alive } = self.conn(index).state else {
                continue;
            };
            match self.jobs.try_send(Job { token, keep_alive }) {
                Ok(()) => {
                    self.in_flight += 1;
                    self.conn(index).state = State::Rendering;
                }
                Err(TrySendError::Full(_)) => {
                    self.queue.push_front(token);
                    return;
                }
                Err(TrySendError::Disconnected(_)) => {
                    self.close(index);
                    return;
                }
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        if self.accept_paused_until.is_some_and(|t| t <= now) {
            self.accept_paused_until = None;
            let data = epoll::EventData::new_u64(LISTENER);
            let _ = epoll::modify(&self.epoll, &self.listener, data, epoll::EventFlags::IN);
        }
        while let Some(&(when, token)) = self.deadlines.first() {
            if when > now {
                return;
            }
            self.deadlines.pop_first();
            let Some(index) = self.lookup(token) else {
                continue;
            };
            let c = self.conn(index);
            match c.state {
                // A half-sent head gets 408; a silent connection is just closed.
                State::Reading if !c.buf.is_empty() => {
                    let deadline = now + self.cfg.request_timeout;
                    self.set_deadline(index, deadline);
                    self.respond_error(index, 408, "request timeout\n");
                }
                _ => self.close(index),
            }
        }
    }
}
