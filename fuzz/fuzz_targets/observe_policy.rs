//! Observability policy text (`Policy::parse`, crates/observe/src/policy): the document every
//! `svc-observe` command reads.
//!
//! Properties: no panic; every problem renders (Display) without control characters; parsing
//! is a function of the JSON value (compact and pretty layouts give the identical result); an
//! accepted policy round-trips through its effective form: `to_json_pretty` (what
//! `show-effective-policy` prints, every default filled in) parses back to the same policy.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::observe::policy::Policy;
use svc_fuzz::assert_clean_display;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = Policy::parse(text);
    match &first {
        Ok(policy) => {
            let effective = policy.to_json_pretty();
            match Policy::parse(&effective) {
                Ok(back) => assert_eq!(&back, policy, "effective policy round-trips"),
                Err(inv) => panic!("the effective policy is refused: {inv}\n{effective}"),
            }
            for line in policy.summary_lines() {
                assert_clean_display("summary line", &line, usize::MAX);
            }
        }
        Err(inv) => {
            assert!(!inv.0.is_empty());
            for p in &inv.0 {
                assert_clean_display("policy problem", &p.to_string(), usize::MAX);
            }
        }
    }
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
        for again in [
            serde_json::to_string(&value).unwrap(),
            serde_json::to_string_pretty(&value).unwrap(),
        ] {
            assert_eq!(Policy::parse(&again), first, "layout changed the result");
        }
    }
});
