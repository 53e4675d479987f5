//! Subject patterns: the one matcher for the whole runtime (label rules, metadata rules, table
//! routing, fan-out routes, subject families, exporter subject rules).
//!
//! Grammar (the broker's): tokens separated by `.`; `*` matches exactly one token; `>` matches
//! one or more trailing tokens and may only be the last token. Tokens are non-empty and contain
//! no whitespace. A literal subject is a pattern without wildcards. Rule lists pick the first
//! rule whose pattern matches; a list of rules is held as [`SubjectRules`], whose compiled
//! [`SubjectIndex`] finds that rule in time bounded by the subject's tokens and the wildcard
//! branches its prefixes take, not by the number of rules (a token trie with `*` and `>`
//! branches, as the broker's own subject index is; docs/performance.md has its worst case).

use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;

use svc_document::reader::ObjectReader;

/// Reads the required subject pattern at `key` of a config object: `None` when it is missing
/// (reported as required) or invalid (reported with the grammar's reason).
pub fn read_pattern(r: &mut ObjectReader<'_>, key: &'static str) -> Option<SubjectPattern> {
    let subject = r.req_string(key);
    match SubjectPattern::parse(&subject) {
        Ok(p) => Some(p),
        Err(e) => {
            if !subject.is_empty() {
                r.problem(key, e.to_string());
            }
            None
        }
    }
}

/// A parsed, validated subject pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectPattern {
    text: String,
    tokens: Vec<Token>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(String),
    One,
    Tail,
}

/// Why a pattern was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError(&'static str);

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for PatternError {}

/// Longest pattern or subject accepted, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 512;

