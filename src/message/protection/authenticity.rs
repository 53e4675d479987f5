//! Publisher authenticity (`authenticity`): HMAC-SHA256 or Ed25519 signatures carried in
//! headers, checked against configured keys before anything else happens to the message.
//!
//! Signed bytes (`docs/payload-protection.md` has test vectors): the canonical JSON of
//! `{"message_id": <Nats-Msg-Id or null>, "payload_sha256": "<hex of the raw payload>",
//! "subject": "<subject>"}`: keys in that (sorted) order, no whitespace, UTF-8, strings
//! escaped as RFC 8785 does (`"` `\` and control characters only). The signature header holds
//! the standard base64 of the HMAC tag (32 bytes) or the Ed25519 signature (64 bytes).
//!
//! A present signature is always checked; a subject whose rule requires one refuses a message
//! without it. Every refusal is a permanent pre-sink failure with a value-free reason code.
//! Comparisons are ring's (`hmac::verify`, `signature::verify`): constant time.

use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::{hmac, signature};

use super::keys::{is_key_id, read_public_file, KeySource};
use crate::document::reader::ObjectReader;
use crate::message::envelope::{hex_sha256, RawMessage, MESSAGE_ID_HEADER};
use crate::message::subject::{read_pattern, SubjectPattern, SubjectRule, SubjectRules};

pub const MAX_KEYS: usize = 256;
pub const MAX_RULES: usize = crate::message::subject::MAX_RULES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    HmacSha256,
    Ed25519,
}

impl Algorithm {
    pub const ALL: &'static [(&'static str, Algorithm)] = &[
        ("hmac-sha256", Algorithm::HmacSha256),
        ("ed25519", Algorithm::Ed25519),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::HmacSha256 => "hmac-sha256",
            Algorithm::Ed25519 => "ed25519",
        }
    }
}

/// Where a verification key comes from (never the secret itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyKeySource {
    /// HMAC: base64 of 32 to 64 secret bytes in this variable.
    HmacSecret(KeySource),
    /// Ed25519: base64 of the 32-byte public key, inline.
    Ed25519Inline(String),
    /// Ed25519: a file holding the base64 of the 32-byte public key.
    Ed25519File(std::path::PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyKeyEntry {
    pub key_id: String,
    pub source: VerifyKeySource,
}

impl VerifyKeyEntry {
    pub fn algorithm(&self) -> Algorithm {
        match self.source {
            VerifyKeySource::HmacSecret(_) => Algorithm::HmacSha256,
            _ => Algorithm::Ed25519,
        }
    }
}

/// One subject rule, first match wins.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthRule {
    pub pattern: SubjectPattern,
    pub required: bool,
    /// Empty = every algorithm.
    pub algorithms: Vec<Algorithm>,
    /// Empty = every configured key of an allowed algorithm.
    pub key_ids: Vec<String>,
}

impl SubjectRule for AuthRule {
    fn pattern(&self) -> &SubjectPattern {
        &self.pattern
    }
}

/// The `authenticity` block.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthenticityConfig {
    pub enabled: bool,
    pub alg_header: String,
    pub key_id_header: String,
    pub signature_header: String,
    pub keys: Vec<VerifyKeyEntry>,
    pub rules: SubjectRules<AuthRule>,
    /// Subjects no rule matches: signature required or not. Defaults to false.
    pub default_required: bool,
}

impl Default for AuthenticityConfig {
    fn default() -> Self {
        AuthenticityConfig {
            enabled: false,
            alg_header: "Svc-Signature-Alg".into(),
            key_id_header: "Svc-Signature-Key-Id".into(),
            signature_header: "Svc-Signature".into(),
            keys: Vec::new(),
            rules: SubjectRules::default(),
            default_required: false,
        }
    }
}

