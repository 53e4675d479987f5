//! The dead letters one runner stored lately, read back at its start (custody checkpoints):
//! a runner-caused gap told to the checkpoint thread before a kill -9, and not signed yet, is
//! found again here (the dead letter names its runner: `runner_id`).
//!
//! Read newest first with `STREAM.MSG.GET` by sequence (a permission the runner holds for the
//! duplicate check already; no consumer), from the stream's last sequence down, until a message
//! the broker stored before the given time, at most a given number of messages, within one
//! deadline. Each answer is bounded as the duplicate check's (a larger message is another
//! publisher's, skipped) and must be for the sequence asked.

use std::time::{Duration, Instant};

use super::config::DEAD_LETTER_SCHEMA;
use super::stored::{msg_get_any, stored_message_of, Got, MAX_STORED_RECORD_REPLY_BYTES};
use crate::text::peer::PeerText;

/// A dead letter of the runner: where its original was, and whether the sink refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerGap {
    pub sequence: u64,
    /// `failure.stage` is `sink` (a permanent sink failure), not a check before the sink.
    pub by_sink: bool,
}

/// Whose dead letters are read: the runner, and the stream (in its current incarnation) and
/// durable it consumes.
#[derive(Debug, Clone, Copy)]
pub struct Whose<'a> {
    pub runner_id: &'a str,
    pub stream: &'a str,
    /// The stream's incarnation now: a record of another incarnation (an earlier stream of
    /// the name, or one a planted record makes up) is never listed.
    pub incarnation: &'a str,
    pub consumer: &'a str,
    /// `dead_letter.subject`: a message of the stream under another subject is not ours.
    pub subject: &'a str,
}

/// How far back and how much.
#[derive(Debug, Clone, Copy)]
pub struct Reach {
    /// Stop at the first message the broker stored before this time (Unix ns; its own clock,
    /// which only moves forward with the sequence: another runner's clock decides nothing).
    pub since_unix_nanos: i128,
    /// Messages read at most.
    pub max_read: u64,
    /// The whole read, every request and every stream included.
    pub deadline: Instant,
    /// One request at most.
    pub request_timeout: Duration,
}

/// What a read found.
#[derive(Debug, Default)]
pub struct Found {
    pub gaps: Vec<RunnerGap>,
    /// Messages read (any runner's).
    pub read: u64,
    /// Why it stopped before reaching `since` or the stream's first message.
    pub cut_short: Option<String>,
}

/// The dead letters of `who` in `stream`, newest first (see the module comment).
pub fn runner_gaps(
    nc: &nats::Connection,
    stream: &str,
    who: Whose<'_>,
    reach: Reach,
) -> Result<Found, String> {
    let left = reach.deadline.saturating_duration_since(Instant::now());
    let info = crate::broker::incarnation::stream_info(nc, stream, left.min(reach.request_timeout))
        .map_err(|e| e.to_string())?;
    let state = &info["state"];
    let (Some(first), Some(last)) = (state["first_seq"].as_u64(), state["last_seq"].as_u64())
    else {
        return Err(format!(
            "stream {}: its info names no first and last sequence",
            PeerText::new(stream)
        ));
    };
    let mut found = Found::default();
    let mut seq = last;
    while seq >= first.max(1) {
        if found.read >= reach.max_read {
            found.cut_short = Some(format!("{} messages read", reach.max_read));
            break;
        }
        let left = reach.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            found.cut_short = Some("its deadline passed".into());
            break;
        }
        found.read += 1;
        let timeout = left.min(reach.request_timeout);
        let got = msg_get_any(nc, stream, seq, timeout, MAX_STORED_RECORD_REPLY_BYTES)?;
        // A message too large to be a dead letter is another publisher's: skipped.
        if let Got::Message(v) = got {
            if v["message"]["seq"].as_u64() != Some(seq) {
                return Err(format!(
                    "stream {} answered for another sequence than {seq}",
                    PeerText::new(stream)
                ));
            }
            match take(&v, who, reach.since_unix_nanos) {
                Take::Ours(gap) => found.gaps.push(gap),
                Take::Other => {}
                Take::Older => break,
            }
        }
        seq -= 1;
    }
    Ok(found)
}

