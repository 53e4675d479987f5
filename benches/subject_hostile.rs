//! What hostile subjects and the largest rule lists cost the subject-rule index (issue 50; the
//! two hostile reviews of the index), against the linear first-match scan it replaced, and
//! what rule lists cost in memory when a config is read. Prints figures, asserts only that the
//! index and the scan agree.
//!
//! ```text
//! cargo bench --bench subject_hostile
//! ```
//!
//! 1. Lookups: 2^k rules of {`a`, `*`} with a 1 MiB token where the walk branches most; 50
//!    realistic rules against 1 MiB subjects; the walk's worst case (1,000 rules of 256
//!    tokens from {`a`, `*`}, a subject that misses them all).
//! 2. Memory: a config whose `message_metadata` list is 5x over the cap (refused, read only
//!    up to the cap), a valid one with two lists at the cap of 256-token patterns, and the
//!    build of such an index.

use std::hint::black_box;
use std::time::Instant;

use svc::message::subject::{SubjectIndex, SubjectPattern, MAX_RULES};

fn pattern(text: &str) -> SubjectPattern {
    SubjectPattern::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

fn linear(patterns: &[SubjectPattern], subject: &str) -> Option<usize> {
    patterns.iter().position(|p| p.matches(subject))
}

/// Nanoseconds per call of `f`, best of 3 runs of `reps` calls (the host is shared).
fn per_call<R: PartialEq + std::fmt::Debug>(reps: u32, mut f: impl FnMut() -> R) -> (R, f64) {
    let mut best = f64::MAX;
    let mut r = f();
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            r = black_box(f());
        }
        best = best.min(t.elapsed().as_nanos() as f64 / f64::from(reps));
    }
    (r, best)
}

fn compare(what: &str, patterns: &[SubjectPattern], subject: &str, reps: u32) {
    let index = SubjectIndex::new(patterns);
    let (got, ix) = per_call(reps, || index.first_match(subject));
    let (want, ln) = per_call(reps, || linear(patterns, subject));
    assert_eq!(got, want, "{what}: the index and the scan disagree");
    println!(
        "{what}: index {:.0} ns, linear {:.0} ns per lookup (index/linear {:.2})",
        ix,
        ln,
        ix / ln
    );
}

/// Every combination of `a` and `*` over `k` tokens, then `zz` (which the subjects lack), and
/// a catch-all `>` last: nothing matches until the last rule, nothing is pruned.
fn combinations(k: usize) -> Vec<SubjectPattern> {
    let mut out: Vec<SubjectPattern> = (0..1u32 << k)
        .map(|code| {
            let t: Vec<&str> = (0..k)
                .map(|b| if code >> b & 1 == 1 { "*" } else { "a" })
                .collect();
            pattern(&format!("{}.zz", t.join(".")))
        })
        .collect();
    out.push(pattern(">"));
    out
}

/// A pattern of 256 distinct-ish tokens (as long as the grammar allows), unique per `i`.
fn deep(i: usize) -> String {
    let mut t = vec![format!("{i:x}")];
    while t.len() < 256 {
        t.push(format!("{:x}", t.len() % 16));
    }
    let mut s = t.join(".");
    s.truncate(512);
    s.trim_end_matches('.').to_string()
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with(field))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

fn lookups(smoke: bool) {
    let long = "a".repeat(if smoke { 1 << 12 } else { 1 << 20 });
    for k in if smoke { vec![5] } else { vec![9, 13] } {
        let rules = combinations(k);
        let hostile = format!("{}.{long}", vec!["a"; k].join("."));
        compare(
            &format!("2^{k} {{a,*}} rules + '>', a long token at depth {}", k + 1),
            &rules,
            &hostile,
            3,
        );
    }
    let mut small: Vec<SubjectPattern> = (0..49)
        .map(|i| pattern(&format!("orders.{i}.*.>")))
        .collect();
    small.push(pattern(">"));
    let many_tokens = vec!["a"; long.len() / 2].join(".");
    compare("50 rules, one long token", &small, &long, 20);
    compare(
        "50 rules, a long subject of 1-byte tokens",
        &small,
        &many_tokens,
        20,
    );
    compare("50 rules, orders.48.x.y", &small, "orders.48.x.y", 20_000);

    let mut seed = 2u64;
    let mut coin = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed & 1 == 0
    };
    let worst: Vec<SubjectPattern> = (0..if smoke { 50 } else { MAX_RULES })
        .map(|_| {
            let mut t: Vec<&str> = (0..255).map(|_| if coin() { "a" } else { "*" }).collect();
            t.push("zz");
            pattern(&t.join("."))
        })
        .collect();
    let subject = vec!["a"; 256].join(".");
    compare(
        &format!(
            "worst walk: {} rules of 256 {{a,*}} tokens, a^256",
            worst.len()
        ),
        &worst,
        &subject,
        20,
    );
}

fn memory(smoke: bool) {
    let n = if smoke { 50 } else { MAX_RULES };
    let config = |meta: usize, policy: usize| {
        let meta: Vec<String> = (0..meta)
            .map(|i| format!(r#"{{"subject": "{}", "priority": "high"}}"#, deep(i)))
            .collect();
        let policy: Vec<String> = (0..policy)
            .map(|i| {
                format!(
                    r#"{{"subject": "{}", "max_payload_bytes": 1000000}}"#,
                    deep(i)
                )
            })
            .collect();
        format!(
            r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                 "subject": ">"}},
                "delivery": {{"max_in_flight_bytes": 1048576}},
                "sink": {{"type": "file", "directory": "/tmp/out"}},
                "message_metadata": {{"rules": [{}]}},
                "pre_sink_policy": {{"enabled": true, "rules": [{}]}}}}"#,
            meta.join(","),
            policy.join(",")
        )
    };
    // Peak RSS only grows: the smaller reads come first.
    for (what, text) in [
        ("message_metadata 5x over the cap", config(n * 5, 0)),
        ("two lists at the cap", config(n, n)),
    ] {
        let before = status_kib("VmHWM:");
        let t = Instant::now();
        let verdict = match svc::config::RuntimeConfig::parse(&text) {
            Ok(_) => "accepted".to_string(),
            Err(e) => format!("refused ({} problems)", e.0.len()),
        };
        println!(
            "config with {what} of 256-token patterns ({} KiB of JSON): {verdict} in {:?}, \
             peak RSS {before} -> {} KiB",
            text.len() / 1024,
            t.elapsed(),
            status_kib("VmHWM:")
        );
    }
    let patterns: Vec<SubjectPattern> = (0..n).map(|i| pattern(&deep(i))).collect();
    let text: usize = patterns.iter().map(|p| p.as_str().len()).sum();
    let before = status_kib("VmRSS:");
    let t = Instant::now();
    let index = black_box(SubjectIndex::new(&patterns));
    println!(
        "index of {n} rules of 256 tokens: built in {:?}, RSS +{} KiB for {} KiB of pattern text",
        t.elapsed(),
        status_kib("VmRSS:").saturating_sub(before),
        text / 1024
    );
    drop(index);
}

fn main() {
    let smoke = cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench");
    if smoke {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench subject_hostile`"
        );
    }
    lookups(smoke);
    memory(smoke);
}
