//! Payload encryption at rest (`payload_encryption`): AES-256-GCM over the normalized payload,
//! bound to the record's place by its associated data, with rotation by key id.
//!
//! Format (`docs/payload-protection.md` is the reference): the envelope's `payload` becomes
//! `{"schema":"svc.encrypted_payload.v1","alg":"A256GCM","key_id":K,"nonce":N,"ciphertext":C}`
//! where the plaintext is the UTF-8 bytes of the normalized payload JSON (exactly what `payload`
//! would hold in clear), N is the base64 of 12 random bytes, C the base64 of ciphertext || 16-byte
//! tag, and the AAD is the UTF-8 bytes of `<stream>\n<stream_sequence>\n<subject>` (sequence in
//! decimal ASCII, `\n` = 0x0A, no trailing newline).
//!
//! With encryption applied, `payload_info.sha256` is not a plain SHA-256 (a digest of a short
//! plaintext can be reversed by guessing) but `HMAC-SHA256(D, raw payload bytes)` in hex, where
//! `D = HKDF-SHA256(ikm = key[digest_key_id], salt = "", info = "svc.payload_info.sha256.v1")`.
//! `digest_key_id` defaults to `active_key_id`; keeping it fixed across a rotation keeps the
//! digests (and so the sinks' duplicate checks) stable.
//!
//! Nonces are random, so each key encrypts at most `max_messages_per_key` records per process
//! (default 2^32, NIST SP 800-38D section 8.3); beyond it the record is refused and left
//! unacknowledged until the operator rotates `active_key_id`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::Value;

use super::keys::{is_key_id, KeySource, Secret};
use crate::document::reader::ObjectReader;
use crate::message::envelope::{Envelope, Payload};
use crate::message::subject::{read_pattern, SubjectPattern, SubjectRule, SubjectRules};

pub const ENCRYPTED_PAYLOAD_SCHEMA: &str = "svc.encrypted_payload.v1";
pub const ALG: &str = "A256GCM";
/// HKDF `info` of the payload digest key.
pub const DIGEST_KEY_INFO: &[u8] = b"svc.payload_info.sha256.v1";
/// Default and upper bound of `max_messages_per_key`: 2^32 invocations per key with random
/// 96-bit nonces (NIST SP 800-38D, 8.3).
pub const MAX_MESSAGES_PER_KEY: u64 = 1 << 32;
pub const MAX_KEYS: usize = 32;
pub const MAX_RULES: usize = crate::message::subject::MAX_RULES;
const KEY_BYTES: usize = 32;
const TAG_BYTES: usize = 16;

/// What a subject rule (or the default) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Encrypt,
    Clear,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EncryptionRule {
    pub pattern: SubjectPattern,
    pub action: Action,
}