impl AuthenticityConfig {
    /// Reads the block (absent = disabled).
    pub fn read(r: Option<ObjectReader<'_>>) -> AuthenticityConfig {
        let d = AuthenticityConfig::default();
        let Some(mut r) = r else {
            return d;
        };
        let enabled = r.bool_or("enabled", false);
        let alg_header = r.header_name_or("alg_header", &d.alg_header);
        let key_id_header = r.header_name_or("key_id_header", &d.key_id_header);
        let signature_header = r.header_name_or("signature_header", &d.signature_header);
        if alg_header == key_id_header
            || alg_header == signature_header
            || key_id_header == signature_header
        {
            r.problem(
                "signature_header",
                "alg_header, key_id_header and signature_header must differ",
            );
        }
        let key_readers = r.objects("keys");
        if key_readers.len() > MAX_KEYS {
            r.problem("keys", format!("must have at most {MAX_KEYS} entries"));
        }
        let mut keys: Vec<VerifyKeyEntry> = Vec::new();
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
            let secret_env = k.opt_string("secret_env");
            let inline = k.opt_string("public_key_b64");
            let file = k.opt_nonempty("public_key_file");
            let source = match (secret_env, inline, file) {
                (Some(v), None, None) if crate::document::grammar::is_env_var_name(&v) => {
                    Some(VerifyKeySource::HmacSecret(KeySource::Env(v)))
                }
                (Some(_), None, None) => {
                    k.problem("secret_env", "must be an environment variable name");
                    None
                }
                (None, Some(b), None) => match B64.decode(b.trim()) {
                    Ok(bytes) if bytes.len() == 32 => Some(VerifyKeySource::Ed25519Inline(b)),
                    _ => {
                        k.problem(
                            "public_key_b64",
                            "must be the base64 of a 32-byte Ed25519 public key",
                        );
                        None
                    }
                },
                (None, None, Some(p)) => Some(VerifyKeySource::Ed25519File(p.into())),
                (None, None, None) => {
                    k.problem(
                        "secret_env",
                        "is required (hmac-sha256), or public_key_b64 / public_key_file (ed25519)",
                    );
                    None
                }
                _ => {
                    k.problem(
                        "secret_env",
                        "set exactly one of secret_env, public_key_b64, public_key_file",
                    );
                    None
                }
            };
            k.finish();
            if let Some(source) = source {
                keys.push(VerifyKeyEntry { key_id, source });
            }
        }
        if enabled && keys.is_empty() {
            r.problem("keys", "must name at least one key when enabled is true");
        }
        let default_required = r.bool_or("default_required", false);
        let rule_readers = r.objects_at_most("rules", MAX_RULES);
        let mut rules = Vec::new();
        for mut rr in rule_readers {
            let pattern = read_pattern(&mut rr, "subject");
            let required = rr.bool_or("required", true);
            let mut algorithms = Vec::new();
            for (i, a) in rr.string_list("algorithms").iter().enumerate() {
                match Algorithm::ALL.iter().find(|(n, _)| n == a) {
                    Some((_, alg)) => algorithms.push(*alg),
                    None => rr.problems().push(
                        format!("{}[{i}]", rr.path_of("algorithms")),
                        "must be one of: hmac-sha256, ed25519",
                    ),
                }
            }
            let key_ids = rr.string_list("key_ids");
            for (i, id) in key_ids.iter().enumerate() {
                if !keys.iter().any(|k| &k.key_id == id) {
                    rr.problems().push(
                        format!("{}[{i}]", rr.path_of("key_ids")),
                        "must name one of authenticity.keys[].key_id",
                    );
                }
            }
            rr.finish();
            if let Some(pattern) = pattern {
                rules.push(AuthRule {
                    pattern,
                    required,
                    algorithms,
                    key_ids,
                });
            }
        }
        r.finish();
        AuthenticityConfig {
            enabled,
            alg_header,
            key_id_header,
            signature_header,
            keys,
            rules: SubjectRules::new(rules),
            default_required,
        }
    }

    /// The three header names (never copied into a DLQ record).
    pub fn headers(&self) -> [&str; 3] {
        [
            &self.alg_header,
            &self.key_id_header,
            &self.signature_header,
        ]
    }
}

