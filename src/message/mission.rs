//! Mission metadata (`mission_metadata`): one JSON object stored with each record, from a
//! message header or, when the header is absent, from the first matching subject rule or the
//! configured default (`docs/governance.md`).
//!
//! The header is read with the project's strict reader ([`parse_strict`]: one value, no
//! duplicate keys, no `NaN`/`Infinity`) and then bounded: no control character in any key, at
//! most `max_depth` levels, canonical size at most `max_bytes`. When `profiles` are configured
//! the object names one in `profile` (limited by `allowed_profiles`) and its fields are checked
//! against it ([`schema`]). The header replaces a rule or default object; nothing is merged.
//!
//! A refused object is a permanent pre-sink failure ([`Refusal`], stage `mission_metadata`):
//! its problems name configured field names, static reasons and sizes, never a value or a key
//! the message brought. The default and rule objects are checked at config load by the same
//! code, so a config that loads fails at run time only on what a header brings.

pub mod schema;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::document::reader::{join, ObjectReader};
use crate::message::envelope::RawMessage;
use crate::message::labels::parse_strict;
use crate::message::labels::LabelReason;
use crate::message::refusal::{Measured, Problems, Refusal};
use crate::message::subject::{read_pattern, SubjectPattern, SubjectRule, SubjectRules};
use schema::{Profile, PROFILE_KEY};

pub const STAGE: &str = "mission_metadata";
/// Every reason code of the stage.
pub const CODES: &[&str] = &[
    "duplicate_header",
    "header_too_large",
    "invalid_json",
    "duplicate_key",
    "not_object",
    "control_character",
    "nul_character",
    "too_deep",
    "too_large",
    "missing_profile",
    "wrong_type",
    "unknown_profile",
    "profile_not_allowed",
    "missing_field",
    "out_of_bounds",
    "unknown_field",
];
pub const DEFAULT_HEADER: &str = "Svc-Mission-Metadata";
pub const DEFAULT_MAX_BYTES: i64 = 8192;
pub const MAX_BYTES_LIMIT: i64 = 262_144;
pub const DEFAULT_MAX_DEPTH: i64 = 8;
/// The envelope's own JSON bound (`envelope.rs` `MAX_JSON_DEPTH`): MariaDB's `JSON_VALID`, the
/// `CHECK` of the MySQL engine's `mission_metadata_json` column, refuses 32 levels or more,
/// so an object the stage let through that deep could never be stored (atk53a finding 1).
pub const MAX_DEPTH_LIMIT: i64 = 31;
/// Most subject rules.
pub const MAX_RULES: usize = crate::message::subject::MAX_RULES;
/// A header longer than `max(64 KiB, 8 x max_bytes)` is refused before it is parsed:
/// room for whitespace and escapes around the largest canonical object.
pub const MIN_HEADER_LIMIT_BYTES: usize = 64 * 1024;

/// A subject rule: `metadata` `None` means "no mission metadata" for matching subjects.
#[derive(Debug, Clone, PartialEq)]
pub struct MissionRule {
    pub pattern: SubjectPattern,
    pub metadata: Option<Map<String, Value>>,
}

impl SubjectRule for MissionRule {
    fn pattern(&self) -> &SubjectPattern {
        &self.pattern
    }
}

/// The `mission_metadata` block.
#[derive(Debug, Clone, PartialEq)]
pub struct MissionMetadataConfig {
    /// Defaults to false.
    pub enabled: bool,
    /// Defaults to `Svc-Mission-Metadata`.
    pub header: String,
    /// Canonical size bound, 1 to 262144. Defaults to 8192.
    pub max_bytes: usize,
    /// Nesting bound (the object itself is level 1), 1 to 31. Defaults to 8.
    pub max_depth: usize,
    pub default: Option<Map<String, Value>>,
    pub rules: SubjectRules<MissionRule>,
    pub profiles: BTreeMap<String, Profile>,
    /// Empty: every configured profile may be named.
    pub allowed_profiles: BTreeSet<String>,
}

impl Default for MissionMetadataConfig {
    fn default() -> Self {
        MissionMetadataConfig {
            enabled: false,
            header: DEFAULT_HEADER.into(),
            max_bytes: DEFAULT_MAX_BYTES as usize,
            max_depth: DEFAULT_MAX_DEPTH as usize,
            default: None,
            rules: SubjectRules::default(),
            profiles: BTreeMap::new(),
            allowed_profiles: BTreeSet::new(),
        }
    }
}

