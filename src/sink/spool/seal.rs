//! The spool encrypted at rest: every record's body sealed whole with AES-256-GCM, bound to
//! its spool and place (segment and offset) by the associated data, with rotation by a key id
//! stored in each record (docs/spool.md, "Encryption at rest", is the reference).
//!
//! A sealed body (version 2, written since the attack on this code, issue 47):
//!
//! `0x81 | appended at, Unix ms (8 LE) | key id length L (1) | key id (L) | key check (8) |
//! salt (16) | nonce (12) | AES-256-GCM(plain body) | tag (16)`
//!
//! Version 1 (`0x80`, read, no longer written) has no key check, and its associated data no
//! spool id. The plain body is what [`super::codec::encode`] writes (flag byte `0` or `1`,
//! append time, the file record). The key check is the first 8 bytes of
//! `HMAC-SHA256(the key file's 32 bytes, "svc.spool.key-check.v2")`, a pseudo-random function
//! of the key that reveals nothing of it: a key file replaced under the same key id (the
//! docs' `head -c 32 /dev/urandom` run again) is told from damage, and its records are kept
//! and the drain stopped, naming the key id, instead of every one quarantined. The AES key of
//! a record is `HKDF-SHA256(salt, ikm = the key file's 32 bytes, info = "svc.spool.record.v2")`
//! (`.v1` for version 1): one salt of 16 random bytes per appended batch, and within it the
//! nonce counts records from 0. A
//! nonce is so never repeated under one AES key (one batch never holds 2^32 records), and two
//! batches share an AES key only when their random salts collide (2^-64 after 2^32 batches,
//! per key file), with no state to keep across restarts. The associated data is
//! `"svc.spool.record.v2" | spool id (16) | segment id (8 LE) | frame offset (8 LE) | the
//! sealed body's bytes before the nonce's end` (version 1: no spool id): a record copied to
//! another spool, segment or offset, or with its time or key id changed, fails to decrypt (a
//! changed key check is taken for a changed key file: kept, the drain stopped).
//!
//! A record in clear is read only with `allow_unencrypted`, and only in a segment written
//! before encryption was turned on (the spool's `meta` file, [`super::meta`]): one in a later
//! segment was not written by this spool and is quarantined.
//!
//! Nothing here trusts a stored length beyond the body the frame checksum bounds; errors name
//! a key by its id only, never a byte of a key or of a record.

use std::path::PathBuf;
use std::sync::Arc;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use ring::{hkdf, hmac};

use super::meta::{self, Meta, Stored, ID_LEN};
use crate::document::reader::ObjectReader;
use crate::message::protection::keys::{is_key_id, KeySource, Secret};

/// First byte of a sealed body of version 1 (a plain body's flag byte is 0 or 1).
pub const FLAG_SEALED: u8 = 0x80;
/// First byte of a sealed body of version 2 (key check, spool id).
pub const FLAG_SEALED_V2: u8 = 0x81;
/// First byte of a sealed custody checkpoint frame: version 2's layout, its plain body a
/// checkpoint's ([`super::codec::FLAG_CHECKPOINT`]). The flag is covered by the associated
/// data, and the opened body's kind must match it: a record never opens as a checkpoint.
pub const FLAG_SEALED_CHECKPOINT: u8 = 0x82;
/// HKDF `info` of a batch's AES key, and the first bytes of every record's associated data.
const INFO: &[u8] = b"svc.spool.record.v1";
const INFO_V2: &[u8] = b"svc.spool.record.v2";
/// What the key check is an HMAC of.
const CHECK_INFO: &[u8] = b"svc.spool.key-check.v2";
const CHECK_LEN: usize = meta::CHECK_LEN;
/// What the key of the `meta` file's tag is an HMAC of (a key of its own, derived from the
/// spool key, as the key check is).
const META_KEY_INFO: &[u8] = b"svc.spool.meta-key.v2";
const SALT_LEN: usize = 16;
const TAG_LEN: usize = 16;
const KEY_LEN: usize = 32;
/// Older keys kept for reading, at most.
pub const MAX_OLD_KEYS: usize = 31;

/// One key file of the `encryption` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolKey {
    pub key_id: String,
    pub key_file: PathBuf,
}

/// `spool.encryption`: the key new records are sealed with, and older keys for reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolEncryption {
    pub current: SpoolKey,
    pub old_keys: Vec<SpoolKey>,
}

