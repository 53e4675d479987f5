//! A file found at a record's name (`duplicate_policy` `skip_existing`): it is the durable copy
//! only when it holds that record. Another account able to write the directory could otherwise
//! plant a file at the name of a message not yet written and have that message acknowledged
//! with no copy anywhere.
//!
//! "Holds that record": the stored record's payload digest (`payload_info.sha256`) is ours, and
//! so are the fields the key was made from: stream and sequence, or the message id
//! (`message_id` keys, and `idempotency_key` without a stream sequence), or the subject
//! (`payload_sha256` keys, where identical payloads on one subject collapse by design). The
//! file is read without following a link or blocking, must be a regular file owned by the
//! service's user, and is read only up to a bound.

use std::io::Read;

use crate::message::envelope::Envelope;
use crate::sink::key::{KeyBasis as Basis, KeyStrategy};

/// The fields of a stored record the check reads; the rest is skipped unread, however deep
/// (a tree of the whole record stopped at serde_json's 128 levels: a record an older version
/// stored with a payload 127 deep read as no record, atk53a finding 5). A repeated field is
/// no record.
#[derive(serde::Deserialize)]
struct Stored {
    stream: Option<String>,
    stream_sequence: Option<u64>,
    stream_incarnation: Option<String>,
    message_id: Option<String>,
    subject: Option<String>,
    payload_info: Option<StoredPayloadInfo>,
}

#[derive(serde::Deserialize)]
struct StoredPayloadInfo {
    sha256: Option<String>,
}

/// What identifies the record a key was made for.
#[derive(Debug, Clone)]
pub struct RecordId {
    basis: Basis,
    stream: String,
    incarnation: String,
    sequence: u64,
    subject: String,
    message_id: Option<String>,
    digest: String,
}

impl RecordId {
    pub fn of(env: &Envelope, strategy: KeyStrategy) -> RecordId {
        RecordId {
            basis: Basis::of(strategy, env),
            stream: env.stream.to_string(),
            incarnation: env.stream_incarnation.to_string(),
            sequence: env.stream_sequence,
            subject: env.subject.clone(),
            message_id: env.message_id.clone(),
            digest: env.payload_info.sha256.clone(),
        }
    }

    /// `Ok` when `stored` (the file's bytes, gzip-compressed when `gzip`) is our record; else
    /// the reason, for the permanent failure. `ours` is the body we meant to write; `max` bounds
    /// the decompressed size.
    pub fn check(&self, stored: &[u8], ours: &[u8], gzip: bool, max: u64) -> Result<(), String> {
        if stored == ours {
            return Ok(());
        }
        let mut json = Vec::new();
        let text: &[u8] = if gzip {
            let read = flate2::read::GzDecoder::new(stored)
                .take(max + 1)
                .read_to_end(&mut json);
            if read.is_err() || json.len() as u64 > max {
                return Err("holds no readable gzip record".into());
            }
            &json
        } else {
            stored
        };
        let doc: Stored =
            serde_json::from_slice(text).map_err(|_| "holds no JSON record".to_string())?;
        let is = |field: &Option<String>, ours: &str| field.as_deref() == Some(ours);
        let same_digest = doc
            .payload_info
            .is_some_and(|p| is(&p.sha256, &self.digest));
        let same_key_input = match self.basis {
            Basis::StreamSequence => {
                is(&doc.stream, &self.stream)
                    && doc.stream_sequence == Some(self.sequence)
                    // Written only when known: absent reads as none.
                    && doc.stream_incarnation.unwrap_or_default() == self.incarnation
            }
            Basis::MessageId => match &self.message_id {
                Some(id) => is(&doc.message_id, id),
                None => false,
            },
            Basis::Subject => is(&doc.subject, &self.subject),
            Basis::Digest => true,
        };
        if same_digest && same_key_input {
            Ok(())
        } else {
            Err(
                "holds another record (stream, sequence, message id, subject or payload \
                 digest differ)"
                    .into(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::file::tests::{envelope, record_of};

    #[test]
    fn only_the_same_record_counts() {
        let env = envelope("orders.created", 2, None, b"{\"a\":1}");
        let ours = record_of(&env);
        let id = RecordId::of(&env, KeyStrategy::IdempotencyKey);
        assert_eq!(id.check(&ours, &ours, false, 1 << 20), Ok(()));
        // A later delivery of the same message: other consumer fields, same identity.
        let mut again: serde_json::Value = serde_json::from_slice(&ours).unwrap();
        again["consumer_sequence"] = 99.into();
        let again = serde_json::to_vec(&again).unwrap();
        assert_eq!(id.check(&again, &ours, false, 1 << 20), Ok(()));
        let e = id
            .check(br#"{"forged":true}"#, &ours, false, 1 << 20)
            .unwrap_err();
        assert!(e.contains("another record"), "{e}");
        let e = id.check(b"\xff\xfe", &ours, false, 1 << 20).unwrap_err();
        assert_eq!(e, "holds no JSON record");
        let other = record_of(&envelope("orders.created", 3, None, b"{\"a\":1}"));
        assert!(id.check(&other, &ours, false, 1 << 20).is_err());
        let e = id.check(&ours, b"x", true, 1 << 20).unwrap_err();
        assert_eq!(e, "holds no readable gzip record");
    }
}
