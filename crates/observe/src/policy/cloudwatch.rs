//! `cloud_b_monitoring`: custom-metric posts to cloud B's monitoring service (put-metric-data).

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks;
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

/// Cap of `max_metrics_per_request` (spec "Limits").
pub const MAX_METRICS_PER_REQUEST: i64 = 1000;

/// Units cloud B accepts for a datum.
pub const UNITS: &[&str] = &[
    "Seconds",
    "Microseconds",
    "Milliseconds",
    "Bytes",
    "Kilobytes",
    "Megabytes",
    "Gigabytes",
    "Terabytes",
    "Bits",
    "Kilobits",
    "Megabits",
    "Gigabits",
    "Terabits",
    "Percent",
    "Count",
    "Bytes/Second",
    "Kilobytes/Second",
    "Megabytes/Second",
    "Gigabytes/Second",
    "Terabytes/Second",
    "Bits/Second",
    "Kilobits/Second",
    "Megabits/Second",
    "Gigabits/Second",
    "Terabits/Second",
    "Count/Second",
    "None",
];

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CloudWatch {
    /// Defaults to false.
    pub enabled: bool,
    /// Must not start with `AWS/` or contain a colon. Defaults to `svc/metrics`.
    pub metric_namespace: String,
    /// Required when enabled; not in dry-run output. Defaults to null.
    pub region: Option<String>,
    /// Defaults to `None`.
    pub unit: String,
    /// 60 (standard) or 1 (high resolution). Defaults to 60.
    pub storage_resolution: u32,
    /// Defaults to {}.
    pub dimensions: BTreeMap<String, String>,
    /// Defaults to false.
    pub include_metric_labels_as_dimensions: bool,
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
    /// 1 to 1000. Defaults to 20.
    pub max_metrics_per_request: u32,
}

impl CloudWatch {
    pub fn read(r: &mut ObjectReader<'_>) -> CloudWatch {
        let enabled = r.bool_or("enabled", false);
        let metric_namespace = r.string_or("metric_namespace", "svc/metrics");
        if let Some(why) = cloud_namespace_problem(&metric_namespace, &["AWS/"]) {
            r.problem("metric_namespace", why);
        }
        let region = super::oci::region(r, enabled.then_some("the connector is enabled"));
        let unit = r.string_or("unit", "None");
        if !UNITS.contains(&unit.as_str()) {
            r.problem("unit", "must be a standard unit such as Count, Seconds, Milliseconds, Bytes, Percent or None");
        }
        let storage_resolution = match r.opt_int_in("storage_resolution", 1, 60) {
            None => 60,
            Some(n @ (1 | 60)) => n as u32,
            Some(_) => {
                r.problem(
                    "storage_resolution",
                    "must be 60 (standard) or 1 (high resolution)",
                );
                60
            }
        };
        let dimensions = checks::dimensions(r, "dimensions", BTreeMap::new(), false);
        let include_metric_labels_as_dimensions =
            r.bool_or("include_metric_labels_as_dimensions", false);
        let push = PushSettings::read(r, &push::HTTP);
        let max_metrics_per_request =
            r.int_in("max_metrics_per_request", 20, 1, MAX_METRICS_PER_REQUEST) as u32;
        CloudWatch {
            enabled,
            metric_namespace,
            region,
            unit,
            storage_resolution,
            dimensions,
            include_metric_labels_as_dimensions,
            push,
            max_metrics_per_request,
        }
    }
}

/// Namespace rules of cloud B and cloud C: 1 to 255 bytes of `[A-Za-z0-9._/#-]` (no colon),
/// no reserved prefix (compared case-insensitively).
pub(crate) fn cloud_namespace_problem(ns: &str, reserved: &[&str]) -> Option<String> {
    if let Some(p) = reserved
        .iter()
        .find(|p| ns.len() >= p.len() && ns[..p.len()].eq_ignore_ascii_case(p))
    {
        return Some(format!("must not start with {p}"));
    }
    if ns.contains(':') {
        return Some("must not contain a colon".into());
    }
    let ok = !ns.is_empty()
        && ns.len() <= 255
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/#-".contains(&b));
    (!ok).then(|| "must be 1 to 255 characters of [A-Za-z0-9._/#-]".to_string())
}
