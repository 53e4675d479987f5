//! Custody evidence (`custody`): every record carries `svc.custody.v1` digests of the payload
//! as received and of the record as stored, so an altered record can be detected later with
//! `svc verify-custody`.
//!
//! The canonical record (sink-independent; `docs/payload-protection.md` is the reference) is
//! the canonical JSON of the object made of the record's fields [`RECORD_FIELDS`], which every
//! sink stores under these names (the relational row under its column names, mapped back by
//! [`record_fields`]). The record digest is over the canonical JSON of
//! `{"custody": <the custody block without record_digest>, "record": <canonical record>}`, so
//! the custody block's own fields (runner id, times, payload digest) are covered too.
//!
//! Canonical JSON is the project's one writer of it ([`crate::document::canonical`]): keys
//! sorted by their UTF-8 bytes, no whitespace, numbers by their exact value (so `1e2`, `100.0`
//! and `100` agree, as PostgreSQL's `jsonb` rewrites them, and no two different numbers do).
//! A stored record is read back strictly: a duplicate key makes it unverifiable.
//!
//! The configuration, never the stored block, chooses the check: with a key configured only
//! a keyed block can be intact.

use std::fmt;

use std::borrow::Cow;

use ring::digest;
use ring::hmac;

use super::keys::{KeySource, Secret};
use crate::document::reader::ObjectReader;
pub use crate::message::envelope::Custody;
use crate::message::envelope::Envelope;
use crate::text::rfc3339::format_rfc3339_nanos;

use super::canonical::canonical_envelope;
use crate::document::canonical::{self, write_string as string, Json};

pub const CUSTODY_SCHEMA: &str = "svc.custody.v1";
pub use super::canonical::{OPTIONAL_RECORD_FIELD, RECORD_FIELDS};

/// The `custody` block.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CustodyConfig {
    pub enabled: bool,
    /// The runner's identity written into every block.
    pub runner_id: String,
    /// HMAC key (base64 of 32 to 64 bytes) in this variable; unkeyed SHA-256 without it.
    pub hmac_key: Option<KeySource>,
    /// `custody.checkpoints`: signed checkpoints per sink ([`super::checkpoint`]).
    pub checkpoints: super::checkpoint::CheckpointConfig,
}

impl CustodyConfig {
    pub fn read(r: Option<ObjectReader<'_>>) -> CustodyConfig {
        let Some(mut r) = r else {
            return CustodyConfig::default();
        };
        let enabled = r.bool_or("enabled", false);
        let runner_id = r.opt_string("runner_id").unwrap_or_default();
        let ok_id = !runner_id.is_empty()
            && runner_id.len() <= 128
            && runner_id.bytes().all(|b| b.is_ascii_graphic());
        if (enabled || !runner_id.is_empty()) && !ok_id {
            r.problem(
                "runner_id",
                "is required: 1 to 128 printable ASCII characters without spaces",
            );
        }
        let hmac_key = match r.opt_string("hmac_key_env") {
            Some(v) if crate::document::grammar::is_env_var_name(&v) => Some(KeySource::Env(v)),
            Some(_) => {
                r.problem("hmac_key_env", "must be an environment variable name");
                None
            }
            None => None,
        };
        let checkpoints = super::checkpoint::CheckpointConfig::read(r.object("checkpoints"));
        if checkpoints.enabled && !enabled {
            r.problem("checkpoints", "need custody.enabled: true");
        }
        r.finish();
        CustodyConfig {
            enabled,
            runner_id,
            hmac_key,
            checkpoints,
        }
    }
}

/// Seals and verifies. `Debug` never shows the key.
pub struct Custodian {
    runner_id: String,
    key: Option<hmac::Key>,
}

impl fmt::Debug for Custodian {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Custodian")
            .field("runner_id", &self.runner_id)
            .field("keyed", &self.key.is_some())
            .finish()
    }
}

/// How one stored record fared in [`Custodian::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Intact,
    /// The digest differs: the record or its custody block was changed.
    Altered,
    /// Cannot be checked (no custody block, unknown algorithm, not a record); the reason.
    Unverifiable(String),
}

impl Custodian {
    pub fn load(cfg: &CustodyConfig) -> Result<Custodian, String> {
        let key = match &cfg.hmac_key {
            Some(src) => {
                let secret: Secret = src
                    .load(32, 64)
                    .map_err(|e| format!("custody.hmac_key_env: {e}"))?;
                Some(hmac::Key::new(hmac::HMAC_SHA256, secret.expose()))
            }
            None => None,
        };
        Ok(Custodian {
            runner_id: cfg.runner_id.clone(),
            key,
        })
    }

    /// The runner id this custodian seals with.
    pub fn runner_id(&self) -> &str {
        &self.runner_id
    }

