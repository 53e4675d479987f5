//! `svc-fetch`: turns credits into pull requests and deliveries into batches.
//!
//! Pull requests and batches are decoupled. Each pull request asks for `batch_size` messages
//! and at most its byte allowance (`max_bytes`), and holds that many credits (see `credit.rs`)
//! until it is answered; each delivery then holds its own size until it is settled. The
//! allowance is the byte bound's share per batch, raised to fit the broker's largest message
//! where the bound allows. When the next message does not fit a whole allowance (the broker
//! ends such a request with a 409, the message untouched), one request for that message alone
//! follows, once everything held is settled: the largest message flows, alone, and the bound
//! holds for everything else. The broker serves
//! outstanding requests in order, so each delivery belongs to the oldest one. A request ends
//! when it is full, when the broker says it expired (408) or hit a limit (409), or when its
//! deadline passes without word (its answer was lost to a reconnect); its unused credits go
//! back to the pool.
//!
//! Deliveries collect in one batch, shipped when it holds `batch_size` messages, when its
//! oldest message has waited `max_batch_wait`, or when no request is outstanding. Under load
//! batches fill at once; under light load a message waits at most `max_batch_wait`, not a
//! pull request's whole expiry.
//!
//! A delivery that arrives with no request outstanding (late, after such a loss) holds no
//! credit: it is NAKed at once so the broker redelivers it promptly, never dropped silently.
//!
//! The consumer can change under us (deleted, or its filter changed by an operator): a
//! [`ConsumerWatch`] checks it now and then and after a refused pull request, pauses pull
//! requests while the consumer does not take them (no request/503 loop), and ends the run
//! with a clear error once the broker confirms the change (`broker/consumer_watch.rs`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::credit::{Credit, CreditPool};
use super::gap_hold::tell_abandoned;
use super::retried::Retried;
use super::{AckMsg, Monitor, RawBatch, ABANDONED, PIPELINED_PULL_REQUESTS};
use crate::broker::consumer_limits::ConsumerLimits;
use crate::broker::consumer_watch::ConsumerWatch;
use crate::broker::{self, AckHandle, AckVerb, Connection, Delivery};
use crate::message::envelope::{now_unix_nanos, RawMessage};
use crate::message::limits;
use crate::message::subject::{is_literal_subject, SubjectPattern};
use crate::metrics::Metrics;
use crate::sink::checkpoint::Feed;
use crate::text::peer::PeerText;

/// Longest single wait, so the stop flag and deadlines are checked often.
const POLL: Duration = Duration::from_millis(50);
/// Extra time after a pull request's expiry before we stop waiting for the broker's 408.
const EXPIRY_GRACE: Duration = Duration::from_secs(1);
/// At a clean stop, how long deliveries are still awaited after the flush that follows the
/// end of our pull requests (one the broker was writing as it read the `UNSUB`).
const LATE_DELIVERY_WAIT: Duration = Duration::from_millis(100);
/// How often the stream's incarnation is read again while deliveries pass (one
/// `STREAM.INFO` before the next delivery): with several runners on one consumer, the
/// longest a runner keeps the old incarnation after the stream was created again.
const INCARNATION_RECHECK: Duration = Duration::from_secs(1);
/// After a pull request's expiry as we count it, until the broker surely counts it expired
/// too (it started the clock a little later, when the request arrived).
const EXPIRY_MARGIN: Duration = Duration::from_millis(100);
/// The least time given to writing the stop's NAKs, even past the shutdown deadline.
pub const MIN_FINAL_FLUSH: Duration = Duration::from_millis(200);

