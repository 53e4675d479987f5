//! The spool encrypted at rest: every record's body sealed whole with AES-256-GCM, bound to
//! its place (segment and offset) by the associated data, with rotation by a key id stored in
//! each record (docs/spool.md, "Encryption at rest", is the reference).
//!
//! A sealed body:
//!
//! `0x80 | appended at, Unix ms (8 LE) | key id length L (1) | key id (L) | salt (16) |
//! nonce (12) | AES-256-GCM(plain body) | tag (16)`
//!
//! where the plain body is what [`super::codec::encode`] writes (flag byte `0` or `1`, append
//! time, the file record). The AES key of a record is
//! `HKDF-SHA256(salt, ikm = the key file's 32 bytes, info = "svc.spool.record.v1")`: one salt
//! of 16 random bytes per appended batch, and within it the nonce counts records from 0. A
//! nonce is so never repeated under one AES key (one batch never holds 2^32 records), and two
//! batches share an AES key only when their random salts collide (2^-64 after 2^32 batches,
//! per key file), with no state to keep across restarts. The associated data is
//! `"svc.spool.record.v1" | segment id (8 LE) | frame offset (8 LE) | the sealed body's
//! bytes before the nonce's end`: a record copied to another segment or offset, or with its
//! time or key id changed, fails to decrypt.
//!
//! Nothing here trusts a stored length beyond the body the frame checksum bounds; errors name
//! a key by its id only, never a byte of a key or of a record.

use std::path::PathBuf;
use std::sync::Arc;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

use crate::document::reader::ObjectReader;
use crate::message::protection::keys::{is_key_id, KeySource, Secret};

/// First byte of a sealed body (a plain body's flag byte is 0 or 1).
pub const FLAG_SEALED: u8 = 0x80;
/// HKDF `info` of a batch's AES key, and the first bytes of every record's associated data.
const INFO: &[u8] = b"svc.spool.record.v1";
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
    /// The first is the current key.
    keys: Vec<(String, Secret)>,
    allow_unencrypted: bool,
    random: SystemRandom,
}

impl std::fmt::Debug for Crypt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
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
    /// Stored in clear, and `allow_unencrypted` is not set: kept, never dropped.
    Unencrypted,
    /// It does not decrypt at this place: moved from another segment or offset, altered, or
    /// sealed by another key under the same id. Damage.
    Failed,
    /// Its sealed layout is broken (the checksum matched, so it was written so). Damage.
    Malformed(&'static str),
}

impl OpenError {
    /// True for a record that must be kept where it is (the drain stops at it).
    pub fn keeps(&self) -> bool {
        matches!(self, OpenError::UnknownKey(_) | OpenError::Unencrypted)
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

/// Where a stored record is opened: the segment and offset it was sealed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub segment: u64,
    pub offset: u64,
}

/// The parts of a sealed body, all within its bounds.
struct Parts<'a> {
    key_id: &'a str,
    salt: &'a [u8],
    nonce: [u8; NONCE_LEN],
    /// Everything the associated data covers: the body up to the nonce's end.
    head: &'a [u8],
    sealed: &'a [u8],
}

fn parts(body: &[u8]) -> Result<Parts<'_>, OpenError> {
    let malformed = OpenError::Malformed;
    let id_len = usize::from(*body.get(9).ok_or(malformed("shorter than its header"))?);
    let id_end = 10 + id_len;
    let head_end = id_end + SALT_LEN + NONCE_LEN;
    if body.len() < head_end + TAG_LEN {
        return Err(malformed("shorter than its header"));
    }
    let key_id =
        std::str::from_utf8(&body[10..id_end]).map_err(|_| malformed("key id is not valid"))?;
    if !is_key_id(key_id) {
        return Err(malformed("key id is not valid"));
    }
    let nonce = body[id_end + SALT_LEN..head_end]
        .try_into()
        .map_err(|_| malformed("nonce"))?;
    Ok(Parts {
        key_id,
        salt: &body[id_end..id_end + SALT_LEN],
        nonce,
        head: &body[..head_end],
        sealed: &body[head_end..],
    })
}

fn batch_key(secret: &Secret, salt: &[u8]) -> LessSafeKey {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(secret.expose());
    let okm = prk
        .expand(&[INFO], &AES_256_GCM)
        .expect("an AES-256 key is far below HKDF's output bound");
    LessSafeKey::new(UnboundKey::from(okm))
}

