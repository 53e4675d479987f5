//! The attack on the spool's encryption at rest (issue 47, findings 2 to 5), on a real
//! directory: a key file replaced under its id keeps every record and stops the drain; a
//! clear record forged beside a key is quarantined, never delivered; a record of another
//! spool under the same key does not decrypt; a forged record is set aside by the operator.

use std::sync::Arc;

use super::config::SpoolConfig;
use super::drain::Drainer;
use super::store::Spool;
use super::tests::{config, drain_all, open, quarantined, segments};
use super::tests_sealed::{delivered, envelope, key_file, sealed};
use super::{codec, dir, frame};
use crate::metrics::Metrics;
use crate::sink::spool::tests::Memory;

/// Appends `body` as one intact frame at the end of segment `name` (what anyone who can
/// write the directory can do, no key needed); returns its offset.
fn plant(cfg: &SpoolConfig, name: &str, body: &[u8]) -> u64 {
    let path = cfg.dir.join(name);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() as u64;
    frame::encode(&mut bytes, body);
    std::fs::write(&path, &bytes).unwrap();
    at
}

/// A clear body of envelope `seq`, as a spool without a key writes it.
fn clear_body(seq: u64) -> Vec<u8> {
    let mut body = Vec::new();
    codec::encode(&mut body, &envelope(seq), 1).unwrap();
    body
}

fn drain_error(spool: &Arc<Spool>, sink: &Arc<Memory>) -> String {
    let mut d = Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()));
    d.run_until_empty(1).unwrap_err().to_string()
}

/// Finding 2: the docs' own key command run again writes another key under the same id. The
/// records sealed under the old key are kept (none quarantined), the drain stops naming the
/// key id and the changed key file, and with the old key back everything is delivered.
#[test]
fn a_key_file_replaced_under_its_id_keeps_every_record() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    open(&cfg)
        .append(&(1..=5).map(envelope).collect::<Vec<_>>())
        .unwrap();
    // The meta file was authenticated under s1: the spool does not open, saying why.
    key_file(tmp.path(), "s1", 8);
    let e = Spool::open(&cfg, Arc::new(Metrics::default()))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains(": meta: "), "{e}");
    assert!(e.contains("key id \"s1\""), "{e}");
    assert!(e.contains("key file changed"), "{e}");
    assert!(quarantined(&cfg).is_empty(), "no record is quarantined");
    // Rotated to s2 (meta authenticated under it now), then s1's file replaced: the records
    // sealed under s1 stop the drain, kept.
    key_file(tmp.path(), "s1", 7);
    let k2 = key_file(tmp.path(), "s2", 9);
    let rotated = sealed(tmp.path(), &k2, &[&k1]);
    drop(open(&rotated));
    key_file(tmp.path(), "s1", 8);
    let spool = open(&rotated);
    assert_eq!(spool.records(), 5);
    let sink = Arc::new(Memory::default());
    let err = drain_error(&spool, &sink);
    assert!(err.contains("key id \"s1\""), "{err}");
    assert!(err.contains("key file changed"), "{err}");
    assert!(err.contains("segment 1 offset 8"), "{err}");
    assert!(delivered(&sink).is_empty());
    assert!(quarantined(&cfg).is_empty(), "no record is quarantined");
    assert_eq!(spool.records(), 5);
    drop(spool);

    key_file(tmp.path(), "s1", 7);
    drain_all(&open(&rotated), &sink);
    assert_eq!(delivered(&sink), (1..=5).collect::<Vec<_>>());
}

/// Finding 4: beside a key, `allow_unencrypted` reads clear records only in the segments
/// written before encryption was turned on; a clear record planted in a later segment is
/// quarantined, never delivered.
#[test]
fn a_clear_record_forged_beside_a_key_is_quarantined_not_delivered() {
    let tmp = tempfile::tempdir().unwrap();
    // A spool in clear (segment 1), then migrated: a key with allow_unencrypted.
    let clear = config(tmp.path());
    open(&clear)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let both = SpoolConfig {
        allow_unencrypted: true,
        ..sealed(tmp.path(), &k1, &[])
    };
    open(&both)
        .append(&(4..=6).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let names = segments(&both);
    assert_eq!(names.len(), 2, "{names:?}");
    let forged_at = plant(&both, &names[1], &clear_body(99));

    let spool = open(&both);
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    assert_eq!(delivered(&sink), (1..=6).collect::<Vec<_>>());
    let kept = quarantined(&both);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].0, super::dir::quarantine_name(2, forged_at));

    // The same forgery in a fresh spool sealed from its first segment: quarantined too, and
    // the spool still opens.
    let fresh = SpoolConfig {
        dir: tmp.path().join("fresh"),
        ..both.clone()
    };
    open(&fresh).append(&[envelope(1)]).unwrap();
    plant(&fresh, &segments(&fresh)[0], &clear_body(98));
    let sink = Arc::new(Memory::default());
    drain_all(&open(&fresh), &sink);
    assert_eq!(delivered(&sink), vec![1]);
    assert_eq!(quarantined(&fresh).len(), 1);
}

