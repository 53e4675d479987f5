//! Watching the bound consumer while the runner runs, so that a durable deleted, its filter
//! changed, or changed to deliver something else (`headers_only`, say: judged as at bind by
//! `consumer_shape.rs`) under running runners ends each run with a clear error, never with a
//! busy loop, silent idling or stored empty payloads. Pull requests the consumer refuses over
//! its request limits (`409 Exceeded Max...`) are logged at warn once and paced.
//!
//! What the broker tells a bound pull subscriber (nats-server 2.9.10, measured with
//! `tests/consumer_changes.rs`):
//! - the durable deleted: its waiting pull requests end with `409 Consumer Deleted`; every
//!   later pull request goes unanswered (the JetStream API takes it and drops it) and ends
//!   only by our own deadline. Before this watch `svc-fetch` kept asking, quietly, forever:
//!   the runner idled with nothing in its log above trace level.
//! - its filter changed: nothing at all. Pull requests keep working and deliver whatever the
//!   new filter selects, or nothing, forever.
//! - `503` (no responders) would say nobody serves the consumer; we have not seen it for pull
//!   requests but treat it like `409 Consumer Deleted`. Neither proves the consumer gone: a
//!   cluster may be moving the consumer to a new leader.
//!
//! So `svc-fetch` asks the broker for the consumer's info (`$JS.API.CONSUMER.INFO`) every
//! [`CHECK_INTERVAL`], and after a suspicious status at most every [`CONFIRM_INTERVAL`], and
//! pauses its pull requests after such a status with a growing delay (no busy loop). The run
//! stops only on [`STRIKES`] definite answers (consumer not found, or a filter other than
//! `nats.subject` / `nats.subjects`) with no good answer between them; a timeout or a cluster error proves
//! nothing and is retried. Each check is one request with a deadline of [`INFO_TIMEOUT`] for
//! request and reply together; a reply (already bounded by the connection's max payload)
//! larger than [`MAX_INFO_BYTES`] is not parsed, and peer text is bounded and escaped.
//!
//! A consumer deleted and recreated with the same name and filter before the next check is
//! simply used again: pull requests address the consumer by name.
//!
//! A good answer also carries the consumer's `max_ack_pending` and `max_deliver`, which an
//! operator may change on the running consumer without changing what it delivers: they are
//! handed to the shared [`ConsumerLimits`] (logged at info when they change), which
//! `svc-ack`'s checkpoint hold reads on each decision (atk54).
//!
//! A consumer switched to `headers_only` delivers every message with no payload and a
//! `Nats-Msg-Size` header, at once, while the checks above take 5-60 s and two strikes: 195
//! of 294 such records were stored and ACKed before the run stopped (1,664 with a 3,000
//! backlog). So a batch holding such a delivery ships only after one check made then
//! ([`ConsumerWatch::confirm_whole_messages`], one request per batch whatever it holds: a
//! publisher may send such messages, and must not be able to stop the runner or flood the
//! API with them): a changed consumer stops the run at the first answer, and an answer that
//! proves nothing releases those deliveries instead of storing them.
//!
//! Routine checks wait while the consumer has a large backlog, for at most
//! [`LONGEST_POSTPONEMENT`] since the last answer. nats-server 2.9.10 answers a consumer info
//! by recounting the consumer's pending messages, and when the consumer is in the first half
//! of the stream's last message block that count comes back without its last sequence
//! (`msgBlock.filteredPendingLocked`), which marks it stale: every later delivery then
//! recounts, scanning the block's messages before the consumer, until it passes the middle.
//! With 100,000 messages waiting, one routine check cost the broker 12-15 CPU-s and the run
//! a third of its rate (`cargo bench --bench file_capacity -- 100000 per_event`, broker
//! profile in docs/sinks/file.md). The scan is at most as long as the backlog, so with
//! [`LARGE_BACKLOG`] or fewer messages waiting (the count each delivery's ack subject
//! carries) checks run on time. Checks after a suspicious status never wait; a filter
//! changed while a large backlog drains is noticed within a minute instead of five seconds.

use std::time::{Duration, Instant};

use crate::backoff::{Backoff, Growth, Jitter};
use std::sync::Arc;

use crate::text::peer::PeerText;

use super::consumer_limits::{ConsumerLimits, Limits};
use super::Connection;

/// Time between routine checks of the consumer's info.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Time between checks while something looks wrong.
pub const CONFIRM_INTERVAL: Duration = Duration::from_secs(1);

