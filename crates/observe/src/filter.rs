//! The one metric filter every connector calls first (spec "Text exposition rendering rules",
//! rule 5): allow names and globs, deny wins, observations only with `include_observations`,
//! legacy aliases only with `include_legacy`. Empty allow lists admit nothing.
//!
//! The connector switches (top-level `enabled` plus the connector's own) are checked by each
//! connector before it calls `select` (`observe/select.rs`), because they differ per
//! connector (the HTTP endpoint does not need `scrape.enabled`).

use crate::catalogue::{self, Kind};
use crate::glob;
use crate::policy::Policy;

/// Why a suffix is or is not exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// No allowed name or pattern matches (the default: share nothing).
    NotAllowed,
    /// A denied name or pattern matches (deny wins).
    Denied,
    /// A timing observation while `include_observations` is false.
    Observation,
    /// A legacy alias while `include_legacy` is false.
    Legacy,
}

/// The policy's metric filter.
#[derive(Debug, Clone, Copy)]
pub struct Filter<'p> {
    policy: &'p Policy,
}

impl<'p> Filter<'p> {
    pub fn new(policy: &'p Policy) -> Self {
        Filter { policy }
    }

    /// Is the suffix named by an allow rule?
    pub fn is_allowed(&self, suffix: &str) -> bool {
        self.policy.allowed_metrics.iter().any(|m| m == suffix)
            || self
                .policy
                .allowed_metric_patterns
                .iter()
                .any(|p| glob::matches(p, suffix))
    }

    /// Is the suffix named by a deny rule?
    pub fn is_denied(&self, suffix: &str) -> bool {
        self.policy.denied_metrics.iter().any(|m| m == suffix)
            || self
                .policy
                .denied_metric_patterns
                .iter()
                .any(|p| glob::matches(p, suffix))
    }

    /// The verdict for one metric of the given kind.
    pub fn verdict(&self, suffix: &str, kind: Kind) -> Verdict {
        if self.is_denied(suffix) {
            Verdict::Denied
        } else if !self.is_allowed(suffix) {
            Verdict::NotAllowed
        } else if catalogue::is_observation(suffix, kind) && !self.policy.include_observations {
            Verdict::Observation
        } else if catalogue::alias(suffix).is_some() && !self.policy.include_legacy {
            Verdict::Legacy
        } else {
            Verdict::Allowed
        }
    }

    pub fn allows(&self, suffix: &str, kind: Kind) -> bool {
        self.verdict(suffix, kind) == Verdict::Allowed
    }

    /// A legacy alias is exported only when the alias passes the filter and its target is
    /// not denied (deny wins through aliases too).
    pub fn allows_alias(&self, alias: &catalogue::LegacyAlias, kind: Kind) -> bool {
        self.allows(alias.alias, kind) && !self.is_denied(alias.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(extra: &str) -> Policy {
        Policy::parse(&format!(
            r#"{{"schema": "svc.observability.policy.v1", "enabled": true {extra}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn empty_allow_lists_admit_nothing() {
        let p = policy("");
        let f = Filter::new(&p);
        assert_eq!(
            f.verdict("messages_acked_total", Kind::Counter),
            Verdict::NotAllowed
        );
    }

    #[test]
    fn names_globs_and_deny_wins() {
        let p = policy(
            r#", "allowed_metrics": ["sink_write_errors_total"],
                "allowed_metric_patterns": ["messages_*"],
                "denied_metrics": ["messages_dlq_total"],
                "denied_metric_patterns": ["*_nacked_*", "sink_write_errors_total"]"#,
        );
        let f = Filter::new(&p);
        assert!(f.allows("messages_acked_total", Kind::Counter));
        assert_eq!(
            f.verdict("messages_dlq_total", Kind::Counter),
            Verdict::Denied
        );
        assert_eq!(
            f.verdict("messages_nacked_total", Kind::Counter),
            Verdict::Denied
        );
        assert_eq!(
            f.verdict("sink_write_errors_total", Kind::Counter),
            Verdict::Denied
        );
        assert_eq!(
            f.verdict("db_duplicates_total", Kind::Counter),
            Verdict::NotAllowed
        );
    }

    #[test]
    fn observations_and_legacy_need_their_switches() {
        let p = policy(r#", "allowed_metric_patterns": ["*"]"#);
        let f = Filter::new(&p);
        assert_eq!(
            f.verdict("sink_batch_write_seconds", Kind::Summary),
            Verdict::Observation
        );
        assert_eq!(
            f.verdict("messages_processed_total", Kind::Counter),
            Verdict::Legacy
        );
        let p = policy(
            r#", "allowed_metric_patterns": ["*"], "include_observations": true, "include_legacy": true,
                "denied_metrics": ["messages_acked_total"]"#,
        );
        let f = Filter::new(&p);
        assert!(f.allows("sink_batch_write_seconds", Kind::Summary));
        assert!(f.allows("messages_processed_total", Kind::Counter));
        let alias = catalogue::alias("messages_processed_total").unwrap();
        assert!(!f.allows_alias(alias, Kind::Counter), "target denied");
        let alias = catalogue::alias("messages_received_total").unwrap();
        assert!(f.allows_alias(alias, Kind::Counter));
    }
}
