//! The spool's `meta` file: its identity and where encryption began.
//!
//! A spool with a key writes it authenticated (version 2):
//! `SVCMETA2 | spool id (16) | first sealed segment (8 LE) | key id length L (1) | key id (L) |
//! key check (8, as in a sealed record) | HMAC-SHA256 (32)` of all the bytes before the tag, under a key derived from the spool key
//! named by the key id (`Crypt::meta_bytes` in seal.rs). A spool without a key writes
//! version 1, as before: `SVCMETA1 | spool id (16) | first sealed segment (8 LE) | CRC-32 (4
//! LE)`. Which version a spool with a key accepts is decided at the opening
//! (store.rs): version 1 there is an old or a rewritten file.
//!
//! - The spool id, made once when the spool is first opened, is bound in the associated data
//!   of every record sealed since (frame version 2): a record copied from another spool under
//!   the same key does not decrypt here.
//! - The first sealed segment is the first segment written since encryption was turned on
//!   ([`NONE`] while the spool runs without a key): a record in clear is read (with
//!   `allow_unencrypted`) only in a segment before it; one at or after it was not written by
//!   this spool and is quarantined, never delivered.
//!
//! The file is replaced whole (temporary name, fsync, rename, directory fsync) and read only
//! when it is a regular file of the service's user with one name, no access for other
//! accounts and exactly its length: one planted by another account, through a link, or with
//! a looser mode is refused, and the spool does not open.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ring::rand::{SecureRandom, SystemRandom};
use rustix::fs::AtFlags;

use super::dir::{self, fail, SpoolError};

/// The file's name in the spool directory.
pub const NAME: &str = "meta";
const MAGIC: &[u8; 8] = b"SVCMETA1";
const MAGIC_V2: &[u8; 8] = b"SVCMETA2";
const LEN: usize = 36;
/// Length of the tag of version 2 (HMAC-SHA256).
pub const TAG_LEN: usize = 32;
/// Length of the key check (what a sealed record carries).
pub const CHECK_LEN: usize = 8;
/// Longest version 2 file: a key id of 64 bytes.
const MAX_LEN_V2: usize = 33 + 64 + CHECK_LEN + TAG_LEN;
/// Length of a spool id.
pub const ID_LEN: usize = 16;
/// "No segment sealed yet": the spool runs without a key.
pub const NONE: u64 = u64::MAX;

/// What the meta file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub spool_id: [u8; ID_LEN],
    pub first_sealed: u64,
}

/// The meta file as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Version 1: a CRC only (a spool without a key, or a file written before version 2).
    Plain(Meta),
    /// Version 2: `tag` authenticates `signed` (the bytes before it) under `key_id`, whose
    /// key check was `check` when it was written.
    Signed {
        meta: Meta,
        key_id: String,
        check: [u8; CHECK_LEN],
        signed: Vec<u8>,
        tag: [u8; TAG_LEN],
    },
}

impl Stored {
    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Stored::Plain(m) => encode(m),
            Stored::Signed { signed, tag, .. } => [&signed[..], &tag[..]].concat(),
        }
    }

    /// What the file says (authenticated or not).
    pub fn meta(&self) -> Meta {
        match self {
            Stored::Plain(m) | Stored::Signed { meta: m, .. } => *m,
        }
    }
}

/// The bytes of version 2 the tag covers: everything before it.
pub fn signed_part(m: &Meta, key_id: &str, check: &[u8; CHECK_LEN]) -> Vec<u8> {
    let mut data = MAGIC_V2.to_vec();
    data.extend_from_slice(&m.spool_id);
    data.extend_from_slice(&m.first_sealed.to_le_bytes());
    data.push(key_id.len() as u8);
    data.extend_from_slice(key_id.as_bytes());
    data.extend_from_slice(check);
    data
}

fn decode_v2(data: &[u8]) -> Option<Stored> {
    let id_len = usize::from(*data.get(32)?);
    let check_at = 33 + id_len;
    if !data.starts_with(MAGIC_V2) || data.len() != check_at + CHECK_LEN + TAG_LEN {
        return None;
    }
    let key_id = std::str::from_utf8(&data[33..check_at]).ok()?;
    if !crate::message::protection::keys::is_key_id(key_id) {
        return None;
    }
    let (signed, tag) = data.split_at(check_at + CHECK_LEN);
    Some(Stored::Signed {
        meta: Meta {
            spool_id: data[8..24].try_into().expect("16 bytes"),
            first_sealed: u64::from_le_bytes(data[24..32].try_into().expect("8 bytes")),
        },
        key_id: key_id.to_string(),
        check: signed[check_at..].try_into().ok()?,
        signed: signed.to_vec(),
        tag: tag.try_into().ok()?,
    })
}

/// Version 1 (a spool without a key).
pub fn encode(m: &Meta) -> Vec<u8> {
    let mut data = MAGIC.to_vec();
    data.extend_from_slice(&m.spool_id);
    data.extend_from_slice(&m.first_sealed.to_le_bytes());
    let sum = crc32fast::hash(&data);
    data.extend_from_slice(&sum.to_le_bytes());
    data
}

fn decode(data: &[u8]) -> Option<Meta> {
    if data.len() != LEN || !data.starts_with(MAGIC) {
        return None;
    }
    let sum = u32::from_le_bytes(data[32..36].try_into().ok()?);
    (crc32fast::hash(&data[..32]) == sum).then(|| Meta {
        spool_id: data[8..24].try_into().expect("16 bytes"),
        first_sealed: u64::from_le_bytes(data[24..32].try_into().expect("8 bytes")),
    })
}

