//! Signed custody checkpoints (`custody.checkpoints`): per sink and runner, a chain of
//! Ed25519-signed statements "these stream sequences, with these record digests, are what I
//! committed since my previous checkpoint", so a deleted record is named by a public-key
//! check (`svc verify-custody --public-key`). Design and reasons: `docs/payload-protection.md`,
//! "Custody checkpoints".
//!
//! A stored checkpoint is one JSON object:
//! `{"schema":"svc.custody.checkpoint.v1","signed":"<body>","signature":"<base64>","leaves":[..]}`
//! where `<body>` is the canonical JSON text that is signed (verbatim bytes, so no reader has
//! to re-encode anything to check the signature) and `leaves` the `[sequence, "<hex digest>"]`
//! pairs the body's Merkle `root` covers (RFC 6962: leaf `SHA-256(0x00 || seq_be64 || digest)`,
//! node `SHA-256(0x01 || left || right)`). The leaves are outside the signature: the root
//! authenticates them.
//!
//! Stored checkpoints are hostile: read strictly (no duplicate keys), bounded, and the key
//! that checks one is chosen by the verifier's own map of trusted key ids, never by the
//! checkpoint.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use base64::Engine;
use ring::digest::{self, SHA256};
use ring::signature::{self, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

use super::keys::{decode_base64_into, is_key_id, read_private_file, read_public_file};
use crate::document::canonical::{self, write_string as string};
use crate::document::reader::ObjectReader;
use crate::text::secret_bytes::{SecretBytes, SecretString};

pub const CHECKPOINT_SCHEMA: &str = "svc.custody.checkpoint.v1";
/// Largest stored checkpoint read (`every_records` at its maximum takes about 9 MiB).
pub const MAX_CHECKPOINT_BYTES: u64 = 16 << 20;
pub const MAX_EVERY_RECORDS: i64 = 100_000;

/// `custody.checkpoints`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointConfig {
    pub enabled: bool,
    pub every_records: usize,
    pub every_seconds: u64,
    /// Ed25519 private key: base64 of a 32-byte seed or of PKCS#8 DER, or PKCS#8 PEM.
    pub signing_key_file: PathBuf,
    pub key_id: String,
    /// `head_file`: the runner's own copy of its chain head, outside the sink (empty until
    /// [`CheckpointConfig::default_head_file`] fills it beside the configuration file).
    pub head_file: PathBuf,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            enabled: false,
            every_records: 1000,
            every_seconds: 60,
            signing_key_file: PathBuf::new(),
            key_id: String::new(),
            head_file: PathBuf::new(),
        }
    }
}

impl CheckpointConfig {
    pub fn read(r: Option<ObjectReader<'_>>) -> CheckpointConfig {
        let Some(mut r) = r else {
            return CheckpointConfig::default();
        };
        let enabled = r.bool_or("enabled", false);
        let every_records = r.int_in("every_records", 1000, 1, MAX_EVERY_RECORDS) as usize;
        let every_seconds = r.int_in("every_seconds", 60, 1, 86_400) as u64;
        let signing_key_file = r.opt_nonempty("signing_key_file").unwrap_or_default();
        let key_id = r.opt_string("key_id").unwrap_or_default();
        let head_file = r.opt_nonempty("head_file").unwrap_or_default();
        if enabled && signing_key_file.is_empty() {
            r.problem(
                "signing_key_file",
                "is required when checkpoints are enabled",
            );
        }
        if enabled && !is_key_id(&key_id) {
            r.problem(
                "key_id",
                "is required: 1 to 64 characters of A-Z a-z 0-9 _ - .",
            );
        }
        r.finish();
        CheckpointConfig {
            enabled,
            every_records,
            every_seconds,
            signing_key_file: PathBuf::from(signing_key_file),
            key_id,
            head_file: PathBuf::from(head_file),
        }
    }

