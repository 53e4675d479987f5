//! The pre-sink policy (`pre_sink_policy`): subject rules, data only, that a message must
//! satisfy before any sink sees it, once its metadata, labels, mission metadata and whether
//! its payload will be encrypted are known. The first rule whose subject pattern matches
//! applies; a subject no rule matches is refused (`unmatched_subject: reject`, the default:
//! fail closed) or let through (`allow`). See `docs/governance.md`.
//!
//! Refusals name the rule's field and a reason code; never the message's value (a priority
//! outside the rule's list is "not in the rule's list", not the value).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::document::reader::ObjectReader;
use crate::message::envelope::Envelope;
use crate::message::refusal::{Problems, Refusal};
use crate::message::subject::{read_pattern, SubjectPattern, SubjectRule, SubjectRules};

pub const STAGE: &str = "pre_sink_policy";
/// Most rules.
pub const MAX_RULES: usize = crate::message::subject::MAX_RULES;

/// Every reason code of the stage.
pub const CODES: &[&str] = &[
    "unmatched_subject",
    "priority_not_allowed",
    "classification_not_allowed",
    "missing_required_label",
    "missing_mission_metadata",
    "payload_not_encrypted",
    "policy_payload_too_large",
    "mission_metadata_key_not_allowed",
];

/// One subject rule; every requirement optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    pub pattern: SubjectPattern,
    /// The priority must be one of these (as stored, after normalization).
    pub require_priority: Option<BTreeSet<String>>,
    /// The classification must be one of these.
    pub require_classification: Option<BTreeSet<String>>,
    /// Every one of these labels must be present.
    pub required_labels: Vec<String>,
    pub require_mission_metadata: bool,
    pub require_encrypted_payload: bool,
    pub max_payload_bytes: Option<u64>,
    /// The mission metadata's top-level keys must be among these.
    pub allowed_mission_metadata_keys: Option<BTreeSet<String>>,
}

impl SubjectRule for PolicyRule {
    fn pattern(&self) -> &SubjectPattern {
        &self.pattern
    }
}

/// The `pre_sink_policy` block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreSinkPolicyConfig {
    /// Defaults to false.
    pub enabled: bool,
    pub rules: SubjectRules<PolicyRule>,
    /// `unmatched_subject`: `reject` (false, the default) or `allow`.
    pub allow_unmatched: bool,
}

impl PreSinkPolicyConfig {
    pub fn read(r: Option<ObjectReader<'_>>) -> PreSinkPolicyConfig {
        let Some(mut r) = r else {
            return PreSinkPolicyConfig::default();
        };
        let enabled = r.bool_or("enabled", false);
        let allow_unmatched = r.one_of(
            "unmatched_subject",
            false,
            &[("reject", false), ("allow", true)],
        );
        let readers = r.objects_at_most("rules", MAX_RULES);
        if enabled && readers.is_empty() {
            r.problem(
                "rules",
                "must hold at least one rule when pre_sink_policy.enabled is true",
            );
        }
        let mut rules = Vec::new();
        for mut rr in readers {
            let pattern = read_pattern(&mut rr, "subject");
            let set = |rr: &mut ObjectReader<'_>, key: &'static str| {
                rr.has(key)
                    .then(|| rr.string_list(key).into_iter().collect::<BTreeSet<_>>())
            };
            let require_priority = set(&mut rr, "require_priority");
            let require_classification = set(&mut rr, "require_classification");
            let required_labels = rr.string_list("required_labels");
            let require_mission_metadata = rr.bool_or("require_mission_metadata", false);
            let require_encrypted_payload = rr.bool_or("require_encrypted_payload", false);
            let max_payload_bytes = rr
                .opt_int_in("max_payload_bytes", 1, 1 << 30)
                .map(|v| v as u64);
            let allowed_mission_metadata_keys = set(&mut rr, "allowed_mission_metadata_keys");
            for (key, s) in [
                ("require_priority", &require_priority),
                ("require_classification", &require_classification),
            ] {
                if s.as_ref().is_some_and(BTreeSet::is_empty) {
                    rr.problem(key, "must list at least one value (omit it for any)");
                }
            }
            let rule = PolicyRule {
                pattern: pattern
                    .clone()
                    .unwrap_or_else(|| SubjectPattern::parse(">").expect("a valid pattern")),
                require_priority,
                require_classification,
                required_labels,
                require_mission_metadata,
                require_encrypted_payload,
                max_payload_bytes,
                allowed_mission_metadata_keys,
            };
            let requires_nothing = rule.require_priority.is_none()
                && rule.require_classification.is_none()
                && rule.required_labels.is_empty()
                && !rule.require_mission_metadata
                && !rule.require_encrypted_payload
                && rule.max_payload_bytes.is_none()
                && rule.allowed_mission_metadata_keys.is_none();
            if requires_nothing {
                rr.problem(
                    "subject",
                    "the rule requires nothing: give at least one require_* or max_* field",
                );
            }
            rr.finish();
            // Kept even with an invalid pattern (the config is refused then anyway), so rule
            // indexes stay those of the document for the cross-checks.
            rules.push(rule);
        }
        r.finish();
        PreSinkPolicyConfig {
            enabled,
            rules: SubjectRules::new(rules),
            allow_unmatched,
        }
    }

