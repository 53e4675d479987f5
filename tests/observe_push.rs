//! Push connectors end to end against real receivers: the OTLP protobuf JSON decoder
//! (opentelemetry-proto) for `otlp`, `search_stack` and `collector_agent`; a strict local HEC
//! receiver (plain and TLS) for `siem_hec`; the npm StatsD daemon for both StatsD dialects;
//! rsyslogd with mmpstrucdata over UDP and a Unix socket for `syslog`. Failure paths: receiver
//! down or failing (bounded retries, exit 1, snapshot untouched), stale, oversize, disabled,
//! missing secrets, and secrets never appearing in any output.

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use crate::support::certs::make_certs;
use crate::support::observe::*;
use crate::support::push::*;
use crate::support::{free_port, TempDir};
use serde_json::Value;

/// Approved metrics of the test snapshot under an allow-all policy: every counter, the
/// gauge, every summary.
fn approved() -> usize {
    svc::metrics::Counters::NAMES.len() + 1 + svc::metrics::SUMMARY_NAMES.len()
}

const FAMS: &[(&str, &str)] = &[
    ("orders.eu.>", "orders_eu"),
    ("orders.us.>", "orders_us"),
    ("payments.*", "payments"),
];

/// Families: `orders` = orders_eu + orders_us, `payments` on its own.
const RULES: &str = r#""subject_metrics": {"enabled": true, "rules": [
    {"subject": "orders.>", "label": "orders"}, {"subject": "payments.*", "label": "payments"}]}"#;

/// Planted secrets: none may appear in any output of svc-observe.
const TOKEN: &str = "hec-token-5f1c2a9e-SECRET";
const HEADER_SECRET: &str = "api-key-77c0ffee-SECRET";

fn policy_with(blocks: &str) -> String {
    policy(&format!("{{{RULES}, {blocks}}}"))
}