impl SubjectPattern {
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        if text.is_empty() {
            return Err(PatternError("must not be empty"));
        }
        if text.len() > MAX_SUBJECT_BYTES {
            return Err(PatternError("must be at most 512 bytes"));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(PatternError(
                "must not contain whitespace or control characters",
            ));
        }
        let parts: Vec<&str> = text.split('.').collect();
        let mut tokens = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let token = match *part {
                "" => return Err(PatternError("must not contain empty tokens")),
                "*" => Token::One,
                ">" if i + 1 == parts.len() => Token::Tail,
                ">" => return Err(PatternError("'>' may only be the last token")),
                p if p.contains('*') || p.contains('>') => {
                    return Err(PatternError("wildcards '*' and '>' must be whole tokens"))
                }
                p => Token::Literal(p.to_string()),
            };
            tokens.push(token);
        }
        Ok(SubjectPattern {
            text: text.to_string(),
            tokens,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the pattern has no wildcard.
    pub fn is_literal(&self) -> bool {
        self.tokens.iter().all(|t| matches!(t, Token::Literal(_)))
    }

    /// Does a concrete subject match? Subjects with wildcards or empty tokens never match.
    pub fn matches(&self, subject: &str) -> bool {
        let mut parts = subject.split('.');
        for token in &self.tokens {
            match token {
                Token::Tail => {
                    // One or more remaining non-empty tokens.
                    let mut any = false;
                    for part in parts.by_ref() {
                        if part.is_empty() || is_wildcard(part) {
                            return false;
                        }
                        any = true;
                    }
                    return any;
                }
                Token::One => match parts.next() {
                    Some(p) if !p.is_empty() && !is_wildcard(p) => {}
                    _ => return false,
                },
                Token::Literal(lit) => match parts.next() {
                    Some(p) if p == lit => {}
                    _ => return false,
                },
            }
        }
        parts.next().is_none()
    }

    /// Does some concrete subject match both patterns? Token by token: two literals must be
    /// equal, `*` takes any one token, and `>` takes whatever the other still has (at least
    /// one token).
    pub fn overlaps(&self, other: &SubjectPattern) -> bool {
        let (a, b) = (&self.tokens, &other.tokens);
        for i in 0..a.len().max(b.len()) {
            match (a.get(i), b.get(i)) {
                (Some(Token::Tail), Some(_)) | (Some(_), Some(Token::Tail)) => return true,
                (Some(Token::Literal(x)), Some(Token::Literal(y))) if x != y => return false,
                (Some(_), Some(_)) => {}
                // One pattern ended where the other still needs a token.
                _ => return false,
            }
        }
        true
    }
}

impl fmt::Display for SubjectPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A subject token that is itself a wildcard: such a subject is a pattern, not a concrete
/// subject (the broker refuses to publish to it), and matches nothing.
/// Whether a delivered subject is a literal subject: non-empty tokens, none a wildcard. The
/// broker answers a publish on `orders.*` with an error and stores it all the same; no pattern
/// matches such a subject, so a rule (a required signature) would be skipped: fail closed.
pub fn is_literal_subject(subject: &str) -> bool {
    subject
        .split('.')
        .all(|token| !token.is_empty() && !is_wildcard(token))
}

fn is_wildcard(token: &str) -> bool {
    token == "*" || token == ">"
}

/// A compiled first-match index over an ordered list of patterns: [`SubjectIndex::first_match`]
/// returns the lowest position whose pattern matches a subject, exactly as
/// `patterns.iter().position(|p| p.matches(subject))` does.
///
/// A token trie: each node has a branch per literal token, one for `*`, and the lowest position
/// of a pattern that ends there or ends there with `>`. A lookup walks the subject's tokens once
/// down the literal and `*` branches (each node is visited at most once, and a subtree whose
/// lowest position cannot beat the best found so far is skipped), so its cost is bounded by the
/// subject's tokens and the patterns that share its prefixes, not by the length of the list.
#[derive(Debug, Clone, Default)]
pub struct SubjectIndex {
    root: Node,
    /// Bytes of the longest literal token of any pattern: a longer subject token can only
    /// match a wildcard, and is never hashed to look it up.
    longest_literal: usize,
    /// Tokens of the longest pattern: a walk never reads deeper than one token past them.
    deepest: usize,
}

#[derive(Debug, Clone)]
struct Node {
    literal: HashMap<Box<str>, Node>,
    one: Option<Box<Node>>,
    /// Lowest position of a pattern that ends at this node.
    end: Option<usize>,
    /// Lowest position of a pattern that ends at this node with `>`.
    tail: Option<usize>,
    /// Lowest position of any pattern in this subtree (for pruning).
    min: usize,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            literal: HashMap::new(),
            one: None,
            end: None,
            tail: None,
            min: usize::MAX,
        }
    }
}

impl SubjectIndex {
    /// Compiles the patterns, in order (their positions are what [`Self::first_match`] returns).
    pub fn new<'a>(patterns: impl IntoIterator<Item = &'a SubjectPattern>) -> Self {
        let mut root = Node::default();
        let (mut longest_literal, mut deepest) = (0, 0);
        for (i, pattern) in patterns.into_iter().enumerate() {
            root.insert(&pattern.tokens, i);
            deepest = deepest.max(pattern.tokens.len());
            for token in &pattern.tokens {
                if let Token::Literal(lit) = token {
                    longest_literal = longest_literal.max(lit.len());
                }
            }
        }
        SubjectIndex {
            root,
            longest_literal,
            deepest,
        }
    }

    /// The lowest position whose pattern matches `subject`. A subject with an empty or
    /// wildcard token matches nothing, as [`SubjectPattern::matches`] says.
    pub fn first_match(&self, subject: &str) -> Option<usize> {
        if self.root.min == usize::MAX || !is_literal_subject(subject) {
            return None;
        }
        // Split once: a walk visits many nodes at one depth, and each re-reading a publisher's
        // 1 MiB token cost a lookup seconds (found by the attack on this index).
        // Tokens past the deepest pattern's only say "more follow" (what `>` needs): one is kept.
        // On the stack for subjects of up to STACK_TOKENS tokens: this runs per message and list.
        let mut parts = subject.split('.').take(self.deepest + 1);
        let mut stack = [""; STACK_TOKENS];
        let mut held = 0;
        for (slot, token) in stack.iter_mut().zip(&mut parts) {
            *slot = token;
            held += 1;
        }
        let deeper: Vec<&str>;
        let tokens: &[&str] = match parts.next() {
            None => &stack[..held],
            Some(next) => {
                deeper = stack.iter().copied().chain([next]).chain(parts).collect();
                &deeper
            }
        };
        let mut best = usize::MAX;
        self.root.walk(tokens, self.longest_literal, &mut best);
        (best != usize::MAX).then_some(best)
    }
}

