//! The subject hints of `svc-observe init-scrape-policy`: every subject pattern the runtime
//! config names. Read here, with the config, because the exporter does not link the runner's
//! config reader (`svc::cli::observe` hands the exporter what it needs).

use super::RuntimeConfig;

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
    fn broker_subjects_come_before_the_subject_families() {
        let config = RuntimeConfig::parse(CONFIG).unwrap();
        assert_eq!(config.metrics.namespace, "shop");
        let subjects: Vec<String> = subject_hints(&config)
            .into_iter()
            .map(|h| h.subject)
            .collect();
        assert_eq!(subjects, ["orders.>", "orders.eu.>"]);
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
