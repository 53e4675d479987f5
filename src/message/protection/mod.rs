//! Payload protection: publisher authenticity, payload encryption at rest, custody evidence.
//!
//! Three config blocks (`authenticity`, `payload_encryption`, `custody`; reference in
//! `docs/payload-protection.md`), applied by `svc-normalize` before any sink sees the
//! envelope, so every sink stores the same protected record:
//!
//! 1. [`authenticity`] on the raw message, first: a missing or bad signature is a permanent
//!    pre-sink failure (dead-lettered with a value-free reason);
//! 2. envelope, metadata and labels (the other message modules);
//! 3. [`encryption`] of the normalized payload (and the keyed `payload_info.sha256`);
//! 4. [`custody`] last, over the record as the sinks will store it.
//!
//! Keys are named in the config and read at start ([`Protection::load`]); [`keys`] holds them
//! in types whose `Debug` redacts the bytes.

pub mod authenticity;
pub mod canonical;
pub mod checkpoint;
pub mod checkpoint_audit;
pub mod custody;
pub mod encryption;
pub mod keys;

use authenticity::{AuthFailure, AuthOutcome, AuthenticityConfig, Verifier};
use custody::{Custodian, CustodyConfig};
use encryption::{CryptError, EncryptionConfig, Encryptor};

use crate::document::reader::Problems;
use crate::message::envelope::{Envelope, RawMessage};

/// Checks between the blocks at validate time (the sink's key strategies are checked by
/// `config`, which knows the sinks).
pub fn cross_check(enc: &EncryptionConfig, custody: &CustodyConfig, problems: &Problems) {
    if enc.enabled && custody.enabled && custody.hmac_key.is_none() {
        problems.push(
            "custody.hmac_key_env",
            "is required when payload_encryption is enabled (an unkeyed digest of the \
             plaintext would be stored in clear)",
        );
    }
}

/// What [`Protection::authenticate`] found, for the metrics.
pub type AuthResult = Result<Option<AuthOutcome>, AuthFailure>;

/// The loaded keys of the three features (each `None` when its block is off).
#[derive(Debug, Default)]
pub struct Protection {
    pub encryptor: Option<Encryptor>,
    pub verifier: Option<Verifier>,
    pub custodian: Option<Custodian>,
}

impl Protection {
    /// Reads every configured key. Errors name the key and its source, never bytes.
    pub fn load(
        enc: &EncryptionConfig,
        auth: &AuthenticityConfig,
        custody: &CustodyConfig,
    ) -> Result<Protection, Vec<String>> {
        let mut errors = Vec::new();
        let encryptor = if enc.enabled {
            Encryptor::load(enc).map_err(|e| errors.extend(e)).ok()
        } else {
            None
        };
        let verifier = if auth.enabled {
            Verifier::load(auth).map_err(|e| errors.extend(e)).ok()
        } else {
            None
        };
        let custodian = if custody.enabled {
            Custodian::load(custody).map_err(|e| errors.push(e)).ok()
        } else {
            None
        };
        if errors.is_empty() {
            Ok(Protection {
                encryptor,
                verifier,
                custodian,
            })
        } else {
            Err(errors)
        }
    }

    /// Step 1: the signature check (`Ok(None)` when authenticity is off).
    pub fn authenticate(&self, raw: &RawMessage) -> AuthResult {
        match &self.verifier {
            Some(v) => v.check(raw).map(Some),
            None => Ok(None),
        }
    }

    /// Steps 3 and 4: encrypts when a rule says so, then seals custody. Returns whether the
    /// payload was encrypted.
    pub fn protect(
        &self,
        env: &mut Envelope,
        raw: &RawMessage,
        now_unix_nanos: i128,
    ) -> Result<bool, CryptError> {
        let mut encrypted = false;
        if let Some(e) = self
            .encryptor
            .as_ref()
            .filter(|e| e.applies_to(&raw.subject))
        {
            e.encrypt(env, &raw.data)?;
            encrypted = true;
        }
        if let Some(c) = &self.custodian {
            c.seal(env, &raw.data, now_unix_nanos);
        }
        Ok(encrypted)
    }

    /// The keyed payload digest a DLQ record carries instead of a plain SHA-256, when the
    /// message's payload would be encrypted.
    pub fn dlq_payload_digest(&self, raw: &RawMessage) -> Option<String> {
        self.encryptor
            .as_ref()
            .filter(|e| e.applies_to(&raw.subject))
            .map(|e| e.payload_digest(&raw.data))
    }
}
