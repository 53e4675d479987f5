//! The `meta` file authenticated under the spool's key (issue 47): a rewritten meta plus a
//! planted segment in clear is refused, a tag that fails stops the opening, a rotation
//! re-authenticates it, and the old format is taken once only when it lets no record in
//! clear through.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use super::config::SpoolConfig;
use super::meta::{self, Meta};
use super::store::Spool;
use super::tests::{config, drain_all, open, quarantined, segments, Memory};
use super::tests_sealed::{delivered, envelope, key_file, sealed};
use super::{aside, codec, dir, frame, scan};
use crate::metrics::Metrics;

fn meta_bytes(cfg: &SpoolConfig) -> Vec<u8> {
    std::fs::read(cfg.dir.join("meta")).unwrap()
}

fn first_sealed(cfg: &SpoolConfig) -> u64 {
    u64::from_le_bytes(meta_bytes(cfg)[24..32].try_into().unwrap())
}

/// The key id version 2 names.
fn meta_key_id(cfg: &SpoolConfig) -> String {
    let m = meta_bytes(cfg);
    assert_eq!(&m[..8], b"SVCMETA2");
    String::from_utf8(m[33..33 + usize::from(m[32])].to_vec()).unwrap()
}

/// Replaces meta by the old format (a CRC, no tag) saying `first_sealed`, same spool id.
fn write_old_format(cfg: &SpoolConfig, first_sealed: u64) {
    let m = meta_bytes(cfg);
    let old = meta::encode(&Meta {
        spool_id: m[8..24].try_into().unwrap(),
        first_sealed,
    });
    std::fs::write(cfg.dir.join("meta"), old).unwrap();
}

fn refused(cfg: &SpoolConfig) -> String {
    match Spool::open(cfg, Arc::new(Metrics::default())) {
        Ok(_) => panic!("the spool opened"),
        Err(e) => e.to_string(),
    }
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

/// The attack: with `allow_unencrypted` beside the key, meta rewritten (same id, "no first
/// sealed segment", a valid CRC) and a segment in clear planted below the lowest sealed one.
/// Before, the record was delivered; now the opening refuses, naming the file and the way on
/// (`set-aside`), which is then counted by `status` and lets the spool open.
#[test]
fn a_rewritten_meta_and_a_clear_segment_below_the_sealed_ones_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = SpoolConfig {
        allow_unencrypted: true,
        ..sealed(tmp.path(), &k1, &[])
    };
    open(&cfg)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(segments(&cfg), vec![dir::segment_name(1)]);
    write_old_format(&cfg, meta::NONE);
    clear_segment(&cfg, 0, 99);

    let e = refused(&cfg);
    assert!(e.contains("meta: is not authenticated"), "{e}");
    assert!(e.contains("1 records stored unencrypted"), "{e}");
    assert!(e.contains("--segment 0 --offset 8"), "{e}");
    assert_eq!(&meta_bytes(&cfg)[..8], b"SVCMETA1", "nothing was changed");

    aside::set_aside(&cfg, 0, 8).unwrap();
    let survey = scan::walk(&cfg.dir, |_| true).unwrap();
    assert_eq!((survey.records, survey.set_aside), (3, 1));
    let sink = Arc::new(Memory::default());
    drain_all(&open(&cfg), &sink);
    assert_eq!(delivered(&sink), vec![1, 2, 3]);
    assert_eq!(meta_key_id(&cfg), "s1", "authenticated once taken");
}

/// A tag that does not verify (a byte of meta changed with any checksum), and a tag under a
/// key id no longer configured, stop the opening: no record is read, nothing is changed.
#[test]
fn a_meta_whose_tag_fails_does_not_open_the_spool() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = SpoolConfig {
        allow_unencrypted: true,
        ..sealed(tmp.path(), &k1, &[])
    };
    open(&cfg).append(&[envelope(1)]).unwrap();
    let good = meta_bytes(&cfg);
    let mut bad = good.clone();
    bad[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(cfg.dir.join("meta"), &bad).unwrap();
    clear_segment(&cfg, 0, 99);
    let e = refused(&cfg);
    assert!(
        e.contains("meta: does not authenticate under key id \"s1\""),
        "{e}"
    );
    assert_eq!(meta_bytes(&cfg), bad, "nothing was changed");
    let e = aside::set_aside(&cfg, 0, 8).unwrap_err().to_string();
    assert!(e.contains("does not authenticate"), "{e}");

    std::fs::write(cfg.dir.join("meta"), &good).unwrap();
    let k3 = key_file(tmp.path(), "s3", 9);
    let e = refused(&sealed(tmp.path(), &k3, &[]));
    assert!(e.contains("key id \"s1\", which is not configured"), "{e}");
    assert_eq!(meta_bytes(&cfg), good);
}

/// Rotation: with the new key current and the old one in `old_keys`, the spool opens and
/// meta is authenticated under the new key, so it still opens once the old key is removed.
#[test]
fn a_rotation_keeps_the_spool_openable_and_authenticates_meta_under_the_new_key() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let k2 = key_file(tmp.path(), "s2", 8);
    open(&sealed(tmp.path(), &k1, &[]))
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(meta_key_id(&sealed(tmp.path(), &k1, &[])), "s1");
    let rotated = sealed(tmp.path(), &k2, &[&k1]);
    let spool = open(&rotated);
    assert_eq!(meta_key_id(&rotated), "s2");
    spool
        .append(&(4..=5).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    drop(spool);
    assert_eq!(delivered(&sink), (1..=5).collect::<Vec<_>>());
    let k2_only = sealed(tmp.path(), &k2, &[]);
    open(&k2_only).append(&[envelope(6)]).unwrap();
    drain_all(&open(&k2_only), &sink);
    assert_eq!(delivered(&sink), (1..=6).collect::<Vec<_>>());
}

