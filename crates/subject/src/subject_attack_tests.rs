//! Hostile review of the subject-rule index (issue 50): differential tests with adversarial
//! alphabets against the linear first-match scan. Cost figures: `cargo bench --bench
//! subject_hostile`.

use super::*;

#[derive(Debug)]
pub(super) struct Rule(pub(super) SubjectPattern);

impl SubjectRule for Rule {
    fn pattern(&self) -> &SubjectPattern {
        &self.0
    }
}

pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        // splitmix64: every seed, including small ones, gives a full-period stream.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(super) fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

/// The contract: the first pattern, in config order, whose `matches` says yes.
pub(super) fn linear(patterns: &[SubjectPattern], subject: &str) -> Option<usize> {
    patterns.iter().position(|p| p.matches(subject))
}

/// Reference matcher written from the NATS rules, independent of `SubjectPattern::matches`.
fn reference(p: &str, s: &str) -> bool {
    let pt: Vec<&str> = p.split('.').collect();
    let st: Vec<&str> = s.split('.').collect();
    if st.iter().any(|t| t.is_empty() || *t == "*" || *t == ">") {
        return false;
    }
    let fixed = if pt.last() == Some(&">") {
        if st.len() < pt.len() {
            return false;
        }
        pt.len() - 1
    } else {
        if st.len() != pt.len() {
            return false;
        }
        pt.len()
    };
    pt[..fixed]
        .iter()
        .zip(&st)
        .all(|(a, b)| *a == "*" || a == b)
}

const PATTERN_TOKENS: &[&str] = &[
    "a",
    "b",
    "*",
    ">",
    "é",
    "日本",
    "a\u{0}",
    "\u{feff}",
    "$JS",
    "A",
    "a*",
    ">x",
    "",
    "x\u{202e}",
];
const SUBJECT_TOKENS: &[&str] = &[
    "a",
    "b",
    "*",
    ">",
    "",
    "é",
    "日本",
    "a\u{0}",
    "\u{0}",
    "\u{1}",
    " ",
    "a b",
    "\u{feff}",
    "$JS",
    "A",
    "a*",
    ">x",
    "**",
    ">>",
    "x\u{202e}",
    "．",
];

fn gen_patterns(rng: &mut Rng, count: usize, max_tokens: usize) -> Vec<SubjectPattern> {
    let mut out: Vec<SubjectPattern> = Vec::new();
    while out.len() < count {
        // Duplicates on purpose: one in five repeats an earlier pattern.
        if !out.is_empty() && rng.below(5) == 0 {
            let again = out[rng.below(out.len())].clone();
            out.push(again);
            continue;
        }
        let n = 1 + rng.below(max_tokens);
        let p: Vec<&str> = (0..n).map(|_| rng.pick(PATTERN_TOKENS)).collect();
        if let Ok(p) = SubjectPattern::parse(&p.join(".")) {
            out.push(p);
        }
    }
    out
}

fn gen_subject(rng: &mut Rng, max_tokens: usize) -> String {
    let k = 1 + rng.below(max_tokens);
    let mut s: Vec<String> = (0..k)
        .map(|_| rng.pick(SUBJECT_TOKENS).to_string())
        .collect();
    if rng.below(30) == 0 {
        s.push("x".repeat(600));
    }
    let mut s = s.join(".");
    match rng.below(12) {
        0 => s.insert(0, '.'),
        1 => s.push('.'),
        2 => s = s.replacen('.', "..", 1),
        3 => s.clear(),
        _ => {}
    }
    s
}

/// Adversarial alphabet, duplicates, rule counts on both sides of [`LINEAR_RULES`]:
/// `SubjectRules::first_match`, `SubjectIndex::first_match` and the linear scan agree, and
/// `matches` agrees with an independent reference.
#[test]
fn adversarial_alphabet_agrees_with_the_linear_scan() {
    let mut rng = Rng(0xA076_1D64_78BD_642F);
    let (mut lookups, mut hits) = (0usize, 0usize);
    for round in 0..1_500 {
        let count = match round % 3 {
            0 => 1 + rng.below(LINEAR_RULES + 3),
            1 => LINEAR_RULES + 1 + rng.below(4),
            _ => 1 + rng.below(60),
        };
        let patterns = gen_patterns(&mut rng, count, 5);
        let rules: SubjectRules<Rule> = patterns.iter().cloned().map(Rule).collect();
        let index = SubjectIndex::new(&patterns);
        for _ in 0..60 {
            let s = gen_subject(&mut rng, 6);
            let want = linear(&patterns, &s);
            for p in &patterns {
                assert_eq!(p.matches(&s), reference(p.as_str(), &s), "{p} vs {s:?}");
            }
            assert_eq!(index.first_match(&s), want, "{s:?} in {patterns:?}");
            assert_eq!(
                rules.first_match(&s).map(|(i, _)| i),
                want,
                "{s:?} in {patterns:?}"
            );
            lookups += 1;
            hits += usize::from(want.is_some());
        }
    }
    assert!(hits > 5_000 && hits < lookups - 5_000, "{hits}/{lookups}");
}

