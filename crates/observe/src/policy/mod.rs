//! The observability policy (`svc.observability.policy.v1`): the model with every field and
//! default of the spec, read strictly (unknown fields rejected, every problem reported with its
//! field path) and serialized with defaults filled for `show-effective-policy`.
//!
//! One file per block: the connector blocks carry their whole configuration and validation
//! now, so connector work only adds behaviour. Field reference: `docs/observe.md` and one page
//! per connector in `docs/observe/`.

pub mod azure_monitor;
pub mod broker_server;
pub mod checks;
pub mod cloudwatch;
pub mod collector_agent;
pub mod oci;
pub mod otlp;
pub mod push;
pub mod scrape;
pub mod search_stack;
pub mod siem_hec;
pub mod statsd;
pub mod subject_metrics;
pub mod syslog;

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::glob;
use svc_document::grammar::is_metric_name;
use svc_document::reader::{parse_json, Invalid, ObjectReader, Problems};
use svc_subject::SubjectPattern;

pub use azure_monitor::AzureMonitor;
pub use broker_server::BrokerServerMonitoring;
pub use cloudwatch::CloudWatch;
pub use collector_agent::CollectorAgent;
pub use oci::OciMonitoring;
pub use otlp::Otlp;
pub use push::PushSettings;
pub use scrape::{HttpEndpoint, Scrape};
pub use search_stack::SearchStack;
pub use siem_hec::SiemHec;
pub use statsd::{AgentStatsd, Statsd};
pub use subject_metrics::SubjectMetrics;
pub use syslog::Syslog;

/// The only accepted `schema` value.
pub const SCHEMA: &str = "svc.observability.policy.v1";
/// At most this many entries in each allow/deny list and in `subjects`.
pub const MAX_LIST: usize = 500;

/// The whole policy. Field order is the order of the spec's table and of the JSON output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Policy {
    pub schema: String,
    /// Global sharing switch. Defaults to false.
    pub enabled: bool,
    /// Prefix of exported names. Defaults to `svc`.
    pub namespace: String,
    pub allowed_metrics: Vec<String>,
    pub allowed_metric_patterns: Vec<String>,
    pub denied_metrics: Vec<String>,
    pub denied_metric_patterns: Vec<String>,
    /// Allows timing observations. Defaults to false.
    pub include_observations: bool,
    /// Allows legacy aliases. Defaults to false.
    pub include_legacy: bool,
    /// The uid the snapshot must belong to. Defaults to null: the exporter's own user, root,
    /// or the owner of the snapshot's directory (see `observe::textfile::read_snapshot`).
    pub expected_owner: Option<u32>,
    /// Review hints only; never a label source.
    pub subjects: Vec<SubjectEntry>,
    pub subject_metrics: SubjectMetrics,
    pub scrape: Scrape,
    pub otlp: Otlp,
    pub search_stack: SearchStack,
    pub collector_agent: CollectorAgent,
    pub siem_hec: SiemHec,
    pub cloud_a_monitoring: OciMonitoring,
    pub statsd: Statsd,
    pub agent_statsd: AgentStatsd,
    pub syslog: Syslog,
    pub broker_server_monitoring: BrokerServerMonitoring,
    pub cloud_c_monitoring: AzureMonitor,
    pub cloud_b_monitoring: CloudWatch,
}

/// A subject hint: which subjects exist, for review. Never used as a label.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubjectEntry {
    pub subject: String,
    /// Defaults to false.
    pub enabled: bool,
    pub allowed_metrics: Vec<String>,
    pub allowed_metric_patterns: Vec<String>,
    /// Must stay false: raw subjects are never labels.
    pub share_subject_label: bool,
}

pub use svc_document::reader::LoadError;

impl Policy {
    pub fn load(path: &Path) -> Result<Policy, LoadError> {
        svc_document::reader::load_document(path, "policy ", Policy::parse)
    }

