//! The security label profile (`svc.security-label.v1`): an optional, structured JSON metadata
//! object carried next to each message. It is metadata only and grants no access to anything.
//!
//! Where a message's profile comes from (runtime config block `security_labels`, see
//! `docs/labels.md`):
//!
//! 1. the message header (`header`, default `Svc-Security-Labels`), parsed and validated;
//! 2. when the header is absent: the first subject rule whose pattern matches (a rule with a
//!    `null` profile means "no profile" and hides the global default);
//! 3. otherwise the global `default` (which may itself be absent: no profile).
//!
//! Validation is strict and never coerces: the header must be one JSON object without duplicate
//! keys; only the allow-listed root fields are accepted, each with exactly the type of the
//! spec's table; `profile` must be `svc.security-label.v1` (filled in when missing); values are
//! checked against the configured vocabularies (an empty vocabulary is unrestricted), which
//! are the authority on spelling: a value matches an entry ASCII case-insensitively and is
//! stored in the entry's form (`secret` with vocabulary `SECRET` is stored `SECRET`), here and
//! in the envelope's own `priority` and `classification`
//! ([`SecurityLabelsConfig::spell_metadata`]);
//! `extensions` is bounded ([`MAX_EXTENSION_DEPTH`], [`MAX_EXTENSION_KEYS`],
//! [`MAX_EXTENSION_KEY_BYTES`]) and secret-looking key names are rejected; the canonical JSON
//! (keys sorted by their UTF-8 bytes at every level, no whitespace) must fit in `max_bytes`.
//! `priority`, `classification` and `labels` are filled from the message metadata when the
//! profile omits them (an explicit `null` priority or classification stays null).
//!
//! A rejected profile is a permanent pre-sink failure (the message goes to the DLQ). Every
//! error names a field (or the header as a whole) and a reason; by construction it never
//! contains a value or a key name taken from the message: [`LabelError`] holds only static text,
//! allow-listed field names, array indexes and sizes.
//!
//! The default and rule profiles are validated at config load by the same code, so a config
//! that loads can only fail at run time on what the message itself brings (its header, or the
//! filled-in metadata against a vocabulary or the size limit).
//!
//! Files: this one holds the per-message checks; `config.rs` reads the block and
//! cross-checks it with the message metadata block; `rejection.rs` the value-free errors;
//! `strict_json.rs` the strict parser and the canonical form.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::document::grammar::looks_secret;
use crate::message::envelope::{Envelope, RawMessage};
use crate::message::metadata::MessageMetadata;
use crate::message::subject::{SubjectPattern, SubjectRule, SubjectRules};

/// The only profile version this runner accepts.
pub const PROFILE_SCHEMA: &str = "svc.security-label.v1";
pub const DEFAULT_HEADER: &str = "Svc-Security-Labels";
pub const DEFAULT_MAX_BYTES: i64 = 8192;
pub const MAX_BYTES_LIMIT: i64 = 262_144;
/// Nesting levels allowed under `extensions`, the `extensions` object itself being level 1.
pub const MAX_EXTENSION_DEPTH: usize = 4;
/// Object keys allowed under `extensions`, counted at every level.
pub const MAX_EXTENSION_KEYS: usize = 64;
/// Longest key under `extensions`, in bytes.
pub const MAX_EXTENSION_KEY_BYTES: usize = 64;
/// A header longer than this is refused before it is parsed: `max(1 MiB, 8 x max_bytes)`
/// leaves room for whitespace and escapes around the largest canonical profile.
pub const MIN_HEADER_LIMIT_BYTES: usize = 1 << 20;
/// Most errors reported for one profile (the first ones found).
pub const MAX_ERRORS: usize = 16;
/// Most subject rules.
pub const MAX_RULES: usize = crate::message::subject::MAX_RULES;

/// The JSON type a root field must have (the spec's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `profile`: a string (not null).
    Str,
    StrOrNull,
    /// An array of strings (not null).
    StrArray,
    /// `extensions`: an object (not null).
    Object,
}

/// The allow-listed root fields, in the spec's order.
pub const ROOT_FIELDS: &[&str] = &[
    "profile",
    "priority",
    "classification",
    "labels",
    "releasability",
    "handling_caveats",
    "owner",
    "originator",
    "policy_id",
    "retention_category",
    "extensions",
];