/// Subject tokens a lookup holds without allocating.
const STACK_TOKENS: usize = 16;

impl Node {
    fn insert(&mut self, tokens: &[Token], i: usize) {
        self.min = self.min.min(i);
        match tokens.split_first() {
            None => {
                self.end.get_or_insert(i);
            }
            Some((Token::Tail, _)) => {
                self.tail.get_or_insert(i);
            }
            Some((Token::One, rest)) => self.one.get_or_insert_with(Box::default).insert(rest, i),
            Some((Token::Literal(lit), rest)) => self
                .literal
                .entry(lit.as_str().into())
                .or_default()
                .insert(rest, i),
        }
    }

    /// `rest`: the subject's tokens not yet consumed; every token is non-empty and no
    /// wildcard (checked by the caller). A token longer than `longest_literal` is no literal
    /// branch's: it is not hashed.
    fn walk(&self, rest: &[&str], longest_literal: usize, best: &mut usize) {
        if self.min >= *best {
            return;
        }
        let Some((token, after)) = rest.split_first() else {
            if let Some(i) = self.end {
                *best = (*best).min(i);
            }
            return;
        };
        if let Some(i) = self.tail {
            *best = (*best).min(i);
        }
        if token.len() <= longest_literal {
            if let Some(child) = self.literal.get(*token) {
                child.walk(after, longest_literal, best);
            }
        }
        if let Some(child) = &self.one {
            child.walk(after, longest_literal, best);
        }
    }
}

/// The most rules a subject rule list of a config may hold (route lists included): an index
/// of 10,000 patterns of 256 distinct tokens took 1.2 GiB (the attack on the index). Readers
/// take a list with `ObjectReader::objects_at_most`, which reads no more than this: compiling
/// all of a generated 5,000-rule list before refusing it took 730 MiB (the second attack).
pub const MAX_RULES: usize = 1000;

/// Lists of at most this many rules are scanned, not looked up in their index.
pub const LINEAR_RULES: usize = 4;

/// A rule of a first-match subject rule list.
pub trait SubjectRule {
    /// The pattern the rule applies to.
    fn pattern(&self) -> &SubjectPattern;
}

/// An ordered list of subject rules with its compiled [`SubjectIndex`]: built once at config
/// load, read as a slice (for validation and display, in config order), and asked for the first
/// rule that matches a subject with [`Self::first_match`].
#[derive(Clone)]
pub struct SubjectRules<T> {
    rules: Vec<T>,
    index: SubjectIndex,
}

impl<T: SubjectRule> SubjectRules<T> {
    pub fn new(rules: Vec<T>) -> Self {
        let index = SubjectIndex::new(rules.iter().map(T::pattern));
        SubjectRules { rules, index }
    }

    /// The first rule (in config order) whose pattern matches `subject`, with its position.
    /// Up to [`LINEAR_RULES`] rules are scanned in order: for so few, matching each costs less
    /// than hashing the subject's tokens into the index (`cargo bench --bench subject_rules`).
    pub fn first_match(&self, subject: &str) -> Option<(usize, &T)> {
        if self.rules.len() <= LINEAR_RULES {
            return self
                .rules
                .iter()
                .enumerate()
                .find(|(_, rule)| rule.pattern().matches(subject));
        }
        let i = self.index.first_match(subject)?;
        Some((i, &self.rules[i]))
    }
}

impl<T> Default for SubjectRules<T> {
    fn default() -> Self {
        SubjectRules {
            rules: Vec::new(),
            index: SubjectIndex::default(),
        }
    }
}