    /// Parses and validates a policy document, reporting every problem.
    pub fn parse(text: &str) -> Result<Policy, Invalid> {
        let value = parse_json(text)?;
        if !value.is_object() {
            return Err(Invalid::one("", "the policy must be a JSON object"));
        }
        let problems = Problems::new();
        let mut r = ObjectReader::root(&value, &problems);
        let policy = Policy::read(&mut r);
        r.finish();
        if problems.is_empty() {
            Ok(policy)
        } else {
            Err(Invalid(problems.into_vec()))
        }
    }

    /// The policy every omitted field defaults to (schema set, everything disabled).
    pub fn disabled() -> Policy {
        let empty = Value::Object(Default::default());
        let scratch = Problems::new();
        let mut r = ObjectReader::root(&empty, &scratch);
        let mut p = Policy::read(&mut r);
        p.schema = SCHEMA.to_string();
        p
    }

    fn read(r: &mut ObjectReader<'_>) -> Policy {
        let schema = r.req_string("schema");
        if !schema.is_empty() && schema != SCHEMA {
            r.problem("schema", format!("must be {SCHEMA}"));
        }
        let enabled = r.bool_or("enabled", false);
        let namespace = r.string_or("namespace", "svc");
        if !is_metric_name(&namespace) || namespace.len() > 64 {
            r.problem(
                "namespace",
                "must match [a-zA-Z_][a-zA-Z0-9_]* and be at most 64 bytes",
            );
        }
        let allowed_metrics = metric_names(r, "allowed_metrics");
        let allowed_metric_patterns = metric_patterns(r, "allowed_metric_patterns");
        let denied_metrics = metric_names(r, "denied_metrics");
        let denied_metric_patterns = metric_patterns(r, "denied_metric_patterns");
        let include_observations = r.bool_or("include_observations", false);
        let include_legacy = r.bool_or("include_legacy", false);
        let expected_owner = r
            .opt_int_in("expected_owner", 0, i64::from(u32::MAX - 1))
            .map(|uid| uid as u32);
        let entries = r.objects("subjects");
        if entries.len() > MAX_LIST {
            r.problem("subjects", format!("must have at most {MAX_LIST} entries"));
        }
        let subjects = entries
            .into_iter()
            .map(|mut e| {
                let s = SubjectEntry::read(&mut e);
                e.finish();
                s
            })
            .collect();
        Policy {
            schema,
            enabled,
            namespace,
            allowed_metrics,
            allowed_metric_patterns,
            denied_metrics,
            denied_metric_patterns,
            include_observations,
            include_legacy,
            expected_owner,
            subjects,
            subject_metrics: read_block(r, "subject_metrics", SubjectMetrics::read),
            scrape: read_block(r, "scrape", Scrape::read),
            otlp: read_block(r, "otlp", Otlp::read),
            search_stack: read_block(r, "search_stack", SearchStack::read),
            collector_agent: read_block(r, "collector_agent", CollectorAgent::read),
            siem_hec: read_block(r, "siem_hec", SiemHec::read),
            cloud_a_monitoring: read_block(r, "cloud_a_monitoring", OciMonitoring::read),
            statsd: read_block(r, "statsd", Statsd::read),
            agent_statsd: read_block(r, "agent_statsd", AgentStatsd::read),
            syslog: read_block(r, "syslog", Syslog::read),
            broker_server_monitoring: read_block(
                r,
                "broker_server_monitoring",
                BrokerServerMonitoring::read,
            ),
            cloud_c_monitoring: read_block(r, "cloud_c_monitoring", AzureMonitor::read),
            cloud_b_monitoring: read_block(r, "cloud_b_monitoring", CloudWatch::read),
        }
    }

