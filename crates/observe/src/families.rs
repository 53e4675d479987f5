//! Subject-family evaluation: which prepared `labeled_metrics` rows are exported, under which
//! label value.
//!
//! The runner counts messages per reviewed family (`metrics.subject_families` in the runtime
//! config: a subject pattern and a label) and writes one row per family and metric, labelled
//! only `subject_family=<label>`, plus the family catalogue (label -> pattern) in the snapshot's
//! `subject_families`. No raw subject ever reaches the snapshot.
//!
//! A `subject_metrics` rule's `subject` is a pattern in the runtime routing grammar and is
//! compared with each family's *pattern*:
//! - an allow rule applies to a family when it **covers** the family (every subject the family
//!   can count is matched by the rule);
//! - a deny rule applies when it **intersects** the family (some subject could match both), so
//!   a family that might contain a denied subject is never exported;
//! - deny wins over allow whatever the order; among allow rules the first in order applies;
//!   a family no rule applies to is denied (`default_action` = `deny`).
//!
//! The exported value of the `subject_family` label follows the allow rule's `display_mode`
//! (`label`: the rule's label, `redacted`: `redacted`, `hash`: 16 hex digits of SHA-256 over
//! the family pattern, `raw`: the family pattern itself). Families that end up with the same
//! value are summed. At most `max_subject_families` values are kept, in order of first
//! appearance (catalogue order); the rest follow `overflow_action`.

use std::collections::BTreeMap;

use crate::catalogue::Kind;
use crate::filter::Filter;
use crate::policy::subject_metrics::{Action, DisplayMode, OverflowAction, Rule};
use crate::policy::Policy;
use svc_snapshot::Snapshot;
use svc_subject::SubjectPattern;

/// The only label exporters ever attach.
pub const LABEL_NAME: &str = "subject_family";

/// Value of the label for `redacted` rules.
pub const REDACTED: &str = "redacted";

/// Labeled samples per metric suffix, in kept order: `(label value, value)`.
pub type FamilySamples = BTreeMap<String, Vec<(String, f64)>>;

/// The aggregation pass could not stay within `max_subject_families` and the policy says
/// `fail_closed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overflow {
    pub families: usize,
    pub max: u32,
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "subject_metrics: {} family labels exceed max_subject_families {} (overflow_action fail_closed)",
            self.families, self.max
        )
    }
}

impl std::error::Error for Overflow {}

/// Tokens of a validated pattern.
fn tokens(p: &SubjectPattern) -> Vec<&str> {
    p.as_str().split('.').collect()
}

/// Does `rule` match every subject `family` can match?
pub fn covers(rule: &SubjectPattern, family: &SubjectPattern) -> bool {
    let (r, f) = (tokens(rule), tokens(family));
    for (i, rt) in r.iter().enumerate() {
        match *rt {
            // `>` takes one or more tokens: the family needs at least one more token here.
            ">" => return f.len() > i,
            "*" => match f.get(i) {
                Some(&">") | None => return false,
                Some(_) => {}
            },
            lit => match f.get(i) {
                Some(ft) if *ft == lit => {}
                _ => return false,
            },
        }
    }
    f.len() == r.len()
}

/// Is there a subject both patterns match?
pub fn intersects(a: &SubjectPattern, b: &SubjectPattern) -> bool {
    let (a, b) = (tokens(a), tokens(b));
    let mut i = 0;
    loop {
        match (a.get(i), b.get(i)) {
            (None, None) => return true,
            // A `>` needs one or more tokens: any token (or `>`) on the other side will do.
            (Some(&">"), Some(_)) | (Some(_), Some(&">")) => return true,
            (Some(x), Some(y)) => {
                if *x != "*" && *y != "*" && x != y {
                    return false;
                }
            }
            _ => return false,
        }
        i += 1;
    }
}

/// 16 hex digits of SHA-256 over the text (deterministic; not a confidentiality boundary).
pub fn short_hash(text: &str) -> String {
    svc_text::hex::sha256(text.as_bytes())[..16].to_string()
}

/// The rule that decides a family: `None` when denied or when no allow rule covers it.
pub fn decide<'r>(rules: &'r [Rule], family: &SubjectPattern) -> Option<&'r Rule> {
    let pattern = |r: &'r Rule| r.pattern.as_ref();
    let denied = rules
        .iter()
        .filter(|r| r.action == Action::Deny)
        .filter_map(pattern)
        .any(|p| intersects(p, family));
    if denied {
        return None;
    }
    rules
        .iter()
        .filter(|r| r.action == Action::Allow)
        .find(|r| pattern(r).is_some_and(|p| covers(p, family)))
}