    /// Sets `head_file`, when not configured, to `<config file>.custody-head` (beside the
    /// configuration, as `svc replay`'s state file is).
    pub fn default_head_file(&mut self, config: &std::path::Path) {
        if self.head_file.as_os_str().is_empty() {
            let mut name = config.file_name().unwrap_or_default().to_os_string();
            name.push(".custody-head");
            self.head_file = config.with_file_name(name);
        }
    }
}

/// Text between PEM armour lines, or the text itself, without whitespace, appended to `out`
/// (reserved once for all of `text`: a private key's body is built without reallocation).
fn pem_body_into(text: &str, out: &mut String) {
    out.reserve_exact(text.len());
    if !text.contains("-----BEGIN") {
        text.split_whitespace().for_each(|w| out.push_str(w));
        return;
    }
    text.lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(|l| l.split_whitespace())
        .for_each(|w| out.push_str(w));
}

fn b64(text: &str) -> Option<Vec<u8>> {
    let mut body = String::new();
    pem_body_into(text, &mut body);
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

/// The private key file's bytes: the file's text, the PEM body and the decoded bytes are each
/// held by a wiping owner (`crate::text::secret_bytes`), so all three are wiped on every path.
fn private_key_bytes(text: &SecretString) -> Option<SecretBytes> {
    let mut body = SecretString::default();
    pem_body_into(text.expose(), body.expose_mut());
    let mut bytes = SecretBytes::default();
    decode_base64_into(body.expose(), bytes.expose_mut()).ok()?;
    Some(bytes)
}

/// The checkpoint signer. `Debug` shows the key id only.
pub struct Signer {
    key_id: String,
    pair: Ed25519KeyPair,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .finish()
    }
}

impl Signer {
    /// Reads the key file (the payload keys' file rules: regular, no link, owner only).
    pub fn load(cfg: &CheckpointConfig) -> Result<Signer, String> {
        let what = format!(
            "custody.checkpoints.signing_key_file {}",
            cfg.signing_key_file.display()
        );
        let text = read_private_file(&cfg.signing_key_file).map_err(|e| format!("{what}: {e}"))?;
        let bytes = private_key_bytes(&text)
            .ok_or_else(|| format!("{what}: does not hold base64 or PEM"))?;
        // ring's key pair keeps its own copy of the seed's expansion, not wiped on drop
        // (docs/security.md, "Secrets in memory").
        let pair = if bytes.len() == 32 {
            Ed25519KeyPair::from_seed_unchecked(bytes.expose())
        } else {
            Ed25519KeyPair::from_pkcs8_maybe_unchecked(bytes.expose())
        }
        .map_err(|_| format!("{what}: not an Ed25519 seed or PKCS#8 key"))?;
        Ok(Signer {
            key_id: cfg.key_id.clone(),
            pair,
        })
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    pub fn public_key(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.pair.public_key().as_ref());
        out
    }

    pub fn sign(&self, body: &[u8]) -> Vec<u8> {
        self.pair.sign(body).as_ref().to_vec()
    }
}

/// DER prefix of an Ed25519 SubjectPublicKeyInfo (`openssl pkey -pubout`).
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// A public key from its file text: base64 of the raw 32 bytes, or an SPKI PEM.
pub fn parse_public_key(text: &str) -> Result<[u8; 32], String> {
    let bytes = b64(text).ok_or("does not hold base64 or PEM")?;
    let raw = match bytes.len() {
        32 => &bytes[..],
        44 if bytes[..12] == SPKI_PREFIX => &bytes[12..],
        n => return Err(format!("holds {n} bytes, not an Ed25519 public key")),
    };
    let mut out = [0u8; 32];
    out.copy_from_slice(raw);
    Ok(out)
}

/// Trusted public keys by key id (`--public-key [ID=]FILE`).
#[derive(Debug, Default, Clone)]
pub struct TrustedKeys(pub BTreeMap<String, [u8; 32]>);

