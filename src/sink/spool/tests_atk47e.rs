//! Attack review atk47e of the authenticated `meta` file (issue 47): an authentic meta put
//! back where it does not belong (an older one of this spool, one of another spool under the
//! same key). Each test states what it did and what it saw.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use super::config::SpoolConfig;
use super::store::Spool;
use super::tests::{config, drain_all, open, quarantined, Memory};
use super::tests_sealed::{delivered, envelope, key_file, sealed};
use super::{codec, dir, frame};
use crate::metrics::Metrics;

fn meta_bytes(cfg: &SpoolConfig) -> Vec<u8> {
    std::fs::read(cfg.dir.join("meta")).unwrap()
}

fn first_sealed(cfg: &SpoolConfig) -> u64 {
    u64::from_le_bytes(meta_bytes(cfg)[24..32].try_into().unwrap())
}

/// Puts `bytes` back as meta, mode 0600, one name (as a copy the service's account kept, a
/// backup restored, or a rename within the file system would leave it).
fn put_meta(cfg: &SpoolConfig, bytes: &[u8]) {
    let path = cfg.dir.join("meta");
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn clear_segment(cfg: &SpoolConfig, id: u64, seq: u64) {
    let mut body = Vec::new();
    codec::encode(&mut body, &envelope(seq), 1).unwrap();
    let mut seg = frame::SEGMENT_MAGIC.to_vec();
    frame::encode(&mut seg, &body);
    let path = cfg.dir.join(dir::segment_name(id));
    std::fs::write(&path, seg).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Finding 3 (rollback). docs/spool.md: "Once no segment before the mark is left, the mark
/// becomes 0 and no record in clear is read again, whatever is put back in the directory".
/// An older meta of this very spool (authentic: written by it under the same key, before the
/// mark closed) put back with a segment in clear and a damaged position (CRC only): the mark
/// is the old one again, and the planted record 99 is delivered.
#[test]
fn an_older_authentic_meta_put_back_reopens_reading_in_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let clear = config(tmp.path());
    open(&clear)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let both = SpoolConfig {
        allow_unencrypted: true,
        ..sealed(tmp.path(), &k1, &[])
    };
    let spool = open(&both);
    assert_eq!(first_sealed(&both), 2);
    // What the service's account (or a backup) keeps: authentic, under the current key.
    let older = meta_bytes(&both);
    assert_eq!(&older[..8], b"SVCMETA2");
    spool
        .append(&(4..=5).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    drop(spool);
    drop(open(&both));
    assert_eq!(first_sealed(&both), 0, "the mark closed");

    put_meta(&both, &older);
    clear_segment(&both, 1, 99);
    std::fs::write(both.dir.join("position"), b"torn").unwrap();
    drain_all(&open(&both), &sink);
    assert_eq!(
        delivered(&sink),
        (1..=5).collect::<Vec<_>>(),
        "a record in clear planted after the mark closed was delivered"
    );
}

/// Finding 4 (meta of another spool). Two spools under one key (two runners on one host, or
/// a spool made again). Spool B's meta put in place of spool A's: it authenticates (same
/// key), the opening accepts it, and the drain quarantines every record A sealed (they do not
/// decrypt under B's spool id): acknowledged messages never delivered, and A's own id, the
/// only way to decrypt them, is gone with A's meta. The opening should refuse (as it does when
/// meta is missing while records are sealed under its id), changing nothing.
#[test]
fn the_meta_of_another_spool_under_the_same_key_does_not_quarantine_every_record() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let a = sealed(tmp.path(), &k1, &[]);
    let b = SpoolConfig {
        dir: tmp.path().join("spool-b"),
        ..a.clone()
    };
    open(&a)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    open(&b).append(&[envelope(9)]).unwrap();
    let a_meta = meta_bytes(&a);
    std::fs::rename(b.dir.join("meta"), a.dir.join("meta")).unwrap();
    assert_ne!(meta_bytes(&a), a_meta);

    match Spool::open(&a, Arc::new(Metrics::default())) {
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("meta"), "{e}");
            assert!(quarantined(&a).is_empty(), "nothing changed");
        }
        Ok(spool) => {
            let sink = Arc::new(Memory::default());
            drain_all(&Arc::new(spool), &sink);
            assert_eq!(
                (delivered(&sink), quarantined(&a).len()),
                (vec![1, 2, 3], 0),
                "every record of spool A quarantined under spool B's id"
            );
        }
    }
}

/// Finding 4b (old-format upgrade). No authentic file needed: meta rewritten in the old format
/// (a CRC anyone computes) with another spool id, beside a spool holding only sealed records.
/// The upgrade rule takes it ("no record in clear": it lets no record in clear through) and
/// rewrites it authenticated under the key with the forged id; the drain then quarantines
/// every sealed record, and the spool's own id is gone.
#[test]
fn an_old_format_meta_with_another_spool_id_does_not_quarantine_every_record() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    open(&cfg)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let forged = super::meta::encode(&super::meta::Meta {
        spool_id: [0x5a; super::meta::ID_LEN],
        first_sealed: first_sealed(&cfg),
    });
    put_meta(&cfg, &forged);

    match Spool::open(&cfg, Arc::new(Metrics::default())) {
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("meta"), "{e}");
            assert_eq!(meta_bytes(&cfg), forged, "nothing changed");
        }
        Ok(spool) => {
            let sink = Arc::new(Memory::default());
            drain_all(&Arc::new(spool), &sink);
            assert_eq!(
                (delivered(&sink), quarantined(&cfg).len()),
                (vec![1, 2, 3], 0),
                "every sealed record quarantined under a forged spool id"
            );
        }
    }
}