/// Evaluates `subject_metrics` over the snapshot's rows. Rows must also pass the policy's
/// metric filter and the rule's own metric lists; only counter rows are exported.
pub fn evaluate(snapshot: &Snapshot, policy: &Policy) -> Result<FamilySamples, Overflow> {
    let sm = &policy.subject_metrics;
    if !policy.enabled || !sm.enabled {
        return Ok(FamilySamples::new());
    }
    let filter = Filter::new(policy);
    // value -> (suffix -> sum), with the values in order of first appearance.
    let mut order: Vec<String> = Vec::new();
    let mut sums: BTreeMap<(String, String), f64> = BTreeMap::new();
    let mut seen_labels: Vec<&str> = Vec::new();
    for fam in &snapshot.subject_families {
        // A label listed twice is ambiguous: only its first entry counts.
        if seen_labels.contains(&fam.label.as_str()) {
            continue;
        }
        seen_labels.push(&fam.label);
        let Ok(pattern) = SubjectPattern::parse(&fam.subject) else {
            continue;
        };
        let Some(rule) = decide(&sm.rules, &pattern) else {
            continue;
        };
        let value = match rule.display_mode {
            DisplayMode::Label => rule.label.clone().unwrap_or_default(),
            DisplayMode::Redacted => REDACTED.to_string(),
            DisplayMode::Hash => short_hash(pattern.as_str()),
            DisplayMode::Raw if sm.allow_raw_subjects => pattern.as_str().to_string(),
            DisplayMode::Raw => continue,
        };
        let mut any = false;
        for row in &snapshot.labeled_metrics {
            if row.labels.get(LABEL_NAME) != Some(&fam.label)
                || row.kind != "counter"
                || !svc_document::grammar::is_metric_name(&row.name)
                || !row.name.ends_with("_total")
                || !row.value.is_finite()
                || !filter.allows(&row.name, Kind::Counter)
                || !rule.admits(&row.name)
            {
                continue;
            }
            any = true;
            *sums.entry((row.name.clone(), value.clone())).or_insert(0.0) += row.value;
        }
        if any && !order.contains(&value) {
            order.push(value);
        }
    }

    let max = sm.max_subject_families as usize;
    let (kept, rest) = order.split_at(order.len().min(max));
    let mut out = FamilySamples::new();
    let mut push = |suffix: &str, label: &str, v: f64| {
        let list = out.entry(suffix.to_string()).or_default();
        match list.iter_mut().find(|(l, _)| l == label) {
            Some((_, sum)) => *sum += v,
            None => list.push((label.to_string(), v)),
        }
    };
    let suffixes: Vec<String> = {
        let mut s: Vec<String> = sums.keys().map(|(n, _)| n.clone()).collect();
        s.dedup();
        s
    };
    if !rest.is_empty() && sm.overflow_action == OverflowAction::FailClosed {
        return Err(Overflow {
            families: order.len(),
            max: sm.max_subject_families,
        });
    }
    for suffix in &suffixes {
        for value in kept {
            if let Some(v) = sums.get(&(suffix.clone(), value.clone())) {
                push(suffix, value, *v);
            }
        }
        if sm.overflow_action == OverflowAction::AggregateOther {
            for value in rest {
                if let Some(v) = sums.get(&(suffix.clone(), value.clone())) {
                    push(suffix, &sm.overflow_label, *v);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SubjectPattern {
        SubjectPattern::parse(s).unwrap()
    }

    #[test]
    fn coverage() {
        assert!(covers(&p("orders.>"), &p("orders.eu.>")));
        assert!(covers(&p("orders.>"), &p("orders.*")));
        assert!(covers(&p("orders.>"), &p("orders.eu")));
        assert!(covers(&p(">"), &p("a.b.>")));
        assert!(covers(&p("orders.*"), &p("orders.eu")));
        assert!(covers(&p("orders.*"), &p("orders.*")));
        assert!(!covers(&p("orders.*"), &p("orders.>")));
        assert!(!covers(&p("orders.eu.>"), &p("orders.>")));
        assert!(!covers(&p("orders.>"), &p("orders")));
        assert!(!covers(&p("orders.eu"), &p("orders.*")));
        assert!(covers(&p("orders.eu"), &p("orders.eu")));
    }

    #[test]
    fn intersection() {
        assert!(intersects(&p("orders.>"), &p("orders.secret.>")));
        assert!(intersects(&p("orders.secret.>"), &p("orders.>")));
        assert!(intersects(&p("*.eu"), &p("orders.*")));
        assert!(!intersects(&p("orders.>"), &p("payments.>")));
        assert!(!intersects(&p("orders.>"), &p("orders")));
        assert!(!intersects(&p("a.*"), &p("a.b.c")));
        assert!(intersects(&p(">"), &p("x")));
    }

    /// Brute force over a small universe of subjects: `covers` and `intersects` agree with
    /// the one subject matcher.
    #[test]
    fn agree_with_the_matcher() {
        let toks = ["a", "b", "*", ">"];
        let mut patterns = Vec::new();
        for n in 1..=3 {
            let mut idx = vec![0usize; n];
            loop {
                let s: Vec<&str> = idx.iter().map(|&i| toks[i]).collect();
                if let Ok(pat) = SubjectPattern::parse(&s.join(".")) {
                    patterns.push(pat);
                }
                let mut k = 0;
                while k < n {
                    idx[k] += 1;
                    if idx[k] < toks.len() {
                        break;
                    }
                    idx[k] = 0;
                    k += 1;
                }
                if k == n {
                    break;
                }
            }
        }
        // Subjects over {a, b, c} of length 1 to 4 ("c" stands for any other token).
        let mut subjects = Vec::new();
        for n in 1..=4u32 {
            for code in 0..3usize.pow(n) {
                let mut c = code;
                let s: Vec<&str> = (0..n)
                    .map(|_| {
                        let t = ["a", "b", "c"][c % 3];
                        c /= 3;
                        t
                    })
                    .collect();
                subjects.push(s.join("."));
            }
        }
        for r in &patterns {
            for f in &patterns {
                let fam: Vec<&String> = subjects.iter().filter(|s| f.matches(s)).collect();
                let want_cover = fam.iter().all(|s| r.matches(s));
                let want_meet = fam.iter().any(|s| r.matches(s));
                // Tails reach beyond length 4; the universe is deep enough for 3-token patterns.
                assert_eq!(covers(r, f), want_cover, "covers({r}, {f})");
                assert_eq!(intersects(r, f), want_meet, "intersects({r}, {f})");
            }
        }
    }

    #[test]
    fn hash_is_deterministic() {
        assert_eq!(short_hash("orders.>"), short_hash("orders.>"));
        assert_eq!(short_hash("orders.>").len(), 16);
        assert_ne!(short_hash("orders.>"), short_hash("orders.*"));
    }
}
