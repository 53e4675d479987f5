//! `otlp-export`: the approved metrics as one OTLP/HTTP JSON `ExportMetricsServiceRequest`
//! POSTed to `otlp.endpoint`. The body builder and the request plan are shared with the two
//! OTLP profiles (`search_stack`, `collector_agent`), which differ only in resource attributes
//! and endpoint rules.
//!
//! Mapping (OTLP protobuf JSON encoding: lowerCamelCase fields, 64-bit integers as strings,
//! enums as integers):
//! - resource attributes `service.name` = `svc`, `service.version`, plus the profile's own;
//!   one scope `svc-observe` with the exporter version;
//! - a counter -> `sum` with `aggregationTemporality` 2 (cumulative) and `isMonotonic` true,
//!   `asInt`; its subject-family rows -> extra data points with attribute `subject_family`;
//! - a gauge -> `gauge` with `asDouble`;
//! - a summary -> `summary` with `count`, `sum` and, once observed, `quantileValues` 0.0 (min)
//!   and 1.0 (max), plus a gauge `<name>_last`;
//! - `startTimeUnixNano` = the snapshot's `started_at_epoch_seconds` (cumulative start),
//!   `timeUnixNano` = its `generated_at_epoch_seconds`.
//!
//! Names are the exposition names (`<namespace>_<suffix>`), descriptions the HELP texts.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{
    epoch_nanos, metric_name, resolve_headers, Action, Connector, Context, Delivery, ExportError,
    Header, HttpRequest, Input, Limit, Method, Plan, Retry,
};
use crate::catalogue::Kind;
use crate::families::LABEL_NAME;
use crate::policy::{Policy, PushSettings};
use crate::select::Sample;
use svc_snapshot::Summary;
use svc_text::peer::PeerText;

pub const CONNECTOR: Connector = Connector {
    command: "otlp-export",
    block: "otlp",
    summary: "Send the approved metrics as OTLP/HTTP JSON to otlp.endpoint.",
    help: "\
Usage: svc-observe otlp-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

POSTs the approved metrics as one OTLP/HTTP JSON request (ExportMetricsServiceRequest) to
otlp.endpoint (needs enabled and otlp.enabled). Header values come from the environment
variables named in otlp.headers_env. Bounded retries (otlp.max_retries).

Options:
  --dry-run      Print the request (header values redacted) instead of sending it
  --allow-stale  Send even if the snapshot is older than otlp.stale_after_seconds

Exit codes: 0 sent (or disabled by policy), 1 not sent (snapshot missing, invalid or stale,
request over otlp.max_request_bytes, receiver failure after retries), 2 invalid policy,
usage or environment.
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.otlp.enabled,
    push: |p| &p.otlp.push,
    action: Action::Plan(plan),
};

/// Value of the `service.name` resource attribute.
pub const SERVICE_NAME: &str = "svc";
/// Instrumentation scope name.
pub const SCOPE_NAME: &str = "svc-observe";
/// `Content-Type` of OTLP/HTTP JSON.
pub const CONTENT_TYPE: &str = "application/json";
/// Largest answer body read from an OTLP receiver (an `ExportMetricsServiceResponse`).
pub const MAX_RESPONSE_BYTES: u64 = 65_536;

/// The transport settings shared by the OTLP connector and its profiles.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub block: &'static str,
    pub endpoint: &'a str,
    pub push: &'a PushSettings,
    pub headers_env: &'a BTreeMap<String, String>,
}

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    let o = &ctx.policy.otlp;
    let target = Target {
        block: "otlp",
        endpoint: o.endpoint.as_deref().unwrap_or_default(),
        push: &o.push,
        headers_env: &o.headers_env,
    };
    otlp_plan(ctx, &target, &[])
}

/// An OTLP/HTTP 2xx answer may report a partial success: `partialSuccess.rejectedDataPoints`
/// above zero means the receiver dropped that many points, and the export is a failure
/// (permanent: sending the request again would duplicate the accepted points). An empty or
/// non-JSON body, or `partialSuccess` without rejected points, is a full success.
pub fn check_answer(body: &[u8]) -> Result<(), String> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Ok(());
    };
    let Some(partial) = v.get("partialSuccess") else {
        return Ok(());
    };
    // int64 travels as a string in the OTLP JSON mapping; some receivers write a number.
    let rejected = match partial.get("rejectedDataPoints") {
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        Some(Value::Number(n)) => n.as_u64(),
        _ => Some(0),
    };
    match rejected {
        Some(0) => Ok(()),
        rejected => {
            let count = rejected.map_or_else(|| "some".to_string(), |n| n.to_string());
            let why = partial
                .get("errorMessage")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
                .unwrap_or("no message");
            Err(format!(
                "the receiver rejected {count} data points (partialSuccess: {})",
                PeerText::with_limit(why, 200)
            ))
        }
    }
}

