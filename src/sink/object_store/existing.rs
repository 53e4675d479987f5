//! A conditional put met a taken key: is the stored object this very message (written by an
//! earlier attempt whose answer was lost), or another one? `fail_existing` asks for the same
//! delivery (stream, sequence, payload digest); `skip_existing` for the same payload digest
//! and the fields the key was made from ([`KeyBasis`]): a publisher who first sends a victim's
//! future `Nats-Msg-Id` must not have the victim's message acknowledged with its own content
//! stored.
//!
//! The store is not trusted: what it serves at the key may be a decompression bomb (65 KB of
//! gzip inflating to a gigabyte) or a huge JSON array. So the stored body is never inflated
//! into memory nor parsed into a tree. It is decompressed as a stream, at most
//! [`identity_limit`] bytes of it, and read by a streaming deserializer that keeps only the
//! three members the comparison needs (`stream`, `stream_sequence`, `payload_info.sha256`)
//! and skips every other value without keeping it (`serde::de::IgnoredAny`). Memory is then
//! bounded by the GET's own bound (`max_object_bytes`) plus a few buffers, whatever the body.

use std::io::{self, BufReader, Read};

use serde::Deserialize;

use super::config::{ObjectFormat, ObjectStoreConfig};
use crate::sink::key::KeyBasis;
use crate::sink::layout::Compression;

/// What identifies the message of a stored envelope; other members are skipped unkept.
#[derive(Deserialize)]
struct Identity {
    stream: String,
    /// Written only when known: absent reads as none.
    #[serde(default)]
    stream_incarnation: String,
    stream_sequence: u64,
    payload_info: PayloadDigest,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    message_id: Option<String>,
}

#[derive(Deserialize)]
struct PayloadDigest {
    sha256: String,
}

/// The message a put was for.
pub struct Ours<'a> {
    pub stream: &'a str,
    pub stream_incarnation: &'a str,
    pub stream_sequence: u64,
    pub payload_sha256: &'a str,
    pub subject: &'a str,
    pub message_id: Option<&'a str>,
    /// What the stored object must share besides the payload digest: `StreamSequence` for
    /// `fail_existing` (the same delivery), the key's own basis for `skip_existing`.
    pub basis: KeyBasis,
    /// Bytes of our own envelope before compression.
    pub plain_len: usize,
}

/// Room for what differs between two envelopes of one message (delivery count, times,
/// metadata of the delivery).
const ENVELOPE_SLACK: u64 = 64 * 1024;

/// Decompressed bytes read at most: `max_object_bytes`, or our own envelope's size plus
/// [`ENVELOPE_SLACK`] when that is larger (`max_object_bytes` bounds the compressed size, so a
/// very compressible message of ours may inflate past it; a stored copy of it is no larger).
pub fn identity_limit(cfg: &ObjectStoreConfig, ours: &Ours<'_>) -> u64 {
    cfg.max_object_bytes
        .max((ours.plain_len as u64).saturating_add(ENVELOPE_SLACK))
}

/// `Ok` when `stored` is an envelope of our message (stream, sequence and payload digest),
/// else why not (for the duplicate error).
pub fn same_message(cfg: &ObjectStoreConfig, stored: &[u8], ours: &Ours<'_>) -> Result<(), String> {
    if cfg.object_format != ObjectFormat::Envelope {
        return Err("the stored payload differs".into());
    }
    let limit = identity_limit(cfg, ours);
    let found = match cfg.compression {
        Compression::None => read_identity(Bounded::new(stored, limit)),
        Compression::Gzip => {
            read_identity(Bounded::new(flate2::read::GzDecoder::new(stored), limit))
        }
    }
    .map_err(|e| format!("the stored object is not an envelope of this message: {e}"))?;
    let same_key_input = match ours.basis {
        KeyBasis::StreamSequence => {
            found.stream == ours.stream
                && found.stream_incarnation == ours.stream_incarnation
                && found.stream_sequence == ours.stream_sequence
        }
        KeyBasis::MessageId => {
            ours.message_id.is_some() && found.message_id.as_deref() == ours.message_id
        }
        KeyBasis::Subject => found.subject.as_deref() == Some(ours.subject),
        KeyBasis::Digest => true,
    };
    if same_key_input && found.payload_info.sha256 == ours.payload_sha256 {
        Ok(())
    } else {
        Err("the stored object holds another message".into())
    }
}

