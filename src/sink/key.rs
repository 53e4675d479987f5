//! Deterministic keys: the idempotency boundary of the file and object-store sinks.
//!
//! The same envelope always yields the same key, so a redelivered message lands on the same
//! file or object. Message content only ever contributes *escaped* components below the
//! strategy's namespace; it can never choose a directory, bucket or prefix of its own.
//!
//! Escaping: bytes outside `[A-Za-z0-9_.-]` become `~XX` (uppercase hex), as does `~` itself and
//! a leading `.` (so `.` and `..` can never appear as components). The mapping is injective:
//! two different inputs never share a key component.

use crate::message::envelope::Envelope;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStrategy {
    /// `idempotency-key/<safe-envelope-key>`: stream + sequence when known, then message ID,
    /// then payload hash.
    IdempotencyKey,
    /// `stream-sequence/<stream>/<sequence>`.
    StreamSequence,
    /// `message-id/<message_id>`; needs a publisher message ID.
    MessageId,
    /// `payload-sha256/<subject>/<digest>`; identical payloads on one subject collapse.
    PayloadSha256,
}

/// The fields besides the payload digest that a key of an envelope was made from: what a record
/// found at that key must share with the envelope to be its durable copy (a file sink's or an
/// object store's `skip_existing`). Otherwise anyone who gets a record in first, a publisher
/// sending a victim's future `Nats-Msg-Id` or an account planting a file, would have the
/// victim's message acknowledged with someone else's content stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyBasis {
    StreamSequence,
    MessageId,
    /// `payload_sha256` keys: identical payloads on one subject collapse by design.
    Subject,
    /// An idempotency key with neither a sequence nor a message id: the digest alone.
    Digest,
}

impl KeyBasis {
    pub fn of(strategy: KeyStrategy, env: &Envelope) -> KeyBasis {
        let has_sequence = !env.stream.is_empty() && env.stream_sequence > 0;
        let has_id = env.message_id.as_deref().is_some_and(|m| !m.is_empty());
        match strategy {
            KeyStrategy::StreamSequence => KeyBasis::StreamSequence,
            KeyStrategy::MessageId => KeyBasis::MessageId,
            KeyStrategy::PayloadSha256 => KeyBasis::Subject,
            KeyStrategy::IdempotencyKey if has_sequence => KeyBasis::StreamSequence,
            KeyStrategy::IdempotencyKey if has_id => KeyBasis::MessageId,
            KeyStrategy::IdempotencyKey => KeyBasis::Digest,
        }
    }
}

pub const KEY_STRATEGIES: &[(&str, KeyStrategy)] = &[
    ("idempotency_key", KeyStrategy::IdempotencyKey),
    ("stream_sequence", KeyStrategy::StreamSequence),
    ("message_id", KeyStrategy::MessageId),
    ("payload_sha256", KeyStrategy::PayloadSha256),
];

/// Escapes one key component (see module docs).
pub fn safe_component(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len().max(1));
    push_safe_component(&mut out, raw);
    out
}

