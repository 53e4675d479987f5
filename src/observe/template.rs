//! `init-scrape-policy`: a disabled policy derived from the runtime config.
//!
//! The template carries every top-level field of the policy except `cloud_b_monitoring` and
//! `cloud_c_monitoring`, with the defaults filled in, sharing switched off, and the subject
//! hints collected from the runtime config.

use serde::Serialize;

use crate::config::RuntimeConfig;
use crate::observe::policy::{self, Policy, SubjectEntry};

/// Where a subject hint came from (for docs and tests; not written to the policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectHint {
    pub subject: String,
    pub source: &'static str,
}

/// Every subject pattern the runtime config names, in config order, without duplicates.
///
/// Sources today: the broker subjects (`nats.subject` or `nats.subjects`), the runner's subject families
/// (`metrics.subject_families[].subject`) and the relational sink's subject-to-table routes
/// (`sink.routes[].subject`, fan-out children included). Later subject rules of the runtime
/// config (payload-encryption rules, message-metadata rules, security-label rules) add their
/// patterns here, one `push` per rule list.
pub fn subject_hints(config: &RuntimeConfig) -> Vec<SubjectHint> {
    let mut hints: Vec<SubjectHint> = Vec::new();
    let mut push = |subject: &str, source: &'static str| {
        if !subject.is_empty() && !hints.iter().any(|h| h.subject == subject) {
            hints.push(SubjectHint {
                subject: subject.to_string(),
                source,
            });
        }
    };
    let source = match config.nats.subjects.len() {
        1 => "nats.subject",
        _ => "nats.subjects",
    };
    for subject in &config.nats.subjects {
        push(subject, source);
    }
    for fam in &config.metrics.subject_families {
        push(fam.pattern.as_str(), "metrics.subject_families");
    }
    for rule in &config.payload_encryption.rules {
        push(rule.pattern.as_str(), "payload_encryption.rules");
    }
    for rule in &config.message_metadata.rules {
        push(rule.pattern.as_str(), "message_metadata.rules");
    }
    for rule in &config.security_labels.rules {
        push(rule.pattern.as_str(), "security_labels.rules");
    }
    // Relational subject-to-table routes (the sink itself or fan-out children).
    for (_, rc) in crate::sink::relational::configs_in(&config.sink) {
        for route in &rc.routes {
            push(route.subject.as_str(), "sink.routes");
        }
    }
    hints
}

/// The default stale bound the template writes (the spec's minimal examples use 60 s).
pub const TEMPLATE_STALE_AFTER_SECONDS: f64 = 60.0;

/// The template document: the policy without `cloud_b_monitoring` and `cloud_c_monitoring`,
/// fields in the spec's order.
#[derive(Debug, Serialize)]
pub struct Template<'a> {
    schema: &'a str,
    enabled: bool,
    namespace: &'a str,
    allowed_metrics: &'a [String],
    allowed_metric_patterns: &'a [String],
    denied_metrics: &'a [String],
    denied_metric_patterns: &'a [String],
    include_observations: bool,
    include_legacy: bool,
    expected_owner: Option<u32>,
    subjects: &'a [SubjectEntry],
    subject_metrics: &'a policy::SubjectMetrics,
    scrape: &'a policy::Scrape,
    otlp: &'a policy::Otlp,
    search_stack: &'a policy::SearchStack,
    collector_agent: &'a policy::CollectorAgent,
    siem_hec: &'a policy::SiemHec,
    cloud_a_monitoring: &'a policy::OciMonitoring,
    statsd: &'a policy::Statsd,
    agent_statsd: &'a policy::AgentStatsd,
    syslog: &'a policy::Syslog,
    broker_server_monitoring: &'a policy::BrokerServerMonitoring,
}

/// The disabled policy the template is made of.
pub fn template_policy(config: &RuntimeConfig, output_file: Option<&str>) -> Policy {
    let mut p = Policy::disabled();
    p.namespace = config.metrics.namespace.clone();
    p.subjects = subject_hints(config)
        .into_iter()
        .map(|h| SubjectEntry {
            subject: h.subject,
            enabled: false,
            allowed_metrics: Vec::new(),
            allowed_metric_patterns: Vec::new(),
            share_subject_label: false,
        })
        .collect();
    p.scrape.output_file = output_file.map(str::to_string);
    p.scrape.stale_after_seconds = Some(TEMPLATE_STALE_AFTER_SECONDS);
    p
}

