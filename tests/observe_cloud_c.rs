//! `cloud-c-export` (Azure Monitor custom metrics) against a strict local receiver that checks
//! the path (`<resource_id>/metrics`), the headers (bearer token, JSON content type, host) and
//! the documented body schema (`time`, `data.baseData.{metric, namespace, dimNames, series}`,
//! each series `{dimValues, min, max, sum, count}`), answering 400 to anything else.
//! No Azure service can run here; the receiver is reached through the test-only
//! `SVC_CLOUD_C_ENDPOINT_OVERRIDE` (loopback only).

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::support::http::{keys_exactly, rfc3339_age, Received, Receiver};
use crate::support::observe::*;
use crate::support::TempDir;
use serde_json::{json, Value};

const TOKEN: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.azure-test-token.c2lnbmF0dXJl";
const RESOURCE: &str = "/subscriptions/0000-1111/resourceGroups/rg-metrics/providers/Microsoft.Compute/virtualMachines/vm-svc";
const LOCATION: &str = "westeurope";

/// The strict check of one request; `Err` is answered with 400 and the reason.
fn validate(r: &Received, host: &str, namespace: &str) -> Result<(), String> {
    if r.method != "POST" || r.version != "HTTP/1.1" {
        return Err(format!("unexpected {} {}", r.method, r.version));
    }
    if r.target != format!("{RESOURCE}/metrics") {
        return Err(format!("unexpected path {}", r.target));
    }
    if r.header("host") != Some(host) {
        return Err("bad host header".into());
    }
    if r.header("authorization") != Some(&format!("Bearer {TOKEN}")) {
        return Err("bad authorization".into());
    }
    if r.header("content-type") != Some("application/json") {
        return Err("content-type must be application/json".into());
    }
    if r.header("content-length") != Some(&r.body.len().to_string()) {
        return Err("content-length does not match".into());
    }
    let v: Value = serde_json::from_slice(&r.body).map_err(|e| format!("not JSON: {e}"))?;
    keys_exactly(&v, "body", &["time", "data"], &[])?;
    let age = rfc3339_age(v["time"].as_str().ok_or("time is not a string")?)?;
    if !(-300.0..=1200.0).contains(&age) {
        return Err(format!("time is {age} s old"));
    }
    keys_exactly(&v["data"], "data", &["baseData"], &[])?;
    let b = &v["data"]["baseData"];
    keys_exactly(
        b,
        "baseData",
        &["metric", "namespace", "series"],
        &["dimNames"],
    )?;
    let metric = b["metric"].as_str().ok_or("metric is not a string")?;
    if metric.is_empty() || b["namespace"] != namespace {
        return Err("bad metric or namespace".into());
    }
    let names: Vec<&str> = match b.get("dimNames") {
        None => Vec::new(),
        Some(n) => n
            .as_array()
            .ok_or("dimNames is not an array")?
            .iter()
            .map(|x| x.as_str().ok_or("dimNames entry is not a string"))
            .collect::<Result<_, _>>()?,
    };
    if names.is_empty() && b.get("dimNames").is_some() {
        return Err("empty dimNames".into());
    }
    if names.len() > 10 {
        return Err("more than 10 dimensions".into());
    }
    let series = b["series"].as_array().ok_or("series is not an array")?;
    if series.is_empty() {
        return Err("no series".into());
    }
    for s in series {
        keys_exactly(s, "series", &["min", "max", "sum", "count"], &["dimValues"])?;
        let values = s
            .get("dimValues")
            .map(|d| d.as_array().map(|a| a.len()).unwrap_or(usize::MAX))
            .unwrap_or(0);
        if values != names.len() {
            return Err("dimValues do not match dimNames".into());
        }
        let count = s["count"].as_u64().ok_or("count is not an integer")?;
        let (min, max) = (
            s["min"].as_f64().ok_or("min")?,
            s["max"].as_f64().ok_or("max")?,
        );
        s["sum"].as_f64().ok_or("sum")?;
        if count == 0 || min > max {
            return Err("count 0 or min > max".into());
        }
    }
    Ok(())
}