    fn alg(&self) -> &'static str {
        if self.key.is_some() {
            "hmac-sha256"
        } else {
            "sha256"
        }
    }

    fn digest(&self, data: &[u8]) -> String {
        match &self.key {
            Some(k) => crate::text::hex::lower(hmac::sign(k, data).as_ref()),
            None => crate::text::hex::lower(digest::digest(&digest::SHA256, data).as_ref()),
        }
    }

    /// Computes and sets the envelope's custody block (last step before the sinks).
    pub fn seal(&self, env: &mut Envelope, raw_payload: &[u8], sealed_unix_nanos: i128) {
        env.custody = None;
        let mut custody = Custody {
            schema: CUSTODY_SCHEMA.into(),
            alg: self.alg().into(),
            runner_id: self.runner_id.clone(),
            received_at: env.metadata.received_at.as_str().to_string(),
            sealed_at: format_rfc3339_nanos(sealed_unix_nanos),
            payload_digest: self.digest(raw_payload),
            record_digest: String::new(),
        };
        let mut input = Vec::with_capacity(512 + env.payload.json().len());
        digest_input_head(&mut input, &custody);
        // Written straight from the envelope: byte for byte what `canonical_json` gives for
        // the envelope's JSON (a test compares the two), at a fraction of the cost.
        canonical_envelope(&mut input, env);
        input.push(b'}');
        custody.record_digest = self.digest(&input);
        env.custody = Some(custody);
    }

    /// Reads a stored record's text strictly and checks it (see [`Custodian::verify`]).
    pub fn verify_text(&self, record: &str) -> Verdict {
        match canonical::parse(record) {
            Ok(doc) => self.verify(&doc),
            Err(e) => Verdict::Unverifiable(format!("the record is not strict JSON: {e}")),
        }
    }

    /// Recomputes the record digest of a stored record and compares.
    pub fn verify(&self, stored: &Json<'_>) -> Verdict {
        let fields = match record_fields(stored) {
            Ok(f) => f,
            Err(e) => return Verdict::Unverifiable(e),
        };
        let not_v1 = || Verdict::Unverifiable("the custody block is not svc.custody.v1".into());
        let custody = match fields.iter().find(|(k, _)| k == "custody") {
            None | Some((_, Json::Null)) => {
                return Verdict::Unverifiable("the record has no custody block".into())
            }
            Some((_, block)) => match custody_block(block) {
                Some(c) => c,
                None => return not_v1(),
            },
        };
        if custody.schema != CUSTODY_SCHEMA {
            return not_v1();
        }
        let Ok(input) = digest_input(fields, &custody) else {
            return Verdict::Unverifiable("the record lacks fields of the canonical record".into());
        };
        let Some(stored_digest) = decode_hex(&custody.record_digest) else {
            return Verdict::Altered;
        };
        let ok = match (custody.alg.as_str(), &self.key) {
            ("hmac-sha256", Some(k)) => hmac::verify(k, &input, &stored_digest).is_ok(),
            ("hmac-sha256", None) => {
                return Verdict::Unverifiable(
                    "keyed (hmac-sha256) custody needs custody.hmac_key_env".into(),
                )
            }
            // With a key configured, an unkeyed block proves nothing: anyone who can edit the
            // store can recompute a plain digest.
            ("sha256", Some(_)) => {
                return Verdict::Unverifiable(
                    "unkeyed (sha256) custody where custody.hmac_key_env is configured: \
                     only keyed blocks can be intact"
                        .into(),
                )
            }
            ("sha256", None) => {
                digest::digest(&digest::SHA256, &input).as_ref() == stored_digest.as_slice()
            }
            _ => return Verdict::Unverifiable("unknown custody algorithm".into()),
        };
        if ok {
            Verdict::Intact
        } else {
            Verdict::Altered
        }
    }
}

/// The checkpoint digest of an envelope sealed by [`Custodian::seal`]: plain SHA-256 of the
/// bytes its record digest covers (no key, so a public-key verifier can recompute it from
/// the stored record). `None` without a custody block.
pub fn public_digest(env: &Envelope) -> Option<[u8; 32]> {
    let custody = env.custody.as_ref()?;
    let mut input = Vec::with_capacity(512 + env.payload.json().len());
    digest_input_head(&mut input, custody);
    canonical_envelope(&mut input, env);
    input.push(b'}');
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, &input).as_ref());
    Some(out)
}

/// What a checkpoint verifier needs of a stored record: its stream sequence, the runner id
/// of its custody block and its [`public_digest`], recomputed from the stored fields.
pub fn public_digest_stored(stored: &Json<'_>) -> Result<(u64, String, [u8; 32]), String> {
    let fields = record_fields(stored)?;
    let seq = stored
        .get("stream_sequence")
        .map(|n| {
            let mut t = Vec::new();
            canonical::write(&mut t, n);
            t
        })
        .and_then(|t| std::str::from_utf8(&t).ok()?.parse::<u64>().ok())
        .ok_or("no integer stream_sequence")?;
    let custody = match fields.iter().find(|(k, _)| k == "custody") {
        Some((_, block)) => {
            custody_block(block).ok_or("the custody block is not svc.custody.v1")?
        }
        None => return Err("the record has no custody block".into()),
    };
    let input = digest_input(fields, &custody)?;
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, &input).as_ref());
    Ok((seq, custody.runner_id, out))
}

