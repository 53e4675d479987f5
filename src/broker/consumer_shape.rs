//! What an existing durable consumer must be for this runner, judged from the consumer's
//! config as the broker itself reports it (the JSON of `$JS.API.CONSUMER.INFO`), not from the
//! crate's typed `ConsumerConfig`: that struct lacks fields current servers have
//! (`max_bytes`, `metadata`, `mem_storage`, `filter_subjects`, priority groups, ...), so
//! judging or sending it back saw and kept only part of the consumer.
//!
//! Every field the broker reports is reviewed by name ([`review`]): a field that changes what
//! is delivered refuses the consumer (at bind, in `stream-plan --apply`, and when the consumer
//! watch sees it change under a running runner); the others are named with the reason they
//! are harmless; a field this code does not know refuses the consumer when it is set to
//! anything but its empty value, since nobody here has judged what it does.

use std::io;
use std::time::Duration;

use serde_json::{Map, Value};

use super::config::StartPosition;
use super::Connection;
use crate::text::peer::PeerText;
use crate::text::rfc3339::{format_rfc3339_nanos, parse_rfc3339_nanos};

/// Deadline of one JetStream API request (request and reply), as the crate's own.
pub const API_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest API reply read; a consumer's info is about 1 KiB.
pub const MAX_REPLY_BYTES: usize = 64 * 1024;

/// The fields that do not change what a pull consumer with explicit acks on the configured
/// subject delivers, each with the reason.
const HARMLESS: &[(&str, &str)] = &[
    (
        "durable_name",
        "the consumer's name, which the runner looked it up by",
    ),
    (
        "name",
        "the consumer's name, which the runner looked it up by",
    ),
    ("description", "text for people"),
    ("metadata", "labels for people and tools"),
    (
        "deliver_policy",
        "where the consumer began in the stream, used once when it was created; an existing \
         consumer keeps its position (`svc run` logs and `--apply` reports a start other than \
         nats.deliver_policy)",
    ),
    (
        "opt_start_seq",
        "a starting point of deliver_policy, used once at creation",
    ),
    (
        "opt_start_time",
        "a starting point of deliver_policy, used once at creation",
    ),
    (
        "ack_wait",
        "when an unacknowledged message is redelivered: owned by reconcile, reported by --apply",
    ),
    (
        "max_deliver",
        "how often a message is delivered: owned by reconcile, reported by --apply; the \
         dead-letter queue and advisories account for messages at the limit",
    ),
    (
        "backoff",
        "redelivery delays: owned by reconcile, reported by --apply",
    ),
    (
        "max_ack_pending",
        "how many deliveries may wait for their ACK: owned by reconcile, read at bind",
    ),
    (
        "replay_policy",
        "`original` paces deliveries at the publish rate: the same messages, later",
    ),
    (
        "rate_limit_bps",
        "push consumers only: the broker refuses it on a pull consumer (10086)",
    ),
    (
        "flow_control",
        "push consumers only: the broker refuses it on a pull consumer (10089)",
    ),
    (
        "idle_heartbeat",
        "push consumers only: the broker refuses it on a pull consumer (10088)",
    ),
    (
        "deliver_group",
        "push consumers only (a push consumer is refused by deliver_subject)",
    ),
    (
        "sample_freq",
        "the share of acknowledgements the broker reports as advisories: metrics only",
    ),
    (
        "inactive_threshold",
        "the broker deletes a consumer idle that long: the consumer watch stops the run with \
         a clear error; its messages stay in the stream",
    ),
    (
        "num_replicas",
        "where the broker keeps the consumer's state; losing it redelivers, which sinks absorb",
    ),
    (
        "mem_storage",
        "the consumer's state in memory: a broker restart redelivers, which sinks absorb",
    ),
    (
        "direct",
        "set by the broker on its own mirror and source consumers; no effect on deliveries",
    ),
    (
        "pause_until",
        "the broker delivers nothing until then: the same messages, later",
    ),
    (
        "priority_timeout",
        "only with priority groups, which are refused",
    ),
    (
        "max_batch",
        "a pull request limit, checked against delivery.batch_size at start",
    ),
    (
        "max_expires",
        "a pull request limit, checked against delivery.fetch_expiry_ms at start",
    ),
    (
        "max_bytes",
        "a pull request limit, checked against each request's byte allowance at start",
    ),
    (
        "max_waiting",
        "a limit of open pull requests, checked against the runner's at start",
    ),
];