/// Renders the template document as pretty JSON with a final newline.
pub fn render(p: &Policy) -> String {
    let t = Template {
        schema: &p.schema,
        enabled: p.enabled,
        namespace: &p.namespace,
        allowed_metrics: &p.allowed_metrics,
        allowed_metric_patterns: &p.allowed_metric_patterns,
        denied_metrics: &p.denied_metrics,
        denied_metric_patterns: &p.denied_metric_patterns,
        include_observations: p.include_observations,
        include_legacy: p.include_legacy,
        expected_owner: p.expected_owner,
        subjects: &p.subjects,
        subject_metrics: &p.subject_metrics,
        scrape: &p.scrape,
        otlp: &p.otlp,
        search_stack: &p.search_stack,
        collector_agent: &p.collector_agent,
        siem_hec: &p.siem_hec,
        cloud_a_monitoring: &p.cloud_a_monitoring,
        statsd: &p.statsd,
        agent_statsd: &p.agent_statsd,
        syslog: &p.syslog,
        broker_server_monitoring: &p.broker_server_monitoring,
    };
    let mut text = serde_json::to_string_pretty(&t).expect("the policy model always serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"{
      "nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"},
      "sink": {"type": "file", "directory": "/tmp/out"},
      "metrics": {"enabled": true, "namespace": "shop", "snapshot_file": "/tmp/s.json",
                  "subject_families": [{"subject": "orders.eu.>", "label": "orders_eu"},
                                       {"subject": "orders.>", "label": "orders"}]}
    }"#;

    #[test]
    fn template_is_a_valid_disabled_policy_without_cloud_b_and_c() {
        let config = RuntimeConfig::parse(CONFIG).unwrap();
        let text = render(&template_policy(&config, Some("/var/lib/node/svc.prom")));
        let p = Policy::parse(&text).unwrap();
        assert!(!p.enabled && !p.scrape.enabled && !p.scrape.http_endpoint.enabled);
        assert_eq!(p.namespace, "shop");
        assert_eq!(
            p.scrape.output_file.as_deref(),
            Some("/var/lib/node/svc.prom")
        );
        let subjects: Vec<&str> = p.subjects.iter().map(|s| s.subject.as_str()).collect();
        assert_eq!(subjects, ["orders.>", "orders.eu.>"]);
        let keys: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("  \""))
            .filter_map(|l| l.split('"').next())
            .collect();
        let full = Policy::disabled().to_json_pretty();
        let mut want: Vec<&str> = full
            .lines()
            .filter_map(|l| l.strip_prefix("  \""))
            .filter_map(|l| l.split('"').next())
            .collect();
        want.retain(|k| *k != "cloud_b_monitoring" && *k != "cloud_c_monitoring");
        assert_eq!(keys, want);
        assert!(text.ends_with("}\n"));
    }

    #[test]
    fn relational_table_routes_become_subject_hints() {
        let config = RuntimeConfig::parse(
            r#"{"nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                         "subject": "orders.>"},
                "sink": {"type": "fanout", "sinks": {
                  "db": {"type": "relational_db", "dsn": "postgresql://svc@127.0.0.1/e",
                         "tls_mode": "disable", "table": "events",
                         "routes": [{"subject": "orders.eu.>", "table": "eu"},
                                    {"subject": "orders.>", "table": "o"}]}}}}"#,
        )
        .unwrap();
        let hints = subject_hints(&config);
        let got: Vec<(&str, &str)> = hints
            .iter()
            .map(|h| (h.subject.as_str(), h.source))
            .collect();
        assert_eq!(
            got,
            [("orders.>", "nats.subject"), ("orders.eu.>", "sink.routes")]
        );
    }

    #[test]
    fn several_filter_subjects_each_become_a_subject_hint() {
        let config = RuntimeConfig::parse(
            r#"{"nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                         "subjects": ["orders.>", "payments.eu.*"]},
                "sink": {"type": "file", "directory": "/tmp/out"},
                "metrics": {"subject_families": [{"subject": "payments.eu.*", "label": "pay"}]}}"#,
        )
        .unwrap();
        let hints = subject_hints(&config);
        let got: Vec<(&str, &str)> = hints
            .iter()
            .map(|h| (h.subject.as_str(), h.source))
            .collect();
        assert_eq!(
            got,
            [
                ("orders.>", "nats.subjects"),
                ("payments.eu.*", "nats.subjects")
            ]
        );
    }

    #[test]
    fn metadata_and_label_rules_become_subject_hints() {
        let config = RuntimeConfig::parse(
            r#"{"nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                         "subject": "orders.>"},
                "sink": {"type": "file", "directory": "/tmp/out"},
                "message_metadata": {"rules": [{"subject": "orders.urgent.>", "priority": "high"}]},
                "payload_encryption": {"rules": [{"subject": "orders.pii.>", "action": "encrypt"},
                                                 {"subject": "orders.urgent.>", "action": "clear"}]},
                "security_labels": {"enabled": true,
                                    "rules": [{"subject": "orders.eu.*", "profile": null},
                                              {"subject": "orders.>", "profile": null}]}}"#,
        )
        .unwrap();
        let hints = subject_hints(&config);
        let got: Vec<(&str, &str)> = hints
            .iter()
            .map(|h| (h.subject.as_str(), h.source))
            .collect();
        assert_eq!(
            got,
            [
                ("orders.>", "nats.subject"),
                ("orders.pii.>", "payload_encryption.rules"),
                ("orders.urgent.>", "payload_encryption.rules"),
                ("orders.eu.*", "security_labels.rules"),
            ]
        );
    }
}
