//! Reading the `security_labels` block: its fields, the default and rule profiles (checked
//! by the message-time code, each problem with its full path), and the cross-check against
//! the message metadata block.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{
    spelled, Errors, LabelRule, Profile, SecurityLabelsConfig, DEFAULT_HEADER, DEFAULT_MAX_BYTES,
    MAX_BYTES_LIMIT, MAX_RULES,
};
use crate::document::grammar::is_header_name;
use crate::document::reader::{join, ObjectReader, Problems};
use crate::message::metadata::MessageMetadataConfig;
use crate::message::subject::{read_pattern, SubjectRules};

impl SecurityLabelsConfig {
    /// Reads the `security_labels` block (absent = disabled defaults). The default and rule
    /// profiles are validated with the message-time checks; their problems carry full paths
    /// (`security_labels.rules[1].profile.classification: ...`).
    pub fn read(r: Option<ObjectReader<'_>>) -> SecurityLabelsConfig {
        let d = SecurityLabelsConfig::default();
        let Some(mut r) = r else {
            return d;
        };
        let enabled = r.bool_or("enabled", false);
        let header = r.string_or("header", DEFAULT_HEADER);
        if !is_header_name(&header) {
            r.problem(
                "header",
                "must be a non-empty header name without spaces or control characters",
            );
        }
        let max_bytes = r.int_in("max_bytes", DEFAULT_MAX_BYTES, 1, MAX_BYTES_LIMIT) as usize;
        let vocab = |r: &mut ObjectReader<'_>, key: &'static str| -> BTreeSet<String> {
            let list = r.string_list(key);
            for (i, v) in list.iter().enumerate() {
                if v.is_empty() || v.chars().any(char::is_control) {
                    r.problems().push(
                        format!("{}[{i}]", r.path_of(key)),
                        "must be a non-empty string without control characters",
                    );
                }
            }
            list.into_iter().collect()
        };
        let mut cfg = SecurityLabelsConfig {
            enabled,
            header,
            default: None,
            rules: SubjectRules::default(),
            max_bytes,
            allowed_priorities: vocab(&mut r, "allowed_priorities"),
            allowed_classifications: vocab(&mut r, "allowed_classifications"),
            allowed_releasability: vocab(&mut r, "allowed_releasability"),
            allowed_handling_caveats: vocab(&mut r, "allowed_handling_caveats"),
            allowed_retention_categories: vocab(&mut r, "allowed_retention_categories"),
        };
        if let Some(v) = r.raw("default") {
            cfg.default = cfg.config_profile(&r, &r.path_of("default"), v);
        }
        let rule_readers = r.objects_at_most("rules", MAX_RULES);
        let mut rules = Vec::new();
        for mut rr in rule_readers {
            let pattern = read_pattern(&mut rr, "subject");
            let present = rr.keys().iter().any(|k| k.as_str() == "profile");
            let profile = match rr.raw("profile") {
                Some(v) => cfg.config_profile(&rr, &rr.path_of("profile"), v),
                None if present => None,
                None => {
                    rr.problem(
                        "profile",
                        "is required (an object, or null to clear the default)",
                    );
                    None
                }
            };
            rr.finish();
            if let Some(pattern) = pattern {
                rules.push(LabelRule { pattern, profile });
            }
        }
        cfg.rules = SubjectRules::new(rules);
        r.finish();
        cfg
    }

    /// Validates a configured profile; problems are recorded under `path`.
    fn config_profile(&self, r: &ObjectReader<'_>, path: &str, v: &Value) -> Option<Profile> {
        let checked = self.check_structure(v.clone()).and_then(|mut p| {
            let mut errors = Errors::default();
            self.spell_vocabularies(&mut p.0, &mut errors);
            self.check_size(&p.0, &mut errors);
            errors.into_result(p)
        });
        match checked {
            Ok(p) => Some(p),
            Err(rej) => {
                for e in rej.errors {
                    let at = if e.field.is_empty() {
                        path.to_string()
                    } else {
                        join(path, &e.field)
                    };
                    r.problems().push(at, e.reason.to_string());
                }
                None
            }
        }
    }

    /// Checks against the `message_metadata` block that only the two together can show: a
    /// profile that omits `priority` or `classification` is filled from the message
    /// metadata (its default, or a matching metadata rule), so each of those values must be
    /// in the vocabulary (in any case), or every message that gets it fails at run time. Also
    /// refuses vocabulary entries that differ from another only by case: values compare
    /// case-insensitively, so which of the two a value would be stored as is ambiguous.
    pub fn cross_check(&self, meta: &MessageMetadataConfig, problems: &Problems) {
        if !self.enabled {
            return;
        }
        for (field, option, default) in [
            ("priority", "allowed_priorities", &meta.default_priority),
            (
                "classification",
                "allowed_classifications",
                &meta.default_classification,
            ),
        ] {
            let Some((set, _)) = self.vocabulary(field) else {
                continue;
            };
            let mut filled = vec![(format!("message_metadata.default_{field}"), default)];
            for (i, rule) in meta.rules.iter().enumerate() {
                let value = match field {
                    "priority" => rule.priority.as_ref(),
                    _ => rule.classification.as_ref(),
                };
                if let Some(v) = value {
                    filled.push((format!("message_metadata.rules[{i}].{field}"), v));
                }
            }
            for (path, value) in filled {
                if spelled(set, value).is_none() {
                    problems.push(
                        path,
                        format!(
                            "\"{value}\" is not in security_labels.{option}: a label profile that \
                             omits {field} gets this value and is refused at run time"
                        ),
                    );
                }
            }
        }
        for field in [
            "priority",
            "classification",
            "releasability",
            "handling_caveats",
            "retention_category",
        ] {
            let Some((set, option)) = self.vocabulary(field) else {
                continue;
            };
            let entries: Vec<&String> = set.iter().collect();
            for (i, a) in entries.iter().enumerate() {
                if let Some(b) = entries[..i].iter().find(|b| b.eq_ignore_ascii_case(a)) {
                    problems.push(
                        format!("security_labels.{option}"),
                        format!(
                            "\"{a}\" and \"{b}\" differ only by case: values compare ASCII \
                             case-insensitively and are stored in the vocabulary's form; list \
                             one form"
                        ),
                    );
                }
            }
        }
    }
}