/// The old format beside a key is taken once, and written authenticated, when it lets no
/// record in clear through: a sealed spool without records in clear, and a spool written in
/// clear given a key (no sealed record yet). Once its records in clear have drained, no
/// segment is read in clear again (the mark is 0), so a segment in clear put back later below
/// the old mark (before, it was delivered) is quarantined.
#[test]
fn an_old_format_meta_is_upgraded_once_when_it_lets_no_clear_record_through() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let sealed_only = sealed(tmp.path(), &k1, &[]);
    open(&sealed_only).append(&[envelope(1)]).unwrap();
    write_old_format(&sealed_only, 1);
    let sink = Arc::new(Memory::default());
    drain_all(&open(&sealed_only), &sink);
    assert_eq!(meta_key_id(&sealed_only), "s1");
    assert_eq!(delivered(&sink), vec![1]);

    let tmp = tempfile::tempdir().unwrap();
    let clear = config(tmp.path());
    open(&clear)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(
        &meta_bytes(&clear)[..8],
        b"SVCMETA1",
        "no key: the old format"
    );
    let k1 = key_file(tmp.path(), "s1", 7);
    let both = SpoolConfig {
        allow_unencrypted: true,
        ..sealed(tmp.path(), &k1, &[])
    };
    let spool = open(&both);
    assert_eq!((meta_key_id(&both), first_sealed(&both)), ("s1".into(), 2));
    spool
        .append(&(4..=5).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    drop(spool);
    assert_eq!(delivered(&sink), (1..=5).collect::<Vec<_>>());
    drop(open(&both));
    assert_eq!(
        first_sealed(&both),
        0,
        "no segment is read in clear any more"
    );
    // Segment 1 in clear put back, the position damaged so the drain starts at it again.
    clear_segment(&both, 1, 99);
    std::fs::write(both.dir.join("position"), b"torn").unwrap();
    drain_all(&open(&both), &sink);
    assert_eq!(
        delivered(&sink),
        (1..=5).collect::<Vec<_>>(),
        "99 not delivered"
    );
}

/// Attack finding 4 (issue 47): the meta of another spool under the same key, authentic, put
/// in place of this one's. Before, no record decrypted and the drain quarantined every one of
/// them; now the opening tries the first sealed record of each segment, refuses when none
/// opens, quarantines nothing and leaves meta as it is. With this spool's meta back,
/// everything is delivered.
#[test]
fn the_meta_of_another_spool_under_the_same_key_is_refused_and_nothing_is_quarantined() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    let theirs = SpoolConfig {
        dir: tmp.path().join("theirs"),
        ..cfg.clone()
    };
    for chunk in (1..=60).map(envelope).collect::<Vec<_>>().chunks(5) {
        open(&cfg).append(chunk).unwrap();
    }
    open(&theirs).append(&[envelope(900)]).unwrap();
    let segment_count = segments(&cfg).len();
    assert!(segment_count > 1, "{segment_count}");
    let mine = meta_bytes(&cfg);
    std::fs::write(cfg.dir.join("meta"), meta_bytes(&theirs)).unwrap();

    let e = refused(&cfg);
    assert!(e.contains("meta: names another spool"), "{e}");
    assert!(
        e.contains(&format!("none of the {segment_count} records tried")),
        "{e}"
    );
    assert!(quarantined(&cfg).is_empty());
    assert_eq!(meta_bytes(&cfg), meta_bytes(&theirs), "meta left as it is");

    std::fs::write(cfg.dir.join("meta"), &mine).unwrap();
    let sink = Arc::new(Memory::default());
    drain_all(&open(&cfg), &sink);
    assert_eq!(delivered(&sink), (1..=60).collect::<Vec<_>>());
    assert!(quarantined(&cfg).is_empty());
}

/// Attack finding 4b: a meta of the old format (a CRC, no tag) with another spool id beside
/// sealed records: before, it was taken (no record in clear), rewritten authenticated, and
/// every record quarantined; now the trial decryption refuses it first.
#[test]
fn an_old_format_meta_with_another_spool_id_is_refused_before_it_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    open(&cfg)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let mine = meta_bytes(&cfg);
    let other = meta::encode(&Meta {
        spool_id: [0x5A; meta::ID_LEN],
        first_sealed: meta::NONE,
    });
    std::fs::write(cfg.dir.join("meta"), &other).unwrap();

    let e = refused(&cfg);
    assert!(e.contains("meta: names another spool"), "{e}");
    assert_eq!(meta_bytes(&cfg), other, "not rewritten");
    assert!(quarantined(&cfg).is_empty());

    std::fs::write(cfg.dir.join("meta"), &mine).unwrap();
    let sink = Arc::new(Memory::default());
    drain_all(&open(&cfg), &sink);
    assert_eq!(delivered(&sink), vec![1, 2, 3]);
}
