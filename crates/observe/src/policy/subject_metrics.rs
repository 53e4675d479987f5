//! `subject_metrics`: the subject-family policy over the snapshot's prepared rows.
//!
//! Evaluation lives in `observe/families.rs`; this file is the model and its validation.

use serde::Serialize;

use crate::glob;
use svc_document::grammar::is_family_label;
use svc_document::reader::ObjectReader;
use svc_subject::SubjectPattern;

/// Bounds of `max_subject_families` (spec "Limits").
pub const MIN_FAMILIES: i64 = 1;
pub const MAX_FAMILIES: i64 = 100;
/// At most this many rules.
pub const MAX_RULES: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DefaultAction {
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowAction {
    /// Families past the limit are not rendered.
    Drop,
    /// Families past the limit are summed under `overflow_label`.
    AggregateOther,
    /// The render fails; nothing is exported.
    FailClosed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DisplayMode {
    /// The rule's reviewed label.
    Label,
    /// The constant `redacted`.
    Redacted,
    /// 16 hex digits of SHA-256 over the family's subject pattern (not a confidentiality
    /// boundary).
    Hash,
    /// The family's subject pattern as configured on the runner.
    Raw,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubjectMetrics {
    /// Defaults to false.
    pub enabled: bool,
    /// Fixed to `deny`.
    pub default_action: DefaultAction,
    /// 1 to 100. Defaults to 20.
    pub max_subject_families: u32,
    /// Defaults to `drop`.
    pub overflow_action: OverflowAction,
    /// Defaults to `other`.
    pub overflow_label: String,
    /// Defaults to false; must be true before an allow rule may use `raw`.
    pub allow_raw_subjects: bool,
    /// Ordered rules. Defaults to [].
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rule {
    /// Subject pattern (the runtime routing grammar). Required.
    pub subject: String,
    #[serde(skip)]
    pub pattern: Option<SubjectPattern>,
    /// Defaults to `allow`.
    pub action: Action,
    /// Required for allow rules. Defaults to null.
    pub label: Option<String>,
    /// Defaults to `label`.
    pub display_mode: DisplayMode,
    /// Empty means any otherwise-approved metric. Defaults to [].
    pub allowed_metrics: Vec<String>,
    /// Defaults to [].
    pub allowed_metric_patterns: Vec<String>,
}

impl SubjectMetrics {
    pub fn read(r: &mut ObjectReader<'_>) -> SubjectMetrics {
        let enabled = r.bool_or("enabled", false);
        let default_action = r.one_of(
            "default_action",
            DefaultAction::Deny,
            &[("deny", DefaultAction::Deny)],
        );
        let max_subject_families =
            r.int_in("max_subject_families", 20, MIN_FAMILIES, MAX_FAMILIES) as u32;
        let overflow_action = r.one_of(
            "overflow_action",
            OverflowAction::Drop,
            &[
                ("drop", OverflowAction::Drop),
                ("aggregate_other", OverflowAction::AggregateOther),
                ("fail_closed", OverflowAction::FailClosed),
            ],
        );
        let overflow_label = r.string_or("overflow_label", "other");
        if !is_family_label(&overflow_label) {
            r.problem("overflow_label", LABEL_RULE);
        }
        let allow_raw_subjects = r.bool_or("allow_raw_subjects", false);
        let readers = r.objects("rules");
        if readers.len() > MAX_RULES {
            r.problem("rules", format!("must have at most {MAX_RULES} rules"));
        }
        let rules = readers
            .into_iter()
            .map(|mut rr| {
                let rule = Rule::read(&mut rr, allow_raw_subjects);
                if overflow_action == OverflowAction::AggregateOther
                    && rule.label.as_deref() == Some(overflow_label.as_str())
                {
                    rr.problem("label", "must differ from subject_metrics.overflow_label");
                }
                rr.finish();
                rule
            })
            .collect();
        SubjectMetrics {
            enabled,
            default_action,
            max_subject_families,
            overflow_action,
            overflow_label,
            allow_raw_subjects,
            rules,
        }
    }
}

const LABEL_RULE: &str =
    "must match [a-z][a-z0-9_-]*, be at most 64 bytes, and not look like a credential";

impl Rule {
    fn read(r: &mut ObjectReader<'_>, allow_raw: bool) -> Rule {
        let subject = r.req_string("subject");
        let pattern = match SubjectPattern::parse(&subject) {
            Ok(p) => Some(p),
            Err(e) => {
                if !subject.is_empty() {
                    r.problem("subject", e.to_string());
                }
                None
            }
        };
        let action = r.one_of(
            "action",
            Action::Allow,
            &[("allow", Action::Allow), ("deny", Action::Deny)],
        );
        let label = r.opt_string("label");
        match &label {
            None if action == Action::Allow => r.problem("label", "is required for an allow rule"),
            Some(l) if !is_family_label(l) => r.problem("label", LABEL_RULE),
            _ => {}
        }
        let display_mode = r.one_of(
            "display_mode",
            DisplayMode::Label,
            &[
                ("label", DisplayMode::Label),
                ("redacted", DisplayMode::Redacted),
                ("hash", DisplayMode::Hash),
                ("raw", DisplayMode::Raw),
            ],
        );
        if action == Action::Allow && display_mode == DisplayMode::Raw && !allow_raw {
            r.problem(
                "display_mode",
                "raw requires subject_metrics.allow_raw_subjects to be true",
            );
        }
        let allowed_metrics = super::metric_names(r, "allowed_metrics");
        let allowed_metric_patterns = super::metric_patterns(r, "allowed_metric_patterns");
        Rule {
            subject,
            pattern,
            action,
            label,
            display_mode,
            allowed_metrics,
            allowed_metric_patterns,
        }
    }

    /// Does this rule admit the metric (on top of the global filter)?
    pub fn admits(&self, suffix: &str) -> bool {
        (self.allowed_metrics.is_empty() && self.allowed_metric_patterns.is_empty())
            || self.allowed_metrics.iter().any(|m| m == suffix)
            || self
                .allowed_metric_patterns
                .iter()
                .any(|p| glob::matches(p, suffix))
    }
}
