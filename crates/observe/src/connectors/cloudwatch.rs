//! `cloud-b-export`: Amazon CloudWatch `PutMetricData` (query protocol, form-encoded POST),
//! signed with AWS Signature Version 4 ([`svc_aws::sigv4`]). No SDK.
//!
//! ```text
//! POST https://monitoring.<region>.amazonaws.com/
//! Content-Type: application/x-www-form-urlencoded; charset=utf-8
//!
//! Action=PutMetricData&Version=2010-08-01&Namespace=svc%2Fmetrics
//! &MetricData.member.1.MetricName=svc_messages_acked_total
//! &MetricData.member.1.Timestamp=2024-05-17T12:34:56.250Z
//! &MetricData.member.1.Value=1200&MetricData.member.1.Unit=Count
//! &MetricData.member.1.StorageResolution=60
//! &MetricData.member.1.Dimensions.member.1.Name=env&MetricData.member.1.Dimensions.member.1.Value=prod
//! &MetricData.member.2.MetricName=svc_sink_batch_write_seconds
//! &MetricData.member.2.StatisticValues.SampleCount=40&...Sum=1.9&...Minimum=0.01&...Maximum=0.2
//! ```
//!
//! - Data points come from [`super::cloud::data`]: counters and gauges as `Value`, summaries as
//!   `StatisticValues` (SampleCount, Sum, Minimum, Maximum), subject-family rows (only with
//!   `include_metric_labels_as_dimensions`) with the extra dimension `subject_family`.
//! - Every datum carries `unit`, `storage_resolution`, the static `dimensions` and the
//!   snapshot's time as `Timestamp`.
//! - At most `max_metrics_per_request` data per request (cap 1000); every request body is
//!   checked against `max_request_bytes` before the first one is sent.
//! - Credentials: the AWS default chain [`svc_aws::chain`] (environment, web identity,
//!   profile `AWS_PROFILE` with static keys, `role_arn` or `credential_process`, container
//!   endpoint, IMDSv2), the region being the STS region when none is set. Endpoint: `AWS_ENDPOINT_URL_CLOUDWATCH`, `AWS_ENDPOINT_URL`,
//!   else `https://monitoring.<region>.amazonaws.com`.
//! - `--dry-run` prints the requests with `Authorization` and `X-Amz-Security-Token` as
//!   `<redacted>` and the region replaced by `<redacted>`.

use super::cloud::{self, Datum, Value};
use super::{
    Action, Connector, Context, Delivery, ExportError, Header, HttpRequest, Input, Limit, Method,
    Plan, Retry, Secret,
};
use crate::exposition::format_value;
use crate::policy::checks::{is_loopback_host, parse_endpoint};
use crate::policy::CloudWatch;
use svc_aws::chain;
use svc_aws::credentials::{CredentialError, Credentials};
use svc_aws::{endpoint_override, sigv4, Env, ProcessEnv};
use svc_text::peer::PeerText;

pub const CONNECTOR: Connector = Connector {
    command: "cloud-b-export",
    block: "cloud_b_monitoring",
    summary: "Send the approved metrics to cloud B monitoring (CloudWatch PutMetricData, SigV4).",
    help: "\
Usage: svc-observe cloud-b-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

Sends the approved metrics to cloud B monitoring with PutMetricData (query protocol, signed
with AWS Signature Version 4), at most cloud_b_monitoring.max_metrics_per_request data per
request, in cloud_b_monitoring.metric_namespace (needs enabled and
cloud_b_monitoring.enabled). Counters and gauges are sent as values, summaries as statistic
sets; subject-family rows only with include_metric_labels_as_dimensions.

Credentials: the AWS default chain, first source configured wins: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY and optional AWS_SESSION_TOKEN; AWS_WEB_IDENTITY_TOKEN_FILE with
AWS_ROLE_ARN (STS AssumeRoleWithWebIdentity); profile AWS_PROFILE (default `default`) of the
shared credentials file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials) and config file
(AWS_CONFIG_FILE or ~/.aws/config): static keys, role_arn with source_profile (STS AssumeRole)
or credential_process; AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI; instance metadata
(IMDSv2; AWS_EC2_METADATA_DISABLED=true skips it). STS: AWS_ENDPOINT_URL_STS, else
AWS_ENDPOINT_URL, else https://sts.<region>.amazonaws.com.
Endpoint: AWS_ENDPOINT_URL_CLOUDWATCH, else AWS_ENDPOINT_URL, else
https://monitoring.<region>.amazonaws.com (plain http only to loopback).

Options:
  --dry-run      Print the signed requests (credentials and region redacted); send nothing
  --allow-stale  Send even if the snapshot is older than cloud_b_monitoring.stale_after_seconds

