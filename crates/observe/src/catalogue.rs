//! The metric catalogue of the exporter: every suffix the runner writes, its type and its
//! `# HELP` text, the timing observations, and the legacy aliases.
//!
//! The runner's registry (`svc_snapshot`) is the source of the names; a unit test keeps this
//! table in step with it. Names the snapshot carries but this table does not know (a newer
//! runner) are still exportable when the policy allows them, with a generic HELP text.

use svc_snapshot::{Counters, SUMMARY_NAMES};

/// Exposition type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Counter,
    Gauge,
    /// Rendered as a Prometheus summary (`_count`, `_sum`) plus `_min`, `_max`, `_last` gauges.
    Summary,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Summary => "summary",
        }
    }
}

/// A metric the runner writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    pub suffix: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

const fn c(suffix: &'static str, help: &'static str) -> Known {
    Known {
        suffix,
        kind: Kind::Counter,
        help,
    }
}

/// Every metric of the runner, in the order `list-metrics` prints them.
pub const KNOWN: &[Known] = &[
    c(
        "messages_fetched_total",
        "Messages received from the broker.",
    ),
    c(
        "messages_prepared_total",
        "Messages normalized into envelopes and handed to the sink.",
    ),
    c(
        "messages_written_total",
        "Messages the sink reported durable.",
    ),
    c(
        "messages_acked_total",
        "Messages acknowledged after durable success or DLQ success.",
    ),
    c(
        "messages_terminated_total",
        "Messages terminated after the configured delivery limit.",
    ),
    c(
        "messages_nacked_total",
        "Negative acknowledgements sent for redelivery.",
    ),
    c(
        "messages_failed_total",
        "Messages whose processing failed permanently.",
    ),
    c(
        "messages_dlq_total",
        "Messages published to the dead-letter subject and confirmed.",
    ),
    c(
        "dlq_publish_errors_total",
        "Dead-letter publishes that failed or were not confirmed; the message stays unacknowledged.",
    ),
    c(
        "checkpoint_gap_waits_total",
        "Deliveries of messages given up on, NAKed until a custody checkpoint lists their gap.",
    ),
    c(
        "checkpoint_gaps_settled_unsigned_total",
        "Messages given up on and settled before a custody checkpoint listed their gap (store failing with the hold full, a read-back, or the consumer's last delivery).",
    ),
    c(
        "checkpoint_records_untold_total",
        "Committed records not told to the custody checkpoint thread (its channel full); signed after its read-back of the store.",
    ),
    c(
        "checkpoint_gaps_unlisted_total",
        "Runner-caused gaps no custody checkpoint lists (the channel and the gaps kept aside full, or past what a failed stop keeps); the log names each sequence.",
    ),
    c(
        "messages_in_progress_total",
        "In-progress acknowledgements sent to extend the ack wait of long batches.",
    ),
    c(
        "ack_confirmations_total",
        "Acknowledgements the broker confirmed having processed (delivery.ack_confirmation).",
    ),
    c(
        "acks_resent_total",
        "Acknowledgements sent again because no confirmation came in time.",
    ),
    c(
        "ack_confirmations_abandoned_total",
        "Acknowledgements given up unconfirmed; the broker redelivers what they did not settle.",
    ),
    c(
        "sink_permanent_failures_total",
        "Sink writes that failed permanently, counted per message and delivery.",
    ),
    c(
        "sink_write_errors_total",
        "Sink write failures, counted per message.",
    ),
    c(
        "sink_retries_total",
        "In-sink retries of single writes (object store: timeouts, 5xx, 409 conflicts).",
    ),
    c(
        "events_stale_at_receive_total",
        "Events older than the configured staleness bound when received.",
    ),
    c(
        "events_missing_publisher_timestamp_total",
        "Events without a publisher timestamp header.",
    ),
    c(
        "events_malformed_timestamp_total",
        "Events whose publisher timestamp header could not be parsed.",
    ),
    c(
        "events_source_clock_skew_total",
        "Events whose source time lies in the future of the runner's clock.",
    ),
    c(
        "events_implausible_time_total",
        "Events whose event time lies far from the broker's store time (left out of event ages).",
    ),
    c(
        "db_duplicates_total",
        "Rows whose idempotency key the relational sink already held (every duplicate detected).",
    ),
    c(
        "db_duplicate_ignored_total",
        "Duplicate rows confirmed as the same event and ignored without error.",
    ),
    c(
        "broker_connection_disconnects_total",
        "Connections lost to the broker.",
    ),
    c(
        "broker_connection_reconnects_total",
        "Connections re-established to the broker.",
    ),
    c(
        "broker_connection_errors_total",
        "Asynchronous connection errors reported by the broker client.",
    ),
    c(
        "fanout_messages_routed_total",
        "Fan-out: messages routed to at least one child sink.",
    ),
    c(
        "fanout_messages_ignored_total",
        "Fan-out: messages no route matched, acknowledged and stored nowhere (no_match: ignore).",
    ),
    c(
        "fanout_child_sinks_selected_total",
        "Fan-out: child sinks selected, summed over messages.",
    ),
    c(
        "fanout_required_child_success_total",
        "Fan-out: required child writes that succeeded.",
    ),
    c(
        "fanout_required_child_failure_total",
        "Fan-out: required child writes that failed and blocked the acknowledgement.",
    ),
    c(
        "fanout_optional_child_timeout_total",
        "Fan-out: optional child writes that did not finish within their timeout.",
    ),
    c(
        "fanout_optional_child_failure_total",
        "Fan-out: optional child writes that failed.",
    ),
    c(
        "fanout_messages_acked_total",
        "Fan-out: messages released by the acknowledgement gate.",
    ),
    c(
        "fanout_messages_ack_blocked_total",
        "Fan-out: messages held back by the acknowledgement gate.",
    ),
    c(
        "advisory_max_deliveries_total",
        "Broker advisories seen: maximum deliveries reached.",
    ),
    c(
        "advisory_terminated_total",
        "Broker advisories seen: message terminated.",
    ),
    c(
        "advisory_nak_total",
        "Broker advisories seen: negative acknowledgement.",
    ),
    c(
        "authenticity_verified_total",
        "Messages whose publisher signature verified.",
    ),
    c(
        "authenticity_unsigned_total",
        "Messages without a signature on a subject that does not require one.",
    ),
    c(
        "authenticity_missing_signature_total",
        "Messages refused: no signature where the subject requires one.",
    ),
    c(
        "authenticity_malformed_signature_total",
        "Messages refused: incomplete, repeated or undecodable signature headers.",
    ),
    c(
        "authenticity_disallowed_algorithm_total",
        "Messages refused: signature algorithm not allowed for the subject.",
    ),
    c(
        "authenticity_unknown_key_total",
        "Messages refused: signing key id unknown or not allowed for the subject.",
    ),
    c(
        "authenticity_bad_signature_total",
        "Messages refused: the signature does not verify.",
    ),
    c("payload_encrypted_total", "Payloads encrypted at rest."),
    c(
        "payload_encryption_clear_total",
        "Payloads left in clear by a payload-encryption clear rule or default.",
    ),
    c(
        "payload_encryption_refused_total",
        "Messages left unacknowledged: the active encryption key reached its message bound.",
    ),
    c(
        "custody_sealed_total",
        "Records sealed with a custody evidence block.",
    ),
    c(
        "mission_metadata_attached_total",
        "Records given a mission metadata object.",
    ),
    c(
        "mission_metadata_rejected_total",
        "Messages refused by the mission metadata stage (dead-lettered).",
    ),
    c(
        "pre_sink_policy_rejected_total",
        "Messages refused by the pre-sink policy (dead-lettered).",
    ),
    c(
        "size_policy_rejected_total",
        "Messages refused by a size policy bound (dead-lettered).",
    ),
    c(
        "mission_metadata_duplicate_header_total",
        "Messages refused by the mission metadata stage with reason duplicate_header.",
    ),
    c(
        "mission_metadata_header_too_large_total",
        "Messages refused by the mission metadata stage with reason header_too_large.",
    ),
    c(
        "mission_metadata_invalid_json_total",
        "Messages refused by the mission metadata stage with reason invalid_json.",
    ),
    c(
        "mission_metadata_duplicate_key_total",
        "Messages refused by the mission metadata stage with reason duplicate_key.",
    ),
    c(
        "mission_metadata_not_object_total",
        "Messages refused by the mission metadata stage with reason not_object.",
    ),
    c(
        "mission_metadata_control_character_total",
        "Messages refused by the mission metadata stage with reason control_character.",
    ),
    c(
        "mission_metadata_nul_character_total",
        "Messages refused by the mission metadata stage with reason nul_character.",
    ),
    c(
        "mission_metadata_too_deep_total",
        "Messages refused by the mission metadata stage with reason too_deep.",
    ),
    c(
        "mission_metadata_too_large_total",
        "Messages refused by the mission metadata stage with reason too_large.",
    ),
    c(
        "mission_metadata_missing_profile_total",
        "Messages refused by the mission metadata stage with reason missing_profile.",
    ),
    c(
        "mission_metadata_wrong_type_total",
        "Messages refused by the mission metadata stage with reason wrong_type.",
    ),
    c(
        "mission_metadata_unknown_profile_total",
        "Messages refused by the mission metadata stage with reason unknown_profile.",
    ),
    c(
        "mission_metadata_profile_not_allowed_total",
        "Messages refused by the mission metadata stage with reason profile_not_allowed.",
    ),
    c(
        "mission_metadata_missing_field_total",
        "Messages refused by the mission metadata stage with reason missing_field.",
    ),
    c(
        "mission_metadata_out_of_bounds_total",
        "Messages refused by the mission metadata stage with reason out_of_bounds.",
    ),
    c(
        "mission_metadata_unknown_field_total",
        "Messages refused by the mission metadata stage with reason unknown_field.",
    ),
    c(
        "pre_sink_policy_unmatched_subject_total",
        "Messages refused by the pre-sink policy with reason unmatched_subject.",
    ),
    c(
        "pre_sink_policy_priority_not_allowed_total",
        "Messages refused by the pre-sink policy with reason priority_not_allowed.",
    ),
    c(
        "pre_sink_policy_classification_not_allowed_total",
        "Messages refused by the pre-sink policy with reason classification_not_allowed.",
    ),
    c(
        "pre_sink_policy_missing_required_label_total",
        "Messages refused by the pre-sink policy with reason missing_required_label.",
    ),
    c(
        "pre_sink_policy_missing_mission_metadata_total",
        "Messages refused by the pre-sink policy with reason missing_mission_metadata.",
    ),
    c(
        "pre_sink_policy_payload_not_encrypted_total",
        "Messages refused by the pre-sink policy with reason payload_not_encrypted.",
    ),
    c(
        "pre_sink_policy_policy_payload_too_large_total",
        "Messages refused by the pre-sink policy with reason policy_payload_too_large.",
    ),
    c(
        "pre_sink_policy_mission_metadata_key_not_allowed_total",
        "Messages refused by the pre-sink policy with reason mission_metadata_key_not_allowed.",
    ),
    c(
        "size_policy_payload_too_large_total",
        "Messages refused by the size policy with reason payload_too_large.",
    ),
    c(
        "size_policy_too_many_headers_total",
        "Messages refused by the size policy with reason too_many_headers.",
    ),
    c(
        "size_policy_header_name_too_long_total",
        "Messages refused by the size policy with reason header_name_too_long.",
    ),
    c(
        "size_policy_header_value_too_long_total",
        "Messages refused by the size policy with reason header_value_too_long.",
    ),
    c(
        "size_policy_headers_too_large_total",
        "Messages refused by the size policy with reason headers_too_large.",
    ),
    c(
        "size_policy_too_many_labels_total",
        "Messages refused by the size policy with reason too_many_labels.",
    ),
    c(
        "size_policy_labels_too_large_total",
        "Messages refused by the size policy with reason labels_too_large.",
    ),
    c(
        "size_policy_mission_metadata_too_large_total",
        "Messages refused by the size policy with reason mission_metadata_too_large.",
    ),
    c(
        "size_policy_record_too_large_total",
        "Messages refused by the size policy with reason record_too_large.",
    ),
    c(
        "http_requests_2xx_total",
        "HTTP sink: requests answered with a 2xx status.",
    ),
    c(
        "http_requests_3xx_total",
        "HTTP sink: requests answered with a 3xx status (redirects are never followed).",
    ),
    c(
        "http_sink_unusable_total",
        "HTTP sink: requests answered with a status that refuses the sink itself (401, 403, \
         404, 407, a redirect); their messages are NAKed, never dead-lettered.",
    ),
    c(
        "http_requests_4xx_total",
        "HTTP sink: requests answered with a 4xx status.",
    ),
    c(
        "http_requests_5xx_total",
        "HTTP sink: requests answered with a 5xx status.",
    ),
    c(
        "http_request_failures_total",
        "HTTP sink: requests without an answer (timeout, connection or TLS failure).",
    ),
    c(
        "http_retries_total",
        "HTTP sink: requests sent again within the batch's retry budget.",
    ),
    c(
        "http_retry_after_waits_total",
        "HTTP sink: retries that waited as the receiver's Retry-After asked.",
    ),
    c(
        "http_request_bytes_total",
        "HTTP sink: request body bytes sent, after gzip, retries included.",
    ),
    c(
        "spool_appended_total",
        "Spool: records appended (fsynced) instead of being written to the sink directly.",
    ),
    c(
        "spool_drained_total",
        "Spool: records the drain delivered and the sink confirmed.",
    ),
    c(
        "spool_quarantined_total",
        "Spool: damaged stretches of a segment moved to a quarantine file.",
    ),
    c(
        "spool_full_refusals_total",
        "Spool: records refused because the spool was full (left to the broker).",
    ),
    c(
        "spool_rejected_total",
        "Spool: records the sink refused for good while draining (kept in a rejected file).",
    ),
    c(
        "spool_drain_errors_total",
        "Spool: drain steps that failed on the spool's side; the drain does not move past them.",
    ),
    Known {
        suffix: "spool_records",
        kind: Kind::Gauge,
        help: "Spool: records waiting to be drained.",
    },
    Known {
        suffix: "spool_bytes",
        kind: Kind::Gauge,
        help: "Spool: bytes of its segment files.",
    },
    Known {
        suffix: "spool_oldest_record_epoch_seconds",
        kind: Kind::Gauge,
        help: "Spool: Unix time the oldest waiting record was appended (0 when empty).",
    },
    Known {
        suffix: "spool_mode",
        kind: Kind::Gauge,
        help: "Spool: 0 direct delivery, 1 spooling (the sink does not answer), 2 draining.",
    },
    Known {
        suffix: "last_sink_success_epoch_seconds",
        kind: Kind::Gauge,
        help: "Unix time of the last successful sink batch write (0 before the first).",
    },
    Known {
        suffix: "sink_batch_write_seconds",
        kind: Kind::Summary,
        help: "Time inside the sink's batch write for successful batches, in seconds.",
    },
    Known {
        suffix: "event_age_at_receive_seconds",
        kind: Kind::Summary,
        help: "Event age when the runner received the message, in seconds.",
    },
    Known {
        suffix: "event_age_at_store_seconds",
        kind: Kind::Summary,
        help: "Event age when the sink reported the message durable, in seconds.",
    },
    Known {
        suffix: "fanout_ack_gate_wait_seconds",
        kind: Kind::Summary,
        help: "Time spent waiting at the fan-out acknowledgement gate, in seconds.",
    },
    Known {
        suffix: "http_request_seconds",
        kind: Kind::Summary,
        help: "HTTP sink: time of one request until its answer was read, in seconds.",
    },
    Known {
        suffix: "http_retry_after_wait_seconds",
        kind: Kind::Summary,
        help: "HTTP sink: waits before a retry that honoured Retry-After, in seconds.",
    },
    Known {
        suffix: "ack_confirmation_seconds",
        kind: Kind::Summary,
        help: "Confirmed ACKs: time from the first send of an ACK to the broker's confirmation, in seconds.",
    },
];