/// Builds the request of an OTLP-style connector: body with the given extra resource
/// attributes, `Content-Type`, the `headers_env` headers.
pub fn otlp_plan(
    ctx: &Context<'_>,
    target: &Target<'_>,
    resource_extra: &[(&str, &str)],
) -> Result<Plan, ExportError> {
    if target.endpoint.is_empty() {
        return Err(ExportError::Render(format!(
            "{}.endpoint: is required when the connector is enabled",
            target.block
        )));
    }
    let p = ctx.prepared();
    let (body, metrics) = request_body(ctx.policy, &p.selection, &p.snapshot, resource_extra);
    let mut headers = vec![Header::plain("Content-Type", CONTENT_TYPE)];
    headers.extend(resolve_headers(target.block, target.headers_env, &[])?);
    Ok(Plan {
        delivery: Delivery::Http {
            requests: vec![HttpRequest {
                method: Method::Post,
                url: signal_url(target.endpoint),
                headers,
                body,
                check: Some(check_answer),
                what: format!("OTLP request ({metrics} metrics)"),
            }],
            timeout: target.push.timeout(),
            max_response_bytes: MAX_RESPONSE_BYTES,
        },
        limit: Limit::of(target.block, target.push),
        retry: Retry::of(target.push),
        metrics,
        redact: Vec::new(),
    })
}

/// The OTLP/HTTP path of the metrics signal.
pub const METRICS_PATH: &str = "/v1/metrics";

/// The URL a request goes to, by the OpenTelemetry exporter convention: a base URL without a
/// path (`https://collector:4318`, or with `/` only) gets [`METRICS_PATH`]; a URL with any
/// other path (normally one that already names the signal, `.../v1/metrics`, or a vendor's own
/// ingestion path) is used as given, query included. The endpoint was validated by the policy
/// (absolute http(s) URL); something unparsable is passed through for the transport to refuse.
pub fn signal_url(endpoint: &str) -> String {
    match url::Url::parse(endpoint) {
        Ok(mut u) if u.path().is_empty() || u.path() == "/" => {
            u.set_path(METRICS_PATH);
            u.to_string()
        }
        _ => endpoint.to_string(),
    }
}

fn string_attr(key: &str, value: &str) -> Value {
    json!({"key": key, "value": {"stringValue": value}})
}

/// A double for the JSON encoding: non-finite values as the strings protobuf JSON accepts.
pub fn json_double(v: f64) -> Value {
    if v.is_nan() {
        Value::from("NaN")
    } else if v == f64::INFINITY {
        Value::from("Infinity")
    } else if v == f64::NEG_INFINITY {
        Value::from("-Infinity")
    } else {
        json!(v)
    }
}

/// A counter value: `asInt` (a string) when integral and within int64, else `asDouble`.
fn number_point(v: f64) -> (&'static str, Value) {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 9.0e18 {
        ("asInt", Value::from((v as i64).to_string()))
    } else {
        ("asDouble", json_double(v))
    }
}

fn unit_of(suffix: &str) -> &'static str {
    if suffix.ends_with("_seconds") {
        "s"
    } else {
        ""
    }
}

