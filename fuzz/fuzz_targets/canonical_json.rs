//! The strict JSON reader and the one canonical writer (`crates/document/src/canonical.rs`): what
//! `svc verify-custody` reads from stores the service does not own, and the form custody
//! digests.
//!
//! Properties: no panic; a refusal's Display is clean and bounded; an accepted document's
//! canonical form re-parses strictly and is a fixed point; the reader is no stricter in grammar
//! than serde_json (a syntax error here is one there too), and what serde_json reads it reads
//! too unless it has a duplicate key or an exponent beyond range; the canonical form keeps the
//! value: serde_json reads the same values from it as from the original, numbers compared as
//! the nearest doubles.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use svc::document::canonical::{parse, write, ParseError};
use svc_fuzz::{assert_clean_display, MAX_ERROR_CHARS};

/// The value with every number read as the nearest double.
fn as_doubles(v: &Value) -> Value {
    match v {
        Value::Number(n) => Value::from(n.as_f64().expect("finite")),
        Value::Array(items) => Value::Array(items.iter().map(as_doubles).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), as_doubles(v))).collect()),
        other => other.clone(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let serde = serde_json::from_str::<Value>(text);
    let doc = match parse(text) {
        Ok(doc) => doc,
        Err(e) => {
            assert_clean_display("canonical::parse", &e.to_string(), MAX_ERROR_CHARS);
            match e {
                ParseError::Syntax { .. } => {
                    assert!(serde.is_err(), "refused as a syntax error, read by serde_json")
                }
                ParseError::DuplicateKey | ParseError::NumberOutOfRange => {}
                ParseError::TooDeep => assert!(serde.is_err(), "too deep here, read there"),
            }
            return;
        }
    };
    let mut once = Vec::new();
    write(&mut once, &doc);
    let canonical = std::str::from_utf8(&once).expect("canonical JSON is UTF-8");
    let back = parse(canonical).expect("canonical JSON parses strictly");
    let mut twice = Vec::new();
    write(&mut twice, &back);
    assert_eq!(once, twice, "canonical JSON is not a fixed point");
    if let Ok(original) = serde {
        // serde_json reads `1E+2` as the double 100.0 and `100` as an integer, and
        // `12345678905234567.0` through a double while its exact canonical form
        // `12345678905234567` stays an integer: compared as doubles, the values are the same.
        let again: Value = serde_json::from_str(canonical).expect("serde_json reads the form");
        assert_eq!(
            as_doubles(&original),
            as_doubles(&again),
            "the canonical form changed the value"
        );
    }
});