/// Why a message was refused. Codes are stable (DLQ `failure.reason`, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// The subject requires a signature and the message has none.
    MissingSignature,
    /// Some but not all signature headers, a repeated header, or a signature that is not
    /// base64 of the algorithm's length.
    MalformedSignature,
    /// The algorithm is unknown or not allowed for the subject.
    DisallowedAlgorithm,
    /// No configured key of that id and algorithm, or not allowed for the subject.
    UnknownKey,
    /// The signature does not verify.
    BadSignature,
}

impl AuthFailure {
    pub const ALL: &'static [AuthFailure] = &[
        AuthFailure::MissingSignature,
        AuthFailure::MalformedSignature,
        AuthFailure::DisallowedAlgorithm,
        AuthFailure::UnknownKey,
        AuthFailure::BadSignature,
    ];

    pub fn code(self) -> &'static str {
        match self {
            AuthFailure::MissingSignature => "missing_signature",
            AuthFailure::MalformedSignature => "malformed_signature",
            AuthFailure::DisallowedAlgorithm => "disallowed_algorithm",
            AuthFailure::UnknownKey => "unknown_key",
            AuthFailure::BadSignature => "bad_signature",
        }
    }
}

impl fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthFailure::MissingSignature => {
                "authenticity: the subject requires a signature and the message has none"
            }
            AuthFailure::MalformedSignature => {
                "authenticity: signature headers incomplete, repeated or not decodable"
            }
            AuthFailure::DisallowedAlgorithm => {
                "authenticity: signature algorithm not allowed for the subject"
            }
            AuthFailure::UnknownKey => {
                "authenticity: signing key id unknown or not allowed for the subject"
            }
            AuthFailure::BadSignature => "authenticity: signature does not verify",
        })
    }
}

/// The outcome of a message that passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthOutcome {
    Verified(Algorithm),
    /// No signature, and none required.
    Unsigned,
}

enum VerifyKey {
    Hmac(hmac::Key),
    Ed25519(signature::UnparsedPublicKey<Vec<u8>>),
}

/// Loaded verification keys and rules. `Debug` shows key ids only.
pub struct Verifier {
    cfg: AuthenticityConfig,
    keys: Vec<(String, VerifyKey)>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.0.as_str()).collect();
        f.debug_struct("Verifier")
            .field("key_ids", &ids)
            .field("keys", &"<redacted>")
            .finish()
    }
}

/// The signed bytes of a message (see the module docs).
pub fn signed_bytes(message_id: Option<&str>, payload: &[u8], subject: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + subject.len());
    out.extend_from_slice(b"{\"message_id\":");
    // serde_json escapes exactly `"`, `\` and control characters, as RFC 8785 does.
    match message_id {
        Some(m) => serde_json::to_writer(&mut out, m).expect("a string serializes"),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"payload_sha256\":\"");
    out.extend_from_slice(hex_sha256(payload).as_bytes());
    out.extend_from_slice(b"\",\"subject\":");
    serde_json::to_writer(&mut out, subject).expect("a string serializes");
    out.push(b'}');
    out
}

impl Verifier {
    /// Loads every key. Errors name the key and source, never bytes.
    pub fn load(cfg: &AuthenticityConfig) -> Result<Verifier, Vec<String>> {
        let mut errors = Vec::new();
        let mut keys = Vec::new();
        for k in &cfg.keys {
            let loaded = match &k.source {
                VerifyKeySource::HmacSecret(src) => src
                    .load(32, 64)
                    .map(|s| VerifyKey::Hmac(hmac::Key::new(hmac::HMAC_SHA256, s.expose()))),
                VerifyKeySource::Ed25519Inline(b) => ed25519_key(b),
                VerifyKeySource::Ed25519File(p) => read_public_file(p)
                    .map_err(|e| format!("public key file {}: {e}", p.display()))
                    .and_then(|t| ed25519_key(&t)),
            };
            match loaded {
                Ok(key) => keys.push((k.key_id.clone(), key)),
                Err(e) => errors.push(format!("authenticity key {}: {e}", k.key_id)),
            }
        }
        if errors.is_empty() {
            Ok(Verifier {
                cfg: cfg.clone(),
                keys,
            })
        } else {
            Err(errors)
        }
    }

