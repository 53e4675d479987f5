//! One envelope as a row: its idempotency key and the borrowed JSON object
//! `jsonb_to_recordset` reads (no payload copy).

use serde::Serialize;

use super::sql::COLUMNS;
use crate::message::envelope::{Envelope, EventMetadata};
use crate::message::record::{push_message_members, Unknown};
use crate::sink::key::idempotency_id;
pub(super) use crate::text::json::decimal;
use crate::text::json::push_str as push_json_str;

/// The idempotency key of an envelope: the shared `idempotency_key` strategy of
/// [`crate::sink::key`] without its namespace (`s-<stream>-<seq>`, `m-<msg id>`, `p-<sha256>`).
pub fn row_key(env: &Envelope) -> String {
    idempotency_id(env)
}

/// One row as the JSON object `jsonb_to_recordset` reads. Borrowed: no payload copies.
#[derive(Serialize)]
pub(super) struct Row<'a> {
    idempotency_key: &'a str,
    subject: &'a str,
    stream: &'a str,
    stream_incarnation: Option<&'a str>,
    stream_sequence: u64,
    consumer: &'a str,
    consumer_sequence: u64,
    message_id: Option<&'a str>,
    priority: &'a str,
    classification: &'a str,
    labels: &'a str,
    labels_list: &'a [String],
    payload: &'a crate::message::envelope::Payload,
    payload_original_format: crate::message::envelope::PayloadFormat,
    payload_wrapped: bool,
    payload_sha256: &'a str,
    payload_size_bytes: u64,
    security_labels_json: Option<&'a serde_json::Value>,
    mission_metadata_json: Option<&'a serde_json::Value>,
    metadata_json: &'a EventMetadata,
    received_at: &'a str,
    custody_json: Option<&'a crate::message::envelope::Custody>,
}

pub(super) fn row<'a>(env: &'a Envelope, key: &'a str) -> Row<'a> {
    Row {
        idempotency_key: key,
        subject: &env.subject,
        stream: &env.stream,
        stream_incarnation: Some(&*env.stream_incarnation).filter(|i| !i.is_empty()),
        stream_sequence: env.stream_sequence,
        consumer: &env.consumer,
        consumer_sequence: env.consumer_sequence,
        message_id: env.message_id.as_deref(),
        priority: &env.priority,
        classification: &env.classification,
        labels: &env.labels,
        labels_list: &env.labels_list,
        payload: &env.payload,
        payload_original_format: env.payload_info.original_format,
        payload_wrapped: env.payload_info.wrapped,
        payload_sha256: &env.payload_info.sha256,
        payload_size_bytes: env.payload_info.size_bytes,
        security_labels_json: env.security_labels.as_ref(),
        mission_metadata_json: env.mission_metadata.as_ref(),
        metadata_json: &env.metadata,
        received_at: &env.metadata.received_at,
        custody_json: env.custody.as_ref(),
    }
}

/// The column names in table order and one envelope's row as the JSON object the insert
/// reads (benches/relational_throughput.rs feeds the same rows to `COPY` as its baseline).
pub fn row_columns_and_object(env: &Envelope) -> (Vec<&'static str>, serde_json::Value) {
    let key = row_key(env);
    let names = COLUMNS.iter().map(|c| c.0).collect();
    let value = serde_json::to_value(row(env, &key)).expect("a row serializes");
    (names, value)
}

/// The rows `idx` of `batch` (keys `keys[i]`) as the JSON array the insert's parameter
/// carries: the same object per row as serializing [`Row`]s, written without serde's
/// machinery for the flat fields (column names are constants, strings escaped in runs); the
/// nested values (metadata, labels, custody) go through serde_json.
pub(super) fn rows_json(
    batch: &[Envelope],
    keys: &[String],
    idx: &[usize],
) -> serde_json::Result<String> {
    let mut out = Vec::with_capacity(idx.len() * 1024);
    out.push(b'[');
    for (n, &i) in idx.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        push_row(&mut out, &batch[i], &keys[i])?;
    }
    out.push(b']');
    Ok(String::from_utf8(out).expect("JSON text is UTF-8"))
}

/// One row's object, appended to `out`, members in [`Row`]'s order.
fn push_row(out: &mut Vec<u8>, env: &Envelope, key: &str) -> serde_json::Result<()> {
    let info = &env.payload_info;
    out.extend_from_slice(b"{\"idempotency_key\":");
    push_json_str(out, key);
    out.push(b',');
    push_message_members(out, env, Unknown::Null)?;
    out.extend_from_slice(b",\"payload_original_format\":\"");
    out.extend_from_slice(info.original_format.name().as_bytes());
    out.extend_from_slice(if info.wrapped {
        b"\",\"payload_wrapped\":true,\"payload_sha256\":"
    } else {
        b"\",\"payload_wrapped\":false,\"payload_sha256\":"
    });
    push_json_str(out, &info.sha256);
    out.extend_from_slice(b",\"payload_size_bytes\":");
    out.extend_from_slice(decimal(info.size_bytes, &mut [0; 20]).as_bytes());
    out.extend_from_slice(b",\"security_labels_json\":");
    serde_json::to_writer(&mut *out, &env.security_labels)?;
    out.extend_from_slice(b",\"mission_metadata_json\":");
    serde_json::to_writer(&mut *out, &env.mission_metadata)?;
    out.extend_from_slice(b",\"metadata_json\":");
    env.metadata.write_json(out)?;
    out.extend_from_slice(b",\"received_at\":");
    push_json_str(out, &env.metadata.received_at);
    out.extend_from_slice(b",\"custody_json\":");
    serde_json::to_writer(&mut *out, &env.custody)?;
    out.push(b'}');
    Ok(())
}