    /// The `key=value` lines `validate-policy` prints after its first line (spec order).
    pub fn summary_lines(&self) -> Vec<String> {
        vec![
            format!("schema={}", self.schema),
            format!("enabled={}", self.enabled),
            format!("namespace={}", self.namespace),
            format!("scrape_enabled={}", self.scrape.enabled),
            format!("otlp_enabled={}", self.otlp.enabled),
            format!("elastic_enabled={}", self.search_stack.enabled),
            format!("collector_agent_enabled={}", self.collector_agent.enabled),
            format!("siem_hec_enabled={}", self.siem_hec.enabled),
            format!("statsd_enabled={}", self.statsd.enabled),
            format!(
                "broker_server_monitoring_enabled={}",
                self.broker_server_monitoring.enabled
            ),
            format!(
                "broker_server_monitoring_scrape_enabled={}",
                self.broker_server_monitoring.scrape_enabled
            ),
            format!("allowed_metrics={}", self.allowed_metrics.len()),
            format!(
                "allowed_metric_patterns={}",
                self.allowed_metric_patterns.len()
            ),
            format!("denied_metrics={}", self.denied_metrics.len()),
            format!(
                "denied_metric_patterns={}",
                self.denied_metric_patterns.len()
            ),
            format!("subjects={}", self.subjects.len()),
        ]
    }

    /// The effective policy as pretty JSON, every default filled in.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).expect("the policy model always serializes")
    }

    /// Is the textfile connector on (both switches)?
    pub fn textfile_enabled(&self) -> bool {
        self.enabled && self.scrape.enabled
    }

    /// Is the HTTP endpoint on (both switches; `scrape.enabled` is not needed)?
    pub fn http_enabled(&self) -> bool {
        self.enabled && self.scrape.http_endpoint.enabled
    }
}

impl SubjectEntry {
    fn read(r: &mut ObjectReader<'_>) -> SubjectEntry {
        let subject = r.req_string("subject");
        if !subject.is_empty() {
            if let Err(e) = SubjectPattern::parse(&subject) {
                r.problem("subject", e.to_string());
            }
        }
        let enabled = r.bool_or("enabled", false);
        let allowed_metrics = metric_names(r, "allowed_metrics");
        let allowed_metric_patterns = metric_patterns(r, "allowed_metric_patterns");
        let share_subject_label = r.bool_or("share_subject_label", false);
        if share_subject_label {
            r.problem(
                "share_subject_label",
                "must be false: raw subjects are never exported as labels; use subject_metrics rules with a reviewed label",
            );
        }
        SubjectEntry {
            subject,
            enabled,
            allowed_metrics,
            allowed_metric_patterns,
            share_subject_label,
        }
    }
}

/// Reads a nested block; an absent block is read from `{}` so every default comes from the
/// block's own reader (one place per default).
pub(crate) fn read_block<T>(
    parent: &mut ObjectReader<'_>,
    key: &'static str,
    read: impl FnOnce(&mut ObjectReader<'_>) -> T,
) -> T {
    match parent.object(key) {
        Some(mut r) => {
            let v = read(&mut r);
            r.finish();
            v
        }
        None => {
            let empty = Value::Object(Default::default());
            let scratch = Problems::new();
            let mut r = ObjectReader::at(parent.path_of(key), &empty, &scratch);
            read(&mut r)
        }
    }
}

/// A list of metric suffixes: each must fit the metric-name grammar.
pub(crate) fn metric_names(r: &mut ObjectReader<'_>, key: &'static str) -> Vec<String> {
    let list = r.string_list(key);
    if list.len() > MAX_LIST {
        r.problem(key, format!("must have at most {MAX_LIST} entries"));
    }
    for (i, n) in list.iter().enumerate() {
        if !is_metric_name(n) || n.len() > 128 {
            r.problems().push(
                format!("{}[{i}]", r.path_of(key)),
                "must be a metric suffix matching [a-zA-Z_][a-zA-Z0-9_]*",
            );
        }
    }
    list
}

/// A list of glob patterns over suffixes.
pub(crate) fn metric_patterns(r: &mut ObjectReader<'_>, key: &'static str) -> Vec<String> {
    let list = r.string_list(key);
    if list.len() > MAX_LIST {
        r.problem(key, format!("must have at most {MAX_LIST} entries"));
    }
    for (i, p) in list.iter().enumerate() {
        if !glob::is_valid(p) {
            r.problems().push(
                format!("{}[{i}]", r.path_of(key)),
                "must be a glob of [A-Za-z0-9_] with * and ?",
            );
        }
    }
    list
}

#[cfg(test)]
mod tests;
