//! `cloud-c-export`: Azure Monitor custom metrics, the REST call for one resource at the
//! location's regional endpoint, as the vendor documents it:
//!
//! ```text
//! POST https://<location>.monitoring.azure.com<resource_id>/metrics
//! Authorization: Bearer <token from token_env>
//! Content-Type: application/json
//!
//! {"time": "2024-05-17T12:34:56.250Z",
//!  "data": {"baseData": {"metric": "svc_messages_acked_total", "namespace": "svc/metrics",
//!           "dimNames": ["env"],
//!           "series": [{"dimValues": ["prod"], "min": 1200, "max": 1200, "sum": 1200, "count": 1}]}}}
//! ```
//!
//! - One request per metric and dimension set: the aggregate with the static `dimensions`;
//!   with `include_metric_labels_as_dimensions`, a second request for the metric's
//!   subject-family rows with `subject_family` appended to the dimension names, one series per
//!   family. Without dimensions `dimNames` and `dimValues` are left out (both optional).
//! - Counters and gauges: `min` = `max` = `sum` = the value, `count` 1. Summaries: their
//!   statistic set (count, sum, min, max, cumulative since the runner started).
//! - `time` is the snapshot's time. Azure Monitor accepts points at most 20 minutes old, so an
//!   older snapshot fails before any request (whatever `--allow-stale` says).
//! - The token is read from the variable named by `token_env` at export time; TLS is always
//!   verified (`verify_tls: false` is rejected by the policy). Every body is checked against
//!   `max_request_bytes` before the first request. `--dry-run` hides the token, `resource_id`
//!   and `location`.
//! - Test hook: `SVC_CLOUD_C_ENDPOINT_OVERRIDE` (scheme, host and port of a loopback receiver,
//!   e.g. `http://127.0.0.1:8443`) replaces `https://<location>.monitoring.azure.com`; any
//!   other host is refused. It exists for tests with a local receiver, not for production.

use serde_json::{json, Map, Value as Json};

use super::cloud::{self, Datum, Value};
use super::{
    resolve_env, Action, Connector, Context, Delivery, ExportError, Header, HttpRequest, Input,
    Limit, Method, Plan, Retry,
};
use crate::policy::AzureMonitor;
use svc_host::{Env, ProcessEnv};

pub const CONNECTOR: Connector = Connector {
    command: "cloud-c-export",
    block: "cloud_c_monitoring",
    summary: "Send the approved metrics to cloud C monitoring (Azure Monitor custom metrics).",
    help: "\
Usage: svc-observe cloud-c-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

POSTs the approved metrics as Azure Monitor custom metrics to
https://<location>.monitoring.azure.com<resource_id>/metrics, one request per metric and
dimension set (needs enabled and cloud_c_monitoring.enabled). The bearer token is read from
the environment variable named by cloud_c_monitoring.token_env. TLS is always verified.
Azure Monitor accepts points at most 20 minutes old: an older snapshot is not sent.

Options:
  --dry-run      Print the requests (token, resource_id and location redacted); send nothing
  --allow-stale  Send even if the snapshot is older than cloud_c_monitoring.stale_after_seconds

Exit codes: 0 sent (or disabled by policy), 1 not sent (snapshot missing, invalid or stale, a
request over max_request_bytes, rejected or failed after retries), 2 invalid policy, usage or
environment (token variable unset).
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.cloud_c_monitoring.enabled,
    push: |p| &p.cloud_c_monitoring.push,
    action: Action::Plan(plan),
};

pub const BLOCK: &str = "cloud_c_monitoring";
/// Test-only replacement of the regional endpoint (loopback only).
pub const ENDPOINT_OVERRIDE_ENV: &str = "SVC_CLOUD_C_ENDPOINT_OVERRIDE";
/// Largest answer body read.
pub const MAX_RESPONSE_BYTES: u64 = 65_536;
/// Azure Monitor rejects custom metric points older than 20 minutes.
pub const MAX_AGE_SECONDS: f64 = 20.0 * 60.0;

/// `https://<location>.monitoring.azure.com`, or the loopback override.
pub fn base_url(location: &str, env: &dyn Env) -> Result<String, ExportError> {
    Ok(cloud::loopback_override(env, ENDPOINT_OVERRIDE_ENV)?
        .unwrap_or_else(|| format!("https://{location}.monitoring.azure.com")))
}

