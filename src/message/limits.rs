//! What one message may bring before anything is built from it: what the broker client could
//! read of it as sent (`unreadable`: a subject that is not UTF-8, a header block the broker and
//! the client would read differently), its headers bounded in count and bytes, the text every
//! sink stores as text (subject, message id, kept headers) without U+0000, which no PostgreSQL
//! text or `jsonb` string can hold, and a literal subject (every subject rule matches literal
//! subjects only: a wildcard subject would skip a required signature).
//!
//! Checked first in `svc-normalize`: a message over a bound is a permanent pre-sink failure
//! with its own reason code (dead-lettered, then acknowledged), and the runner moves on. The
//! errors name the bound and a count, never a header name or value (both are the publisher's).

use std::fmt;

use super::envelope::{RawMessage, MESSAGE_ID_HEADER};
use super::subject::is_literal_subject;

/// Most header lines one message may carry. NATS's own and a publisher's tracing, signature
/// and label headers are a few dozen at most; 8,669 small headers per message made
/// normalization take 37.7 s and 637 MiB for 3,000 messages.
pub const MAX_HEADERS: usize = 256;

/// Most bytes of header names and values one message may carry: real ones are a few KiB,
/// and nats-server 2.9.10 itself drops a message with more than 64 KiB of headers.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

// The client builds a header map only within these same bounds (beyond them it marks the
// block unreadable): the two must not drift apart.
const _: () = assert!(
    MAX_HEADERS == nats::header::MAX_HEADER_LINES
        && MAX_HEADER_BYTES == nats::header::MAX_HEADER_BYTES
);

/// Why a message was refused before its envelope was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputLimit {
    /// More than [`MAX_HEADERS`] header lines.
    TooManyHeaders(usize),
    /// More than [`MAX_HEADER_BYTES`] of header names and values.
    HeadersTooLarge(usize),
    /// The subject, the message id or a kept header holds U+0000.
    NulCharacter(NulIn),
    /// The broker client could not read the message as sent; the reason is static text.
    Unreadable(&'static str),
    /// The subject is not a literal subject (a wildcard or an empty token).
    NotALiteralSubject,
}

/// Where a U+0000 was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NulIn {
    Subject,
    MessageId,
    KeptHeader,
}

impl InputLimit {
    /// The stable reason code (DLQ records, docs).
    pub fn code(self) -> &'static str {
        match self {
            InputLimit::TooManyHeaders(_) => "too_many_headers",
            InputLimit::HeadersTooLarge(_) => "headers_too_large",
            InputLimit::NulCharacter(_) => "nul_character",
            InputLimit::Unreadable(_) => "unreadable",
            InputLimit::NotALiteralSubject => "wildcard_subject",
        }
    }

    /// The field the failure names.
    pub fn field(self) -> &'static str {
        match self {
            InputLimit::TooManyHeaders(_) | InputLimit::HeadersTooLarge(_) => "headers",
            InputLimit::NulCharacter(NulIn::Subject) | InputLimit::NotALiteralSubject => "subject",
            InputLimit::NulCharacter(NulIn::MessageId) => "message_id",
            InputLimit::NulCharacter(NulIn::KeptHeader) => "envelope.keep_headers",
            InputLimit::Unreadable(_) => "message",
        }
    }
}

impl fmt::Display for InputLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputLimit::TooManyHeaders(n) => {
                write!(f, "message has {n} header lines, more than {MAX_HEADERS}")
            }
            InputLimit::HeadersTooLarge(n) => write!(
                f,
                "message has {n} bytes of headers, more than {MAX_HEADER_BYTES}"
            ),
            InputLimit::NulCharacter(_) => write!(
                f,
                "{} holds U+0000, which no sink can store as text",
                self.field()
            ),
            InputLimit::Unreadable(why) => {
                write!(f, "the message could not be read as sent: {why}")
            }
            InputLimit::NotALiteralSubject => f.write_str(
                "the subject has a wildcard or an empty token: no subject rule could match it",
            ),
        }
    }
}