impl SubjectRule for EncryptionRule {
    fn pattern(&self) -> &SubjectPattern {
        &self.pattern
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    pub key_id: String,
    pub source: KeySource,
}

/// The `payload_encryption` block. Holds key *sources* only.
#[derive(Debug, Clone, PartialEq)]
pub struct EncryptionConfig {
    pub enabled: bool,
    pub keys: Vec<KeyEntry>,
    pub active_key_id: String,
    pub digest_key_id: String,
    pub default_action: Action,
    pub rules: SubjectRules<EncryptionRule>,
    pub max_messages_per_key: u64,
}

impl Default for EncryptionConfig {
    fn default() -> Self {
        EncryptionConfig {
            enabled: false,
            keys: Vec::new(),
            active_key_id: String::new(),
            digest_key_id: String::new(),
            default_action: Action::Encrypt,
            rules: SubjectRules::default(),
            max_messages_per_key: MAX_MESSAGES_PER_KEY,
        }
    }
}

impl EncryptionConfig {
    /// Reads the block (absent = disabled).
    pub fn read(r: Option<ObjectReader<'_>>) -> EncryptionConfig {
        let Some(mut r) = r else {
            return EncryptionConfig::default();
        };
        let enabled = r.bool_or("enabled", false);
        let mut keys: Vec<KeyEntry> = Vec::new();
        let key_readers = r.objects("keys");
        if key_readers.len() > MAX_KEYS {
            r.problem("keys", format!("must have at most {MAX_KEYS} entries"));
        }
        for mut k in key_readers {
            let key_id = k.req_string("key_id");
            if !key_id.is_empty() && !is_key_id(&key_id) {
                k.problem("key_id", "must be 1 to 64 characters of A-Z a-z 0-9 _ - .");
            } else if keys.iter().any(|e| e.key_id == key_id) {
                k.problem(
                    "key_id",
                    "is used by an earlier key; key ids must be unique",
                );
            }
            let source = KeySource::read(&mut k, "key_env", "key_file");
            k.finish();
            if let Some(source) = source {
                keys.push(KeyEntry { key_id, source });
            }
        }
        if enabled && keys.is_empty() {
            r.problem("keys", "must name at least one key when enabled is true");
        }
        let active_key_id = r.opt_string("active_key_id").unwrap_or_default();
        let known = |id: &str| keys.iter().any(|k| k.key_id == id);
        if enabled && !known(&active_key_id) {
            r.problem("active_key_id", "must name one of keys[].key_id");
        }
        let digest_key_id = r
            .opt_string("digest_key_id")
            .unwrap_or_else(|| active_key_id.clone());
        if enabled && !known(&digest_key_id) {
            r.problem("digest_key_id", "must name one of keys[].key_id");
        }
        let actions = [("encrypt", Action::Encrypt), ("clear", Action::Clear)];
        let default_action = r.one_of("default", Action::Encrypt, &actions);
        let rule_readers = r.objects_at_most("rules", MAX_RULES);
        let mut rules = Vec::new();
        for mut rr in rule_readers {
            let pattern = read_pattern(&mut rr, "subject");
            if !rr.has("action") {
                rr.problem("action", "is required (encrypt or clear)");
            }
            let action = rr.one_of("action", Action::Encrypt, &actions);
            rr.finish();
            if let Some(pattern) = pattern {
                rules.push(EncryptionRule { pattern, action });
            }
        }
        let max_messages_per_key = r.int_in(
            "max_messages_per_key",
            MAX_MESSAGES_PER_KEY as i64,
            1,
            MAX_MESSAGES_PER_KEY as i64,
        ) as u64;
        r.finish();
        EncryptionConfig {
            enabled,
            keys,
            active_key_id,
            digest_key_id,
            default_action,
            rules: SubjectRules::new(rules),
            max_messages_per_key,
        }
    }

    /// What happens to the payload of a subject: first matching rule, then the default.
    pub fn action_for(&self, subject: &str) -> Action {
        if !self.enabled {
            return Action::Clear;
        }
        self.rules
            .first_match(subject)
            .map_or(self.default_action, |(_, r)| r.action)
    }
}

/// A loaded AES key. `Debug` shows the id only.
struct AeadKey {
    key_id: String,
    key: LessSafeKey,
    /// Records sealed under this key by this process.
    used: AtomicU64,
}

/// Why a payload was not encrypted or not decrypted. Never carries key or payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CryptError {
    /// The active key reached `max_messages_per_key` in this process.
    KeyExhausted { key_id: String, limit: u64 },
    /// The random source failed.
    Random,
    /// The record's payload is not a `svc.encrypted_payload.v1` object (field named).
    Format(String),
    /// No configured key has this id.
    UnknownKey(String),
    /// Authentication failed: wrong key, altered ciphertext, or moved to another record.
    Open,
}

impl fmt::Display for CryptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CryptError::KeyExhausted { key_id, limit } => write!(
                f,
                "payload_encryption: key {key_id} has encrypted {limit} records in this process \
                 (max_messages_per_key); rotate active_key_id"
            ),
            CryptError::Random => f.write_str("payload_encryption: the random source failed"),
            CryptError::Format(what) => write!(f, "not an encrypted payload record: {what}"),
            CryptError::UnknownKey(id) => write!(
                f,
                "payload encrypted under key id {} which is not in payload_encryption.keys",
                crate::text::peer::PeerText::new(id)
            ),
            CryptError::Open => f.write_str(
                "decryption failed: wrong key, altered ciphertext, or the payload was moved \
                 from another record (stream, sequence or subject differ)",
            ),
        }
    }
}

impl std::error::Error for CryptError {}

/// The loaded keys and rules: encrypts on `svc-normalize`, decrypts in `svc decrypt`.
pub struct Encryptor {
    cfg: EncryptionConfig,
    keys: Vec<AeadKey>,
    active: usize,
    digest_key: hmac::Key,
    nonces: NonceSource,
}

/// Random nonces drawn from the OS in blocks: one `getrandom` call per 341 records instead of
/// one per record (measured: the system call was a third of encryption's cost). Nonces are
/// public (they are stored with the record); each block position is handed out once.
struct NonceSource {
    rng: SystemRandom,
    /// The block and the position of the next unused nonce in it.
    block: std::sync::Mutex<(Vec<u8>, usize)>,
}

