//! A strict reader over parsed JSON that collects *every* problem with its field path.
//!
//! serde's derive stops at the first error, but operators fixing a config want the whole list
//! at once (`sink.bucket: must be 3 to 63 characters`, `delivery.batch_size: ...`). Each config
//! struct reads its fields through an [`ObjectReader`], one line per field with its default in
//! plain sight; unknown keys are reported when the reader is finished.
//!
//! Both the runtime config and the observability policy use this module.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::effective::{self, Node};
use super::grammar::is_header_name;
use svc_text::peer::PeerText;

/// One configuration problem: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted field path, e.g. `nats.urls[1]`.
    pub path: String,
    /// Lowercase reason, never containing the offending value when it could be a secret.
    pub message: String,
}

/// A path is made of the document's keys and a message may quote its values: both are shown
/// escaped (control characters never reach the terminal or log) and bounded.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = PeerText::with_limit(&self.message, MAX_MESSAGE_CHARS);
        if self.path.is_empty() {
            write!(f, "{message}")
        } else {
            write!(f, "{}: {message}", PeerText::new(&self.path))
        }
    }
}

/// Longest problem message shown (longer ones are cut with `...`).
const MAX_MESSAGE_CHARS: usize = 2048;

/// Accumulates problems while a document is read. Shared by reference between nested readers.
#[derive(Debug, Default)]
pub struct Problems(RefCell<Vec<Problem>>);

impl Problems {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&self, path: impl Into<String>, message: impl Into<String>) {
        self.0.borrow_mut().push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }

    pub fn into_vec(self) -> Vec<Problem> {
        self.0.into_inner()
    }
}

/// The error of a document that could not be accepted: every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub Vec<Problem>);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}

impl Invalid {
    pub fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid(vec![Problem {
            path: path.into(),
            message: message.into(),
        }])
    }
}

/// A JSON document (runtime config, observability policy) that could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be read. `what` names the document, e.g. `policy `.
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The document is invalid; every problem is listed.
    Invalid(Invalid),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { what, path, source } => {
                write!(f, "cannot read {what}{}: {source}", path.display())
            }
            LoadError::Invalid(inv) => write!(f, "{inv}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// Reads a document from `path` and parses it with `parse`.
pub fn load_document<T>(
    path: &Path,
    what: &'static str,
    parse: impl FnOnce(&str) -> Result<T, Invalid>,
) -> Result<T, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(LoadError::Invalid)
}

/// Parses JSON text, turning a syntax error into a problem with line and column.
pub fn parse_json(text: &str) -> Result<Value, Invalid> {
    serde_json::from_str(text).map_err(|e| {
        Invalid::one(
            "",
            format!(
                "not valid JSON at line {} column {}: {}",
                e.line(),
                e.column(),
                json_error_reason(&e)
            ),
        )
    })
}