fn names(v: &[Value]) -> Vec<String> {
    v.iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

fn assert_no_secret(o: &std::process::Output) {
    for s in [TOKEN, HEADER_SECRET] {
        assert!(!stdout(o).contains(s), "secret in stdout: {}", stdout(o));
        assert!(!stderr(o).contains(s), "secret in stderr: {}", stderr(o));
    }
}

/// Expected nanosecond timestamps of a snapshot: (start, time).
fn snapshot_times(snap: &str) -> (String, String) {
    let v: Value = serde_json::from_str(snap).unwrap();
    let ns = |s: f64| (((s * 1e6).round() as u64) * 1000).to_string();
    (
        ns(v["started_at_epoch_seconds"].as_f64().unwrap()),
        ns(v["generated_at_epoch_seconds"].as_f64().unwrap()),
    )
}

fn attrs(v: &Value) -> BTreeMap<String, String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|kv| {
                    (
                        kv["key"].as_str().unwrap().to_string(),
                        kv["value"]["stringValue"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Checks one decoded ExportMetricsServiceRequest against the test snapshot.
fn check_otlp_request(req: &Value, snap: &str, resource_extra: &[(&str, &str)]) {
    let (start, time) = snapshot_times(snap);
    let rm = &req["resourceMetrics"][0];
    let res = attrs(&rm["resource"]["attributes"]);
    assert_eq!(res.get("service.name").map(String::as_str), Some("svc"));
    assert_eq!(
        res.get("service.version").map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
    for (k, v) in resource_extra {
        assert_eq!(res.get(*k).map(String::as_str), Some(*v), "{k}");
    }
    assert_eq!(res.len(), 2 + resource_extra.len());
    let sm = &rm["scopeMetrics"][0];
    assert_eq!(sm["scope"]["name"], "svc-observe");
    let metrics = sm["metrics"].as_array().unwrap();
    let by_name: BTreeMap<String, &Value> = metrics
        .iter()
        .map(|m| (m["name"].as_str().unwrap().to_string(), m))
        .collect();
    // Every runner counter, as a cumulative monotonic sum with the snapshot's value.
    for name in svc::metrics::Counters::NAMES {
        let m = by_name
            .get(&format!("svc_{name}"))
            .unwrap_or_else(|| panic!("svc_{name} missing: {:?}", names(metrics)));
        let sum = &m["sum"];
        assert_eq!(
            sum["aggregationTemporality"],
            "AGGREGATION_TEMPORALITY_CUMULATIVE"
        );
        assert_eq!(sum["isMonotonic"], true);
        let points = sum["dataPoints"].as_array().unwrap();
        let agg = points
            .iter()
            .find(|p| p.get("attributes").is_none())
            .unwrap();
        assert_eq!(agg["asInt"], counter_value(name).to_string(), "{name}");
        assert_eq!(agg["startTimeUnixNano"], start);
        assert_eq!(agg["timeUnixNano"], time);
        assert!(!m["description"].as_str().unwrap().is_empty());
    }
    // Subject-family rows as data points with the subject_family attribute.
    let written = &by_name["svc_messages_written_total"]["sum"]["dataPoints"];
    let fam: BTreeMap<String, String> = written
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p.get("attributes").is_some())
        .map(|p| {
            (
                attrs(&p["attributes"])["subject_family"].clone(),
                p["asInt"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        fam,
        BTreeMap::from([
            ("orders".to_string(), "30".to_string()),
            ("payments".to_string(), "30".to_string())
        ])
    );
    // The gauge.
    let g = &by_name["svc_last_sink_success_epoch_seconds"]["gauge"]["dataPoints"][0];
    assert_eq!(g["asDouble"], 1_700_000_000.0);
    assert_eq!(g["timeUnixNano"], time);
    // Summaries: count, sum, min/max as quantiles 0 and 1, and the `_last` gauge.
    for name in svc::metrics::SUMMARY_NAMES {
        let p = &by_name[&format!("svc_{name}")]["summary"]["dataPoints"][0];
        assert_eq!(p["count"], "3");
        assert_eq!(p["sum"], 2.75);
        let q = p["quantileValues"].as_array().unwrap();
        // MessageToDict omits a quantile of 0.0 (the proto3 default).
        assert_eq!(
            q[0].get("quantile").and_then(Value::as_f64).unwrap_or(0.0),
            0.0
        );
        assert_eq!(q[0]["value"], 0.25);
        assert_eq!(q[1]["quantile"], 1.0);
        assert_eq!(q[1]["value"], 2.0);
        assert_eq!(p["startTimeUnixNano"], start);
        let last = &by_name[&format!("svc_{name}_last")]["gauge"]["dataPoints"][0];
        assert_eq!(last["asDouble"], 2.0);
    }
    // Nothing else: counters + gauge + every summary with its `_last` gauge.
    assert_eq!(
        metrics.len(),
        svc::metrics::Counters::NAMES.len() + 1 + 2 * svc::metrics::SUMMARY_NAMES.len()
    );
}

#[test]
fn otlp_export_decodes_with_the_opentelemetry_protobuf_definitions() {
    let dir = TempDir::new("otlp");
    let rx = Receiver::start(&dir, "otlp_receiver.py", &[], &[]);
    let snap_text = snapshot(FAMS, 0.0);
    let snap = dir.write("snap.json", &snap_text);
    let pol = dir.write(
        "policy.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{}/v1/metrics",
                "stale_after_seconds": 60, "headers_env": {{"X-Api-Key": "OTLP_API_KEY"}}}}"#,
            rx.port
        )),
    );
    let o = run(
        &[&"otlp-export", &snap, &pol],
        &[("OTLP_API_KEY", HEADER_SECRET)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let recs = rx.records();
    assert_eq!(recs.len(), 1, "{recs:?}");
    let r = &recs[0];
    assert!(r.get("error").is_none(), "{r}");
    assert_eq!(r["path"], "/v1/metrics");
    assert_eq!(r["headers"]["content-type"], "application/json");
    assert_eq!(r["headers"]["x-api-key"], HEADER_SECRET);
    check_otlp_request(&r["request"], &snap_text, &[]);
    let metrics = svc::metrics::Counters::NAMES.len() + 1 + svc::metrics::SUMMARY_NAMES.len();
    assert_eq!(
        stdout(&o),
        format!(
            "otlp-export: sent {metrics} metrics in 1 request ({} bytes) to http://127.0.0.1:{}/v1/metrics\n",
            r["bytes"], rx.port
        )
    );
    assert_no_secret(&o);

    // The dry run prints the same body and sends nothing; the header value is redacted.
    let o = run(
        &[&"otlp-export", &snap, &pol, &"--dry-run"],
        &[("OTLP_API_KEY", HEADER_SECRET)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!("# svc-observe otlp-export --dry-run: 1 request, {metrics} metrics; nothing sent")
    );
    assert_eq!(
        lines.next().unwrap(),
        format!("POST http://127.0.0.1:{}/v1/metrics", rx.port)
    );
    assert_eq!(lines.next().unwrap(), "Content-Type: application/json");
    assert_eq!(lines.next().unwrap(), "X-Api-Key: <redacted>");
    assert_eq!(lines.next().unwrap(), "");
    let body: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(
        body["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
            .as_array()
            .unwrap()
            .len(),
        svc::metrics::Counters::NAMES.len() + 1 + 2 * svc::metrics::SUMMARY_NAMES.len()
    );
    assert_eq!(rx.records().len(), 1, "the dry run sent nothing");
    assert_no_secret(&o);
}

#[test]
fn search_stack_and_collector_agent_profiles() {
    let dir = TempDir::new("profiles");
    let rx = Receiver::start(&dir, "otlp_receiver.py", &[], &[]);
    let snap_text = snapshot(FAMS, 0.0);
    let snap = dir.write("snap.json", &snap_text);
    let pol = dir.write(
        "policy.json",
        &policy_with(&format!(
            r#""search_stack": {{"enabled": true, "endpoint": "http://127.0.0.1:{p}",
                   "data_stream_dataset": "svc.delivery", "data_stream_namespace": "prod"}},
               "collector_agent": {{"enabled": true, "endpoint": "http://localhost:{p}/v1/metrics"}}"#,
            p = rx.port
        )),
    );
    let o = run(&[&"search-stack-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&[&"collector-agent-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let recs = rx.records();
    assert_eq!(recs.len(), 2);
    check_otlp_request(
        &recs[0]["request"],
        &snap_text,
        &[
            ("data_stream.dataset", "svc.delivery"),
            ("data_stream.namespace", "prod"),
        ],
    );
    check_otlp_request(&recs[1]["request"], &snap_text, &[]);
    assert_eq!(recs[1]["headers"]["host"], format!("localhost:{}", rx.port));
}

/// The OpenTelemetry exporter convention: a base URL (no path, or `/`) gets `/v1/metrics`; a
/// URL that names the signal path is used as given (the receiver answers 404 elsewhere).
#[test]
fn otlp_base_url_gets_the_metrics_path_and_a_signal_url_is_kept() {
    let dir = TempDir::new("otlp-paths");
    let rx = Receiver::start(&dir, "otlp_receiver.py", &[], &[]);
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let cases = [
        (
            "otlp",
            "otlp-export",
            format!("http://127.0.0.1:{}", rx.port),
        ),
        (
            "otlp",
            "otlp-export",
            format!("http://127.0.0.1:{}/", rx.port),
        ),
        (
            "otlp",
            "otlp-export",
            format!("http://127.0.0.1:{}/v1/metrics", rx.port),
        ),
        (
            "search_stack",
            "search-stack-export",
            format!("http://127.0.0.1:{}/v1/metrics", rx.port),
        ),
    ];
    for (i, (block, command, endpoint)) in cases.iter().enumerate() {
        let pol = dir.write(
            &format!("p{i}.json"),
            &policy_with(&format!(
                r#""{block}": {{"enabled": true, "endpoint": "{endpoint}"}}"#
            )),
        );
        let o = run(&[command, &snap, &pol], &[]);
        assert_eq!(o.status.code(), Some(0), "{endpoint}: {}", stderr(&o));
        assert!(
            stdout(&o).ends_with(&format!(" to http://127.0.0.1:{}/v1/metrics\n", rx.port)),
            "{endpoint}: {}",
            stdout(&o)
        );
        let recs = rx.records();
        assert_eq!(recs.len(), i + 1);
        assert_eq!(recs[i]["path"], "/v1/metrics", "{endpoint}");
        assert!(recs[i].get("error").is_none(), "{}", recs[i]);
    }
}

#[test]
fn collector_agent_config_snippet() {
    let dir = TempDir::new("alloy");
    let pol = dir.write(
        "policy.json",
        &policy(
            r#"{"collector_agent": {"enabled": true, "endpoint": "http://127.0.0.1:4318/v1/metrics",
                "receiver_label": "svc_in", "batch_label": "svc_batch", "exporter_label": "grafana_cloud",
                "auth_label": "grafana_cloud_auth", "upstream_endpoint_env": "GC_OTLP_ENDPOINT",
                "upstream_auth_mode": "basic", "upstream_auth_username_env": "GC_INSTANCE_ID",
                "upstream_auth_password_env": "GC_API_KEY"}}"#,
        ),
    );
    let o = run(
        &[&"collector-agent-config", &pol],
        &[("GC_API_KEY", HEADER_SECRET), ("GC_INSTANCE_ID", "12345")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        r#"// Grafana Alloy configuration for svc-observe collector-agent-export.
// Receives OTLP/HTTP metrics locally, batches them and forwards them upstream.
// Upstream endpoint and credentials come from Alloy's own environment.

otelcol.receiver.otlp "svc_in" {
  http {
    endpoint = "127.0.0.1:4318"
  }

  output {
    metrics = [otelcol.processor.batch.svc_batch.input]
  }
}

otelcol.processor.batch "svc_batch" {
  output {
    metrics = [otelcol.exporter.otlphttp.grafana_cloud.input]
  }
}

otelcol.exporter.otlphttp "grafana_cloud" {
  client {
    endpoint = sys.env("GC_OTLP_ENDPOINT")
    auth     = otelcol.auth.basic.grafana_cloud_auth.handler
  }
}

otelcol.auth.basic "grafana_cloud_auth" {
  username = sys.env("GC_INSTANCE_ID")
  password = sys.env("GC_API_KEY")
}
"#
    );
    assert_no_secret(&o);
    assert!(!stdout(&o).contains("12345"));

    // Without basic auth: no auth line, no auth component; default labels and receiver.
    let pol = dir.write("none.json", &policy("{}"));
    let o = run(&[&"collector-agent-config", &pol], &[]);
    assert_eq!(o.status.code(), Some(0));
    let text = stdout(&o);
    assert!(text
        .contains("otelcol.receiver.otlp \"svc\" {\n  http {\n    endpoint = \"127.0.0.1:4318\""));
    assert!(text.contains("otelcol.exporter.otlphttp \"upstream_cloud\" {\n  client {\n    endpoint = sys.env(\"UPSTREAM_OTLP_ENDPOINT\")\n  }\n}\n"));
    assert!(!text.contains("auth"));

    // Basic auth without the variable names (profile disabled, so validation allowed it).
    let pol = dir.write(
        "basic.json",
        &policy(r#"{"collector_agent": {"upstream_auth_mode": "basic"}}"#),
    );
    let o = run(&[&"collector-agent-config", &pol], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "svc-observe collector-agent-config: collector_agent.upstream_auth_username_env, collector_agent.upstream_auth_password_env: required with upstream_auth_mode basic\n"
    );
}

#[test]
fn otlp_receiver_failures_are_retried_a_bounded_number_of_times() {
    let dir = TempDir::new("otlp-retry");
    let snap_text = snapshot(FAMS, 0.0);
    let snap = dir.write("snap.json", &snap_text);
    let before = std::fs::metadata(&snap).unwrap().modified().unwrap();

    // 503 every time: 1 + max_retries attempts, then exit 1.
    let rx = Receiver::start(&dir, "otlp_receiver.py", &["--status", "503"], &[]);
    let pol = dir.write(
        "p1.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{}/v1/metrics",
                "max_retries": 2, "retry_backoff_seconds": 0.1}}"#,
            rx.port
        )),
    );
    let t = Instant::now();
    let o = run(&[&"otlp-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(t.elapsed() >= Duration::from_millis(200), "two pauses");
    assert_eq!(rx.records().len(), 3);
    assert!(
        stderr(&o).ends_with(&format!("svc-observe otlp-export: otlp: sent 0 of 1; last failure: OTLP request ({} metrics): HTTP 503: {{\"message\": \"try later\"}} (after 3 attempts)\n", approved())),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o).matches("retrying in 0.100 s").count(), 2);

    // 503 once, then 200: the retry delivers; exit 0.
    let rx = Receiver::start(
        &dir,
        "otlp_receiver.py",
        &["--status", "503", "--fail-first", "1"],
        &[],
    );
    let pol = dir.write(
        "p2.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{}/v1/metrics",
                "max_retries": 1, "retry_backoff_seconds": 0}}"#,
            rx.port
        )),
    );
    let o = run(&[&"otlp-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let recs = rx.records();
    assert_eq!(recs.len(), 2);
    assert_eq!(
        (recs[0]["answered"].as_u64(), recs[1]["answered"].as_u64()),
        (Some(503), Some(200))
    );

    // A 4xx is permanent: one attempt whatever max_retries says.
    let pol = dir.write(
        "p3.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{}/v1/logs",
                "max_retries": 5, "retry_backoff_seconds": 0}}"#,
            rx.port
        )),
    );
    let o = run(&[&"otlp-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("HTTP 404"), "{}", stderr(&o));
    assert!(stderr(&o).contains("(after 1 attempt)"), "{}", stderr(&o));
    assert_eq!(rx.records().len(), 3);

    // Receiver down: connection refused on every attempt.
    let port = free_port();
    let pol = dir.write(
        "p4.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{port}/v1/metrics",
                "max_retries": 2, "retry_backoff_seconds": 0.05}}"#
        )),
    );
    let o = run(&[&"otlp-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("(after 3 attempts)"), "{}", stderr(&o));
    assert!(stderr(&o).contains("otlp: sent 0 of 1"), "{}", stderr(&o));

    // The snapshot is never touched by an export.
    assert_eq!(std::fs::read_to_string(&snap).unwrap(), snap_text);
    assert_eq!(
        std::fs::metadata(&snap).unwrap().modified().unwrap(),
        before
    );
}

#[test]
fn stale_oversize_disabled_and_missing_secrets_fail_closed() {
    let dir = TempDir::new("closed");
    let rx = Receiver::start(&dir, "otlp_receiver.py", &[], &[]);
    let old = dir.write("old.json", &snapshot(FAMS, 120.0));
    let fresh = dir.write("fresh.json", &snapshot(FAMS, 0.0));
    let pol = dir.write(
        "p.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{}/v1/metrics",
                "stale_after_seconds": 60}}"#,
            rx.port
        )),
    );
    let o = run(&[&"otlp-export", &old, &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("metrics withheld: snapshot is stale: 120 s old, stale_after_seconds is 60 (otlp.stale_after_seconds; --allow-stale overrides)"),
        "{}",
        stderr(&o)
    );
    assert_eq!(rx.records().len(), 0);
    let o = run(&[&"otlp-export", &old, &pol, &"--allow-stale"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(rx.records().len(), 1);

    // Oversize: nothing is sent.
    let small = dir.write(
        "small.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{}/v1/metrics", "max_request_bytes": 1024}}"#,
            rx.port
        )),
    );
    let o = run(&[&"otlp-export", &fresh, &small], &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with(&format!(
            "svc-observe otlp-export: OTLP request ({} metrics) is ",
            approved()
        )) && err.ends_with(" bytes, over otlp.max_request_bytes 1024; nothing was sent\n"),
        "{err}"
    );
    assert_eq!(rx.records().len(), 1);

    // Missing or invalid snapshot: exit 1, nothing sent.
    let o = run(&[&"otlp-export", &dir.join("none.json"), &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("metrics withheld: cannot read snapshot"));

    let garbage = dir.write("garbage.json", "{not json");
    let o = run(&[&"otlp-export", &garbage, &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("metrics withheld: snapshot"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("is not usable"), "{}", stderr(&o));
    assert_eq!(rx.records().len(), 1);

    // Disabled: exit 0, no snapshot needed, nothing sent.
    let on_but_blocks_off = dir.write("off.json", &policy("{}"));
    for c in svc::observe::connectors::CONNECTORS {
        let o = run(
            &[&c.command, &dir.join("none.json"), &on_but_blocks_off],
            &[],
        );
        assert_eq!(o.status.code(), Some(0), "{}", c.command);
        assert_eq!(
            stdout(&o),
            format!(
                "{}: disabled by policy ({}.enabled=false); nothing sent\n",
                c.command, c.block
            )
        );
    }
    let off = dir.write(
        "alloff.json",
        r#"{"schema": "svc.observability.policy.v1"}"#,
    );
    for c in svc::observe::connectors::CONNECTORS {
        let o = run(&[&c.command, &dir.join("none.json"), &off], &[]);
        assert_eq!(o.status.code(), Some(0), "{}", c.command);
        assert_eq!(
            stdout(&o),
            format!(
                "{}: disabled by policy (enabled=false); nothing sent\n",
                c.command
            )
        );
    }

    // A header variable that is not set: exit 2 naming field and variable.
    let hp = dir.write(
        "hdr.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{}/v1/metrics",
                "headers_env": {{"X-Api-Key": "UNSET_OTLP_KEY_VAR"}}}}"#,
            rx.port
        )),
    );
    let o = run(&[&"otlp-export", &fresh, &hp], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "svc-observe otlp-export: otlp.headers_env.X-Api-Key: environment variable UNSET_OTLP_KEY_VAR is not set\n"
    );
    assert_eq!(rx.records().len(), 1);

    // An invalid policy: exit 2 with every problem.
    let bad = dir.write(
        "bad.json",
        &policy(r#"{"otlp": {"enabled": true, "endpoint": "http://collector.example/v1/metrics"}, "siem_hec": {"verify_tls": false}}"#),
    );
    let o = run(&[&"otlp-export", &fresh, &bad], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "Observability policy is invalid:\n  otlp.endpoint: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https\n  siem_hec.verify_tls: must be true; TLS verification cannot be disabled\n"
    );
    // Usage errors: exit 2.
    let o = run(&[&"otlp-export", &fresh], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with("svc-observe: otlp-export takes 2 arguments, got 1"));
    let o = run(&[&"syslog-export", &fresh, &pol, &"--output", &"x"], &[]);
    assert_eq!(o.status.code(), Some(2));
}