/// Checks in a row for possibly headers-only deliveries that may prove nothing before the
/// runner stops.
pub const UNCONFIRMED_LIMIT: u64 = 3;
/// Consecutive definite answers that stop the run.
pub const STRIKES: u32 = 2;
/// Deadline of one consumer info request (request and reply).
pub const INFO_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest consumer info reply read; a real one is about 1 KiB.
pub const MAX_INFO_BYTES: usize = 64 * 1024;
/// Messages waiting above which routine checks wait (see the module comment).
pub const LARGE_BACKLOG: u64 = 1024;
/// Longest time without an answer from the consumer while routine checks wait.
pub const LONGEST_POSTPONEMENT: Duration = Duration::from_secs(60);

/// Pause before the next pull request after the consumer did not answer one.
const UNAVAILABLE_PAUSE: Backoff = Backoff {
    growth: Growth::Exponential,
    initial: Duration::from_millis(50),
    multiplier: 2.0,
    max: Duration::from_secs(1),
    jitter: Jitter::Equal,
};

/// Pause before the next pull request after the consumer refused one over its request limits.
const REFUSED_PAUSE: Backoff = Backoff {
    growth: Growth::Exponential,
    initial: Duration::from_millis(100),
    multiplier: 2.0,
    max: Duration::from_secs(5),
    jitter: Jitter::Equal,
};

/// True when the broker refused a pull request over one of the consumer's request limits:
/// `409 Exceeded MaxRequestBatch of N`, `MaxRequestExpires`, `MaxRequestMaxBytes`,
/// `409 Exceeded MaxWaiting`.
pub fn request_over_limit(status: &str) -> bool {
    let status = status.trim_start();
    status.starts_with("409") && status.to_ascii_lowercase().contains("exceeded max")
}

/// What one consumer info reply says.
#[derive(Debug, Clone, PartialEq)]
pub enum InfoAnswer {
    /// The consumer exists and filters the expected subject; its limits now.
    Fine(Limits),
    /// The broker says the consumer does not exist (JetStream error 10014).
    NotFound,
    /// The consumer exists with another filter subject (peer text, bounded and escaped).
    FilterChanged(String),
    /// The consumer now delivers something else (why, the broker's text escaped).
    Changed(String),
    /// Anything else (a cluster error, an unexpected reply): proves nothing.
    Inconclusive(String),
}

/// Watches one bound consumer on behalf of `svc-fetch`.
pub struct ConsumerWatch {
    nc: Connection,
    info_subject: String,
    /// `ORDERS/svc`, for messages.
    name: String,
    /// The consumer's limits, updated from each good answer.
    limits: Arc<ConsumerLimits>,
    /// The configured filter subjects (`nats.subject` or `nats.subjects`).
    expected: Vec<String>,
    next_check: Instant,
    /// When the last check was answered (or the watch began).
    last_answer: Instant,
    /// The consumer's messages still to deliver, as of the latest delivery.
    backlog: u64,
    /// Definite answers saying the consumer is gone or changed, since the last good one.
    strikes: u32,
    /// Consecutive pull requests the consumer did not answer.
    unanswered: u32,
    /// Consecutive pull requests refused over a request limit (`409 Exceeded Max...`).
    refused: u32,
    /// Whether such a refusal was logged (at warn, once per run).
    refusal_logged: bool,
    /// Checks in a row, asked for possibly headers-only deliveries, that proved nothing.
    unconfirmed: u64,
    /// No check for such deliveries before this (a publisher can send them on purpose: at
    /// most one consumer info request per [`CONFIRM_INTERVAL`] for all of them).
    next_confirm: Instant,
    /// When (Unix ns) the broker last said the consumer delivers whole messages.
    whole_at: Option<i128>,
}

impl ConsumerWatch {
    /// Watches `stream`/`consumer`, bound with `limits` (updated from each good answer)
    /// and expected to filter `expected`.
    pub fn new(
        nc: Connection,
        stream: &str,
        consumer: &str,
        limits: Arc<ConsumerLimits>,
        expected: &[String],
    ) -> Self {
        ConsumerWatch {
            nc,
            info_subject: format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"),
            name: format!("{stream}/{consumer}"),
            limits,
            expected: expected.to_vec(),
            next_check: Instant::now() + CHECK_INTERVAL,
            last_answer: Instant::now(),
            backlog: 0,
            strikes: 0,
            unanswered: 0,
            refused: 0,
            refusal_logged: false,
            unconfirmed: 0,
            next_confirm: Instant::now(),
            whole_at: None,
        }
    }