    /// Checks one message.
    pub fn check(&self, msg: &RawMessage) -> Result<AuthOutcome, AuthFailure> {
        let rule = self
            .cfg
            .rules
            .first_match(&msg.subject)
            .map(|(_, rule)| rule);
        let required = rule.map_or(self.cfg.default_required, |r| r.required);
        let one = |name: &str| -> Result<Option<&str>, AuthFailure> {
            let mut it = msg.headers.iter().filter(|(k, _)| k == name);
            let first = it.next().map(|(_, v)| v.as_str());
            if it.next().is_some() {
                return Err(AuthFailure::MalformedSignature);
            }
            Ok(first)
        };
        let (alg, key_id, sig) = match (
            one(&self.cfg.alg_header)?,
            one(&self.cfg.key_id_header)?,
            one(&self.cfg.signature_header)?,
        ) {
            (None, None, None) if required => return Err(AuthFailure::MissingSignature),
            (None, None, None) => return Ok(AuthOutcome::Unsigned),
            (Some(a), Some(k), Some(s)) => (a, k, s),
            _ => return Err(AuthFailure::MalformedSignature),
        };
        let alg = Algorithm::ALL
            .iter()
            .find(|(n, _)| *n == alg)
            .map(|(_, a)| *a)
            .filter(|a| rule.is_none_or(|r| r.algorithms.is_empty() || r.algorithms.contains(a)))
            .ok_or(AuthFailure::DisallowedAlgorithm)?;
        let allowed_id =
            rule.is_none_or(|r| r.key_ids.is_empty() || r.key_ids.iter().any(|k| k == key_id));
        let key = self
            .keys
            .iter()
            .filter(|_| allowed_id)
            .find(|(id, k)| {
                id == key_id
                    && matches!(
                        (k, alg),
                        (VerifyKey::Hmac(_), Algorithm::HmacSha256)
                            | (VerifyKey::Ed25519(_), Algorithm::Ed25519)
                    )
            })
            .map(|(_, k)| k)
            .ok_or(AuthFailure::UnknownKey)?;
        let sig = B64
            .decode(sig.trim())
            .map_err(|_| AuthFailure::MalformedSignature)?;
        let signed = signed_bytes(msg.header(MESSAGE_ID_HEADER), &msg.data, &msg.subject);
        let ok = match key {
            VerifyKey::Hmac(k) => sig.len() == 32 && hmac::verify(k, &signed, &sig).is_ok(),
            VerifyKey::Ed25519(k) => sig.len() == 64 && k.verify(&signed, &sig).is_ok(),
        };
        if ok {
            Ok(AuthOutcome::Verified(alg))
        } else if sig.len() != 32 && sig.len() != 64 {
            Err(AuthFailure::MalformedSignature)
        } else {
            Err(AuthFailure::BadSignature)
        }
    }
}

fn ed25519_key(b64: &str) -> Result<VerifyKey, String> {
    match B64.decode(b64.trim()) {
        Ok(bytes) if bytes.len() == 32 => Ok(VerifyKey::Ed25519(
            signature::UnparsedPublicKey::new(&signature::ED25519, bytes),
        )),
        _ => Err("is not the base64 of a 32-byte Ed25519 public key".into()),
    }
}

#[cfg(test)]
#[path = "authenticity_tests.rs"]
mod tests;