impl TrustedKeys {
    /// The public half of the configuration's own signing key, under its key id (what a
    /// drain checks checkpoint frames with when no `--public-key` is given).
    pub fn own(cfg: &CheckpointConfig) -> Result<TrustedKeys, String> {
        let signer = Signer::load(cfg)?;
        let mut trusted = TrustedKeys::default();
        trusted
            .0
            .insert(signer.key_id().to_string(), signer.public_key());
        Ok(trusted)
    }

    /// Adds `ID=FILE` or `FILE` (then under `default_id`), read with the public key rules.
    pub fn add(&mut self, arg: &str, default_id: &str) -> Result<(), String> {
        let (id, path) = match arg.split_once('=') {
            Some((id, p)) if is_key_id(id) => (id.to_string(), p),
            _ => (default_id.to_string(), arg),
        };
        if !is_key_id(&id) {
            return Err(format!(
                "--public-key {arg}: no key id (give ID=FILE or set custody.checkpoints.key_id)"
            ));
        }
        let text = read_public_file(std::path::Path::new(path))
            .map_err(|e| format!("--public-key {path}: {e}"))?;
        let key = parse_public_key(&text).map_err(|e| format!("--public-key {path}: {e}"))?;
        self.0.insert(id, key);
        Ok(())
    }
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&SHA256, data).as_ref());
    out
}

fn leaf_hash(seq: u64, d: &[u8; 32]) -> [u8; 32] {
    let mut buf = [0u8; 41];
    buf[1..9].copy_from_slice(&seq.to_be_bytes());
    buf[9..].copy_from_slice(d);
    sha256(&buf)
}

fn node_hash(l: &[u8; 32], r: &[u8; 32]) -> [u8; 32] {
    let mut buf = [0u8; 65];
    buf[0] = 1;
    buf[1..33].copy_from_slice(l);
    buf[33..].copy_from_slice(r);
    sha256(&buf)
}

/// The RFC 6962 Merkle tree hash of the leaves in order (SHA-256 of nothing when empty).
pub fn merkle_root(leaves: &[(u64, [u8; 32])]) -> [u8; 32] {
    let mut level: Vec<[u8; 32]> = leaves.iter().map(|(s, d)| leaf_hash(*s, d)).collect();
    if level.is_empty() {
        return sha256(b"");
    }
    // Pairing left to right and promoting an odd last node gives RFC 6962's split at the
    // largest power of two below n.
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|c| match c {
                [l, r] => node_hash(l, r),
                [one] => *one,
                _ => unreachable!("chunks of two"),
            })
            .collect();
    }
    level[0]
}

/// What one checkpoint states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    pub runner_id: String,
    pub key_id: String,
    pub sink: String,
    pub index: u64,
    pub first_sequence: u64,
    pub last_sequence: u64,
    pub count: u64,
    pub root: [u8; 32],
    /// Hex digest of the previous checkpoint's body; empty for index 0.
    pub previous: String,
    /// Sequences the runner itself left out (dead-lettered, refused), with the reason code.
    pub gaps: Vec<(u64, String)>,
    pub created_at: String,
    /// The stream every sequence here is of, and its incarnation (its creation time,
    /// `broker/incarnation.rs`; empty when not known): a sequence names a message only
    /// within one incarnation of one stream.
    pub stream: String,
    pub stream_incarnation: String,
}

