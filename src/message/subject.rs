//! Subject patterns: the one matcher for the whole runtime (label rules, metadata rules, table
//! routing, fan-out routes, subject families, exporter subject rules).
//!
//! Grammar (the broker's): tokens separated by `.`; `*` matches exactly one token; `>` matches
//! one or more trailing tokens and may only be the last token. Tokens are non-empty and contain
//! no whitespace. A literal subject is a pattern without wildcards. Rule lists pick the first
//! rule whose pattern matches (`rules.iter().find(|r| r.pattern.matches(subject))`).

use std::fmt;

use crate::document::reader::ObjectReader;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