/// A legacy alias: an older name kept for dashboards written against earlier releases. It is
/// rendered (with the target's value and type) only when `include_legacy` is true, the alias
/// itself is allowed, and neither the alias nor its target is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegacyAlias {
    pub alias: &'static str,
    pub target: &'static str,
}

/// The legacy aliases (documented in `docs/observe.md`, "Legacy aliases").
pub const LEGACY_ALIASES: &[LegacyAlias] = &[
    LegacyAlias {
        alias: "messages_received_total",
        target: "messages_fetched_total",
    },
    LegacyAlias {
        alias: "messages_processed_total",
        target: "messages_acked_total",
    },
    LegacyAlias {
        alias: "messages_dead_lettered_total",
        target: "messages_dlq_total",
    },
    LegacyAlias {
        alias: "sink_errors_total",
        target: "sink_write_errors_total",
    },
    LegacyAlias {
        alias: "last_success_epoch_seconds",
        target: "last_sink_success_epoch_seconds",
    },
];

/// Timing observations (spec: `sink_batch_write_seconds`, `event_age_*`,
/// `fanout_ack_gate_wait_seconds`): exported only with `include_observations`. Every summary
/// is an observation, whatever its name; the named families are observations even if a newer
/// snapshot carried them in another section.
pub fn is_observation(suffix: &str, kind: Kind) -> bool {
    kind == Kind::Summary
        || suffix == "sink_batch_write_seconds"
        || suffix.starts_with("event_age_")
        || suffix == "fanout_ack_gate_wait_seconds"
}

