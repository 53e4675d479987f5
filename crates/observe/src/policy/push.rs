//! The delivery settings every push connector block shares (timeout, export deadline, retries,
//! backoff, staleness, size bound), read and validated by one function so the nine blocks
//! cannot drift apart. The blocks differ only in their [`Bounds`]: the timeout's default and
//! the name, default and range of the size field.

use std::time::Duration;

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::checks;
use svc_document::reader::ObjectReader;

/// Upper bound of every push connector's `timeout_seconds` (spec "Limits").
pub const MAX_TIMEOUT_SECONDS: f64 = 60.0;

/// What differs between blocks: the timeout default and the size field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Default `timeout_seconds`.
    pub timeout_default: f64,
    /// `max_request_bytes`, `max_datagram_bytes` or `max_message_bytes`.
    pub size_key: &'static str,
    pub size_default: u64,
    pub size_min: i64,
    pub size_max: i64,
}

/// HTTP connectors: 5 s, `max_request_bytes` 1 MiB (1 KiB to 16 MiB).
pub const HTTP: Bounds = Bounds {
    timeout_default: 5.0,
    size_key: "max_request_bytes",
    size_default: 1_048_576,
    size_min: checks::MIN_BYTES,
    size_max: checks::MAX_BYTES,
};

/// Largest UDP payload over IPv4.
pub const MAX_DATAGRAM_BYTES: i64 = 65_507;

/// StatsD: 1 s, `max_datagram_bytes` 1432 (64 to 65507): one Ethernet frame by default.
pub const STATSD: Bounds = Bounds {
    timeout_default: 1.0,
    size_key: "max_datagram_bytes",
    size_default: 1432,
    size_min: 64,
    size_max: MAX_DATAGRAM_BYTES,
};

/// Syslog: 1 s, `max_message_bytes` 1024 (480 to 65507: RFC 5424 receivers must take 480).
pub const SYSLOG: Bounds = Bounds {
    timeout_default: 1.0,
    size_key: "max_message_bytes",
    size_default: 1024,
    size_min: 480,
    size_max: MAX_DATAGRAM_BYTES,
};

/// The shared fields of one push connector block. Serialized flat into the block, with the
/// size field under the block's own name.
#[derive(Debug, Clone, PartialEq)]
pub struct PushSettings {
    /// Whole-attempt timeout; greater than 0, at most 60. Defaults per block (5 HTTP, 1 datagram).
    pub timeout_seconds: f64,
    /// One deadline for a whole export run (every request, retry and wait). Defaults to 60.
    pub export_deadline_seconds: f64,
    /// Retries after the first attempt, 0 to 10. Defaults to 0.
    pub max_retries: u32,
    /// Fixed delay between attempts, 0 to 60. Defaults to 0.25.
    pub retry_backoff_seconds: f64,
    /// Defaults to null (never stale).
    pub stale_after_seconds: Option<f64>,
    /// The size bound of every request, datagram or message (field [`Self::size_key`]).
    pub max_bytes: u64,
    /// The policy field of `max_bytes`.
    pub size_key: &'static str,
}

impl PushSettings {
    /// Reads and validates the shared fields of a block with the given bounds.
    pub fn read(r: &mut ObjectReader<'_>, bounds: &Bounds) -> PushSettings {
        PushSettings {
            timeout_seconds: checks::timeout(r, bounds.timeout_default, MAX_TIMEOUT_SECONDS),
            export_deadline_seconds: checks::export_deadline(r),
            max_retries: checks::retries(r),
            retry_backoff_seconds: checks::backoff(r),
            stale_after_seconds: checks::stale(r),
            max_bytes: checks::bytes(
                r,
                bounds.size_key,
                bounds.size_default,
                bounds.size_min,
                bounds.size_max,
            ),
            size_key: bounds.size_key,
        }
    }

    /// `timeout_seconds` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_seconds)
    }
}

impl Serialize for PushSettings {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry("timeout_seconds", &self.timeout_seconds)?;
        m.serialize_entry("export_deadline_seconds", &self.export_deadline_seconds)?;
        m.serialize_entry("max_retries", &self.max_retries)?;
        m.serialize_entry("retry_backoff_seconds", &self.retry_backoff_seconds)?;
        m.serialize_entry("stale_after_seconds", &self.stale_after_seconds)?;
        m.serialize_entry(self.size_key, &self.max_bytes)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_document::reader::Problems;

    fn read(text: &str, bounds: &Bounds) -> (PushSettings, Vec<String>) {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let problems = Problems::new();
        let p = PushSettings::read(&mut ObjectReader::at("b".into(), &v, &problems), bounds);
        let found = problems
            .into_vec()
            .iter()
            .map(ToString::to_string)
            .collect();
        (p, found)
    }

    #[test]
    fn defaults_and_the_size_field_follow_the_bounds() {
        let (p, problems) = read("{}", &STATSD);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            (p.timeout_seconds, p.export_deadline_seconds, p.max_bytes),
            (1.0, 60.0, 1432)
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["max_datagram_bytes"], 1432);
        assert_eq!(json["export_deadline_seconds"], 60.0);
        assert!(json.get("max_bytes").is_none() && json.get("size_key").is_none());
        let (p, _) = read("{}", &HTTP);
        assert_eq!((p.timeout_seconds, p.max_bytes), (5.0, 1_048_576));
    }

    #[test]
    fn every_field_is_checked_with_its_path() {
        let (_, problems) = read(
            r#"{"timeout_seconds": 0, "export_deadline_seconds": 3601, "max_retries": 11,
                "retry_backoff_seconds": -1, "stale_after_seconds": 0, "max_message_bytes": 479}"#,
            &SYSLOG,
        );
        assert_eq!(
            problems,
            [
                "b.timeout_seconds: must be a number greater than 0 and at most 60",
                "b.export_deadline_seconds: must be a number greater than 0 and at most 3600",
                "b.max_retries: must be an integer from 0 to 10",
                "b.retry_backoff_seconds: must be a number from 0 to 60",
                "b.stale_after_seconds: must be a number greater than 0 and at most 31536000",
                "b.max_message_bytes: must be an integer from 480 to 65507",
            ]
        );
    }
}
