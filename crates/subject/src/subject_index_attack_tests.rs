//! Second hostile review of the subject-rule index (issue 50, helper branch atk-index): what
//! the first review's generators did not reach. Exhaustive small universes (every ordered list
//! of up to three patterns against every short subject), rule orders shuffled so the lowest
//! position moves around the trie (the pruning), the two bounds the lookup added after the first
//! review (tokens longer than the longest literal are not hashed; tokens past the deepest
//! pattern are dropped) probed at one byte and one token either side, multi-byte and
//! canonically-equivalent tokens, and `SubjectRules` forced onto its index path by padding.
//! Cost and memory figures: `cargo bench --bench subject_hostile`.

use super::*;

use super::attack_tests::{linear, Rng, Rule};

fn p(text: &str) -> SubjectPattern {
    SubjectPattern::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

/// Never matches a subject drawn from the alphabets below (a token none of them uses).
const NEVER: &str = "zz.zz.zz.zz.zz.zz.zz.zz.zz";

/// Asks the index directly, and `SubjectRules` both as given (scanned when short) and padded
/// past [`LINEAR_RULES`] with never-matching rules, after (positions kept) and before
/// (positions shifted), so both of its paths answer for every list.
fn check_all_ways(patterns: &[SubjectPattern], subjects: &[String]) -> usize {
    let index = SubjectIndex::new(patterns);
    let plain: SubjectRules<Rule> = patterns.iter().cloned().map(Rule).collect();
    let pad = LINEAR_RULES + 1;
    let after: SubjectRules<Rule> = patterns
        .iter()
        .cloned()
        .chain((0..pad).map(|_| p(NEVER)))
        .map(Rule)
        .collect();
    let before: SubjectRules<Rule> = (0..pad)
        .map(|_| p(NEVER))
        .chain(patterns.iter().cloned())
        .map(Rule)
        .collect();
    let mut hits = 0;
    for s in subjects {
        let want = linear(patterns, s);
        let ctx = || format!("subject {s:?} in {:?}", texts(patterns));
        assert_eq!(index.first_match(s), want, "index: {}", ctx());
        assert_eq!(
            plain.first_match(s).map(|(i, _)| i),
            want,
            "rules: {}",
            ctx()
        );
        assert_eq!(
            after.first_match(s).map(|(i, _)| i),
            want,
            "padded after: {}",
            ctx()
        );
        assert_eq!(
            before.first_match(s).map(|(i, _)| i),
            want.map(|i| i + pad),
            "padded before: {}",
            ctx()
        );
        hits += usize::from(want.is_some());
    }
    hits
}

fn texts(patterns: &[SubjectPattern]) -> Vec<&str> {
    patterns.iter().map(SubjectPattern::as_str).collect()
}

/// Every valid pattern of 1 to `depth` tokens over `tokens` (`>` only last).
fn all_patterns(tokens: &[&str], depth: usize) -> Vec<SubjectPattern> {
    let mut out = Vec::new();
    let mut frontier: Vec<Vec<&str>> = vec![vec![]];
    for _ in 0..depth {
        let mut next = Vec::new();
        for prefix in &frontier {
            for t in tokens {
                let mut v = prefix.clone();
                v.push(t);
                if let Ok(pat) = SubjectPattern::parse(&v.join(".")) {
                    out.push(pat);
                    if *t != ">" {
                        next.push(v);
                    }
                }
            }
        }
        frontier = next;
    }
    out
}

/// Every subject of 1 to `depth` tokens over `tokens`, and malformed ones.
fn all_subjects(tokens: &[&str], depth: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut frontier: Vec<String> = vec![String::new()];
    for d in 0..depth {
        let mut next = Vec::new();
        for prefix in &frontier {
            for t in tokens {
                let s = if d == 0 {
                    t.to_string()
                } else {
                    format!("{prefix}.{t}")
                };
                out.push(s.clone());
                next.push(s);
            }
        }
        frontier = next;
    }
    for bad in [
        "", ".", "..", "a.", ".a", "a..b", "*", ">", "a.*", "a.>", "*.a", ">.a", "a.b.", "a b",
    ] {
        out.push(bad.to_string());
    }
    out
}

/// Every ordered list of one or two patterns of up to three tokens over {a, b, *, >}, and every
/// ordered list of three of up to two tokens, against every subject of up to four tokens over
/// {a, b, c} (and malformed ones): the index, the scan and both padded lists agree.
#[test]
fn exhaustive_small_universe_agrees() {
    let subjects = all_subjects(&["a", "b", "c"], 4);
    let deep = all_patterns(&["a", "b", "*", ">"], 3);
    let shallow = all_patterns(&["a", "b", "*", ">"], 2);
    assert_eq!((deep.len(), shallow.len()), (52, 16));
    let (mut lists, mut hits) = (0usize, 0usize);
    for x in &deep {
        hits += check_all_ways(std::slice::from_ref(x), &subjects);
        lists += 1;
        for y in &deep {
            hits += check_all_ways(&[x.clone(), y.clone()], &subjects);
            lists += 1;
        }
    }
    for x in &shallow {
        for y in &shallow {
            for z in &shallow {
                hits += check_all_ways(&[x.clone(), y.clone(), z.clone()], &subjects);
                lists += 1;
            }
        }
    }
    assert_eq!(lists, 52 + 52 * 52 + 16 * 16 * 16);
    assert!(hits > 100_000, "{hits}");
}

/// One set of overlapping patterns (literal, `*` and `>` at every depth, duplicates) in 1,000
/// shuffled orders: wherever the lowest position sits in the trie, the pruning keeps it.
#[test]
fn shuffled_rule_orders_agree() {
    let base: Vec<SubjectPattern> = [
        "a", "a.b", "a.*", "a.>", "*", "*.b", "*.>", ">", "a.b.c", "a.*.c", "*.*.c", "a.b.>",
        "*.b.>", "a.*.>", "*.*.*", "a.b.c.d", "*.*.*.*", "a.*.*.>", "b.>", "a.b", "*.b", ">",
        "c.*", "a.b.c.>",
    ]
    .iter()
    .map(|t| p(t))
    .collect();
    let subjects = all_subjects(&["a", "b", "c", "d"], 4);
    let mut rng = Rng(7);
    let mut hits = 0;
    for round in 0..1_000 {
        let mut list = base.clone();
        for i in (1..list.len()).rev() {
            list.swap(i, rng.below(i + 1));
        }
        list.truncate(1 + round % base.len());
        hits += check_all_ways(&list, &subjects);
    }
    assert!(hits > 50_000, "{hits}");
}

/// Literal tokens of lengths next to each other (ASCII and two-byte characters, a precomposed
/// and a decomposed "é", case variants) and subject tokens one byte longer than the longest
/// literal of the list; subjects derived from the patterns with up to three tokens appended
/// (past the deepest pattern, which the lookup drops) or the last removed. Many seeds.
#[test]
fn bounds_of_the_lookup_agree() {
    const LITS: &[&str] = &[
        "x",
        "xx",
        "xxx",
        "X",
        "\u{e9}",
        "\u{e9}\u{e9}",
        "e\u{301}",
        "ab",
        "a",
        "\u{1F600}",
    ];
    const EXTRA: &[&str] = &[
        "x",
        "xx",
        "xxx",
        "xxxx",
        "xxxxx",
        "X",
        "\u{e9}",
        "\u{e9}\u{e9}",
        "\u{e9}\u{e9}\u{e9}",
        "e\u{301}",
        "e",
        "ab",
        "abc",
        "a",
        "\u{1F600}",
        "\u{1F600}x",
    ];
    let mut total_hits = 0;
    for seed in 0..400u64 {
        let mut rng = Rng(seed);
        let count = 1 + rng.below(3 * LINEAR_RULES);
        let max_depth = 1 + rng.below(7);
        let mut patterns = Vec::new();
        while patterns.len() < count {
            let n = 1 + rng.below(max_depth);
            let t: Vec<&str> = (0..n)
                .map(|_| match rng.below(6) {
                    0 => "*",
                    1 => ">",
                    _ => rng.pick(LITS),
                })
                .collect();
            if let Ok(pat) = SubjectPattern::parse(&t.join(".")) {
                patterns.push(pat);
            }
        }
        let longest = patterns
            .iter()
            .flat_map(|p| p.as_str().split('.'))
            .filter(|t| *t != "*" && *t != ">")
            .map(str::len)
            .max()
            .unwrap_or(0);
        let one_longer = "x".repeat(longest + 1);
        let mut subjects = Vec::new();
        for _ in 0..150 {
            let src = patterns[rng.below(patterns.len())].as_str();
            let mut s: Vec<&str> = Vec::new();
            for t in src.split('.') {
                match t {
                    "*" => s.push(rng.pick(EXTRA)),
                    ">" => (0..1 + rng.below(3)).for_each(|_| s.push(rng.pick(EXTRA))),
                    t => s.push(t),
                }
            }
            match rng.below(6) {
                0 => {
                    s.pop();
                }
                1 => (0..1 + rng.below(3)).for_each(|_| s.push(rng.pick(EXTRA))),
                2 => {
                    let i = rng.below(s.len());
                    s[i] = &one_longer;
                }
                3 => {
                    let i = rng.below(s.len());
                    s[i] = rng.pick(EXTRA);
                }
                _ => {}
            }
            subjects.push(s.join("."));
        }
        total_hits += check_all_ways(&patterns, &subjects);
    }
    assert!(total_hits > 20_000, "{total_hits}");
}

/// The two bounds exactly: a subject token of the longest literal's length is looked up, one
/// byte longer is not (and still matches `*`); a subject one, two and many tokens deeper than
/// the deepest pattern matches its `>` and no literal end.
#[test]
fn bound_edges_by_hand() {
    let list: Vec<SubjectPattern> = ["q.r", "q.r.s", "xxxx.zz", "*.zz", "a.b.>", "a.b.c", "*.*.*"]
        .iter()
        .map(|t| p(t))
        .collect();
    let subjects: Vec<String> = [
        "xxxx.zz",
        "xxxxx.zz",
        "xxx.zz",
        "a.b.c",
        "a.b.c.d",
        "a.b.c.d.e",
        "a.b",
        "a.x.c",
        "q.r.s",
        "q.r.s.t",
        "\u{e9}\u{e9}.zz",
        "\u{e9}\u{e9}\u{e9}.zz",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(std::iter::once(format!(
        "a.b.{}",
        vec!["c"; 100_000].join(".")
    )))
    .collect();
    check_all_ways(&list, &subjects);
    let index = SubjectIndex::new(&list);
    assert_eq!(index.first_match("xxxx.zz"), Some(2));
    assert_eq!(index.first_match("xxxxx.zz"), Some(3));
    assert_eq!(index.first_match("a.b.c"), Some(4));
    assert_eq!(index.first_match("a.b.c.d.e"), Some(4));
    assert_eq!(index.first_match("a.x.c"), Some(6));
}

/// Hostile subjects against a list at the cap (1,000 rules, every wildcard shape): subjects of
/// 100,000 tokens, a 1 MiB token, 256 tokens each as long as the longest literal.
#[test]
fn hostile_subjects_at_the_cap_agree() {
    let mut rng = Rng(0xC0FF_EE00);
    let toks = ["a", "b", "*", "*", ">"];
    let mut patterns = Vec::new();
    while patterns.len() < MAX_RULES {
        let n = 1 + rng.below(12);
        let t: Vec<&str> = (0..n).map(|_| rng.pick(&toks)).collect();
        if let Ok(pat) = SubjectPattern::parse(&t.join(".")) {
            patterns.push(pat);
        }
    }
    let subjects = vec![
        vec!["a"; 100_000].join("."),
        vec!["b"; 100_000].join(".") + ".",
        "a".repeat(1 << 20),
        format!("a.b.{}", "a".repeat(1 << 20)),
        vec!["ab"; 256].join("."),
        ["a"; 11].join(".") + ".c",
        ["a"; 12].join(".") + ".c",
    ];
    check_all_ways(&patterns, &subjects);
}
