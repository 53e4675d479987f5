//! `svc-normalize`: raw deliveries in, envelopes (or pre-sink verdicts) out. No I/O.
//!
//! Per message: the input limits (`message::limits`: header count and bytes, U+0000 in what
//! sinks store as text) and the size policy's input bounds (`size_policy`: payload, headers),
//! the publisher signature (`authenticity`), the envelope (`normalize`), the
//! message metadata (`message_metadata`: priority, classification, labels), the security
//! label profile (`security_labels`), the mission metadata (`mission_metadata`), the size
//! policy's label and mission metadata bounds, the pre-sink policy (`pre_sink_policy`: it
//! needs metadata, labels, mission metadata and whether the payload will be encrypted), then
//! payload encryption (`payload_encryption`) and custody evidence (`custody`) over the record
//! as the sinks will store it, and last the size policy's bound on that record's bytes.
//! The governance stages run before encryption so a refused message uses no encryption key
//! budget; only the record bound, which needs the final bytes, runs after.
//! A limit, signature, metadata, profile or governance failure is a permanent pre-sink failure: the message does
//! not reach the sink; its verdict carries a value-free reason and, when a DLQ is configured,
//! the sanitized DLQ record for `svc-ack` to publish. An encryption key at its message bound
//! is a transient failure (the message stays unacknowledged until the key is rotated). Other
//! messages of the batch are unaffected.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::{Monitor, Prepared, PreparedBatch, RawBatch, Rejection};
use crate::broker::dead_letter::{DeadLetter, DeadLetterConfig, Failure};
use crate::config::RuntimeConfig;
use crate::message::envelope::{
    normalize, now_unix_nanos, Envelope, EnvelopeConfig, Freshness, RawMessage,
};
use crate::message::labels::{self, SecurityLabelsConfig};
use crate::message::limits;
use crate::message::metadata::MessageMetadataConfig;
use crate::message::mission::MissionMetadataConfig;
use crate::message::policy::PreSinkPolicyConfig;
use crate::message::protection::authenticity::{AuthFailure, AuthOutcome};
use crate::message::protection::Protection;
use crate::message::refusal::Refusal;
use crate::message::size_policy::SizePolicyConfig;
use crate::metrics::{Metrics, Summary};

/// Everything needed to turn one delivery into an envelope.
pub struct Normalizer {
    envelope: EnvelopeConfig,
    message_metadata: MessageMetadataConfig,
    security_labels: SecurityLabelsConfig,
    mission_metadata: MissionMetadataConfig,
    pre_sink_policy: PreSinkPolicyConfig,
    size_policy: SizePolicyConfig,
    dead_letter: DeadLetterConfig,
    protection: Arc<Protection>,
    metrics: Arc<Metrics>,
}

impl Normalizer {
    pub fn new(
        cfg: &RuntimeConfig,
        protection: Arc<Protection>,
        metrics: Arc<Metrics>,
    ) -> Normalizer {
        Normalizer {
            protection,
            envelope: cfg.envelope.clone(),
            message_metadata: cfg.message_metadata.clone(),
            security_labels: cfg.security_labels.clone(),
            mission_metadata: cfg.mission_metadata.clone(),
            pre_sink_policy: cfg.pre_sink_policy.clone(),
            size_policy: cfg.size_policy.clone(),
            dead_letter: cfg.dead_letter.clone(),
            metrics,
        }
    }

    /// Builds the envelope of one message and records its freshness (the age into `ages`,
    /// which the caller hands to the metrics once per batch).
    pub fn prepare(
        &self,
        raw: &RawMessage,
        received_unix_nanos: i128,
        family: Option<usize>,
        ages: &mut Summary,
    ) -> Result<Prepared, Rejection> {
        self.admit(raw)?;
        let (mut envelope, fresh) = normalize(raw, received_unix_nanos, &self.envelope);
        if let Some(age) = fresh.age_seconds {
            ages.observe(age);
        }
        count_freshness(&self.metrics.counters, &fresh);
        self.govern(raw, &mut envelope)?;
        self.protect(raw, &mut envelope)?;
        self.bound_record(raw, &envelope)?;
        if envelope.mission_metadata.is_some() {
            Metrics::add(&self.metrics.counters.mission_metadata_attached_total, 1);
        }
        Ok(Prepared {
            family,
            envelope,
            source_unix_nanos: fresh.source_unix_nanos,
        })
    }

