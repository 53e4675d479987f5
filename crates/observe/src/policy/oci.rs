//! `cloud_a_monitoring`: custom-metric posts to cloud A's monitoring service.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks;
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

/// Cap of `max_metrics_per_request` (spec "Limits").
pub const MAX_METRICS_PER_REQUEST: i64 = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    InstancePrincipal,
    ResourcePrincipal,
    ConfigFile,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BatchAtomicity {
    #[serde(rename = "ATOMIC")]
    Atomic,
    #[serde(rename = "NON_ATOMIC")]
    NonAtomic,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OciMonitoring {
    /// Defaults to false.
    pub enabled: bool,
    /// Custom metric namespace; prefixes `oci_` and `oracle_` are reserved. Defaults to
    /// `svc_metrics`.
    pub metric_namespace: String,
    /// Required when enabled. Defaults to null.
    pub region: Option<String>,
    /// Required when enabled; redacted from dry-run output. Defaults to null.
    pub compartment_id: Option<String>,
    /// Optional static resource group. Defaults to null.
    pub resource_group: Option<String>,
    /// Defaults to `instance_principal`.
    pub auth_mode: AuthMode,
    /// SDK config file; required when enabled with `config_file` mode. Defaults to null.
    pub config_file: Option<String>,
    /// SDK config profile. Defaults to `DEFAULT`.
    pub profile: String,
    /// Defaults to `ATOMIC`.
    pub batch_atomicity: BatchAtomicity,
    /// Static dimensions; at least one. Defaults to `{"source": "svc"}`.
    pub dimensions: BTreeMap<String, String>,
    /// Static metadata; sensitive-looking keys rejected. Defaults to {}.
    pub metadata: BTreeMap<String, String>,
    /// Defaults to false.
    pub include_metric_labels_as_dimensions: bool,
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
    /// 1 to 50. Defaults to 20.
    pub max_metrics_per_request: u32,
}

impl OciMonitoring {
    pub fn read(r: &mut ObjectReader<'_>) -> OciMonitoring {
        let enabled = r.bool_or("enabled", false);
        let when = enabled.then_some("the connector is enabled");
        let metric_namespace = r.string_or("metric_namespace", "svc_metrics");
        let lower = metric_namespace.to_ascii_lowercase();
        if lower.starts_with("oci_") || lower.starts_with("oracle_") {
            r.problem(
                "metric_namespace",
                "must not start with the reserved prefix oci_ or oracle_",
            );
        } else if !is_namespace(&metric_namespace) {
            r.problem(
                "metric_namespace",
                "must be 1 to 255 characters of [A-Za-z0-9_] starting with a letter",
            );
        }
        let region = region(r, when);
        let compartment_id = r.opt_string("compartment_id");
        match &compartment_id {
            None if enabled => r.problem(
                "compartment_id",
                "is required when the connector is enabled",
            ),
            Some(c)
                if !(c.starts_with("ocid1.")
                    && c.len() <= 255
                    && c.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))) =>
            {
                r.problem(
                    "compartment_id",
                    "must be an OCID (ocid1.<type>.<realm>...)",
                )
            }
            Some(c) if !(c.starts_with("ocid1.compartment.") || c.starts_with("ocid1.tenancy.")) => {
                r.problem(
                    "compartment_id",
                    "must be a compartment OCID (ocid1.compartment.…) or the tenancy OCID (ocid1.tenancy.…, the root compartment)",
                )
            }
            _ => {}
        }
        let resource_group = r.opt_string("resource_group");
        if let Some(g) = &resource_group {
            if let Some(why) = checks::dimension_value_problem(g) {
                r.problem("resource_group", why);
            }
        }
        let auth_mode = r.one_of(
            "auth_mode",
            AuthMode::InstancePrincipal,
            &[
                ("instance_principal", AuthMode::InstancePrincipal),
                ("resource_principal", AuthMode::ResourcePrincipal),
                ("config_file", AuthMode::ConfigFile),
            ],
        );
        let config_file = r.opt_string("config_file");
        match &config_file {
            None if enabled && auth_mode == AuthMode::ConfigFile => r.problem(
                "config_file",
                "is required when the connector is enabled with auth_mode config_file",
            ),
            Some(p) if !p.starts_with('/') || p.contains('\0') => {
                r.problem("config_file", "must be an absolute path")
            }
            _ => {}
        }
        let profile = r.string_or("profile", "DEFAULT");
        let profile_ok = !profile.is_empty()
            && profile.len() <= 64
            && profile
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !profile_ok {
            r.problem("profile", "must be 1 to 64 characters of [A-Za-z0-9_-]");
        }
        let batch_atomicity = r.one_of(
            "batch_atomicity",
            BatchAtomicity::Atomic,
            &[
                ("ATOMIC", BatchAtomicity::Atomic),
                ("NON_ATOMIC", BatchAtomicity::NonAtomic),
            ],
        );
        let dimensions = checks::dimensions(
            r,
            "dimensions",
            BTreeMap::from([("source".to_string(), "svc".to_string())]),
            true,
        );
        let metadata = checks::dimensions(r, "metadata", BTreeMap::new(), false);
        let include_metric_labels_as_dimensions =
            r.bool_or("include_metric_labels_as_dimensions", false);
        let push = PushSettings::read(r, &push::HTTP);
        let max_metrics_per_request =
            r.int_in("max_metrics_per_request", 20, 1, MAX_METRICS_PER_REQUEST) as u32;
        OciMonitoring {
            enabled,
            metric_namespace,
            region,
            compartment_id,
            resource_group,
            auth_mode,
            config_file,
            profile,
            batch_atomicity,
            dimensions,
            metadata,
            include_metric_labels_as_dimensions,
            push,
            max_metrics_per_request,
        }
    }
}

fn is_namespace(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.as_bytes()[0].is_ascii_alphabetic()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A cloud region identifier (`eu-frankfurt-1`, `us-east-1`, `westeurope`); `when` makes it
/// required.
pub(crate) fn region(r: &mut ObjectReader<'_>, when: Option<&str>) -> Option<String> {
    let v = r.opt_string("region");
    match &v {
        None => {
            if let Some(why) = when {
                r.problem("region", format!("is required when {why}"));
            }
        }
        Some(s) => {
            let ok = !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                r.problem("region", "must be 1 to 64 characters of [a-z0-9-]");
            }
        }
    }
    v
}