/// The `ExportMetricsServiceRequest` JSON and the number of approved metrics in it.
pub fn request_body(
    policy: &Policy,
    selection: &crate::select::Selection,
    snapshot: &svc_snapshot::Snapshot,
    resource_extra: &[(&str, &str)],
) -> (Vec<u8>, usize) {
    let start = epoch_nanos(snapshot.started_at_epoch_seconds).to_string();
    let time = epoch_nanos(snapshot.generated_at_epoch_seconds).to_string();
    let mut metrics: Vec<Value> = Vec::new();
    for m in &selection.metrics {
        let name = metric_name(policy, &m.suffix);
        let unit = unit_of(&m.suffix);
        match (m.kind, &m.sample) {
            (Kind::Counter, sample) => {
                let mut points = Vec::new();
                if let Some(Sample::Counter(v)) = sample {
                    let value = if *v <= i64::MAX as u64 {
                        ("asInt", Value::from(v.to_string()))
                    } else {
                        ("asDouble", json_double(*v as f64))
                    };
                    points.push(json!({
                        "startTimeUnixNano": start, "timeUnixNano": time, value.0: value.1
                    }));
                }
                for (label, v) in &m.labeled {
                    let (k, val) = number_point(*v);
                    points.push(json!({
                        "attributes": [string_attr(LABEL_NAME, label)],
                        "startTimeUnixNano": start, "timeUnixNano": time, k: val
                    }));
                }
                if points.is_empty() {
                    continue;
                }
                metrics.push(json!({
                    "name": name, "description": m.help, "unit": unit,
                    "sum": {"dataPoints": points, "aggregationTemporality": 2, "isMonotonic": true}
                }));
            }
            (Kind::Gauge, Some(Sample::Gauge(v))) => {
                metrics.push(gauge(&name, &m.help, unit, &time, *v));
            }
            (Kind::Summary, Some(Sample::Summary(s))) => {
                metrics.push(summary(&name, &m.help, unit, &start, &time, s));
                if s.count > 0 {
                    metrics.push(gauge(
                        &format!("{name}_last"),
                        &format!("Most recent observation of {name} since the runner started."),
                        unit,
                        &time,
                        s.last,
                    ));
                }
            }
            _ => continue,
        }
    }
    let count = selection.metrics.len();
    let mut resource = vec![
        string_attr("service.name", SERVICE_NAME),
        string_attr("service.version", env!("CARGO_PKG_VERSION")),
    ];
    for (k, v) in resource_extra {
        resource.push(string_attr(k, v));
    }
    let doc = json!({
        "resourceMetrics": [{
            "resource": {"attributes": resource},
            "scopeMetrics": [{
                "scope": {"name": SCOPE_NAME, "version": env!("CARGO_PKG_VERSION")},
                "metrics": metrics
            }]
        }]
    });
    (
        serde_json::to_vec(&doc).expect("JSON values always serialize"),
        count,
    )
}

fn gauge(name: &str, help: &str, unit: &str, time: &str, v: f64) -> Value {
    json!({
        "name": name, "description": help, "unit": unit,
        "gauge": {"dataPoints": [{"timeUnixNano": time, "asDouble": json_double(v)}]}
    })
}

fn summary(name: &str, help: &str, unit: &str, start: &str, time: &str, s: &Summary) -> Value {
    let mut point = json!({
        "startTimeUnixNano": start, "timeUnixNano": time,
        "count": s.count.to_string(), "sum": json_double(s.sum)
    });
    if s.count > 0 {
        point["quantileValues"] = json!([
            {"quantile": 0.0, "value": json_double(s.min)},
            {"quantile": 1.0, "value": json_double(s.max)}
        ]);
    }
    json!({
        "name": name, "description": help, "unit": unit,
        "summary": {"dataPoints": [point]}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_path_by_the_exporter_convention() {
        for (given, sent) in [
            (
                "https://collector:4318",
                "https://collector:4318/v1/metrics",
            ),
            (
                "https://collector:4318/",
                "https://collector:4318/v1/metrics",
            ),
            (
                "http://127.0.0.1:4318/?tenant=a",
                "http://127.0.0.1:4318/v1/metrics?tenant=a",
            ),
            (
                "https://collector:4318/v1/metrics",
                "https://collector:4318/v1/metrics",
            ),
            (
                "https://otlp.example/otlp/v1/metrics",
                "https://otlp.example/otlp/v1/metrics",
            ),
            (
                "https://vendor.example/ingest",
                "https://vendor.example/ingest",
            ),
        ] {
            assert_eq!(signal_url(given), sent, "{given}");
        }
    }

    #[test]
    fn doubles_and_ints_follow_the_json_mapping() {
        assert_eq!(json_double(0.5), json!(0.5));
        assert_eq!(json_double(f64::NAN), json!("NaN"));
        assert_eq!(json_double(f64::INFINITY), json!("Infinity"));
        assert_eq!(json_double(f64::NEG_INFINITY), json!("-Infinity"));
        assert_eq!(number_point(700.0), ("asInt", json!("700")));
        assert_eq!(number_point(0.5), ("asDouble", json!(0.5)));
        assert_eq!(number_point(1e19), ("asDouble", json!(1e19)));
        assert_eq!(unit_of("sink_batch_write_seconds"), "s");
        assert_eq!(unit_of("messages_acked_total"), "");
    }
}
