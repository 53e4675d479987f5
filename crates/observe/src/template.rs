//! `init-scrape-policy`: a disabled policy derived from the runtime config.
//!
//! The template carries every top-level field of the policy except `cloud_b_monitoring` and
//! `cloud_c_monitoring`, with the defaults filled in, sharing switched off, and the subject
//! hints collected from the runtime config ([`TemplateInput`]).

use serde::Serialize;

use crate::policy::{self, Policy, SubjectEntry};

/// What `init-scrape-policy` takes from the runtime config. The runtime config's reader is the
/// runner's (`svc::config`), which this crate does not link: the binary reads the config and
/// hands this over (`svc::cli::observe`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateInput {
    /// `metrics.namespace`.
    pub namespace: String,
    /// Every subject pattern the runtime config names, in config order, without duplicates
    /// (`svc::config::hints::subject_hints`).
    pub subjects: Vec<String>,
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
pub fn template_policy(input: &TemplateInput, output_file: Option<&str>) -> Policy {
    let mut p = Policy::disabled();
    p.namespace = input.namespace.clone();
    p.subjects = input
        .subjects
        .iter()
        .map(|subject| SubjectEntry {
            subject: subject.clone(),
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

    #[test]
    fn template_is_a_valid_disabled_policy_without_cloud_b_and_c() {
        let input = TemplateInput {
            namespace: "shop".into(),
            subjects: vec!["orders.>".into(), "orders.eu.>".into()],
        };
        let text = render(&template_policy(&input, Some("/var/lib/node/svc.prom")));
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
}