pub fn known(suffix: &str) -> Option<&'static Known> {
    KNOWN.iter().find(|k| k.suffix == suffix)
}

pub fn alias(name: &str) -> Option<&'static LegacyAlias> {
    LEGACY_ALIASES.iter().find(|a| a.alias == name)
}

/// HELP text of a suffix; a generic one for names this release does not know.
pub fn help(suffix: &str) -> String {
    match known(suffix) {
        Some(k) => k.help.to_string(),
        None => format!("Runner metric {suffix}."),
    }
}

/// Every suffix a policy may allow: the runner's metrics, then the legacy aliases.
pub fn allowable_names() -> Vec<&'static str> {
    KNOWN
        .iter()
        .map(|k| k.suffix)
        .chain(LEGACY_ALIASES.iter().map(|a| a.alias))
        .collect()
}

/// Keeps the catalogue honest: every name the runner can write is described here.
pub fn runner_names() -> impl Iterator<Item = &'static str> {
    Counters::NAMES
        .iter()
        .chain(SUMMARY_NAMES.iter())
        .copied()
        .chain(std::iter::once("last_sink_success_epoch_seconds"))
        .chain(svc_snapshot::SPOOL_GAUGE_NAMES.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_covers_the_runner() {
        for name in runner_names() {
            assert!(known(name).is_some(), "{name} missing from the catalogue");
        }
        for k in KNOWN {
            assert!(svc_document::grammar::is_metric_name(k.suffix));
            assert_eq!(
                k.kind == Kind::Counter,
                k.suffix.ends_with("_total"),
                "{}",
                k.suffix
            );
            assert!(!k.help.contains('\n') && !k.help.contains('\\'));
        }
    }

    #[test]
    fn aliases_point_at_known_non_observations() {
        for a in LEGACY_ALIASES {
            let t = known(a.target).expect("alias target is a runner metric");
            assert!(
                known(a.alias).is_none(),
                "{} shadows a real metric",
                a.alias
            );
            assert!(!is_observation(t.suffix, t.kind));
            assert_eq!(t.kind == Kind::Counter, a.alias.ends_with("_total"));
        }
    }

    #[test]
    fn observations() {
        assert!(is_observation("sink_batch_write_seconds", Kind::Summary));
        assert!(is_observation("event_age_at_store_seconds", Kind::Gauge));
        assert!(is_observation("anything", Kind::Summary));
        assert!(!is_observation("messages_acked_total", Kind::Counter));
        assert!(!is_observation(
            "events_stale_at_receive_total",
            Kind::Counter
        ));
    }
}