fn kind_of(field: &str) -> Option<Kind> {
    Some(match field {
        "profile" => Kind::Str,
        "priority" | "classification" | "owner" | "originator" | "policy_id"
        | "retention_category" => Kind::StrOrNull,
        "labels" | "releasability" | "handling_caveats" => Kind::StrArray,
        "extensions" => Kind::Object,
        _ => return None,
    })
}

mod config;
mod rejection;
mod strict_json;

use rejection::Errors;
pub use rejection::{LabelError, LabelReason, LabelRejection};
use strict_json::canonical_len;
pub use strict_json::{canonical_json, parse_strict};

/// A profile whose structure is valid, with `profile` set; `priority`, `classification` and
/// `labels` may still be missing (filled per message).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile(Map<String, Value>);

impl Profile {
    pub fn fields(&self) -> &Map<String, Value> {
        &self.0
    }
}

/// A subject rule: `profile` `None` means the rule clears the global default.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelRule {
    pub pattern: SubjectPattern,
    pub profile: Option<Profile>,
}

impl SubjectRule for LabelRule {
    fn pattern(&self) -> &SubjectPattern {
        &self.pattern
    }
}

/// The `security_labels` block.
#[derive(Debug, Clone, PartialEq)]
pub struct SecurityLabelsConfig {
    /// Defaults to false.
    pub enabled: bool,
    /// Defaults to `Svc-Security-Labels`.
    pub header: String,
    /// Defaults to none.
    pub default: Option<Profile>,
    pub rules: SubjectRules<LabelRule>,
    /// 1 to 262144. Defaults to 8192.
    pub max_bytes: usize,
    pub allowed_priorities: BTreeSet<String>,
    pub allowed_classifications: BTreeSet<String>,
    pub allowed_releasability: BTreeSet<String>,
    pub allowed_handling_caveats: BTreeSet<String>,
    pub allowed_retention_categories: BTreeSet<String>,
}

impl Default for SecurityLabelsConfig {
    fn default() -> Self {
        SecurityLabelsConfig {
            enabled: false,
            header: DEFAULT_HEADER.into(),
            default: None,
            rules: SubjectRules::default(),
            max_bytes: DEFAULT_MAX_BYTES as usize,
            allowed_priorities: BTreeSet::new(),
            allowed_classifications: BTreeSet::new(),
            allowed_releasability: BTreeSet::new(),
            allowed_handling_caveats: BTreeSet::new(),
            allowed_retention_categories: BTreeSet::new(),
        }
    }
}

impl SecurityLabelsConfig {
    /// Writes the metadata's `priority` and `classification` in their vocabularies' forms
    /// when those list them (ASCII case aside), so the envelope, every sink and the DLQ
    /// record carry one spelling. Values no vocabulary lists are left as they are.
    pub fn spell_metadata(&self, meta: &mut MessageMetadata) {
        if !self.enabled {
            return;
        }
        for (field, value) in [
            ("priority", &mut meta.priority),
            ("classification", &mut meta.classification),
        ] {
            if let Some(form) = self
                .vocabulary(field)
                .and_then(|(set, _)| spelled(set, value))
            {
                if form != value.as_str() {
                    *value = form.to_string();
                }
            }
        }
    }

    /// Longest header accepted before parsing.
    pub fn header_limit(&self) -> usize {
        MIN_HEADER_LIMIT_BYTES.max(self.max_bytes.saturating_mul(8))
    }

