//! The size policy (`size_policy`): operator bounds, tighter than the built-in input limits
//! (`limits`), on what one message brings and on the record the sinks would store. Each bound
//! is off unless set, and each violation has its own reason code; the refusal carries the
//! measured size and the limit, never the content (`docs/governance.md`).
//!
//! Two checks: [`SizePolicyConfig::check_input`] on the raw message, first, before any work
//! is spent on it; [`SizePolicyConfig::check_envelope`] on labels and mission metadata; and
//! [`SizePolicyConfig::check_record_bytes`] on the record as the sinks will store it, after
//! encryption and custody (so `max_record_bytes` bounds the stored bytes).

use crate::document::reader::ObjectReader;
use crate::message::envelope::{Envelope, RawMessage};
use crate::message::refusal::Refusal;

pub const STAGE: &str = "size_policy";
/// Largest value any bound accepts (1 GiB).
pub const MAX_LIMIT: i64 = 1 << 30;

/// The `size_policy` block: every bound optional (`None`: not checked).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SizePolicyConfig {
    /// Defaults to false.
    pub enabled: bool,
    pub max_payload_bytes: Option<u64>,
    pub max_header_count: Option<u64>,
    pub max_header_name_bytes: Option<u64>,
    pub max_header_value_bytes: Option<u64>,
    pub max_total_header_bytes: Option<u64>,
    pub max_label_count: Option<u64>,
    pub max_label_bytes: Option<u64>,
    pub max_mission_metadata_bytes: Option<u64>,
    pub max_record_bytes: Option<u64>,
}

/// The bounds: option name, reason code, field path, unit.
const BOUNDS: &[(&str, &str, &str, &str)] = &[
    ("max_payload_bytes", "payload_too_large", "payload", "bytes"),
    ("max_header_count", "too_many_headers", "headers", "headers"),
    (
        "max_header_name_bytes",
        "header_name_too_long",
        "headers",
        "bytes",
    ),
    (
        "max_header_value_bytes",
        "header_value_too_long",
        "headers",
        "bytes",
    ),
    (
        "max_total_header_bytes",
        "headers_too_large",
        "headers",
        "bytes",
    ),
    ("max_label_count", "too_many_labels", "labels", "labels"),
    ("max_label_bytes", "labels_too_large", "labels", "bytes"),
    (
        "max_mission_metadata_bytes",
        "mission_metadata_too_large",
        "mission_metadata",
        "bytes",
    ),
    ("max_record_bytes", "record_too_large", "record", "bytes"),
];

/// Every reason code of the stage, in the order of [`BOUNDS`].
pub fn codes() -> impl Iterator<Item = &'static str> {
    BOUNDS.iter().map(|b| b.1)
}

impl SizePolicyConfig {
    pub fn read(r: Option<ObjectReader<'_>>) -> SizePolicyConfig {
        let Some(mut r) = r else {
            return SizePolicyConfig::default();
        };
        let enabled = r.bool_or("enabled", false);
        let mut get = |key: &'static str| r.opt_int_in(key, 1, MAX_LIMIT).map(|v| v as u64);
        let cfg = SizePolicyConfig {
            enabled,
            max_payload_bytes: get("max_payload_bytes"),
            max_header_count: get("max_header_count"),
            max_header_name_bytes: get("max_header_name_bytes"),
            max_header_value_bytes: get("max_header_value_bytes"),
            max_total_header_bytes: get("max_total_header_bytes"),
            max_label_count: get("max_label_count"),
            max_label_bytes: get("max_label_bytes"),
            max_mission_metadata_bytes: get("max_mission_metadata_bytes"),
            max_record_bytes: get("max_record_bytes"),
        };
        if cfg.enabled && cfg.limits().iter().all(Option::is_none) {
            r.problem(
                "enabled",
                "is true but no limit is set: set at least one max_* bound",
            );
        }
        r.finish();
        cfg
    }

    fn limits(&self) -> [Option<u64>; 9] {
        [
            self.max_payload_bytes,
            self.max_header_count,
            self.max_header_name_bytes,
            self.max_header_value_bytes,
            self.max_total_header_bytes,
            self.max_label_count,
            self.max_label_bytes,
            self.max_mission_metadata_bytes,
            self.max_record_bytes,
        ]
    }

    /// The refusal of bound `i` of [`BOUNDS`] when `measured` is over it.
    fn over(&self, i: usize, measured: u64) -> Result<(), Refusal> {
        match self.limits()[i] {
            Some(limit) if measured > limit => {
                let (_, code, field, unit) = BOUNDS[i];
                Err(Refusal::size(STAGE, field, code, unit, measured, limit))
            }
            _ => Ok(()),
        }
    }

    /// Payload and header bounds of a raw message.
    pub fn check_input(&self, raw: &RawMessage) -> Result<(), Refusal> {
        if !self.enabled {
            return Ok(());
        }
        self.over(0, raw.data.len() as u64)?;
        // Lines as sent: 1,000 identical lines are 1,000, though the map holds one pair.
        self.over(1, raw.header_lines() as u64)?;
        let longest_name = raw.headers.iter().map(|(k, _)| k.len()).max();
        self.over(2, longest_name.unwrap_or(0) as u64)?;
        let longest_value = raw.headers.iter().map(|(_, v)| v.len()).max();
        self.over(3, longest_value.unwrap_or(0) as u64)?;
        self.over(4, raw.header_bytes() as u64)
    }