impl Body {
    /// The canonical JSON text (sorted keys, no whitespace) that is signed.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(512 + 32 * self.gaps.len());
        o.extend_from_slice(b"{\"count\":");
        o.extend_from_slice(self.count.to_string().as_bytes());
        o.extend_from_slice(b",\"created_at\":");
        string(&mut o, &self.created_at);
        o.extend_from_slice(b",\"first_sequence\":");
        o.extend_from_slice(self.first_sequence.to_string().as_bytes());
        o.extend_from_slice(b",\"gaps\":[");
        for (i, (s, why)) in self.gaps.iter().enumerate() {
            if i > 0 {
                o.push(b',');
            }
            o.extend_from_slice(format!("[{s},").as_bytes());
            string(&mut o, why);
            o.push(b']');
        }
        o.extend_from_slice(b"],\"index\":");
        o.extend_from_slice(self.index.to_string().as_bytes());
        o.extend_from_slice(b",\"key_id\":");
        string(&mut o, &self.key_id);
        o.extend_from_slice(b",\"last_sequence\":");
        o.extend_from_slice(self.last_sequence.to_string().as_bytes());
        o.extend_from_slice(b",\"previous\":");
        string(&mut o, &self.previous);
        o.extend_from_slice(b",\"root\":");
        string(&mut o, &crate::text::hex::lower(&self.root));
        o.extend_from_slice(b",\"runner_id\":");
        string(&mut o, &self.runner_id);
        o.extend_from_slice(b",\"schema\":");
        string(&mut o, CHECKPOINT_SCHEMA);
        o.extend_from_slice(b",\"sink\":");
        string(&mut o, &self.sink);
        o.extend_from_slice(b",\"stream\":");
        string(&mut o, &self.stream);
        o.extend_from_slice(b",\"stream_incarnation\":");
        string(&mut o, &self.stream_incarnation);
        o.push(b'}');
        o
    }
}

/// The chain digest of a body text: what the next checkpoint's `previous` holds.
pub fn body_digest(body: &[u8]) -> String {
    crate::text::hex::lower(&sha256(body))
}

/// The stored form of a signed checkpoint.
pub fn seal(body: &Body, leaves: &[(u64, [u8; 32])], signer: &Signer) -> Vec<u8> {
    let text = body.encode();
    let sig = signer.sign(&text);
    let body_str = std::str::from_utf8(&text).expect("the encoder writes UTF-8");
    let mut o = Vec::with_capacity(text.len() + 80 * leaves.len() + 256);
    o.extend_from_slice(b"{\"leaves\":[");
    for (i, (s, d)) in leaves.iter().enumerate() {
        if i > 0 {
            o.push(b',');
        }
        o.extend_from_slice(format!("[{s},\"{}\"]", crate::text::hex::lower(d)).as_bytes());
    }
    o.extend_from_slice(b"],\"schema\":");
    string(&mut o, CHECKPOINT_SCHEMA);
    o.extend_from_slice(b",\"signature\":");
    string(
        &mut o,
        &base64::engine::general_purpose::STANDARD.encode(sig),
    );
    o.extend_from_slice(b",\"signed\":");
    string(&mut o, body_str);
    o.extend_from_slice(b"}\n");
    o
}

/// A stored checkpoint whose signature, root and leaves checked out.
#[derive(Debug, Clone)]
pub struct Verified {
    pub body: Body,
    pub digest: String,
    pub leaves: Vec<(u64, [u8; 32])>,
}

/// Why a stored checkpoint is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not a readable checkpoint (the reason names the field).
    Malformed(String),
    /// Its key id is not among the trusted keys (the id, shown escaped by the caller).
    UnknownKey(String),
    /// The signature does not verify under the trusted key of its id.
    Forged,
    /// Signed, but the leaves stored beside it do not give its root, count or range.
    LeavesAltered,
}

/// What an operator reads: the key id is peer text, escaped and bounded.
impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::UnknownKey(id) => write!(
                f,
                "signed by an unknown key (key id {})",
                crate::text::peer::PeerText::new(id)
            ),
            Refused::Forged => f.write_str("FORGED (the signature does not verify)"),
            Refused::LeavesAltered => {
                f.write_str("its leaves do not match its signed root (altered)")
            }
            Refused::Malformed(w) => write!(f, "unreadable ({w})"),
        }
    }
}

