//! Attack atk47d on issue 47's evidence at rest (reproductions; each asserts what the docs
//! promise, and each runs: the findings are fixed).

use std::sync::Arc;

use super::config::SpoolConfig;
use super::tests::{config, drain_all, open, quarantined, segments, Memory};
use super::tests_sealed::{delivered, envelope, key_file, sealed};
use super::{codec, frame};

fn plant(cfg: &SpoolConfig, name: &str, body: &[u8]) -> u64 {
    let path = cfg.dir.join(name);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() as u64;
    frame::encode(&mut bytes, body);
    std::fs::write(&path, &bytes).unwrap();
    at
}

fn clear_body(seq: u64) -> Vec<u8> {
    let mut body = Vec::new();
    codec::encode(&mut body, &envelope(seq), 1).unwrap();
    body
}

/// A migrated spool: segment 1 in clear, then a key with `allow_unencrypted`.
fn migrated(tmp: &std::path::Path) -> SpoolConfig {
    open(&config(tmp))
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let k1 = key_file(tmp, "s1", 7);
    let both = SpoolConfig {
        allow_unencrypted: true,
        ..sealed(tmp, &k1, &[])
    };
    open(&both)
        .append(&(4..=6).map(envelope).collect::<Vec<_>>())
        .unwrap();
    both
}

/// Finding 1a: `meta` was protected by a CRC alone. Whoever writes the spool as the service's
/// account (the actor docs/spool.md considers) rewrote it with the same spool id and "no
/// first sealed segment", and a clear record planted in a segment written under the key was
/// delivered. `meta` is authenticated now: the same rewrite in the old format (a CRC, no tag)
/// is refused at the opening, since the spool holds records in clear beside sealed ones.
#[test]
fn a_rewritten_meta_lets_a_clear_record_through_a_sealed_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let both = migrated(tmp.path());
    let names = segments(&both);
    assert_eq!(names.len(), 2, "{names:?}");
    // Rewrite meta: same id, first sealed segment = none (u64::MAX), a valid CRC.
    let meta_path = both.dir.join("meta");
    let m = std::fs::read(&meta_path).unwrap();
    assert_eq!(&m[..8], b"SVCMETA2");
    assert_eq!(u64::from_le_bytes(m[24..32].try_into().unwrap()), 2);
    let forged = super::meta::encode(&super::meta::Meta {
        spool_id: m[8..24].try_into().unwrap(),
        first_sealed: u64::MAX,
    });
    std::fs::write(&meta_path, forged).unwrap();
    plant(&both, &names[1], &clear_body(99));

    let opened = super::store::Spool::open(&both, Arc::new(crate::metrics::Metrics::default()));
    let e = opened.err().expect("refused").to_string();
    assert!(e.contains("meta: is not authenticated"), "{e}");
    assert!(quarantined(&both).is_empty(), "nothing was changed");
}

/// Finding 1b: no forgery of `meta` needed. When the spool is empty and its position file
/// is damaged (a torn write, or anyone with the account), segment ids start at 1 again
/// (docs/spool.md) but `meta` keeps the old first sealed segment: the new sealed segments lie
/// below it, and a clear record planted in one is delivered.
#[test]
fn segment_ids_starting_again_put_sealed_segments_below_the_first_sealed_one() {
    let tmp = tempfile::tempdir().unwrap();
    let both = migrated(tmp.path());
    // Drain everything: segments removed, the position past segment 2.
    let sink = Arc::new(Memory::default());
    drain_all(&open(&both), &sink);
    assert_eq!(delivered(&sink), (1..=6).collect::<Vec<_>>());
    // A few more segments so that first_sealed stays well above 1 after the restart.
    let small = SpoolConfig {
        segment_bytes: 4096,
        ..both.clone()
    };
    std::fs::write(both.dir.join("position"), b"torn").unwrap();
    let spool = open(&small);
    spool
        .append(&(7..=8).map(envelope).collect::<Vec<_>>())
        .unwrap();
    drop(spool);
    let names = segments(&both);
    assert_eq!(names[0], "segment-0000000000000001.spool", "{names:?}");
    // Since meta is authenticated: once the clear segments drained, no record in clear is
    // read in any segment (the mark is 0), so ids starting again open no gap.
    let m = std::fs::read(both.dir.join("meta")).unwrap();
    let first_sealed = u64::from_le_bytes(m[24..32].try_into().unwrap());
    assert_eq!(first_sealed, 0, "first sealed segment {first_sealed}");
    plant(&both, &names[0], &clear_body(99));

    let sink = Arc::new(Memory::default());
    drain_all(&open(&both), &sink);
    let got = delivered(&sink);
    assert!(
        !got.contains(&99),
        "a clear record forged in sealed segment 1 was delivered: {got:?}"
    );
}