pub struct Fetcher {
    pub nc: Connection,
    /// The configured subjects (`nats.subject` or `nats.subjects`): a delivery on any other
    /// subject stops the run.
    pub subjects: Vec<SubjectPattern>,
    pub sub: broker::PullSubscription,
    pub batch_size: usize,
    /// Messages per pull request ([`request_messages`]).
    pub request_messages: usize,
    pub expiry: Duration,
    pub max_batch_wait: Duration,
    pub credits: Arc<CreditPool>,
    /// Each pull request's byte allowance (`max_bytes`), see [`request_allowance`]; at most
    /// the pool's byte capacity.
    pub request_bytes: usize,
    /// Wakes `svc-flush` (capacity 1: kicks coalesce).
    pub flush_kick: Sender<()>,
    pub raw_tx: Sender<RawBatch>,
    pub ack_tx: Sender<AckMsg>,
    pub stop: Arc<AtomicBool>,
    /// When the stop was asked for (the signal): the shutdown deadline counts from there.
    pub stop_at: Arc<OnceLock<Instant>>,
    /// `delivery.shutdown_timeout_seconds`.
    pub shutdown_timeout: Duration,
    /// Permission violations the broker reported: the runner stops on the first.
    pub denials: Arc<broker::Denials>,
    pub metrics: Arc<Metrics>,
    pub monitor: Arc<Monitor>,
    /// Notices the consumer deleted or its filter changed under the running runner.
    pub watch: ConsumerWatch,
    /// The stream and its incarnation at bind (`broker/incarnation.rs`).
    pub stream: String,
    pub incarnation: Arc<str>,
    /// Advanced when a delivery shows the consumer created again: `svc-ack` settles no
    /// handle of an older generation ([`broker::AckGeneration`]).
    pub generation: Arc<broker::AckGeneration>,
    /// With custody checkpoints: where the gap of a delivery released here on the consumer's
    /// last delivery is told ([`Self::released`]).
    pub checkpoints: Option<Arc<Feed>>,
    /// The consumer's `max_deliver` as the broker last reported it (the watch keeps it).
    pub limits: Arc<ConsumerLimits>,
    /// With custody checkpoints: the deliveries released here before their last delivery,
    /// until delivered again; one is listed when `max_deliver` is lowered under it
    /// ([`Self::on_limit`]).
    pub released: RefCell<Retried>,
}

/// An outstanding pull request: how many deliveries it may still bring, and until when.
struct Request {
    remaining: usize,
    /// Byte credits the request still holds for deliveries to come.
    bytes_left: usize,
    delivered: usize,
    deadline: Instant,
}

impl Request {
    /// What the request holds that no delivery took: given back when it ends.
    fn unused(&self) -> Credit {
        Credit::new(self.remaining, self.bytes_left)
    }
}

/// Added to the broker's largest message in a request's allowance: the broker counts a
/// message's subject and headers as well as its payload.
const ALLOWANCE_SLACK: usize = 64 * 1024;

/// The byte allowance of each pull request: the bound's share per batch in flight, raised to
/// the broker's largest message (`max_payload`, and what the broker counts beside it) as far as
/// the bound allows, so that such a message normally needs no request of its own.
pub fn request_allowance(bound: usize, batches: usize, max_payload: usize) -> usize {
    let largest = max_payload.saturating_add(ALLOWANCE_SLACK);
    (bound / batches.max(1)).max(largest.min(bound))
}

/// What one held header costs beside its name and value bytes: the `(String, String)` pair
/// (48 bytes) and two heap blocks, each with glibc's 8-byte header and rounding to 16 bytes
/// (a block is at least 32 bytes). A one-byte header line costs the broker 5 bytes and the
/// runner about 112: charging name + value + 4, as before, let 3,000 messages of 8,000 such
/// lines hold 2.1 GiB under a 64 MiB bound.
const HEADER_PAIR_COST: usize = 48 + 2 * 32;

/// The most a delivery's headers may hold: the client refuses a block over svc's input limits
/// (as many lines and bytes as `message::limits` allows) before building anything, so at most
/// that many pairs at [`HEADER_PAIR_COST`] each, and the bytes.
const WORST_HEADERS_HELD: usize = limits::MAX_HEADERS * HEADER_PAIR_COST + limits::MAX_HEADER_BYTES;

/// Messages one pull request asks for: `batch_size`, but no more than its byte allowance
/// covers at the worst header cost. The broker counts wire bytes against `max_bytes`, while a
/// held one-byte header line costs about 112: two requests of 10,000 messages of 256 short
/// headers each held 580 MiB-1 GiB under a 160 MiB bound. With the defaults (a 20 MiB
/// allowance) this is 341, above the default `batch_size` of 256.
pub fn request_messages(batch_size: usize, request_bytes: usize) -> usize {
    batch_size.min((request_bytes / WORST_HEADERS_HELD).max(1))
}

/// The bytes a delivery holds while the runner has it: payload, subject and what its headers
/// really cost in memory (at least what the broker counts against a pull request's
/// `max_bytes`: a message over the client's header bound comes with no headers at all).
pub fn delivery_bytes(m: &RawMessage) -> usize {
    let headers: usize = m
        .headers
        .iter()
        .map(|(k, v)| k.len() + v.len() + HEADER_PAIR_COST)
        .sum();
    m.data.len() + m.subject.len() + headers
}