enum Take {
    Ours(RunnerGap),
    /// Another runner's, another subject's, or not a record this version reads.
    Other,
    /// Stored by the broker before the time asked for: the read ends.
    Older,
}

/// One stored message read as a dead letter of `who`.
fn take(v: &serde_json::Value, who: Whose<'_>, since: i128) -> Take {
    let stored = v["message"]["time"]
        .as_str()
        .and_then(crate::text::rfc3339::parse_rfc3339_nanos);
    if stored.is_some_and(|t| t < since) {
        return Take::Older;
    }
    let Some(m) = stored_message_of(v).filter(|m| m.subject == who.subject) else {
        return Take::Other;
    };
    let Ok(r) = serde_json::from_slice::<serde_json::Value>(&m.data) else {
        return Take::Other;
    };
    let o = &r["original"];
    let ours = r["schema"] == DEAD_LETTER_SCHEMA
        && r["runner_id"] == who.runner_id
        && o["stream"] == who.stream
        && o["stream_incarnation"] == who.incarnation
        && o["consumer"] == who.consumer
        && r.get("replayed").is_none();
    match (ours, o["stream_sequence"].as_u64()) {
        (true, Some(sequence)) if sequence > 0 => Take::Ours(RunnerGap {
            sequence,
            by_sink: r["failure"]["stage"] == "sink",
        }),
        _ => Take::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn answer(subject: &str, stored_at: &str, record: serde_json::Value) -> serde_json::Value {
        let data = base64::engine::general_purpose::STANDARD.encode(record.to_string());
        serde_json::json!({"message": {"subject": subject, "seq": 7, "data": data,
                                       "time": stored_at}})
    }

    fn record(runner: &str, incarnation: &str, stage: &str) -> serde_json::Value {
        serde_json::json!({
            "schema": DEAD_LETTER_SCHEMA, "failed_at": "2020-01-01T00:00:00Z",
            "runner_id": runner, "failure": {"stage": stage},
            "original": {"stream": "ORDERS", "stream_incarnation": incarnation,
                         "stream_sequence": 42, "consumer": "svc"}
        })
    }

    const WHO: Whose<'static> = Whose {
        runner_id: "r1",
        stream: "ORDERS",
        incarnation: "20260101T000000Z",
        consumer: "svc",
        subject: "dlq.svc",
    };

    #[test]
    fn only_the_runners_own_records_of_its_stream_incarnation_and_durable_are_gaps() {
        let at = "2026-11-29T12:00:00Z";
        let since = crate::text::rfc3339::parse_rfc3339_nanos("2026-11-29T11:00:00Z").unwrap();
        let inc = WHO.incarnation;
        let v = answer("dlq.svc", at, record("r1", inc, "sink"));
        match take(&v, WHO, since) {
            Take::Ours(g) => assert_eq!((g.sequence, g.by_sink), (42, true)),
            _ => panic!("not taken"),
        }
        let other = |v: serde_json::Value| matches!(take(&v, WHO, since), Take::Other);
        assert!(other(answer("dlq.svc", at, record("r2", inc, "sink"))));
        assert!(other(answer(
            "other.subject",
            at,
            record("r1", inc, "sink")
        )));
        // An incarnation the stream does not have now (made up, or an earlier stream's).
        assert!(other(answer(
            "dlq.svc",
            at,
            record("r1", "made-up", "sink")
        )));
        let mut replayed = record("r1", inc, "input");
        replayed["replayed"] = true.into();
        assert!(other(answer("dlq.svc", at, replayed)));
        // The broker's store time ends the read, whatever clock wrote `failed_at`.
        let old = answer(
            "dlq.svc",
            "2026-11-29T10:59:59Z",
            record("r1", inc, "input"),
        );
        assert!(matches!(take(&old, WHO, since), Take::Older));
    }
}