    /// Refuses rules that no message could pass: mission metadata required while the stage
    /// is off, an encrypted payload required while encryption is off.
    pub fn cross_check(
        &self,
        mission_enabled: bool,
        encryption_enabled: bool,
        problems: &crate::document::reader::Problems,
    ) {
        if !self.enabled {
            return;
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.require_mission_metadata && !mission_enabled {
                problems.push(
                    format!("pre_sink_policy.rules[{i}].require_mission_metadata"),
                    "mission_metadata.enabled is false: every matching message would be refused",
                );
            }
            if rule.require_encrypted_payload && !encryption_enabled {
                problems.push(
                    format!("pre_sink_policy.rules[{i}].require_encrypted_payload"),
                    "payload_encryption.enabled is false: every matching message would be refused",
                );
            }
        }
    }

    /// The verdict for an envelope whose metadata, labels and mission metadata are set;
    /// `encrypted`: its payload will be encrypted at rest. Pure.
    pub fn check(&self, env: &Envelope, encrypted: bool) -> Result<(), Refusal> {
        if !self.enabled {
            return Ok(());
        }
        let Some((i, rule)) = self.rules.first_match(&env.subject) else {
            if self.allow_unmatched {
                return Ok(());
            }
            return Err(Refusal::one(
                STAGE,
                "pre_sink_policy.rules",
                "unmatched_subject",
                "no rule matches the subject (unmatched_subject: reject)",
            ));
        };
        let at = |field: &str| format!("pre_sink_policy.rules[{i}].{field}");
        let mut out = Problems::new(STAGE);
        if let Some(set) = &rule.require_priority {
            if !set.contains(&env.priority) {
                out.push(
                    at("require_priority"),
                    "priority_not_allowed",
                    "the priority is not in the rule's list",
                );
            }
        }
        if let Some(set) = &rule.require_classification {
            if !set.contains(&env.classification) {
                out.push(
                    at("require_classification"),
                    "classification_not_allowed",
                    "the classification is not in the rule's list",
                );
            }
        }
        for (j, label) in rule.required_labels.iter().enumerate() {
            if !env.labels_list.contains(label) {
                out.push(
                    format!("{}[{j}]", at("required_labels")),
                    "missing_required_label",
                    "a required label is missing",
                );
            }
        }
        if rule.require_mission_metadata && env.mission_metadata.is_none() {
            out.push(
                at("require_mission_metadata"),
                "missing_mission_metadata",
                "the record has no mission metadata",
            );
        }
        if rule.require_encrypted_payload && !encrypted {
            out.push(
                at("require_encrypted_payload"),
                "payload_not_encrypted",
                "the payload would be stored in clear (no payload_encryption rule applies)",
            );
        }
        if let Some(limit) = rule.max_payload_bytes {
            let size = env.payload_info.size_bytes;
            if size > limit {
                out.push_size(
                    at("max_payload_bytes"),
                    "policy_payload_too_large",
                    crate::message::refusal::Measured {
                        measured: size,
                        limit,
                    },
                );
            }
        }
        if let (Some(keys), Some(Value::Object(m))) =
            (&rule.allowed_mission_metadata_keys, &env.mission_metadata)
        {
            if m.keys().any(|k| !keys.contains(k)) {
                // The key is the publisher's: never named.
                out.push(
                    at("allowed_mission_metadata_keys"),
                    "mission_metadata_key_not_allowed",
                    "the mission metadata holds a key the rule does not list",
                );
            }
        }
        out.into_result(())
    }
}

#[cfg(test)]
mod tests;