/// Deliveries collected for the next batch.
struct Collecting {
    messages: Vec<(RawMessage, i128)>,
    handles: Vec<AckHandle>,
    /// Byte credits the messages hold.
    bytes: usize,
    /// Arrival of the oldest message in the batch.
    since: Option<Instant>,
    /// Holds a delivery that may come from a consumer switched to `headers_only`
    /// ([`broker::maybe_headers_only`]): the consumer is checked before the batch ships.
    suspect: bool,
    /// The subject of a delivery outside the configured subjects: the consumer's filter was
    /// widened under the runner (or the broker lies); the run stops before the batch ships.
    foreign: Option<String>,
}

impl Collecting {
    fn new(capacity: usize) -> Collecting {
        Collecting {
            messages: Vec::with_capacity(capacity),
            handles: Vec::with_capacity(capacity),
            bytes: 0,
            since: None,
            suspect: false,
            foreign: None,
        }
    }
}

/// What svc-fetch keeps between events: its open pull requests, the batch it collects and
/// what decides the next request.
struct Pulls {
    /// Outstanding pull requests, oldest first (the broker serves them in order).
    outstanding: VecDeque<Request>,
    batch: Collecting,
    next_id: u64,
    /// Pull requests that failed in a row (disconnected): logged at the first and every 50th.
    request_failures: u32,
    names: broker::DeliveryNames,
    /// What this thread last told the monitor: it is told again only on a change, so the
    /// per-delivery path takes no lock for it.
    doing: &'static str,
    /// No pull request before this instant: the consumer did not take the last one.
    paused_until: Option<Instant>,
    /// The next message did not fit a whole allowance: it gets a request of its own.
    oversize: bool,
    /// When the stream's incarnation is read again before the next delivery passes on.
    incarnation_due: Instant,
    /// The last plain subject found to match a configured pattern (empty: none yet): a
    /// delivery on the same subject needs no pattern check (deliveries come in runs of one
    /// subject; the two checks cost more than the rest of taking the delivery).
    allowed_subject: String,
}

impl Fetcher {
    /// Runs until the stop flag is set (Ok), or the connection is closed for good or the
    /// consumer was deleted or changed under us (Err, the operator's message).
    pub fn run(mut self) -> Result<(), String> {
        let mut p = self.pulls();
        // One clock reading per delivery, shared by everything that needs the time.
        let mut now = Instant::now();
        let result = loop {
            if self.stop.load(Ordering::SeqCst) {
                break Ok(());
            }
            if let Err(e) = self.still_allowed(now) {
                break Err(e);
            }
            // Another runner on this consumer may have seen the consumer created again when
            // this one saw no sequence go back: read the incarnation again now and then.
            if now >= p.incarnation_due {
                p.names.note_restart();
                p.incarnation_due = now + INCARNATION_RECHECK;
            }
            // Keep the pipeline of pull requests full, each covered by its credits.
            if self.top_up(&mut p, now) {
                continue;
            }
            let wait = match p.batch.since {
                Some(since) => (since + self.max_batch_wait)
                    .saturating_duration_since(now)
                    .min(POLL),
                None => POLL,
            };
            self.note(&mut p.doing, "waiting for deliveries");
            let delivery = broker::next_delivery(&self.sub, wait, &mut p.names);
            now = Instant::now();
            if let Err(e) = self.on_delivery(&mut p, delivery, now) {
                break Err(e);
            }
            self.expire(&mut p, now);
            if let Err(e) = self.ship_if_due(&mut p, now) {
                break Err(e);
            }
        };
        self.on_end(p, result)
    }

    /// The state of a run that has sent nothing yet.
    fn pulls(&self) -> Pulls {
        Pulls {
            outstanding: VecDeque::new(),
            batch: Collecting::new(self.batch_size),
            next_id: 1,
            request_failures: 0,
            names: broker::DeliveryNames::new(
                Arc::clone(&self.incarnation),
                Arc::clone(&self.generation),
            ),
            doing: "",
            paused_until: None,
            oversize: false,
            incarnation_due: Instant::now() + INCARNATION_RECHECK,
            allowed_subject: String::new(),
        }
    }

    /// What the wait for a delivery brought; Err when the subscription is closed.
    fn on_delivery(
        &mut self,
        p: &mut Pulls,
        delivery: Delivery,
        now: Instant,
    ) -> Result<(), String> {
        match delivery {
            Delivery::Message {
                raw,
                handle,
                pending,
            } => {
                // Counted as fetched when its batch ships (one shared add per batch).
                self.monitor.mark_fetch(now);
                // Delivered again: svc-ack answers for it now.
                self.released.borrow_mut().settled(handle.stream_sequence);
                self.watch.delivered(pending);
                self.take(p, raw, handle, now);
            }
            Delivery::RequestEnded(end) => self.request_ended(p, &end, now),
            Delivery::Idle => {}
            Delivery::Closed => return Err("broker subscription closed".to_string()),
        }
        Ok(())
    }