impl SpoolEncryption {
    /// Reads the block; `None` (with the problem noted) when it is not usable.
    pub fn read(mut r: ObjectReader<'_>) -> Option<SpoolEncryption> {
        let current = read_key(&mut r);
        let mut old_keys: Vec<SpoolKey> = Vec::new();
        let readers = r.objects_at_most("old_keys", MAX_OLD_KEYS);
        for mut k in readers {
            if let Some(key) = read_key(&mut k) {
                let seen = current.as_ref().map(|c| &c.key_id) == Some(&key.key_id)
                    || old_keys.iter().any(|o| o.key_id == key.key_id);
                if seen {
                    k.problem("key_id", "is used by another key; key ids must be unique");
                }
                old_keys.push(key);
            }
            k.finish();
        }
        r.finish();
        Some(SpoolEncryption {
            current: current?,
            old_keys,
        })
    }
}

fn read_key(r: &mut ObjectReader<'_>) -> Option<SpoolKey> {
    let key_id = r.req_string("key_id");
    let key_file = r.opt_nonempty("key_file");
    if key_file.is_none() {
        r.problem(
            "key_file",
            "is required (a file of the base64 of 32 random bytes, mode 0600, owned by the \
             service's user)",
        );
    }
    // An empty id is refused, not taken for "no key": that turned encryption off without a
    // word (found by the attack on this code).
    if r.has("key_id") && !is_key_id(&key_id) {
        r.problem("key_id", "must be 1 to 64 characters of A-Z a-z 0-9 _ - .");
        return None;
    }
    Some(SpoolKey {
        key_id,
        key_file: PathBuf::from(key_file?),
    })
    .filter(|k| !k.key_id.is_empty())
}

/// The loaded keys of a spool and what it may read. `Debug` shows key ids only.
pub struct Crypt {
    /// The first is the current key; each with its key check.
    keys: Vec<(String, Secret, [u8; CHECK_LEN])>,
    allow_unencrypted: bool,
    random: SystemRandom,
    /// The spool's id and first sealed segment (its `meta` file); `None` until bound.
    meta: Option<Meta>,
}

impl std::fmt::Debug for Crypt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, ..)| id.as_str()).collect();
        f.debug_struct("Crypt")
            .field("key_ids", &ids)
            .field("allow_unencrypted", &self.allow_unencrypted)
            .finish()
    }
}

/// Why a stored record was not opened. Never carries key or record bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// Sealed under a key id this spool is not configured with: kept, never dropped.
    UnknownKey(String),
    /// Sealed under a key id this spool is configured with, but the key file now under that
    /// id holds another key (its key check differs): kept, never dropped.
    KeyChanged(String),
    /// Stored in clear, and `allow_unencrypted` is not set: kept, never dropped.
    Unencrypted,
    /// Stored in clear in a segment written after encryption was turned on: not written by
    /// this spool. Damage.
    ClearAfterSealing,
    /// It does not decrypt at this place: moved from another segment or offset, altered, or
    /// sealed by another key under the same id. Damage.
    Failed,
    /// Its sealed layout is broken (the checksum matched, so it was written so). Damage.
    Malformed(&'static str),
}

impl OpenError {
    /// True for a record that must be kept where it is (the drain stops at it).
    pub fn keeps(&self) -> bool {
        matches!(
            self,
            OpenError::UnknownKey(_) | OpenError::KeyChanged(_) | OpenError::Unencrypted
        )
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::UnknownKey(id) => write!(
                f,
                "sealed under key id \"{}\", which is not configured (spool.encryption.key_id \
                 or old_keys)",
                crate::text::peer::PeerText::new(id)
            ),
            OpenError::KeyChanged(id) => write!(
                f,
                "sealed under key id \"{}\", but the key file now configured under that id \
                 holds another key (the key file changed since the record was written): \
                 configure the original key file under that id (in old_keys, with the new key \
                 under a new key id)",
                crate::text::peer::PeerText::new(id)
            ),
            OpenError::ClearAfterSealing => f.write_str(
                "stored unencrypted in a segment written after encryption was turned on (not \
                 written by this spool)",
            ),
            OpenError::Unencrypted => f.write_str(
                "stored unencrypted (a spool of an older version, or one run with \
                 allow_unencrypted), and spool.allow_unencrypted is not set",
            ),
            OpenError::Failed => f.write_str(
                "does not decrypt at this segment and offset (moved from another place, \
                 altered, or sealed by another key under the same id)",
            ),
            OpenError::Malformed(why) => write!(f, "sealed record is malformed ({why})"),
        }
    }
}