/// Subjects built from the patterns themselves (each wildcard replaced by a token, `>` by one
/// to three tokens), so most lookups hit, deep in the trie and at every depth up to 256.
#[test]
fn subjects_derived_from_the_rules_agree() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let lits = ["a", "b", "c"];
    let mut hits = 0usize;
    for round in 0..400 {
        let max_tokens = if round % 4 == 0 { 256 } else { 8 };
        let count = 5 + rng.below(80);
        let mut patterns = Vec::new();
        while patterns.len() < count {
            let n = 1 + rng.below(max_tokens);
            let p: Vec<&str> = (0..n)
                .map(|_| match rng.below(5) {
                    0 => "*",
                    1 => ">",
                    _ => rng.pick(&lits),
                })
                .collect();
            if let Ok(p) = SubjectPattern::parse(&p.join(".")) {
                patterns.push(p);
            }
        }
        let index = SubjectIndex::new(&patterns);
        for _ in 0..80 {
            let src = &patterns[rng.below(patterns.len())];
            let mut s: Vec<&str> = Vec::new();
            for t in src.as_str().split('.') {
                match t {
                    "*" => s.push(rng.pick(&lits)),
                    ">" => (0..1 + rng.below(3)).for_each(|_| s.push(rng.pick(&lits))),
                    t => s.push(t),
                }
            }
            if rng.below(8) == 0 {
                s.pop();
            }
            let s = s.join(".");
            let want = linear(&patterns, &s);
            assert_eq!(index.first_match(&s), want, "{s:?} in {patterns:?}");
            hits += usize::from(want.is_some());
        }
    }
    assert!(hits > 20_000, "{hits}");
}

/// The lowest position sits at the bottom of a `>` branch under many higher-positioned
/// shallower rules, and `*` vs `>` vs a literal at one depth.
#[test]
fn lowest_position_deep_and_star_vs_tail_at_one_depth() {
    let deep = format!("{}>", "*.".repeat(200));
    let mut texts: Vec<String> = vec!["a.b".into(), "a.*".into(), "a.>".into(), "*.>".into()];
    texts.insert(0, deep.clone());
    for i in 0..50 {
        texts.push("a.".repeat(i % 10) + "z");
    }
    let patterns: Vec<SubjectPattern> = texts
        .iter()
        .map(|t| SubjectPattern::parse(t).unwrap())
        .collect();
    let index = SubjectIndex::new(&patterns);
    for s in [
        "a.b".to_string(),
        "a.b.c".to_string(),
        "a".to_string(),
        "a.".repeat(200) + "a",
        "a.".repeat(201) + "a",
        "a.".repeat(199) + "a",
        "a.".repeat(9) + "z",
    ] {
        assert_eq!(index.first_match(&s), linear(&patterns, &s), "{s}");
    }
    assert_eq!(index.first_match(&("a.".repeat(200) + "a")), Some(0));
}

/// Config-side extremes: the longest accepted pattern (256 tokens), the first refused, and a
/// list of 2,000 such patterns compile, answer and drop without overflowing the test stack.
#[test]
fn deepest_patterns_compile_walk_and_drop() {
    let max = format!("{}a", "a.".repeat(255));
    assert_eq!(max.split('.').count(), 256);
    assert!(SubjectPattern::parse(&max).is_ok());
    assert!(SubjectPattern::parse(&format!("{}a", "a.".repeat(256))).is_err());
    let mut patterns = Vec::new();
    for i in 0..2_000usize {
        let mut t: Vec<String> = vec!["a".into(); 254];
        t[253] = format!("{}", i % 10);
        t.push(if i % 2 == 0 { "*".into() } else { ">".into() });
        patterns.push(SubjectPattern::parse(&t.join(".")).unwrap());
    }
    let index = SubjectIndex::new(&patterns);
    let s = format!("{}.5.x", vec!["a"; 253].join("."));
    assert_eq!(index.first_match(&s), linear(&patterns, &s));
    assert_eq!(index.first_match(&s), Some(5));
    drop(index);
}
