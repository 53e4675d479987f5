//! The dead letters one runner stored lately, read back at its start (custody checkpoints):
//! a runner-caused gap told to the checkpoint thread before a kill -9, and not signed yet, is
//! found again here (the dead letter names its runner: `runner_id`).
//!
//! Read newest first with `STREAM.MSG.GET` by sequence (a permission the runner holds for the
//! duplicate check already; no consumer), from the stream's last sequence down, until a record
//! failed before the given time, at most a given number of messages, within one deadline.
//! Each answer is bounded as the duplicate check's and must be for the sequence asked.

use std::time::{Duration, Instant};

use super::config::DEAD_LETTER_SCHEMA;
use super::stored::{msg_get, stored_message_of, MAX_STORED_RECORD_REPLY_BYTES};
use crate::text::peer::PeerText;

/// A dead letter of the runner: where its original was, and whether the sink refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerGap {
    pub stream: String,
    pub incarnation: String,
    pub sequence: u64,
    /// `failure.stage` is `sink` (a permanent sink failure), not a check before the sink.
    pub by_sink: bool,
}

/// Whose dead letters are read: the runner, and the stream and durable it consumes.
#[derive(Debug, Clone, Copy)]
pub struct Whose<'a> {
    pub runner_id: &'a str,
    pub stream: &'a str,
    pub consumer: &'a str,
    /// `dead_letter.subject`: a message of the stream under another subject is not ours.
    pub subject: &'a str,
}

/// How far back and how much.
#[derive(Debug, Clone, Copy)]
pub struct Reach {
    /// Stop at the first record that failed before this time (Unix ns); `None`: no time limit.
    pub since_unix_nanos: Option<i128>,
    /// Messages read at most.
    pub max_read: u64,
    /// The whole read, every request included.
    pub timeout: Duration,
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
    let deadline = Instant::now() + reach.timeout;
    let info = crate::broker::incarnation::stream_info(nc, stream, reach.timeout)
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
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            found.cut_short = Some(format!("{} s passed", reach.timeout.as_secs()));
            break;
        }
        found.read += 1;
        let answer = msg_get(nc, stream, seq, left, MAX_STORED_RECORD_REPLY_BYTES)?;
        if let Some(v) = answer {
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
    /// Failed before the time asked for: the read ends.
    Older,
}

/// One stored message read as a dead letter of `who`.
fn take(v: &serde_json::Value, who: Whose<'_>, since: Option<i128>) -> Take {
    let Some(m) = stored_message_of(v).filter(|m| m.subject == who.subject) else {
        return Take::Other;
    };
    let Ok(r) = serde_json::from_slice::<serde_json::Value>(&m.data) else {
        return Take::Other;
    };
    if r["schema"] != DEAD_LETTER_SCHEMA {
        return Take::Other;
    }
    let failed = r["failed_at"]
        .as_str()
        .and_then(crate::text::rfc3339::parse_rfc3339_nanos);
    if let (Some(failed), Some(since)) = (failed, since) {
        if failed < since {
            return Take::Older;
        }
    }
    let o = &r["original"];
    let ours = r["runner_id"] == who.runner_id
        && o["stream"] == who.stream
        && o["consumer"] == who.consumer
        && r.get("replayed").is_none();
    match (ours, o["stream_sequence"].as_u64()) {
        (true, Some(sequence)) if sequence > 0 => Take::Ours(RunnerGap {
            stream: who.stream.to_string(),
            incarnation: o["stream_incarnation"].as_str().unwrap_or("").to_string(),
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

    fn answer(subject: &str, record: serde_json::Value) -> serde_json::Value {
        let data = base64::engine::general_purpose::STANDARD.encode(record.to_string());
        serde_json::json!({"message": {"subject": subject, "seq": 7, "data": data}})
    }

    fn record(runner: &str, failed_at: &str, stage: &str) -> serde_json::Value {
        serde_json::json!({
            "schema": DEAD_LETTER_SCHEMA, "failed_at": failed_at, "runner_id": runner,
            "failure": {"stage": stage},
            "original": {"stream": "ORDERS", "stream_incarnation": "20260101T000000Z",
                         "stream_sequence": 42, "consumer": "svc"}
        })
    }

    const WHO: Whose<'static> = Whose {
        runner_id: "r1",
        stream: "ORDERS",
        consumer: "svc",
        subject: "dlq.svc",
    };

    #[test]
    fn only_the_runners_own_records_of_its_stream_and_durable_are_gaps() {
        let at = "2026-11-29T12:00:00Z";
        let since = crate::text::rfc3339::parse_rfc3339_nanos("2026-11-29T11:00:00Z");
        let v = answer("dlq.svc", record("r1", at, "sink"));
        match take(&v, WHO, since) {
            Take::Ours(g) => {
                assert_eq!((g.sequence, g.by_sink), (42, true));
                assert_eq!(g.incarnation, "20260101T000000Z");
            }
            _ => panic!("not taken"),
        }
        let v = answer("dlq.svc", record("r2", at, "sink"));
        assert!(matches!(take(&v, WHO, since), Take::Other));
        let v = answer("other.subject", record("r1", at, "sink"));
        assert!(matches!(take(&v, WHO, since), Take::Other));
        let mut replayed = record("r1", at, "input");
        replayed["replayed"] = true.into();
        assert!(matches!(
            take(&answer("dlq.svc", replayed), WHO, since),
            Take::Other
        ));
        let old = answer("dlq.svc", record("r2", "2026-11-29T10:59:59Z", "input"));
        assert!(matches!(take(&old, WHO, since), Take::Older));
        assert!(matches!(take(&old, WHO, None), Take::Other));
    }
}