Exit codes: 0 sent (or disabled by policy), 1 not sent (snapshot missing, invalid or stale, a
request over max_request_bytes, rejected or failed after retries), 2 invalid policy, usage or
environment (no credentials, bad endpoint variable).
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.cloud_b_monitoring.enabled,
    push: |p| &p.cloud_b_monitoring.push,
    action: Action::Plan(plan),
};

pub const BLOCK: &str = "cloud_b_monitoring";
/// Signing name of the service.
pub const SERVICE: &str = "monitoring";
/// `Content-Type` of the query protocol.
pub const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
/// Largest answer body read.
pub const MAX_RESPONSE_BYTES: u64 = 65_536;
/// CloudWatch accepts data points up to two weeks old.
pub const MAX_AGE_SECONDS: f64 = 14.0 * 86_400.0;

/// Percent-encoding of the query protocol (RFC 3986: unreserved characters kept, `/` encoded).
pub fn encode(s: &str) -> String {
    sigv4::uri_encode(s, true)
}

/// The form body of one `PutMetricData` request.
pub fn body(cfg: &CloudWatch, data: &[Datum], timestamp: &str) -> String {
    let mut pairs: Vec<(String, String)> = vec![
        ("Action".into(), "PutMetricData".into()),
        ("Version".into(), "2010-08-01".into()),
        ("Namespace".into(), cfg.metric_namespace.clone()),
    ];
    for (i, d) in data.iter().enumerate() {
        let m = format!("MetricData.member.{}", i + 1);
        pairs.push((format!("{m}.MetricName"), d.name.clone()));
        pairs.push((format!("{m}.Timestamp"), timestamp.to_string()));
        match d.value {
            Value::Single(v) => pairs.push((format!("{m}.Value"), format_value(v))),
            Value::Stats {
                count,
                sum,
                min,
                max,
            } => {
                let s = format!("{m}.StatisticValues");
                pairs.push((format!("{s}.SampleCount"), count.to_string()));
                pairs.push((format!("{s}.Sum"), format_value(sum)));
                pairs.push((format!("{s}.Minimum"), format_value(min)));
                pairs.push((format!("{s}.Maximum"), format_value(max)));
            }
        }
        pairs.push((format!("{m}.Unit"), cfg.unit.clone()));
        pairs.push((
            format!("{m}.StorageResolution"),
            cfg.storage_resolution.to_string(),
        ));
        let dims = cfg
            .dimensions
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(d.family_dimension());
        for (j, (name, value)) in dims.enumerate() {
            let dm = format!("{m}.Dimensions.member.{}", j + 1);
            pairs.push((format!("{dm}.Name"), name.to_string()));
            pairs.push((format!("{dm}.Value"), value.to_string()));
        }
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The signed request headers for one body.
pub fn signed_headers(
    host: &str,
    region: &str,
    body: &[u8],
    creds: &Credentials,
    now: time::OffsetDateTime,
) -> Vec<Header> {
    let amz_date = sigv4::amz_date(now);
    let mut signed = sigv4::sign(
        &sigv4::Request {
            method: "POST",
            host,
            path: "/",
            query: "",
            headers: &[("Content-Type", CONTENT_TYPE)],
            payload_sha256: &sigv4::hex_sha256(body),
        },
        &sigv4::Scope {
            region,
            service: SERVICE,
            amz_date: &amz_date,
        },
        creds,
    );
    let mut headers = vec![
        Header::plain("Host", host),
        Header::plain("Content-Type", CONTENT_TYPE),
    ];
    for (name, value) in signed.headers.iter_mut() {
        if name == "X-Amz-Date" {
            headers.push(Header::plain(name, value));
        } else {
            // Moved, not copied: `Signed` wipes what is left (nothing) as it drops.
            headers.push(Header::secret(name, Secret::new(std::mem::take(value))));
        }
    }
    headers
}

/// A 2xx answer must not be an error document: CloudWatch answers `PutMetricData` with a
/// `PutMetricDataResponse` (query protocol); a body holding an `ErrorResponse`/`Error` element
/// or a JSON `__type` (a proxy or a broken endpoint answering 200) is a failure.
pub fn check_answer(body: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let xml_error = text.contains("<ErrorResponse") || text.contains("<Error>");
    let json_error = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| {
            v.get("__type")
                .or_else(|| v.get("Error"))
                .map(|t| t.as_str().unwrap_or("error").to_string())
        });
    if !xml_error && json_error.is_none() {
        return Ok(());
    }
    let code = json_error
        .or_else(|| xml_text(text, "Code"))
        .unwrap_or_else(|| "no code".into());
    let message = xml_text(text, "Message")
        .or_else(|| {
            serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|v| {
                    v.get("message")
                        .or_else(|| v.get("Message"))
                        .and_then(|m| m.as_str().map(str::to_string))
                })
        })
        .unwrap_or_else(|| "no message".into());
    Err(format!(
        "the 2xx answer is an error document: {}: {}",
        PeerText::with_limit(&code, 64),
        PeerText::with_limit(&message, 200)
    ))
}

