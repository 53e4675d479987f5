//! `siem-hec-export`: one bounded metric event POSTed to the SIEM's HTTP event collector at
//! `/services/collector/event`, in the collector's multiple-metric JSON format:
//!
//! ```json
//! {"time": 1718000000.25, "host": "svc", "source": "svc", "sourcetype": "svc:metrics",
//!  "index": "metrics", "event": "metric",
//!  "fields": {"metric_name:svc_messages_acked_total": 1200, ...}}
//! ```
//!
//! Only unlabeled aggregates go in (one event, one set of dimensions): counters, gauges, and
//! for each summary `_count`, `_sum` and, once observed, `_min`, `_max`, `_last`. Subject-family
//! rows are not sent (a second dimension set would need more events). Non-finite values are
//! left out (the format carries numbers only). `time` is the snapshot's generation time.
//!
//! Token: read from the variable named by `token_env` at export time and sent as
//! `Authorization: Splunk <token>`; `Authorization` and `Content-Type` are refused in
//! `headers_env` (validation, and again here). TLS verification is always on.

use serde_json::{json, Map, Value};

use super::{
    metric_name, resolve_env, resolve_headers, Action, Connector, Context, Delivery, ExportError,
    Header, HttpRequest, Input, Limit, Method, Plan, Retry,
};
use crate::select::Sample;
use svc_text::peer::PeerText;

pub const CONNECTOR: Connector = Connector {
    command: "siem-hec-export",
    block: "siem_hec",
    summary: "Send the approved aggregates as one metric event to the SIEM HTTP event collector.",
    help: "\
Usage: svc-observe siem-hec-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

POSTs one metric event (multiple-metric JSON) with the approved aggregate metrics to
siem_hec.endpoint (path /services/collector/event; needs enabled and siem_hec.enabled). The
token is read from the environment variable named by siem_hec.token_env and sent as
`Authorization: Splunk <token>`.

Options:
  --dry-run      Print the request (token and header values redacted) instead of sending it
  --allow-stale  Send even if the snapshot is older than siem_hec.stale_after_seconds

Exit codes: 0 sent (or disabled by policy), 1 not sent, 2 invalid policy, usage or environment
(token variable unset).
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.siem_hec.enabled,
    push: |p| &p.siem_hec.push,
    action: Action::Plan(plan),
};

/// Headers the connector sets itself (refused in `headers_env`).
pub const OWN_HEADERS: &[&str] = &["Authorization", "Content-Type"];
/// Largest collector answer read.
pub const MAX_RESPONSE_BYTES: u64 = 65_536;

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    let h = &ctx.policy.siem_hec;
    let endpoint = h.endpoint.as_deref().unwrap_or_default();
    let Some(token_env) = h.token_env.as_deref() else {
        return Err(ExportError::Environment(
            "siem_hec.token_env: is required when the connector is enabled".into(),
        ));
    };
    let token = resolve_env("siem_hec.token_env", token_env)?;
    let mut headers = vec![
        Header::secret("Authorization", token.prefixed("Splunk ")),
        Header::plain("Content-Type", "application/json"),
    ];
    headers.extend(resolve_headers("siem_hec", &h.headers_env, OWN_HEADERS)?);
    let (event, metrics) = event(ctx);
    Ok(Plan {
        delivery: Delivery::Http {
            requests: vec![HttpRequest {
                method: Method::Post,
                url: endpoint.to_string(),
                headers,
                body: serde_json::to_vec(&event).expect("JSON values always serialize"),
                check: Some(check_answer),
                what: format!("HEC event ({metrics} metrics)"),
            }],
            timeout: h.push.timeout(),
            max_response_bytes: MAX_RESPONSE_BYTES,
        },
        limit: Limit::of("siem_hec", &h.push),
        retry: Retry::of(&h.push),
        metrics,
        redact: Vec::new(),
    })
}

/// The metric event and the number of approved metrics in it.
pub fn event(ctx: &Context<'_>) -> (Value, usize) {
    let p = ctx.prepared();
    let h = &ctx.policy.siem_hec;
    let mut fields = Map::new();
    let put = |fields: &mut Map<String, Value>, name: String, v: f64| {
        if v.is_finite() {
            fields.insert(format!("metric_name:{name}"), json!(v));
        }
    };
    let mut metrics = 0;
    for m in &p.selection.metrics {
        let name = metric_name(ctx.policy, &m.suffix);
        match &m.sample {
            Some(Sample::Counter(v)) => {
                metrics += 1;
                fields.insert(format!("metric_name:{name}"), json!(v));
            }
            Some(Sample::Gauge(v)) => {
                metrics += 1;
                put(&mut fields, name, *v);
            }
            Some(Sample::Summary(s)) => {
                metrics += 1;
                fields.insert(format!("metric_name:{name}_count"), json!(s.count));
                put(&mut fields, format!("{name}_sum"), s.sum);
                if s.count > 0 {
                    put(&mut fields, format!("{name}_min"), s.min);
                    put(&mut fields, format!("{name}_max"), s.max);
                    put(&mut fields, format!("{name}_last"), s.last);
                }
            }
            None => {}
        }
    }
    let mut e = Map::new();
    e.insert(
        "time".into(),
        json!((p.snapshot.generated_at_epoch_seconds * 1000.0).round() / 1000.0),
    );
    e.insert("host".into(), json!(h.host));
    e.insert("source".into(), json!(h.source));
    e.insert("sourcetype".into(), json!(h.sourcetype));
    if let Some(i) = &h.index {
        e.insert("index".into(), json!(i));
    }
    e.insert("event".into(), json!("metric"));
    e.insert("fields".into(), Value::Object(fields));
    (Value::Object(e), metrics)
}

/// The collector answers `{"text": "Success", "code": 0}`; any other code inside a 2xx is a
/// rejection.
pub fn check_answer(body: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|_| "the collector's answer is not JSON".to_string())?;
    match v.get("code").and_then(Value::as_i64) {
        Some(0) => Ok(()),
        Some(code) => Err(format!(
            "the collector rejected the event: code {code} ({})",
            PeerText::with_limit(
                v.get("text").and_then(Value::as_str).unwrap_or("no text"),
                200
            )
        )),
        None => Err("the collector's answer has no code".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `fuzz/fuzz_targets/cloud_answers.rs`: the collector's `text` reached the error
    /// unbounded and with its control characters.
    #[test]
    fn answer_text_is_escaped_and_bounded() {
        assert_eq!(
            check_answer(br#"{"text":"no\r\nforged","code":9}"#),
            Err("the collector rejected the event: code 9 (no\\r\\nforged)".into())
        );
        let long = format!(r#"{{"text":"{}","code":9}}"#, "x".repeat(100_000));
        assert!(check_answer(long.as_bytes()).unwrap_err().len() < 400);
    }

    #[test]
    fn collector_answers() {
        assert_eq!(check_answer(br#"{"text":"Success","code":0}"#), Ok(()));
        assert_eq!(
            check_answer(br#"{"text":"Incorrect index","code":7}"#),
            Err("the collector rejected the event: code 7 (Incorrect index)".into())
        );
        assert_eq!(
            check_answer(b"<html>"),
            Err("the collector's answer is not JSON".into())
        );
        assert_eq!(
            check_answer(b"{}"),
            Err("the collector's answer has no code".into())
        );
    }
}