/// Finding 2: a set-aside frame is a CRC and `0xFE`, no key: whoever writes the spool
/// directory turns any acknowledged record into one, and every reader skips it without a
/// word (no log, no metric, `svc spool status` does not count it), although the genuine
/// command always leaves `quarantine-<S>-<O>.bad` beside it. A forged marker is the one
/// forgery the spool neither quarantines nor stops at; a marker with no quarantine copy
/// should at least be said and counted.
#[test]
fn a_forged_set_aside_frame_hides_an_acknowledged_record_silently() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    open(&cfg)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let name = segments(&cfg).pop().unwrap();
    let path = cfg.dir.join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    let second = frame::items(&bytes, frame::HEADER_LEN)
        .filter_map(|i| match i {
            frame::Item::Record { start, end, .. } => Some((start, end)),
            _ => None,
        })
        .nth(1)
        .unwrap();
    let mut body = vec![0u8; second.1 - second.0 - frame::FRAME_OVERHEAD];
    body[0] = super::aside::FLAG_SET_ASIDE;
    let mut tomb = Vec::new();
    frame::encode(&mut tomb, &body);
    bytes[second.0..second.1].copy_from_slice(&tomb);
    std::fs::write(&path, &bytes).unwrap();

    let metrics = Arc::new(crate::metrics::Metrics::default());
    let spool = match super::store::Spool::open(&cfg, metrics.clone()) {
        Ok(s) => Arc::new(s),
        Err(e) => return eprintln!("refused at the opening: {e}"),
    };
    let sink = Arc::new(Memory::default());
    let mut d = super::drain::Drainer::new(spool.clone(), sink.clone(), metrics.clone());
    let _ = d.run_until_empty(1);
    assert_eq!(delivered(&sink), vec![1, 3], "record 2 is gone");
    let counted = metrics
        .counters
        .spool_quarantined_total
        .load(std::sync::atomic::Ordering::Relaxed)
        + metrics
            .counters
            .spool_drain_errors_total
            .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        counted > 0 || !quarantined(&cfg).is_empty(),
        "acknowledged record 2 vanished behind a forged set-aside frame: nothing counted, no \
         quarantine file, no error"
    );
}

/// Finding 3: `svc spool set-aside` is for "a record no configuration should read", but it
/// takes any intact record: an offset copied from `svc spool inspect` one line off (an
/// operator's honest mistake) sets aside a genuine, readable, acknowledged record, which is
/// then never delivered (only its sealed bytes are kept, in a file nothing drains).
#[test]
fn set_aside_takes_a_genuine_record_the_configuration_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    open(&cfg)
        .append(&(1..=3).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let name = segments(&cfg).pop().unwrap();
    let bytes = std::fs::read(cfg.dir.join(&name)).unwrap();
    let second = frame::items(&bytes, frame::HEADER_LEN)
        .filter_map(|i| match i {
            frame::Item::Record { start, .. } => Some(start as u64),
            _ => None,
        })
        .nth(1)
        .unwrap();
    let done = super::aside::set_aside(&cfg, 1, second);
    let sink = Arc::new(Memory::default());
    drain_all(&open(&cfg), &sink);
    assert!(
        done.is_err(),
        "a readable record was set aside ({done:?}); delivered: {:?}",
        delivered(&sink)
    );
}

/// Finding 1c: a missing `meta` is refused only while sealed (version 2) records remain. A
/// drained spool's `meta` removed, and a segment of clear records planted after the drain
/// position: the opening makes a new spool id and puts the first sealed segment after the
/// planted one, whose clear records are delivered (with `allow_unencrypted`, which a
/// migrated spool keeps until it has drained).
#[test]
fn a_removed_meta_and_a_planted_segment_deliver_clear_records() {
    let tmp = tempfile::tempdir().unwrap();
    let both = migrated(tmp.path());
    let sink = Arc::new(Memory::default());
    drain_all(&open(&both), &sink);
    assert_eq!(delivered(&sink), (1..=6).collect::<Vec<_>>());
    std::fs::remove_file(both.dir.join("meta")).unwrap();
    let mut seg = frame::SEGMENT_MAGIC.to_vec();
    frame::encode(&mut seg, &clear_body(99));
    let name = super::dir::segment_name(5);
    std::fs::write(both.dir.join(&name), &seg).unwrap();
    std::fs::set_permissions(
        both.dir.join(&name),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();

    let sink = Arc::new(Memory::default());
    match super::store::Spool::open(&both, Arc::new(crate::metrics::Metrics::default())) {
        Err(e) => eprintln!("refused: {e}"),
        Ok(s) => drain_all(&Arc::new(s), &sink),
    }
    let got = delivered(&sink);
    assert!(
        !got.contains(&99),
        "a clear record planted with meta removed was delivered: {got:?}"
    );
}

/// Finding 4: `set-aside` names the quarantine file by the place alone, not the name
/// `dir::keep` used: with a link or a file of other contents planted at that name (the
/// record's bytes then go to `quarantine-<S>-<O>~1.bad`), the command's output and its log
/// line point the operator at the planted file, not at the record's bytes. (Held: the link
/// is not followed and the planted file is not overwritten; the bytes are kept.)
#[test]
fn set_aside_names_the_file_the_bytes_are_in_not_a_planted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    open(&cfg).append(&[envelope(1)]).unwrap();
    let name = segments(&cfg).pop().unwrap();
    let mut forged = vec![super::seal::FLAG_SEALED_V2];
    forged.extend_from_slice(&1u64.to_le_bytes());
    forged.push(4);
    forged.extend_from_slice(b"evil");
    forged.extend_from_slice(&[0x33; 52]);
    let at = plant(&cfg, &name, &forged);
    let mut frame_bytes = Vec::new();
    frame::encode(&mut frame_bytes, &forged);
    let target = tmp.path().join("target");
    std::fs::write(&target, b"victim").unwrap();
    let kept = super::dir::quarantine_name(1, at);
    std::os::unix::fs::symlink(&target, cfg.dir.join(&kept)).unwrap();
    let got = super::aside::set_aside(&cfg, 1, at).unwrap();
    // Held: the link was not followed, the bytes are kept under the next name.
    assert_eq!(std::fs::read(&target).unwrap(), b"victim");
    let real = kept.replace(".bad", "~1.bad");
    assert_eq!(std::fs::read(cfg.dir.join(&real)).unwrap(), frame_bytes);
    let sink = Arc::new(Memory::default());
    drain_all(&open(&cfg), &sink);
    assert_eq!(delivered(&sink), vec![1]);
    // The finding: the name given to the operator is the planted link's.
    assert_eq!(
        got, real,
        "set-aside said the bytes are in the planted {got}"
    );
}