/// The text of the first `<name>` element (no entity decoding: shown escaped anyway).
fn xml_text(text: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = text.find(&open)? + open.len();
    let end = start + text[start..].find(&format!("</{name}>"))?;
    Some(text[start..end].to_string())
}

/// The endpoint to call: `AWS_ENDPOINT_URL_CLOUDWATCH`, else `AWS_ENDPOINT_URL`, else
/// `https://monitoring.<region>.amazonaws.com` (the variables are ignored when
/// `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS` is `true`). An override must be `http(s)://host[:port]`
/// with an empty or `/` path, no credentials, query or fragment; plain http only to loopback.
/// Returns `(base URL without trailing slash, Host header value, which variable)`.
pub fn endpoint(
    env: &dyn Env,
    region: &str,
) -> Result<(String, String, Option<&'static str>), CredentialError> {
    let Some((var, url)) = endpoint_override(env, "AWS_ENDPOINT_URL_CLOUDWATCH") else {
        let host = format!("monitoring.{region}.amazonaws.com");
        return Ok((format!("https://{host}"), host, None));
    };
    let ep = parse_endpoint(&url).map_err(|why| CredentialError(format!("{var} {why}")))?;
    if !(ep.path.is_empty() || ep.path == "/") {
        return Err(CredentialError(format!(
            "{var} must be scheme, host and optional port, without a path"
        )));
    }
    if !ep.https && !is_loopback_host(&ep.host) {
        return Err(CredentialError(format!(
            "{var}: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https"
        )));
    }
    let host = match ep.port {
        Some(p) => format!("{}:{p}", ep.host),
        None => ep.host.clone(),
    };
    let scheme = if ep.https { "https" } else { "http" };
    Ok((format!("{scheme}://{host}"), host, Some(var)))
}

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    plan_with(ctx, &ProcessEnv, time::OffsetDateTime::now_utc())
}