    /// `stream/consumer`, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A pull request ended with `status` (e.g. `408 Request Timeout`, `503`). Returns how
    /// long to wait before the next pull request when the status says the consumer did not
    /// take the request; a check is then due soon.
    pub fn request_ended(&mut self, status: &str, now: Instant) -> Option<Duration> {
        if request_over_limit(status) {
            // The consumer's request limits were lowered under the running runner (they are
            // checked at start): without a pause this is thousands of refusals a second.
            self.refused = self.refused.saturating_add(1);
            if !self.refusal_logged {
                self.refusal_logged = true;
                log::warn!(
                    "broker: consumer {} refused a pull request ({}): its request limits are \
                     below this runner's requests; retrying with a growing pause (restart \
                     the runner to have its limits checked)",
                    self.name,
                    PeerText::new(status)
                );
            }
            return Some(REFUSED_PAUSE.delay(self.refused));
        }
        self.refused = 0;
        if !consumer_unavailable(status) {
            // The consumer answered (an expiry, a limit): it is there.
            self.unanswered = 0;
            return None;
        }
        self.unanswered = self.unanswered.saturating_add(1);
        log::debug!(
            "broker: consumer {} did not take a pull request ({}), {} in a row",
            self.name,
            PeerText::new(status),
            self.unanswered
        );
        if self.unanswered == 1 {
            log::warn!(
                "broker: consumer {} did not take a pull request ({}): a consumer leader \
                 election, or the consumer was deleted; checking",
                self.name,
                PeerText::new(status)
            );
        }
        self.next_check = self
            .next_check
            .min(now + CONFIRM_INTERVAL.min(INFO_TIMEOUT));
        Some(UNAVAILABLE_PAUSE.delay(self.unanswered))
    }

    /// A delivery arrived: the consumer works, with `pending` messages still to deliver.
    pub fn delivered(&mut self, pending: u64) {
        self.backlog = pending;
        if self.unanswered > 0 {
            log::info!("broker: consumer {} delivers again", self.name);
            self.unanswered = 0;
        }
    }

    /// Checks the consumer when a check is due. `Err` is the operator's message: the run
    /// must stop.
    pub fn check_if_due(&mut self, now: Instant) -> Result<(), String> {
        if now < self.next_check {
            return Ok(());
        }
        let routine = self.strikes == 0 && self.unanswered == 0;
        if routine
            && postpone_routine_check(
                self.backlog,
                now.saturating_duration_since(self.last_answer),
            )
        {
            self.next_check = now + CHECK_INTERVAL;
            return Ok(());
        }
        let answer = self.ask();
        let now = Instant::now();
        match answer {
            InfoAnswer::Fine(_) => {
                if self.strikes > 0 {
                    log::info!("broker: consumer {} is back as configured", self.name);
                }
                self.strikes = 0;
                self.next_check = now + CHECK_INTERVAL;
                Ok(())
            }
            InfoAnswer::Inconclusive(why) => {
                log::debug!("broker: consumer {} check inconclusive: {why}", self.name);
                self.next_check = now
                    + if self.unanswered > 0 || self.strikes > 0 {
                        CONFIRM_INTERVAL
                    } else {
                        CHECK_INTERVAL
                    };
                Ok(())
            }
            definite => {
                self.strikes += 1;
                self.next_check = now + CONFIRM_INTERVAL;
                if self.strikes < STRIKES {
                    return Ok(());
                }
                Err(self.stop_error(definite))
            }
        }
    }