const NONCE_BLOCK: usize = NONCE_LEN * 341;

impl NonceSource {
    fn new() -> NonceSource {
        NonceSource {
            rng: SystemRandom::new(),
            // Starts "used up": the first call draws a block.
            block: std::sync::Mutex::new((vec![0; NONCE_BLOCK], NONCE_BLOCK)),
        }
    }

    fn next(&self) -> Result<[u8; NONCE_LEN], CryptError> {
        let mut guard = self.block.lock().unwrap_or_else(|e| e.into_inner());
        let (block, pos) = &mut *guard;
        if *pos + NONCE_LEN > block.len() {
            self.rng.fill(block).map_err(|_| CryptError::Random)?;
            *pos = 0;
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&block[*pos..*pos + NONCE_LEN]);
        *pos += NONCE_LEN;
        Ok(nonce)
    }
}

impl fmt::Debug for Encryptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.key_id.as_str()).collect();
        f.debug_struct("Encryptor")
            .field("key_ids", &ids)
            .field("active_key_id", &self.keys[self.active].key_id)
            .field("keys", &"<redacted>")
            .finish()
    }
}

/// The payload digest key derived from an encryption key (see the module docs).
pub fn digest_key(secret: &[u8]) -> hmac::Key {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(secret);
    let okm = prk
        .expand(&[DIGEST_KEY_INFO], hmac::HMAC_SHA256)
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    hmac::Key::from(okm)
}

/// The associated data of a record: `<stream>\n<stream_sequence>\n<subject>`.
pub fn aad(stream: &str, stream_sequence: u64, subject: &str) -> Vec<u8> {
    format!("{stream}\n{stream_sequence}\n{subject}").into_bytes()
}

impl Encryptor {
    /// Loads every key of an enabled block. Errors name the key and source, never bytes.
    pub fn load(cfg: &EncryptionConfig) -> Result<Encryptor, Vec<String>> {
        let mut errors = Vec::new();
        let mut keys = Vec::new();
        let mut digest = None;
        for k in &cfg.keys {
            match k.source.load(KEY_BYTES, KEY_BYTES) {
                Ok(secret) => {
                    if k.key_id == cfg.digest_key_id {
                        digest = Some(digest_key(secret.expose()));
                    }
                    keys.push(aead_key(&k.key_id, &secret));
                }
                Err(e) => errors.push(format!("payload_encryption key {}: {e}", k.key_id)),
            }
        }
        let active = keys.iter().position(|k| k.key_id == cfg.active_key_id);
        match (active, digest, errors.is_empty()) {
            (Some(active), Some(digest_key), true) => Ok(Encryptor {
                cfg: cfg.clone(),
                keys,
                active,
                digest_key,
                nonces: NonceSource::new(),
            }),
            _ => {
                if errors.is_empty() {
                    errors.push("payload_encryption: active or digest key missing".into());
                }
                Err(errors)
            }
        }
    }

    pub fn config(&self) -> &EncryptionConfig {
        &self.cfg
    }

    /// Whether the payload of `subject` is encrypted.
    pub fn applies_to(&self, subject: &str) -> bool {
        self.cfg.action_for(subject) == Action::Encrypt
    }

    /// The keyed payload digest (hex) that replaces `payload_info.sha256`.
    pub fn payload_digest(&self, raw_payload: &[u8]) -> String {
        crate::text::hex::lower(hmac::sign(&self.digest_key, raw_payload).as_ref())
    }

