//! `otlp`: OTLP/HTTP JSON export of the approved metrics.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks;
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

/// Upper bound of `timeout_seconds` for the OTLP-style connectors (spec "Limits").
pub const MAX_TIMEOUT_SECONDS: f64 = push::MAX_TIMEOUT_SECONDS;

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
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
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
        let push = PushSettings::read(r, &push::HTTP);
        let headers_env = checks::headers_env(r, checks::RESERVED_HEADERS);
        Otlp {
            enabled,
            endpoint,
            protocol,
            push,
            headers_env,
        }
    }
}