impl MissionMetadataConfig {
    /// Reads the block (absent = disabled defaults); the default and rule objects are checked
    /// as a header would be, their problems under their config paths.
    pub fn read(r: Option<ObjectReader<'_>>) -> MissionMetadataConfig {
        let Some(mut r) = r else {
            return MissionMetadataConfig::default();
        };
        let enabled = r.bool_or("enabled", false);
        let header = r.header_name_or("header", DEFAULT_HEADER);
        let max_bytes = r.int_in("max_bytes", DEFAULT_MAX_BYTES, 1, MAX_BYTES_LIMIT) as usize;
        let max_depth = r.int_in("max_depth", DEFAULT_MAX_DEPTH, 1, MAX_DEPTH_LIMIT) as usize;
        let profiles = match r.raw("profiles") {
            Some(v) => schema::read_profiles(&r.path_of("profiles"), v, r.problems()),
            None => BTreeMap::new(),
        };
        let allowed = r.string_list("allowed_profiles");
        for (i, name) in allowed.iter().enumerate() {
            if !profiles.contains_key(name) {
                r.problems().push(
                    format!("{}[{i}]", r.path_of("allowed_profiles")),
                    "names no profile of mission_metadata.profiles",
                );
            }
        }
        let mut cfg = MissionMetadataConfig {
            enabled,
            header,
            max_bytes,
            max_depth,
            default: None,
            rules: SubjectRules::default(),
            profiles,
            allowed_profiles: allowed.into_iter().collect(),
        };
        if let Some(v) = r.raw("default") {
            cfg.default = cfg.config_object(&r.path_of("default"), v, &r);
        }
        let rule_readers = r.objects_at_most("rules", MAX_RULES);
        let mut rules = Vec::new();
        for mut rr in rule_readers {
            let pattern = read_pattern(&mut rr, "subject");
            let present = rr.keys().iter().any(|k| k.as_str() == "metadata");
            let metadata = match rr.raw("metadata") {
                Some(v) => cfg.config_object(&rr.path_of("metadata"), v, &rr),
                None if present => None,
                None => {
                    rr.problem(
                        "metadata",
                        "is required (an object, or null for no mission metadata)",
                    );
                    None
                }
            };
            rr.finish();
            if let Some(pattern) = pattern {
                rules.push(MissionRule { pattern, metadata });
            }
        }
        cfg.rules = SubjectRules::new(rules);
        r.finish();
        cfg
    }

    /// A configured object, checked like a header's; problems go under `path`.
    fn config_object(
        &self,
        path: &str,
        v: &Value,
        r: &ObjectReader<'_>,
    ) -> Option<Map<String, Value>> {
        match self.check(v.clone()) {
            Ok((m, _)) => Some(m),
            Err(refusal) => {
                for p in refusal.problems {
                    let rel = p.field.strip_prefix(STAGE).unwrap_or(&p.field);
                    let rel = rel.strip_prefix('.').unwrap_or(rel);
                    let at = if rel.is_empty() {
                        path.to_string()
                    } else {
                        join(path, rel)
                    };
                    r.problems().push(at, format!("{} ({})", p.text, p.code));
                }
                None
            }
        }
    }

    /// Longest header accepted before parsing.
    pub fn header_limit(&self) -> usize {
        MIN_HEADER_LIMIT_BYTES.max(self.max_bytes.saturating_mul(8))
    }

    /// The mission metadata of one message: `Ok(None)` when the stage is off or nothing
    /// applies. Pure.
    pub fn resolve(&self, msg: &RawMessage) -> Result<Option<Value>, Refusal> {
        Ok(self.resolve_measured(msg)?.map(|(v, _)| v))
    }

    /// As [`Self::resolve`], with the object's canonical size when it was measured here (a
    /// header's is; a rule's or the default's is not), so a later bound need not measure it
    /// again.
    pub fn resolve_measured(
        &self,
        msg: &RawMessage,
    ) -> Result<Option<(Value, Option<usize>)>, Refusal> {
        if !self.enabled {
            return Ok(None);
        }
        let mut values = msg.headers.iter().filter(|(k, _)| *k == self.header);
        let object = match values.next() {
            Some(_) if values.next().is_some() => {
                return Err(Refusal::one(
                    STAGE,
                    STAGE,
                    "duplicate_header",
                    "the header appears more than once",
                ))
            }
            Some((_, text)) => {
                let (map, size) = self.parse_measured(text)?;
                Some((map, Some(size)))
            }
            None => match self.rules.first_match(&msg.subject) {
                Some((_, rule)) => rule.metadata.clone().map(|m| (m, None)),
                None => self.default.clone().map(|m| (m, None)),
            },
        };
        // Invariant: serde_json's map is ordered by key (no `preserve_order` feature in the
        // tree), so every sink writes the object in canonical key order.
        Ok(object.map(|(m, size)| (Value::Object(m), size)))
    }

