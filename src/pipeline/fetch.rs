//! `svc-fetch`: turns credits into pull requests and deliveries into batches.
//!
//! One batch = the messages answering one pull request. The broker serves outstanding pull
//! requests in order, so each delivery belongs to the oldest outstanding request. A request
//! ends when it is full, when the broker says it expired (408) or hit a limit (409), or when
//! its deadline passes without word (its answer was lost to a reconnect). A delivery that
//! arrives with no request outstanding (late, after such a loss) is NAKed at once so the
//! broker redelivers it promptly; it is never dropped silently.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::{AckMsg, Monitor, RawBatch, PIPELINED_PULL_REQUESTS};
use crate::broker::{self, AckHandle, AckVerb, Connection, Delivery};
use crate::envelope::{now_unix_nanos, RawMessage};
use crate::metrics::Metrics;

/// How long a wait on the subscription lasts before the stop flag and deadlines are checked.
const POLL: Duration = Duration::from_millis(50);
/// Extra time after a pull request's expiry before we stop waiting for the broker's 408.
const EXPIRY_GRACE: Duration = Duration::from_secs(1);

pub struct Fetcher {
    pub nc: Connection,
    pub sub: broker::PullSubscription,
    pub batch_size: usize,
    pub expiry: Duration,
    pub credit_rx: Receiver<()>,
    pub credit_tx: Sender<()>,
    pub raw_tx: Sender<RawBatch>,
    pub ack_tx: Sender<AckMsg>,
    pub stop: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub monitor: Arc<Monitor>,
}

/// An outstanding pull request and the deliveries collected for it.
struct Request {
    remaining: usize,
    deadline: Instant,
    messages: Vec<(RawMessage, i128)>,
    handles: Vec<AckHandle>,
}

impl Fetcher {
    /// Runs until the stop flag is set (Ok) or the connection is closed for good (Err).
    pub fn run(self) -> Result<(), String> {
        let mut outstanding: VecDeque<Request> = VecDeque::new();
        let mut next_id: u64 = 1;
        let mut request_failures: u32 = 0;
        let result = loop {
            if self.stop.load(Ordering::SeqCst) {
                break Ok(());
            }
            // Keep the pipeline of pull requests full, one credit per request.
            if outstanding.len() < PIPELINED_PULL_REQUESTS {
                let credit = if outstanding.is_empty() {
                    self.monitor.activity("waiting for a free batch slot");
                    self.credit_rx.recv_timeout(POLL).ok()
                } else {
                    self.credit_rx.try_recv().ok()
                };
                if credit.is_some() {
                    self.monitor.activity("sending pull request");
                    match broker::request_batch(&self.nc, &self.sub, self.batch_size, self.expiry) {
                        Ok(()) => {
                            request_failures = 0;
                            outstanding.push_back(Request {
                                remaining: self.batch_size,
                                deadline: Instant::now() + self.expiry + EXPIRY_GRACE,
                                messages: Vec::with_capacity(self.batch_size),
                                handles: Vec::with_capacity(self.batch_size),
                            });
                        }
                        Err(e) => {
                            // Disconnected: the client reconnects on its own; retry calmly.
                            let _ = self.credit_tx.send(());
                            request_failures += 1;
                            if request_failures == 1 || request_failures % 50 == 0 {
                                log::warn!(
                                    "broker: pull request failed ({request_failures}x): {e}"
                                );
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                    continue;
                }
                if outstanding.is_empty() {
                    continue;
                }
            }

            self.monitor.activity("waiting for deliveries");
            match broker::next_delivery(&self.sub, POLL) {
                Delivery::Message(raw, handle) => {
                    Metrics::add(&self.metrics.counters.messages_fetched_total, 1);
                    self.monitor.mark_fetch();
                    let received = now_unix_nanos();
                    match outstanding.front_mut() {
                        Some(req) => {
                            req.messages.push((raw, received));
                            req.handles.push(handle);
                            req.remaining = req.remaining.saturating_sub(1);
                            if req.remaining == 0 {
                                let req = outstanding.pop_front().expect("front exists");
                                self.ship(req, &mut next_id)?;
                            }
                        }
                        None => self.release_stray(&handle),
                    }
                }
                Delivery::RequestEnded(why) => {
                    log::trace!("pull request ended: {why}");
                    if let Some(req) = outstanding.pop_front() {
                        self.ship(req, &mut next_id)?;
                    }
                }
                Delivery::Idle => {}
                Delivery::Closed => break Err("broker subscription closed".to_string()),
            }
            // Requests whose answer never came (lost in a reconnect).
            let now = Instant::now();
            while outstanding.front().is_some_and(|r| r.deadline <= now) {
                let req = outstanding.pop_front().expect("front exists");
                self.ship(req, &mut next_id)?;
            }
        };
        // Ship what was collected: those messages were delivered to us and may as well be
        // written and acknowledged while the pipeline drains.
        for req in outstanding {
            self.ship(req, &mut next_id)?;
        }
        self.monitor.activity("stopped");
        result
    }

    /// Sends a finished request downstream, or returns its credit when it brought nothing.
    fn ship(&self, req: Request, next_id: &mut u64) -> Result<(), String> {
        if req.messages.is_empty() {
            let _ = self.credit_tx.send(());
            return Ok(());
        }
        let id = *next_id;
        *next_id += 1;
        let families = req
            .messages
            .iter()
            .map(|(m, _)| self.metrics.family_of(&m.subject))
            .collect::<Vec<_>>();
        for f in &families {
            self.metrics.add_family(*f, "messages_fetched_total", 1);
        }
        self.monitor.activity("handing batch to svc-normalize");
        // Registration first, on the channel the outcome will take: svc-ack always knows the
        // batch before its outcome arrives.
        self.ack_tx
            .send(AckMsg::Register {
                id,
                handles: req.handles,
                families,
            })
            .map_err(|_| "svc-ack stopped unexpectedly".to_string())?;
        self.raw_tx
            .send(RawBatch {
                id,
                messages: req.messages,
            })
            .map_err(|_| "svc-normalize stopped unexpectedly".to_string())
    }

    /// A delivery no request is waiting for: hand it straight back to the broker.
    fn release_stray(&self, handle: &AckHandle) {
        log::debug!(
            "delivery of stream sequence {} arrived after its pull request ended; released for redelivery",
            handle.stream_sequence
        );
        if broker::send_ack(&self.nc, handle, AckVerb::Nak(Duration::ZERO)).is_ok() {
            Metrics::add(&self.metrics.counters.messages_nacked_total, 1);
        }
    }
}
