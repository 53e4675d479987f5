//! The carried `nats` client's protocol parser (third_party/nats/src/proto.rs, header.rs):
//! every byte the server sends, and inside `MSG`/`HMSG` every byte a publisher chose.
//!
//! First byte: bits 0-5 the read size (1 to 64 bytes per read, so commands arrive split as from
//! a socket), bit 6 selects the mode. Mode 0: the rest is the server's byte stream as is.
//! Mode 1: the rest is split into a subject and a header block that a publisher controls; the
//! target frames them as the server would (`HMSG`, lengths right) and follows with a plain
//! `MSG`.
//!
//! Properties: no panic at any read size; in mode 1 nothing the publisher chose closes the
//! connection: both messages come out, the first readable or marked `unreadable` (and then
//! without headers when its subject was readable), the second untouched.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_fuzz::split_selector;

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let chunk = usize::from(sel & 0x3f) + 1;
    if sel & 0x40 == 0 {
        let _ = nats::decode_all(rest, chunk);
        return;
    }
    let Some((n, rest)) = rest.split_first() else {
        return;
    };
    let (subject, block) = rest.split_at(usize::from(*n).min(rest.len()));
    let subject: Vec<u8> = subject
        .iter()
        .map(|b| if b" \t\r\n".contains(b) { b'_' } else { *b })
        .collect();
    if subject.is_empty() {
        return;
    }
    // The header block ends at its first empty line, as the server frames it.
    let mut head = b"NATS/1.0\r\n".to_vec();
    head.extend_from_slice(block);
    head.extend_from_slice(b"\r\n\r\n");
    if head.windows(4).filter(|w| w == b"\r\n\r\n").count() > 1 {
        return;
    }
    let mut frame = b"HMSG ".to_vec();
    frame.extend_from_slice(&subject);
    frame.extend_from_slice(format!(" 1 $JS.ACK.S.c.1.1.1.0.0 {} {}\r\n", head.len(), head.len() + 1).as_bytes());
    frame.extend_from_slice(&head);
    frame.extend_from_slice(b"p\r\nMSG after 1 2\r\n{}\r\n");
    let out = nats::decode_all(&frame, chunk)
        .unwrap_or_else(|e| panic!("a publisher's bytes closed the connection: {e}"));
    assert_eq!(out.len(), 2, "both messages come out");
    assert_eq!(out[1].0, "after");
    assert!(out[1].2.is_none());
    if out[0].2.is_some() && std::str::from_utf8(&subject).is_ok() {
        assert!(out[0].3.is_empty(), "an unreadable header block yields no headers");
    }
});
