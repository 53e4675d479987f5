//! The spool encrypted at rest, on a real directory with real key files: no payload text on
//! disk, a record moved to another offset is quarantined and never delivered, a drain after a
//! key rotation delivers everything, a record under a key id not configured is kept and
//! named, an unencrypted spool of an older version is refused unless allowed, and key files
//! are held to the payload keys' rules.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;

use super::config::SpoolConfig;
use super::seal::{SpoolEncryption, SpoolKey};
use super::store::Spool;
use super::tests::{config, drain_all, open, segments, Memory};
use crate::message::envelope::{normalize, Envelope, EnvelopeConfig, RawMessage};
use crate::metrics::Metrics;

const MARKER: &str = "MARKER-c41f-payload-text";

pub(super) fn envelope(seq: u64) -> Envelope {
    let msg = RawMessage {
        stream: Arc::from("ORDERS"),
        consumer: Arc::from("svc"),
        published_unix_nanos: Some(1_700_000_000_000_000_000),
        ..RawMessage::sample(
            "orders.eu",
            seq,
            format!("{{\"n\":{seq},\"secret\":\"{MARKER}\"}}").as_bytes(),
        )
    };
    normalize(&msg, 1_700_000_000_000_000_001, &EnvelopeConfig::default()).0
}

/// A key file of 32 bytes of `byte`, mode 0600.
pub(super) fn key_file(dir: &Path, id: &str, byte: u8) -> SpoolKey {
    let path = dir.join(format!("{id}.key"));
    let text = base64::engine::general_purpose::STANDARD.encode([byte; 32]);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    SpoolKey {
        key_id: id.into(),
        key_file: path,
    }
}

pub(super) fn sealed(dir: &Path, current: &SpoolKey, old: &[&SpoolKey]) -> SpoolConfig {
    SpoolConfig {
        encryption: Some(SpoolEncryption {
            current: current.clone(),
            old_keys: old.iter().map(|k| (*k).clone()).collect(),
        }),
        allow_unencrypted: false,
        ..config(dir)
    }
}

fn segment_bytes(cfg: &SpoolConfig) -> Vec<u8> {
    let mut all = Vec::new();
    for name in segments(cfg) {
        all.extend(std::fs::read(cfg.dir.join(name)).unwrap());
    }
    all
}

pub(super) fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

pub(super) fn delivered(sink: &Memory) -> Vec<u64> {
    sink.got.lock().unwrap().clone()
}

#[test]
fn segment_bytes_hold_no_payload_text_and_drain_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    let envs: Vec<Envelope> = (1..=30).map(envelope).collect();
    let spool = open(&cfg);
    for chunk in envs.chunks(4) {
        spool.append(chunk).unwrap();
    }
    drop(spool);
    let disk = segment_bytes(&cfg);
    assert!(disk.len() > 30 * 100, "{} bytes", disk.len());
    // Neither the payload nor the subject or stream is readable at rest; the key id is.
    assert!(!contains(&disk, MARKER));
    assert!(!contains(&disk, "orders.eu"));
    assert!(!contains(&disk, "svc.file.message.v1"));
    assert!(contains(&disk, "s1"));
    // The same records in clear do show the marker (the check can fail).
    let clear = config(&tmp.path().join("clear"));
    std::fs::create_dir(tmp.path().join("clear")).unwrap();
    open(&clear).append(&envs[..1]).unwrap();
    assert!(contains(&segment_bytes(&clear), MARKER));

    let spool = open(&cfg);
    assert_eq!(spool.records(), 30);
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    assert_eq!(delivered(&sink), (1..=30).collect::<Vec<_>>());
}

#[test]
fn a_record_copied_to_another_offset_is_quarantined_and_never_delivered() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = SpoolConfig {
        segment_bytes: 1 << 20,
        ..sealed(tmp.path(), &k1, &[])
    };
    let spool = open(&cfg);
    spool.append(&[envelope(1)]).unwrap();
    spool.append(&[envelope(2)]).unwrap();
    drop(spool);
    // The first record's frame, byte for byte (its checksum intact), appended again after
    // the second: an intact frame at an offset it was not sealed for.
    let name = segments(&cfg).pop().unwrap();
    let path = cfg.dir.join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    let first = match super::frame::next(&bytes, super::frame::HEADER_LEN) {
        super::frame::Item::Record { start, end, .. } => bytes[start..end].to_vec(),
        other => panic!("{other:?}"),
    };
    let moved_at = bytes.len() as u64;
    bytes.extend_from_slice(&first);
    std::fs::write(&path, &bytes).unwrap();

    let metrics = Arc::new(Metrics::default());
    let spool = Arc::new(Spool::open(&cfg, metrics.clone()).unwrap());
    assert_eq!(spool.records(), 3, "the copy passes the frame checksum");
    let sink = Arc::new(Memory::default());
    let mut d = super::drain::Drainer::new(spool.clone(), sink.clone(), metrics.clone());
    d.run_until_empty(1).unwrap();
    assert_eq!(delivered(&sink), vec![1, 2], "the copy is never delivered");
    assert_eq!(spool.records(), 0);
    let counted = &metrics.counters.spool_quarantined_total;
    assert_eq!(counted.load(std::sync::atomic::Ordering::Relaxed), 1);
    let kept = cfg.dir.join(super::dir::quarantine_name(1, moved_at));
    assert_eq!(
        std::fs::read(kept).unwrap(),
        first,
        "kept as damage, by its offset"
    );
}