/// One series of a request.
fn series(dim_values: &[&str], value: Value) -> Json {
    let mut s = Map::new();
    if !dim_values.is_empty() {
        s.insert("dimValues".into(), json!(dim_values));
    }
    let (min, max, sum, count) = match value {
        Value::Single(v) => (v, v, v, 1),
        Value::Stats {
            count,
            sum,
            min,
            max,
        } => (min, max, sum, count),
    };
    s.insert("min".into(), json!(min));
    s.insert("max".into(), json!(max));
    s.insert("sum".into(), json!(sum));
    s.insert("count".into(), json!(count));
    Json::Object(s)
}

/// One request body: `metric` with `dim_names` and its series.
pub fn body(
    time: &str,
    metric: &str,
    namespace: &str,
    dim_names: &[&str],
    series: Vec<Json>,
) -> Json {
    let mut base = Map::new();
    base.insert("metric".into(), json!(metric));
    base.insert("namespace".into(), json!(namespace));
    if !dim_names.is_empty() {
        base.insert("dimNames".into(), json!(dim_names));
    }
    base.insert("series".into(), Json::Array(series));
    json!({"time": time, "data": {"baseData": Json::Object(base)}})
}

/// The bodies for all data: `(what, body)` in data order, one per metric and dimension set.
pub fn bodies(cfg: &AzureMonitor, data: &[Datum], time: &str) -> Vec<(String, Json)> {
    let static_names: Vec<&str> = cfg.dimensions.keys().map(String::as_str).collect();
    let static_values: Vec<&str> = cfg.dimensions.values().map(String::as_str).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let d = &data[i];
        if d.family.is_none() {
            out.push((
                format!("custom metric {}", d.name),
                body(
                    time,
                    &d.name,
                    &cfg.metric_namespace,
                    &static_names,
                    vec![series(&static_values, d.value)],
                ),
            ));
            i += 1;
            continue;
        }
        // The family rows of one metric are consecutive: one request with every family.
        let mut names = static_names.clone();
        names.push(crate::families::LABEL_NAME);
        let mut list = Vec::new();
        while i < data.len() && data[i].name == d.name && data[i].family.is_some() {
            let mut values = static_values.clone();
            values.push(data[i].family.as_deref().unwrap_or_default());
            list.push(series(&values, data[i].value));
            i += 1;
        }
        out.push((
            format!("custom metric {} by subject_family", d.name),
            body(time, &d.name, &cfg.metric_namespace, &names, list),
        ));
    }
    out
}

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    plan_with(ctx, &ProcessEnv)
}