    /// The normalized profile of one message: `Ok(None)` when labels are disabled or no
    /// profile applies. Pure.
    pub fn resolve(
        &self,
        msg: &RawMessage,
        meta: &MessageMetadata,
    ) -> Result<Option<Value>, LabelRejection> {
        if !self.enabled {
            return Ok(None);
        }
        let mut values = msg.headers.iter().filter(|(k, _)| *k == self.header);
        let base = match values.next() {
            Some(_) if values.next().is_some() => {
                let mut e = Errors::default();
                e.push("", LabelReason::DuplicateHeader);
                return e.into_result(None);
            }
            Some((_, text)) => Some(self.parse_header(text)?),
            None => match self.rules.first_match(&msg.subject) {
                Some((_, rule)) => rule.profile.clone(),
                None => self.default.clone(),
            },
        };
        let Some(Profile(mut map)) = base else {
            return Ok(None);
        };
        fill_from_metadata(&mut map, meta);
        let mut errors = Errors::default();
        self.spell_vocabularies(&mut map, &mut errors);
        self.check_size(&map, &mut errors);
        errors.into_result(())?;
        // Invariant: serde_json's map is ordered by key (no `preserve_order` feature in the
        // tree; a test guards it), so sinks serialize the canonical form.
        Ok(Some(Value::Object(map)))
    }

    /// Parses and structurally validates a header value (no fill, no vocabulary check).
    pub fn parse_header(&self, text: &str) -> Result<Profile, LabelRejection> {
        let mut errors = Errors::default();
        let limit = self.header_limit();
        if text.len() > limit {
            errors.push("", LabelReason::HeaderTooLarge { max: limit });
            return errors.into_result(Profile(Map::new()));
        }
        let value = parse_strict(text).map_err(|reason| LabelRejection {
            errors: vec![LabelError {
                field: String::new(),
                reason,
            }],
        })?;
        self.check_structure(value)
    }

