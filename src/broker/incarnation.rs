//! Which stream of a name the runner reads from. A stream deleted and created again under the
//! same name numbers its messages from 1 again, so `<stream>:<sequence>` alone names two
//! different messages: a dead-letter record's `Nats-Msg-Id` inside the DLQ's duplicate window,
//! an HTTP receiver's idempotency key, an object key or a row. Every such id also carries the
//! stream's incarnation: its creation time as the broker reports it (`created` of
//! `$JS.API.STREAM.INFO`), written by [`compact_utc`] (`20261128T071943.123456789Z`).
//!
//! The runner reads it at bind, and again when a delivery shows that the consumer was created
//! again (its delivery sequence went back: `DeliveryNames::take_restart`), before that
//! delivery goes on; docs/delivery-semantics.md says what is left.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::consumer_shape;
use super::Connection;
use crate::text::rfc3339::{compact_utc, parse_rfc3339_nanos};

/// Largest stream info reply read: a stream's config lists its subjects, so it can be far
/// larger than a consumer's (the connection's max payload bounds it first).
pub const MAX_STREAM_INFO_BYTES: usize = 1024 * 1024;

/// Creation times outside 2000-01-01..10000-01-01 are not believed: the compact form of an
/// instant RFC 3339 cannot write is the epoch, and two streams would share it.
const PLAUSIBLE_NANOS: std::ops::Range<i128> = 946_684_800_000_000_000..253_402_300_800_000_000_000;

/// The incarnation of `stream` as the broker reports it now.
pub fn read(nc: &Connection, stream: &str) -> io::Result<Arc<str>> {
    read_with_retention(nc, stream).map(|(incarnation, _)| incarnation)
}

/// [`read`], the request sent at once and answered within `timeout` (a check made before
/// each of many small steps, such as a redrive's removals).
pub fn read_within(nc: &Connection, stream: &str, timeout: Duration) -> io::Result<Arc<str>> {
    of_info(&stream_info(nc, stream, timeout)?).map_err(io::Error::other)
}

/// `$JS.API.STREAM.INFO` of `stream`, sent at once and answered within `timeout`, the reply
/// bounded by [`MAX_STREAM_INFO_BYTES`]: the one reader of a stream's info.
pub fn stream_info(nc: &Connection, stream: &str, timeout: Duration) -> io::Result<Value> {
    consumer_shape::api_request_flushed(
        nc,
        &format!("$JS.API.STREAM.INFO.{stream}"),
        b"",
        MAX_STREAM_INFO_BYTES,
        timeout,
    )
}

/// The incarnation of `stream` and its retention policy (`limits`, `interest`, `workqueue`;
/// `limits` when the broker does not say), from one stream info.
pub fn read_with_retention(nc: &Connection, stream: &str) -> io::Result<(Arc<str>, String)> {
    let info = stream_info(nc, stream, consumer_shape::API_TIMEOUT)?;
    let incarnation = of_info(&info).map_err(io::Error::other)?;
    let retention = match info["config"]["retention"].as_str() {
        None => "limits".to_string(),
        Some(r @ ("limits" | "interest" | "workqueue")) => r.to_string(),
        Some(_) => {
            return Err(io::Error::other(
                "the broker's stream retention (`config.retention`) is not limits, interest \
                 or workqueue",
            ))
        }
    };
    Ok((incarnation, retention))
}

/// The incarnation in a stream info reply, or why there is none.
pub fn of_info(info: &Value) -> Result<Arc<str>, String> {
    let created = info
        .get("created")
        .and_then(Value::as_str)
        .ok_or("the broker's stream info has no creation time (`created`)")?;
    let nanos = (created.len() <= 64)
        .then(|| parse_rfc3339_nanos(created))
        .flatten()
        .ok_or("the broker's stream creation time (`created`) is not RFC 3339")?;
    if !PLAUSIBLE_NANOS.contains(&nanos) {
        return Err(
            "the broker's stream creation time (`created`) is before 2000 or after \
                    9999"
                .into(),
        );
    }
    Ok(compact_utc(nanos).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_creation_time_is_read_strictly() {
        let info = |created: Value| json!({"config": {"name": "S"}, "created": created});
        assert_eq!(
            &*of_info(&info(json!("2026-11-28T07:19:43.123456789Z"))).unwrap(),
            "20261128T071943.123456789Z"
        );
        // Another offset, the same instant: the same incarnation.
        assert_eq!(
            &*of_info(&info(json!("2026-11-28T08:19:43.123456789+01:00"))).unwrap(),
            "20261128T071943.123456789Z"
        );
        for bad in [
            json!(null),
            json!(17),
            json!("yesterday"),
            json!("0001-01-01T00:00:00Z"),
            json!(format!("2026-11-28T07:19:43.{}Z", "1".repeat(80))),
        ] {
            let e = of_info(&info(bad.clone())).unwrap_err();
            assert!(e.contains("`created`"), "{bad}: {e}");
        }
        assert!(of_info(&json!({"config": {}})).is_err());
    }
}
