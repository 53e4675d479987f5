//! Every validation rule of the policy, each with its exact message.

use super::*;

/// Problems of a policy made of the schema plus `body` (top-level fields, no braces).
fn problems(body: &str) -> Vec<String> {
    let sep = if body.trim().is_empty() { "" } else { "," };
    let text = format!(r#"{{"schema": "svc.observability.policy.v1"{sep} {body}}}"#);
    match Policy::parse(&text) {
        Ok(_) => Vec::new(),
        Err(inv) => inv.0.iter().map(|p| p.to_string()).collect(),
    }
}

fn one(body: &str) -> String {
    let got = problems(body);
    assert_eq!(got.len(), 1, "expected one problem for {body}: {got:#?}");
    got.into_iter().next().unwrap()
}

#[test]
fn minimal_policy_has_every_default() {
    let p = Policy::parse(r#"{"schema": "svc.observability.policy.v1"}"#).unwrap();
    assert_eq!(p, Policy::disabled());
    assert!(!p.enabled);
    assert_eq!(p.namespace, "svc");
    assert!(p.allowed_metrics.is_empty() && p.allowed_metric_patterns.is_empty());
    assert!(!p.include_observations && !p.include_legacy);
    let sm = &p.subject_metrics;
    assert!(!sm.enabled);
    assert_eq!(sm.max_subject_families, 20);
    assert_eq!(sm.overflow_action, subject_metrics::OverflowAction::Drop);
    assert_eq!(sm.overflow_label, "other");
    assert!(!sm.allow_raw_subjects);
    let s = &p.scrape;
    assert!(!s.enabled && s.include_help && s.include_type);
    assert_eq!(s.output_file, None);
    assert_eq!(s.stale_after_seconds, None);
    let h = &s.http_endpoint;
    assert!(!h.enabled);
    assert_eq!(
        (h.host.as_str(), h.port, h.path.as_str()),
        ("127.0.0.1", 9108, "/metrics")
    );
    assert_eq!(h.request_timeout_seconds, 5.0);
    assert_eq!(h.response_max_bytes, 1_048_576);
    assert_eq!(p.otlp.protocol, otlp::Protocol::HttpJson);
    assert_eq!(
        (
            p.otlp.push.timeout_seconds,
            p.otlp.push.max_retries,
            p.otlp.push.retry_backoff_seconds
        ),
        (5.0, 0, 0.25)
    );
    assert_eq!(p.otlp.push.max_bytes, 1_048_576);
    assert_eq!(p.search_stack.data_stream_dataset, "svc.metrics");
    assert_eq!(p.search_stack.data_stream_namespace, "default");
    let c = &p.collector_agent;
    assert_eq!(
        (
            c.receiver_label.as_str(),
            c.batch_label.as_str(),
            c.exporter_label.as_str(),
            c.auth_label.as_str()
        ),
        ("svc", "svc_batch", "upstream_cloud", "upstream_cloud_auth")
    );
    assert_eq!(c.upstream_endpoint_env, "UPSTREAM_OTLP_ENDPOINT");
    assert_eq!(
        c.upstream_auth_mode,
        collector_agent::UpstreamAuthMode::None
    );
    let h = &p.siem_hec;
    assert!(h.verify_tls);
    assert_eq!(
        (h.source.as_str(), h.sourcetype.as_str(), h.host.as_str()),
        ("svc", "svc:metrics", "svc")
    );
    let a = &p.cloud_a_monitoring;
    assert_eq!(a.metric_namespace, "svc_metrics");
    assert_eq!(a.auth_mode, oci::AuthMode::InstancePrincipal);
    assert_eq!(a.profile, "DEFAULT");
    assert_eq!(a.batch_atomicity, oci::BatchAtomicity::Atomic);
    assert_eq!(a.dimensions.get("source").map(String::as_str), Some("svc"));
    assert_eq!(a.max_metrics_per_request, 20);
    assert_eq!(
        (
            p.statsd.port,
            p.statsd.push.timeout_seconds,
            p.statsd.push.max_bytes
        ),
        (8125, 1.0, 1432)
    );
    assert_eq!(p.agent_statsd.base.port, 8125);
    let y = &p.syslog;
    assert_eq!(
        (
            y.port,
            y.facility.as_str(),
            y.severity.as_str(),
            y.priority()
        ),
        (514, "local0", "info", 134)
    );
    assert_eq!(
        (
            y.hostname.as_str(),
            y.app_name.as_str(),
            y.procid.as_str(),
            y.msgid.as_str()
        ),
        ("-", "svc", "-", "metrics")
    );
    assert_eq!(
        (y.structured_data_id.as_str(), y.push.max_bytes),
        ("svc", 1024)
    );
    let b = &p.broker_server_monitoring;
    assert_eq!(
        (b.timeout_seconds, b.max_response_bytes, b.verify_tls),
        (2.0, 262_144, true)
    );
    let cb = &p.cloud_b_monitoring;
    assert_eq!(
        (
            cb.metric_namespace.as_str(),
            cb.unit.as_str(),
            cb.storage_resolution
        ),
        ("svc/metrics", "None", 60)
    );
    assert_eq!(cb.max_metrics_per_request, 20);
    let cc = &p.cloud_c_monitoring;
    assert_eq!(cc.metric_namespace, "svc/metrics");
    assert!(cc.verify_tls);
}

#[test]
fn effective_policy_serializes_every_field() {
    let text = Policy::disabled().to_json_pretty();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Top-level keys in the spec's order (two-space indent marks the top level).
    let keys: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("  \""))
        .filter_map(|l| l.split('"').next())
        .collect();
    assert_eq!(
        keys,
        [
            "schema",
            "enabled",
            "namespace",
            "allowed_metrics",
            "allowed_metric_patterns",
            "denied_metrics",
            "denied_metric_patterns",
            "include_observations",
            "include_legacy",
            "expected_owner",
            "subjects",
            "subject_metrics",
            "scrape",
            "otlp",
            "search_stack",
            "collector_agent",
            "siem_hec",
            "cloud_a_monitoring",
            "statsd",
            "agent_statsd",
            "syslog",
            "broker_server_monitoring",
            "cloud_c_monitoring",
            "cloud_b_monitoring"
        ]
    );
    assert_eq!(v["scrape"]["http_endpoint"]["port"], 9108);
    assert_eq!(v["agent_statsd"]["port"], 8125);
    assert_eq!(v["agent_statsd"]["tags"], serde_json::json!({}));
    assert_eq!(v["cloud_a_monitoring"]["batch_atomicity"], "ATOMIC");
    assert_eq!(v["otlp"]["endpoint"], serde_json::Value::Null);
    // The shared settings are flat in every block, the size field under the block's own name.
    for (block, size) in [
        ("otlp", "max_request_bytes"),
        ("search_stack", "max_request_bytes"),
        ("collector_agent", "max_request_bytes"),
        ("siem_hec", "max_request_bytes"),
        ("cloud_a_monitoring", "max_request_bytes"),
        ("cloud_b_monitoring", "max_request_bytes"),
        ("cloud_c_monitoring", "max_request_bytes"),
        ("statsd", "max_datagram_bytes"),
        ("agent_statsd", "max_datagram_bytes"),
        ("syslog", "max_message_bytes"),
    ] {
        for key in [
            "timeout_seconds",
            "export_deadline_seconds",
            "max_retries",
            "retry_backoff_seconds",
            "stale_after_seconds",
            size,
        ] {
            assert!(v[block].get(key).is_some(), "{block}.{key}");
        }
        assert!(v[block].get("push").is_none(), "{block}");
        assert_eq!(v[block]["export_deadline_seconds"], 60.0, "{block}");
    }
    // The effective policy reads back to itself.
    let back = Policy::parse(&Policy::disabled().to_json_pretty()).unwrap();
    assert_eq!(back, Policy::disabled());
}

#[test]
fn top_level_rules() {
    assert_eq!(
        Policy::parse("{}").unwrap_err().to_string(),
        "schema: is required"
    );
    assert_eq!(one(r#""bogus": 1"#), "bogus: unknown field");
    assert_eq!(
        Policy::parse(r#"{"schema": "v2"}"#)
            .unwrap_err()
            .to_string(),
        "schema: must be svc.observability.policy.v1"
    );
    assert_eq!(
        Policy::parse("[]").unwrap_err().to_string(),
        "the policy must be a JSON object"
    );
    assert_eq!(
        one(r#""namespace": "svc-metrics""#),
        "namespace: must match [a-zA-Z_][a-zA-Z0-9_]* and be at most 64 bytes"
    );
    assert_eq!(
        one(r#""allowed_metrics": ["messages.acked"]"#),
        "allowed_metrics[0]: must be a metric suffix matching [a-zA-Z_][a-zA-Z0-9_]*"
    );
    assert_eq!(
        one(r#""denied_metric_patterns": ["messages_[a]"]"#),
        "denied_metric_patterns[0]: must be a glob of [A-Za-z0-9_] with * and ?"
    );
    assert_eq!(one(r#""enabled": "yes""#), "enabled: must be true or false");
    assert_eq!(
        one(r#""subjects": [{"subject": "orders..x"}]"#),
        "subjects[0].subject: must not contain empty tokens"
    );
    assert_eq!(
        one(r#""subjects": [{"subject": "orders.>", "share_subject_label": true}]"#),
        "subjects[0].share_subject_label: must be false: raw subjects are never exported as labels; use subject_metrics rules with a reviewed label"
    );
    assert_eq!(
        one(r#""subjects": [{}]"#),
        "subjects[0].subject: is required"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let got = problems(
        r#""namespace": "1x", "scrape": {"http_endpoint": {"port": 0, "path": "/m?x"}, "extra": 1},
           "siem_hec": {"verify_tls": false}, "subject_metrics": {"max_subject_families": 0}"#,
    );
    assert_eq!(
        got,
        [
            "namespace: must match [a-zA-Z_][a-zA-Z0-9_]* and be at most 64 bytes",
            "subject_metrics.max_subject_families: must be an integer from 1 to 100",
            "scrape.http_endpoint.port: must be an integer from 1 to 65535",
            "scrape.http_endpoint.path: must not contain a query string",
            "scrape.extra: unknown field",
            "siem_hec.verify_tls: must be true; TLS verification cannot be disabled",
        ]
    );
}

#[test]
fn scrape_rules() {
    for (path, msg) in [
        ("/metrics?x=1", "must not contain a query string"),
        ("/metrics#top", "must not contain a fragment"),
        (
            "/met rics",
            "must not contain whitespace or control characters",
        ),
        (
            "/met\\u0007",
            "must not contain whitespace or control characters",
        ),
        ("metrics", "must start with / and be at most 256 bytes"),
    ] {
        assert_eq!(
            one(&format!(
                r#""scrape": {{"http_endpoint": {{"path": "{path}"}}}}"#
            )),
            format!("scrape.http_endpoint.path: {msg}")
        );
    }
    for port in ["0", "65536", "-1", "80.5", "\"80\""] {
        let got = if port.starts_with('"') {
            " (got a string)"
        } else {
            ""
        };
        assert_eq!(
            one(&format!(
                r#""scrape": {{"http_endpoint": {{"port": {port}}}}}"#
            )),
            format!("scrape.http_endpoint.port: must be an integer from 1 to 65535{got}")
        );
    }
    assert_eq!(
        one(r#""scrape": {"http_endpoint": {"request_timeout_seconds": 0}}"#),
        "scrape.http_endpoint.request_timeout_seconds: must be a number greater than 0 and at most 300"
    );
    assert_eq!(
        one(r#""scrape": {"http_endpoint": {"response_max_bytes": 10}}"#),
        "scrape.http_endpoint.response_max_bytes: must be an integer from 1024 to 16777216"
    );
    assert_eq!(
        one(r#""scrape": {"http_endpoint": {"host": "bad host"}}"#),
        "scrape.http_endpoint.host: must be a host name or IP address"
    );
    assert_eq!(
        one(r#""scrape": {"output_file": "/var/lib/node/svc.txt"}"#),
        "scrape.output_file: must end in .prom (the textfile collector reads only *.prom files)"
    );
    assert_eq!(
        one(r#""scrape": {"stale_after_seconds": -5}"#),
        "scrape.stale_after_seconds: must be a number greater than 0 and at most 31536000"
    );
    assert!(problems(r#""scrape": {"http_endpoint": {"host": "::1"}}"#).is_empty());
    assert!(
        problems(r#""scrape": {"http_endpoint": {"host": "0.0.0.0", "port": 65535}}"#).is_empty()
    );
}

#[test]
fn endpoint_rules() {
    let plain =
        "plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https";
    for block in ["otlp", "search_stack", "collector_agent", "siem_hec"] {
        assert_eq!(
            one(&format!(
                r#""{block}": {{"endpoint": "http://collector.example:4318/v1/metrics"}}"#
            )),
            format!("{block}.endpoint: {plain}")
        );
        assert_eq!(
            one(&format!(r#""{block}": {{"endpoint": "https://user:secret@collector.example/v1/metrics"}}"#)),
            format!("{block}.endpoint: must not contain credentials; use the connector's environment-variable fields")
        );
        assert_eq!(
            one(&format!(
                r#""{block}": {{"endpoint": "https://collector.example/v1/metrics?api_key=1"}}"#
            )),
            format!("{block}.endpoint: must not contain a query string or fragment")
        );
        assert_eq!(
            one(&format!(
                r#""{block}": {{"endpoint": "collector.example"}}"#
            )),
            format!("{block}.endpoint: must be an http:// or https:// URL")
        );
    }
    // Messages never echo the URL.
    let got = problems(r#""otlp": {"endpoint": "https://user:hunter2@x/v1"}"#);
    assert!(!got.concat().contains("hunter2"));
    assert!(problems(
        r#""otlp": {"enabled": true, "endpoint": "http://127.0.0.1:4318/v1/metrics"}"#
    )
    .is_empty());
    assert!(
        problems(r#""otlp": {"enabled": true, "endpoint": "http://[::1]:4318/v1/metrics"}"#)
            .is_empty()
    );
    assert!(problems(
        r#""otlp": {"enabled": true, "endpoint": "https://otlp.example/v1/metrics"}"#
    )
    .is_empty());
    assert_eq!(
        one(r#""otlp": {"enabled": true}"#),
        "otlp.endpoint: is required when the connector is enabled"
    );
    assert_eq!(
        one(r#""otlp": {"protocol": "grpc"}"#),
        "otlp.protocol: must be one of: http_json"
    );
    assert_eq!(
        one(r#""collector_agent": {"enabled": true, "endpoint": "http://127.0.0.1:4318/v1/logs"}"#),
        "collector_agent.endpoint: path must be /v1/metrics when the profile is enabled"
    );
    assert!(
        problems(r#""collector_agent": {"endpoint": "http://127.0.0.1:4318/other"}"#).is_empty()
    );
    assert_eq!(
        one(
            r#""siem_hec": {"enabled": true, "token_env": "HEC_TOKEN", "endpoint": "https://siem.example:8088/services/collector/raw"}"#
        ),
        "siem_hec.endpoint: path must be /services/collector/event when the connector is enabled"
    );
    assert!(problems(r#""siem_hec": {"enabled": true, "token_env": "HEC_TOKEN", "endpoint": "https://siem.example:8088/services/collector/event"}"#).is_empty());
}

#[test]
fn timeout_ranges() {
    for (block, max) in [
        ("otlp", "60"),
        ("search_stack", "60"),
        ("collector_agent", "60"),
        ("siem_hec", "60"),
        ("cloud_a_monitoring", "60"),
        ("cloud_b_monitoring", "60"),
        ("cloud_c_monitoring", "60"),
        ("statsd", "60"),
        ("agent_statsd", "60"),
        ("syslog", "60"),
        ("broker_server_monitoring", "30"),
    ] {
        for bad in ["0", "-1", "61", "1000"] {
            if max == "60" || bad != "61" {
                assert_eq!(
                    one(&format!(r#""{block}": {{"timeout_seconds": {bad}}}"#)),
                    format!("{block}.timeout_seconds: must be a number greater than 0 and at most {max}")
                );
            }
        }
        assert!(problems(&format!(r#""{block}": {{"timeout_seconds": 0.5}}"#)).is_empty());
    }
    assert_eq!(
        one(r#""broker_server_monitoring": {"timeout_seconds": 31}"#),
        "broker_server_monitoring.timeout_seconds: must be a number greater than 0 and at most 30"
    );
    assert_eq!(
        one(r#""otlp": {"max_retries": 11}"#),
        "otlp.max_retries: must be an integer from 0 to 10"
    );
    assert_eq!(
        one(r#""syslog": {"retry_backoff_seconds": 61}"#),
        "syslog.retry_backoff_seconds: must be a number from 0 to 60"
    );
}

#[test]
fn ports_and_transports() {
    for block in ["statsd", "agent_statsd", "syslog"] {
        assert_eq!(
            one(&format!(r#""{block}": {{"port": 70000}}"#)),
            format!("{block}.port: must be an integer from 1 to 65535")
        );
        assert_eq!(
            one(&format!(r#""{block}": {{"transport": "unixgram"}}"#)),
            format!("{block}.socket_path: is required when transport is unixgram")
        );
        assert_eq!(
            one(&format!(r#""{block}": {{"transport": "tcp"}}"#)),
            format!("{block}.transport: must be one of: udp, unixgram")
        );
        assert!(problems(&format!(
            r#""{block}": {{"enabled": true, "transport": "unixgram", "socket_path": "/run/x.sock"}}"#
        ))
        .is_empty());
    }
    assert_eq!(
        one(r#""statsd": {"max_datagram_bytes": 70000}"#),
        "statsd.max_datagram_bytes: must be an integer from 64 to 65507"
    );
    assert_eq!(
        one(r#""syslog": {"max_message_bytes": 100}"#),
        "syslog.max_message_bytes: must be an integer from 480 to 65507"
    );
    assert_eq!(
        one(r#""syslog": {"facility": "local9"}"#),
        "syslog.facility: must be a syslog facility name (kern, user, daemon, local0 to local7, ...)"
    );
    assert_eq!(
        one(r#""syslog": {"app_name": "my app"}"#),
        "syslog.app_name: must be 1 to 48 printable ASCII characters without spaces"
    );
}

#[test]
fn required_fields_of_enabled_connectors() {
    assert_eq!(
        problems(r#""siem_hec": {"enabled": true}"#),
        [
            "siem_hec.endpoint: is required when the connector is enabled",
            "siem_hec.token_env: is required when the connector is enabled",
        ]
    );
    assert_eq!(
        problems(r#""cloud_a_monitoring": {"enabled": true}"#),
        [
            "cloud_a_monitoring.region: is required when the connector is enabled",
            "cloud_a_monitoring.compartment_id: is required when the connector is enabled",
        ]
    );
    assert_eq!(
        one(r#""cloud_a_monitoring": {"enabled": true, "region": "eu-frankfurt-1", "compartment_id": "ocid1.compartment.oc1..aaaa", "auth_mode": "config_file"}"#),
        "cloud_a_monitoring.config_file: is required when the connector is enabled with auth_mode config_file"
    );
    assert_eq!(
        one(r#""cloud_b_monitoring": {"enabled": true}"#),
        "cloud_b_monitoring.region: is required when the connector is enabled"
    );
    assert_eq!(
        problems(r#""cloud_c_monitoring": {"enabled": true}"#),
        [
            "cloud_c_monitoring.resource_id: is required when the connector is enabled",
            "cloud_c_monitoring.location: is required when the connector is enabled",
            "cloud_c_monitoring.token_env: is required when the connector is enabled",
        ]
    );
    assert_eq!(
        problems(r#""collector_agent": {"enabled": true, "endpoint": "http://127.0.0.1:4318/v1/metrics", "upstream_auth_mode": "basic"}"#),
        [
            "collector_agent.upstream_auth_username_env: is required when the profile is enabled with upstream_auth_mode basic",
            "collector_agent.upstream_auth_password_env: is required when the profile is enabled with upstream_auth_mode basic",
        ]
    );
    assert!(problems(r#""collector_agent": {"upstream_auth_mode": "basic"}"#).is_empty());
    assert_eq!(
        problems(r#""broker_server_monitoring": {"enabled": true}"#),
        [
            "broker_server_monitoring.base_url: is required when the connector is enabled",
            "broker_server_monitoring.allowed_endpoints: must name at least one endpoint when the connector is enabled",
        ]
    );
    assert_eq!(
        one(r#""siem_hec": {"token_env": "hec token"}"#),
        "siem_hec.token_env: must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
    );
    // Fully configured connectors are valid.
    assert!(problems(
        r#""cloud_a_monitoring": {"enabled": true, "region": "eu-frankfurt-1", "compartment_id": "ocid1.compartment.oc1..aaaa"},
           "cloud_b_monitoring": {"enabled": true, "region": "us-east-1", "unit": "Count", "storage_resolution": 1},
           "cloud_c_monitoring": {"enabled": true, "resource_id": "/subscriptions/s/resourceGroups/g/providers/p/x", "location": "westeurope", "token_env": "AZ_TOKEN"},
           "broker_server_monitoring": {"enabled": true, "base_url": "http://127.0.0.1:8222", "allowed_endpoints": ["/varz", "/jsz"], "allowed_fields": ["jetstream.stats.messages"]}"#
    )
    .is_empty());
}

#[test]
fn cloud_namespaces_and_limits() {
    assert_eq!(
        one(r#""cloud_a_monitoring": {"metric_namespace": "oci_custom"}"#),
        "cloud_a_monitoring.metric_namespace: must not start with the reserved prefix oci_ or oracle_"
    );
    assert_eq!(
        one(r#""cloud_a_monitoring": {"metric_namespace": "oracle_x"}"#),
        "cloud_a_monitoring.metric_namespace: must not start with the reserved prefix oci_ or oracle_"
    );
    assert_eq!(
        one(r#""cloud_b_monitoring": {"metric_namespace": "AWS/Custom"}"#),
        "cloud_b_monitoring.metric_namespace: must not start with AWS/"
    );
    assert_eq!(
        one(r#""cloud_b_monitoring": {"metric_namespace": "svc:metrics"}"#),
        "cloud_b_monitoring.metric_namespace: must not contain a colon"
    );
    assert_eq!(
        one(r#""cloud_c_monitoring": {"metric_namespace": "Microsoft.Compute"}"#),
        "cloud_c_monitoring.metric_namespace: must not start with Microsoft."
    );
    assert_eq!(
        one(r#""cloud_c_monitoring": {"metric_namespace": "svc:m"}"#),
        "cloud_c_monitoring.metric_namespace: must not contain a colon"
    );
    assert_eq!(
        one(r#""cloud_a_monitoring": {"max_metrics_per_request": 51}"#),
        "cloud_a_monitoring.max_metrics_per_request: must be an integer from 1 to 50"
    );
    assert_eq!(
        one(r#""cloud_b_monitoring": {"max_metrics_per_request": 1001}"#),
        "cloud_b_monitoring.max_metrics_per_request: must be an integer from 1 to 1000"
    );
    assert!(problems(r#""cloud_b_monitoring": {"max_metrics_per_request": 1000}"#).is_empty());
    assert_eq!(
        one(r#""cloud_b_monitoring": {"storage_resolution": 30}"#),
        "cloud_b_monitoring.storage_resolution: must be 60 (standard) or 1 (high resolution)"
    );
    assert_eq!(
        one(r#""cloud_b_monitoring": {"unit": "Parsecs"}"#),
        "cloud_b_monitoring.unit: must be a standard unit such as Count, Seconds, Milliseconds, Bytes, Percent or None"
    );
    assert_eq!(
        one(r#""cloud_c_monitoring": {"verify_tls": false}"#),
        "cloud_c_monitoring.verify_tls: must be true; TLS verification cannot be disabled"
    );
    assert_eq!(
        one(r#""otlp": {"max_request_bytes": 100000000}"#),
        "otlp.max_request_bytes: must be an integer from 1024 to 16777216"
    );
}

#[test]
fn sensitive_dimensions_tags_and_metadata() {
    let sensitive = "looks sensitive (names like subject, label, message, table, file, host, user, token, secret, key are rejected)";
    for (block, key) in [
        ("cloud_a_monitoring", "dimensions"),
        ("cloud_a_monitoring", "metadata"),
        ("cloud_b_monitoring", "dimensions"),
        ("cloud_c_monitoring", "dimensions"),
        ("agent_statsd", "tags"),
    ] {
        for name in [
            "subject",
            "classification",
            "message_type",
            "table",
            "api_key",
            "hostname",
            "user",
            "db_token",
        ] {
            assert_eq!(
                one(&format!(
                    r#""{block}": {{"{key}": {{"{name}": "x", "source": "svc"}}}}"#
                )),
                format!("{block}.{key}.{name}: {sensitive}")
            );
        }
        assert_eq!(
            one(&format!(r#""{block}": {{"{key}": {{"request_id": "x", "source": "svc"}}}}"#)),
            format!("{block}.{key}.request_id: looks high-cardinality (ids, addresses, timestamps are not static dimensions)")
        );
        assert_eq!(
            one(&format!(r#""{block}": {{"{key}": {{"source": "0123456789abcdef0123"}}}}"#)),
            format!("{block}.{key}.source: value looks high-cardinality or secret (long hex or digit run)")
        );
    }
    assert_eq!(
        one(r#""cloud_a_monitoring": {"dimensions": {}}"#),
        "cloud_a_monitoring.dimensions: must have at least one static dimension"
    );
    assert!(problems(
        r#""cloud_b_monitoring": {"dimensions": {"env": "prod", "team": "payments"}}"#
    )
    .is_empty());
}

#[test]
fn subject_metrics_rules() {
    assert_eq!(
        one(r#""subject_metrics": {"max_subject_families": 101}"#),
        "subject_metrics.max_subject_families: must be an integer from 1 to 100"
    );
    assert_eq!(
        one(r#""subject_metrics": {"default_action": "allow"}"#),
        "subject_metrics.default_action: must be one of: deny"
    );
    assert_eq!(
        one(r#""subject_metrics": {"overflow_action": "truncate"}"#),
        "subject_metrics.overflow_action: must be one of: drop, aggregate_other, fail_closed"
    );
    assert_eq!(
        one(r#""subject_metrics": {"rules": [{"subject": "orders.>", "display_mode": "raw", "label": "orders"}]}"#),
        "subject_metrics.rules[0].display_mode: raw requires subject_metrics.allow_raw_subjects to be true"
    );
    assert!(problems(r#""subject_metrics": {"allow_raw_subjects": true, "rules": [{"subject": "orders.>", "display_mode": "raw", "label": "orders"}]}"#).is_empty());
    assert_eq!(
        one(r#""subject_metrics": {"rules": [{"subject": "orders.>"}]}"#),
        "subject_metrics.rules[0].label: is required for an allow rule"
    );
    assert!(problems(
        r#""subject_metrics": {"rules": [{"subject": "orders.>", "action": "deny"}]}"#
    )
    .is_empty());
    assert_eq!(
        one(r#""subject_metrics": {"rules": [{"subject": "orders.>", "label": "db_password"}]}"#),
        "subject_metrics.rules[0].label: must match [a-z][a-z0-9_-]*, be at most 64 bytes, and not look like a credential"
    );
    assert_eq!(
        one(r#""subject_metrics": {"rules": [{"subject": "orders.>.x", "label": "orders"}]}"#),
        "subject_metrics.rules[0].subject: '>' may only be the last token"
    );
    assert_eq!(
        one(r#""subject_metrics": {"rules": [{"label": "orders"}]}"#),
        "subject_metrics.rules[0].subject: is required"
    );
    assert_eq!(
        one(
            r#""subject_metrics": {"overflow_action": "aggregate_other", "rules": [{"subject": "a.>", "label": "other"}]}"#
        ),
        "subject_metrics.rules[0].label: must differ from subject_metrics.overflow_label"
    );
    assert_eq!(
        one(r#""subject_metrics": {"overflow_label": "Other"}"#),
        "subject_metrics.overflow_label: must match [a-z][a-z0-9_-]*, be at most 64 bytes, and not look like a credential"
    );
    assert_eq!(
        one(r#""subject_metrics": {"rules": [{"subject": "a.>", "label": "a", "allowed_metrics": ["x-y"]}]}"#),
        "subject_metrics.rules[0].allowed_metrics[0]: must be a metric suffix matching [a-zA-Z_][a-zA-Z0-9_]*"
    );
}

#[test]
fn connector_specific_rules() {
    assert_eq!(
        one(r#""siem_hec": {"headers_env": {"Authorization": "X"}}"#),
        "siem_hec.headers_env.Authorization: is set by the connector and cannot be overridden"
    );
    assert_eq!(
        one(r#""siem_hec": {"headers_env": {"content-type": "X"}}"#),
        "siem_hec.headers_env.content-type: is set by the connector and cannot be overridden"
    );
    assert!(problems(r#""otlp": {"headers_env": {"Authorization": "OTLP_AUTH"}}"#).is_empty());
    assert_eq!(
        one(r#""otlp": {"headers_env": {"X-Scope": "not a var"}}"#),
        "otlp.headers_env.X-Scope: must name an environment variable ([A-Za-z_][A-Za-z0-9_]*)"
    );
    assert_eq!(
        one(r#""siem_hec": {"index": "Main"}"#),
        "siem_hec.index: must be 1 to 80 characters of [a-z0-9_-] starting with a letter or digit"
    );
    assert_eq!(
        one(r#""search_stack": {"data_stream_dataset": "svc-metrics"}"#),
        "search_stack.data_stream_dataset: must be 1 to 100 characters of [a-z0-9_.] starting with a letter"
    );
    assert_eq!(
        one(r#""search_stack": {"ingestion_path": "bulk"}"#),
        "search_stack.ingestion_path: must be one of: otlp_collector"
    );
    for (key, bad) in [
        ("receiver_label", "my receiver"),
        ("batch_label", "svc-batch"),
        ("exporter_label", "1st"),
        ("auth_label", ""),
    ] {
        assert_eq!(
            one(&format!(r#""collector_agent": {{"{key}": "{bad}"}}"#)),
            format!("collector_agent.{key}: must be 1 to 64 characters of [A-Za-z0-9_] starting with a letter (an identifier of the collector configuration)")
        );
    }
    assert_eq!(
        one(r#""collector_agent": {"auth_label": "upstream_token"}"#),
        "collector_agent.auth_label: must not look like a credential"
    );
    assert_eq!(
        one(r#""cloud_a_monitoring": {"compartment_id": "compartment-1"}"#),
        "cloud_a_monitoring.compartment_id: must be an OCID (ocid1.<type>.<realm>...)"
    );
    assert_eq!(
        one(r#""cloud_a_monitoring": {"auth_mode": "api_key"}"#),
        "cloud_a_monitoring.auth_mode: must be one of: instance_principal, resource_principal, config_file"
    );
    assert_eq!(
        one(r#""cloud_c_monitoring": {"resource_id": "vm-1"}"#),
        "cloud_c_monitoring.resource_id: must be a resource id starting with /subscriptions/"
    );
    assert_eq!(
        one(r#""broker_server_monitoring": {"base_url": "http://127.0.0.1:8222/varz"}"#),
        "broker_server_monitoring.base_url: must be scheme and host only, without a path"
    );
    assert_eq!(
        one(r#""broker_server_monitoring": {"base_url": "http://nats.example:8222"}"#),
        "broker_server_monitoring.base_url: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https"
    );
    assert_eq!(
        one(
            r#""broker_server_monitoring": {"base_url": "https://nats.example:8222", "verify_tls": false}"#
        ),
        "broker_server_monitoring.verify_tls: may be false only for a loopback base_url"
    );
    assert_eq!(
        one(r#""broker_server_monitoring": {"allowed_endpoints": ["/varz", "/stacksz"]}"#),
        "broker_server_monitoring.allowed_endpoints[1]: must be one of: /varz, /connz, /routez, /subsz, /accountz, /accstatz, /jsz, /healthz"
    );
    assert_eq!(
        one(r#""broker_server_monitoring": {"allowed_fields": ["jetstream..messages"]}"#),
        "broker_server_monitoring.allowed_fields[0]: must be a dotted path of [A-Za-z0-9_] names"
    );
    assert_eq!(
        one(r#""statsd": {"metric_prefix": "svc prefix"}"#),
        "statsd.metric_prefix: must be 1 to 64 characters of [A-Za-z0-9_.] starting with a letter or _"
    );
    assert_eq!(
        one(r#""agent_statsd": {"bogus": true}"#),
        "agent_statsd.bogus: unknown field"
    );
}

#[test]
fn push_connector_rules() {
    for (body, msg) in [
        (
            r#""syslog": {"severity": "loud"}"#,
            "syslog.severity: must be one of: emerg, alert, crit, err, warning, notice, info, debug",
        ),
        (
            r#""syslog": {"structured_data_id": "svc metrics"}"#,
            "syslog.structured_data_id: must be 1 to 32 printable ASCII characters without = ] \" or space",
        ),
        (
            r#""syslog": {"structured_data_id": "svc=1"}"#,
            "syslog.structured_data_id: must be 1 to 32 printable ASCII characters without = ] \" or space",
        ),
        (
            r#""syslog": {"structured_data_id": "abcdefghijklmnopqrstuvwxyz0123456"}"#,
            "syslog.structured_data_id: must be 1 to 32 printable ASCII characters without = ] \" or space",
        ),
        (
            r#""syslog": {"hostname": "my host"}"#,
            "syslog.hostname: must be 1 to 255 printable ASCII characters without spaces",
        ),
        (
            r#""syslog": {"procid": ""}"#,
            "syslog.procid: must be 1 to 128 printable ASCII characters without spaces",
        ),
        (
            r#""syslog": {"msgid": "metrics-and-more-than-thirty-two-chars"}"#,
            "syslog.msgid: must be 1 to 32 printable ASCII characters without spaces",
        ),
        (
            r#""syslog": {"socket_path": "relative.sock"}"#,
            "syslog.socket_path: must be an absolute path of at most 107 bytes",
        ),
        (
            r#""statsd": {"host": "bad host"}"#,
            "statsd.host: must be a host name or IP address",
        ),
        (
            r#""agent_statsd": {"tags": {"env": "a,b"}}"#,
            "agent_statsd.tags.env: value must be 1 to 128 characters of [A-Za-z0-9_.:/-]",
        ),
        (
            r#""agent_statsd": {"tags": {"env|x": "prod"}}"#,
            "agent_statsd.tags.env|x: must be 1 to 64 characters of [A-Za-z0-9_.-] starting with a letter",
        ),
        (
            r#""agent_statsd": {"include_metric_labels_as_tags": "yes"}"#,
            "agent_statsd.include_metric_labels_as_tags: must be true or false",
        ),
        (
            r#""siem_hec": {"source": "my source"}"#,
            "siem_hec.source: must be 1 to 128 characters of [A-Za-z0-9_.:/-]",
        ),
        (
            r#""siem_hec": {"sourcetype": "svc|metrics"}"#,
            "siem_hec.sourcetype: must be 1 to 128 characters of [A-Za-z0-9_.:/-]",
        ),
        (
            r#""siem_hec": {"host": "0123456789abcdef0123"}"#,
            "siem_hec.host: looks high-cardinality or secret (long hex or digit run)",
        ),
        (
            r#""siem_hec": {"token_env": "HEC-TOKEN"}"#,
            "siem_hec.token_env: must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
        ),
        (
            r#""siem_hec": {"headers_env": {"X-Tenant": "tenant var"}}"#,
            "siem_hec.headers_env.X-Tenant: must name an environment variable ([A-Za-z_][A-Za-z0-9_]*)",
        ),
        (
            r#""otlp": {"headers_env": {"Host": "OTLP_HOST"}}"#,
            "otlp.headers_env.Host: is set by the connector and cannot be overridden",
        ),
        (
            r#""search_stack": {"headers_env": {"Content-Type": "CT"}}"#,
            "search_stack.headers_env.Content-Type: is set by the connector and cannot be overridden",
        ),
        (
            r#""collector_agent": {"headers_env": {"bad header": "V"}}"#,
            "collector_agent.headers_env.bad header: must be a header name without spaces or control characters",
        ),
        (
            r#""search_stack": {"data_stream_namespace": "prod.eu"}"#,
            "search_stack.data_stream_namespace: must be 1 to 100 characters of [a-z0-9_] starting with a letter",
        ),
        (
            r#""search_stack": {"enabled": true}"#,
            "search_stack.endpoint: is required when the connector is enabled",
        ),
        (
            r#""collector_agent": {"enabled": true}"#,
            "collector_agent.endpoint: is required when the profile is enabled",
        ),
        (
            r#""collector_agent": {"handoff_mode": "grpc"}"#,
            "collector_agent.handoff_mode: must be one of: otlp_http",
        ),
        (
            r#""collector_agent": {"upstream_auth_mode": "oauth"}"#,
            "collector_agent.upstream_auth_mode: must be one of: none, basic",
        ),
        (
            r#""collector_agent": {"upstream_endpoint_env": "UPSTREAM ENDPOINT"}"#,
            "collector_agent.upstream_endpoint_env: must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
        ),
        (
            r#""collector_agent": {"max_request_bytes": 1023}"#,
            "collector_agent.max_request_bytes: must be an integer from 1024 to 16777216",
        ),
        (
            r#""siem_hec": {"stale_after_seconds": 0}"#,
            "siem_hec.stale_after_seconds: must be a number greater than 0 and at most 31536000",
        ),
        (
            r#""statsd": {"max_datagram_bytes": 63}"#,
            "statsd.max_datagram_bytes: must be an integer from 64 to 65507",
        ),
        (
            r#""agent_statsd": {"transport": "unixgram"}"#,
            "agent_statsd.socket_path: is required when transport is unixgram",
        ),
    ] {
        assert_eq!(one(body), msg, "{body}");
    }
    // Complete, enabled push connectors are valid.
    assert!(problems(
        r#""otlp": {"enabled": true, "endpoint": "https://otlp.example:4318/v1/metrics", "headers_env": {"X-Api-Key": "OTLP_KEY"}},
           "search_stack": {"enabled": true, "endpoint": "https://apm.example/v1/metrics", "data_stream_namespace": "prod"},
           "collector_agent": {"enabled": true, "endpoint": "http://localhost:4318/v1/metrics", "upstream_auth_mode": "basic",
                               "upstream_auth_username_env": "UP_USER", "upstream_auth_password_env": "UP_PASS"},
           "siem_hec": {"enabled": true, "endpoint": "https://siem.example:8088/services/collector/event", "token_env": "HEC_TOKEN", "index": "svc_metrics"},
           "statsd": {"enabled": true, "metric_prefix": "svc.prod"},
           "agent_statsd": {"enabled": true, "transport": "unixgram", "socket_path": "/var/run/datadog/dsd.socket", "tags": {"env": "prod"}, "include_metric_labels_as_tags": true},
           "syslog": {"enabled": true, "facility": "local3", "severity": "notice", "structured_data_id": "svc@32473"}"#
    )
    .is_empty());
}

/// Every rule of the cloud A, B, C and broker server monitoring blocks, with its message (some
/// are also covered above; this is the complete list in one place).
#[test]
fn every_cloud_and_broker_monitoring_rule() {
    let long = "a".repeat(256);
    let cases: Vec<(String, &str)> = vec![
        // cloud_a_monitoring
        (r#""cloud_a_monitoring": {"metric_namespace": "OCI_metrics"}"#.into(), "cloud_a_monitoring.metric_namespace: must not start with the reserved prefix oci_ or oracle_"),
        (r#""cloud_a_monitoring": {"metric_namespace": "1svc"}"#.into(), "cloud_a_monitoring.metric_namespace: must be 1 to 255 characters of [A-Za-z0-9_] starting with a letter"),
        (r#""cloud_a_monitoring": {"metric_namespace": "svc-metrics"}"#.into(), "cloud_a_monitoring.metric_namespace: must be 1 to 255 characters of [A-Za-z0-9_] starting with a letter"),
        (format!(r#""cloud_a_monitoring": {{"metric_namespace": "{long}"}}"#), "cloud_a_monitoring.metric_namespace: must be 1 to 255 characters of [A-Za-z0-9_] starting with a letter"),
        (r#""cloud_a_monitoring": {"region": "EU_FRANKFURT"}"#.into(), "cloud_a_monitoring.region: must be 1 to 64 characters of [a-z0-9-]"),
        (r#""cloud_a_monitoring": {"compartment_id": "compartment-1"}"#.into(), "cloud_a_monitoring.compartment_id: must be an OCID (ocid1.<type>.<realm>...)"),
        (r#""cloud_a_monitoring": {"compartment_id": "ocid1.instance.oc1.eu-frankfurt-1.abc"}"#.into(), "cloud_a_monitoring.compartment_id: must be a compartment OCID (ocid1.compartment.…) or the tenancy OCID (ocid1.tenancy.…, the root compartment)"),
        (r#""cloud_a_monitoring": {"resource_group": "svc prod"}"#.into(), "cloud_a_monitoring.resource_group: must be 1 to 128 characters of [A-Za-z0-9_.:/-]"),
        (r#""cloud_a_monitoring": {"resource_group": "deadbeefdeadbeefdeadbeef"}"#.into(), "cloud_a_monitoring.resource_group: looks high-cardinality or secret (long hex or digit run)"),
        (r#""cloud_a_monitoring": {"auth_mode": "api_key"}"#.into(), "cloud_a_monitoring.auth_mode: must be one of: instance_principal, resource_principal, config_file"),
        (r#""cloud_a_monitoring": {"enabled": true, "region": "eu-frankfurt-1", "compartment_id": "ocid1.tenancy.oc1..aaaa", "auth_mode": "config_file"}"#.into(), "cloud_a_monitoring.config_file: is required when the connector is enabled with auth_mode config_file"),
        (r#""cloud_a_monitoring": {"config_file": "oci/config"}"#.into(), "cloud_a_monitoring.config_file: must be an absolute path"),
        (r#""cloud_a_monitoring": {"profile": "my profile"}"#.into(), "cloud_a_monitoring.profile: must be 1 to 64 characters of [A-Za-z0-9_-]"),
        (r#""cloud_a_monitoring": {"batch_atomicity": "atomic"}"#.into(), "cloud_a_monitoring.batch_atomicity: must be one of: ATOMIC, NON_ATOMIC"),
        (r#""cloud_a_monitoring": {"dimensions": {}}"#.into(), "cloud_a_monitoring.dimensions: must have at least one static dimension"),
        (r#""cloud_a_monitoring": {"dimensions": {"hostname": "a"}}"#.into(), "cloud_a_monitoring.dimensions.hostname: looks sensitive (names like subject, label, message, table, file, host, user, token, secret, key are rejected)"),
        (r#""cloud_a_monitoring": {"dimensions": {"env": "a b"}}"#.into(), "cloud_a_monitoring.dimensions.env: value must be 1 to 128 characters of [A-Za-z0-9_.:/-]"),
        (r#""cloud_a_monitoring": {"metadata": {"api_key": "x"}}"#.into(), "cloud_a_monitoring.metadata.api_key: looks sensitive (names like subject, label, message, table, file, host, user, token, secret, key are rejected)"),
        (r#""cloud_a_monitoring": {"timeout_seconds": 61}"#.into(), "cloud_a_monitoring.timeout_seconds: must be a number greater than 0 and at most 60"),
        (r#""cloud_a_monitoring": {"max_retries": 11}"#.into(), "cloud_a_monitoring.max_retries: must be an integer from 0 to 10"),
        (r#""cloud_a_monitoring": {"retry_backoff_seconds": 61}"#.into(), "cloud_a_monitoring.retry_backoff_seconds: must be a number from 0 to 60"),
        (r#""cloud_a_monitoring": {"stale_after_seconds": 0}"#.into(), "cloud_a_monitoring.stale_after_seconds: must be a number greater than 0 and at most 31536000"),
        (r#""cloud_a_monitoring": {"max_metrics_per_request": 51}"#.into(), "cloud_a_monitoring.max_metrics_per_request: must be an integer from 1 to 50"),
        (r#""cloud_a_monitoring": {"max_request_bytes": 1023}"#.into(), "cloud_a_monitoring.max_request_bytes: must be an integer from 1024 to 16777216"),
        // cloud_b_monitoring
        (r#""cloud_b_monitoring": {"metric_namespace": "aws/custom"}"#.into(), "cloud_b_monitoring.metric_namespace: must not start with AWS/"),
        (r#""cloud_b_monitoring": {"metric_namespace": "svc:metrics"}"#.into(), "cloud_b_monitoring.metric_namespace: must not contain a colon"),
        (r#""cloud_b_monitoring": {"metric_namespace": "svc metrics"}"#.into(), "cloud_b_monitoring.metric_namespace: must be 1 to 255 characters of [A-Za-z0-9._/#-]"),
        (r#""cloud_b_monitoring": {"enabled": true}"#.into(), "cloud_b_monitoring.region: is required when the connector is enabled"),
        (r#""cloud_b_monitoring": {"region": "US-EAST-1"}"#.into(), "cloud_b_monitoring.region: must be 1 to 64 characters of [a-z0-9-]"),
        (r#""cloud_b_monitoring": {"unit": "Hours"}"#.into(), "cloud_b_monitoring.unit: must be a standard unit such as Count, Seconds, Milliseconds, Bytes, Percent or None"),
        (r#""cloud_b_monitoring": {"storage_resolution": 30}"#.into(), "cloud_b_monitoring.storage_resolution: must be 60 (standard) or 1 (high resolution)"),
        (r#""cloud_b_monitoring": {"dimensions": {"subject": "orders"}}"#.into(), "cloud_b_monitoring.dimensions.subject: looks sensitive (names like subject, label, message, table, file, host, user, token, secret, key are rejected)"),
        (r#""cloud_b_monitoring": {"dimensions": {"trace_id": "x"}}"#.into(), "cloud_b_monitoring.dimensions.trace_id: looks high-cardinality (ids, addresses, timestamps are not static dimensions)"),
        (r#""cloud_b_monitoring": {"timeout_seconds": 0}"#.into(), "cloud_b_monitoring.timeout_seconds: must be a number greater than 0 and at most 60"),
        (r#""cloud_b_monitoring": {"max_metrics_per_request": 1001}"#.into(), "cloud_b_monitoring.max_metrics_per_request: must be an integer from 1 to 1000"),
        (r#""cloud_b_monitoring": {"max_request_bytes": 16777217}"#.into(), "cloud_b_monitoring.max_request_bytes: must be an integer from 1024 to 16777216"),
        // cloud_c_monitoring
        (r#""cloud_c_monitoring": {"resource_id": "/resourceGroups/g"}"#.into(), "cloud_c_monitoring.resource_id: must be a resource id starting with /subscriptions/"),
        (r#""cloud_c_monitoring": {"resource_id": "/subscriptions/s/x?y=1"}"#.into(), "cloud_c_monitoring.resource_id: must be a resource id starting with /subscriptions/"),
        (r#""cloud_c_monitoring": {"location": "West Europe"}"#.into(), "cloud_c_monitoring.location: must be 1 to 64 characters of [a-z0-9]"),
        (r#""cloud_c_monitoring": {"metric_namespace": "microsoft.compute"}"#.into(), "cloud_c_monitoring.metric_namespace: must not start with Microsoft."),
        (r#""cloud_c_monitoring": {"metric_namespace": "Azure.custom"}"#.into(), "cloud_c_monitoring.metric_namespace: must not start with Azure."),
        (r#""cloud_c_monitoring": {"metric_namespace": "a:b"}"#.into(), "cloud_c_monitoring.metric_namespace: must not contain a colon"),
        (r#""cloud_c_monitoring": {"token_env": "AZ-TOKEN"}"#.into(), "cloud_c_monitoring.token_env: must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"),
        (r#""cloud_c_monitoring": {"dimensions": {"password": "x"}}"#.into(), "cloud_c_monitoring.dimensions.password: looks sensitive (names like subject, label, message, table, file, host, user, token, secret, key are rejected)"),
        (r#""cloud_c_monitoring": {"include_metric_labels_as_dimensions": true, "dimensions": {"d0": "v", "d1": "v", "d2": "v", "d3": "v", "d4": "v", "d5": "v", "d6": "v", "d7": "v", "d8": "v", "d9": "v"}}"#.into(), "cloud_c_monitoring.dimensions: must have at most 9 entries with include_metric_labels_as_dimensions (subject_family is one more; the service allows 10 per metric)"),
        (r#""cloud_c_monitoring": {"verify_tls": false}"#.into(), "cloud_c_monitoring.verify_tls: must be true; TLS verification cannot be disabled"),
        (r#""cloud_c_monitoring": {"retry_backoff_seconds": -1}"#.into(), "cloud_c_monitoring.retry_backoff_seconds: must be a number from 0 to 60"),
        // broker_server_monitoring
        (r#""broker_server_monitoring": {"base_url": "https://user:pw@nats.example:8222"}"#.into(), "broker_server_monitoring.base_url: must not contain credentials; use the connector's environment-variable fields"),
        (r#""broker_server_monitoring": {"base_url": "http://127.0.0.1:8222?x=1"}"#.into(), "broker_server_monitoring.base_url: must not contain a query string or fragment"),
        (r#""broker_server_monitoring": {"base_url": "http://127.0.0.1:8222/varz"}"#.into(), "broker_server_monitoring.base_url: must be scheme and host only, without a path"),
        (r#""broker_server_monitoring": {"base_url": "http://10.0.0.5:8222"}"#.into(), "broker_server_monitoring.base_url: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https"),
        (r#""broker_server_monitoring": {"allowed_endpoints": ["/varz", "/varz"]}"#.into(), "broker_server_monitoring.allowed_endpoints[1]: is listed twice"),
        (r#""broker_server_monitoring": {"allowed_endpoints": ["/ipqueuesz"]}"#.into(), "broker_server_monitoring.allowed_endpoints[0]: must be one of: /varz, /connz, /routez, /subsz, /accountz, /accstatz, /jsz, /healthz"),
        (r#""broker_server_monitoring": {"allowed_fields": ["mem", "mem"]}"#.into(), "broker_server_monitoring.allowed_fields[1]: is listed twice"),
        (r#""broker_server_monitoring": {"allowed_fields": ["a/b"]}"#.into(), "broker_server_monitoring.allowed_fields[0]: must be a dotted path of [A-Za-z0-9_] names"),
        (format!(r#""broker_server_monitoring": {{"allowed_fields": [{}]}}"#, (0..101).map(|i| format!("\"f{i}\"")).collect::<Vec<_>>().join(",")), "broker_server_monitoring.allowed_fields: must have at most 100 entries"),
        (r#""broker_server_monitoring": {"enabled": true, "scrape_enabled": true, "base_url": "http://127.0.0.1:8222", "allowed_endpoints": ["/varz"]}"#.into(), "broker_server_monitoring.allowed_fields: must name at least one field when the connector and scrape_enabled are on"),
        (r#""broker_server_monitoring": {"timeout_seconds": 31}"#.into(), "broker_server_monitoring.timeout_seconds: must be a number greater than 0 and at most 30"),
        (r#""broker_server_monitoring": {"max_response_bytes": 100}"#.into(), "broker_server_monitoring.max_response_bytes: must be an integer from 1024 to 16777216"),
        (r#""broker_server_monitoring": {"base_url": "https://nats.example", "verify_tls": false}"#.into(), "broker_server_monitoring.verify_tls: may be false only for a loopback base_url"),
        (r#""broker_server_monitoring": {"ca_file": "ca.pem"}"#.into(), "broker_server_monitoring.ca_file: must be an absolute path"),
        (r#""broker_server_monitoring": {"base_url": "http://127.0.0.1:8222", "ca_file": "/etc/ssl/ca.pem"}"#.into(), "broker_server_monitoring.ca_file: is only used with an https base_url"),
        (r#""broker_server_monitoring": {"base_url": "https://127.0.0.1:8222", "verify_tls": false, "ca_file": "/etc/ssl/ca.pem"}"#.into(), "broker_server_monitoring.ca_file: cannot be combined with verify_tls false"),
    ];
    for (body, msg) in &cases {
        assert_eq!(one(body), *msg, "{body}");
    }
    for field in [
        "server_name",
        "server_id",
        "port",
        "http_port",
        "cluster.port",
        "gateway.name",
        "host",
        "jetstream.meta_cluster.leader_id",
        "leafnode.urls",
        "account",
        "stream_name",
        "consumer.name",
    ] {
        assert_eq!(
            one(&format!(r#""broker_server_monitoring": {{"allowed_fields": ["{field}"]}}"#)),
            "broker_server_monitoring.allowed_fields[0]: names an identity, address or topology field (name, id, host, ip, url, port, account, stream, consumer, ...); only aggregate values may be exported",
            "{field}"
        );
    }
    for field in [
        "mem",
        "cpu",
        "connections",
        "total_connections",
        "routes",
        "leafnodes",
        "in_msgs",
        "slow_consumers",
        "subscriptions",
        "streams",
        "consumers",
        "jetstream.stats.accounts",
        "jetstream.stats.api.errors",
        "num_subscriptions",
    ] {
        assert_eq!(
            problems(&format!(
                r#""broker_server_monitoring": {{"allowed_fields": ["{field}"]}}"#
            )),
            Vec::<String>::new(),
            "{field}"
        );
    }
    // A fully configured broker block with a CA is valid.
    assert!(problems(
        r#""broker_server_monitoring": {"enabled": true, "scrape_enabled": true, "base_url": "https://nats.example:8222",
            "ca_file": "/etc/ssl/nats-ca.pem", "allowed_endpoints": ["/varz", "/jsz", "/healthz"],
            "allowed_fields": ["mem", "jetstream.stats.memory", "messages"]}"#
    )
    .is_empty());
}