/// Reads the meta file, either version (not verified: see `Crypt::verify_meta` in seal.rs):
/// `None` when there is none; an error naming the reason when it is refused (another owner,
/// a link, more than one name, a mode open to other accounts) or damaged.
pub fn read(dir: &OwnedFd, path: &Path) -> Result<Option<Stored>, SpoolError> {
    if rustix::fs::statat(dir, NAME, AtFlags::SYMLINK_NOFOLLOW).is_err() {
        return Ok(None);
    }
    let file = dir::open_file(dir, path, NAME, false)?;
    let mode = file
        .metadata()
        .map_err(|e| fail(path, NAME, e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(fail(
            path,
            NAME,
            format!(
                "has mode {:o}: it must grant other accounts nothing (0600); a file the \
                 spool writes always has, so it was not written by it",
                mode & 0o777
            ),
        ));
    }
    let data = dir::read_at(&file, 0, MAX_LEN_V2 as u64 + 1).map_err(|e| fail(path, NAME, e))?;
    let stored = decode(&data)
        .map(Stored::Plain)
        .or_else(|| decode_v2(&data));
    stored.map(Some).ok_or_else(|| {
        fail(
            path,
            NAME,
            "is damaged (wrong length, header or checksum); the spool is not opened: restore \
             it from a backup, or remove it only when no record in the spool was sealed since \
             version 2 of the frame (those would be quarantined)",
        )
    })
}

/// Writes the meta file's bytes ([`encode`], or version 2 from `Crypt` in seal.rs),
/// replacing it whole.
pub fn write(dir: &OwnedFd, path: &Path, bytes: &[u8]) -> Result<(), SpoolError> {
    dir::write_new(dir, path, NAME, bytes)
}

/// A new spool id from the system's random source.
pub fn new_id() -> Result<[u8; ID_LEN], SpoolError> {
    let mut id = [0u8; ID_LEN];
    SystemRandom::new()
        .fill(&mut id)
        .map_err(|_| SpoolError("the system's random source failed".into()))?;
    Ok(id)
}

/// The meta a spool opened with (`seals`: with a key) takes on, where `next_segment` is the
/// segment its next append creates: a spool id is made once; encryption begins at the next
/// segment when it was off, and a spool run without a key has no first sealed segment (its
/// new clear records must stay readable when a key comes back).
pub fn next(old: Option<Meta>, seals: bool, next_segment: u64) -> Result<Meta, SpoolError> {
    let mut m = match old {
        Some(m) => m,
        None => Meta {
            spool_id: new_id()?,
            first_sealed: NONE,
        },
    };
    m.first_sealed = match (seals, m.first_sealed) {
        (false, _) => NONE,
        (true, NONE) => next_segment,
        (true, first) => first,
    };
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_damage_is_refused() {
        let m = Meta {
            spool_id: [7; ID_LEN],
            first_sealed: 12,
        };
        let data = encode(&m);
        assert_eq!(data.len(), LEN);
        assert_eq!(decode(&data), Some(m));
        for i in 0..LEN {
            let mut bad = data.clone();
            bad[i] ^= 1;
            assert_eq!(decode(&bad), None, "{i}");
        }
        assert_eq!(decode(&data[..LEN - 1]), None);
    }

    #[test]
    fn version_2_decodes_and_damage_or_another_length_is_refused() {
        let m = Meta {
            spool_id: [7; ID_LEN],
            first_sealed: 12,
        };
        let mut data = signed_part(&m, "k1", &[5; CHECK_LEN]);
        data.extend_from_slice(&[9; TAG_LEN]);
        let Some(Stored::Signed {
            meta,
            key_id,
            check,
            tag,
            ..
        }) = decode_v2(&data)
        else {
            panic!("not decoded")
        };
        assert_eq!(
            (meta, key_id.as_str(), check, tag),
            (m, "k1", [5; CHECK_LEN], [9; TAG_LEN])
        );
        assert_eq!(decode_v2(&data[..data.len() - 1]), None);
        let mut bad_id = data.clone();
        bad_id[33] = b'/';
        assert_eq!(decode_v2(&bad_id), None);
        let mut long = data.clone();
        long[32] = 3;
        assert_eq!(decode_v2(&long), None);
    }

    #[test]
    fn encryption_begins_at_the_next_segment_and_ends_without_a_key() {
        let first = next(None, true, 5).unwrap();
        assert_eq!(first.first_sealed, 5);
        assert_eq!(next(Some(first), true, 9).unwrap(), first);
        let off = next(Some(first), false, 9).unwrap();
        assert_eq!((off.spool_id, off.first_sealed), (first.spool_id, NONE));
        assert_eq!(next(Some(off), true, 11).unwrap().first_sealed, 11);
        assert_ne!(next(None, true, 1).unwrap().spool_id, first.spool_id);
    }

    #[test]
    fn a_planted_meta_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s");
        let d = dir::open_dir(&path, true).unwrap();
        assert_eq!(read(&d, &path).unwrap(), None);
        let m = next(None, true, 1).unwrap();
        write(&d, &path, &encode(&m)).unwrap();
        assert_eq!(read(&d, &path).unwrap(), Some(Stored::Plain(m)));
        let file = path.join(NAME);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read(&d, &path).unwrap_err().to_string();
        assert!(e.contains("mode 644"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::hard_link(&file, tmp.path().join("second-name")).unwrap();
        assert!(read(&d, &path).is_err());
        std::fs::remove_file(tmp.path().join("second-name")).unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &file).unwrap();
        std::fs::write(tmp.path().join("elsewhere"), encode(&m)).unwrap();
        assert!(read(&d, &path).is_err());
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, b"short").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read(&d, &path).unwrap_err().to_string();
        assert!(e.contains("damaged"), "{e}");
    }
}