fn hec_policy(endpoint: &str, extra: &str) -> String {
    policy_with(&format!(
        r#""siem_hec": {{"enabled": true, "endpoint": "{endpoint}", "token_env": "SVC_HEC_TOKEN",
            "index": "svc_metrics", "source": "svc-observe", "sourcetype": "svc:metrics",
            "host": "delivery-01", "headers_env": {{"X-Tenant": "SVC_TENANT"}} {extra}}}"#
    ))
}

#[test]
fn siem_hec_event_passes_the_strict_receiver() {
    let dir = TempDir::new("hec");
    let rx = Receiver::start(
        &dir,
        "hec_receiver.py",
        &["--token-env", "EXPECTED_TOKEN"],
        &[("EXPECTED_TOKEN", TOKEN)],
    );
    let snap_text = snapshot(FAMS, 0.0);
    let snap = dir.write("snap.json", &snap_text);
    let url = format!("http://127.0.0.1:{}/services/collector/event", rx.port);
    let pol = dir.write("p.json", &hec_policy(&url, ""));
    let env = [("SVC_HEC_TOKEN", TOKEN), ("SVC_TENANT", HEADER_SECRET)];
    let o = run(&[&"siem-hec-export", &snap, &pol], &env);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_no_secret(&o);
    let recs = rx.records();
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r["answer"][0], 200, "{r}");
    assert_eq!(r["headers"]["authorization"], format!("Splunk {TOKEN}"));
    assert_eq!(r["headers"]["x-tenant"], HEADER_SECRET);
    let ev = &r["event"];
    let gen: Value = serde_json::from_str(&snap_text).unwrap();
    let t = gen["generated_at_epoch_seconds"].as_f64().unwrap();
    assert!((ev["time"].as_f64().unwrap() - t).abs() < 0.001);
    assert_eq!(
        (
            &ev["host"],
            &ev["source"],
            &ev["sourcetype"],
            &ev["index"],
            &ev["event"]
        ),
        (
            &Value::from("delivery-01"),
            &Value::from("svc-observe"),
            &Value::from("svc:metrics"),
            &Value::from("svc_metrics"),
            &Value::from("metric")
        )
    );
    let fields = ev["fields"].as_object().unwrap();
    for name in svc::metrics::Counters::NAMES {
        assert_eq!(
            fields[&format!("metric_name:svc_{name}")],
            counter_value(name),
            "{name}"
        );
    }
    for name in svc::metrics::SUMMARY_NAMES {
        for (part, v) in [
            ("count", 3.0),
            ("sum", 2.75),
            ("min", 0.25),
            ("max", 2.0),
            ("last", 2.0),
        ] {
            assert_eq!(fields[&format!("metric_name:svc_{name}_{part}")], v);
        }
    }
    assert_eq!(
        fields["metric_name:svc_last_sink_success_epoch_seconds"],
        1_700_000_000.0
    );
    // Only aggregates: no dimension, no subject family.
    assert_eq!(
        fields.len(),
        svc::metrics::Counters::NAMES.len() + 1 + 5 * svc::metrics::SUMMARY_NAMES.len()
    );

    // Dry run: token and header redacted, body shown.
    let o = run(&[&"siem-hec-export", &snap, &pol, &"--dry-run"], &env);
    assert_eq!(o.status.code(), Some(0));
    assert_no_secret(&o);
    let out = stdout(&o);
    assert!(out.contains("\nAuthorization: <redacted>\nContent-Type: application/json\nX-Tenant: <redacted>\n\n{"), "{out}");
    assert_eq!(rx.records().len(), 1);

    // Wrong token: 403 from the collector, permanent (one attempt), exit 1.
    let pol_retry = dir.write(
        "pr.json",
        &hec_policy(&url, r#", "max_retries": 3, "retry_backoff_seconds": 0"#),
    );
    let o = run(
        &[&"siem-hec-export", &snap, &pol_retry],
        &[
            ("SVC_HEC_TOKEN", "wrong-token"),
            ("SVC_TENANT", HEADER_SECRET),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o)
            .contains("HTTP 403: {\"text\": \"Invalid token\", \"code\": 4} (after 1 attempt)"),
        "{}",
        stderr(&o)
    );
    assert_eq!(rx.records().len(), 2);

    // Token variable unset: exit 2 before anything is sent.
    let o = run(&[&"siem-hec-export", &snap, &pol], &[("SVC_TENANT", "x")]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "svc-observe siem-hec-export: siem_hec.token_env: environment variable SVC_HEC_TOKEN is not set\n"
    );
    assert_eq!(rx.records().len(), 2);

    // A busy collector (503) is retried.
    let busy = Receiver::start(
        &dir,
        "hec_receiver.py",
        &["--token-env", "EXPECTED_TOKEN", "--status", "503"],
        &[("EXPECTED_TOKEN", TOKEN)],
    );
    let pol = dir.write(
        "busy.json",
        &hec_policy(
            &format!("http://127.0.0.1:{}/services/collector/event", busy.port),
            r#", "max_retries": 2, "retry_backoff_seconds": 0"#,
        ),
    );
    let o = run(&[&"siem-hec-export", &snap, &pol], &env);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(busy.records().len(), 3);
    assert!(stderr(&o).contains("HTTP 503"), "{}", stderr(&o));
    assert_no_secret(&o);
}