    /// For deliveries that may come from a consumer switched to `headers_only`
    /// ([`super::maybe_headers_only`]): asks the broker, at most once per
    /// [`CONFIRM_INTERVAL`], whether the consumer delivers whole messages. Ok(Some(t)): it said
    /// so at `t` (Unix ns); a delivery received before `t`, and delivered before (so not the
    /// first delivery under a switch that was undone at once), is a publisher's. Ok(None): no
    /// answer vouches for any. Err (the operator's message): the consumer now delivers
    /// something else, or [`UNCONFIRMED_LIMIT`] checks in a row proved nothing (an oversized
    /// or missing answer: the runner stops rather than store on trust or burn deliveries
    /// releasing them).
    pub fn confirm_whole_messages(&mut self) -> Result<Option<i128>, String> {
        let now = Instant::now();
        if now < self.next_confirm {
            return Ok(self.whole_at);
        }
        self.next_confirm = now + CONFIRM_INTERVAL;
        let answer = self.ask();
        match answer {
            InfoAnswer::Fine(_) => {
                self.unconfirmed = 0;
                self.whole_at = Some(crate::message::envelope::now_unix_nanos());
            }
            InfoAnswer::FilterChanged(_) | InfoAnswer::Changed(_) => {
                return Err(self.stop_error(answer))
            }
            InfoAnswer::NotFound | InfoAnswer::Inconclusive(_) => {
                let why = match answer {
                    InfoAnswer::Inconclusive(why) => why,
                    _ => "consumer not found".to_string(),
                };
                self.unconfirmed += 1;
                if self.unconfirmed >= UNCONFIRMED_LIMIT {
                    return Err(format!(
                        "broker: consumer {} could not be checked {} times in a row ({why}) \
                         while deliveries with no payload and a Nats-Msg-Size header (as a \
                         consumer switched to headers_only sends) came; stopping rather than \
                         store them on trust",
                        self.name, self.unconfirmed
                    ));
                }
                log::warn!(
                    "broker: deliveries with no payload and a Nats-Msg-Size header came while \
                     consumer {} could not be checked ({why}); released for redelivery, not \
                     stored ({}x)",
                    self.name,
                    self.unconfirmed
                );
                self.next_check = self.next_check.min(now + CONFIRM_INTERVAL);
            }
        }
        Ok(self.whole_at)
    }

    /// One consumer info request, its answer classified; a good one's limits taken.
    fn ask(&mut self) -> InfoAnswer {
        let answer = match self
            .nc
            .request_timeout(&self.info_subject, b"", INFO_TIMEOUT)
        {
            Ok(reply) if reply.data.len() > MAX_INFO_BYTES => InfoAnswer::Inconclusive(format!(
                "reply of {} bytes exceeds {MAX_INFO_BYTES}",
                reply.data.len()
            )),
            Ok(reply) if reply.data.is_empty() => {
                // A status only, e.g. 503: JetStream itself is not answering.
                InfoAnswer::Inconclusive("no JetStream answer".into())
            }
            Ok(reply) => classify_info(&reply.data, &self.expected),
            Err(e) => InfoAnswer::Inconclusive(e.to_string()),
        };
        if !matches!(answer, InfoAnswer::Inconclusive(_)) {
            self.last_answer = Instant::now();
        }
        if let InfoAnswer::Fine(limits) = answer {
            self.limits.update(&self.name, limits);
        }
        answer
    }

    /// The operator's message for a definite answer that stops the run.
    fn stop_error(&self, definite: InfoAnswer) -> String {
        match definite {
            InfoAnswer::FilterChanged(filter) => format!(
                "broker: consumer {} now filters subject \"{filter}\" but {} \
                 \"{}\"; stopping: they must be equal (change one of them, then \
                 start the runner again)",
                self.name,
                match self.expected.len() {
                    1 => "nats.subject is",
                    _ => "nats.subjects are",
                },
                self.expected.join(", ")
            ),
            InfoAnswer::Changed(why) => format!(
                "broker: consumer {} changed while this runner was bound: it {why}; \
                 stopping (change it back, then start the runner again)",
                self.name
            ),
            _ => format!(
                "broker: consumer {} was deleted while this runner was bound (the \
                 broker answers \"consumer not found\"); stopping: recreate it (or set \
                 nats.consumer_mode to \"create\") and start the runner again",
                self.name
            ),
        }
    }
}

/// Whether a routine check due now waits: the consumer has more than [`LARGE_BACKLOG`]
/// messages waiting and answered less than [`LONGEST_POSTPONEMENT`] ago.
fn postpone_routine_check(backlog: u64, since_last_answer: Duration) -> bool {
    backlog > LARGE_BACKLOG && since_last_answer < LONGEST_POSTPONEMENT
}

/// True when a pull request's end status says the consumer did not take it: `503` (no
/// responders: no consumer, or no consumer leader yet) or `409 Consumer Deleted`.
pub fn consumer_unavailable(status: &str) -> bool {
    let status = status.trim_start();
    status.starts_with("503")
        || (status.starts_with("409") && status.to_ascii_lowercase().contains("consumer deleted"))
}