    /// What the message itself brings, before any envelope: the input limits, the size
    /// policy's input bounds, the publisher signature.
    fn admit(&self, raw: &RawMessage) -> Result<(), Rejection> {
        let c = &self.metrics.counters;
        if let Err(limit) = limits::check(raw, &self.envelope.keep_headers) {
            return Err(self.reject(
                raw,
                Failure::new("input", limit.field(), limit.code(), limit.to_string()),
            ));
        }
        if let Err(r) = self.size_policy.check_input(raw) {
            return Err(self.refuse(raw, &r));
        }
        match self.protection.authenticate(raw) {
            Ok(None) => {}
            Ok(Some(AuthOutcome::Verified(_))) => Metrics::add(&c.authenticity_verified_total, 1),
            Ok(Some(AuthOutcome::Unsigned)) => Metrics::add(&c.authenticity_unsigned_total, 1),
            Err(f) => {
                Metrics::add(auth_counter(c, f), 1);
                return Err(self.reject(
                    raw,
                    Failure::new("authenticity", "authenticity", f.code(), f.to_string()),
                ));
            }
        }
        Ok(())
    }

    /// The governance stages on the envelope: message metadata, security labels, mission
    /// metadata, the size policy's envelope bounds, the pre-sink policy.
    fn govern(&self, raw: &RawMessage, envelope: &mut Envelope) -> Result<(), Rejection> {
        let mut meta = self
            .message_metadata
            .resolve(raw)
            .map_err(|e| self.reject(raw, Failure::from(&e)))?;
        self.security_labels.spell_metadata(&mut meta);
        if !meta.fell_back.is_empty() {
            let fields: Vec<&str> = meta.fell_back.iter().map(|f| f.as_str()).collect();
            log::warn!(
                "stream sequence {}: invalid message_metadata header for {} replaced by the \
                 rule or default value (on_invalid = use_default)",
                raw.stream_sequence,
                fields.join(", ")
            );
        }
        let profile = self
            .security_labels
            .resolve(raw, &meta)
            .map_err(|r| self.reject(raw, Failure::from(&r)))?;
        meta.apply_to(envelope);
        labels::apply_to(envelope, profile);
        let (mission, mission_bytes) = self
            .mission_metadata
            .resolve_measured(raw)
            .map_err(|r| self.refuse(raw, &r))?
            .map_or((None, None), |(v, size)| (Some(v), size));
        envelope.mission_metadata = mission;
        self.size_policy
            .check_envelope(envelope, mission_bytes)
            .map_err(|r| self.refuse(raw, &r))?;
        if self.pre_sink_policy.enabled {
            // Matched against the encryption rules only when a policy may ask.
            let will_encrypt = self
                .protection
                .encryptor
                .as_ref()
                .is_some_and(|e| e.applies_to(&raw.subject));
            self.pre_sink_policy
                .check(envelope, will_encrypt)
                .map_err(|r| self.refuse(raw, &r))?;
        }
        Ok(())
    }

    /// Payload encryption and custody evidence; a key at its message bound leaves the
    /// message for redelivery (`retry`), never for the DLQ.
    fn protect(&self, raw: &RawMessage, envelope: &mut Envelope) -> Result<(), Rejection> {
        let c = &self.metrics.counters;
        match self.protection.protect(envelope, raw, now_unix_nanos()) {
            Ok(encrypted) => {
                if encrypted {
                    Metrics::add(&c.payload_encrypted_total, 1);
                } else if self.protection.encryptor.is_some() {
                    Metrics::add(&c.payload_encryption_clear_total, 1);
                }
                if self.protection.custodian.is_some() {
                    Metrics::add(&c.custody_sealed_total, 1);
                }
                Ok(())
            }
            Err(e) => {
                Metrics::add(&c.payload_encryption_refused_total, 1);
                log::error!("stream sequence {}: {e}", raw.stream_sequence);
                Err(Rejection {
                    reason: e.to_string(),
                    dead_letter: None,
                    retry: true,
                    at: at(raw),
                    gap: super::GapReason::RefusedBeforeSink,
                })
            }
        }
    }