/// How far a `meta` file read at the opening is trusted ([`Crypt::verify_meta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaTrust {
    /// Its tag verifies under a configured key; `current`: under the key new records are
    /// sealed with (otherwise an old key: rewritten under the current one).
    Authentic { current: bool },
    /// Version 1 (no tag) in a spool with a key: written before meta was authenticated, by a
    /// run without a key, or by someone who can write the directory. The opening decides.
    Unsigned,
    /// No key is configured: taken as it says (nothing to authenticate it with).
    Keyless,
}

/// Where a stored record is opened: the segment and offset it was sealed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub segment: u64,
    pub offset: u64,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "spool segment {} offset {}", self.segment, self.offset)
    }
}

/// The parts of a sealed body, all within its bounds.
struct Parts<'a> {
    v2: bool,
    key_id: &'a str,
    /// Version 2 only.
    check: Option<&'a [u8]>,
    salt: &'a [u8],
    nonce: [u8; NONCE_LEN],
    /// Everything the associated data covers: the body up to the nonce's end.
    head: &'a [u8],
    sealed: &'a [u8],
}

fn parts(body: &[u8]) -> Result<Parts<'_>, OpenError> {
    let malformed = OpenError::Malformed;
    let v2 = matches!(
        body.first(),
        Some(&FLAG_SEALED_V2 | &FLAG_SEALED_CHECKPOINT)
    );
    let id_len = usize::from(*body.get(9).ok_or(malformed("shorter than its header"))?);
    let id_end = 10 + id_len;
    let salt_at = id_end + if v2 { CHECK_LEN } else { 0 };
    let head_end = salt_at + SALT_LEN + NONCE_LEN;
    if body.len() < head_end + TAG_LEN {
        return Err(malformed("shorter than its header"));
    }
    let key_id =
        std::str::from_utf8(&body[10..id_end]).map_err(|_| malformed("key id is not valid"))?;
    if !is_key_id(key_id) {
        return Err(malformed("key id is not valid"));
    }
    let nonce = body[salt_at + SALT_LEN..head_end]
        .try_into()
        .map_err(|_| malformed("nonce"))?;
    Ok(Parts {
        v2,
        key_id,
        check: v2.then(|| &body[id_end..salt_at]),
        salt: &body[salt_at..salt_at + SALT_LEN],
        nonce,
        head: &body[..head_end],
        sealed: &body[head_end..],
    })
}

fn batch_key(secret: &Secret, salt: &[u8], info: &[u8]) -> LessSafeKey {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(secret.expose());
    let info = [info];
    let okm = prk
        .expand(&info, &AES_256_GCM)
        .expect("an AES-256 key is far below HKDF's output bound");
    LessSafeKey::new(UnboundKey::from(okm))
}

/// The key check of a key (see the module comment).
fn key_check(secret: &Secret) -> [u8; CHECK_LEN] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.expose());
    let tag = hmac::sign(&key, CHECK_INFO);
    tag.as_ref()[..CHECK_LEN]
        .try_into()
        .expect("SHA-256 is longer")
}

/// The key the `meta` file's tag is made with, derived from a spool key.
fn meta_key(secret: &Secret) -> hmac::Key {
    let outer = hmac::Key::new(hmac::HMAC_SHA256, secret.expose());
    hmac::Key::new(
        hmac::HMAC_SHA256,
        hmac::sign(&outer, META_KEY_INFO).as_ref(),
    )
}

/// The associated data of a record at `place`: version 2 with `spool_id`, version 1 without.
fn aad(spool_id: Option<&[u8; ID_LEN]>, place: Place, head: &[u8], out: &mut Vec<u8>) {
    out.clear();
    match spool_id {
        Some(id) => {
            out.extend_from_slice(INFO_V2);
            out.extend_from_slice(id);
        }
        None => out.extend_from_slice(INFO),
    }
    out.extend_from_slice(&place.segment.to_le_bytes());
    out.extend_from_slice(&place.offset.to_le_bytes());
    out.extend_from_slice(head);
}