    /// Requests whose answer never came (lost in a reconnect) give their credits back.
    fn expire(&self, p: &mut Pulls, now: Instant) {
        while p.outstanding.front().is_some_and(|r| r.deadline <= now) {
            let req = p.outstanding.pop_front().expect("front exists");
            self.credits.give(req.unused());
        }
    }

    /// Ships the batch when it is full, its oldest message has waited `max_batch_wait`, or
    /// no request is open to bring more.
    fn ship_if_due(&mut self, p: &mut Pulls, now: Instant) -> Result<(), String> {
        let due = p.batch.messages.len() >= self.batch_size
            || p.outstanding.is_empty()
            || p.batch
                .since
                .is_some_and(|s| now >= s + self.max_batch_wait);
        if due && !p.batch.messages.is_empty() {
            let full = std::mem::replace(&mut p.batch, Collecting::new(self.batch_size));
            self.ship_checked(full, &mut p.next_id)?;
            p.doing = "handing batch to svc-normalize";
        }
        Ok(())
    }

    /// The loop ended (`result`): ships what was collected, releases the open requests
    /// after a stop, and gives their credits back.
    fn on_end(&mut self, mut p: Pulls, result: Result<(), String>) -> Result<(), String> {
        // Ship what was collected: those messages were delivered to us and may as well be
        // written and acknowledged while the pipeline drains.
        if !p.batch.messages.is_empty() {
            let held = std::mem::replace(&mut p.batch, Collecting::new(0));
            self.ship_checked(held, &mut p.next_id)?;
        }
        if result.is_ok() {
            let stopped = *self.stop_at.get_or_init(Instant::now);
            // The final flush's least time stays inside the stop's budget.
            let until = stopped + self.shutdown_timeout.saturating_sub(MIN_FINAL_FLUSH);
            self.release_after_stop(&p.outstanding, &mut p.names, until);
        }
        // Credits of requests still outstanding are not needed any more.
        for req in p.outstanding {
            self.credits.give(req.unused());
        }
        self.monitor.activity("stopped");
        result
    }

    /// Err (the operator's message) when going on would only redeliver or lose sight of
    /// messages: something was denied (an ACK, the DLQ, an advisory subscription), the
    /// client's connection thread ended, or the consumer was deleted or changed.
    fn still_allowed(&mut self, now: Instant) -> Result<(), String> {
        if let Some(denied) = self.denials.first() {
            return Err(broker::permissions::runner_error(&denied));
        }
        if self.denials.client_ended() {
            return Err(
                "broker: the client's connection thread ended; it will not reconnect".to_string(),
            );
        }
        let checked = self.watch.check_if_due(now);
        self.on_limit();
        checked
    }