    /// Label and mission metadata bounds of an envelope (before encryption and custody).
    /// `mission_bytes`: the mission object's canonical size when already measured.
    pub fn check_envelope(
        &self,
        env: &Envelope,
        mission_bytes: Option<usize>,
    ) -> Result<(), Refusal> {
        if !self.enabled {
            return Ok(());
        }
        self.over(5, env.labels_list.len() as u64)?;
        // `labels` is the list joined by `;`: the bytes every sink stores.
        self.over(6, env.labels.len() as u64)?;
        if let Some(serde_json::Value::Object(m)) = &env.mission_metadata {
            let size = mission_bytes.unwrap_or_else(|| crate::message::mission::canonical_len(m));
            self.over(7, size as u64)?;
        }
        Ok(())
    }

    /// Whether `max_record_bytes` is set: the caller measures the record only then.
    pub fn bounds_record(&self) -> bool {
        self.enabled && self.max_record_bytes.is_some()
    }

    /// The normalized record's bytes, measured by the caller as the file sink writes the
    /// record (`svc.file.message.v1`, byte for byte what serde writes for the envelope plus
    /// its `schema`): the sinks live above this module, and their encoder is the fast one.
    pub fn check_record_bytes(&self, measured: u64) -> Result<(), Refusal> {
        if !self.enabled {
            return Ok(());
        }
        self.over(8, measured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::envelope::{normalize, EnvelopeConfig};

    fn raw(headers: Vec<(&str, &str)>, data: &[u8]) -> RawMessage {
        RawMessage {
            stream: "S".into(),
            consumer: "c".into(),
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..RawMessage::sample("o.x", 1, data)
        }
    }

    fn all(n: u64) -> SizePolicyConfig {
        SizePolicyConfig {
            enabled: true,
            max_payload_bytes: Some(n),
            max_header_count: Some(2),
            max_header_name_bytes: Some(8),
            max_header_value_bytes: Some(n),
            max_total_header_bytes: Some(n),
            max_label_count: Some(1),
            max_label_bytes: Some(4),
            max_mission_metadata_bytes: Some(n),
            max_record_bytes: Some(10 * n),
        }
    }

    #[test]
    fn each_bound_has_its_code_and_carries_size_and_limit() {
        let c = all(20);
        let cases: Vec<(RawMessage, &str, u64)> = vec![
            (raw(vec![], &[b'x'; 21]), "payload_too_large", 21),
            (
                raw(vec![("a", ""), ("b", ""), ("c", "")], b""),
                "too_many_headers",
                3,
            ),
            (
                raw(vec![("SECRET-NAME", "")], b""),
                "header_name_too_long",
                11,
            ),
            (
                raw(vec![("a", "SECRET-VALUE-123456789")], b""),
                "header_value_too_long",
                22,
            ),
            (
                raw(
                    vec![("a", "SECRET-VALUE-12"), ("b", "SECRET-VALUE-12")],
                    b"",
                ),
                "headers_too_large",
                32,
            ),
        ];
        // Lines as sent: three identical lines are one pair held and three lines counted.
        let repeated = RawMessage {
            header_block: crate::message::envelope::HeaderBlock { lines: 3, bytes: 3 },
            ..raw(vec![("a", "")], b"")
        };
        let mut cases = cases;
        cases.push((repeated, "too_many_headers", 3));
        for (m, code, measured) in cases {
            let r = c.check_input(&m).unwrap_err();
            assert_eq!((r.code(), r.measured.unwrap().measured), (code, measured));
            assert!(!r.to_string().contains("SECRET"), "{r}");
        }
        let (mut env, _) = normalize(&raw(vec![], b"{}"), 0, &EnvelopeConfig::default());
        assert!(c.check_envelope(&env, None).is_ok());
        env.labels_list = vec!["a".into(), "b".into()];
        assert_eq!(
            c.check_envelope(&env, None).unwrap_err().code(),
            "too_many_labels"
        );
        env.labels_list = vec!["abcde".into()];
        env.labels = "abcde".into();
        assert_eq!(
            c.check_envelope(&env, None).unwrap_err().code(),
            "labels_too_large"
        );
        env.labels_list.clear();
        env.labels.clear();
        env.mission_metadata = Some(serde_json::json!({"k": "SECRET-VALUE-123456789"}));
        let r = c.check_envelope(&env, None).unwrap_err();
        assert_eq!(r.code(), "mission_metadata_too_large");
        assert_eq!(r.measured.unwrap().limit, 20);
        assert!(all(20).bounds_record() && !SizePolicyConfig::default().bounds_record());
        assert!(all(20).check_record_bytes(200).is_ok());
        let r = all(20).check_record_bytes(201).unwrap_err();
        assert_eq!(r.code(), "record_too_large");
        assert_eq!(
            r.measured,
            Some(crate::message::refusal::Measured {
                measured: 201,
                limit: 200
            })
        );
        assert!(SizePolicyConfig::default()
            .check_input(&raw(vec![], &[0; 99]))
            .is_ok());
    }
}