impl Crypt {
    /// Loads the key files of a spool's config (each by the payload keys' file rules: a
    /// regular file, no link at its name, owned by the service's user or root, mode 0600 or
    /// stricter, the base64 of exactly 32 bytes). Errors name the key id and the file.
    pub fn load(
        encryption: Option<&SpoolEncryption>,
        allow_unencrypted: bool,
    ) -> Result<Crypt, String> {
        let mut keys = Vec::new();
        if let Some(enc) = encryption {
            for k in std::iter::once(&enc.current).chain(&enc.old_keys) {
                let secret = KeySource::File(k.key_file.clone())
                    .load(KEY_LEN, KEY_LEN)
                    .map_err(|e| format!("encryption key \"{}\": {e}", k.key_id))?;
                let check = key_check(&secret);
                keys.push((k.key_id.clone(), secret, check));
            }
        }
        Ok(Crypt {
            keys,
            allow_unencrypted,
            random: SystemRandom::new(),
            meta: None,
        })
    }

    /// Binds the spool's identity and where its encryption began (its `meta` file): new
    /// records are sealed only once bound.
    pub fn bind(&mut self, meta: Meta) {
        self.meta = Some(meta);
    }

    /// The bytes of the `meta` file for `m`: version 2, authenticated under the current key,
    /// when this spool has one; version 1 (a CRC) when it has none.
    pub fn meta_bytes(&self, m: &Meta) -> Vec<u8> {
        let Some((key_id, secret, check)) = self.keys.first() else {
            return meta::encode(m);
        };
        let mut data = meta::signed_part(m, key_id, check);
        let tag = hmac::sign(&meta_key(secret), &data);
        data.extend_from_slice(tag.as_ref());
        data
    }

    /// How far a stored `meta` file is trusted; an error (the spool does not open) for a tag
    /// under a key id not configured, or one that does not verify. Never names a key's bytes.
    pub fn verify_meta(&self, stored: &Stored) -> Result<MetaTrust, String> {
        let (key_id, check, signed, tag) = match stored {
            _ if self.keys.is_empty() => return Ok(MetaTrust::Keyless),
            Stored::Plain(_) => return Ok(MetaTrust::Unsigned),
            Stored::Signed {
                key_id,
                check,
                signed,
                tag,
                ..
            } => (key_id, check, signed, tag),
        };
        let shown = crate::text::peer::PeerText::new(key_id);
        let Some(index) = self.keys.iter().position(|(id, ..)| id == key_id) else {
            return Err(format!(
                "is authenticated under key id \"{shown}\", which is not configured \
                 (spool.encryption.key_id or old_keys): configure that key (in old_keys) to \
                 open the spool; nothing was read or changed"
            ));
        };
        if *check != self.keys[index].2 {
            return Err(format!(
                "is authenticated under key id \"{shown}\", but the key file now configured \
                 under that id holds another key (the key file changed since): configure the \
                 original key file under that id (in old_keys, with the new key under a new \
                 key id); nothing was read or changed"
            ));
        }
        hmac::verify(&meta_key(&self.keys[index].1), signed, tag).map_err(|_| {
            format!(
                "does not authenticate under key id \"{shown}\" (altered or damaged): the \
                 spool is not opened and no record is read; restore the file from a backup of \
                 the spool directory"
            )
        })?;
        Ok(MetaTrust::Authentic {
            current: index == 0,
        })
    }

    /// Binds a stored `meta` file for a reader that does not open the spool (`svc spool
    /// inspect`, `set-aside`): as it says when authentic or when there is no key; one not
    /// authenticated beside a key lets no record in clear be read (the opening decides on it).
    pub fn bind_stored(&mut self, stored: Option<&Stored>) -> Result<(), String> {
        let Some(s) = stored else { return Ok(()) };
        let m = s.meta();
        match self.verify_meta(s)? {
            MetaTrust::Unsigned => self.bind(Meta {
                first_sealed: 0,
                ..m
            }),
            MetaTrust::Authentic { .. } | MetaTrust::Keyless => self.bind(m),
        }
        Ok(())
    }

    /// Why a stored body cannot be opened with this configuration and must be kept where it
    /// is (a key id not configured, a key file changed), read from its header alone; `None`
    /// when it is not sealed or is malformed (the drain judges it).
    pub fn kept(&self, body: &[u8]) -> Option<OpenError> {
        let p = parts(body).ok().filter(|_| is_sealed(body))?;
        match self.keys.iter().find(|(id, ..)| id == p.key_id) {
            None => Some(OpenError::UnknownKey(p.key_id.to_string())),
            Some((_, _, check)) if p.check.is_some_and(|c| c != check) => {
                Some(OpenError::KeyChanged(p.key_id.to_string()))
            }
            Some(_) => None,
        }
    }