    /// Counts `n` records sealed under `key_id` by an earlier run (a resumed replay's) against
    /// its bound, as if this process had sealed them. An id no longer configured is ignored.
    pub fn count_earlier(&self, key_id: &str, n: u64) {
        if let Some(key) = self.keys.iter().find(|k| k.key_id == key_id) {
            let _ = key
                .used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                    Some(u.saturating_add(n))
                });
        }
    }

    /// Records sealed so far under each key by this process, `(key_id, count)`.
    pub fn usage(&self) -> Vec<(&str, u64)> {
        self.keys
            .iter()
            .map(|k| (k.key_id.as_str(), k.used.load(Ordering::Relaxed)))
            .collect()
    }

    /// Encrypts the envelope's payload in place and replaces `payload_info.sha256` by the
    /// keyed digest of `raw_payload` (the bytes as received).
    pub fn encrypt(&self, env: &mut Envelope, raw_payload: &[u8]) -> Result<(), CryptError> {
        let key = &self.keys[self.active];
        let limit = self.cfg.max_messages_per_key;
        // Counted before use, never decremented: a refused record also spends nothing but
        // the count stays a strict upper bound of nonces drawn.
        if key.used.fetch_add(1, Ordering::Relaxed) >= limit {
            key.used.fetch_sub(1, Ordering::Relaxed);
            return Err(CryptError::KeyExhausted {
                key_id: key.key_id.clone(),
                limit,
            });
        }
        let nonce = self.nonces.next()?;
        let mut buf = env.payload.json().as_bytes().to_vec();
        buf.reserve(TAG_BYTES);
        key.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(&env.stream, env.stream_sequence, &env.subject)),
                &mut buf,
            )
            .map_err(|_| CryptError::Random)?;
        // Every value is plain ASCII (key ids are `[A-Za-z0-9_.-]`, base64): no escaping.
        let text = format!(
            "{{\"schema\":\"{ENCRYPTED_PAYLOAD_SCHEMA}\",\"alg\":\"{ALG}\",\"key_id\":\"{}\",\
             \"nonce\":\"{}\",\"ciphertext\":\"{}\"}}",
            key.key_id,
            B64.encode(nonce),
            B64.encode(&buf)
        );
        env.payload = Payload::from_compact_json(text).ok_or(CryptError::Random)?;
        env.payload_info.sha256 = self.payload_digest(raw_payload);
        env.payload_info.keyed = true;
        Ok(())
    }

    /// The plaintext (normalized payload JSON bytes) of a stored record: a JSON object with
    /// `stream`, `stream_sequence`, `subject` and an encrypted `payload` (file record,
    /// object-store object, or relational row as JSON).
    pub fn decrypt_record(&self, record: &Value) -> Result<Vec<u8>, CryptError> {
        let field = |name: &str| {
            record
                .get(name)
                .ok_or_else(|| CryptError::Format(format!("no {name} field")))
        };
        let stream = field("stream")?
            .as_str()
            .ok_or_else(|| CryptError::Format("stream is not a string".into()))?;
        let subject = field("subject")?
            .as_str()
            .ok_or_else(|| CryptError::Format("subject is not a string".into()))?;
        let seq = field("stream_sequence")?
            .as_u64()
            .ok_or_else(|| CryptError::Format("stream_sequence is not an integer".into()))?;
        let payload = field("payload")?;
        self.decrypt_payload(payload, &aad(stream, seq, subject))
    }

    /// Opens one `svc.encrypted_payload.v1` object with the given associated data.
    pub fn decrypt_payload(
        &self,
        payload: &Value,
        aad_bytes: &[u8],
    ) -> Result<Vec<u8>, CryptError> {
        let text = |name: &str| {
            payload.get(name).and_then(Value::as_str).ok_or_else(|| {
                CryptError::Format(format!("payload.{name} missing or not a string"))
            })
        };
        if text("schema")? != ENCRYPTED_PAYLOAD_SCHEMA {
            return Err(CryptError::Format(format!(
                "payload.schema is not {ENCRYPTED_PAYLOAD_SCHEMA}"
            )));
        }
        if text("alg")? != ALG {
            return Err(CryptError::Format(format!("payload.alg is not {ALG}")));
        }
        let key_id = text("key_id")?;
        let key = self
            .keys
            .iter()
            .find(|k| k.key_id == key_id)
            .ok_or_else(|| CryptError::UnknownKey(key_id.to_string()))?;
        let nonce: [u8; NONCE_LEN] = B64
            .decode(text("nonce")?)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or_else(|| CryptError::Format("payload.nonce is not base64 of 12 bytes".into()))?;
        let mut buf = B64
            .decode(text("ciphertext")?)
            .map_err(|_| CryptError::Format("payload.ciphertext is not base64".into()))?;
        let plain = key
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad_bytes),
                &mut buf,
            )
            .map_err(|_| CryptError::Open)?;
        Ok(plain.to_vec())
    }
}

fn aead_key(key_id: &str, secret: &Secret) -> AeadKey {
    AeadKey {
        key_id: key_id.to_string(),
        key: LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, secret.expose()).expect("32 bytes is an AES-256 key"),
        ),
        used: AtomicU64::new(0),
    }
}

#[cfg(test)]
#[path = "encryption_tests.rs"]
mod tests;
