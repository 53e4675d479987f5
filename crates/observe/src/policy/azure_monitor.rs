//! `cloud_c_monitoring`: custom-metric posts to cloud C's regional monitoring endpoint.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks;
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

/// Dimensions per custom metric the service accepts.
pub const MAX_DIMENSIONS: usize = 10;
/// Namespace prefixes reserved by the platform.
pub const RESERVED_PREFIXES: &[&str] = &["Microsoft.", "Azure."];

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AzureMonitor {
    /// Defaults to false.
    pub enabled: bool,
    /// Resource owning the custom metrics; required when enabled. Defaults to null.
    pub resource_id: Option<String>,
    /// Region of the regional endpoint; required when enabled. Defaults to null.
    pub location: Option<String>,
    /// No reserved prefix, no colon. Defaults to `svc/metrics`.
    pub metric_namespace: String,
    /// Environment variable with the bearer token; required when enabled. Defaults to null.
    pub token_env: Option<String>,
    /// Defaults to {}.
    pub dimensions: BTreeMap<String, String>,
    /// Defaults to false.
    pub include_metric_labels_as_dimensions: bool,
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
    /// Always verified: must be true. Defaults to true.
    pub verify_tls: bool,
}

impl AzureMonitor {
    pub fn read(r: &mut ObjectReader<'_>) -> AzureMonitor {
        let enabled = r.bool_or("enabled", false);
        let when = enabled.then_some("the connector is enabled");
        let resource_id = r.opt_string("resource_id");
        match &resource_id {
            None if enabled => {
                r.problem("resource_id", "is required when the connector is enabled")
            }
            Some(id)
                if !(id.starts_with("/subscriptions/")
                    && id.len() <= 1024
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_graphic() && !b"?#%\\\"'".contains(&b))) =>
            {
                r.problem(
                    "resource_id",
                    "must be a resource id starting with /subscriptions/",
                )
            }
            _ => {}
        }
        let location = r.opt_string("location");
        match &location {
            None if enabled => r.problem("location", "is required when the connector is enabled"),
            Some(l)
                if !(!l.is_empty()
                    && l.len() <= 64
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())) =>
            {
                r.problem("location", "must be 1 to 64 characters of [a-z0-9]")
            }
            _ => {}
        }
        let metric_namespace = r.string_or("metric_namespace", "svc/metrics");
        if let Some(why) =
            super::cloudwatch::cloud_namespace_problem(&metric_namespace, RESERVED_PREFIXES)
        {
            r.problem("metric_namespace", why);
        }
        let token_env = checks::env_name(r, "token_env", when);
        let dimensions = checks::dimensions(r, "dimensions", BTreeMap::new(), false);
        let include_metric_labels_as_dimensions =
            r.bool_or("include_metric_labels_as_dimensions", false);
        if include_metric_labels_as_dimensions && dimensions.len() >= MAX_DIMENSIONS {
            r.problem(
                "dimensions",
                format!("must have at most {} entries with include_metric_labels_as_dimensions (subject_family is one more; the service allows {MAX_DIMENSIONS} per metric)", MAX_DIMENSIONS - 1),
            );
        }
        let push = PushSettings::read(r, &push::HTTP);
        let verify_tls = r.bool_or("verify_tls", true);
        if !verify_tls {
            r.problem(
                "verify_tls",
                "must be true; TLS verification cannot be disabled",
            );
        }
        AzureMonitor {
            enabled,
            resource_id,
            location,
            metric_namespace,
            token_env,
            dimensions,
            include_metric_labels_as_dimensions,
            push,
            verify_tls,
        }
    }
}
