//! Why a security label profile was refused: reasons with static texts, the per-field error,
//! and the rejection that carries every error found (at most [`super::MAX_ERRORS`]). Nothing
//! here can hold a value or a key name taken from the message.

use std::fmt;

use super::{
    MAX_ERRORS, MAX_EXTENSION_DEPTH, MAX_EXTENSION_KEYS, MAX_EXTENSION_KEY_BYTES, PROFILE_SCHEMA,
    ROOT_FIELDS,
};

/// Why a profile was refused. Display texts are static: they never include message content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelReason {
    /// The header occurs more than once.
    DuplicateHeader,
    /// The header is longer than the pre-parse limit.
    HeaderTooLarge {
        max: usize,
    },
    /// Not valid JSON; the position helps find it without quoting it.
    InvalidJson {
        line: usize,
        column: usize,
    },
    /// Nested deeper than the JSON parser allows.
    NestingTooDeep,
    /// An object holds the same key twice (ambiguous).
    DuplicateKey,
    /// The profile (root) is not a JSON object.
    NotObject,
    /// A root field outside the allow-list (its name is not repeated).
    UnknownField,
    /// The field has another JSON type than the spec's table gives.
    WrongType {
        expected: &'static str,
    },
    /// An empty string.
    EmptyValue,
    /// A string with a control character.
    ControlCharacter,
    /// `profile` is not `svc.security-label.v1`.
    WrongProfile,
    /// Not in the named vocabulary option.
    NotInVocabulary {
        option: &'static str,
    },
    /// Canonical JSON larger than `max_bytes`.
    TooLarge {
        size: usize,
        max: usize,
    },
    ExtensionsTooDeep,
    TooManyExtensionKeys,
    /// An extension key that is empty, too long, or outside `A-Z a-z 0-9 _ - . :`.
    InvalidExtensionKey,
    /// An extension key name that looks like it carries a secret.
    SecretExtensionKey,
    /// A string holding U+0000, which no sink stores as text (PostgreSQL refuses it).
    NulCharacter,
}

impl LabelReason {
    /// Stable machine-readable code (DLQ payload, logs).
    pub fn code(&self) -> &'static str {
        match self {
            LabelReason::DuplicateHeader => "duplicate_header",
            LabelReason::HeaderTooLarge { .. } => "header_too_large",
            LabelReason::InvalidJson { .. } => "invalid_json",
            LabelReason::NestingTooDeep => "nesting_too_deep",
            LabelReason::DuplicateKey => "duplicate_key",
            LabelReason::NotObject => "not_object",
            LabelReason::UnknownField => "unknown_field",
            LabelReason::WrongType { .. } => "wrong_type",
            LabelReason::EmptyValue => "empty_value",
            LabelReason::ControlCharacter => "control_character",
            LabelReason::WrongProfile => "wrong_profile",
            LabelReason::NotInVocabulary { .. } => "not_in_vocabulary",
            LabelReason::TooLarge { .. } => "too_large",
            LabelReason::ExtensionsTooDeep => "extensions_too_deep",
            LabelReason::TooManyExtensionKeys => "too_many_extension_keys",
            LabelReason::InvalidExtensionKey => "invalid_extension_key",
            LabelReason::SecretExtensionKey => "secret_extension_key",
            LabelReason::NulCharacter => "nul_character",
        }
    }
}

impl fmt::Display for LabelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelReason::DuplicateHeader => f.write_str("header appears more than once"),
            LabelReason::HeaderTooLarge { max } => {
                write!(f, "header is larger than {max} bytes")
            }
            LabelReason::InvalidJson { line, column } => {
                write!(f, "is not valid JSON (line {line} column {column})")
            }
            LabelReason::NestingTooDeep => f.write_str("is nested too deeply"),
            LabelReason::DuplicateKey => f.write_str("contains a duplicate object key"),
            LabelReason::NotObject => f.write_str("must be a JSON object"),
            LabelReason::UnknownField => write!(
                f,
                "unknown root field (allowed: {})",
                ROOT_FIELDS.join(", ")
            ),
            LabelReason::WrongType { expected } => write!(f, "must be {expected}"),
            LabelReason::EmptyValue => f.write_str("must not be empty"),
            LabelReason::ControlCharacter => f.write_str("must not contain control characters"),
            LabelReason::WrongProfile => write!(f, "must be {PROFILE_SCHEMA}"),
            LabelReason::NotInVocabulary { option } => {
                write!(f, "value is not in security_labels.{option}")
            }
            LabelReason::TooLarge { size, max } => write!(
                f,
                "canonical size {size} bytes exceeds security_labels.max_bytes ({max})"
            ),
            LabelReason::ExtensionsTooDeep => {
                write!(f, "must not nest deeper than {MAX_EXTENSION_DEPTH} levels")
            }
            LabelReason::TooManyExtensionKeys => {
                write!(f, "must not hold more than {MAX_EXTENSION_KEYS} keys")
            }
            LabelReason::InvalidExtensionKey => write!(
                f,
                "keys must be 1 to {MAX_EXTENSION_KEY_BYTES} characters of A-Z a-z 0-9 _ - . :"
            ),
            LabelReason::SecretExtensionKey => {
                f.write_str("contains a secret-looking key name (not allowed)")
            }
            LabelReason::NulCharacter => {
                f.write_str("must not contain U+0000 (no sink stores it as text)")
            }
        }
    }
}

/// One problem of a profile: a field path relative to the profile (`""` = the header or the
/// whole profile, `releasability[2]`, `extensions`) and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelError {
    /// Built only from [`ROOT_FIELDS`] names and indexes, never from message content.
    pub field: String,
    pub reason: LabelReason,
}

impl fmt::Display for LabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "security_labels: {}", self.reason)
        } else {
            write!(f, "security_labels.{}: {}", self.field, self.reason)
        }
    }
}

/// A refused profile: every problem found (at most [`MAX_ERRORS`]), never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRejection {
    pub errors: Vec<LabelError>,
}

impl LabelRejection {
    /// The first problem (the one named in one-line summaries).
    pub fn first(&self) -> &LabelError {
        &self.errors[0]
    }
}

impl fmt::Display for LabelRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.first())?;
        match self.errors.len() {
            1 => {}
            2 => f.write_str(" (and 1 more problem)")?,
            n => write!(f, " (and {} more problems)", n - 1)?,
        }
        Ok(())
    }
}

impl std::error::Error for LabelRejection {}

/// Collects errors, without repeats and at most [`MAX_ERRORS`].
#[derive(Debug, Default)]
pub(super) struct Errors(Vec<LabelError>);

impl Errors {
    pub(super) fn push(&mut self, field: impl Into<String>, reason: LabelReason) {
        let field = field.into();
        if self.0.len() < MAX_ERRORS
            && !self
                .0
                .iter()
                .any(|e| e.field == field && e.reason == reason)
        {
            self.0.push(LabelError { field, reason });
        }
    }

    pub(super) fn into_result<T>(self, ok: T) -> Result<T, LabelRejection> {
        if self.0.is_empty() {
            Ok(ok)
        } else {
            Err(LabelRejection { errors: self.0 })
        }
    }
}