/// serde_json's message without its trailing " at line X column Y", which we already print.
fn json_error_reason(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.find(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Joins a parent path and a key.
pub fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// Reads the fields of one JSON object. Created by [`ObjectReader::root`] or by
/// [`ObjectReader::object`] for nested blocks.
pub struct ObjectReader<'a> {
    path: String,
    map: Option<&'a Map<String, Value>>,
    known: Vec<&'static str>,
    /// Keys `has` found absent: their absence has a meaning, so no default is recorded.
    absent_checked: Vec<&'static str>,
    problems: &'a Problems,
}

impl<'a> ObjectReader<'a> {
    /// Reader over the document root; a non-object root is a problem.
    pub fn root(value: &'a Value, problems: &'a Problems) -> Self {
        Self::at(String::new(), value, problems)
    }

    /// Reader over `value` found at `path`.
    pub fn at(path: String, value: &'a Value, problems: &'a Problems) -> Self {
        if effective::recording() && value.is_object() {
            // Filled field by field by this reader, in its reading order (the parsed
            // document's own key order is alphabetical, and would differ on a second pass).
            effective::record(&path, Node::Object(Vec::new()));
        }
        let map = match value {
            Value::Object(m) => Some(m),
            _ => {
                problems.push(path.clone(), "must be a JSON object");
                None
            }
        };
        ObjectReader {
            path,
            map,
            known: Vec::new(),
            absent_checked: Vec::new(),
            problems,
        }
    }

    /// Records the default a getter used for an absent field (see [`effective`]).
    fn record_default(&self, key: &'static str, default: Value) {
        if effective::recording() {
            let v = if self.absent_checked.contains(&key) {
                Value::Null
            } else {
                default
            };
            effective::record(&self.path_of(key), Node::Leaf(v));
        }
    }

    /// Records `value` as what field `key` resolved to, in place of what the getters
    /// recorded: for a field the reader decides from others when it is absent (`null` would
    /// hide what the runner does). The value must read back to the same configuration.
    pub fn record_resolved(&self, key: &'static str, value: Value) {
        if effective::recording() {
            effective::record(&self.path_of(key), Node::Leaf(value));
        }
    }

    /// Path of a field of this object.
    pub fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// This object's own path.
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn problems(&self) -> &'a Problems {
        self.problems
    }

    /// Records a problem on field `key` of this object.
    pub fn problem(&self, key: &str, message: impl Into<String>) {
        self.problems.push(self.path_of(key), message);
    }

    /// True when the key is present with a non-null value.
    pub fn has(&mut self, key: &'static str) -> bool {
        let present = self.raw(key).is_some();
        if !present {
            self.absent_checked.push(key);
        }
        present
    }

    /// The raw value of a key; `null` counts as absent (the spec's null defaults).
    pub fn raw(&mut self, key: &'static str) -> Option<&'a Value> {
        self.known.push(key);
        let v = match self.map.and_then(|m| m.get(key)) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        };
        if effective::recording() {
            let recorded = v.cloned().unwrap_or(Value::Null);
            effective::record(&self.path_of(key), Node::Leaf(recorded));
        }
        v
    }

    /// An optional string.
    pub fn opt_string(&mut self, key: &'static str) -> Option<String> {
        match self.raw(key)? {
            Value::String(s) => Some(s.clone()),
            _ => {
                self.problem(key, "must be a string");
                None
            }
        }
    }

    /// A required string; missing yields a problem and an empty string.
    pub fn req_string(&mut self, key: &'static str) -> String {
        let present = self.has(key);
        if !present {
            self.problem(key, "is required");
            return String::new();
        }
        self.opt_string(key).unwrap_or_default()
    }

    /// A string with a default.
    pub fn string_or(&mut self, key: &'static str, default: &str) -> String {
        self.opt_string(key).unwrap_or_else(|| {
            self.record_default(key, Value::from(default));
            default.to_string()
        })
    }

    /// A message header name at `key` (`default` when absent); anything else is a problem.
    pub fn header_name_or(&mut self, key: &'static str, default: &str) -> String {
        let h = self.string_or(key, default);
        if !is_header_name(&h) {
            self.problem(
                key,
                "must be a header name without spaces or control characters",
            );
        }
        h
    }

    /// A non-empty optional string (empty is a problem).
    pub fn opt_nonempty(&mut self, key: &'static str) -> Option<String> {
        let s = self.opt_string(key)?;
        if s.trim().is_empty() {
            self.problem(key, "must not be empty");
            return None;
        }
        Some(s)
    }

    pub fn bool_or(&mut self, key: &'static str, default: bool) -> bool {
        match self.raw(key) {
            None => {
                self.record_default(key, Value::Bool(default));
                default
            }
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                self.problem(key, "must be true or false");
                default
            }
        }
    }

    /// An optional integer within `min..=max`.
    pub fn opt_int_in(&mut self, key: &'static str, min: i64, max: i64) -> Option<i64> {
        let v = self.raw(key)?;
        match v.as_i64() {
            Some(n) if (min..=max).contains(&n) => Some(n),
            Some(_) => {
                self.problem(key, format!("must be an integer from {min} to {max}"));
                None
            }
            None => {
                let got = match v {
                    Value::Number(_) => String::new(),
                    other => format!(" (got {})", kind_of(other)),
                };
                self.problem(key, format!("must be an integer from {min} to {max}{got}"));
                None
            }
        }
    }

    /// An integer within `min..=max` with a default.
    pub fn int_in(&mut self, key: &'static str, default: i64, min: i64, max: i64) -> i64 {
        self.opt_int_in(key, min, max).unwrap_or_else(|| {
            self.record_default(key, Value::from(default));
            default
        })
    }

    /// An optional number within `min..=max` (`exclusive_min` makes the lower bound open).
    pub fn opt_number_in(
        &mut self,
        key: &'static str,
        min: f64,
        exclusive_min: bool,
        max: f64,
    ) -> Option<f64> {
        let v = self.raw(key)?;
        let ok =
            |n: f64| n.is_finite() && (if exclusive_min { n > min } else { n >= min }) && n <= max;
        match v.as_f64() {
            Some(n) if ok(n) => Some(n),
            _ => {
                let low = if exclusive_min {
                    format!("greater than {min}")
                } else {
                    format!("from {min}")
                };
                let got = match v {
                    Value::Number(_) => String::new(),
                    other => format!(" (got {})", kind_of(other)),
                };
                let msg = if exclusive_min {
                    format!("must be a number {low} and at most {max}{got}")
                } else {
                    format!("must be a number {low} to {max}{got}")
                };
                self.problem(key, msg);
                None
            }
        }
    }

    pub fn number_in(
        &mut self,
        key: &'static str,
        default: f64,
        min: f64,
        exclusive_min: bool,
        max: f64,
    ) -> f64 {
        self.opt_number_in(key, min, exclusive_min, max)
            .unwrap_or_else(|| {
                self.record_default(key, Value::from(default));
                default
            })
    }

    /// One of a fixed set of string values.
    pub fn one_of<T: Copy + PartialEq>(
        &mut self,
        key: &'static str,
        default: T,
        choices: &[(&'static str, T)],
    ) -> T {
        let Some(s) = self.opt_string(key) else {
            if let Some((name, _)) = choices.iter().find(|(_, v)| *v == default) {
                self.record_default(key, Value::from(*name));
            }
            return default;
        };
        match choices.iter().find(|(name, _)| *name == s) {
            Some((_, v)) => *v,
            None => {
                let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
                self.problem(key, format!("must be one of: {}", names.join(", ")));
                default
            }
        }
    }

    /// An array of strings (absent = empty).
    pub fn string_list(&mut self, key: &'static str) -> Vec<String> {
        let Some(v) = self.raw(key) else {
            self.record_default(key, Value::Array(Vec::new()));
            return Vec::new();
        };
        let Value::Array(items) = v else {
            self.problem(key, "must be an array of strings");
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => out.push(s.clone()),
                _ => self
                    .problems
                    .push(format!("{}[{i}]", self.path_of(key)), "must be a string"),
            }
        }
        out
    }

    /// An object of string to string (absent = empty).
    pub fn string_map(&mut self, key: &'static str) -> BTreeMap<String, String> {
        let Some(v) = self.raw(key) else {
            self.record_default(key, Value::Object(Map::new()));
            return BTreeMap::new();
        };
        let Value::Object(m) = v else {
            self.problem(key, "must be an object of string values");
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for (k, item) in m {
            match item {
                Value::String(s) => {
                    out.insert(k.clone(), s.clone());
                }
                _ => self
                    .problems
                    .push(join(&self.path_of(key), k), "must be a string"),
            }
        }
        out
    }

    /// A nested object; absent gives `None`.
    pub fn object(&mut self, key: &'static str) -> Option<ObjectReader<'a>> {
        let path = self.path_of(key);
        let Some(v) = self.raw(key) else {
            effective::record_absent_object(&path);
            return None;
        };
        Some(ObjectReader::at(path, v, self.problems))
    }

    /// [`Self::objects`] with at most `max` elements: a longer array is a problem ("must have at
    /// most N entries") and only its first `max` elements are read.
    pub fn objects_at_most(&mut self, key: &'static str, max: usize) -> Vec<ObjectReader<'a>> {
        let mut readers = self.objects(key);
        if readers.len() > max {
            self.problem(key, format!("must have at most {max} entries"));
            readers.truncate(max);
        }
        readers
    }

    /// An array of objects (absent = empty); each element gets its own reader.
    pub fn objects(&mut self, key: &'static str) -> Vec<ObjectReader<'a>> {
        let path = self.path_of(key);
        let Some(v) = self.raw(key) else {
            self.record_default(key, Value::Array(Vec::new()));
            return Vec::new();
        };
        let Value::Array(items) = v else {
            self.problem(key, "must be an array of objects");
            return Vec::new();
        };
        if effective::recording() {
            let empty = items.iter().map(|_| Node::Object(Vec::new())).collect();
            effective::record(&path, Node::Array(empty));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| ObjectReader::at(format!("{path}[{i}]"), item, self.problems))
            .collect()
    }

    /// The keys present in this object, in document order.
    pub fn keys(&self) -> Vec<&'a String> {
        self.map.map(|m| m.keys().collect()).unwrap_or_default()
    }

    /// Reports every key that no getter asked for, with the nearest known key when one is
    /// close enough to be a typo of it.
    pub fn finish(self) {
        let Some(map) = self.map else { return };
        for key in map.keys() {
            if !self.known.iter().any(|k| k == key) {
                let message = match nearest(key, &self.known) {
                    Some(k) => format!("unknown field; did you mean {k}?"),
                    None => "unknown field".to_string(),
                };
                self.problems.push(join(&self.path, key), message);
            }
        }
    }
}

/// The known key closest to `key` by edit distance, when at most 2 edits (and fewer than a
/// third of the key) apart: a typo, not a different word.
fn nearest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    // Long keys are not typos worth the quadratic distance (and may be hostile input).
    if key.len() > 64 {
        return None;
    }
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 2 && *d * 3 <= key.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over bytes (keys are ASCII names).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// What a JSON value is, for "got a string" in a type problem.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_names_the_nearest_field_and_a_wrong_type_is_named() {
        let got = read(
            r#"{"batch_sise": 5, "fetch_expiry_ms": "10", "colour": 1}"#,
            |r| {
                r.int_in("batch_size", 1, 1, 10);
                r.number_in("fetch_expiry_ms", 1.0, 0.0, true, 9.0);
                r.bool_or("color_mode", false);
            },
        );
        assert_eq!(
            got,
            [
                "fetch_expiry_ms: must be a number greater than 0 and at most 9 (got a string)",
                "batch_sise: unknown field; did you mean batch_size?",
                "colour: unknown field",
            ]
        );
        assert_eq!(edit_distance("batch_sise", "batch_size"), 1);
        assert_eq!(nearest("zz", &["ok"]), None);
    }

    fn read(text: &str, f: impl FnOnce(&mut ObjectReader)) -> Vec<String> {
        let v = parse_json(text).unwrap();
        let p = Problems::new();
        let mut r = ObjectReader::root(&v, &p);
        f(&mut r);
        r.finish();
        p.into_vec().iter().map(|p| p.to_string()).collect()
    }

    /// Found by `fuzz/fuzz_targets/runtime_config.rs` and `observe_policy.rs`: an unknown key
    /// reached the problem text raw (a control character in a key forges output lines).
    #[test]
    fn problems_show_document_text_escaped() {
        let got = read(r#"{"a\u0001b\nc": 1, "ok": 2}"#, |_| {});
        assert_eq!(
            got,
            vec!["a\\u{1}b\\nc: unknown field", "ok: unknown field"]
        );
        let long = format!(r#"{{"{}": 1}}"#, "k".repeat(1000));
        let got = read(&long, |_| {});
        assert!(
            got[0].len() < 300 && got[0].contains("...: unknown"),
            "{}",
            got[0]
        );
    }

    #[test]
    fn reports_every_problem_with_its_path() {
        let got = read(
            r#"{"a": "x", "b": 7, "c": true, "n": {"deep": 1, "extra": 2}, "zz": 1}"#,
            |r| {
                r.int_in("a", 1, 0, 10);
                r.int_in("b", 1, 0, 5);
                r.opt_string("c");
                let mut n = r.object("n").unwrap();
                n.opt_string("deep");
                n.finish();
            },
        );
        assert_eq!(
            got,
            vec![
                "a: must be an integer from 0 to 10 (got a string)",
                "b: must be an integer from 0 to 5",
                "c: must be a string",
                "n.deep: must be a string",
                "n.extra: unknown field",
                "zz: unknown field",
            ]
        );
    }

    #[test]
    fn null_counts_as_absent_and_required_is_reported() {
        let got = read(r#"{"a": null}"#, |r| {
            assert_eq!(r.opt_string("a"), None);
            r.req_string("b");
        });
        assert_eq!(got, vec!["b: is required"]);
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let e = parse_json("{\n \"a\": }").unwrap_err();
        assert!(e.to_string().contains("line 2 column"), "{e}");
    }
}
