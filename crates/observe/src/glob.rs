//! Glob patterns over metric suffixes (`allowed_metric_patterns`, `denied_metric_patterns`).
//!
//! Grammar: `*` matches any run of characters (including none), `?` matches exactly one
//! character, every other character matches itself. Suffixes and patterns are ASCII metric-name
//! characters, so matching works on bytes. There are no character classes or escapes: the
//! metric-name alphabet has nothing to escape.

/// True when `text` matches the glob `pattern` as a whole.
///
/// Iterative with single backtracking point (the classic wildcard algorithm): linear in
/// practice, `O(len(pattern) * len(text))` at worst, never recursive.
pub fn matches(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let t = text.as_bytes();
    let (mut pi, mut ti) = (0usize, 0usize);
    // Position after the last `*` seen, and the text position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi + 1, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            // Let the last `*` swallow one more character and retry.
            pi = sp;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A valid glob: 1 to 128 bytes of `[A-Za-z0-9_*?]`. A lone `*` is allowed: it means "every
/// metric", which an operator may intend (deny lists and the other gates still apply).
pub fn is_valid(pattern: &str) -> bool {
    !pattern.is_empty()
        && pattern.len() <= 128
        && pattern
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'*' || b == b'?')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_and_question_marks() {
        assert!(matches("messages_*", "messages_acked_total"));
        assert!(matches("messages_*", "messages_"));
        assert!(!matches("messages_*", "message_acked_total"));
        assert!(matches("*_total", "db_duplicates_total"));
        assert!(!matches("*_total", "sink_batch_write_seconds"));
        assert!(matches("*", ""));
        assert!(matches("*", "anything"));
        assert!(matches(
            "event_age_at_???????_seconds",
            "event_age_at_receive_seconds"
        ));
        assert!(!matches(
            "event_age_at_???_seconds",
            "event_age_at_receive_seconds"
        ));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(matches("a*b*c", "abc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
        assert!(!matches("", "x"));
        assert!(matches("", ""));
        assert!(matches("**a", "ba"));
    }

    /// Cross-check against a recursive reference on random inputs.
    #[test]
    fn randomised_against_reference() {
        fn reference(p: &[u8], t: &[u8]) -> bool {
            match (p.first(), t.first()) {
                (None, None) => true,
                (None, Some(_)) => false,
                (Some(b'*'), _) => {
                    reference(&p[1..], t) || (!t.is_empty() && reference(p, &t[1..]))
                }
                (Some(_), None) => false,
                (Some(&c), Some(&d)) => (c == b'?' || c == d) && reference(&p[1..], &t[1..]),
            }
        }
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let plen = (next() % 6) as usize;
            let tlen = (next() % 7) as usize;
            let p: String = (0..plen)
                .map(|_| ['a', 'b', '*', '?'][(next() % 4) as usize])
                .collect();
            let t: String = (0..tlen)
                .map(|_| ['a', 'b'][(next() % 2) as usize])
                .collect();
            assert_eq!(
                matches(&p, &t),
                reference(p.as_bytes(), t.as_bytes()),
                "{p} vs {t}"
            );
        }
    }

    #[test]
    fn validity() {
        assert!(is_valid("messages_*"));
        assert!(is_valid("*"));
        assert!(!is_valid(""));
        assert!(!is_valid("messages.*"));
        assert!(!is_valid("[a]*"));
        assert!(!is_valid(&"a".repeat(129)));
    }
}
