//! `cloud-a-export`: OCI Monitoring `PostMetricData`, signed with the OCI HTTP signature
//! (version 1, [`self::signature`]) of the identity `auth_mode` names
//! ([`self::auth`]). No SDK.
//!
//! ```text
//! POST https://telemetry-ingestion.<region>.oraclecloud.com/20180401/metrics
//! date, host, content-type: application/json, content-length, x-content-sha256, authorization
//!
//! {"metricData": [{"namespace": "svc_metrics", "compartmentId": "ocid1.compartment...",
//!    "resourceGroup": "...", "name": "svc_messages_acked_total",
//!    "dimensions": {"source": "svc"}, "metadata": {...},
//!    "datapoints": [{"timestamp": "2024-05-17T12:34:56.250Z", "value": 1200}]}, ...],
//!  "batchAtomicity": "ATOMIC"}
//! ```
//!
//! - Counters and gauges: one datapoint with the value. A summary: `<name>` with
//!   `value` = sum / count and `count` = count (OCI weighs a datapoint by its count, so the
//!   service's sum and count statistics come out right), plus `<name>_min` and `<name>_max`
//!   (a datapoint's value cannot carry them). Subject-family rows only with
//!   `include_metric_labels_as_dimensions`, with the extra dimension `subject_family`.
//! - Every entry: the static `dimensions` (at least one), `metadata` when not empty,
//!   `resourceGroup` when set, the snapshot's time. OCI accepts datapoints at most two hours old:
//!   an older snapshot is not sent.
//! - At most `max_metrics_per_request` entries per request (cap 50); every body is checked
//!   against `max_request_bytes` before the first request. A 200 answer with
//!   `failedMetricsCount` > 0 (possible with `NON_ATOMIC`) is a failure.
//! - `--dry-run` hides `compartment_id`, `region`, the key id and the signature.
//! - Test hook: `SVC_CLOUD_A_ENDPOINT_OVERRIDE` (a loopback `http(s)://host:port`) replaces
//!   `https://telemetry-ingestion.<region>.oraclecloud.com`; any other host is refused. The
//!   instance principal's hooks are in [`self::instance`].

pub mod auth;
pub mod identity;
pub mod instance;
pub mod signature;

use serde_json::{json, Map, Value as Json};

use self::signature::Signer;
use super::cloud::{self, Datum, Value};
use super::{
    Action, Connector, Context, Delivery, ExportError, Header, HttpRequest, Input, Limit, Method,
    Plan, Retry, Secret,
};
use crate::policy::oci::AuthMode;
use crate::policy::OciMonitoring;
use svc_host::{Env, ProcessEnv};
use svc_text::peer::PeerText;

pub const CONNECTOR: Connector = Connector {
    command: "cloud-a-export",
    block: "cloud_a_monitoring",
    summary: "Send the approved metrics to cloud A monitoring (OCI PostMetricData, signed).",
    help: "\
Usage: svc-observe cloud-a-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

Posts the approved metrics to cloud A monitoring (OCI PostMetricData at
https://telemetry-ingestion.<region>.oraclecloud.com/20180401/metrics), at most
cloud_a_monitoring.max_metrics_per_request entries per request, each request signed with the
OCI HTTP signature (needs enabled and cloud_a_monitoring.enabled). OCI accepts datapoints at
most two hours old: an older snapshot is not sent.

Identity (cloud_a_monitoring.auth_mode):
  config_file         API key: user, tenancy, fingerprint and key_file of the profile in the
                      SDK config file cloud_a_monitoring.config_file (unencrypted PEM keys)
  resource_principal  resource principal 2.2 from OCI_RESOURCE_PRINCIPAL_VERSION, _RPST,
                      _PRIVATE_PEM and _REGION (set by the platform)
  instance_principal  the instance's certificate and key from the instance metadata service
                      (169.254.169.254), exchanged at auth.<region>.oraclecloud.com/v1/x509
                      for a session token with a fresh RSA session key (once per run)

Options:
  --dry-run      Print the signed requests (compartment, region, key id and signature
                 redacted); send nothing
  --allow-stale  Send even if the snapshot is older than cloud_a_monitoring.stale_after_seconds

Exit codes: 0 sent (or disabled by policy), 1 not sent (snapshot missing, invalid or stale, a
request over max_request_bytes, rejected or failed after retries, an instance principal step
failed: metadata service, federation service), 2 invalid policy, usage, identity or environment.
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.cloud_a_monitoring.enabled,
    push: |p| &p.cloud_a_monitoring.push,
    action: Action::Plan(plan),
};

pub const BLOCK: &str = "cloud_a_monitoring";
/// API path of PostMetricData.
pub const PATH: &str = "/20180401/metrics";
/// Test-only replacement of the ingestion endpoint (loopback only).
pub const ENDPOINT_OVERRIDE_ENV: &str = "SVC_CLOUD_A_ENDPOINT_OVERRIDE";
/// Largest answer body read (the answer lists failed metrics).
pub const MAX_RESPONSE_BYTES: u64 = 262_144;
/// OCI rejects datapoints more than two hours old.
pub const MAX_AGE_SECONDS: f64 = 2.0 * 3600.0;

/// One `metricData` entry without the per-request fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: String,
    pub family: Option<String>,
    pub value: f64,
    pub count: Option<u64>,
}

