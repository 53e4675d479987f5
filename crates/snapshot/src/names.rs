//! The names a snapshot carries: every counter the runner declares (the counter set is
//! declared once, here, so the runner's registry, its snapshot and the exporter's catalogue
//! cannot drift), the summaries and the spool's gauges.

use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the counter set once: the struct, its names and the snapshot iteration stay in step.
macro_rules! counters {
    ($( $(#[$doc:meta])* $field:ident ),* $(,)?) => {
        /// Monotonic counters. Field name = metric suffix.
        #[derive(Debug, Default)]
        pub struct Counters {
            $( $(#[$doc])* pub $field: AtomicU64, )*
        }

        impl Counters {
            /// Every counter as `(suffix, value)`, in declaration order.
            pub fn values(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($field), self.$field.load(Ordering::Relaxed)), )* ]
            }

            /// Every counter suffix the runner can produce.
            pub const NAMES: &'static [&'static str] = &[ $( stringify!($field), )* ];
        }
    };
}

counters! {
    /// Messages received from the broker.
    messages_fetched_total,
    /// Messages normalized into envelopes and handed to the sink.
    messages_prepared_total,
    /// Messages the sink reported durable (including already-durable duplicates).
    messages_written_total,
    /// Messages acknowledged after durable success or DLQ success.
    messages_acked_total,
    /// Messages terminated (`+TERM`) after the configured delivery limit.
    messages_terminated_total,
    /// Negative acknowledgements sent (transient failures and permanent failures awaiting a limit).
    messages_nacked_total,
    /// Messages whose processing failed permanently (pre-sink or sink).
    messages_failed_total,
    /// Messages published to the dead-letter subject and confirmed by the broker.
    messages_dlq_total,
    /// Dead-letter publishes that were not confirmed (the original stays unacknowledged).
    dlq_publish_errors_total,
    /// Sink write failures, counted per message.
    sink_write_errors_total,
    /// Sink writes that failed permanently (a failure class redelivery cannot fix), counted per
    /// message and delivery: dead-lettered when a DLQ is on, else NAKed until a delivery limit.
    sink_permanent_failures_total,
    /// In-sink retries of a single write (object store: timeouts, 5xx, 409 conflicts).
    sink_retries_total,
    /// Events whose age at receive exceeded `envelope.stale_after_seconds`.
    events_stale_at_receive_total,
    /// Events without a publisher timestamp header (broker time used instead).
    events_missing_publisher_timestamp_total,
    /// Events whose publisher timestamp header could not be parsed.
    events_malformed_timestamp_total,
    /// Events whose source time lies in the runner's future (positive source clock skew).
    events_source_clock_skew_total,
    /// Events whose event time header lies more than 10 years before or an hour after the
    /// broker's store time: left out of the event-age summaries (broker time used instead).
    events_implausible_time_total,
    /// Relational sink: rows whose idempotency key already existed (every duplicate detected).
    db_duplicates_total,
    /// Relational sink: the duplicates confirmed to be the same event (same subject and payload
    /// digest), ignored without error; the rest are key collisions reported as permanent.
    db_duplicate_ignored_total,
    /// Connections lost to the broker.
    broker_connection_disconnects_total,
    /// Connections re-established to the broker.
    broker_connection_reconnects_total,
    /// Asynchronous connection errors reported by the client.
    broker_connection_errors_total,
    /// In-progress acknowledgements sent to extend AckWait of long batches.
    messages_in_progress_total,
    /// `ack_confirmation`: ACKs the broker confirmed having processed.
    ack_confirmations_total,
    /// `ack_confirmation`: ACKs sent again because no confirmation came in time.
    acks_resent_total,
    /// `ack_confirmation`: ACKs given up unconfirmed (after the ack wait, at a stop, or for a
    /// consumer created again); the broker redelivers what they did not settle.
    ack_confirmations_abandoned_total,
    /// Custody checkpoints: deliveries of a message given up on that were NAKed to wait until a
    /// stored checkpoint lists its gap (sign first, settle last).
    checkpoint_gap_waits_total,
    /// Custody checkpoints: messages given up on and settled before a checkpoint listed their
    /// gap (the checkpoint store failing with the hold full, the thread reading the store
    /// back, or the consumer's own last delivery); the gap is still listed by the next cut.
    checkpoint_gaps_settled_unsigned_total,
    /// Custody checkpoints: records committed while the checkpoint thread's channel was full,
    /// not told to it (the thread reads the store back after such an overflow and signs them).
    checkpoint_records_untold_total,
    /// Custody checkpoints: gaps listed by no checkpoint: told while the channel and the gaps
    /// kept aside (65,536) were full, or left at a stop whose last checkpoint failed past the
    /// 65,536 kept for the next start (or when they could not be kept); the log names each.
    checkpoint_gaps_unlisted_total,
    /// Fan-out: messages routed to at least one child.
    fanout_messages_routed_total,
    /// Fan-out: messages no route matched, acknowledged unstored (`no_match: ignore`).
    fanout_messages_ignored_total,
    /// Fan-out: child sinks selected, summed over messages.
    fanout_child_sinks_selected_total,
    /// Fan-out: required child writes that succeeded.
    fanout_required_child_success_total,
    /// Fan-out: required child writes that failed and blocked ACK.
    fanout_required_child_failure_total,
    /// Fan-out: optional child writes that did not finish within their timeout.
    fanout_optional_child_timeout_total,
    /// Fan-out: optional child writes that failed.
    fanout_optional_child_failure_total,
    /// Fan-out: messages released by the ACK gate.
    fanout_messages_acked_total,
    /// Fan-out: messages held back by the ACK gate.
    fanout_messages_ack_blocked_total,
    /// Advisory observer: max-deliveries advisories seen.
    advisory_max_deliveries_total,
    /// Advisory observer: message-terminated advisories seen.
    advisory_terminated_total,
    /// Advisory observer: consumer NAK advisories seen.
    advisory_nak_total,
    /// Authenticity: messages whose signature verified.
    authenticity_verified_total,
    /// Authenticity: messages without a signature on a subject that does not require one.
    authenticity_unsigned_total,
    /// Authenticity: refused, no signature where one is required.
    authenticity_missing_signature_total,
    /// Authenticity: refused, incomplete, repeated or undecodable signature headers.
    authenticity_malformed_signature_total,
    /// Authenticity: refused, algorithm not allowed for the subject.
    authenticity_disallowed_algorithm_total,
    /// Authenticity: refused, key id unknown or not allowed for the subject.
    authenticity_unknown_key_total,
    /// Authenticity: refused, the signature does not verify.
    authenticity_bad_signature_total,
    /// Payload encryption: payloads encrypted.
    payload_encrypted_total,
    /// Payload encryption: payloads left in clear by a `clear` rule or default.
    payload_encryption_clear_total,
    /// Payload encryption: messages refused because the active key reached its message bound
    /// (left unacknowledged until the key is rotated).
    payload_encryption_refused_total,
    /// Custody: records sealed with a custody block.
    custody_sealed_total,
    /// Mission metadata: records given a mission metadata object.
    mission_metadata_attached_total,
    /// Mission metadata: messages refused (dead-lettered) by the mission metadata stage.
    mission_metadata_rejected_total,
    /// Pre-sink policy: messages refused (dead-lettered) by a policy rule or as unmatched.
    pre_sink_policy_rejected_total,
    /// Size policy: messages refused (dead-lettered) by a size bound.
    size_policy_rejected_total,
    /// Mission metadata refused: `duplicate_header`.
    mission_metadata_duplicate_header_total,
    /// Mission metadata refused: `header_too_large`.
    mission_metadata_header_too_large_total,
    /// Mission metadata refused: `invalid_json`.
    mission_metadata_invalid_json_total,
    /// Mission metadata refused: `duplicate_key`.
    mission_metadata_duplicate_key_total,
    /// Mission metadata refused: `not_object`.
    mission_metadata_not_object_total,
    /// Mission metadata refused: `control_character`.
    mission_metadata_control_character_total,
    /// Mission metadata refused: `nul_character`.
    mission_metadata_nul_character_total,
    /// Mission metadata refused: `too_deep`.
    mission_metadata_too_deep_total,
    /// Mission metadata refused: `too_large`.
    mission_metadata_too_large_total,
    /// Mission metadata refused: `missing_profile`.
    mission_metadata_missing_profile_total,
    /// Mission metadata refused: `wrong_type`.
    mission_metadata_wrong_type_total,
    /// Mission metadata refused: `unknown_profile`.
    mission_metadata_unknown_profile_total,
    /// Mission metadata refused: `profile_not_allowed`.
    mission_metadata_profile_not_allowed_total,
    /// Mission metadata refused: `missing_field`.
    mission_metadata_missing_field_total,
    /// Mission metadata refused: `out_of_bounds`.
    mission_metadata_out_of_bounds_total,
    /// Mission metadata refused: `unknown_field`.
    mission_metadata_unknown_field_total,
    /// Pre-sink policy refused: `unmatched_subject`.
    pre_sink_policy_unmatched_subject_total,
    /// Pre-sink policy refused: `priority_not_allowed`.
    pre_sink_policy_priority_not_allowed_total,
    /// Pre-sink policy refused: `classification_not_allowed`.
    pre_sink_policy_classification_not_allowed_total,
    /// Pre-sink policy refused: `missing_required_label`.
    pre_sink_policy_missing_required_label_total,
    /// Pre-sink policy refused: `missing_mission_metadata`.
    pre_sink_policy_missing_mission_metadata_total,
    /// Pre-sink policy refused: `payload_not_encrypted`.
    pre_sink_policy_payload_not_encrypted_total,
    /// Pre-sink policy refused: `policy_payload_too_large`.
    pre_sink_policy_policy_payload_too_large_total,
    /// Pre-sink policy refused: `mission_metadata_key_not_allowed`.
    pre_sink_policy_mission_metadata_key_not_allowed_total,
    /// Size policy refused: `payload_too_large`.
    size_policy_payload_too_large_total,
    /// Size policy refused: `too_many_headers`.
    size_policy_too_many_headers_total,
    /// Size policy refused: `header_name_too_long`.
    size_policy_header_name_too_long_total,
    /// Size policy refused: `header_value_too_long`.
    size_policy_header_value_too_long_total,
    /// Size policy refused: `headers_too_large`.
    size_policy_headers_too_large_total,
    /// Size policy refused: `too_many_labels`.
    size_policy_too_many_labels_total,
    /// Size policy refused: `labels_too_large`.
    size_policy_labels_too_large_total,
    /// Size policy refused: `mission_metadata_too_large`.
    size_policy_mission_metadata_too_large_total,
    /// Size policy refused: `record_too_large`.
    size_policy_record_too_large_total,
    /// Spool: records appended (fsynced) instead of being written to the sink directly.
    spool_appended_total,
    /// Spool: records the drain delivered and the sink confirmed.
    spool_drained_total,
    /// Spool: damaged stretches of a segment moved to a quarantine file.
    spool_quarantined_total,
    /// Spool: records refused because the spool was full (left to the broker, NAKed).
    spool_full_refusals_total,
    /// Spool: records the sink refused for good while draining (kept in a `rejected-*` file).
    spool_rejected_total,
    /// Spool: drain steps that failed on the spool's side (records the sink refused that
    /// could not be kept, a segment or the position that could not be read or written); the
    /// drain does not move past such a step.
    spool_drain_errors_total,
    /// HTTP sink: requests answered with a 2xx status.
    http_requests_2xx_total,
    /// HTTP sink: requests answered with a 3xx status (never followed: the sink is unusable).
    http_requests_3xx_total,
    /// HTTP sink: requests answered with a 4xx status.
    http_requests_4xx_total,
    /// HTTP sink: requests answered with a 5xx status.
    http_requests_5xx_total,
    /// HTTP sink: requests answered with a status that refuses the sink itself (401, 403, 404,
    /// 407, a redirect: any status outside the success, retry and dead-letter lists).
    http_sink_unusable_total,
    /// HTTP sink: requests without an answer (timeout, connection or TLS failure).
    http_request_failures_total,
    /// HTTP sink: requests sent again in the call (retry statuses, timeouts, no answer).
    http_retries_total,
    /// HTTP sink: retries that waited as the receiver's `Retry-After` asked.
    http_retry_after_waits_total,
    /// HTTP sink: request body bytes sent (as sent: after gzip), retries included.
    http_request_bytes_total,
}

/// The spool's gauges, in the snapshot only when a spool is configured.
pub const SPOOL_GAUGE_NAMES: &[&str] = &[
    "spool_records",
    "spool_bytes",
    "spool_oldest_record_epoch_seconds",
    "spool_mode",
];

/// Summary suffixes the runner produces.
pub const SUMMARY_NAMES: &[&str] = &[
    "sink_batch_write_seconds",
    "event_age_at_receive_seconds",
    "event_age_at_store_seconds",
    "fanout_ack_gate_wait_seconds",
    "http_request_seconds",
    "http_retry_after_wait_seconds",
    "ack_confirmation_seconds",
];