    /// Whether a body stored in clear at segment `segment` may be read (see
    /// [`Opener::open`]).
    pub fn clear_allowed(&self, segment: u64) -> Result<(), OpenError> {
        let first_sealed = self.meta.map_or(super::meta::NONE, |m| m.first_sealed);
        if segment >= first_sealed {
            Err(OpenError::ClearAfterSealing)
        } else if self.allow_unencrypted {
            Ok(())
        } else {
            Err(OpenError::Unencrypted)
        }
    }

    /// True when new records are sealed.
    pub fn seals(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Whether `body`, stored at `place`, opens under this spool's keys and bound meta (a
    /// trial made by the opening scan: see `scan::Trial`).
    pub fn trial_open(&self, place: Place, body: &[u8]) -> Result<(), OpenError> {
        let mut out = Vec::new();
        open_with(self, (&mut None, &mut Vec::new()), place, body, &mut out).map(|_| ())
    }

    /// The bytes a sealed body of `plain` bytes takes (what it takes unsealed when this spool
    /// has no key).
    pub fn body_len(&self, plain: usize) -> usize {
        match self.keys.first() {
            Some((id, ..)) => 10 + id.len() + CHECK_LEN + SALT_LEN + NONCE_LEN + plain + TAG_LEN,
            None => plain,
        }
    }

    /// A sealer for one appended batch (a fresh salt, so a fresh AES key); `None` when this
    /// spool has no key.
    pub fn batch(&self) -> Result<Option<BatchSealer<'_>>, String> {
        let Some((key_id, secret, check)) = self.keys.first() else {
            return Ok(None);
        };
        let Some(meta) = &self.meta else {
            return Err("the spool's identity (its meta file) is not loaded".into());
        };
        let mut salt = [0u8; SALT_LEN];
        self.random
            .fill(&mut salt)
            .map_err(|_| "the system's random source failed".to_string())?;
        Ok(Some(BatchSealer {
            key_id,
            check,
            spool_id: &meta.spool_id,
            salt,
            key: batch_key(secret, &salt, INFO_V2),
            next: 0,
            aad: Vec::new(),
        }))
    }
}

/// Seals the records of one batch.
pub struct BatchSealer<'a> {
    key_id: &'a str,
    check: &'a [u8; CHECK_LEN],
    spool_id: &'a [u8; ID_LEN],
    salt: [u8; SALT_LEN],
    key: LessSafeKey,
    /// The next record's nonce.
    next: u32,
    aad: Vec<u8>,
}

impl BatchSealer<'_> {
    /// Appends the sealed body of `plain` (a body [`super::codec::encode`] wrote) to `out`,
    /// bound to `place`.
    pub fn seal(
        &mut self,
        out: &mut Vec<u8>,
        plain: &[u8],
        appended_unix_ms: u64,
        place: Place,
    ) -> Result<(), String> {
        let index = self.next;
        self.next = index
            .checked_add(1)
            .ok_or("more records in one batch than nonces")?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce[NONCE_LEN - 4..].copy_from_slice(&index.to_be_bytes());
        let start = out.len();
        out.push(if super::codec::is_checkpoint(plain) {
            FLAG_SEALED_CHECKPOINT
        } else {
            FLAG_SEALED_V2
        });
        out.extend_from_slice(&appended_unix_ms.to_le_bytes());
        out.push(self.key_id.len() as u8);
        out.extend_from_slice(self.key_id.as_bytes());
        out.extend_from_slice(self.check);
        out.extend_from_slice(&self.salt);
        out.extend_from_slice(&nonce);
        aad(Some(self.spool_id), place, &out[start..], &mut self.aad);
        let at = out.len();
        out.extend_from_slice(plain);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&self.aad[..]),
                &mut out[at..],
            )
            .map_err(|_| {
                out.truncate(start);
                "sealing a record failed".to_string()
            })?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }
}

/// What a stored body holds once opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// Stored in clear (allowed): the body itself is the plain body.
    Clear,
    /// Decrypted: the plain body is at this range of the output buffer.
    Sealed(std::ops::Range<usize>),
}

/// Opens stored bodies, keeping the AES key of the last batch seen (consecutive records
/// mostly share one).
pub struct Opener {
    crypt: Arc<Crypt>,
    last: LastKey,
    aad: Vec<u8>,
}

impl Opener {
    pub fn new(crypt: Arc<Crypt>) -> Opener {
        Opener {
            crypt,
            last: None,
            aad: Vec::new(),
        }
    }

