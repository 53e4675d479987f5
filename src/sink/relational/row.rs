//! One envelope as a row: its idempotency key and the borrowed JSON object
//! `jsonb_to_recordset` reads (no payload copy).

use serde::Serialize;

use super::sql::COLUMNS;
use crate::message::envelope::{Envelope, EventMetadata};
use crate::sink::key::{strategy_key, KeyStrategy};

/// The idempotency key of an envelope: the shared `idempotency_key` strategy of
/// [`crate::sink::key`] without its namespace (`s-<stream>-<seq>`, `m-<msg id>`, `p-<sha256>`).
pub fn row_key(env: &Envelope) -> String {
    let k = strategy_key(env, KeyStrategy::IdempotencyKey, "")
        .expect("the idempotency_key strategy always has an input");
    k.strip_prefix("idempotency-key/").unwrap_or(&k).to_string()
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
