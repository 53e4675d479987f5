//! The vocabulary the file and object-store sinks share: `duplicate_policy`, `compression` and
//! `payload_mode` with their config names, defaults and reading; the rule for a prefix
//! (`key_prefix` of both, object_store's `prefix`); the rules for a suffix (a simple extension;
//! gzip output ends with `.gz`, and only it does).
//!
//! One copy of each rule, so the two sinks cannot drift apart in what they accept. Where the
//! sinks word a refusal differently (their messages are documented in `docs/sinks/file.md` and
//! `docs/sinks/object-store.md`, and operators match on them), a rule here says which rule
//! failed and the sink keeps its own wording.

use std::fmt;

use crate::document::reader::ObjectReader;

/// What a write does when its key (file name or object key) already holds a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuplicatePolicy {
    /// Keep the existing record; report the message as already durable (when the record is
    /// its durable copy).
    SkipExisting,
    /// Replace the existing record with the new one.
    Replace,
    /// Keep the existing record; report a permanent failure for operator review (unless the
    /// record is the same message).
    FailExisting,
}

/// `duplicate_policy` values as the config spells them.
pub const DUPLICATE_POLICIES: &[(&str, DuplicatePolicy)] = &[
    ("skip_existing", DuplicatePolicy::SkipExisting),
    ("replace", DuplicatePolicy::Replace),
    ("fail_existing", DuplicatePolicy::FailExisting),
];

impl DuplicatePolicy {
    /// Reads `duplicate_policy`. Defaults to `skip_existing`.
    pub fn read(r: &mut ObjectReader<'_>) -> DuplicatePolicy {
        r.one_of(
            "duplicate_policy",
            DuplicatePolicy::SkipExisting,
            DUPLICATE_POLICIES,
        )
    }

    /// The config spelling (`skip_existing`, ...), as operators wrote it.
    pub fn name(self) -> &'static str {
        match self {
            DuplicatePolicy::SkipExisting => "skip_existing",
            DuplicatePolicy::Replace => "replace",
            DuplicatePolicy::FailExisting => "fail_existing",
        }
    }
}

impl fmt::Display for DuplicatePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a record is compressed before it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

/// `compression` values as the config spells them.
pub const COMPRESSIONS: &[(&str, Compression)] =
    &[("none", Compression::None), ("gzip", Compression::Gzip)];

impl Compression {
    /// Reads `compression`. Defaults to `none`.
    pub fn read(r: &mut ObjectReader<'_>) -> Compression {
        r.one_of("compression", Compression::None, COMPRESSIONS)
    }

    /// The config spelling (`none`, `gzip`), also what an object-store sidecar records.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
        }
    }
}

/// Payload normalization before the record is built (only one value exists today).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadMode {
    JsonOrEnvelope,
}

/// `payload_mode` values as the config spells them.
pub const PAYLOAD_MODES: &[(&str, PayloadMode)] =
    &[("json_or_envelope", PayloadMode::JsonOrEnvelope)];

impl PayloadMode {
    /// Reads `payload_mode`. Defaults to `json_or_envelope`.
    pub fn read(r: &mut ObjectReader<'_>) -> PayloadMode {
        r.one_of("payload_mode", PayloadMode::JsonOrEnvelope, PAYLOAD_MODES)
    }
}

/// Longest prefix, in bytes.
pub const MAX_PREFIX_BYTES: usize = 256;

/// Why a prefix (`prefix`, `key_prefix`) is unsafe, if it is: it must be `/`-separated
/// segments of `[A-Za-z0-9_.-]`, no empty, `.` or `..` segment, no leading or trailing slash,
/// at most [`MAX_PREFIX_BYTES`]. The object-store sink reports these reasons as they are; the
/// file sink reports one sentence for all of them.
pub fn prefix_problem(p: &str) -> Option<&'static str> {
    if p.is_empty() {
        return Some("must not be empty (omit the field instead)");
    }
    if p.len() > MAX_PREFIX_BYTES {
        return Some("must be at most 256 bytes");
    }
    if p.starts_with('/') || p.ends_with('/') {
        return Some("must not start or end with '/'");
    }
    let segments: Vec<&str> = p.split('/').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Some("must not contain empty segments");
    }
    if segments.iter().any(|s| *s == "." || *s == "..") {
        return Some("must not contain '.' or '..' segments");
    }
    if !p
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
    {
        return Some("must contain only letters, digits, '_', '-', '.' and '/'");
    }
    None
}

/// True for a prefix [`prefix_problem`] accepts.
pub fn is_safe_prefix(p: &str) -> bool {
    prefix_problem(p).is_none()
}

/// True for a suffix such as `.json`, `.json.gz`, `.metadata.json`: dot-separated ASCII
/// alphanumeric parts, 2 to 32 bytes.
pub fn is_simple_suffix(s: &str) -> bool {
    s.len() >= 2
        && s.len() <= 32
        && s.starts_with('.')
        && s[1..]
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// How a suffix disagrees with the compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GzipSuffix {
    /// `compression` is gzip and the suffix does not end with `.gz`.
    Missing,
    /// The suffix ends with `.gz` and `compression` is not gzip.
    Unexpected,
}

impl GzipSuffix {
    /// The file sink's wording (the object-store sink adds an example to [`GzipSuffix::Missing`]).
    pub fn message(self) -> &'static str {
        match self {
            GzipSuffix::Missing => "must end with .gz when compression is gzip",
            GzipSuffix::Unexpected => "must not end with .gz unless compression is gzip",
        }
    }
}

/// Gzip output ends with `.gz`, and only it does: a reader (and an operator's tools) can tell
/// a compressed record by its name.
pub fn gzip_suffix_problem(compression: Compression, suffix: &str) -> Option<GzipSuffix> {
    match (compression, suffix.ends_with(".gz")) {
        (Compression::Gzip, false) => Some(GzipSuffix::Missing),
        (Compression::None, true) => Some(GzipSuffix::Unexpected),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_config_spellings() {
        for (name, policy) in DUPLICATE_POLICIES {
            assert_eq!(policy.name(), *name);
            assert_eq!(policy.to_string(), *name);
        }
        for (name, compression) in COMPRESSIONS {
            assert_eq!(compression.name(), *name);
        }
    }

    #[test]
    fn suffix_and_prefix_rules() {
        assert!(is_simple_suffix(".json") && is_simple_suffix(".json.gz"));
        assert!(!is_simple_suffix("json") && !is_simple_suffix(".") && !is_simple_suffix(".a..b"));
        assert!(is_safe_prefix("events/prod") && is_safe_prefix("a"));
        for bad in ["", "/a", "a/", "a//b", "a/./b", "a/../b", "a b", "a\\b"] {
            assert!(!is_safe_prefix(bad), "{bad}");
        }
    }

    #[test]
    fn gzip_output_and_only_it_ends_with_gz() {
        use Compression::{Gzip, None};
        assert_eq!(
            gzip_suffix_problem(Gzip, ".json"),
            Some(GzipSuffix::Missing)
        );
        assert_eq!(
            gzip_suffix_problem(None, ".json.gz"),
            Some(GzipSuffix::Unexpected)
        );
        assert_eq!(gzip_suffix_problem(Gzip, ".json.gz"), Option::None);
        assert_eq!(gzip_suffix_problem(None, ".json"), Option::None);
    }
}
