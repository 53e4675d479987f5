//! The JetStream ack subject (`broker::AckSubject`, src/broker/mod.rs): the reply subject of a
//! delivery, set by the broker (or whatever answers on its address), parsed per message.
//!
//! Calls `broker::fuzz_parse_ack_subject` (a thin wrapper of the private `AckSubject::parse`).
//! Properties: no panic; an accepted subject has non-empty stream and consumer tokens without
//! `.`; the values round-trip: the canonical 7-token form built from them parses to the same
//! values, and so does the 9-token form with a domain and an account hash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::broker::fuzz_parse_ack_subject;

fuzz_target!(|data: &[u8]| {
    let Ok(reply) = std::str::from_utf8(data) else {
        return;
    };
    let Some(v) = fuzz_parse_ack_subject(reply) else {
        return;
    };
    let (stream, consumer, delivered, sseq, cseq, ts) = v;
    for name in [stream, consumer] {
        assert!(
            !name.is_empty() && !name.contains('.'),
            "name token {name:?} in {reply:?}"
        );
    }
    let short = format!("$JS.ACK.{stream}.{consumer}.{delivered}.{sseq}.{cseq}.{ts}.0");
    assert_eq!(
        fuzz_parse_ack_subject(&short),
        Some(v),
        "7-token form of {reply:?}"
    );
    let long = format!("$JS.ACK.hub.ACC.{stream}.{consumer}.{delivered}.{sseq}.{cseq}.{ts}.0.tok");
    assert_eq!(
        fuzz_parse_ack_subject(&long),
        Some(v),
        "domain form of {reply:?}"
    );
});