/// Checks one message against the bounds (see the module docs). `keep_headers` are the
/// header names the envelope keeps.
pub fn check(raw: &RawMessage, keep_headers: &[String]) -> Result<(), InputLimit> {
    // Lines as sent, repeated ones included, and first: the client marks a block over these
    // bounds unreadable without reading it, and this names the bound it crossed.
    let lines = raw.header_lines();
    if lines > MAX_HEADERS {
        return Err(InputLimit::TooManyHeaders(lines));
    }
    let bytes = raw.header_bytes();
    if bytes > MAX_HEADER_BYTES {
        return Err(InputLimit::HeadersTooLarge(bytes));
    }
    if let Some(why) = raw.unreadable {
        return Err(InputLimit::Unreadable(why));
    }
    if raw.subject.contains('\0') {
        return Err(InputLimit::NulCharacter(NulIn::Subject));
    }
    if !is_literal_subject(&raw.subject) {
        return Err(InputLimit::NotALiteralSubject);
    }
    for (k, v) in &raw.headers {
        if !v.contains('\0') {
            continue;
        }
        if k == MESSAGE_ID_HEADER {
            return Err(InputLimit::NulCharacter(NulIn::MessageId));
        }
        if keep_headers.iter().any(|h| h == k) {
            return Err(InputLimit::NulCharacter(NulIn::KeptHeader));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(subject: &str, headers: Vec<(String, String)>) -> RawMessage {
        RawMessage {
            stream: "S".into(),
            consumer: "c".into(),
            headers,
            ..RawMessage::sample(subject, 1, b"")
        }
    }

    fn h(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn bounds_and_reasons() {
        let keep = vec!["Content-Type".to_string()];
        assert_eq!(check(&msg("a.b", vec![h("X", "1")]), &keep), Ok(()));
        let many: Vec<_> = (0..=MAX_HEADERS)
            .map(|i| h(&format!("X-{i}"), "v"))
            .collect();
        assert_eq!(
            check(&msg("a", many.clone()), &keep),
            Err(InputLimit::TooManyHeaders(257))
        );
        assert_eq!(check(&msg("a", many[1..].to_vec()), &keep), Ok(()));
        let big = vec![h("X-Big", &"b".repeat(MAX_HEADER_BYTES - 5))];
        assert_eq!(check(&msg("a", big), &keep), Ok(()));
        let big = vec![h("X-Big", &"b".repeat(MAX_HEADER_BYTES))];
        let e = check(&msg("a", big), &keep).unwrap_err();
        assert_eq!(e, InputLimit::HeadersTooLarge(32_773));
        assert_eq!(e.code(), "headers_too_large");
        for (m, field) in [
            (msg("a\0b", vec![]), "subject"),
            (msg("a", vec![h("Nats-Msg-Id", "id\0")]), "message_id"),
            (
                msg("a", vec![h("Content-Type", "x\0y")]),
                "envelope.keep_headers",
            ),
        ] {
            let e = check(&m, &keep).unwrap_err();
            assert_eq!((e.code(), e.field()), ("nul_character", field));
            assert!(!e.to_string().contains('\0'));
        }
        for subject in [
            "orders.*",
            "orders.>",
            "orders..x",
            ".orders",
            "orders.",
            "",
        ] {
            let e = check(&msg(subject, vec![]), &keep).unwrap_err();
            assert_eq!(
                (e.code(), e.field()),
                ("wildcard_subject", "subject"),
                "{subject:?}"
            );
        }
        // Header lines as the client counted them, not the pairs it kept: 1,000 identical
        // lines are one pair; a block the client refused unread is named by its bound.
        let repeated = RawMessage {
            header_block: crate::message::envelope::HeaderBlock {
                lines: 1_000,
                bytes: 7_000,
            },
            ..msg("a", vec![h("X-Same", "1")])
        };
        assert_eq!(
            check(&repeated, &keep),
            Err(InputLimit::TooManyHeaders(1_000))
        );
        let unread = RawMessage {
            unreadable: Some("the client did not read it"),
            header_block: crate::message::envelope::HeaderBlock {
                lines: 3,
                bytes: 40_000,
            },
            ..msg("a", vec![])
        };
        assert_eq!(
            check(&unread, &keep),
            Err(InputLimit::HeadersTooLarge(40_000))
        );
        assert_eq!(check(&msg("orders.x*y.>z", vec![]), &keep), Ok(()));
        // A header that is not kept may hold anything: it never reaches a sink.
        assert_eq!(check(&msg("a", vec![h("X-Other", "x\0y")]), &keep), Ok(()));
    }
}