    /// Opens `body`, stored at `place`: a sealed body is decrypted to the end of `out`.
    pub fn open(
        &mut self,
        place: Place,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Opened, OpenError> {
        open_with(
            &self.crypt,
            (&mut self.last, &mut self.aad),
            place,
            body,
            out,
        )
    }
}

/// The AES key of the last batch an [`Opener`] opened: the key's index, the version (true:
/// 2), the salt, the key.
type LastKey = Option<(usize, bool, [u8; SALT_LEN], LessSafeKey)>;

/// [`Opener::open`] with its cached key and associated-data buffer passed in.
fn open_with(
    crypt: &Crypt,
    (last, aad_buf): (&mut LastKey, &mut Vec<u8>),
    place: Place,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<Opened, OpenError> {
    if !is_sealed(body) {
        crypt.clear_allowed(place.segment)?;
        return Ok(Opened::Clear);
    }
    let p = parts(body)?;
    let Some(index) = crypt.keys.iter().position(|(id, ..)| id == p.key_id) else {
        return Err(OpenError::UnknownKey(p.key_id.to_string()));
    };
    if p.check.is_some_and(|c| c != crypt.keys[index].2) {
        return Err(OpenError::KeyChanged(p.key_id.to_string()));
    }
    let spool_id = match (p.v2, &crypt.meta) {
        (false, _) => None,
        (true, Some(m)) => Some(&m.spool_id),
        // No identity to open it with (a survey of a spool without its meta file).
        (true, None) => return Err(OpenError::Failed),
    };
    let cached = last
        .as_ref()
        .is_some_and(|(i, v2, salt, _)| *i == index && *v2 == p.v2 && salt[..] == *p.salt);
    if !cached {
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(p.salt);
        let info = if p.v2 { INFO_V2 } else { INFO };
        let key = batch_key(&crypt.keys[index].1, &salt, info);
        *last = Some((index, p.v2, salt, key));
    }
    let (_, _, _, key) = last.as_ref().expect("set above");
    aad(spool_id, place, p.head, aad_buf);
    let start = out.len();
    out.extend_from_slice(p.sealed);
    let opened = key.open_in_place(
        Nonce::assume_unique_for_key(p.nonce),
        Aad::from(&aad_buf[..]),
        &mut out[start..],
    );
    match opened {
        Ok(plain) => {
            let len = plain.len();
            let kind_matches = (body[0] == FLAG_SEALED_CHECKPOINT)
                == super::codec::is_checkpoint(&out[start..start + len]);
            if !kind_matches {
                out.truncate(start);
                return Err(OpenError::Malformed(
                    "its kind (record or checkpoint) does not match its seal",
                ));
            }
            out.truncate(start + len);
            Ok(Opened::Sealed(start..start + len))
        }
        Err(_) => {
            out.truncate(start);
            Err(OpenError::Failed)
        }
    }
}

/// True for a sealed body (of either version).
pub fn is_sealed(body: &[u8]) -> bool {
    matches!(
        body.first(),
        Some(&FLAG_SEALED | &FLAG_SEALED_V2 | &FLAG_SEALED_CHECKPOINT)
    )
}

/// True for a stored custody checkpoint frame (sealed or in clear), told without a key: its
/// first byte, which for a sealed one the associated data covers.
pub fn is_checkpoint_frame(body: &[u8]) -> bool {
    matches!(
        body.first(),
        Some(&FLAG_SEALED_CHECKPOINT | &super::codec::FLAG_CHECKPOINT)
    )
}

/// The key id a sealed body names, when it is one (for reports; never trusted for more).
pub fn key_id(body: &[u8]) -> Option<&str> {
    is_sealed(body)
        .then(|| parts(body).ok().map(|p| p.key_id))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of 32 bytes of their id's first byte (`byte` to change one), spool id 1s, sealed
    /// from segment 10.
    fn crypt_of(ids: &[(&str, u8)], allow: bool, spool: u8) -> Arc<Crypt> {
        let keys = ids
            .iter()
            .map(|(id, byte)| {
                let secret = Secret::new(vec![*byte; KEY_LEN]);
                let check = key_check(&secret);
                (id.to_string(), secret, check)
            })
            .collect();
        Arc::new(Crypt {
            keys,
            allow_unencrypted: allow,
            random: SystemRandom::new(),
            meta: Some(Meta {
                spool_id: [spool; ID_LEN],
                first_sealed: 10,
            }),
        })
    }

    fn crypt(ids: &[&str], allow: bool) -> Arc<Crypt> {
        let ids: Vec<(&str, u8)> = ids.iter().map(|id| (*id, id.as_bytes()[0])).collect();
        crypt_of(&ids, allow, 1)
    }

    const AT: Place = Place {
        segment: 3,
        offset: 8,
    };

    fn sealed(c: &Crypt, plain: &[u8], place: Place) -> Vec<u8> {
        let mut b = c.batch().unwrap().unwrap();
        let mut out = Vec::new();
        b.seal(&mut out, plain, 7, place).unwrap();
        assert_eq!(out.len(), c.body_len(plain.len()));
        out
    }

    #[test]
    fn a_sealed_body_opens_only_at_its_place_and_under_its_key() {
        let c = crypt(&["k2", "k1"], false);
        let body = sealed(&c, b"\x00plain body MARKER", AT);
        assert!(!body.windows(6).any(|w| w == b"MARKER"));
        assert_eq!(super::super::codec::appended_unix_ms(&body), Some(7));
        assert_eq!(key_id(&body), Some("k2"));
        let mut o = Opener::new(c.clone());
        let mut out = Vec::new();
        let Opened::Sealed(r) = o.open(AT, &body, &mut out).unwrap() else {
            panic!("not sealed")
        };
        assert_eq!(&out[r], b"\x00plain body MARKER");
        for moved in [Place { offset: 20, ..AT }, Place { segment: 4, ..AT }] {
            assert_eq!(o.open(moved, &body, &mut out), Err(OpenError::Failed));
        }
        let mut timed = body.clone();
        timed[1] ^= 1;
        assert_eq!(o.open(AT, &timed, &mut out), Err(OpenError::Failed));
        // Rotated: k1 only reads; a key id no longer configured is reported by its id.
        let older = crypt(&["k1"], false);
        let mut o1 = Opener::new(older);
        assert_eq!(
            o1.open(AT, &body, &mut out),
            Err(OpenError::UnknownKey("k2".into()))
        );
        // In clear: refused unless allowed.
        assert_eq!(
            o.open(AT, b"\x00clear", &mut out),
            Err(OpenError::Unencrypted)
        );
        let mut lax = Opener::new(crypt(&["k2"], true));
        assert_eq!(lax.open(AT, b"\x00clear", &mut out), Ok(Opened::Clear));
    }

    /// The kind is sealed: a record's outer flag turned into a checkpoint's (or back) does
    /// not open, and each opens as its own kind.
    #[test]
    fn a_sealed_record_never_opens_as_a_checkpoint() {
        let c = crypt(&["k1"], false);
        let mut cp = Vec::new();
        super::super::codec::encode_checkpoint(&mut cp, ("r", 1), b"{}", 5).unwrap();
        let record = b"\x00\x05\x00\x00\x00\x00\x00\x00\x00{}".to_vec();
        let mut out = Vec::new();
        for (plain, flag, other) in [
            (&cp, FLAG_SEALED_CHECKPOINT, FLAG_SEALED_V2),
            (&record, FLAG_SEALED_V2, FLAG_SEALED_CHECKPOINT),
        ] {
            let mut body = sealed(&c, plain, AT);
            assert_eq!(body[0], flag);
            assert!(is_checkpoint_frame(&body) == (flag == FLAG_SEALED_CHECKPOINT));
            let mut o = Opener::new(c.clone());
            let Opened::Sealed(r) = o.open(AT, &body, &mut out).unwrap() else {
                panic!("sealed")
            };
            assert_eq!(&out[r], &plain[..]);
            body[0] = other;
            assert!(o.open(AT, &body, &mut out).is_err());
        }
    }

    #[test]
    fn a_key_file_replaced_under_its_id_is_told_from_damage() {
        let c = crypt_of(&[("k", 1)], false, 1);
        let body = sealed(&c, b"\x00x", AT);
        let replaced = crypt_of(&[("k", 2)], false, 1);
        let mut o = Opener::new(replaced.clone());
        let e = o.open(AT, &body, &mut Vec::new()).unwrap_err();
        assert_eq!(e, OpenError::KeyChanged("k".into()));
        assert!(e.keeps());
        assert!(e.to_string().contains("key file changed"), "{e}");
        assert_eq!(replaced.kept(&body), Some(e));
        assert_eq!(c.kept(&body), None);
        // The check is no prefix of the key nor of its AES keys' material.
        let check = key_check(&Secret::new(vec![1; KEY_LEN]));
        assert_ne!(check, [1; CHECK_LEN]);
        // A flipped check bit is a changed key too, never a decryption with another key.
        let mut flipped = body.clone();
        flipped[12] ^= 1;
        assert_eq!(c.kept(&flipped), Some(OpenError::KeyChanged("k".into())));
    }

    #[test]
    fn a_record_of_another_spool_under_the_same_key_does_not_open() {
        let mine = crypt_of(&[("k", 1)], false, 1);
        let other = crypt_of(&[("k", 1)], false, 2);
        let body = sealed(&other, b"\x00x", AT);
        let mut o = Opener::new(mine);
        assert_eq!(o.open(AT, &body, &mut Vec::new()), Err(OpenError::Failed));
    }

    #[test]
    fn clear_records_open_only_before_the_first_sealed_segment() {
        let mut lax = Opener::new(crypt(&["k"], true));
        let mut out = Vec::new();
        let before = Place { segment: 9, ..AT };
        assert_eq!(lax.open(before, b"\x00c", &mut out), Ok(Opened::Clear));
        for segment in [10, 11] {
            let at = Place { segment, ..AT };
            let e = lax.open(at, b"\x00c", &mut out).unwrap_err();
            assert_eq!(e, OpenError::ClearAfterSealing);
            assert!(!e.keeps());
        }
    }

    #[test]
    fn version_1_records_still_open() {
        // Sealed as the previous version wrote them: flag 0x80, no key check, no spool id.
        let c = crypt(&["k"], false);
        let secret = Secret::new(vec![b'k'; KEY_LEN]);
        let salt = [5u8; SALT_LEN];
        let key = batch_key(&secret, &salt, INFO);
        let mut body = vec![FLAG_SEALED];
        body.extend_from_slice(&7u64.to_le_bytes());
        body.push(1);
        body.push(b'k');
        body.extend_from_slice(&salt);
        body.extend_from_slice(&[0; NONCE_LEN]);
        let mut a = Vec::new();
        aad(None, AT, &body, &mut a);
        let mut plain = b"\x00old".to_vec();
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key([0; NONCE_LEN]),
                Aad::from(&a[..]),
                &mut plain,
            )
            .unwrap();
        body.extend_from_slice(&plain);
        body.extend_from_slice(tag.as_ref());
        let mut o = Opener::new(c.clone());
        let mut out = Vec::new();
        let Opened::Sealed(r) = o.open(AT, &body, &mut out).unwrap() else {
            panic!("not sealed")
        };
        assert_eq!(&out[r], b"\x00old");
        assert_eq!(c.kept(&body), None);
        let moved = Place { offset: 9, ..AT };
        assert_eq!(o.open(moved, &body, &mut out), Err(OpenError::Failed));
    }

    #[test]
    fn hostile_sealed_layouts_are_refused_without_panic() {
        let c = crypt(&["k"], false);
        let body = sealed(&c, b"\x00x", AT);
        let mut o = Opener::new(c);
        let mut out = Vec::new();
        for cut in 0..body.len() {
            let r = o.open(AT, &body[..cut], &mut out);
            assert!(r.is_err(), "{cut}");
        }
        let mut long_id = body.clone();
        long_id[9] = 255;
        assert!(matches!(
            o.open(AT, &long_id, &mut out),
            Err(OpenError::Malformed(_))
        ));
        let mut bad_id = body.clone();
        bad_id[10] = b'/';
        assert!(matches!(
            o.open(AT, &bad_id, &mut out),
            Err(OpenError::Malformed(_))
        ));
    }

    #[test]
    fn nonces_never_repeat_within_a_batch_and_salts_differ_between_batches() {
        let c = crypt(&["k"], false);
        let a = sealed(&c, b"\x00x", AT);
        let b = sealed(&c, b"\x00x", AT);
        let salt = |b: &[u8]| b[11 + CHECK_LEN..11 + CHECK_LEN + SALT_LEN].to_vec();
        assert_ne!(salt(&a), salt(&b));
        let mut s = c.batch().unwrap().unwrap();
        let (mut one, mut two) = (Vec::new(), Vec::new());
        s.seal(&mut one, b"\x00x", 7, AT).unwrap();
        s.seal(&mut two, b"\x00x", 7, AT).unwrap();
        let at = 11 + CHECK_LEN + SALT_LEN;
        let nonce = |b: &[u8]| b[at..at + NONCE_LEN].to_vec();
        assert_ne!(nonce(&one), nonce(&two));
    }
}