/// The consumer's config as the broker reports it (`$JS.API.CONSUMER.INFO`'s `config`).
/// A missing consumer is `ErrorKind::NotFound`.
pub fn consumer_config(nc: &Connection, stream: &str, consumer: &str) -> io::Result<Value> {
    consumer_info(nc, stream, consumer).map(|(config, _)| config)
}

/// The consumer's config and the rest of its info (`$JS.API.CONSUMER.INFO`: its state, e.g.
/// `ack_floor`, `delivered`, `num_ack_pending`). A missing consumer is `ErrorKind::NotFound`.
pub fn consumer_info(nc: &Connection, stream: &str, consumer: &str) -> io::Result<(Value, Value)> {
    let reply = api_request(
        nc,
        &format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"),
        b"",
    )?;
    match reply {
        Value::Object(mut m) => {
            let config = m
                .remove("config")
                .filter(Value::is_object)
                .ok_or_else(|| io::Error::other("consumer info reply has no config"))?;
            Ok((config, Value::Object(m)))
        }
        _ => Err(io::Error::other("consumer info reply is not an object")),
    }
}

/// Creates or updates a durable consumer with exactly `config` (the broker's own JSON, with
/// whatever the caller changed), answering the broker's error as an `io::Error`.
pub fn put_consumer(nc: &Connection, stream: &str, config: &Value) -> io::Result<()> {
    let name = config
        .get("durable_name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let body = serde_json::json!({"stream_name": stream, "config": config});
    api_request(
        nc,
        &format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}"),
        &serde_json::to_vec(&body)?,
    )
    .map(|_| ())
}

/// One JetStream API request; the broker's `error` becomes an `io::Error` (10014 and 10059,
/// consumer or stream not found: `NotFound`) whose text is the broker's (at most 64 KiB; shown
/// bounded and escaped by [`super::BrokerError`]).
pub fn api_request(nc: &Connection, subject: &str, body: &[u8]) -> io::Result<Value> {
    api_request_within(nc, subject, body, MAX_REPLY_BYTES)
}

/// [`api_request`] with a reply of at most `max_bytes` read.
pub fn api_request_within(
    nc: &Connection,
    subject: &str,
    body: &[u8],
    max_bytes: usize,
) -> io::Result<Value> {
    let reply = nc.request_timeout(subject, body, API_TIMEOUT)?;
    api_reply(&reply, max_bytes)
}

/// [`api_request_within`] sent at once ([`flushed_request`]) and answered within `timeout`.
pub fn api_request_flushed(
    nc: &Connection,
    subject: &str,
    body: &[u8],
    max_bytes: usize,
    timeout: Duration,
) -> io::Result<Value> {
    api_reply(&flushed_request(nc, subject, body, timeout)?, max_bytes)
}

/// One request written to the socket at once (the client's background flusher waits up to
/// 5 ms between writes, which caps one-at-a-time requests near 200/s) and its reply, all
/// within `timeout`; no responders is `NotFound`.
pub fn flushed_request(
    nc: &Connection,
    subject: &str,
    body: &[u8],
    timeout: Duration,
) -> io::Result<nats::Message> {
    let deadline = std::time::Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(std::time::Instant::now());
    let inbox = nc.new_inbox();
    let sub = nc.subscribe(&inbox)?;
    nc.publish_with_reply_or_headers(subject, Some(&inbox), None, body)?;
    nc.flush_timeout(left())?;
    let reply = sub.next_timeout(left());
    let _ = sub.unsubscribe();
    let reply = reply?;
    if reply.is_no_responders() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no responders: JetStream does not answer on this subject",
        ));
    }
    Ok(reply)
}

