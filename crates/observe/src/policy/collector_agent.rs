//! `collector_agent`: hand-off to a local collector agent over OTLP/HTTP, plus the labels of
//! the collector configuration snippet the profile can generate.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks;
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HandoffMode {
    OtlpHttp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamAuthMode {
    None,
    Basic,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CollectorAgent {
    /// Defaults to false; needs the top-level `enabled` too.
    pub enabled: bool,
    /// Defaults to `otlp_http`, the only mode.
    pub handoff_mode: HandoffMode,
    /// Local collector endpoint; path `/v1/metrics` when enabled. Defaults to null.
    pub endpoint: Option<String>,
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
    pub headers_env: BTreeMap<String, String>,
    /// Defaults to `svc`.
    pub receiver_label: String,
    /// Defaults to `svc_batch`.
    pub batch_label: String,
    /// Defaults to `upstream_cloud`.
    pub exporter_label: String,
    /// Defaults to `upstream_cloud_auth`.
    pub auth_label: String,
    /// Defaults to `UPSTREAM_OTLP_ENDPOINT`.
    pub upstream_endpoint_env: String,
    /// Defaults to `none`.
    pub upstream_auth_mode: UpstreamAuthMode,
    /// Required when enabled with mode `basic`. Defaults to null.
    pub upstream_auth_username_env: Option<String>,
    /// Required when enabled with mode `basic`. Defaults to null.
    pub upstream_auth_password_env: Option<String>,
}

/// Path every enabled collector endpoint must have.
pub const METRICS_PATH: &str = "/v1/metrics";

impl CollectorAgent {
    pub fn read(r: &mut ObjectReader<'_>) -> CollectorAgent {
        let enabled = r.bool_or("enabled", false);
        let handoff_mode = r.one_of(
            "handoff_mode",
            HandoffMode::OtlpHttp,
            &[("otlp_http", HandoffMode::OtlpHttp)],
        );
        let endpoint = checks::endpoint(
            r,
            "endpoint",
            enabled.then_some("the profile is enabled"),
            enabled.then_some((METRICS_PATH, "the profile is enabled")),
        );
        let push = PushSettings::read(r, &push::HTTP);
        let headers_env = checks::headers_env(r, checks::RESERVED_HEADERS);
        let receiver_label = checks::component_label(r, "receiver_label", "svc");
        let batch_label = checks::component_label(r, "batch_label", "svc_batch");
        let exporter_label = checks::component_label(r, "exporter_label", "upstream_cloud");
        let auth_label = checks::component_label(r, "auth_label", "upstream_cloud_auth");
        let upstream_endpoint_env = checks::env_name(r, "upstream_endpoint_env", None)
            .unwrap_or_else(|| "UPSTREAM_OTLP_ENDPOINT".to_string());
        let upstream_auth_mode = r.one_of(
            "upstream_auth_mode",
            UpstreamAuthMode::None,
            &[
                ("none", UpstreamAuthMode::None),
                ("basic", UpstreamAuthMode::Basic),
            ],
        );
        let needed = (enabled && upstream_auth_mode == UpstreamAuthMode::Basic)
            .then_some("the profile is enabled with upstream_auth_mode basic");
        let upstream_auth_username_env = checks::env_name(r, "upstream_auth_username_env", needed);
        let upstream_auth_password_env = checks::env_name(r, "upstream_auth_password_env", needed);
        CollectorAgent {
            enabled,
            handoff_mode,
            endpoint,
            push,
            headers_env,
            receiver_label,
            batch_label,
            exporter_label,
            auth_label,
            upstream_endpoint_env,
            upstream_auth_mode,
            upstream_auth_username_env,
            upstream_auth_password_env,
        }
    }
}