/// Why a checkpoint of the first format (before `stream` and `stream_incarnation` were
/// signed; never released) is refused: its sequences name no stream.
const NO_STREAM: &str = "no stream or stream_incarnation: a checkpoint of the format before \
     they were signed (unreleased); its sequences name no stream, start a new chain";

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Reads and checks one stored checkpoint.
pub fn verify(text: &str, trusted: &TrustedKeys) -> Result<Verified, Refused> {
    use serde_json::Value;
    let bad = |w: &str| Refused::Malformed(w.to_string());
    if text.len() as u64 > MAX_CHECKPOINT_BYTES {
        return Err(bad("larger than the checkpoint bound"));
    }
    canonical::parse(text).map_err(|_| bad("not strict JSON (a duplicate key?)"))?;
    let outer: Value = serde_json::from_str(text).map_err(|_| bad("not JSON"))?;
    if outer.get("schema").and_then(Value::as_str) != Some(CHECKPOINT_SCHEMA) {
        return Err(bad("schema is not svc.custody.checkpoint.v1"));
    }
    let signed = outer
        .get("signed")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no signed body"))?;
    canonical::parse(signed).map_err(|_| bad("signed body is not strict JSON"))?;
    let b: Value = serde_json::from_str(signed).map_err(|_| bad("signed body is not JSON"))?;
    let s = |k: &str| b.get(k).and_then(Value::as_str).map(str::to_string);
    let n = |k: &str| b.get(k).and_then(Value::as_u64);
    let key_id = s("key_id").ok_or_else(|| bad("no key_id"))?;
    let Some(key) = trusted.0.get(&key_id) else {
        return Err(Refused::UnknownKey(key_id));
    };
    let sig = outer
        .get("signature")
        .and_then(Value::as_str)
        .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
        .ok_or(Refused::Forged)?;
    UnparsedPublicKey::new(&signature::ED25519, key)
        .verify(signed.as_bytes(), &sig)
        .map_err(|_| Refused::Forged)?;
    // Signed by a trusted key from here on: the body is the signer's statement.
    if s("schema").as_deref() != Some(CHECKPOINT_SCHEMA) {
        return Err(bad("signed schema"));
    }
    let gaps = b
        .get("gaps")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("gaps"))?
        .iter()
        .map(|g| Some((g.get(0)?.as_u64()?, g.get(1)?.as_str()?.to_string())))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("gaps"))?;
    let body = Body {
        runner_id: s("runner_id").ok_or_else(|| bad("runner_id"))?,
        key_id,
        sink: s("sink").ok_or_else(|| bad("sink"))?,
        index: n("index").ok_or_else(|| bad("index"))?,
        first_sequence: n("first_sequence").ok_or_else(|| bad("first_sequence"))?,
        last_sequence: n("last_sequence").ok_or_else(|| bad("last_sequence"))?,
        count: n("count").ok_or_else(|| bad("count"))?,
        root: s("root")
            .as_deref()
            .and_then(hex32)
            .ok_or_else(|| bad("root"))?,
        previous: s("previous").ok_or_else(|| bad("previous"))?,
        gaps,
        created_at: s("created_at").ok_or_else(|| bad("created_at"))?,
        stream: s("stream").ok_or_else(|| bad(NO_STREAM))?,
        stream_incarnation: s("stream_incarnation").ok_or_else(|| bad(NO_STREAM))?,
    };
    let leaves = outer
        .get("leaves")
        .and_then(Value::as_array)
        .ok_or(Refused::LeavesAltered)?
        .iter()
        .map(|l| Some((l.get(0)?.as_u64()?, hex32(l.get(1)?.as_str()?)?)))
        .collect::<Option<Vec<_>>>()
        .ok_or(Refused::LeavesAltered)?;
    let sorted = leaves.windows(2).all(|w| w[0].0 < w[1].0);
    let in_range = leaves.first().map(|l| l.0) == Some(body.first_sequence)
        && leaves.last().map(|l| l.0) == Some(body.last_sequence);
    if !sorted
        || leaves.len() as u64 != body.count
        || (!leaves.is_empty() && !in_range)
        || merkle_root(&leaves) != body.root
    {
        return Err(Refused::LeavesAltered);
    }
    Ok(Verified {
        digest: body_digest(signed.as_bytes()),
        body,
        leaves,
    })
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