/// The plan with the environment given (tests).
pub fn plan_with(ctx: &Context<'_>, env: &dyn Env) -> Result<Plan, ExportError> {
    let cfg = &ctx.policy.cloud_c_monitoring;
    let required = |field: &str| {
        ExportError::Environment(format!(
            "{BLOCK}.{field}: is required when the connector is enabled"
        ))
    };
    let resource_id = cfg
        .resource_id
        .as_deref()
        .ok_or_else(|| required("resource_id"))?;
    let location = cfg
        .location
        .as_deref()
        .ok_or_else(|| required("location"))?;
    let token_env = cfg
        .token_env
        .as_deref()
        .ok_or_else(|| required("token_env"))?;
    let token = resolve_env(&format!("{BLOCK}.token_env"), token_env)?;
    let prepared = ctx.prepared();
    cloud::check_vendor_window(
        BLOCK,
        "Azure Monitor",
        prepared.snapshot.age_seconds(),
        MAX_AGE_SECONDS,
    )?;
    let url = format!("{}{resource_id}/metrics", base_url(location, env)?);
    let data = cloud::data(ctx, cfg.include_metric_labels_as_dimensions);
    let time = cloud::rfc3339_millis(prepared.snapshot.generated_at_epoch_seconds);
    let requests = bodies(cfg, &data, &time)
        .into_iter()
        .map(|(what, body)| HttpRequest {
            method: Method::Post,
            url: url.clone(),
            headers: vec![
                Header::secret("Authorization", token.prefixed("Bearer ")),
                Header::plain("Content-Type", "application/json"),
            ],
            body: serde_json::to_vec(&body).expect("JSON values always serialize"),
            check: None,
            what,
        })
        .collect();
    Ok(Plan {
        delivery: Delivery::Http {
            requests,
            timeout: cfg.push.timeout(),
            max_response_bytes: MAX_RESPONSE_BYTES,
        },
        limit: Limit::of(BLOCK, &cfg.push),
        retry: Retry::of(&cfg.push),
        metrics: data.len(),
        // The bearer token is scrubbed with or without its prefix by `plan_secrets`.
        redact: vec![resource_id.to_string(), location.to_string()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use std::collections::BTreeMap;

    #[test]
    fn documented_body_shape() {
        let p = Policy::parse(
            r#"{"schema": "svc.observability.policy.v1",
                "cloud_c_monitoring": {"metric_namespace": "QueueProcessing",
                  "dimensions": {"env": "prod", "app": "svc"}}}"#,
        )
        .unwrap();
        let data = vec![
            Datum {
                name: "svc_messages_acked_total".into(),
                family: None,
                value: Value::Single(1200.0),
            },
            Datum {
                name: "svc_messages_acked_total".into(),
                family: Some("orders".into()),
                value: Value::Single(700.0),
            },
            Datum {
                name: "svc_messages_acked_total".into(),
                family: Some("payments".into()),
                value: Value::Single(500.0),
            },
            Datum {
                name: "svc_sink_batch_write_seconds".into(),
                family: None,
                value: Value::Stats {
                    count: 3,
                    sum: 28.0,
                    min: 3.0,
                    max: 20.0,
                },
            },
        ];
        let b = bodies(&p.cloud_c_monitoring, &data, "2018-09-13T16:34:20.000Z");
        let whats: Vec<&str> = b.iter().map(|(w, _)| w.as_str()).collect();
        assert_eq!(
            whats,
            [
                "custom metric svc_messages_acked_total",
                "custom metric svc_messages_acked_total by subject_family",
                "custom metric svc_sink_batch_write_seconds"
            ]
        );
        assert_eq!(
            b[1].1,
            json!({"time": "2018-09-13T16:34:20.000Z", "data": {"baseData": {
                "metric": "svc_messages_acked_total", "namespace": "QueueProcessing",
                "dimNames": ["app", "env", "subject_family"],
                "series": [
                  {"dimValues": ["svc", "prod", "orders"], "min": 700.0, "max": 700.0, "sum": 700.0, "count": 1},
                  {"dimValues": ["svc", "prod", "payments"], "min": 500.0, "max": 500.0, "sum": 500.0, "count": 1}]}}})
        );
        assert_eq!(
            b[2].1["data"]["baseData"]["series"],
            json!([{"dimValues": ["svc", "prod"], "min": 3.0, "max": 20.0, "sum": 28.0, "count": 3}])
        );
        let p = Policy::disabled();
        let b = bodies(&p.cloud_c_monitoring, &data[..1], "t");
        assert_eq!(
            b[0].1,
            json!({"time": "t", "data": {"baseData": {"metric": "svc_messages_acked_total",
                "namespace": "svc/metrics",
                "series": [{"min": 1200.0, "max": 1200.0, "sum": 1200.0, "count": 1}]}}})
        );
    }

    #[test]
    fn endpoint_override_is_loopback_only() {
        let none: BTreeMap<&str, &str> = BTreeMap::new();
        assert_eq!(
            base_url("westeurope", &none).unwrap(),
            "https://westeurope.monitoring.azure.com"
        );
        let env: BTreeMap<&str, &str> = [(ENDPOINT_OVERRIDE_ENV, "http://127.0.0.1:9/")].into();
        assert_eq!(base_url("x", &env).unwrap(), "http://127.0.0.1:9");
        for (v, msg) in [
            ("https://evil.example", "SVC_CLOUD_C_ENDPOINT_OVERRIDE must name a loopback host (it is a test hook for a local receiver)"),
            ("http://127.0.0.1/x", "SVC_CLOUD_C_ENDPOINT_OVERRIDE must be scheme, host and optional port, without a path"),
            ("ftp://127.0.0.1", "SVC_CLOUD_C_ENDPOINT_OVERRIDE must be an http:// or https:// URL"),
        ] {
            let env: BTreeMap<&str, &str> = [(ENDPOINT_OVERRIDE_ENV, v)].into();
            assert_eq!(base_url("x", &env).unwrap_err().to_string(), msg);
        }
    }
}
