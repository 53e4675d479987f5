//! What a fan-out route matches beyond the subject: priority, classification, labels and kept
//! headers of the normalized envelope, and the checks `svc validate` runs on them.

use std::collections::{BTreeMap, BTreeSet};

use crate::document::grammar::looks_secret;
use crate::document::reader::ObjectReader;
use crate::message::metadata::normalize_value;
use crate::message::subject::SubjectPattern;

/// Longest header value a route may compare against.
pub const MAX_HEADER_VALUE_BYTES: usize = 1024;
/// Most entries in one list or header map of a route's `match`.
pub const MAX_MATCH_ITEMS: usize = 64;

/// The facts of one normalized message a route is matched against.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub subject: &'a str,
    pub priority: &'a str,
    pub classification: &'a str,
    pub labels: &'a [String],
    /// Only the headers the envelope kept (`envelope.keep_headers`).
    pub headers: &'a BTreeMap<String, String>,
}

impl<'a> Facts<'a> {
    pub fn of(env: &'a crate::message::envelope::Envelope) -> Facts<'a> {
        Facts {
            subject: &env.subject,
            priority: &env.priority,
            classification: &env.classification,
            labels: &env.labels_list,
            headers: &env.metadata.headers,
        }
    }
}

/// The non-subject part of a route's `match`; `None`/empty means "any".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conditions {
    pub priority: Option<BTreeSet<String>>,
    pub classification: Option<BTreeSet<String>>,
    pub labels_all: BTreeSet<String>,
    pub labels_any: Option<BTreeSet<String>>,
    pub labels_none: BTreeSet<String>,
    pub headers: BTreeMap<String, String>,
}

impl Conditions {
    /// True when the route matches on the subject alone (the subject index decides).
    pub fn is_empty(&self) -> bool {
        *self == Conditions::default()
    }

    /// Values compare without case: the route's are normalized as a message's are
    /// (`metadata::normalize_value`), and a vocabulary may spell the message's its own way
    /// (`RESTRICTED`).
    pub fn matches(&self, f: &Facts<'_>) -> bool {
        let has = |l: &String| f.labels.iter().any(|x| x.eq_ignore_ascii_case(l));
        let one_of = |s: &BTreeSet<String>, v: &str| s.iter().any(|x| x.eq_ignore_ascii_case(v));
        self.priority.as_ref().is_none_or(|s| one_of(s, f.priority))
            && self
                .classification
                .as_ref()
                .is_none_or(|s| one_of(s, f.classification))
            && self.labels_all.iter().all(has)
            && self.labels_any.as_ref().is_none_or(|s| s.iter().any(has))
            && !self.labels_none.iter().any(has)
            && self
                .headers
                .iter()
                .all(|(k, v)| f.headers.get(k).is_some_and(|x| x == v))
    }

    /// Could one message satisfy both `self` and `other`? (Conservative: true unless the two
    /// provably exclude each other.)
    pub fn compatible(&self, other: &Conditions) -> bool {
        let disjoint = |a: &Option<BTreeSet<String>>, b: &Option<BTreeSet<String>>| match (a, b) {
            (Some(a), Some(b)) => a.is_disjoint(b),
            _ => false,
        };
        let headers_clash = self
            .headers
            .iter()
            .any(|(k, v)| other.headers.get(k).is_some_and(|w| w != v));
        !(disjoint(&self.priority, &other.priority)
            || disjoint(&self.classification, &other.classification)
            || !self.labels_all.is_disjoint(&other.labels_none)
            || !other.labels_all.is_disjoint(&self.labels_none)
            || headers_clash)
    }

    /// Reads the keys beside `subject` in a route's `match`, refusing any that no message
    /// could satisfy.
    pub fn read(m: &mut ObjectReader<'_>) -> Conditions {
        let mut c = Conditions {
            priority: set(m, "priority"),
            classification: set(m, "classification"),
            labels_all: set(m, "labels_all").unwrap_or_default(),
            labels_any: set(m, "labels_any"),
            labels_none: set(m, "labels_none").unwrap_or_default(),
            headers: BTreeMap::new(),
        };
        for shared in c.labels_all.intersection(&c.labels_none) {
            m.problem(
                "labels_none",
                format!("{shared} is also in labels_all, so no message could match"),
            );
        }
        if let Some(any) = &c.labels_any {
            if !any.is_empty() && any.is_subset(&c.labels_none) {
                m.problem(
                    "labels_any",
                    "every label is also in labels_none, so no message could match",
                );
            }
        }
        if m.has("headers") {
            let headers = m.string_map("headers");
            if headers.is_empty() {
                m.problem("headers", "is empty; omit it to match any headers");
            }
            if headers.len() > MAX_MATCH_ITEMS {
                m.problem(
                    "headers",
                    format!("has more than {MAX_MATCH_ITEMS} entries"),
                );
            }
            for (k, v) in &headers {
                let at = format!("{}.{k}", m.path_of("headers"));
                if looks_secret(k) {
                    m.problems().push(
                        at,
                        "looks like a secret-bearing header; routes never match on it",
                    );
                } else if v.len() > MAX_HEADER_VALUE_BYTES {
                    m.problems().push(
                        at,
                        format!("value is longer than {MAX_HEADER_VALUE_BYTES} bytes"),
                    );
                }
            }
            c.headers = headers;
        }
        c
    }
}

/// An optional list read as a set: absent is `None`; an empty or oversized list is refused.
fn set(m: &mut ObjectReader<'_>, key: &'static str) -> Option<BTreeSet<String>> {
    if !m.has(key) {
        return None;
    }
    let list = m.string_list(key);
    if list.is_empty() {
        m.problem(
            key,
            "is an empty list, so no message could match; omit it to match any",
        );
    } else if list.len() > MAX_MATCH_ITEMS {
        m.problem(key, format!("has more than {MAX_MATCH_ITEMS} entries"));
    }
    if list.iter().any(String::is_empty) {
        m.problem(key, "must not contain an empty string");
    }
    // As a message's values are read: trimmed, lower case, one label per entry. A value no
    // message can carry would never match (and in labels_none never exclude).
    let mut values = BTreeSet::new();
    for v in list.iter().filter(|v| !v.is_empty()) {
        match normalize_value(v) {
            Some(n) => {
                values.insert(n);
            }
            None => m.problem(
                key,
                format!(
                    "{v} is not a value a message can carry (letters, digits, inner spaces and \
                     _-.:/+, one value per entry), so it would never match"
                ),
            ),
        }
    }
    Some(values)
}

/// Could one subject match both patterns? Token by token: `*` matches any one token, `>` one
/// or more trailing tokens.
pub fn subjects_overlap(a: &SubjectPattern, b: &SubjectPattern) -> bool {
    let a: Vec<&str> = a.as_str().split('.').collect();
    let b: Vec<&str> = b.as_str().split('.').collect();
    let mut i = 0;
    loop {
        match (a.get(i), b.get(i)) {
            (Some(&">"), Some(_)) | (Some(_), Some(&">")) => return true,
            (Some(x), Some(y)) => {
                if x != y && *x != "*" && *y != "*" {
                    return false;
                }
            }
            (None, None) => return true,
            _ => return false,
        }
        i += 1;
    }
}