fn aad(place: Place, head: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(INFO);
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
                    .map_err(|e| format!("encryption key {:?}: {e}", k.key_id))?;
                keys.push((k.key_id.clone(), secret));
            }
        }
        Ok(Crypt {
            keys,
            allow_unencrypted,
            random: SystemRandom::new(),
        })
    }

    /// True when new records are sealed.
    pub fn seals(&self) -> bool {
        !self.keys.is_empty()
    }

    /// True when records stored in clear may be read.
    pub fn allows_unencrypted(&self) -> bool {
        self.allow_unencrypted
    }

    /// True when `key_id` is one of this spool's keys.
    pub fn knows(&self, key_id: &str) -> bool {
        self.keys.iter().any(|(id, _)| id == key_id)
    }

    /// The bytes a sealed body of `plain` bytes takes (what it takes unsealed when this spool
    /// has no key).
    pub fn body_len(&self, plain: usize) -> usize {
        match self.keys.first() {
            Some((id, _)) => 10 + id.len() + SALT_LEN + NONCE_LEN + plain + TAG_LEN,
            None => plain,
        }
    }

    /// A sealer for one appended batch (a fresh salt, so a fresh AES key); `None` when this
    /// spool has no key.
    pub fn batch(&self) -> Result<Option<BatchSealer<'_>>, String> {
        let Some((key_id, secret)) = self.keys.first() else {
            return Ok(None);
        };
        let mut salt = [0u8; SALT_LEN];
        self.random
            .fill(&mut salt)
            .map_err(|_| "the system's random source failed".to_string())?;
        Ok(Some(BatchSealer {
            key_id,
            salt,
            key: batch_key(secret, &salt),
            next: 0,
            aad: Vec::new(),
        }))
    }
}

/// Seals the records of one batch.
pub struct BatchSealer<'a> {
    key_id: &'a str,
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
        out.push(FLAG_SEALED);
        out.extend_from_slice(&appended_unix_ms.to_le_bytes());
        out.push(self.key_id.len() as u8);
        out.extend_from_slice(self.key_id.as_bytes());
        out.extend_from_slice(&self.salt);
        out.extend_from_slice(&nonce);
        aad(place, &out[start..], &mut self.aad);
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
    last: Option<(usize, [u8; SALT_LEN], LessSafeKey)>,
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
        match body.first() {
            Some(&FLAG_SEALED) => {}
            _ if self.crypt.allow_unencrypted => return Ok(Opened::Clear),
            _ => return Err(OpenError::Unencrypted),
        }
        let p = parts(body)?;
        let Some(index) = self.crypt.keys.iter().position(|(id, _)| id == p.key_id) else {
            return Err(OpenError::UnknownKey(p.key_id.to_string()));
        };
        let cached = self
            .last
            .as_ref()
            .is_some_and(|(i, salt, _)| *i == index && salt[..] == *p.salt);
        if !cached {
            let mut salt = [0u8; SALT_LEN];
            salt.copy_from_slice(p.salt);
            let key = batch_key(&self.crypt.keys[index].1, &salt);
            self.last = Some((index, salt, key));
        }
        let (_, _, key) = self.last.as_ref().expect("set above");
        aad(place, p.head, &mut self.aad);
        let start = out.len();
        out.extend_from_slice(p.sealed);
        let opened = key.open_in_place(
            Nonce::assume_unique_for_key(p.nonce),
            Aad::from(&self.aad[..]),
            &mut out[start..],
        );
        match opened {
            Ok(plain) => {
                let len = plain.len();
                out.truncate(start + len);
                Ok(Opened::Sealed(start..start + len))
            }
            Err(_) => {
                out.truncate(start);
                Err(OpenError::Failed)
            }
        }
    }
}

/// The key id a sealed body names, when it is one (for reports; never trusted for more).
pub fn key_id(body: &[u8]) -> Option<&str> {
    (body.first() == Some(&FLAG_SEALED))
        .then(|| parts(body).ok().map(|p| p.key_id))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crypt(ids: &[&str], allow: bool) -> Arc<Crypt> {
        let keys = ids
            .iter()
            .map(|id| (id.to_string(), Secret::new(vec![id.as_bytes()[0]; KEY_LEN])))
            .collect();
        Arc::new(Crypt {
            keys,
            allow_unencrypted: allow,
            random: SystemRandom::new(),
        })
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
        let salt = |b: &[u8]| b[11..11 + SALT_LEN].to_vec();
        assert_ne!(salt(&a), salt(&b));
        let mut s = c.batch().unwrap().unwrap();
        let (mut one, mut two) = (Vec::new(), Vec::new());
        s.seal(&mut one, b"\x00x", 7, AT).unwrap();
        s.seal(&mut two, b"\x00x", 7, AT).unwrap();
        let nonce = |b: &[u8]| b[11 + SALT_LEN..11 + SALT_LEN + NONCE_LEN].to_vec();
        assert_ne!(nonce(&one), nonce(&two));
    }
}
