//! `otlp`: OTLP/HTTP JSON export of the approved metrics.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks;
use crate::document::reader::ObjectReader;

/// Upper bound of `timeout_seconds` for the OTLP-style connectors (spec "Limits").
pub const MAX_TIMEOUT_SECONDS: f64 = 60.0;

/// The only OTLP transport of this release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    HttpJson,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Otlp {
    /// Defaults to false; needs the top-level `enabled` too.
    pub enabled: bool,
    /// OTLP/HTTP metrics endpoint; https unless loopback, no credentials. Defaults to null.
    pub endpoint: Option<String>,
    /// Defaults to `http_json`, the only value.
    pub protocol: Protocol,
    /// Greater than 0, at most 60. Defaults to 5.
    pub timeout_seconds: f64,
    /// One deadline for a whole export run (every request, retry and wait). Defaults to 60.
    pub export_deadline_seconds: f64,
    /// Retries after the first attempt, 0 to 10. Defaults to 0.
    pub max_retries: u32,
    /// Defaults to 0.25.
    pub retry_backoff_seconds: f64,
    /// Defaults to null.
    pub stale_after_seconds: Option<f64>,
    /// Defaults to 1048576.
    pub max_request_bytes: u64,
    /// Header name -> environment-variable name. Defaults to {}.
    pub headers_env: BTreeMap<String, String>,
}

impl Otlp {
    pub fn read(r: &mut ObjectReader<'_>) -> Otlp {
        let enabled = r.bool_or("enabled", false);
        let endpoint = checks::endpoint(
            r,
            "endpoint",
            enabled.then_some("the connector is enabled"),
            None,
        );
        let protocol = r.one_of(
            "protocol",
            Protocol::HttpJson,
            &[("http_json", Protocol::HttpJson)],
        );
        let common = Common::read(r);
        let headers_env = checks::headers_env(r, checks::RESERVED_HEADERS);
        Otlp {
            enabled,
            endpoint,
            protocol,
            timeout_seconds: common.timeout_seconds,
            export_deadline_seconds: common.export_deadline_seconds,
            max_retries: common.max_retries,
            retry_backoff_seconds: common.retry_backoff_seconds,
            stale_after_seconds: common.stale_after_seconds,
            max_request_bytes: common.max_request_bytes,
            headers_env,
        }
    }
}

/// The timing, retry and size fields shared by `otlp`, `search_stack` and `collector_agent`.
pub(crate) struct Common {
    pub timeout_seconds: f64,
    pub export_deadline_seconds: f64,
    pub max_retries: u32,
    pub retry_backoff_seconds: f64,
    pub stale_after_seconds: Option<f64>,
    pub max_request_bytes: u64,
}

impl Common {
    pub fn read(r: &mut ObjectReader<'_>) -> Common {
        Common {
            timeout_seconds: checks::timeout(r, 5.0, MAX_TIMEOUT_SECONDS),
            export_deadline_seconds: checks::export_deadline(r),
            max_retries: checks::retries(r),
            retry_backoff_seconds: checks::backoff(r),
            stale_after_seconds: checks::stale(r),
            max_request_bytes: checks::bytes(
                r,
                "max_request_bytes",
                1_048_576,
                checks::MIN_BYTES,
                checks::MAX_BYTES,
            ),
        }
    }
}