#[test]
fn siem_hec_over_tls_verifies_the_certificate() {
    let dir = TempDir::new("hec-tls");
    let certs = make_certs(dir.path());
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let env = [("SVC_HEC_TOKEN", TOKEN), ("SVC_TENANT", HEADER_SECRET)];
    // Signed by a CA trusted through SSL_CERT_FILE: delivered.
    let rx = Receiver::start(
        &dir,
        "hec_receiver.py",
        &[
            "--token-env",
            "EXPECTED_TOKEN",
            "--tls-cert",
            certs.cert.to_str().unwrap(),
            "--tls-key",
            certs.key.to_str().unwrap(),
        ],
        &[("EXPECTED_TOKEN", TOKEN)],
    );
    let pol = dir.write(
        "p.json",
        &hec_policy(
            &format!("https://localhost:{}/services/collector/event", rx.port),
            "",
        ),
    );
    let ca = certs.ca.to_str().unwrap();
    let o = run(
        &[&"siem-hec-export", &snap, &pol],
        &[env[0], env[1], ("SSL_CERT_FILE", ca)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(rx.records().len(), 1);
    assert_eq!(rx.records()[0]["answer"][0], 200);
    assert_no_secret(&o);

    // SSL_CERT_FILE naming something that is not a PEM bundle: exit 2, nothing sent.
    let not_pem = dir.write("not.pem", "not a certificate\n");
    let o = run(
        &[&"siem-hec-export", &snap, &pol],
        &[env[0], env[1], ("SSL_CERT_FILE", not_pem.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("contains no PEM certificate"),
        "{}",
        stderr(&o)
    );
    assert_eq!(rx.records().len(), 1);

    // The same server without the CA (built-in roots only): a clean certificate error, no
    // panic, no retry of a permanent failure, nothing delivered.
    let pol_r = dir.write(
        "pr.json",
        &hec_policy(
            &format!("https://localhost:{}/services/collector/event", rx.port),
            r#", "max_retries": 2, "retry_backoff_seconds": 0"#,
        ),
    );
    let o = run(&[&"siem-hec-export", &snap, &pol_r], &env);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("invalid peer certificate"), "{err}");
    assert!(err.contains("(after 1 attempt)"), "{err}");
    assert_eq!(rx.records().len(), 1);
    assert_no_secret(&o);

    // A self-signed certificate not issued by the trusted CA (openssl s_server).
    let port = free_port();
    let server = std::process::Command::new("openssl")
        .args(["s_server", "-accept", &port.to_string(), "-cert"])
        .arg(&certs.rogue_cert)
        .arg("-key")
        .arg(&certs.rogue_key)
        .args(["-www", "-quiet"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _guard = ChildGuard(server);
    wait_for("openssl s_server", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let pol = dir.write(
        "rogue.json",
        &hec_policy(
            &format!("https://localhost:{port}/services/collector/event"),
            "",
        ),
    );
    let o = run(
        &[&"siem-hec-export", &snap, &pol],
        &[env[0], env[1], ("SSL_CERT_FILE", ca)],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("invalid peer certificate"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_no_secret(&o);
}

fn statsd_policy(block: &str, port: u16, extra: &str) -> String {
    policy_with(&format!(
        r#""{block}": {{"enabled": true, "host": "127.0.0.1", "port": {port} {extra}}}"#
    ))
}

#[test]
fn statsd_daemon_counts_both_dialects_without_bad_lines() {
    let dir = TempDir::new("statsd");
    let d = Statsd::start(&dir);
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let pol = dir.write(
        "p.json",
        &statsd_policy("statsd", d.port, r#", "metric_prefix": "svc.prod""#),
    );
    let o = run(&[&"statsd-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let n = svc::metrics::Counters::NAMES.len() + 1 + svc::metrics::SUMMARY_NAMES.len();
    assert!(stdout(&o).starts_with(&format!(
        "statsd-export: sent {n} metrics in {n} datagrams ("
    )));
    let gauges = d.wait_packets(n);
    for name in svc::metrics::Counters::NAMES {
        assert_eq!(
            gauges[&format!("svc.prod.{name}")],
            counter_value(name) as f64,
            "{name}"
        );
    }
    for name in svc::metrics::SUMMARY_NAMES {
        for (part, v) in [
            ("count", 3.0),
            ("sum", 2.75),
            ("min", 0.25),
            ("max", 2.0),
            ("last", 2.0),
        ] {
            assert_eq!(gauges[&format!("svc.prod.{name}_{part}")], v);
        }
    }
    assert_eq!(
        gauges["svc.prod.last_sink_success_epoch_seconds"],
        1_700_000_000.0
    );
    let counters = d.inspected("counters");
    assert_eq!(counters["statsd.packets_received"], n as f64);
    assert_eq!(
        counters["statsd.metrics_received"],
        (svc::metrics::Counters::NAMES.len() + 1 + 5 * svc::metrics::SUMMARY_NAMES.len()) as f64
    );
    assert_eq!(d.stat("messages.bad_lines_seen"), 0.0);

    // Agent dialect: static tags plus subject-family rows as tags.
    let d = Statsd::start(&dir);
    let pol = dir.write(
        "a.json",
        &statsd_policy(
            "agent_statsd",
            d.port,
            r#", "tags": {"env": "prod", "team": "payments"}, "include_metric_labels_as_tags": true"#,
        ),
    );
    let o = run(&[&"agent-statsd-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // 5 family metrics (fetched, written, acked, failed, dlq) x 2 labels.
    let gauges = d.wait_packets(n + 10);
    let tags = ";env=prod;team=payments";
    for name in svc::metrics::Counters::NAMES {
        assert_eq!(
            gauges[&format!("svc.{name}{tags}")],
            counter_value(name) as f64
        );
    }
    for (name, orders, payments) in [
        ("messages_written_total", 30.0, 30.0),
        ("messages_acked_total", 30.0, 30.0),
        ("messages_fetched_total", 33.0, 33.0),
        ("messages_failed_total", 0.0, 0.0),
        ("messages_dlq_total", 0.0, 0.0),
    ] {
        assert_eq!(
            gauges[&format!("svc.{name}{tags};subject_family=orders")],
            orders
        );
        assert_eq!(
            gauges[&format!("svc.{name}{tags};subject_family=payments")],
            payments
        );
    }
    assert_eq!(
        gauges[&format!("svc.sink_batch_write_seconds_max{tags}")],
        2.0
    );
    assert_eq!(d.stat("messages.bad_lines_seen"), 0.0);
    assert_eq!(
        d.inspected("counters")["statsd.packets_received"],
        (n + 10) as f64
    );
}

#[test]
fn statsd_over_a_unix_datagram_socket() {
    // The npm daemon listens on UDP only: relay what arrives on the Unix socket to it
    // unchanged, so its parser still judges every datagram.
    let dir = TempDir::new("statsd-unix");
    let d = Statsd::start(&dir);
    let sock = dir.join("statsd.sock");
    let rx = UnixDatagram::bind(&sock).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let pol = dir.write(
        "p.json",
        &policy_with(&format!(
            r#""statsd": {{"enabled": true, "transport": "unixgram", "socket_path": "{}"}}"#,
            sock.display()
        )),
    );
    let n = svc::metrics::Counters::NAMES.len() + 1 + svc::metrics::SUMMARY_NAMES.len();
    // The relay reads while the export sends (a Unix datagram queue is short: a receiver
    // that does not read makes the sender wait, then fail after timeout_seconds).
    let statsd_port = d.port;
    let relay = std::thread::Builder::new()
        .name("test-unix-relay".into())
        .spawn(move || {
            let mut buf = [0u8; 65536];
            for _ in 0..n {
                let k = rx.recv(&mut buf).unwrap();
                udp.send_to(&buf[..k], ("127.0.0.1", statsd_port)).unwrap();
            }
            rx
        })
        .unwrap();
    let o = run(&[&"statsd-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rx = relay.join().unwrap();
    let gauges = d.wait_packets(n);
    assert_eq!(
        gauges["svc.messages_acked_total"],
        counter_value("messages_acked_total") as f64
    );
    assert_eq!(d.stat("messages.bad_lines_seen"), 0.0);

    // Socket gone: every datagram fails after its retries; exit 1 with the counts.
    drop(rx);
    std::fs::remove_file(&sock).unwrap();
    let pol = dir.write(
        "p2.json",
        &policy_with(&format!(
            r#""statsd": {{"enabled": true, "transport": "unixgram", "socket_path": "{}",
                "max_retries": 1, "retry_backoff_seconds": 0}}"#,
            sock.display()
        )),
    );
    let o = run(&[&"statsd-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "statsd: sent 0 of {n}; last failure: svc.spool_rejected_total: No such file or directory"
        )),
        "{err}"
    );
    assert_eq!(err.matches("not sent after 2 attempts").count(), n, "{err}");
}

#[test]
fn statsd_receiver_down_and_oversize() {
    let dir = TempDir::new("statsd-down");
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    // UDP to a port nobody listens on: the connected socket sees ICMP port unreachable.
    let pol = dir.write("p.json", &statsd_policy("statsd", free_udp_port(), ""));
    let o = run(&[&"statsd-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stderr(&o).contains("Connection refused"), "{}", stderr(&o));
    // Oversize datagram: nothing sent.
    let d = Statsd::start(&dir);
    let pol = dir.write(
        "small.json",
        &statsd_policy("statsd", d.port, r#", "max_datagram_bytes": 64"#),
    );
    let o = run(&[&"statsd-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("bytes, over statsd.max_datagram_bytes 64; nothing was sent"),
        "{}",
        stderr(&o)
    );
    // Absence needs a live receiver: a control datagram sent through the same UDP port after
    // the export exited must arrive, and be the only one. On loopback a datagram is queued
    // on the receiving socket when it is sent, so anything the export had sent would be ahead
    // of the control.
    let control = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    control
        .send_to(b"svc_test_control:1|c", ("127.0.0.1", d.port))
        .unwrap();
    d.wait_packets(1);
    let counters = d.inspected("counters");
    assert_eq!(counters["statsd.packets_received"], 1.0, "{counters:?}");
    assert_eq!(counters["svc_test_control"], 1.0, "{counters:?}");
}

#[test]
fn syslog_messages_parse_in_rsyslog_over_udp_and_unix_socket() {
    let dir = TempDir::new("syslog");
    let rs = Rsyslog::start(&dir);
    let snap_text = snapshot(FAMS, 0.0);
    let snap = dir.write("snap.json", &snap_text);
    let pol = dir.write(
        "udp.json",
        &policy_with(&format!(
            r#""syslog": {{"enabled": true, "port": {}, "facility": "local3", "severity": "notice",
                "hostname": "delivery-01", "app_name": "svc-observe", "procid": "4242",
                "msgid": "svcmetrics", "structured_data_id": "svc@32473"}}"#,
            rs.port
        )),
    );
    let o = run(&[&"syslog-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let n_metrics = svc::metrics::Counters::NAMES.len() + 1 + svc::metrics::SUMMARY_NAMES.len();
    // Plus 5 family metrics x 2 labels.
    let n = n_metrics + 10;
    let msgs = rs.wait_messages(n);
    assert_eq!(msgs.len(), n);
    let gen: Value = serde_json::from_str(&snap_text).unwrap();
    let ts = svc::observe::connectors::syslog::rfc5424_timestamp(
        gen["generated_at_epoch_seconds"].as_f64().unwrap(),
    );
    let mut seen = BTreeMap::new();
    for (raw, sd) in &msgs {
        // PRI 19*8+5 = 157, version 1, the fields as sent.
        let head = format!("157 1 {ts} delivery-01 svc-observe 4242 svcmetrics [svc@32473 ");
        assert!(raw.starts_with(&head), "{raw}\nwant {head}");
        let p = sd["svc@32473"].as_object().unwrap();
        let key = match p.get("subject_family") {
            Some(f) => format!("{}{{{}}}", p["name"].as_str().unwrap(), f.as_str().unwrap()),
            None => p["name"].as_str().unwrap().to_string(),
        };
        seen.insert(key, p.clone());
    }
    for name in svc::metrics::Counters::NAMES {
        let p = &seen[&format!("svc_{name}")];
        assert_eq!(p["type"], "counter");
        assert_eq!(p["value"], counter_value(name).to_string());
    }
    assert_eq!(seen["svc_messages_written_total{orders}"]["value"], "30");
    assert_eq!(seen["svc_messages_fetched_total{payments}"]["value"], "33");
    let s = &seen["svc_sink_batch_write_seconds"];
    assert_eq!(
        (
            &s["type"],
            &s["count"],
            &s["sum"],
            &s["min"],
            &s["max"],
            &s["last"]
        ),
        (
            &Value::from("summary"),
            &Value::from("3"),
            &Value::from("2.75"),
            &Value::from("0.25"),
            &Value::from("2"),
            &Value::from("2")
        )
    );
    assert_eq!(
        seen["svc_last_sink_success_epoch_seconds"]["value"],
        "1700000000"
    );

    // Unix socket, default header fields, and a raw family pattern that needs escaping.
    let dir2 = TempDir::new("syslog-unix");
    let rs2 = Rsyslog::start(&dir2);
    let weird = r#"weird."q"]\x.>"#;
    let snap2 = dir.write("weird.json", &snapshot(&[(weird, "weird")], 0.0));
    let pol = dir.write(
        "unix.json",
        &policy(&format!(
            r#"{{"subject_metrics": {{"enabled": true, "allow_raw_subjects": true,
                  "rules": [{{"subject": "weird.>", "label": "weird", "display_mode": "raw"}}]}},
                "allowed_metric_patterns": ["messages_written_total"],
                "syslog": {{"enabled": true, "transport": "unixgram", "socket_path": "{}"}}}}"#,
            rs2.socket.display()
        )),
    );
    let o = run(&[&"syslog-export", &snap2, &pol, &"--dry-run"], &[]);
    assert!(
        stdout(&o).contains(r#"subject_family="weird.\"q\"\]\\x.>""#),
        "{}",
        stdout(&o)
    );
    let o = run(&[&"syslog-export", &snap2, &pol], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let msgs = rs2.wait_messages(2);
    assert!(msgs[0].0.starts_with("134 1 "), "{}", msgs[0].0);
    assert!(
        msgs[0].0.contains(" svc - metrics [svc name="),
        "{}",
        msgs[0].0
    );
    let fam = msgs
        .iter()
        .find(|(_, sd)| sd["svc"].get("subject_family").is_some())
        .unwrap();
    assert_eq!(fam.1["svc"]["subject_family"], weird);
    assert_eq!(fam.1["svc"]["value"], "10");
}

#[test]
fn syslog_oversize_and_socket_missing() {
    let dir = TempDir::new("syslog-fail");
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let sock = dir.join("nobody.sock");
    let pol = dir.write(
        "p.json",
        &policy_with(&format!(
            r#""syslog": {{"enabled": true, "transport": "unixgram", "socket_path": "{}",
                "max_retries": 2, "retry_backoff_seconds": 0}}"#,
            sock.display()
        )),
    );
    let o = run(&[&"syslog-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(1));
    let n = svc::metrics::Counters::NAMES.len() + 1 + svc::metrics::SUMMARY_NAMES.len() + 10;
    assert!(
        stderr(&o).contains(&format!("syslog: sent 0 of {n}")),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o).matches("not sent after 3 attempts").count(), n);

    let rs = Rsyslog::start(&dir);
    let pol = dir.write(
        "small.json",
        &policy_with(&format!(
            r#""syslog": {{"enabled": true, "port": {}, "max_message_bytes": 480,
                "hostname": "{}", "procid": "{}", "app_name": "{}"}}"#,
            rs.port,
            "h".repeat(255),
            "p".repeat(128),
            "a".repeat(48)
        )),
    );
    let o = run(&[&"syslog-export", &snap, &pol], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("over syslog.max_message_bytes 480; nothing was sent"),
        "{}",
        stderr(&o)
    );
    // Absence needs a live receiver: a control message sent over the same UDP input after the
    // export exited must be written, and nothing but probes and it may be there.
    let control = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    control
        .send_to(
            b"<13>1 2024-01-01T00:00:00Z probe probe - probe - control-after-oversize",
            ("127.0.0.1", rs.port),
        )
        .unwrap();
    wait_for("the control message", Duration::from_secs(10), || {
        rs.raw_lines()
            .iter()
            .any(|l| l.contains("control-after-oversize"))
            .then_some(())
    });
    let lines = rs.raw_lines();
    assert!(lines.iter().all(|l| l.contains("probe")), "{lines:?}");
}

#[test]
fn planted_secrets_appear_in_no_output() {
    // Receivers that echo request headers in their error answers (OTLP and HEC, each on its
    // own receiver so each error path really gets the echo): the exporter must scrub them
    // from its error message too.
    let dir = TempDir::new("secrets");
    let snap = dir.write("snap.json", &snapshot(FAMS, 0.0));
    let otlp = Receiver::start(
        &dir,
        "otlp_receiver.py",
        &["--status", "500", "--echo-headers"],
        &[],
    );
    let hec = Receiver::start(
        &dir,
        "hec_receiver.py",
        &[
            "--token-env",
            "SVC_HEC_TOKEN",
            "--status",
            "503",
            "--echo-headers",
        ],
        &[("SVC_HEC_TOKEN", TOKEN)],
    );
    let pol = dir.write(
        "p.json",
        &policy_with(&format!(
            r#""otlp": {{"enabled": true, "endpoint": "http://127.0.0.1:{o}/v1/metrics",
                  "headers_env": {{"Authorization": "SVC_OTLP_AUTH", "X-Api-Key": "SVC_OTLP_KEY"}}}},
               "siem_hec": {{"enabled": true, "endpoint": "http://127.0.0.1:{h}/services/collector/event",
                  "token_env": "SVC_HEC_TOKEN", "headers_env": {{"X-Tenant": "SVC_OTLP_KEY"}}}}"#,
            o = otlp.port,
            h = hec.port
        )),
    );
    let env = [
        ("SVC_OTLP_AUTH", TOKEN),
        ("SVC_OTLP_KEY", HEADER_SECRET),
        ("SVC_HEC_TOKEN", TOKEN),
    ];
    // (arguments, expected exit code): dry runs and policy commands succeed, the exports
    // fail on the receivers' error answers.
    for (args, code) in [
        (vec!["otlp-export", "--dry-run"], 0),
        (vec!["otlp-export"], 1),
        (vec!["siem-hec-export", "--dry-run"], 0),
        (vec!["siem-hec-export"], 1),
        (vec!["validate-policy"], 0),
        (vec!["show-effective-policy"], 0),
    ] {
        let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&args[0]];
        if !args[0].ends_with("policy") {
            a.push(&snap);
        }
        a.push(&pol);
        for extra in &args[1..] {
            a.push(extra);
        }
        let o = run(&a, &env);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
        assert_no_secret(&o);
    }
    // Both receivers got the secrets (so there was something to leak) and echoed them.
    let recs = otlp.records();
    assert!(
        recs.iter().any(|r| r["headers"]["authorization"] == TOKEN),
        "the OTLP receiver did get the secret: {recs:?}"
    );
    let recs = hec.records();
    assert!(
        recs.iter().any(
            |r| r["headers"]["authorization"] == format!("Splunk {TOKEN}")
                && r["headers"]["x-tenant"] == HEADER_SECRET
                && r["answer"][0] == 503
        ),
        "the HEC receiver did get the secrets and answered 503: {recs:?}"
    );
    let o = run(&[&"otlp-export", &snap, &pol], &env);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("HTTP 500"), "{}", stderr(&o));
    // The echoed header was scrubbed before the excerpt was cut (at 200 characters).
    assert!(
        stderr(&o).contains(r#""authorization": "<redac"#),
        "the echo was scrubbed: {}",
        stderr(&o)
    );
    assert_no_secret(&o);
    let o = run(&[&"siem-hec-export", &snap, &pol], &env);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("HTTP 503"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("<redac"),
        "the echo was scrubbed: {}",
        stderr(&o)
    );
    assert_no_secret(&o);
}