    /// The size policy's bound on the record's bytes, as the sinks will store it.
    fn bound_record(&self, raw: &RawMessage, envelope: &Envelope) -> Result<(), Rejection> {
        if self.size_policy.bounds_record() {
            let mut record = Vec::with_capacity(1024 + envelope.payload.json().len());
            // An envelope the encoder refuses is left to the sink, which refuses it the same way.
            if crate::message::record::encode_record(&mut record, envelope).is_ok() {
                self.size_policy
                    .check_record_bytes(record.len() as u64)
                    .map_err(|r| self.refuse(raw, &r))?;
            }
        }
        Ok(())
    }

    /// A governance stage's refusal: counted per stage, then a permanent pre-sink failure.
    fn refuse(&self, raw: &RawMessage, r: &Refusal) -> Rejection {
        let c = &self.metrics.counters;
        let counter = match r.stage {
            crate::message::mission::STAGE => &c.mission_metadata_rejected_total,
            crate::message::policy::STAGE => &c.pre_sink_policy_rejected_total,
            _ => &c.size_policy_rejected_total,
        };
        Metrics::add(counter, 1);
        if let Some(reason) = reason_counter(c, r.stage, r.code()) {
            Metrics::add(reason, 1);
        }
        self.reject(raw, Failure::from(r))
    }

    /// The verdict of a permanent pre-sink failure, with its DLQ record when a DLQ is on.
    fn reject(&self, raw: &RawMessage, failure: Failure) -> Rejection {
        Rejection {
            dead_letter: self.dead_letter.enabled.then(|| {
                DeadLetter::build_with_digest(
                    raw,
                    &failure,
                    now_unix_nanos(),
                    &self.dead_letter,
                    self.protection.dlq_payload_digest(raw),
                )
            }),
            reason: failure.message,
            retry: false,
            at: at(raw),
            gap: super::GapReason::RefusedBeforeSink,
        }
    }
}

/// Where a refused message is from, for [`Rejection::at`].
fn at(raw: &RawMessage) -> Arc<(crate::sink::checkpoint::Origin, u64)> {
    let origin = (Arc::clone(&raw.stream), Arc::clone(&raw.stream_incarnation));
    Arc::new((origin, raw.stream_sequence))
}

/// The per-reason counter of a governance refusal; `None` for a code this table lacks (a
/// test holds it complete).
fn reason_counter<'c>(
    c: &'c crate::metrics::Counters,
    stage: &str,
    code: &str,
) -> Option<&'c std::sync::atomic::AtomicU64> {
    use crate::message::{mission, policy, size_policy as size};
    Some(match (stage, code) {
        (mission::STAGE, "duplicate_header") => &c.mission_metadata_duplicate_header_total,
        (mission::STAGE, "header_too_large") => &c.mission_metadata_header_too_large_total,
        (mission::STAGE, "invalid_json") => &c.mission_metadata_invalid_json_total,
        (mission::STAGE, "duplicate_key") => &c.mission_metadata_duplicate_key_total,
        (mission::STAGE, "not_object") => &c.mission_metadata_not_object_total,
        (mission::STAGE, "control_character") => &c.mission_metadata_control_character_total,
        (mission::STAGE, "nul_character") => &c.mission_metadata_nul_character_total,
        (mission::STAGE, "too_deep") => &c.mission_metadata_too_deep_total,
        (mission::STAGE, "too_large") => &c.mission_metadata_too_large_total,
        (mission::STAGE, "missing_profile") => &c.mission_metadata_missing_profile_total,
        (mission::STAGE, "wrong_type") => &c.mission_metadata_wrong_type_total,
        (mission::STAGE, "unknown_profile") => &c.mission_metadata_unknown_profile_total,
        (mission::STAGE, "profile_not_allowed") => &c.mission_metadata_profile_not_allowed_total,
        (mission::STAGE, "missing_field") => &c.mission_metadata_missing_field_total,
        (mission::STAGE, "out_of_bounds") => &c.mission_metadata_out_of_bounds_total,
        (mission::STAGE, "unknown_field") => &c.mission_metadata_unknown_field_total,
        (policy::STAGE, "unmatched_subject") => &c.pre_sink_policy_unmatched_subject_total,
        (policy::STAGE, "priority_not_allowed") => &c.pre_sink_policy_priority_not_allowed_total,
        (policy::STAGE, "classification_not_allowed") => {
            &c.pre_sink_policy_classification_not_allowed_total
        }
        (policy::STAGE, "missing_required_label") => {
            &c.pre_sink_policy_missing_required_label_total
        }
        (policy::STAGE, "missing_mission_metadata") => {
            &c.pre_sink_policy_missing_mission_metadata_total
        }
        (policy::STAGE, "payload_not_encrypted") => &c.pre_sink_policy_payload_not_encrypted_total,
        (policy::STAGE, "policy_payload_too_large") => {
            &c.pre_sink_policy_policy_payload_too_large_total
        }
        (policy::STAGE, "mission_metadata_key_not_allowed") => {
            &c.pre_sink_policy_mission_metadata_key_not_allowed_total
        }
        (size::STAGE, "payload_too_large") => &c.size_policy_payload_too_large_total,
        (size::STAGE, "too_many_headers") => &c.size_policy_too_many_headers_total,
        (size::STAGE, "header_name_too_long") => &c.size_policy_header_name_too_long_total,
        (size::STAGE, "header_value_too_long") => &c.size_policy_header_value_too_long_total,
        (size::STAGE, "headers_too_large") => &c.size_policy_headers_too_large_total,
        (size::STAGE, "too_many_labels") => &c.size_policy_too_many_labels_total,
        (size::STAGE, "labels_too_large") => &c.size_policy_labels_too_large_total,
        (size::STAGE, "mission_metadata_too_large") => {
            &c.size_policy_mission_metadata_too_large_total
        }
        (size::STAGE, "record_too_large") => &c.size_policy_record_too_large_total,
        _ => return None,
    })
}