fn read_identity(reader: impl Read) -> Result<Identity, String> {
    use serde_json::error::Category;
    // serde_json reads an `io::Read` a byte at a time: the buffer spares the decoder that.
    serde_json::from_reader(BufReader::with_capacity(8 * 1024, reader)).map_err(|e| {
        // The reader's own errors (the bound, broken gzip) are ours to show; serde's other
        // messages can quote the stored bytes, so only their class is shown.
        match e.classify() {
            // Gives back the reader's own error, without serde's position suffix.
            Category::Io => io::Error::from(e).to_string(),
            Category::Syntax => "not JSON".into(),
            Category::Data => "not an envelope".into(),
            Category::Eof => "the JSON ends early".into(),
        }
    })
}

/// A reader that fails once more than `limit` bytes came through it.
struct Bounded<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Bounded<R> {
    fn new(inner: R, limit: u64) -> Self {
        Bounded {
            inner,
            left: limit,
            limit,
        }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // One byte beyond the bound is enough to tell it was crossed.
        let want = buf.len().min(self.left.saturating_add(1) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        if n as u64 > self.left {
            return Err(io::Error::other(format!(
                "its body decompresses to over {} bytes",
                self.limit
            )));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn cfg(extra: &str) -> ObjectStoreConfig {
        let text = format!(
            r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
               "subject": "a"}}, "sink": {{"type": "object_store", "bucket": "abc",
               "max_object_bytes": 1048576{extra}}}}}"#
        );
        match crate::config::RuntimeConfig::parse(&text).unwrap().sink {
            crate::sink::SinkConfig::ObjectStore(c) => *c,
            _ => unreachable!(),
        }
    }

    fn gzip_of(parts: &[&[u8]], repeat: usize) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(parts[0]).unwrap();
        for _ in 0..repeat {
            enc.write_all(parts[1]).unwrap();
        }
        enc.write_all(parts[2]).unwrap();
        enc.finish().unwrap()
    }

    /// An object the sink wrote is recognised as its message's by the identity the sink reads
    /// back, the stream's incarnation included; another incarnation's is not.
    #[test]
    fn a_stored_envelope_is_its_messages_in_its_incarnation_only() {
        use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};
        let raw = RawMessage {
            stream_incarnation: "20261128T071943Z".into(),
            ..RawMessage::sample("orders.created", 7, b"{}")
        };
        let env = normalize(&raw, 0, &EnvelopeConfig::default()).0;
        let stored = super::super::body::object_json(&env).unwrap();
        let ours = |incarnation| Ours {
            stream: "ORDERS",
            stream_incarnation: incarnation,
            stream_sequence: 7,
            payload_sha256: &env.payload_info.sha256,
            subject: "orders.created",
            message_id: None,
            basis: KeyBasis::StreamSequence,
            plain_len: stored.len(),
        };
        let c = cfg("");
        assert_eq!(same_message(&c, &stored, &ours("20261128T071943Z")), Ok(()));
        assert!(same_message(&c, &stored, &ours("20251128T071943Z")).is_err());
        assert!(same_message(&c, &stored, &ours("")).is_err());
    }

    const OURS: Ours<'static> = Ours {
        stream: "ORDERS",
        stream_incarnation: "",
        stream_sequence: 7,
        payload_sha256: "ab12",
        subject: "orders.created",
        message_id: Some("m-7"),
        basis: KeyBasis::StreamSequence,
        plain_len: 300,
    };

    /// `skip_existing` with message-id keys: a publisher's retry of the same payload under the
    /// same id is the durable copy, another payload under the victim's id is not.
    #[test]
    fn skip_existing_compares_what_the_key_was_made_from() {
        let c = cfg("");
        let by_id = Ours {
            basis: KeyBasis::MessageId,
            ..OURS
        };
        let retry = br#"{"stream":"ORDERS","stream_sequence":9,"message_id":"m-7",
                        "payload_info":{"sha256":"ab12"}}"#;
        assert_eq!(same_message(&c, retry, &by_id), Ok(()));
        let planted = br#"{"stream":"ORDERS","stream_sequence":3,"message_id":"m-7",
                          "payload_info":{"sha256":"ffff"}}"#;
        assert_eq!(
            same_message(&c, planted, &by_id).unwrap_err(),
            "the stored object holds another message"
        );
        let no_id = br#"{"stream":"ORDERS","stream_sequence":9,"payload_info":{"sha256":"ab12"}}"#;
        assert!(same_message(&c, no_id, &by_id).is_err());
        let by_subject = Ours {
            basis: KeyBasis::Subject,
            ..OURS
        };
        let same_payload = br#"{"stream":"ORDERS","stream_sequence":1,"subject":"orders.created",
                               "payload_info":{"sha256":"ab12"}}"#;
        assert_eq!(same_message(&c, same_payload, &by_subject), Ok(()));
        // The same delivery is asked for by fail_existing.
        assert!(same_message(&c, retry, &OURS).is_err());
    }

    #[test]
    fn only_the_identity_is_read_and_compared() {
        let c = cfg("");
        let doc = br#"{"schema":"x","stream":"ORDERS","payload":{"deep":[[[1]]]},
                      "stream_sequence":7,"payload_info":{"size":3,"sha256":"ab12"}}"#;
        assert_eq!(same_message(&c, doc, &OURS), Ok(()));
        let other = br#"{"stream":"ORDERS","stream_sequence":8,"payload_info":{"sha256":"ab12"}}"#;
        assert_eq!(
            same_message(&c, other, &OURS).unwrap_err(),
            "the stored object holds another message"
        );
        // Peer bytes never reach the reason.
        for (bad, why) in [
            (&b"\x1b[2J not json"[..], "not JSON"),
            (br#"{"stream": 5}"#, "not an envelope"),
            (br#"{"stream":"ORDERS""#, "the JSON ends early"),
        ] {
            assert_eq!(
                same_message(&c, bad, &OURS).unwrap_err(),
                format!("the stored object is not an envelope of this message: {why}")
            );
        }
        let gz = cfg(r#", "compression": "gzip", "object_suffix": ".json.gz""#);
        assert_eq!(
            same_message(&gz, &gzip_of(&[doc, b"", b""], 0), &OURS),
            Ok(())
        );
        let not_gzip = same_message(&gz, b"plain", &OURS).unwrap_err();
        assert!(
            not_gzip.starts_with("the stored object is not an envelope of this message: "),
            "{not_gzip}"
        );
    }

    #[test]
    fn a_bomb_is_cut_at_the_bound_without_a_tree() {
        let gz = cfg(r#", "compression": "gzip", "object_suffix": ".json.gz""#);
        // 64 MiB of `0,` inside a member: a tree of it would take about a gigabyte.
        let bomb = gzip_of(
            &[br#"{"pad":["#, &[b'0', b','].repeat(1 << 15), b"0]}"],
            1024,
        );
        assert_eq!(
            same_message(&gz, &bomb, &OURS).unwrap_err(),
            "the stored object is not an envelope of this message: its body decompresses to \
             over 1048576 bytes"
        );
        // A large message of ours raises the bound to its own size plus slack.
        let big = Ours {
            plain_len: 4 << 20,
            ..OURS
        };
        assert_eq!(identity_limit(&gz, &big), (4 << 20) + ENVELOPE_SLACK);
        assert_eq!(identity_limit(&gz, &OURS), 1 << 20);
    }
}