    /// Root allow-list, exact types, non-empty control-free strings, `profile` value, and the
    /// bounds of `extensions`. Fills `profile` when missing.
    fn check_structure(&self, v: Value) -> Result<Profile, LabelRejection> {
        let mut errors = Errors::default();
        let Value::Object(mut map) = v else {
            errors.push("", LabelReason::NotObject);
            return errors.into_result(Profile(Map::new()));
        };
        for (key, value) in &map {
            let Some(kind) = kind_of(key) else {
                errors.push("", LabelReason::UnknownField);
                continue;
            };
            match (kind, value) {
                (Kind::Str, Value::String(s)) => {
                    if s != PROFILE_SCHEMA {
                        errors.push(key.as_str(), LabelReason::WrongProfile);
                    }
                }
                (Kind::Str, _) => errors.push(
                    key.as_str(),
                    LabelReason::WrongType {
                        expected: "a string",
                    },
                ),
                (Kind::StrOrNull, Value::Null) => {}
                (Kind::StrOrNull, Value::String(s)) => check_text(s, key, &mut errors),
                (Kind::StrOrNull, _) => errors.push(
                    key.as_str(),
                    LabelReason::WrongType {
                        expected: "a string or null",
                    },
                ),
                (Kind::StrArray, Value::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        match item {
                            Value::String(s) => check_text(s, &format!("{key}[{i}]"), &mut errors),
                            _ => errors.push(
                                format!("{key}[{i}]"),
                                LabelReason::WrongType {
                                    expected: "a string",
                                },
                            ),
                        }
                    }
                }
                (Kind::StrArray, _) => errors.push(
                    key.as_str(),
                    LabelReason::WrongType {
                        expected: "an array of strings",
                    },
                ),
                (Kind::Object, Value::Object(_)) => {
                    let mut keys = 0;
                    check_extension(value, 1, &mut keys, &mut errors);
                }
                (Kind::Object, _) => errors.push(
                    key.as_str(),
                    LabelReason::WrongType {
                        expected: "an object",
                    },
                ),
            }
        }
        map.entry("profile")
            .or_insert_with(|| Value::String(PROFILE_SCHEMA.into()));
        errors.into_result(Profile(map))
    }

    fn vocabulary(&self, field: &str) -> Option<(&BTreeSet<String>, &'static str)> {
        let (set, option) = match field {
            "priority" => (&self.allowed_priorities, "allowed_priorities"),
            "classification" => (&self.allowed_classifications, "allowed_classifications"),
            "releasability" => (&self.allowed_releasability, "allowed_releasability"),
            "handling_caveats" => (&self.allowed_handling_caveats, "allowed_handling_caveats"),
            "retention_category" => (
                &self.allowed_retention_categories,
                "allowed_retention_categories",
            ),
            _ => return None,
        };
        (!set.is_empty()).then_some((set, option))
    }

    /// Every vocabulary-controlled value must be listed, ASCII case aside, and takes the
    /// vocabulary's form (null is always allowed: no value).
    fn spell_vocabularies(&self, map: &mut Map<String, Value>, errors: &mut Errors) {
        for (key, value) in map.iter_mut() {
            let Some((set, option)) = self.vocabulary(key) else {
                continue;
            };
            let mut spell = |s: &mut String, field: String| match spelled(set, s) {
                Some(form) if form != s.as_str() => *s = form.to_string(),
                Some(_) => {}
                None => errors.push(field, LabelReason::NotInVocabulary { option }),
            };
            match value {
                Value::String(s) => spell(s, key.clone()),
                Value::Array(items) => {
                    for (i, item) in items.iter_mut().enumerate() {
                        if let Value::String(s) = item {
                            spell(s, format!("{key}[{i}]"));
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Canonical JSON of the profile; its size must be at most `max_bytes`.
    fn check_size(&self, map: &Map<String, Value>, errors: &mut Errors) {
        let size = canonical_len(map);
        if size > self.max_bytes {
            errors.push(
                "",
                LabelReason::TooLarge {
                    size,
                    max: self.max_bytes,
                },
            );
        }
    }
}

/// The vocabulary's own form of `value`: the entry equal to it, else the one equal but for
/// ASCII case (entries differing only by case are refused at config load).
fn spelled<'s>(set: &'s BTreeSet<String>, value: &str) -> Option<&'s str> {
    set.get(value)
        .or_else(|| set.iter().find(|e| e.eq_ignore_ascii_case(value)))
        .map(String::as_str)
}

/// Sets the resolved profile on the envelope: top level and `metadata.security_labels`.
pub fn apply_to(env: &mut Envelope, profile: Option<Value>) {
    env.metadata.security_labels = profile.clone();
    env.security_labels = profile;
}

/// `priority`, `classification` and `labels` from the message metadata when omitted.
fn fill_from_metadata(map: &mut Map<String, Value>, meta: &MessageMetadata) {
    map.entry("priority")
        .or_insert_with(|| Value::String(meta.priority.clone()));
    map.entry("classification")
        .or_insert_with(|| Value::String(meta.classification.clone()));
    map.entry("labels")
        .or_insert_with(|| Value::Array(meta.labels.iter().cloned().map(Value::String).collect()));
}

/// A root string value or array item: non-empty, no control characters.
fn check_text(s: &str, field: &str, errors: &mut Errors) {
    if s.is_empty() {
        errors.push(field, LabelReason::EmptyValue);
    } else if s.chars().any(char::is_control) {
        errors.push(field, LabelReason::ControlCharacter);
    }
}

/// Bounds of `extensions`: depth, total key count, key grammar, secret-looking key names.
/// Errors are reported on the field `extensions` without naming the key.
fn check_extension(v: &Value, depth: usize, keys: &mut usize, errors: &mut Errors) {
    match v {
        Value::Object(m) => {
            if depth > MAX_EXTENSION_DEPTH {
                errors.push("extensions", LabelReason::ExtensionsTooDeep);
                return;
            }
            for (k, child) in m {
                *keys += 1;
                if *keys == MAX_EXTENSION_KEYS + 1 {
                    errors.push("extensions", LabelReason::TooManyExtensionKeys);
                }
                if !is_extension_key(k) {
                    errors.push("extensions", LabelReason::InvalidExtensionKey);
                } else if looks_secret(k) {
                    errors.push("extensions", LabelReason::SecretExtensionKey);
                }
                check_extension(child, depth + 1, keys, errors);
            }
        }
        Value::Array(items) => {
            if depth > MAX_EXTENSION_DEPTH {
                errors.push("extensions", LabelReason::ExtensionsTooDeep);
                return;
            }
            for item in items {
                check_extension(item, depth + 1, keys, errors);
            }
        }
        // PostgreSQL refuses U+0000 in `jsonb` and text for good (atk53a finding 2).
        Value::String(text) if text.contains('\0') => {
            errors.push("extensions", LabelReason::NulCharacter);
        }
        _ => {}
    }
}

fn is_extension_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= MAX_EXTENSION_KEY_BYTES
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
}

#[cfg(test)]
mod tests;