/// Counts the freshness findings of one message.
fn count_freshness(c: &crate::metrics::Counters, fresh: &Freshness) {
    for (flag, counter) in [
        (fresh.stale, &c.events_stale_at_receive_total),
        (
            fresh.missing_publisher_timestamp,
            &c.events_missing_publisher_timestamp_total,
        ),
        (
            fresh.malformed_timestamp,
            &c.events_malformed_timestamp_total,
        ),
        (fresh.clock_skew, &c.events_source_clock_skew_total),
        (
            fresh.implausible_event_time,
            &c.events_implausible_time_total,
        ),
    ] {
        if flag {
            Metrics::add(counter, 1);
        }
    }
}

/// The counter of one authenticity failure reason.
fn auth_counter(c: &crate::metrics::Counters, f: AuthFailure) -> &std::sync::atomic::AtomicU64 {
    match f {
        AuthFailure::MissingSignature => &c.authenticity_missing_signature_total,
        AuthFailure::MalformedSignature => &c.authenticity_malformed_signature_total,
        AuthFailure::DisallowedAlgorithm => &c.authenticity_disallowed_algorithm_total,
        AuthFailure::UnknownKey => &c.authenticity_unknown_key_total,
        AuthFailure::BadSignature => &c.authenticity_bad_signature_total,
    }
}

