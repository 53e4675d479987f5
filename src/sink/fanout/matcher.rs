//! What a fan-out route matches beyond the subject: priority, classification, labels and kept
//! headers of the normalized envelope, and the checks `svc validate` runs on them.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::document::reader::ObjectReader;
use crate::message::envelope::Envelope;
use crate::message::metadata::normalize_value;
use crate::message::subject::SubjectPattern;
use crate::text::secrets::is_secret_name;

/// Longest header value a route may compare against.
pub const MAX_HEADER_VALUE_BYTES: usize = 1024;
/// Most entries in one list or header map of a route's `match`.
pub const MAX_MATCH_ITEMS: usize = 64;

/// The facts of one normalized message a route is matched against.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    pub subject: &'a str,
    pub marks: Marks,
    /// Only the headers the envelope kept (`envelope.keep_headers`).
    pub headers: &'a BTreeMap<String, String>,
}

impl<'a> Facts<'a> {
    /// Every fact of `env` a route may match.
    pub fn of(env: &'a Envelope) -> Facts<'a> {
        Facts {
            subject: &env.subject,
            marks: Marks::of(env),
            headers: &env.metadata.headers,
        }
    }

    /// The subject alone, for routes that match on nothing else (nothing is copied).
    pub fn subject_only(env: &'a Envelope) -> Facts<'a> {
        static NO_HEADERS: BTreeMap<String, String> = BTreeMap::new();
        Facts {
            subject: &env.subject,
            marks: Marks::default(),
            headers: &NO_HEADERS,
        }
    }
}

/// A message's priority, classification and labels in the form route values are read in
/// (`metadata::normalize_value`: trimmed, lower case), so each comparison is one lookup: a
/// route's labels cost one probe each, whatever the message carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    pub priority: String,
    pub classification: String,
    pub labels: HashSet<String>,
}

impl Marks {
    pub fn new<'x>(
        priority: &str,
        classification: &str,
        labels: impl IntoIterator<Item = &'x str>,
    ) -> Marks {
        Marks {
            priority: canonical(priority),
            classification: canonical(classification),
            labels: labels.into_iter().map(canonical).collect(),
        }
    }

    /// The message's marking: its metadata's (rules, default, and the `Svc-*` headers only
    /// under `trust_headers`), the one the pre-sink policy checks and the record's columns
    /// hold. A label profile's own fields never route: a publisher may attach any profile
    /// whatever `trust_headers` says, and a profile saying `unclassified` on a message the
    /// rules mark restricted must not send it to the general child.
    pub fn of(env: &Envelope) -> Marks {
        Marks::new(
            &env.priority,
            &env.classification,
            env.labels_list.iter().map(String::as_str),
        )
    }
}

/// A message value as a route value is read (metadata values are normalized already; a
/// vocabulary may spell them in upper case). A value `normalize_value` refuses is only lowered:
/// no route value can equal it, as routes hold only normalized values.
fn canonical(v: &str) -> String {
    normalize_value(v).unwrap_or_else(|| v.to_ascii_lowercase())
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
    /// (`metadata::normalize_value`), and so are the message's [`Marks`] (a vocabulary may spell
    /// them its own way: `RESTRICTED`).
    pub fn matches(&self, f: &Facts<'_>) -> bool {
        let m = &f.marks;
        let has = |l: &String| m.labels.contains(l);
        self.priority
            .as_ref()
            .is_none_or(|s| s.contains(&m.priority))
            && self
                .classification
                .as_ref()
                .is_none_or(|s| s.contains(&m.classification))
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
                if is_secret_name(k) {
                    m.problems().push(
                        at,
                        "looks like a secret-bearing header; routes never match on it",
                    );
                } else if v.trim() != v || v.contains(['\0', '\r', '\n']) {
                    // The client trims a header value (Unicode white space included) and reads
                    // it from one line; a NUL in a kept header is refused at input.
                    m.problems().push(
                        at,
                        "has white space at an end, a line break or a NUL, which no kept \
                         header value has, so no message could match",
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