/// The plan, with the environment and the clock given (tests).
pub fn plan_with(
    ctx: &Context<'_>,
    env: &dyn Env,
    now: time::OffsetDateTime,
) -> Result<Plan, ExportError> {
    let cfg = &ctx.policy.cloud_b_monitoring;
    let region = cfg.region.as_deref().ok_or_else(|| {
        ExportError::Environment(format!(
            "{BLOCK}.region: is required when the connector is enabled"
        ))
    })?;
    let prepared = ctx.prepared();
    cloud::check_vendor_window(
        BLOCK,
        "CloudWatch",
        prepared.snapshot.age_seconds(),
        MAX_AGE_SECONDS,
    )?;
    let (base, host, _) =
        endpoint(env, region).map_err(|e| ExportError::Environment(format!("{BLOCK}: {e}")))?;
    // One export is one short run: the first fetch is all it needs (no refresh wait).
    let provider = chain::default_chain(env, Some(region))
        .map_err(|e| ExportError::Environment(format!("{BLOCK}: {e}")))?;
    let creds = provider
        .current()
        .map_err(|e| ExportError::Environment(format!("{BLOCK}: {e}")))?;
    log::info!("{BLOCK}: credentials from {}", provider.describe());
    let data = cloud::data(ctx, cfg.include_metric_labels_as_dimensions);
    let timestamp = cloud::rfc3339_millis(prepared.snapshot.generated_at_epoch_seconds);
    let chunks: Vec<&[Datum]> = cloud::batches(&data, cfg.max_metrics_per_request).collect();
    let total = chunks.len();
    let mut requests = Vec::with_capacity(total);
    for (i, chunk) in chunks.into_iter().enumerate() {
        let body = body(cfg, chunk, &timestamp).into_bytes();
        requests.push(HttpRequest {
            method: Method::Post,
            url: format!("{base}/"),
            headers: signed_headers(&host, region, &body, &creds, now),
            body,
            check: Some(check_answer),
            what: format!(
                "PutMetricData request {} of {total} ({} data)",
                i + 1,
                chunk.len()
            ),
        });
    }
    Ok(Plan {
        delivery: Delivery::Http {
            requests,
            timeout: cfg.push.timeout(),
            max_response_bytes: MAX_RESPONSE_BYTES,
        },
        limit: Limit::of(BLOCK, &cfg.push),
        retry: Retry::of(&cfg.push),
        metrics: data.len(),
        // The access key id too: it is inside the Authorization header, and services echo it.
        redact: vec![region.to_string(), creds.access_key_id.clone()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use std::collections::BTreeMap;

    fn env<'a>(pairs: &[(&'a str, &'a str)]) -> BTreeMap<&'a str, &'a str> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn percent_encoding() {
        assert_eq!(encode("svc/metrics"), "svc%2Fmetrics");
        assert_eq!(encode("a b+c=d&e~f.g-h_i"), "a%20b%2Bc%3Dd%26e~f.g-h_i");
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn bodies() {
        let p = Policy::parse(
            r#"{"schema": "svc.observability.policy.v1",
                "cloud_b_monitoring": {"unit": "Count", "storage_resolution": 1,
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
                name: "svc_sink_batch_write_seconds".into(),
                family: None,
                value: Value::Stats {
                    count: 40,
                    sum: 1.9,
                    min: 0.01,
                    max: 0.2,
                },
            },
        ];
        let b = body(&p.cloud_b_monitoring, &data, "2024-05-17T12:34:56.250Z");
        let want = [
            "Action=PutMetricData&Version=2010-08-01&Namespace=svc%2Fmetrics",
            "&MetricData.member.1.MetricName=svc_messages_acked_total&MetricData.member.1.Timestamp=2024-05-17T12%3A34%3A56.250Z&MetricData.member.1.Value=1200&MetricData.member.1.Unit=Count&MetricData.member.1.StorageResolution=1",
            "&MetricData.member.1.Dimensions.member.1.Name=app&MetricData.member.1.Dimensions.member.1.Value=svc&MetricData.member.1.Dimensions.member.2.Name=env&MetricData.member.1.Dimensions.member.2.Value=prod",
            "&MetricData.member.2.MetricName=svc_messages_acked_total&MetricData.member.2.Timestamp=2024-05-17T12%3A34%3A56.250Z&MetricData.member.2.Value=700&MetricData.member.2.Unit=Count&MetricData.member.2.StorageResolution=1",
            "&MetricData.member.2.Dimensions.member.1.Name=app&MetricData.member.2.Dimensions.member.1.Value=svc&MetricData.member.2.Dimensions.member.2.Name=env&MetricData.member.2.Dimensions.member.2.Value=prod&MetricData.member.2.Dimensions.member.3.Name=subject_family&MetricData.member.2.Dimensions.member.3.Value=orders",
            "&MetricData.member.3.MetricName=svc_sink_batch_write_seconds&MetricData.member.3.Timestamp=2024-05-17T12%3A34%3A56.250Z&MetricData.member.3.StatisticValues.SampleCount=40&MetricData.member.3.StatisticValues.Sum=1.9&MetricData.member.3.StatisticValues.Minimum=0.01&MetricData.member.3.StatisticValues.Maximum=0.2&MetricData.member.3.Unit=Count&MetricData.member.3.StorageResolution=1",
            "&MetricData.member.3.Dimensions.member.1.Name=app&MetricData.member.3.Dimensions.member.1.Value=svc&MetricData.member.3.Dimensions.member.2.Name=env&MetricData.member.3.Dimensions.member.2.Value=prod",
        ]
        .concat();
        assert_eq!(b, want);
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            endpoint(&env(&[]), "eu-west-1").unwrap(),
            (
                "https://monitoring.eu-west-1.amazonaws.com".into(),
                "monitoring.eu-west-1.amazonaws.com".into(),
                None
            )
        );
        assert_eq!(
            endpoint(
                &env(&[
                    ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
                    ("AWS_ENDPOINT_URL_CLOUDWATCH", "http://127.0.0.1:5000/")
                ]),
                "r"
            )
            .unwrap(),
            (
                "http://127.0.0.1:5000".into(),
                "127.0.0.1:5000".into(),
                Some("AWS_ENDPOINT_URL_CLOUDWATCH")
            )
        );
        let ignored = env(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
            ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"),
        ]);
        assert_eq!(endpoint(&ignored, "r").unwrap().2, None);
        for (url, msg) in [
            (
                "http://monitoring.example:80",
                "AWS_ENDPOINT_URL: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https",
            ),
            (
                "https://u:p@example",
                "AWS_ENDPOINT_URL must not contain credentials; use the connector's environment-variable fields",
            ),
            (
                "https://example/x",
                "AWS_ENDPOINT_URL must be scheme, host and optional port, without a path",
            ),
        ] {
            assert_eq!(
                endpoint(&env(&[("AWS_ENDPOINT_URL", url)]), "r")
                    .unwrap_err()
                    .0,
                msg
            );
        }
    }
}