pub fn run(
    normalizer: Normalizer,
    rx: Receiver<RawBatch>,
    tx: Sender<PreparedBatch>,
    monitor: Arc<Monitor>,
) {
    loop {
        monitor.activity("waiting for batches");
        let Ok(batch) = rx.recv() else { break };
        monitor.activity("normalizing");
        let mut ages = Summary::default();
        let items = batch
            .messages
            .iter()
            .zip(&batch.families)
            .map(|((raw, received), family)| {
                normalizer
                    .prepare(raw, *received, *family, &mut ages)
                    .map_err(|f| (f, *family))
            })
            .collect::<Vec<_>>();
        normalizer
            .metrics
            .observe_all(crate::metrics::SummaryMetric::EventAgeAtReceive, &ages);
        let prepared = items.iter().filter(|i| i.is_ok()).count() as u64;
        Metrics::add(
            &normalizer.metrics.counters.messages_prepared_total,
            prepared,
        );
        // The raw messages are not needed any more: freed before a wait for a sink worker,
        // so a full pipeline holds each payload once, not twice.
        let id = batch.id;
        drop(batch);
        monitor.activity("handing batch to sink workers");
        if tx.send(PreparedBatch { id, items }).is_err() {
            log::error!("sink workers stopped unexpectedly; svc-normalize exits");
            break;
        }
    }
    monitor.activity("stopped");
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use base64::Engine as _;
    use ring::signature::{Ed25519KeyPair, KeyPair};

    use super::*;
    use crate::message::protection::authenticity::signed_bytes;

    const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

    /// A normalizer with all three protections (Ed25519 signatures required everywhere,
    /// encryption bounded to `max` records, keyed custody) and a DLQ.
    fn normalizer(dir: &std::path::Path, max: u64) -> (Normalizer, Arc<Metrics>) {
        let key = dir.join("k1");
        std::fs::write(&key, B64.encode([5u8; 32])).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let pair = Ed25519KeyPair::from_seed_unchecked(&[1; 32]).unwrap();
        let mut cfg = RuntimeConfig::parse(
            &serde_json::json!({
                "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
                "sink": {"type": "file", "directory": dir.join("out")},
                "dead_letter": {"enabled": true, "subject": "dlq"},
                "payload_encryption": {"enabled": true, "keys": [{"key_id": "k1", "key_file": key}],
                                       "active_key_id": "k1", "max_messages_per_key": max},
                "authenticity": {"enabled": true, "default_required": true,
                                 "keys": [{"key_id": "ed1",
                                           "public_key_b64": B64.encode(pair.public_key().as_ref())}]},
                "custody": {"enabled": true, "runner_id": "r1",
                            "hmac_key_env": "SVC_NORMALIZE_TEST_CUSTODY_KEY"}
            })
            .to_string(),
        )
        .unwrap();
        // The custody key comes from a file rather than the variable the config names: the
        // test threads share the process environment, so no test sets a variable in it.
        let custody_key = dir.join("custody");
        std::fs::write(&custody_key, B64.encode([6u8; 32])).unwrap();
        std::fs::set_permissions(&custody_key, std::fs::Permissions::from_mode(0o600)).unwrap();
        cfg.custody.hmac_key = Some(crate::message::protection::keys::KeySource::File(
            custody_key,
        ));
        let p = Protection::load(&cfg.payload_encryption, &cfg.authenticity, &cfg.custody).unwrap();
        let metrics = Arc::new(Metrics::default());
        (Normalizer::new(&cfg, Arc::new(p), metrics.clone()), metrics)
    }

    fn raw(seq: u64, signed: bool) -> RawMessage {
        let data = br#"{"secret":"PLAINTEXT"}"#.to_vec();
        let mut headers = vec![];
        if signed {
            let pair = Ed25519KeyPair::from_seed_unchecked(&[1; 32]).unwrap();
            let sig = pair.sign(&signed_bytes(None, &data, "o.x"));
            headers = vec![
                ("Svc-Signature-Alg".to_string(), "ed25519".to_string()),
                ("Svc-Signature-Key-Id".to_string(), "ed1".to_string()),
                ("Svc-Signature".to_string(), B64.encode(sig.as_ref())),
            ];
        }
        RawMessage {
            stream_incarnation: Default::default(),
            subject: "o.x".into(),
            stream: "S".into(),
            consumer: "c".into(),
            stream_sequence: seq,
            consumer_sequence: seq,
            delivery_count: 1,
            published_unix_nanos: None,
            headers,
            data,
            unreadable: None,
            header_block: Default::default(),
        }
    }

    #[test]
    fn signed_messages_are_encrypted_and_sealed_unsigned_ones_dead_lettered() {
        let dir = tempfile::tempdir().unwrap();
        let (n, metrics) = normalizer(dir.path(), 10);
        let mut ages = Summary::default();
        let p = n.prepare(&raw(1, true), 0, None, &mut ages).unwrap();
        let text = serde_json::to_string(&p.envelope).unwrap();
        assert!(!text.contains("PLAINTEXT"), "{text}");
        assert!(text.contains("svc.encrypted_payload.v1") && text.contains("svc.custody.v1"));

        let Err(f) = n.prepare(&raw(2, false), 0, None, &mut ages) else {
            panic!("an unsigned message passed")
        };
        assert!(!f.retry);
        let dl = f.dead_letter.expect("a DLQ record");
        assert_eq!(dl.reason, "missing_signature");
        let body: serde_json::Value = serde_json::from_slice(&dl.body).unwrap();
        assert!(body["payload"].get("sha256").is_none(), "{body}");
        assert_eq!(body["payload"]["hmac_sha256"].as_str().unwrap().len(), 64);
        assert!(!String::from_utf8_lossy(&dl.body).contains("PLAINTEXT"));

        let c = &metrics.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(get(&c.authenticity_verified_total), 1);
        assert_eq!(get(&c.authenticity_missing_signature_total), 1);
        assert_eq!(get(&c.payload_encrypted_total), 1);
        assert_eq!(get(&c.custody_sealed_total), 1);
    }

    /// The governance stages run before encryption: a refused message spends none of the
    /// active key's message budget, and it is counted per stage and per reason.
    #[test]
    fn a_refused_message_spends_no_encryption_budget() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k1");
        std::fs::write(&key, B64.encode([5u8; 32])).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let cfg = RuntimeConfig::parse(
            &serde_json::json!({
                "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "o.>"},
                "sink": {"type": "file", "directory": dir.path().join("out")},
                "dead_letter": {"enabled": true, "subject": "dlq"},
                "payload_encryption": {"enabled": true, "keys": [{"key_id": "k1", "key_file": key}],
                                       "active_key_id": "k1", "max_messages_per_key": 1},
                "mission_metadata": {"enabled": true, "default": {"unit": "a"}},
                "pre_sink_policy": {"enabled": true, "rules": [
                    {"subject": "o.>", "max_payload_bytes": 30, "require_encrypted_payload": true}]}
            })
            .to_string(),
        )
        .unwrap();
        let p = Protection::load(&cfg.payload_encryption, &cfg.authenticity, &cfg.custody).unwrap();
        let metrics = Arc::new(Metrics::default());
        let n = Normalizer::new(&cfg, Arc::new(p), metrics.clone());
        let mut ages = Summary::default();
        let mut big = raw(1, false);
        big.data = vec![b' '; 31];
        let Err(f) = n.prepare(&big, 0, None, &mut ages) else {
            panic!("a payload over the rule's bound passed")
        };
        assert_eq!(f.dead_letter.unwrap().reason, "policy_payload_too_large");
        let p = n.prepare(&raw(2, false), 0, None, &mut ages).unwrap();
        assert_eq!(
            p.envelope.mission_metadata,
            Some(serde_json::json!({"unit": "a"}))
        );
        let c = &metrics.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(get(&c.pre_sink_policy_rejected_total), 1);
        assert_eq!(get(&c.pre_sink_policy_policy_payload_too_large_total), 1);
        assert_eq!(get(&c.payload_encrypted_total), 1);
        assert_eq!(get(&c.mission_metadata_attached_total), 1);
    }

    #[test]
    fn every_governance_reason_has_its_counter() {
        use crate::message::{mission, policy, size_policy};
        let c = crate::metrics::Counters::default();
        let all = mission::CODES
            .iter()
            .map(|code| (mission::STAGE, *code))
            .chain(policy::CODES.iter().map(|code| (policy::STAGE, *code)))
            .chain(size_policy::codes().map(|code| (size_policy::STAGE, code)));
        let mut n = 0;
        for (stage, code) in all {
            assert!(reason_counter(&c, stage, code).is_some(), "{stage}/{code}");
            n += 1;
        }
        assert_eq!(n, 33);
    }

    #[test]
    fn a_key_at_its_bound_is_a_transient_failure_never_dead_lettered() {
        let dir = tempfile::tempdir().unwrap();
        let (n, metrics) = normalizer(dir.path(), 1);
        let mut ages = Summary::default();
        assert!(n.prepare(&raw(1, true), 0, None, &mut ages).is_ok());
        let Err(f) = n.prepare(&raw(2, true), 0, None, &mut ages) else {
            panic!("the key's bound was not enforced")
        };
        assert!(f.retry && f.dead_letter.is_none());
        assert!(f.reason.contains("rotate active_key_id"), "{}", f.reason);
        let refused = &metrics.counters.payload_encryption_refused_total;
        assert_eq!(refused.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