/// A JetStream API reply read: at most `max_bytes`, JSON, its `error` an `io::Error`.
fn api_reply(reply: &nats::Message, max_bytes: usize) -> io::Result<Value> {
    if reply.data.len() > max_bytes {
        return Err(io::Error::other(format!(
            "reply of {} bytes exceeds {max_bytes}",
            reply.data.len()
        )));
    }
    if reply.data.is_empty() {
        return Err(io::Error::other("no JetStream answer (a status only)"));
    }
    let v: Value = serde_json::from_slice(&reply.data)
        .map_err(|e| io::Error::other(format!("reply is not JSON: {e}")))?;
    api_error(&v).map_or(Ok(v), Err)
}

/// The `error` of an API reply, if any.
fn api_error(v: &Value) -> Option<io::Error> {
    let error = v.get("error")?;
    let code = error.get("err_code").and_then(Value::as_u64);
    let description = error
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = match code {
        Some(10014 | 10059) => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    let code = code.map_or_else(|| "?".to_string(), |c| c.to_string());
    Some(io::Error::new(
        kind,
        // Raw here: every caller wraps it in a BrokerError, whose Display bounds and escapes
        // it once (escaping here too showed `\\r` for `\r`).
        format!("{description} (error {code})"),
    ))
}

/// Why an existing consumer cannot serve this runner, judged field by field from the broker's
/// JSON: not a pull consumer, not explicit acks, another filter, headers only, priority groups,
/// or a field nobody here has judged set to a value. `Ok`: every field is one this runner
/// checked or one of [`HARMLESS`].
pub fn check_bindable(config: &Value, subjects: &[String]) -> Result<(), String> {
    let Some(fields) = config.as_object() else {
        return Err("the broker's consumer config is not an object".into());
    };
    let problems = review(fields, subjects);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Every problem of `fields`, in the broker's order; the broker's text is escaped.
fn review(fields: &Map<String, Value>, subjects: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    if !fields.get("ack_policy").is_some_and(|p| p == "explicit") {
        problems.push("must use explicit acknowledgement".to_string());
    }
    if let Some(why) = filter_problem(fields, subjects) {
        problems.push(why);
    }
    for (name, value) in fields {
        let set = !is_empty(value);
        match name.as_str() {
            "ack_policy" | "filter_subject" | "filter_subjects" => {}
            "deliver_subject" if set => {
                problems.push("is a push consumer; a pull consumer is required".into())
            }
            "headers_only" if set => problems.push(
                "delivers headers only (headers_only): the runner would store empty payloads; \
                 a consumer that delivers whole messages is required"
                    .into(),
            ),
            "priority_groups" if set => problems.push(
                "has priority groups (priority_groups): the broker refuses pull requests that \
                 name no group, and the runner names none"
                    .into(),
            ),
            "priority_policy" => {
                if set && value != "none" {
                    problems.push(format!(
                        "has priority policy \"{}\": the runner's pull requests name no group",
                        PeerText::new(value.as_str().unwrap_or("?"))
                    ))
                }
            }
            n if HARMLESS.iter().any(|(h, _)| *h == n) => {}
            _ if !set => {}
            n => problems.push(format!(
                "sets {} = {}, a consumer setting this svc does not know: it may change what \
                 is delivered",
                PeerText::new(n),
                PeerText::with_limit(&value.to_string(), 80)
            )),
        }
    }
    problems
}

/// The filter must be exactly the configured subjects: `filter_subject`, or (nats-server 2.10
/// and later) a `filter_subjects` list of the same subjects in any order. A consumer that
/// reports both (no server accepts that) is another filter.
fn filter_problem(fields: &Map<String, Value>, subjects: &[String]) -> Option<String> {
    let reported = reported_filters(fields)?;
    // Both fields, saying different things: which one the broker applies is unknown.
    let single = fields.get("filter_subject").and_then(Value::as_str);
    let both = single.is_some_and(|s| !s.is_empty() && reported.iter().any(|r| r != s));
    let mut wanted: Vec<&str> = subjects.iter().map(String::as_str).collect();
    let mut have: Vec<&str> = reported.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    have.sort_unstable();
    if wanted == have && !both {
        return None;
    }
    let (key, noun) = match subjects {
        [_] => ("nats.subject is", "subject"),
        _ => ("nats.subjects are", "subjects"),
    };
    // The broker's text last: the error's Display bounds and escapes it.
    Some(format!(
        "{key} \"{}\" but the consumer filters {noun} \"{}\"; they must be equal",
        subjects.join(", "),
        PeerText::new(&reported.join(", "))
    ))
}

/// The consumer's filter subjects as the broker reports them: `filter_subject` and
/// `filter_subjects` together (a value that is not text reads `?`). `None`: the config is
/// not an object.
fn reported_filters(fields: &Map<String, Value>) -> Option<Vec<String>> {
    let mut all = Vec::new();
    if let Some(single) = fields.get("filter_subject") {
        match single.as_str() {
            Some("") => {}
            Some(s) => all.push(s.to_string()),
            None if single.is_null() => {}
            None => all.push("?".to_string()),
        }
    }
    if let Some(many) = fields.get("filter_subjects").filter(|v| !v.is_null()) {
        match many.as_array() {
            Some(a) => all.extend(a.iter().map(|s| s.as_str().unwrap_or("?").to_string())),
            None => all.push("?".to_string()),
        }
    }
    // The one subject in both fields is that subject.
    if all.len() > 1
        && all.iter().all(|f| *f == all[0])
        && fields.get("filter_subject") == Some(&Value::String(all[0].clone()))
    {
        all.truncate(1);
    }
    Some(all)
}

/// The consumer's filter as the broker reports it (for messages).
pub fn filter_of(config: &Value) -> String {
    config
        .as_object()
        .and_then(reported_filters)
        .unwrap_or_default()
        .join(", ")
}

/// The consumer's filter when it is not exactly `subjects` (for messages), else `None`.
pub fn filter_differs(config: &Value, subjects: &[String]) -> Option<String> {
    let fields = config.as_object()?;
    filter_problem(fields, subjects).map(|_| filter_of(config))
}

/// Whether the consumer starts where `wanted` says: its `deliver_policy` and the starting
/// point that goes with it (`opt_start_seq`, `opt_start_time` compared as instants). Err
/// names what the broker reports.
pub fn check_start(config: &Value, wanted: StartPosition) -> Result<(), String> {
    let policy = config
        .get("deliver_policy")
        .and_then(Value::as_str)
        .unwrap_or("all");
    let seq = config.get("opt_start_seq").and_then(Value::as_u64);
    let time_text = config.get("opt_start_time").and_then(Value::as_str);
    let time = time_text.and_then(parse_rfc3339_nanos);
    let same = policy == wanted.policy_name()
        && match wanted {
            StartPosition::ByStartSequence(n) => seq == Some(n),
            StartPosition::ByStartTime(nanos) => time == Some(nanos),
            _ => true,
        };
    if same {
        return Ok(());
    }
    let point = match (seq, time) {
        (Some(n), _) if n > 0 => format!(" (opt_start_seq {n})"),
        (_, Some(t)) => format!(" (opt_start_time {})", format_rfc3339_nanos(t)),
        _ => String::new(),
    };
    Err(format!(
        "the consumer starts at deliver_policy {}{point}, not {wanted}",
        PeerText::with_limit(policy, 40)
    ))
}

/// A field's "not set" value: what the broker reports for a default.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// What the runner asks of each pull request, checked against the consumer's request limits.
#[derive(Debug, Clone, Copy)]
pub struct RequestShape {
    /// Messages per request (`delivery.batch_size`).
    pub batch: usize,
    /// A request's expiry (`delivery.fetch_expiry_ms`).
    pub expires: Duration,
    /// A request's byte allowance (`max_bytes`).
    pub max_bytes: usize,
    /// Pull requests the runner keeps open at once.
    pub open_requests: usize,
}

/// Refuses a consumer whose pull request limits are below what the runner asks: the broker
/// would refuse every request with a 409 and deliver nothing. Each problem names the consumer
/// field and the setting of the runner to change.
pub fn check_request_limits(config: &Value, asked: RequestShape) -> Result<(), String> {
    let limit = |name: &str| {
        config
            .get(name)
            .and_then(Value::as_i64)
            .filter(|n| *n > 0)
            .map(|n| n as u128)
    };
    let mut problems = Vec::new();
    let mut compare = |field: &str, wanted: u128, what: &str, setting: &str| {
        if let Some(max) = limit(field) {
            if max < wanted {
                problems.push(format!(
                    "the consumer's {field} is {max} but the runner asks {wanted} {what} \
                     ({setting}): raise {field} or lower {setting}"
                ));
            }
        }
    };
    compare(
        "max_batch",
        asked.batch as u128,
        "messages per pull request",
        "delivery.batch_size",
    );
    compare(
        "max_expires",
        asked.expires.as_nanos(),
        "nanoseconds of expiry per pull request",
        "delivery.fetch_expiry_ms",
    );
    compare(
        "max_bytes",
        asked.max_bytes as u128,
        "bytes per pull request",
        "delivery.max_in_flight_bytes / max_in_flight_batches",
    );
    compare(
        "max_waiting",
        asked.open_requests as u128,
        "open pull requests",
        "the runner's pipelined pull requests",
    );
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(subject: &str) -> Vec<String> {
        vec![subject.to_string()]
    }

    /// A pull consumer as nats-server 2.9.10 reports it.
    fn reported() -> Value {
        json!({"durable_name":"svc","deliver_policy":"all","ack_policy":"explicit",
               "ack_wait":30000000000u64,"max_deliver":-1,"filter_subject":"orders.>",
               "replay_policy":"instant","max_waiting":512,"max_ack_pending":1000,
               "num_replicas":0})
    }

    #[test]
    fn a_plain_pull_consumer_binds() {
        assert_eq!(check_bindable(&reported(), &one("orders.>")), Ok(()));
        let mut c = reported();
        c["filter_subject"] = json!("");
        c["filter_subjects"] = json!(["orders.>"]);
        c["metadata"] = json!({"team": "x"});
        c["mem_storage"] = json!(true);
        c["priority_policy"] = json!("none");
        c["some_future_field"] = json!(false);
        assert_eq!(check_bindable(&c, &one("orders.>")), Ok(()));
    }

    #[test]
    fn settings_that_change_what_is_delivered_are_refused() {
        for (field, value, said) in [
            ("headers_only", json!(true), "headers_only"),
            ("deliver_subject", json!("push.x"), "push consumer"),
            ("ack_policy", json!("all"), "explicit acknowledgement"),
            (
                "filter_subject",
                json!("orders.a"),
                "filters subject \"orders.a\"",
            ),
            ("filter_subjects", json!(["orders.a"]), "filters subject"),
            ("priority_groups", json!(["g"]), "priority groups"),
            ("priority_policy", json!("overflow"), "priority policy"),
            ("some_future_field", json!(3), "does not know"),
        ] {
            let mut c = reported();
            c[field] = value;
            let why = check_bindable(&c, &one("orders.>")).unwrap_err();
            assert!(why.contains(said), "{field}: {why}");
        }
    }

    #[test]
    fn several_filter_subjects_bind_only_as_the_same_set() {
        let wanted = vec!["orders.a".to_string(), "orders.b".to_string()];
        let mut c = reported();
        c["filter_subject"] = json!("");
        c["filter_subjects"] = json!(["orders.b", "orders.a"]);
        assert_eq!(check_bindable(&c, &wanted), Ok(()));
        // A broker that answers with a filter set we did not ask for: refused.
        for other in [
            json!(["orders.a"]),
            json!(["orders.a", "orders.b", "orders.c"]),
            json!(["orders.a", "orders.a"]),
            json!("orders.a"),
        ] {
            c["filter_subjects"] = other.clone();
            let why = check_bindable(&c, &wanted).unwrap_err();
            assert!(
                why.contains("nats.subjects are \"orders.a, orders.b\" but the consumer filters"),
                "{other}: {why}"
            );
        }
        // A single-subject consumer, or a consumer of everything, for several subjects.
        c["filter_subjects"] = Value::Null;
        for single in ["orders.>", ""] {
            c["filter_subject"] = json!(single);
            assert!(check_bindable(&c, &wanted).is_err(), "{single}");
        }
        // Several subjects on a consumer for one.
        c["filter_subject"] = json!("");
        c["filter_subjects"] = json!(["orders.>", "payments.>"]);
        let why = check_bindable(&c, &one("orders.>")).unwrap_err();
        assert!(
            why.contains("filters subject \"orders.>, payments.>\""),
            "{why}"
        );
    }

    #[test]
    fn the_start_is_compared_with_its_starting_point() {
        use super::super::config::StartPosition;
        let mut c = reported();
        assert_eq!(check_start(&c, StartPosition::All), Ok(()));
        let why = check_start(&c, StartPosition::New).unwrap_err();
        assert_eq!(why, "the consumer starts at deliver_policy all, not new");
        c["deliver_policy"] = json!("by_start_sequence");
        c["opt_start_seq"] = json!(42);
        assert_eq!(check_start(&c, StartPosition::ByStartSequence(42)), Ok(()));
        let why = check_start(&c, StartPosition::ByStartSequence(7)).unwrap_err();
        assert_eq!(
            why,
            "the consumer starts at deliver_policy by_start_sequence (opt_start_seq 42), not \
             by_start_sequence (opt_start_seq 7)"
        );
        c["deliver_policy"] = json!("by_start_time");
        c["opt_start_seq"] = Value::Null;
        // The broker's own spelling of the instant (another offset, more digits).
        c["opt_start_time"] = json!("2026-11-28T10:00:00.500000000+01:00");
        let at = crate::text::rfc3339::parse_rfc3339_nanos("2026-11-28T09:00:00.5Z").unwrap();
        assert_eq!(check_start(&c, StartPosition::ByStartTime(at)), Ok(()));
        assert!(check_start(&c, StartPosition::ByStartTime(at + 1)).is_err());
        // Hostile text is bounded and escaped.
        c["deliver_policy"] = json!(format!("x\u{1b}[31m{}", "y".repeat(500)));
        let why = check_start(&c, StartPosition::All).unwrap_err();
        assert!(!why.contains('\u{1b}') && why.len() < 200, "{why}");
    }

    #[test]
    fn filter_subjects_need_nats_server_2_10() {
        for v in ["2.10.0", "2.15.1", "v2.10.22-RC.1", "3.0.0", "2.11"] {
            assert!(super::super::supports_filter_subjects(v), "{v}");
        }
        for v in [
            "2.9.10",
            "2.9",
            "1.99.0",
            "",
            "2",
            "two.ten",
            "2.x",
            "\u{1b}2.10",
        ] {
            assert!(!super::super::supports_filter_subjects(v), "{v}");
        }
    }

    #[test]
    fn request_limits_below_what_the_runner_asks_are_refused() {
        let asked = RequestShape {
            batch: 256,
            expires: Duration::from_secs(5),
            max_bytes: 1 << 20,
            open_requests: 2,
        };
        assert_eq!(check_request_limits(&reported(), asked), Ok(()));
        for (field, value) in [
            ("max_batch", 10),
            ("max_expires", 1_000_000_000),
            ("max_bytes", 1000),
            ("max_waiting", 1),
        ] {
            let mut c = reported();
            c[field] = json!(value);
            let why = check_request_limits(&c, asked).unwrap_err();
            assert!(
                why.contains(&format!("consumer's {field} is {value}")),
                "{why}"
            );
        }
    }
}