/// Reads a `$JS.API.CONSUMER.INFO` reply.
pub fn classify_info(data: &[u8], expected: &[String]) -> InfoAnswer {
    let v: serde_json::Value = match serde_json::from_slice(data) {
        Ok(v) => v,
        Err(e) => return InfoAnswer::Inconclusive(format!("reply is not JSON: {e}")),
    };
    if let Some(error) = v.get("error") {
        let code = error.get("err_code").and_then(|c| c.as_u64());
        let description = error
            .get("description")
            .and_then(|d| d.as_str())
            .unwrap_or_default();
        return if code == Some(10014) {
            InfoAnswer::NotFound
        } else {
            InfoAnswer::Inconclusive(format!(
                "error {}: {}",
                code.map_or_else(|| "?".to_string(), |c| c.to_string()),
                PeerText::new(description)
            ))
        };
    }
    let Some(config) = v.get("config") else {
        return InfoAnswer::Inconclusive("reply has neither config nor error".into());
    };
    if let Some(filter) = super::consumer_shape::filter_differs(config, expected) {
        return InfoAnswer::FilterChanged(PeerText::new(&filter).to_string());
    }
    // Any other change of what is delivered (headers only, say: the broker takes that as an
    // update of a running consumer) is judged as at bind.
    match super::consumer_shape::check_bindable(config, expected) {
        Ok(()) => InfoAnswer::Fine(Limits::of(config)),
        Err(why) => InfoAnswer::Changed(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routine_checks_wait_only_for_a_large_backlog_and_only_so_long() {
        let soon = CHECK_INTERVAL;
        assert!(!postpone_routine_check(0, soon));
        assert!(!postpone_routine_check(LARGE_BACKLOG, soon));
        assert!(postpone_routine_check(LARGE_BACKLOG + 1, soon));
        assert!(postpone_routine_check(
            u64::MAX,
            LONGEST_POSTPONEMENT - soon
        ));
        assert!(!postpone_routine_check(u64::MAX, LONGEST_POSTPONEMENT));
    }

    #[test]
    fn statuses_that_mean_the_consumer_did_not_take_the_request() {
        for s in ["503", "503 No Responders", "409 Consumer Deleted"] {
            assert!(consumer_unavailable(s), "{s}");
        }
        for s in [
            "408 Request Timeout",
            "409 Exceeded MaxWaiting",
            "409 Leadership Change",
            "next_timeout: Pull Request timed out",
            "",
        ] {
            assert!(!consumer_unavailable(s), "{s}");
        }
    }

    #[test]
    fn refusals_over_request_limits_are_recognized() {
        for s in [
            "409 Exceeded MaxRequestBatch of 4",
            "409 Exceeded MaxRequestExpires of 100ms",
            "409 Exceeded MaxRequestMaxBytes of 1000",
            "409 Exceeded MaxWaiting",
        ] {
            assert!(request_over_limit(s), "{s}");
        }
        for s in [
            "409 Message Size Exceeds MaxBytes",
            "408 Request Timeout",
            "503",
        ] {
            assert!(!request_over_limit(s), "{s}");
        }
    }

    fn one(subject: &str) -> Vec<String> {
        vec![subject.to_string()]
    }

    /// Several filter subjects: the same set in any order is fine; a set the broker changed
    /// (one more, one less, or a single filter) stops the run.
    #[test]
    fn several_filter_subjects_are_compared_as_a_set() {
        let wanted = vec!["orders.a".to_string(), "orders.b".to_string()];
        let reply = |filters: &str| {
            format!(r#"{{"config":{{"durable_name":"svc","ack_policy":"explicit",{filters}}}}}"#)
        };
        let fine = reply(r#""filter_subjects":["orders.b","orders.a"]"#);
        assert_eq!(
            classify_info(fine.as_bytes(), &wanted),
            InfoAnswer::Fine(Limits::default())
        );
        for (filters, shown) in [
            (
                r#""filter_subjects":["orders.a","orders.b","orders.c"]"#,
                "orders.a, orders.b, orders.c",
            ),
            (r#""filter_subjects":["orders.a"]"#, "orders.a"),
            (r#""filter_subject":"orders.>""#, "orders.>"),
            (r#""filter_subject":"""#, ""),
            (
                r#""filter_subject":"orders.a","filter_subjects":["orders.b"]"#,
                "orders.a, orders.b",
            ),
        ] {
            assert_eq!(
                classify_info(reply(filters).as_bytes(), &wanted),
                InfoAnswer::FilterChanged(shown.into()),
                "{filters}"
            );
        }
    }

    #[test]
    fn info_replies_are_classified() {
        let fine = br#"{"type":"io.nats.jetstream.api.v1.consumer_info_response","stream_name":"ORDERS","name":"svc","config":{"durable_name":"svc","ack_policy":"explicit","filter_subject":"orders.>"}}"#;
        assert_eq!(
            classify_info(fine, &one("orders.>")),
            InfoAnswer::Fine(Limits::default())
        );
        // Switched to headers only under the runner: judged as at bind.
        let headers_only = br#"{"config":{"durable_name":"svc","ack_policy":"explicit","filter_subject":"orders.>","headers_only":true}}"#;
        assert!(matches!(
            classify_info(headers_only, &one("orders.>")),
            InfoAnswer::Changed(why) if why.contains("headers_only")
        ));
        assert_eq!(
            classify_info(fine, &one("payments.>")),
            InfoAnswer::FilterChanged("orders.>".into())
        );
        let gone = br#"{"type":"io.nats.jetstream.api.v1.consumer_info_response","error":{"code":404,"err_code":10014,"description":"consumer not found"}}"#;
        assert_eq!(classify_info(gone, &one("orders.>")), InfoAnswer::NotFound);
        let cluster = br#"{"error":{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable"}}"#;
        assert!(matches!(
            classify_info(cluster, &one("orders.>")),
            InfoAnswer::Inconclusive(m) if m.contains("10008")
        ));
        assert!(matches!(
            classify_info(b"<html>", &one("orders.>")),
            InfoAnswer::Inconclusive(_)
        ));
        assert!(matches!(
            classify_info(b"{}", &one("orders.>")),
            InfoAnswer::Inconclusive(_)
        ));
        // A hostile filter is bounded and escaped before it reaches a message.
        let hostile = format!(
            r#"{{"config":{{"filter_subject":"x\u001b[31m{}"}}}}"#,
            "y".repeat(5000)
        );
        match classify_info(hostile.as_bytes(), &one("orders.>")) {
            InfoAnswer::FilterChanged(f) => {
                assert!(f.chars().count() < 400, "{}", f.len());
                assert!(!f.contains('\u{1b}'));
            }
            other => panic!("{other:?}"),
        }
    }

    /// A good answer carries the consumer's limits as they are now, read as at bind
    /// (positive values, else none), and they reach whoever shares them (atk54: the hold).
    #[test]
    fn a_good_answer_carries_the_consumers_limits_to_those_sharing_them() {
        let reply = |limits: &str| {
            format!(
                r#"{{"config":{{"durable_name":"svc","ack_policy":"explicit",
                "filter_subject":"orders.>"{limits}}}}}"#
            )
        };
        let lowered = reply(r#","max_ack_pending":16,"max_deliver":2"#);
        let InfoAnswer::Fine(limits) = classify_info(lowered.as_bytes(), &one("orders.>")) else {
            panic!("not fine")
        };
        assert_eq!(
            limits,
            Limits {
                max_ack_pending: Some(16),
                max_deliver: Some(2)
            }
        );
        for none in [
            r#","max_ack_pending":-1,"max_deliver":-1"#,
            r#","max_ack_pending":0,"max_deliver":0"#,
            r#","max_ack_pending":"16","max_deliver":true"#,
            "",
        ] {
            assert_eq!(
                classify_info(reply(none).as_bytes(), &one("orders.>")),
                InfoAnswer::Fine(Limits::default()),
                "{none}"
            );
        }
        let at_bind = Limits {
            max_ack_pending: Some(1000),
            max_deliver: None,
        };
        let shared = Arc::new(ConsumerLimits::new(at_bind));
        let hold_side = Arc::clone(&shared);
        assert!(shared.update("ORDERS/svc", limits));
        let seen = std::thread::spawn(move || hold_side.current())
            .join()
            .unwrap();
        assert_eq!(seen, limits);
    }

    #[test]
    fn pauses_grow_and_stay_bounded() {
        let mut last = Duration::ZERO;
        for attempt in 1..20 {
            let d = UNAVAILABLE_PAUSE.delay(attempt);
            assert!(d <= Duration::from_secs(1));
            assert!(d >= Duration::from_millis(25));
            last = last.max(d);
        }
        assert!(last >= Duration::from_millis(500));
    }
}