/// Finding 5: a record of another spool sealed under the same key does not decrypt here (the
/// spool id and its place are in the associated data): quarantined, while this spool's own
/// records are delivered. (A spool where no record opens at all is refused at the opening:
/// tests_meta.rs.)
#[test]
fn a_record_of_another_spool_under_the_same_key_is_quarantined() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let mine = sealed(tmp.path(), &k1, &[]);
    let theirs = SpoolConfig {
        dir: tmp.path().join("theirs"),
        ..mine.clone()
    };
    open(&mine).append(&[envelope(1)]).unwrap();
    open(&theirs).append(&[envelope(2)]).unwrap();
    let name = segments(&theirs).pop().unwrap();
    let next = dir::segment_id(&segments(&mine).pop().unwrap()).unwrap() + 1;
    std::fs::copy(
        theirs.dir.join(&name),
        mine.dir.join(dir::segment_name(next)),
    )
    .unwrap();

    let sink = Arc::new(Memory::default());
    drain_all(&open(&mine), &sink);
    assert_eq!(delivered(&sink), vec![1]);
    assert_eq!(quarantined(&mine).len(), 1);
}

/// 64 bytes under a key id never configured (no key needed to write them).
fn forged_unknown_key() -> Vec<u8> {
    let mut body = vec![super::seal::FLAG_SEALED_V2];
    body.extend_from_slice(&1u64.to_le_bytes());
    body.push(4);
    body.extend_from_slice(b"evil");
    body.extend_from_slice(&[0x33; 52]);
    body
}

/// Finding 3: a forged record under a key id never configured stops the drain, naming its
/// place and `svc spool set-aside`; set aside, its bytes are kept in a quarantine file and
/// the drain delivers everything after it.
#[test]
fn a_forged_record_set_aside_lets_the_drain_go_on() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    open(&cfg)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let name = segments(&cfg).pop().unwrap();
    let at = plant(&cfg, &name, &forged_unknown_key());
    open(&cfg)
        .append(&(4..=6).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let spool = open(&cfg);
    assert_eq!(spool.records(), 7);
    let sink = Arc::new(Memory::default());
    let err = drain_error(&spool, &sink);
    assert!(err.contains("key id \"evil\""), "{err}");
    let command = format!("svc spool set-aside <config_file> --segment 1 --offset {at}");
    assert!(err.contains(&command), "{err}");
    assert_eq!(delivered(&sink), vec![1, 2, 3]);
    // Refused while the spool is held.
    let held = super::aside::set_aside(&cfg, 1, at)
        .unwrap_err()
        .to_string();
    assert!(held.contains("another process"), "{held}");
    drop(spool);

    let before = std::fs::read(cfg.dir.join(&name)).unwrap();
    let kept = super::aside::set_aside(&cfg, 1, at).unwrap();
    assert_eq!(kept, super::dir::quarantine_name(1, at));
    let mut frame_bytes = Vec::new();
    frame::encode(&mut frame_bytes, &forged_unknown_key());
    assert_eq!(quarantined(&cfg), vec![(kept, frame_bytes)]);
    let after = std::fs::read(cfg.dir.join(&name)).unwrap();
    assert_eq!(after.len(), before.len());
    assert_eq!(
        after[..at as usize],
        before[..at as usize],
        "nothing else changed"
    );
    for wrong in [at + 1, u64::MAX] {
        let e = super::aside::set_aside(&cfg, 1, wrong).unwrap_err();
        assert!(e.to_string().contains("no intact record starts"), "{e}");
    }
    let e = super::aside::set_aside(&cfg, 1, 8).unwrap_err();
    assert!(e.to_string().contains("before the drain position"), "{e}");
    let again = super::aside::set_aside(&cfg, 1, at).unwrap_err();
    assert!(again.to_string().contains("set aside already"), "{again}");

    let spool = open(&cfg);
    assert_eq!(spool.records(), 3, "a set-aside frame is no record");
    drain_all(&spool, &sink);
    assert_eq!(delivered(&sink), (1..=6).collect::<Vec<_>>());
    assert_eq!(quarantined(&cfg).len(), 1);
}

/// The spool id is made once: a spool whose `meta` file is gone while records are sealed
/// under its id is refused (a new id would make them all undecryptable), and drains once the
/// file is back.
#[test]
fn a_missing_meta_file_with_sealed_records_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    open(&cfg).append(&[envelope(1)]).unwrap();
    let meta = cfg.dir.join("meta");
    let saved = std::fs::read(&meta).unwrap();
    std::fs::remove_file(&meta).unwrap();
    let e = Spool::open(&cfg, Arc::new(Metrics::default()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("the meta file is missing, but 1 records"), "{e}");
    assert!(!meta.exists(), "nothing was changed");
    std::fs::write(&meta, saved).unwrap();
    std::fs::set_permissions(&meta, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let sink = Arc::new(Memory::default());
    drain_all(&open(&cfg), &sink);
    assert_eq!(delivered(&sink), vec![1]);
}