    /// Parses and checks a header value.
    pub fn parse_header(&self, text: &str) -> Result<Map<String, Value>, Refusal> {
        self.parse_measured(text).map(|(map, _)| map)
    }

    /// A header's object and its canonical size.
    fn parse_measured(&self, text: &str) -> Result<(Map<String, Value>, usize), Refusal> {
        let limit = self.header_limit();
        if text.len() > limit {
            return Err(Refusal::size(
                STAGE,
                STAGE,
                "header_too_large",
                "bytes of header",
                text.len() as u64,
                limit as u64,
            ));
        }
        let value = parse_strict(text).map_err(|reason| {
            let code = match reason {
                LabelReason::DuplicateKey => "duplicate_key",
                LabelReason::NestingTooDeep => "too_deep",
                _ => "invalid_json",
            };
            Refusal::one(STAGE, STAGE, code, reason.to_string())
        })?;
        self.check(value)
    }

    /// Structure, bounds and profile of one object (from a header or the config), with its
    /// canonical size.
    fn check(&self, v: Value) -> Result<(Map<String, Value>, usize), Refusal> {
        let mut out = Problems::new(STAGE);
        let Value::Object(map) = v else {
            out.push(STAGE, "not_object", "must be a JSON object");
            return out.into_result((Map::new(), 0));
        };
        let mut walk = Walk::default();
        walk.visit_map(&map, 1);
        if walk.control_key {
            out.push(
                STAGE,
                "control_character",
                "an object key holds a control character",
            );
        }
        if walk.nul_value {
            out.push(
                STAGE,
                "nul_character",
                "a string value holds U+0000, which no sink stores as text",
            );
        }
        if walk.depth > self.max_depth {
            out.push(
                STAGE,
                "too_deep",
                format!(
                    "nests {} levels, more than mission_metadata.max_depth ({})",
                    walk.depth, self.max_depth
                ),
            );
        }
        let size = canonical_len(&map);
        if size > self.max_bytes {
            out.push_size(
                STAGE,
                "too_large",
                Measured {
                    measured: size as u64,
                    limit: self.max_bytes as u64,
                },
            );
        }
        if !out.is_empty() {
            return out.into_result((map, size));
        }
        self.check_profile(&map, &mut out);
        out.into_result((map, size))
    }

    fn check_profile(&self, map: &Map<String, Value>, out: &mut Problems) {
        if self.profiles.is_empty() {
            return;
        }
        let at = join(STAGE, PROFILE_KEY);
        let name = match map.get(PROFILE_KEY) {
            None => {
                out.push(
                    at,
                    "missing_profile",
                    "is required: mission_metadata.profiles are configured",
                );
                return;
            }
            Some(Value::String(s)) => s,
            Some(_) => {
                out.push(at, "wrong_type", "must be a string");
                return;
            }
        };
        let Some(profile) = self.profiles.get(name) else {
            out.push(
                at,
                "unknown_profile",
                "names no profile of mission_metadata.profiles",
            );
            return;
        };
        if !self.allowed_profiles.is_empty() && !self.allowed_profiles.contains(name) {
            out.push(
                at,
                "profile_not_allowed",
                "is not in mission_metadata.allowed_profiles",
            );
            return;
        }
        profile.check(map, STAGE, out);
    }
}

/// Length in bytes of the canonical JSON of an object.
pub fn canonical_len(map: &Map<String, Value>) -> usize {
    let mut out = Vec::new();
    crate::document::canonical::write_map(&mut out, map);
    out.len()
}

/// What a walk over an object finds: its depth, whether a key holds a control character, and
/// whether a string value holds U+0000 (PostgreSQL's `jsonb` and text refuse it for good:
/// atk53a finding 2; a kept header is refused for the same reason).
#[derive(Default)]
struct Walk {
    depth: usize,
    control_key: bool,
    nul_value: bool,
}

impl Walk {
    fn visit_map(&mut self, map: &Map<String, Value>, depth: usize) {
        self.depth = self.depth.max(depth);
        for (k, v) in map {
            if k.chars().any(char::is_control) {
                self.control_key = true;
            }
            self.visit(v, depth + 1);
        }
    }

    fn visit(&mut self, v: &Value, depth: usize) {
        match v {
            Value::Object(m) => self.visit_map(m, depth),
            Value::Array(items) => {
                self.depth = self.depth.max(depth);
                for item in items {
                    self.visit(item, depth + 1);
                }
            }
            Value::String(text) => self.nul_value |= text.contains('\0'),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