fn strict_receiver(namespace: &'static str) -> Receiver {
    let host = Arc::new(std::sync::OnceLock::<String>::new());
    let h = host.clone();
    let r = Receiver::start(Box::new(move |req| {
        match validate(req, h.get().unwrap(), namespace) {
            Ok(()) => (200, "{}".into()),
            Err(why) => (
                400,
                json!({"error": {"code": "BadRequest", "message": why}}).to_string(),
            ),
        }
    }));
    host.set(r.addr.to_string()).unwrap();
    r
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn files(dir: &TempDir, cloud_c: Value, extra: &str, age: f64) -> (String, String) {
    let snap = dir.write(
        "snapshot.json",
        &snapshot(
            &[("orders.eu.>", "orders_eu"), ("payments.>", "payments")],
            age,
        ),
    );
    let mut p: Value = serde_json::from_str(&policy(extra)).unwrap();
    let mut block = json!({"enabled": true, "resource_id": RESOURCE, "location": LOCATION,
                           "token_env": "AZ_MONITOR_TOKEN"});
    for (k, v) in cloud_c.as_object().unwrap() {
        block[k] = v.clone();
    }
    p["cloud_c_monitoring"] = block;
    let pol = dir.write("policy.json", &p.to_string());
    (snap.to_str().unwrap().into(), pol.to_str().unwrap().into())
}

fn body(r: &Received) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

const FAMILIES: &str = r#"{"subject_metrics": {"enabled": true, "rules": [
    {"subject": "orders.>", "label": "orders"}, {"subject": "payments.>", "label": "payments"}]}}"#;