impl<T: SubjectRule> From<Vec<T>> for SubjectRules<T> {
    fn from(rules: Vec<T>) -> Self {
        SubjectRules::new(rules)
    }
}

impl<T: SubjectRule> FromIterator<T> for SubjectRules<T> {
    fn from_iter<I: IntoIterator<Item = T>>(rules: I) -> Self {
        SubjectRules::new(rules.into_iter().collect())
    }
}

impl<T> Deref for SubjectRules<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.rules
    }
}

impl<'a, T> IntoIterator for &'a SubjectRules<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.rules.iter()
    }
}

/// Shows the rules (the index is derived from them).
impl<T: fmt::Debug> fmt::Debug for SubjectRules<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.rules.fmt(f)
    }
}

/// Two lists are equal when their rules are (the index is derived from them).
impl<T: PartialEq> PartialEq for SubjectRules<T> {
    fn eq(&self, other: &Self) -> bool {
        self.rules == other.rules
    }
}

impl<T: Eq> Eq for SubjectRules<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_patterns_share_a_subject() {
        let o = |a: &str, b: &str| {
            let (a, b) = (
                SubjectPattern::parse(a).unwrap(),
                SubjectPattern::parse(b).unwrap(),
            );
            assert_eq!(a.overlaps(&b), b.overlaps(&a), "symmetric");
            a.overlaps(&b)
        };
        for (a, b) in [
            ("orders.a", "orders.a"),
            ("orders.*", "orders.a"),
            ("orders.>", "orders.a.b"),
            ("orders.*.b", "orders.a.*"),
            ("*.a", "orders.*"),
            (">", "x"),
            ("orders.>", "*.*.c"),
        ] {
            assert!(o(a, b), "{a} / {b}");
        }
        for (a, b) in [
            ("orders.a", "orders.b"),
            ("orders.*", "orders"),
            ("orders.>", "orders"),
            ("orders.*", "orders.a.b"),
            ("orders.*.b", "orders.a.c"),
            ("orders.>", "payments.>"),
            ("a.b", "a.b.c"),
        ] {
            assert!(!o(a, b), "{a} / {b}");
        }
    }

    fn m(p: &str, s: &str) -> bool {
        SubjectPattern::parse(p).unwrap().matches(s)
    }

    #[test]
    fn literal_and_wildcards() {
        assert!(m("orders.created", "orders.created"));
        assert!(!m("orders.created", "orders.created.eu"));
        assert!(!m("orders.created", "orders"));
        assert!(m("orders.*", "orders.created"));
        assert!(!m("orders.*", "orders"));
        assert!(!m("orders.*", "orders.a.b"));
        assert!(m("orders.>", "orders.a"));
        assert!(m("orders.>", "orders.a.b.c"));
        assert!(!m("orders.>", "orders"));
        assert!(m(">", "a"));
        assert!(m(">", "a.b"));
        assert!(m("*.*", "a.b"));
        assert!(!m("*.*", "a"));
        assert!(m("*.b.>", "a.b.c"));
        assert!(!m("*.b.>", "a.c.c"));
    }

    #[test]
    fn malformed_subjects_never_match() {
        assert!(!m("orders.*", "orders."));
        assert!(!m("orders.>", "orders..x"));
        assert!(!m("*", ""));
        assert!(!m("a.*.c", "a..c"));
    }

    #[test]
    fn wildcard_subjects_never_match() {
        assert!(!m("*", "*"));
        assert!(!m(">", ">"));
        assert!(!m("a.>", "a.b.*"));
        assert!(!m("a.*", "a.>"));
        assert!(!m("a", "*"));
        assert!(m("a.>", "a.b*"), "'b*' is an ordinary token in a subject");
    }

    #[test]
    fn rejects_bad_patterns() {
        for bad in [
            "", "a..b", ".a", "a.", "a.>.b", "a*", "a.b>", "a b", "a.\u{1}", "> ",
        ] {
            assert!(SubjectPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(SubjectPattern::parse(&"a.".repeat(300)).is_err());
    }

    /// Randomised check against a reference implementation written the obvious way.
    #[test]
    fn randomised_against_reference() {
        fn reference(p: &str, s: &str) -> bool {
            let pt: Vec<&str> = p.split('.').collect();
            let st: Vec<&str> = s.split('.').collect();
            if st.iter().any(|t| t.is_empty()) {
                return false;
            }
            for (i, t) in pt.iter().enumerate() {
                if *t == ">" {
                    return st.len() > i;
                }
                match st.get(i) {
                    None => return false,
                    Some(x) if *t == "*" || t == x => {}
                    Some(_) => return false,
                }
            }
            st.len() == pt.len()
        }
        let alphabet = ["a", "b", "*", ">", "", "ab"];
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut checked = 0;
        for _ in 0..20_000 {
            let n = 1 + (next() % 4) as usize;
            let p: Vec<&str> = (0..n).map(|_| alphabet[(next() % 6) as usize]).collect();
            let k = 1 + (next() % 4) as usize;
            let s: Vec<&str> = (0..k)
                .map(|_| ["a", "b", "ab", ""][(next() % 4) as usize])
                .collect();
            let (p, s) = (p.join("."), s.join("."));
            if let Ok(pat) = SubjectPattern::parse(&p) {
                assert_eq!(pat.matches(&s), reference(&p, &s), "{p} vs {s}");
                checked += 1;
            }
        }
        assert!(checked > 1000);
    }

    /// Grammar corner cases: a reference validator and matcher written the obvious way are
    /// compared with the real ones on generated patterns and subjects (whitespace, control and
    /// non-ASCII characters, partial wildcards, empty tokens, wildcard subjects, long inputs).
    #[test]
    fn randomised_grammar_corner_cases() {
        fn valid(p: &str) -> bool {
            if p.is_empty() || p.len() > MAX_SUBJECT_BYTES {
                return false;
            }
            if p.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return false;
            }
            let t: Vec<&str> = p.split('.').collect();
            t.iter().enumerate().all(|(i, tok)| {
                !tok.is_empty()
                    && (*tok == "*"
                        || (*tok == ">" && i + 1 == t.len())
                        || (!tok.contains('*') && !tok.contains('>')))
            })
        }
        fn matches(p: &str, s: &str) -> bool {
            let pt: Vec<&str> = p.split('.').collect();
            let st: Vec<&str> = s.split('.').collect();
            if st.iter().any(|t| t.is_empty() || *t == "*" || *t == ">") {
                return false;
            }
            match pt.last() {
                Some(&">") => {
                    st.len() >= pt.len()
                        && pt[..pt.len() - 1]
                            .iter()
                            .zip(&st)
                            .all(|(a, b)| *a == "*" || a == b)
                }
                _ => pt.len() == st.len() && pt.iter().zip(&st).all(|(a, b)| *a == "*" || a == b),
            }
        }
        let tokens = [
            "a", "b", "*", ">", "", "ab", "a*", "*a", ">a", "a>", " ", "a b", "\t", "\u{1}", "é",
            "日本", "-", "_", "$JS", "A",
        ];
        let mut seed: u64 = 0xD1B5_4A32_D192_ED03;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut parsed, mut refused) = (0, 0);
        for i in 0..50_000 {
            let n = 1 + (next() % 6) as usize;
            let mut p: Vec<&str> = (0..n)
                .map(|_| tokens[(next() % tokens.len() as u64) as usize])
                .collect();
            let long;
            if i % 997 == 0 {
                long = "x".repeat(500);
                p.push(&long);
            }
            let p = p.join(".");
            let k = 1 + (next() % 6) as usize;
            let s: Vec<&str> = (0..k)
                .map(|_| tokens[(next() % tokens.len() as u64) as usize])
                .collect();
            let s = s.join(".");
            match SubjectPattern::parse(&p) {
                Ok(pat) => {
                    assert!(valid(&p), "accepted {p:?}");
                    assert_eq!(pat.matches(&s), matches(&p, &s), "{p:?} vs {s:?}");
                    assert_eq!(pat.as_str(), p);
                    parsed += 1;
                }
                Err(e) => {
                    assert!(!valid(&p), "refused {p:?}: {e}");
                    assert!(
                        e.to_string().starts_with("must")
                            || e.to_string().starts_with("'>'")
                            || e.to_string().starts_with("wildcards"),
                        "{e}"
                    );
                    refused += 1;
                }
            }
        }
        assert!(parsed > 2_000 && refused > 2_000, "{parsed} {refused}");
    }

    /// The index and the linear scan give the same rule for every subject: generated rule
    /// lists (1 to 40 patterns, duplicates and every wildcard shape included) against
    /// generated subjects (wildcard and empty tokens included), 50,000 lookups.
    #[test]
    fn index_agrees_with_the_linear_scan() {
        let pattern_tokens = ["a", "b", "c", "ab", "*", ">"];
        let subject_tokens = ["a", "b", "c", "ab", "d", "", "*", ">"];
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut matched = 0;
        for _ in 0..500 {
            let count = 1 + (next() % 40) as usize;
            let mut patterns = Vec::new();
            while patterns.len() < count {
                let n = 1 + (next() % 5) as usize;
                let p: Vec<&str> = (0..n)
                    .map(|_| pattern_tokens[(next() % pattern_tokens.len() as u64) as usize])
                    .collect();
                if let Ok(p) = SubjectPattern::parse(&p.join(".")) {
                    patterns.push(p);
                }
            }
            let index = SubjectIndex::new(&patterns);
            for _ in 0..100 {
                let k = 1 + (next() % 6) as usize;
                let s: Vec<&str> = (0..k)
                    .map(|_| subject_tokens[(next() % subject_tokens.len() as u64) as usize])
                    .collect();
                let s = s.join(".");
                let linear = patterns.iter().position(|p| p.matches(&s));
                assert_eq!(index.first_match(&s), linear, "{s:?} in {patterns:?}");
                matched += usize::from(linear.is_some());
            }
        }
        assert!(matched > 5_000 && matched < 45_000, "{matched}");
    }

    #[test]
    fn index_keeps_the_lowest_position() {
        let patterns: Vec<SubjectPattern> = ["a.>", "a.b", "*.b", "a.b", ">"]
            .iter()
            .map(|p| SubjectPattern::parse(p).unwrap())
            .collect();
        let index = SubjectIndex::new(&patterns);
        assert_eq!(index.first_match("a.b"), Some(0));
        assert_eq!(index.first_match("x.b"), Some(2));
        assert_eq!(index.first_match("x"), Some(4));
        assert_eq!(index.first_match("a"), Some(4));
        assert_eq!(index.first_match("a..b"), None);
        assert_eq!(SubjectIndex::default().first_match("a"), None);
    }

    /// Short lists (scanned) and long ones (indexed) answer alike.
    #[test]
    fn rule_lists_agree_on_both_sides_of_the_linear_bound() {
        #[derive(Debug)]
        struct Rule(SubjectPattern);
        impl SubjectRule for Rule {
            fn pattern(&self) -> &SubjectPattern {
                &self.0
            }
        }
        let texts = [
            "a.b", "a.*", "*.b", "a.>", ">", "c.d", "c.*.e", "*.*", "a.b.c", "b",
        ];
        for len in 1..=texts.len() {
            let rules: SubjectRules<Rule> = texts[..len]
                .iter()
                .rev()
                .map(|t| Rule(SubjectPattern::parse(t).unwrap()))
                .collect();
            for subject in [
                "a.b", "x.b", "c.d", "c.x.e", "b", "a.b.c", "q", "a..b", "a.*",
            ] {
                let linear = rules.iter().position(|r| r.0.matches(subject));
                assert_eq!(
                    rules.first_match(subject).map(|(i, _)| i),
                    linear,
                    "{len} {subject}"
                );
            }
        }
    }
}

#[cfg(test)]
#[path = "subject_attack_tests.rs"]
mod attack_tests;

#[cfg(test)]
#[path = "subject_index_attack_tests.rs"]
mod index_attack;