/// Data points -> entries (a summary becomes the weighted mean plus `_min` and `_max`).
pub fn entries(data: &[Datum]) -> Vec<Entry> {
    let mut out = Vec::with_capacity(data.len());
    for d in data {
        match d.value {
            Value::Single(v) => out.push(Entry {
                name: d.name.clone(),
                family: d.family.clone(),
                value: v,
                count: None,
            }),
            Value::Stats {
                count,
                sum,
                min,
                max,
            } => {
                out.push(Entry {
                    name: d.name.clone(),
                    family: d.family.clone(),
                    value: sum / count as f64,
                    count: Some(count),
                });
                for (suffix, v) in [("min", min), ("max", max)] {
                    out.push(Entry {
                        name: format!("{}_{suffix}", d.name),
                        family: d.family.clone(),
                        value: v,
                        count: None,
                    });
                }
            }
        }
    }
    out
}

/// OCI metric names: a letter, then letters, digits, `.`, `_`, `-`, `$`.
pub fn is_metric_name(name: &str) -> bool {
    name.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-$".contains(&b))
}

/// The body of one request.
pub fn body(cfg: &OciMonitoring, compartment: &str, entries: &[Entry], timestamp: &str) -> Json {
    let data: Vec<Json> = entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("namespace".into(), json!(cfg.metric_namespace));
            m.insert("compartmentId".into(), json!(compartment));
            if let Some(g) = &cfg.resource_group {
                m.insert("resourceGroup".into(), json!(g));
            }
            m.insert("name".into(), json!(e.name));
            let mut dims: Map<String, Json> = cfg
                .dimensions
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            if let Some(f) = &e.family {
                dims.insert(crate::families::LABEL_NAME.into(), json!(f));
            }
            m.insert("dimensions".into(), Json::Object(dims));
            if !cfg.metadata.is_empty() {
                m.insert("metadata".into(), json!(cfg.metadata));
            }
            let mut point = Map::new();
            point.insert("timestamp".into(), json!(timestamp));
            point.insert("value".into(), json!(e.value));
            if let Some(c) = e.count {
                point.insert("count".into(), json!(c));
            }
            m.insert("datapoints".into(), json!([Json::Object(point)]));
            Json::Object(m)
        })
        .collect();
    let atomicity = serde_json::to_value(cfg.batch_atomicity).expect("enum serializes");
    json!({"metricData": data, "batchAtomicity": atomicity})
}

/// A 200 answer lists the entries OCI rejected; any is a failure (messages only: the entries
/// themselves carry the compartment).
pub fn check_answer(body: &[u8]) -> Result<(), String> {
    let v: Json = serde_json::from_slice(body)
        .map_err(|_| "the PostMetricData answer is not JSON".to_string())?;
    let failed = v
        .get("failedMetricsCount")
        .and_then(Json::as_u64)
        .ok_or("the PostMetricData answer has no failedMetricsCount")?;
    if failed == 0 {
        return Ok(());
    }
    let first = v
        .get("failedMetrics")
        .and_then(Json::as_array)
        .and_then(|a| a.first())
        .and_then(|f| f.get("message"))
        .and_then(Json::as_str)
        .unwrap_or("no message");
    let first = PeerText::with_limit(first, 200);
    Err(format!(
        "OCI rejected {failed} metric{} of the batch (first: {first})",
        if failed == 1 { "" } else { "s" }
    ))
}