/// The custody block's fields, all strings; `None` when it is not one.
fn custody_block(block: &Json<'_>) -> Option<Custody> {
    let text = |name: &str| block.get(name).and_then(Json::as_str).map(str::to_string);
    Some(Custody {
        schema: text("schema")?,
        alg: text("alg")?,
        runner_id: text("runner_id")?,
        received_at: text("received_at")?,
        sealed_at: text("sealed_at")?,
        payload_digest: text("payload_digest")?,
        record_digest: text("record_digest")?,
    })
}

type Members<'a> = Vec<(Cow<'a, str>, Json<'a>)>;

/// The record's fields under their envelope names: a file record, an object-store object or
/// an envelope as is; a relational row (`payload_sha256`, `metadata_json`, ... columns)
/// mapped back to the envelope's names.
pub fn record_fields<'a>(stored: &Json<'a>) -> Result<Members<'a>, String> {
    let Json::Object(obj) = stored else {
        return Err("the record is not a JSON object".into());
    };
    if stored.get("metadata_json").is_none() {
        return Ok(obj.clone());
    }
    let mut out = obj.clone();
    let mut take = |from: &str| match out.iter().position(|(k, _)| k == from) {
        Some(i) => out.remove(i).1,
        None => Json::Null,
    };
    // In key order, as an object from `parse` has its members.
    let info = Json::Object(vec![
        ("original_format".into(), take("payload_original_format")),
        ("sha256".into(), take("payload_sha256")),
        ("size_bytes".into(), take("payload_size_bytes")),
        ("wrapped".into(), boolean_column(take("payload_wrapped"))),
    ]);
    let security_labels = take("security_labels_json");
    let mission_metadata = take("mission_metadata_json");
    let metadata = take("metadata_json");
    let custody = take("custody_json");
    out.push(("payload_info".into(), info));
    out.push(("security_labels".into(), security_labels));
    out.push(("mission_metadata".into(), mission_metadata));
    out.push(("metadata".into(), metadata));
    out.push(("custody".into(), custody));
    Ok(out)
}

/// A boolean column as MySQL exports it: `BOOLEAN` is `TINYINT(1)`, so 0 and 1 are false and
/// true; any other value stays as it is (and does not verify).
fn boolean_column(v: Json<'_>) -> Json<'_> {
    if let Json::Number(_) = &v {
        let mut text = Vec::new();
        canonical::write(&mut text, &v);
        match text.as_slice() {
            b"0" => return Json::Bool(false),
            b"1" => return Json::Bool(true),
            _ => {}
        }
    }
    v
}

/// The bytes the record digest covers: canonical JSON of `{"custody": ..., "record": ...}`,
/// the record being `fields` restricted to [`RECORD_FIELDS`] (all of them required) and
/// [`OPTIONAL_RECORD_FIELD`] when it is there and not null.
fn digest_input(mut fields: Members<'_>, custody: &Custody) -> Result<Vec<u8>, String> {
    fields.retain(|(k, v)| {
        RECORD_FIELDS.contains(&k.as_ref())
            || (k.as_ref() == OPTIONAL_RECORD_FIELD && !matches!(v, Json::Null))
    });
    if let Some(missing) = RECORD_FIELDS
        .iter()
        .find(|f| !fields.iter().any(|(k, _)| k == *f))
    {
        return Err(format!("no {missing} field"));
    }
    fields.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut out = Vec::with_capacity(1024);
    digest_input_head(&mut out, custody);
    canonical::write(&mut out, &Json::Object(fields));
    out.push(b'}');
    Ok(out)
}

/// `{"custody":<block without record_digest>,"record":` (the outer keys in sorted order).
fn digest_input_head(out: &mut Vec<u8>, custody: &Custody) {
    out.extend_from_slice(b"{\"custody\":{\"alg\":");
    string(out, &custody.alg);
    out.extend_from_slice(b",\"payload_digest\":");
    string(out, &custody.payload_digest);
    out.extend_from_slice(b",\"received_at\":");
    string(out, &custody.received_at);
    out.extend_from_slice(b",\"runner_id\":");
    string(out, &custody.runner_id);
    out.extend_from_slice(b",\"schema\":");
    string(out, &custody.schema);
    out.extend_from_slice(b",\"sealed_at\":");
    string(out, &custody.sealed_at);
    out.extend_from_slice(b"},\"record\":");
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
#[path = "custody_tests.rs"]
mod tests;