/// [`safe_component`] appended to `out`.
pub fn push_safe_component(out: &mut String, raw: &str) {
    if raw.is_empty() {
        out.push('~');
        return;
    }
    for (i, b) in raw.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0);
        if plain {
            out.push(b as char);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('~');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

/// The envelope's place in its stream, escaped, appended to `out`: what
/// [`stream_place`](crate::message::envelope::stream_place) makes of the escaped stream, the
/// escaped incarnation (left out when not known) and the sequence.
pub fn push_stream_place(out: &mut String, env: &Envelope, sep: char) {
    push_safe_component(out, &env.stream);
    if !env.stream_incarnation.is_empty() {
        out.push(sep);
        push_safe_component(out, &env.stream_incarnation);
    }
    out.push(sep);
    out.push_str(crate::text::json::decimal(
        env.stream_sequence,
        &mut [0; 20],
    ));
}

/// The `idempotency_key` strategy's key without its namespace: `s-<stream place>` when the
/// stream and sequence are known, else `m-<message id>`, else `p-<payload sha256>` (the
/// relational sink's row key).
pub fn idempotency_id(env: &Envelope) -> String {
    let mut out = String::with_capacity(64);
    push_idempotency_id(&mut out, env);
    out
}

fn push_idempotency_id(out: &mut String, env: &Envelope) {
    if !env.stream.is_empty() && env.stream_sequence > 0 {
        out.push_str("s-");
        push_stream_place(out, env, '-');
    } else if let Some(m) = env.message_id.as_deref().filter(|m| !m.is_empty()) {
        out.push_str("m-");
        push_safe_component(out, m);
    } else {
        out.push_str("p-");
        out.push_str(&env.payload_info.sha256);
    }
}

/// The key of an envelope below the strategy namespace, without any prefix, with `suffix`.
/// Fails (permanently) when the strategy's input is missing. Built in one string: this runs
/// once per message.
pub fn strategy_key(env: &Envelope, strategy: KeyStrategy, suffix: &str) -> Result<String, String> {
    let mut key = String::with_capacity(96 + suffix.len());
    match strategy {
        KeyStrategy::IdempotencyKey => {
            key.push_str("idempotency-key/");
            push_idempotency_id(&mut key, env);
        }
        KeyStrategy::StreamSequence => {
            if env.stream.is_empty() || env.stream_sequence == 0 {
                return Err("key strategy stream_sequence needs a stream and sequence".into());
            }
            key.push_str("stream-sequence/");
            push_stream_place(&mut key, env, '/');
        }
        KeyStrategy::MessageId => match env.message_id.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => {
                key.push_str("message-id/");
                push_safe_component(&mut key, m);
            }
            None => return Err("key strategy message_id needs a Nats-Msg-Id header".into()),
        },
        KeyStrategy::PayloadSha256 => {
            key.push_str("payload-sha256/");
            push_safe_component(&mut key, &env.subject);
            key.push('/');
            key.push_str(&env.payload_info.sha256);
        }
    }
    key.push_str(suffix);
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};

    fn env(subject: &str, msg_id: Option<&str>) -> Envelope {
        let mut headers = vec![];
        if let Some(m) = msg_id {
            headers.push(("Nats-Msg-Id".to_string(), m.to_string()));
        }
        normalize(
            &RawMessage {
                stream_incarnation: Default::default(),
                subject: subject.into(),
                stream: "ORDERS".into(),
                consumer: "c".into(),
                stream_sequence: 42,
                consumer_sequence: 1,
                delivery_count: 1,
                published_unix_nanos: None,
                headers,
                data: b"{}".to_vec(),
                unreadable: None,
                header_block: Default::default(),
            },
            0,
            &EnvelopeConfig::default(),
        )
        .0
    }

    /// A stream deleted and created again numbers from 1 again: its keys differ from the old
    /// one's by the incarnation (issue 51.11).
    #[test]
    fn keys_of_a_stream_created_again_differ() {
        let mut e = env("orders.created", None);
        e.stream_incarnation = "20261128T071943.123456789Z".into();
        assert_eq!(
            strategy_key(&e, KeyStrategy::StreamSequence, ".json").unwrap(),
            "stream-sequence/ORDERS/20261128T071943.123456789Z/42.json"
        );
        assert_eq!(
            strategy_key(&e, KeyStrategy::IdempotencyKey, "").unwrap(),
            "idempotency-key/s-ORDERS-20261128T071943.123456789Z-42"
        );
        let mut again = e.clone();
        again.stream_incarnation = "20261128T081943Z".into();
        for s in [KeyStrategy::StreamSequence, KeyStrategy::IdempotencyKey] {
            assert_ne!(
                strategy_key(&e, s, "").unwrap(),
                strategy_key(&again, s, "").unwrap()
            );
        }
    }

    #[test]
    fn key_shapes() {
        let e = env("orders.created", Some("id/../x"));
        assert_eq!(
            strategy_key(&e, KeyStrategy::StreamSequence, ".json").unwrap(),
            "stream-sequence/ORDERS/42.json"
        );
        assert_eq!(
            strategy_key(&e, KeyStrategy::IdempotencyKey, ".json").unwrap(),
            "idempotency-key/s-ORDERS-42.json"
        );
        assert_eq!(
            strategy_key(&e, KeyStrategy::MessageId, ".json").unwrap(),
            "message-id/id~2F..~2Fx.json"
        );
        let k = strategy_key(&e, KeyStrategy::PayloadSha256, ".json").unwrap();
        assert!(
            k.starts_with("payload-sha256/orders.created/44136fa3"),
            "{k}"
        );
        assert!(strategy_key(&env("a", None), KeyStrategy::MessageId, "").is_err());
        let mut odd = env("a b", Some("m/1"));
        odd.stream = "OR DERS".into();
        odd.stream_incarnation = "2026~x".into();
        assert_eq!(
            strategy_key(&odd, KeyStrategy::StreamSequence, "").unwrap(),
            "stream-sequence/OR~20DERS/2026~7Ex/42"
        );
        assert_eq!(idempotency_id(&odd), "s-OR~20DERS-2026~7Ex-42");
        odd.stream = "".into();
        assert_eq!(idempotency_id(&odd), "m-m~2F1");
        odd.message_id = None;
        assert_eq!(
            idempotency_id(&odd),
            format!("p-{}", odd.payload_info.sha256)
        );
        assert_eq!(
            strategy_key(&odd, KeyStrategy::PayloadSha256, ".x").unwrap(),
            format!("payload-sha256/a~20b/{}.x", odd.payload_info.sha256)
        );
    }

    #[test]
    fn escaping_is_safe_and_injective() {
        assert_eq!(safe_component(".."), "~2E.");
        assert_eq!(safe_component("."), "~2E");
        assert_eq!(safe_component(""), "~");
        assert_eq!(safe_component("a/b"), "a~2Fb");
        assert_ne!(safe_component("a~2Fb"), safe_component("a/b"));
        assert_eq!(safe_component("é"), "~C3~A9");
        for s in ["..", "a/../b", "/etc/passwd", "~", "a b"] {
            let c = safe_component(s);
            assert!(!c.contains('/') && c != "." && c != "..", "{s} -> {c}");
        }
    }
}