/// Signed headers of one request body.
pub fn signed_headers(
    signer: &Signer,
    host: &str,
    body: &[u8],
    now: time::OffsetDateTime,
) -> Result<Vec<Header>, ExportError> {
    let signed = signer
        .sign(
            &signature::Request {
                method: "POST",
                host,
                path: PATH,
                body: Some(("application/json", body)),
            },
            now,
        )
        .map_err(|e| ExportError::Render(format!("{BLOCK}: signing failed: {e}")))?;
    let mut headers = vec![Header::plain("host", host)];
    for (name, value) in signed {
        if name == "authorization" {
            headers.push(Header::secret(&name, Secret::new(value)));
        } else {
            headers.push(Header::plain(&name, &value));
        }
    }
    Ok(headers)
}

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    let now = time::OffsetDateTime::now_utc();
    plan_with(ctx, &ProcessEnv, now)
}

/// The plan with the environment and the clock given (tests).
pub fn plan_with(
    ctx: &Context<'_>,
    env: &dyn Env,
    now: time::OffsetDateTime,
) -> Result<Plan, ExportError> {
    let cfg = &ctx.policy.cloud_a_monitoring;
    let required = |field: &str| {
        ExportError::Environment(format!(
            "{BLOCK}.{field}: is required when the connector is enabled"
        ))
    };
    let region = cfg.region.as_deref().ok_or_else(|| required("region"))?;
    let compartment = cfg
        .compartment_id
        .as_deref()
        .ok_or_else(|| required("compartment_id"))?;
    let prepared = ctx.prepared();
    cloud::check_vendor_window(
        BLOCK,
        "OCI Monitoring",
        prepared.snapshot.age_seconds(),
        MAX_AGE_SECONDS,
    )?;
    let base = cloud::loopback_override(env, ENDPOINT_OVERRIDE_ENV)?
        .unwrap_or_else(|| format!("https://telemetry-ingestion.{region}.oraclecloud.com"));
    let host = cloud::host_of(&base).to_string();
    let entries = entries(&cloud::data(ctx, cfg.include_metric_labels_as_dimensions));
    if let Some(bad) = entries.iter().find(|e| !is_metric_name(&e.name)) {
        return Err(ExportError::Render(format!(
            "{BLOCK}: metric name {} is not valid for OCI (it must start with a letter; check the policy namespace)",
            bad.name
        )));
    }
    let identity = if cfg.auth_mode == AuthMode::InstancePrincipal {
        // Network steps: an unreachable or refusing service is a failed run (exit 1).
        let timeout = cfg.push.timeout();
        instance::identity(env, timeout, &ctx.deadline, now).map_err(|e| match e {
            instance::InstanceError::Failed(m) => ExportError::Send {
                block: BLOCK,
                sent: 0,
                total: entries.len(),
                last: m,
            },
            instance::InstanceError::Invalid(m) => {
                ExportError::Environment(format!("{BLOCK}: {m}"))
            }
        })?
    } else {
        auth::identity(cfg, env, now.unix_timestamp())
            .map_err(|e| ExportError::Environment(format!("{BLOCK}: {e}")))?
    };
    log::info!("{BLOCK}: signing with {}", identity.source);
    let timestamp = cloud::rfc3339_millis(prepared.snapshot.generated_at_epoch_seconds);
    let chunks: Vec<&[Entry]> = cloud::batches(&entries, cfg.max_metrics_per_request).collect();
    let total = chunks.len();
    let mut requests = Vec::with_capacity(total);
    for (i, chunk) in chunks.into_iter().enumerate() {
        let body = serde_json::to_vec(&body(cfg, compartment, chunk, &timestamp))
            .expect("JSON values always serialize");
        requests.push(HttpRequest {
            method: Method::Post,
            url: format!("{base}{PATH}"),
            headers: signed_headers(&identity.signer, &host, &body, now)?,
            body,
            check: Some(check_answer),
            what: format!(
                "PostMetricData request {} of {total} ({} entries)",
                i + 1,
                chunk.len()
            ),
        });
    }
    // The key id holds OCIDs (tenancy, user) or a session token: never printed.
    let mut redact = vec![compartment.to_string(), region.to_string()];
    redact.extend(
        identity
            .signer
            .key_id()
            .split(['/', '$'])
            .filter(|p| p.len() >= 16)
            .map(str::to_string),
    );
    Ok(Plan {
        delivery: Delivery::Http {
            requests,
            timeout: cfg.push.timeout(),
            max_response_bytes: MAX_RESPONSE_BYTES,
        },
        limit: Limit::of(BLOCK, &cfg.push),
        retry: Retry::of(&cfg.push),
        metrics: entries.len(),
        redact,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    /// Found by `fuzz/fuzz_targets/cloud_answers.rs`: the rejection message of the answer
    /// reached the error text with its control characters.
    #[test]
    fn answer_messages_are_escaped() {
        let e = check_answer(
            br#"{"failedMetricsCount": 1, "failedMetrics": [{"message": "bad\nforged \u001b[2J"}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "OCI rejected 1 metric of the batch (first: bad\\nforged \\u{1b}[2J)"
        );
    }

    #[test]
    fn summaries_become_weighted_means_with_min_and_max() {
        let e = entries(&[
            Datum {
                name: "svc_x_seconds".into(),
                family: None,
                value: Value::Stats {
                    count: 4,
                    sum: 2.0,
                    min: 0.1,
                    max: 1.5,
                },
            },
            Datum {
                name: "svc_a_total".into(),
                family: Some("orders".into()),
                value: Value::Single(7.0),
            },
        ]);
        assert_eq!(
            e,
            vec![
                Entry {
                    name: "svc_x_seconds".into(),
                    family: None,
                    value: 0.5,
                    count: Some(4)
                },
                Entry {
                    name: "svc_x_seconds_min".into(),
                    family: None,
                    value: 0.1,
                    count: None
                },
                Entry {
                    name: "svc_x_seconds_max".into(),
                    family: None,
                    value: 1.5,
                    count: None
                },
                Entry {
                    name: "svc_a_total".into(),
                    family: Some("orders".into()),
                    value: 7.0,
                    count: None
                },
            ]
        );
    }

    #[test]
    fn bodies_follow_the_api() {
        let p = Policy::parse(
            r#"{"schema": "svc.observability.policy.v1",
                "cloud_a_monitoring": {"resource_group": "svc-prod", "batch_atomicity": "NON_ATOMIC",
                  "dimensions": {"source": "svc", "env": "prod"}, "metadata": {"unit": "count"}}}"#,
        )
        .unwrap();
        let b = body(
            &p.cloud_a_monitoring,
            "ocid1.compartment.oc1..aaaa",
            &[
                Entry {
                    name: "svc_a_total".into(),
                    family: None,
                    value: 3.0,
                    count: None,
                },
                Entry {
                    name: "svc_a_total".into(),
                    family: Some("orders".into()),
                    value: 2.0,
                    count: None,
                },
                Entry {
                    name: "svc_t_seconds".into(),
                    family: None,
                    value: 0.5,
                    count: Some(4),
                },
            ],
            "2024-05-17T12:34:56.250Z",
        );
        let entry = |name: &str, dims: Json, point: Json| {
            json!({"namespace": "svc_metrics", "compartmentId": "ocid1.compartment.oc1..aaaa",
                   "resourceGroup": "svc-prod", "name": name, "dimensions": dims,
                   "metadata": {"unit": "count"}, "datapoints": [point]})
        };
        assert_eq!(
            b,
            json!({"metricData": [
                entry("svc_a_total", json!({"env": "prod", "source": "svc"}),
                      json!({"timestamp": "2024-05-17T12:34:56.250Z", "value": 3.0})),
                entry("svc_a_total", json!({"env": "prod", "source": "svc", "subject_family": "orders"}),
                      json!({"timestamp": "2024-05-17T12:34:56.250Z", "value": 2.0})),
                entry("svc_t_seconds", json!({"env": "prod", "source": "svc"}),
                      json!({"timestamp": "2024-05-17T12:34:56.250Z", "value": 0.5, "count": 4})),
            ], "batchAtomicity": "NON_ATOMIC"})
        );
        let p = Policy::disabled();
        let b = body(&p.cloud_a_monitoring, "c", &[], "t");
        assert_eq!(b, json!({"metricData": [], "batchAtomicity": "ATOMIC"}));
    }

    #[test]
    fn answers() {
        assert!(check_answer(br#"{"failedMetricsCount": 0, "failedMetrics": []}"#).is_ok());
        assert_eq!(
            check_answer(br#"{"failedMetricsCount": 2, "failedMetrics": [{"message": "bad dimension", "metricData": {"compartmentId": "x"}}]}"#).unwrap_err(),
            "OCI rejected 2 metrics of the batch (first: bad dimension)"
        );
        assert!(check_answer(b"<html>").is_err());
        assert!(check_answer(b"{}").is_err());
    }

    #[test]
    fn metric_names() {
        assert!(is_metric_name("svc_messages_acked_total"));
        assert!(is_metric_name("a.b-c$d"));
        assert!(!is_metric_name("_svc_x"));
        assert!(!is_metric_name(""));
    }
}