#[test]
fn metrics_reach_the_receiver_in_the_documented_schema() {
    let rx = strict_receiver("svc/metrics");
    let dir = TempDir::new("cloudc-schema");
    let (snap, pol) = files(
        &dir,
        json!({"dimensions": {"env": "prod", "service": "svc"},
               "include_metric_labels_as_dimensions": true}),
        FAMILIES,
        0.0,
    );
    let url = rx.url();
    let out = run(
        &["cloud-c-export", &snap, &pol],
        &[
            ("AZ_MONITOR_TOKEN", TOKEN),
            ("SVC_CLOUD_C_ENDPOINT_OVERRIDE", &url),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let reqs = rx.requests();
    let counters = svc::metrics::Counters::NAMES.len();
    let data = counters + 1 + svc::metrics::SUMMARY_NAMES.len();
    // every aggregate, plus one family request (two series) for each of the five metrics the
    // runner writes family rows for
    assert_eq!(reqs.len(), data + 5);
    assert!(stdout(&out).starts_with(&format!(
        "cloud-c-export: sent {} metrics in {} requests (",
        data + 10,
        data + 5
    )));
    let find = |metric: &str, by_family: bool| -> Value {
        reqs.iter()
            .map(body)
            .find(|b| {
                b["data"]["baseData"]["metric"] == metric
                    && b["data"]["baseData"]["dimNames"].as_array().unwrap().len()
                        == if by_family { 3 } else { 2 }
            })
            .unwrap_or_else(|| panic!("no request for {metric}"))
    };
    let acked = counter_value("messages_acked_total") as f64;
    let b = find("svc_messages_acked_total", false);
    assert_eq!(b["data"]["baseData"]["dimNames"], json!(["env", "service"]));
    assert_eq!(
        b["data"]["baseData"]["series"],
        json!([{"dimValues": ["prod", "svc"], "min": acked, "max": acked, "sum": acked, "count": 1}])
    );
    let b = find("svc_messages_written_total", true);
    assert_eq!(
        b["data"]["baseData"]["dimNames"],
        json!(["env", "service", "subject_family"])
    );
    assert_eq!(
        b["data"]["baseData"]["series"],
        json!([
            {"dimValues": ["prod", "svc", "orders"], "min": 10.0, "max": 10.0, "sum": 10.0, "count": 1},
            {"dimValues": ["prod", "svc", "payments"], "min": 20.0, "max": 20.0, "sum": 20.0, "count": 1}
        ])
    );
    let b = find("svc_event_age_at_store_seconds", false);
    assert_eq!(
        b["data"]["baseData"]["series"],
        json!([{"dimValues": ["prod", "svc"], "min": 0.25, "max": 2.0, "sum": 2.75, "count": 3}])
    );
    // raw subjects never travel
    for r in &reqs {
        let text = String::from_utf8_lossy(&r.body);
        assert!(
            !text.contains("orders.eu") && !text.contains("payments.>"),
            "{text}"
        );
    }
}

#[test]
fn without_the_switch_no_family_rows_and_no_dimensions() {
    let rx = strict_receiver("custom/ns");
    let dir = TempDir::new("cloudc-nodims");
    let (snap, pol) = files(
        &dir,
        json!({"metric_namespace": "custom/ns"}),
        &FAMILIES.replace(
            "{\"subject_metrics\"",
            "{\"allowed_metrics\": [\"messages_written_total\"], \"allowed_metric_patterns\": [], \"subject_metrics\"",
        ),
        0.0,
    );
    let url = rx.url();
    let out = run(
        &["cloud-c-export", &snap, &pol],
        &[
            ("AZ_MONITOR_TOKEN", TOKEN),
            ("SVC_CLOUD_C_ENDPOINT_OVERRIDE", &url),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 1);
    let v = counter_value("messages_written_total") as f64;
    assert_eq!(
        body(&reqs[0])["data"]["baseData"],
        json!({"metric": "svc_messages_written_total", "namespace": "custom/ns",
               "series": [{"min": v, "max": v, "sum": v, "count": 1}]})
    );
}

#[test]
fn retries_then_rejection_without_leaking_the_token() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let rx = Receiver::start(Box::new(move |_| {
        match c.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => (503, "{}".into()),
            2 => (200, "{}".into()),
            _ => (
                403,
                json!({"error": {"code": "AuthorizationFailed",
                                 "message": format!("token {TOKEN} lacks Monitoring Metrics Publisher")}})
                .to_string(),
            ),
        }
    }));
    let dir = TempDir::new("cloudc-retry");
    let (snap, pol) = files(
        &dir,
        json!({"max_retries": 2, "retry_backoff_seconds": 0}),
        r#"{"allowed_metrics": ["messages_acked_total", "messages_written_total"], "allowed_metric_patterns": []}"#,
        0.0,
    );
    let url = rx.url();
    let out = run(
        &["cloud-c-export", &snap, &pol],
        &[
            ("AZ_MONITOR_TOKEN", TOKEN),
            ("SVC_CLOUD_C_ENDPOINT_OVERRIDE", &url),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    // request 1: 503, 503, 200; request 2: 403 (permanent, not retried)
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let err = stderr(&out);
    assert!(
        err.contains("svc-observe cloud-c-export: cloud_c_monitoring: sent 1 of 2; last failure: custom metric svc_messages_written_total: HTTP 403: "),
        "{err}"
    );
    assert!(err.contains("AuthorizationFailed"), "{err}");
    assert!(
        !err.contains(TOKEN) && !stdout(&out).contains(TOKEN),
        "{err}"
    );
    assert!(!err.contains(RESOURCE) && !err.contains(LOCATION), "{err}");
}

#[test]
fn dry_run_hides_token_resource_and_location() {
    let dir = TempDir::new("cloudc-dry");
    let (snap, pol) = files(&dir, json!({}), "{}", 0.0);
    let out = run(
        &["cloud-c-export", &snap, &pol, "--dry-run"],
        &[("AZ_MONITOR_TOKEN", TOKEN)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    for s in [TOKEN, RESOURCE, LOCATION, "0000-1111", "vm-svc"] {
        assert!(!text.contains(s), "{s} leaked:\n{text}");
    }
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1],
        "POST https://<redacted>.monitoring.azure.com<redacted>/metrics"
    );
    assert_eq!(lines[2], "Authorization: <redacted>");
    assert_eq!(lines[3], "Content-Type: application/json");
}

#[test]
fn failures_before_any_request() {
    let rx = strict_receiver("svc/metrics");
    let url = rx.url();
    let dir = TempDir::new("cloudc-before");
    let long = "v".repeat(128);
    let dims: serde_json::Map<String, Value> =
        (0..10).map(|i| (format!("dim{i}"), json!(long))).collect();
    let env = [
        ("AZ_MONITOR_TOKEN", TOKEN),
        ("SVC_CLOUD_C_ENDPOINT_OVERRIDE", url.as_str()),
    ];
    // oversize
    let (snap, pol) = files(
        &dir,
        json!({"dimensions": dims, "max_request_bytes": 1024}),
        "{}",
        0.0,
    );
    let out = run(&["cloud-c-export", &snap, &pol], &env);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "svc-observe cloud-c-export: custom metric svc_ack_confirmation_seconds is "
        ) && err
            .trim_end()
            .ends_with("bytes, over cloud_c_monitoring.max_request_bytes 1024; nothing was sent"),
        "{err}"
    );
    // older than Azure's 20-minute window, even with --allow-stale
    let (snap, pol) = files(&dir, json!({}), "{}", 1500.0);
    let out = run(&["cloud-c-export", &snap, &pol, "--allow-stale"], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("svc-observe cloud-c-export: cloud_c_monitoring: the snapshot is 1500 s old; Azure Monitor accepts data points at most 1200 s old, so nothing was sent"), "{}", stderr(&out));
    // stale by the policy
    let (snap, pol) = files(&dir, json!({"stale_after_seconds": 60}), "{}", 100.0);
    let out = run(&["cloud-c-export", &snap, &pol], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("metrics withheld: snapshot is stale"),
        "{}",
        stderr(&out)
    );
    // token variable unset
    let (snap, pol) = files(&dir, json!({}), "{}", 0.0);
    let out = run(&["cloud-c-export", &snap, &pol], &env[1..]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "svc-observe cloud-c-export: cloud_c_monitoring.token_env: environment variable AZ_MONITOR_TOKEN is not set\n"
    );
    // the override refuses non-loopback hosts
    let out = run(
        &["cloud-c-export", &snap, &pol],
        &[
            ("AZ_MONITOR_TOKEN", TOKEN),
            (
                "SVC_CLOUD_C_ENDPOINT_OVERRIDE",
                "https://collector.example.com",
            ),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(rx.requests().is_empty(), "a request was made");
}
