//! `siem_hec`: one bounded metric event to a SIEM HTTP event collector.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks;
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

/// Path every enabled SIEM endpoint must have.
pub const EVENT_PATH: &str = "/services/collector/event";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SiemHec {
    /// Defaults to false; needs the top-level `enabled` too.
    pub enabled: bool,
    /// Path `/services/collector/event` when enabled; https unless loopback. Defaults to null.
    pub endpoint: Option<String>,
    /// Environment variable holding the collector token; required when enabled.
    pub token_env: Option<String>,
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
    /// Must be true. Defaults to true.
    pub verify_tls: bool,
    /// Extra headers; `Authorization` and `Content-Type` cannot be overridden.
    pub headers_env: BTreeMap<String, String>,
    /// Defaults to `svc`.
    pub source: String,
    /// Defaults to `svc:metrics`.
    pub sourcetype: String,
    /// Defaults to `svc`.
    pub host: String,
    /// Defaults to null (the token decides routing).
    pub index: Option<String>,
}

impl SiemHec {
    pub fn read(r: &mut ObjectReader<'_>) -> SiemHec {
        let enabled = r.bool_or("enabled", false);
        let endpoint = checks::endpoint(
            r,
            "endpoint",
            enabled.then_some("the connector is enabled"),
            enabled.then_some((EVENT_PATH, "the connector is enabled")),
        );
        let token_env = checks::env_name(
            r,
            "token_env",
            enabled.then_some("the connector is enabled"),
        );
        let push = PushSettings::read(r, &push::HTTP);
        let verify_tls = r.bool_or("verify_tls", true);
        if !verify_tls {
            r.problem(
                "verify_tls",
                "must be true; TLS verification cannot be disabled",
            );
        }
        let mut reserved = checks::RESERVED_HEADERS.to_vec();
        reserved.push("Authorization");
        let headers_env = checks::headers_env(r, &reserved);
        let source = checks::static_value(r, "source", "svc");
        let sourcetype = checks::static_value(r, "sourcetype", "svc:metrics");
        let host = checks::static_value(r, "host", "svc");
        let index = r.opt_string("index");
        if let Some(i) = &index {
            let ok = !i.is_empty()
                && i.len() <= 80
                && (i.as_bytes()[0].is_ascii_lowercase() || i.as_bytes()[0].is_ascii_digit())
                && i.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !ok {
                r.problem(
                    "index",
                    "must be 1 to 80 characters of [a-z0-9_-] starting with a letter or digit",
                );
            }
        }
        SiemHec {
            enabled,
            endpoint,
            token_env,
            push,
            verify_tls,
            headers_env,
            source,
            sourcetype,
            host,
            index,
        }
    }
}