    /// Sends the next pull request when fewer than [`PIPELINED_PULL_REQUESTS`] are open, the
    /// consumer takes them and the credits allow (waiting a moment for credits when nothing
    /// is open or collected). True when the loop should come back here before waiting for a
    /// delivery: a request went out or failed, or there is nothing to wait for.
    fn top_up(&self, p: &mut Pulls, now: Instant) -> bool {
        let paused = p.paused_until.is_some_and(|t| now < t);
        if paused || p.outstanding.len() >= PIPELINED_PULL_REQUESTS {
            return false;
        }
        let idle = p.outstanding.is_empty() && p.batch.messages.is_empty();
        let wait = if idle {
            self.note(&mut p.doing, "waiting for free message credits");
            POLL
        } else {
            Duration::ZERO
        };
        // One message with no byte limit, once the whole byte pool is free; otherwise a
        // batch within the allowance.
        let (held, max_bytes) = if p.oversize {
            (Credit::new(1, self.credits.capacity().bytes), None)
        } else {
            let held = Credit::new(self.request_messages, self.request_bytes);
            (held, Some(self.request_bytes))
        };
        if !self.credits.take(held, wait) {
            return idle;
        }
        self.note(&mut p.doing, "sending pull request");
        match broker::request_batch(&self.sub, held.messages, max_bytes, self.expiry) {
            Ok(()) => {
                // Written at once by svc-flush, not after the client's 5 ms floor.
                let _ = self.flush_kick.try_send(());
                p.request_failures = 0;
                p.oversize = false;
                p.outstanding.push_back(Request {
                    remaining: held.messages,
                    bytes_left: held.bytes,
                    delivered: 0,
                    deadline: Instant::now() + self.expiry + EXPIRY_GRACE,
                });
            }
            Err(e) => {
                // Disconnected: the client reconnects on its own; retry calmly.
                self.credits.give(held);
                p.request_failures += 1;
                if p.request_failures == 1 || p.request_failures % 50 == 0 {
                    log::warn!("broker: pull request failed ({}x): {e}", p.request_failures);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        true
    }

    /// The broker ended the oldest request (expired, or a limit): its unused credits go back;
    /// a message over the whole allowance gets a request of its own next; a request the
    /// consumer refused pauses the next ones.
    fn request_ended(&mut self, p: &mut Pulls, end: &broker::RequestEnd, now: Instant) {
        log::trace!("pull request ended: {}", end.why);
        let ended = p.outstanding.pop_front();
        if let Some(req) = &ended {
            self.credits.give(req.unused());
        }
        // The broker says how much of the allowance was left (servers that do not say: the
        // request brought nothing). All of it: the next message is larger.
        let untouched = match (end.unused_bytes, &ended) {
            (Some(unused), _) => unused >= self.request_bytes,
            (None, Some(req)) => req.delivered == 0,
            (None, None) => false,
        };
        if broker::message_over_max_bytes(&end.why) && untouched && !p.oversize {
            p.oversize = true;
            log::info!(
                "broker: the next message is larger than a pull request's allowance of {} \
                 bytes: it is fetched alone once what is held is settled \
                 (delivery.max_in_flight_bytes)",
                self.request_bytes
            );
        }
        if let Some(pause) = self.watch.request_ended(&end.why, now) {
            p.paused_until = Some(now + pause);
        }
    }

    /// At a clean stop the pull requests still open keep delivering: each such message would
    /// wait a whole AckWait before any other runner got it (hundreds per rolling restart), and
    /// a NAK sent while they are open goes straight back into them (a sole runner once burnt
    /// 86-119 deliveries per message this way, past `max_deliver`). So: the broker first
    /// forgets our open requests ([`broker::forget_pull_requests`]); a flush then waits until
    /// everything it sent before that has arrived; each of those deliveries is handed back
    /// once (NAK, with the delay until those requests have expired, so the NAK cannot go
    /// back into them). All within the stop's one deadline.
    fn release_after_stop(
        &self,
        outstanding: &VecDeque<Request>,
        names: &mut broker::DeliveryNames,
        deadline: Instant,
    ) {
        if outstanding.is_empty() {
            return;
        }
        self.monitor
            .activity("releasing deliveries of open pull requests");
        if let Err(e) = broker::forget_pull_requests(&self.sub) {
            log::debug!("broker: could not end the open pull requests: {e}");
        }
        let left = |now: Instant| deadline.saturating_duration_since(now);
        // After the PONG, everything sent before the UNSUB is here; a delivery the broker
        // was writing just then gets a moment more.
        let _ = broker::flush(&self.nc, left(Instant::now()));
        let until = Instant::now() + LATE_DELIVERY_WAIT.min(left(Instant::now()));
        // The broker may keep our pull requests open until they expire whatever the UNSUB
        // (2.9.10 does): a NAK without delay went straight back into them, and each round
        // trip burnt a delivery (a message at `max_deliver` 2 was lost at a stop). So the
        // redelivery waits until the last of them has expired.
        let last_expiry = outstanding
            .iter()
            .map(|r| r.deadline - EXPIRY_GRACE + EXPIRY_MARGIN)
            .max();
        let delay = last_expiry.map_or(Duration::ZERO, |d| d.saturating_duration_since(until));
        let mut released = std::collections::HashSet::new();
        loop {
            let now = Instant::now();
            if now >= until {
                break;
            }
            match broker::next_delivery(&self.sub, until - now, names) {
                Delivery::Message { raw, handle, .. } => {
                    // Once per message, whatever arrives twice.
                    if !released.insert(handle.stream_sequence) {
                        continue;
                    }
                    if broker::send_ack(&self.nc, &handle, AckVerb::Nak(delay)).is_ok() {
                        Metrics::add(&self.metrics.counters.messages_nacked_total, 1);
                    }
                    self.released(&raw, &handle, "at the stop");
                }
                Delivery::RequestEnded(_) | Delivery::Idle => {}
                Delivery::Closed => break,
            }
        }
        if !released.is_empty() {
            // The NAKs go out before the process ends (a PING round trip: they are written).
            let _ = broker::flush(&self.nc, left(Instant::now()).max(MIN_FINAL_FLUSH));
            log::info!(
                "stop: {} messages delivered into still-open pull requests were released for \
                 redelivery in {:.1} s, once those requests have expired",
                released.len(),
                delay.as_secs_f64()
            );
        }
    }

    /// Reports `what` to the monitor when it differs from what was last reported.
    fn note(&self, doing: &mut &'static str, what: &'static str) {
        if *doing != what {
            self.monitor.activity(what);
            *doing = what;
        }
    }

    /// Sends a batch downstream as [`Self::ship`] does, but one holding a delivery that may
    /// come from a consumer switched to `headers_only` only once the consumer is checked
    /// (`broker/consumer_watch.rs`): changed, the run stops and the whole batch is released;
    /// not known, those deliveries are released and the rest ships.
    fn ship_checked(&mut self, mut batch: Collecting, next_id: &mut u64) -> Result<(), String> {
        if let Some(subject) = batch.foreign.take() {
            self.release_where(batch, |_, _| true);
            return Err(format!(
                "broker: consumer {} delivered a message on subject {}, outside the \
                 configured subjects: its filter was changed under the runner; nothing of that \
                 batch was stored",
                self.watch.name(),
                PeerText::new(&subject)
            ));
        }
        if batch.suspect {
            match self.watch.confirm_whole_messages() {
                // Only a redelivery received before the broker vouched for the consumer: a
                // first delivery may come from a switch undone before the answer.
                Ok(whole_at) => {
                    let vouched = |m: &RawMessage, received: i128| {
                        m.delivery_count >= 2 && whole_at.is_some_and(|t| received <= t)
                    };
                    batch = self.release_where(batch, |m, received| {
                        broker::maybe_headers_only(m) && !vouched(m, received)
                    });
                }
                Err(stop) => {
                    self.release_where(batch, |_, _| true);
                    return Err(stop);
                }
            }
        }
        if batch.messages.is_empty() {
            return Ok(());
        }
        self.ship(batch, next_id)
    }

    /// NAKs the deliveries of `batch` that `release` picks (redelivered once any of our
    /// pull requests open now has expired) and gives back their credits; the rest stays.
    fn release_where(
        &self,
        batch: Collecting,
        release: impl Fn(&RawMessage, i128) -> bool,
    ) -> Collecting {
        let mut kept = Collecting::new(batch.messages.len());
        kept.since = batch.since;
        let (mut count, mut bytes) = (0, 0);
        for (message, handle) in batch.messages.into_iter().zip(batch.handles) {
            if !release(&message.0, message.1) {
                kept.bytes += delivery_bytes(&message.0);
                kept.messages.push(message);
                kept.handles.push(handle);
                continue;
            }
            (count, bytes) = (count + 1, bytes + delivery_bytes(&message.0));
            let delay = AckVerb::Nak(self.expiry + EXPIRY_GRACE);
            if broker::send_ack(&self.nc, &handle, delay).is_ok() {
                Metrics::add(&self.metrics.counters.messages_nacked_total, 1);
            }
            self.released(&message.0, &handle, "its batch not shipped");
        }
        Metrics::add(&self.metrics.counters.messages_fetched_total, count as u64);
        self.credits.give(Credit::new(count, bytes));
        let _ = self.flush_kick.try_send(());
        kept
    }

    /// Sends a batch downstream: registration first, then the data.
    fn ship(&self, batch: Collecting, next_id: &mut u64) -> Result<(), String> {
        let id = *next_id;
        *next_id += 1;
        Metrics::add(
            &self.metrics.counters.messages_fetched_total,
            batch.messages.len() as u64,
        );
        let families = batch
            .messages
            .iter()
            .map(|(m, _)| self.metrics.family_of(&m.subject))
            .collect::<Vec<_>>();
        for f in &families {
            self.metrics
                .add_family(*f, crate::metrics::FamilyMetric::Fetched, 1);
        }
        self.monitor.activity("handing batch to svc-normalize");
        // Registration first, on the channel the outcome will take: svc-ack always knows the
        // batch before its outcome arrives.
        self.ack_tx
            .send(AckMsg::Register {
                id,
                origin: batch.messages.last().map_or_else(
                    || {
                        (
                            Arc::from(self.stream.as_str()),
                            Arc::clone(&self.incarnation),
                        )
                    },
                    |(m, _)| (Arc::clone(&m.stream), Arc::clone(&m.stream_incarnation)),
                ),
                handles: batch.handles,
                families: families.clone(),
                bytes: batch.bytes,
            })
            .map_err(|_| "svc-ack stopped unexpectedly".to_string())?;
        self.raw_tx
            .send(RawBatch {
                id,
                messages: batch.messages,
                families,
            })
            .map_err(|_| "svc-normalize stopped unexpectedly".to_string())
    }

    /// A delivery no request is waiting for: hand it straight back to the broker.
    /// One delivery into the batch, held against the oldest outstanding request.
    fn take(&self, p: &mut Pulls, mut raw: RawMessage, mut handle: AckHandle, now: Instant) {
        let Some(req) = p.outstanding.front_mut() else {
            return self.release_stray(&raw, &handle);
        };
        req.remaining -= 1;
        req.delivered += 1;
        let admitted = !p.names.take_restart() || self.restamp(&mut p.names, &mut raw, &mut handle);
        if admitted {
            let size = delivery_bytes(&raw);
            let from_allowance = size.min(req.bytes_left);
            req.bytes_left -= from_allowance;
            // Larger than what is left of the allowance: held all the same (it was
            // delivered), in debt until settled.
            self.credits.charge_bytes(size - from_allowance);
            p.batch.bytes += size;
            p.batch.suspect |= broker::maybe_headers_only(&raw);
            // A subject with a wildcard or empty token (the broker stores such a publish), or
            // one the client could not read, matches no pattern: `svc-normalize` refuses it
            // with its reason, whatever the filter; only a plain subject tells of a filter.
            let readable = raw.unreadable.is_none();
            let known = readable && !raw.subject.is_empty() && raw.subject == p.allowed_subject;
            if p.batch.foreign.is_none() && !known && readable && is_literal_subject(&raw.subject) {
                if self.subjects.iter().any(|s| s.matches(&raw.subject)) {
                    // Kept in one buffer: no allocation when the subject changes.
                    p.allowed_subject.clear();
                    p.allowed_subject.push_str(&raw.subject);
                } else {
                    p.batch.foreign = Some(raw.subject.clone());
                }
            }
            p.batch.since.get_or_insert(now);
            p.batch.messages.push((raw, now_unix_nanos()));
            p.batch.handles.push(handle);
        } else {
            self.release_stray(&raw, &handle);
        }
        if req.remaining == 0 {
            let done = p.outstanding.pop_front().expect("front exists");
            self.credits.give(done.unused());
        }
    }

    /// The first delivery of the bind, or the consumer was created again (its delivery
    /// sequence went back): reads the stream's incarnation again before this delivery goes on,
    /// so that a stream created again since never lends its sequences the old one's ids
    /// (`broker/incarnation.rs`). False when it could not be read: the delivery is released
    /// for redelivery and the next one asks again.
    fn restamp(
        &self,
        names: &mut broker::DeliveryNames,
        raw: &mut RawMessage,
        handle: &mut AckHandle,
    ) -> bool {
        match broker::incarnation::read(&self.nc, &self.stream) {
            Ok(now) => {
                if now != *names.incarnation() {
                    log::warn!(
                        "broker: stream {} was created again ({} -> {}); ids and keys of its \
                         messages carry the new incarnation",
                        self.stream,
                        names.incarnation(),
                        now
                    );
                    if let Some(generation) = names.set_incarnation(now) {
                        handle.generation = generation;
                    }
                }
                raw.stream_incarnation = Arc::clone(names.incarnation());
                true
            }
            Err(e) => {
                log::warn!(
                    "broker: stream {}'s incarnation could not be read again before a \
                     delivery ({}); the delivery is released and the next one asks again",
                    self.stream,
                    PeerText::new(&e.to_string())
                );
                names.note_restart();
                false
            }
        }
    }

    fn release_stray(&self, raw: &RawMessage, handle: &AckHandle) {
        Metrics::add(&self.metrics.counters.messages_fetched_total, 1);
        log::debug!(
            "delivery of stream sequence {} arrived after its pull request ended; released for redelivery",
            handle.stream_sequence
        );
        if broker::send_ack(&self.nc, handle, AckVerb::Nak(Duration::ZERO)).is_ok() {
            Metrics::add(&self.metrics.counters.messages_nacked_total, 1);
        }
        self.released(raw, handle, "a stray delivery");
    }

    /// A delivery released here on the consumer's last delivery (`max_deliver`) is one the
    /// broker delivers no more: with custody checkpoints its gap is told, as `svc-ack` tells
    /// one for a message it NAKs then (atk56 finding 1: a publisher's empty message with a
    /// `Nats-Msg-Size` header, released as a possible `headers_only` delivery on a consumer
    /// with `max_deliver` 1, was stored nowhere and listed nowhere).
    fn released(&self, raw: &RawMessage, handle: &AckHandle, why: &str) {
        let Some(feed) = &self.checkpoints else {
            return;
        };
        let origin = (Arc::clone(&raw.stream), Arc::clone(&raw.stream_incarnation));
        let last = self.limits.max_deliver();
        let Some(last) = last.filter(|l| handle.delivery_count >= *l) else {
            // Comes back, unless the limit is lowered under it meanwhile.
            let at = (origin, handle.stream_sequence);
            return self
                .released
                .borrow_mut()
                .nakked(&at, handle.delivery_count);
        };
        if tell_abandoned(feed, &self.metrics, origin, handle.stream_sequence) {
            log::warn!(
                "stream {} sequence {}: released by svc-fetch ({why}) on the consumer's last \
                 delivery ({last}, its max_deliver): the broker delivers it no more; the next \
                 custody checkpoint lists it as a gap ({ABANDONED})",
                PeerText::new(&raw.stream),
                handle.stream_sequence
            );
        }
    }

    /// With custody checkpoints: when the consumer's `max_deliver` was lowered (the watch
    /// read it), each delivery released here on a delivery at or past the new limit and not
    /// delivered since is one the broker delivers no more: listed as a gap ([`ABANDONED`];
    /// atk59, as `svc-ack` does for its own NAKs).
    fn on_limit(&self) {
        let Some(feed) = &self.checkpoints else {
            return;
        };
        let limit = self.limits.max_deliver();
        let lowered = self.released.borrow_mut().lowered(limit);
        for (origin, seq) in lowered {
            if tell_abandoned(feed, &self.metrics, origin.clone(), seq) {
                log::warn!(
                    "stream {} sequence {seq}: released by svc-fetch on a delivery at or past \
                     the consumer's max_deliver, lowered to {}: the broker delivers it no \
                     more; the next custody checkpoint lists it as a gap ({ABANDONED})",
                    PeerText::new(&origin.0),
                    limit.unwrap_or_default()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    #[test]
    fn a_request_asks_for_no_more_messages_than_its_allowance_holds_at_the_worst() {
        // The defaults: a 20 MiB allowance covers a batch of 256 at the worst header cost.
        assert_eq!(request_messages(256, 20 * MIB), 256);
        assert_eq!(request_messages(10_000, 20 * MIB), 341);
        assert_eq!(request_messages(10_000, MIB), 17);
        assert_eq!(request_messages(10_000, 1024), 1, "one message always");
    }

    #[test]
    fn the_allowance_fits_the_largest_message_where_the_bound_allows() {
        // The default: 64 MiB over 8 batches, the broker's default 1 MiB messages.
        assert_eq!(request_allowance(64 * MIB, 8, MIB), 8 * MIB);
        // 8 MiB messages: raised to fit one with what the broker counts beside it.
        assert_eq!(request_allowance(64 * MIB, 8, 8 * MIB), 8 * MIB + 64 * 1024);
        // A bound below the largest message: never more than the bound (such a message is
        // fetched alone).
        assert_eq!(request_allowance(MIB, 4, 4 * MIB), MIB);
    }

    #[test]
    fn a_delivery_holds_its_headers_as_well_as_its_payload() {
        let message = |headers: Vec<(String, String)>| RawMessage {
            stream_incarnation: Default::default(),
            subject: "orders.created".into(),
            stream: "S".into(),
            consumer: "c".into(),
            stream_sequence: 1,
            consumer_sequence: 1,
            delivery_count: 1,
            published_unix_nanos: None,
            headers,
            data: vec![b'x'; 100],
            unreadable: None,
            header_block: Default::default(),
        };
        assert_eq!(delivery_bytes(&message(vec![])), 100 + 14);
        // Many small headers (a shape that once swelled memory) count what they hold: the
        // pair and its two heap blocks, not only their bytes.
        let many = (0..1000)
            .map(|i| (format!("H{i:03}"), "v".repeat(20)))
            .collect::<Vec<_>>();
        assert_eq!(
            delivery_bytes(&message(many)),
            100 + 14 + 1000 * (4 + 20 + 112)
        );
    }
}