#[test]
fn a_drain_after_a_key_rotation_delivers_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let k2 = key_file(tmp.path(), "s2", 9);
    open(&sealed(tmp.path(), &k1, &[]))
        .append(&(1..=10).map(envelope).collect::<Vec<_>>())
        .unwrap();
    // Rotated: s2 seals new records; s1 only reads; the old segment is not rewritten.
    let rotated = sealed(tmp.path(), &k2, &[&k1]);
    let before = segments(&rotated);
    open(&rotated)
        .append(&(11..=20).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let disk = segment_bytes(&rotated);
    assert!(contains(&disk, "s1") && contains(&disk, "s2"));
    assert!(segments(&rotated).starts_with(&before));

    // Without the old key the drain delivers nothing and keeps every record.
    let metrics = Arc::new(Metrics::default());
    let spool = Arc::new(Spool::open(&sealed(tmp.path(), &k2, &[]), metrics.clone()).unwrap());
    let sink = Arc::new(Memory::default());
    let mut d = super::drain::Drainer::new(spool.clone(), sink.clone(), metrics);
    let err = d.run_until_empty(1).unwrap_err().to_string();
    assert!(err.contains("drain stuck"), "{err}");
    assert!(
        err.contains("key id \"s1\", which is not configured"),
        "{err}"
    );
    assert!(err.contains("segment 1 offset 8"), "{err}");
    assert!(err.contains("it is kept where it is"), "{err}");
    assert!(delivered(&sink).is_empty());
    assert_eq!(spool.records(), 20);
    drop((d, spool));

    let spool = open(&rotated);
    drain_all(&spool, &sink);
    assert_eq!(delivered(&sink), (1..=20).collect::<Vec<_>>());
    assert!(segments(&rotated).is_empty());
}

#[test]
fn an_unencrypted_spool_of_an_older_version_is_refused_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    // An older version's spool: records in clear (as `allow_unencrypted` writes them).
    open(&config(tmp.path()))
        .append(&(1..=5).map(envelope).collect::<Vec<_>>())
        .unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let strict = sealed(tmp.path(), &k1, &[]);
    let err = Spool::open(&strict, Arc::new(Metrics::default()))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("segment-0000000000000001.spool offset 8 holds a record stored unencrypted"),
        "{err}"
    );
    assert!(err.contains("set spool.allow_unencrypted: true"), "{err}");

    // Allowed beside the key: the old records are read, new ones are sealed.
    let both = SpoolConfig {
        allow_unencrypted: true,
        ..strict.clone()
    };
    let spool = open(&both);
    let before = segment_bytes(&both).len();
    spool
        .append(&(6..=10).map(envelope).collect::<Vec<_>>())
        .unwrap();
    assert!(!contains(&segment_bytes(&both)[before..], MARKER));
    let sink = Arc::new(Memory::default());
    drain_all(&spool, &sink);
    assert_eq!(delivered(&sink), (1..=10).collect::<Vec<_>>());
}

#[test]
fn key_files_are_held_to_the_payload_keys_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    let refused = |cfg: &SpoolConfig| {
        Spool::open(cfg, Arc::new(Metrics::default()))
            .err()
            .expect("refused")
            .to_string()
    };
    std::fs::set_permissions(&k1.key_file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = refused(&cfg);
    assert!(err.contains("encryption key \"s1\""), "{err}");
    assert!(err.contains("mode 0640"), "{err}");
    std::fs::set_permissions(&k1.key_file, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Another account's file (as root, the tests' user, any uid but 0 is another account).
    if crate::files::owner::service_uid() == 0 {
        std::os::unix::fs::chown(&k1.key_file, Some(65534), None).unwrap();
        let err = refused(&cfg);
        assert!(err.contains("uid 65534"), "{err}");
        std::os::unix::fs::chown(&k1.key_file, Some(0), None).unwrap();
    }

    // A link at the key's name.
    let link: PathBuf = tmp.path().join("link.key");
    std::os::unix::fs::symlink(&k1.key_file, &link).unwrap();
    let linked = SpoolKey {
        key_file: link,
        ..k1.clone()
    };
    let err = refused(&sealed(tmp.path(), &linked, &[]));
    assert!(err.contains("link"), "{err}");

    // A key of the wrong length, and an old key that is missing, are refused by id.
    std::fs::write(&k1.key_file, "c2hvcnQ=").unwrap();
    assert!(refused(&cfg).contains("decodes to 5 bytes; 32 bytes are required"));
    let k2 = key_file(tmp.path(), "s2", 9);
    let gone = SpoolKey {
        key_id: "s0".into(),
        key_file: tmp.path().join("missing.key"),
    };
    assert!(refused(&sealed(tmp.path(), &k2, &[&gone])).contains("encryption key \"s0\""));
    // The secret never shows in an error or in Debug.
    assert!(!format!("{:?}", super::seal::Crypt::load(None, true)).contains("Secret"));
    // And the right one opens.
    open(&sealed(tmp.path(), &k2, &[]));
}
