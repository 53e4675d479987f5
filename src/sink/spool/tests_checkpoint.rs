//! Custody checkpoint frames in a sealed spool (`sink.type: spool`), on a real directory: a
//! frame appended between records is sealed (its text not on disk), counted apart by the
//! survey, read back as a checkpoint by the spool store, and drained in order: the records
//! before it first, then the frame into a real file checkpoint store; a drain without a
//! checkpoint store stops at it, the records before it delivered. Then the signature check
//! before a put (`super::put`): in a spool kept in clear and in a sealed one.

use std::sync::Arc;

use super::tests::{drain_all, open, Memory};
use super::tests_sealed::{contains, delivered, envelope, key_file, sealed};
use crate::metrics::Metrics;
use crate::sink::checkpoint::spool::SpoolStore;
use crate::sink::checkpoint::{CheckpointStore, FileStore};

/// A checkpoint as a store keeps it, as far as the drain reads it (the name its signed body
/// claims; the signature is the audit's to check).
const TEXT: &str = concat!(
    r#"{"signed":"{\"index\":0,\"marker\":\"CHECKPOINT-TEXT-7d1e\","#,
    r#"\"runner_id\":\"runner-1\"}"}"#,
    "\n"
);

#[test]
fn a_sealed_checkpoint_frame_drains_after_its_records_into_the_target_store() {
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    let spool = open(&cfg);
    spool
        .append(&[envelope(1), envelope(2), envelope(3)])
        .unwrap();
    spool
        .append_checkpoint(("runner-1", 0), TEXT.as_bytes())
        .unwrap();
    spool.append(&[envelope(4), envelope(5)]).unwrap();
    assert_eq!(
        spool.records(),
        6,
        "frames waiting, the checkpoint included"
    );
    let store = SpoolStore::new(spool.clone());
    let read = store.checkpoints().unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].1, TEXT);
    assert!(read[0].0.starts_with("spool segment "), "{}", read[0].0);
    assert_eq!(store.records().unwrap().len(), 5);
    drop((spool, store));

    let mut disk = Vec::new();
    for name in super::tests::segments(&cfg) {
        disk.extend(std::fs::read(cfg.dir.join(name)).unwrap());
    }
    assert!(!contains(&disk, "CHECKPOINT-TEXT-7d1e"));
    let survey = super::scan::walk(&cfg.dir, |_| true).unwrap();
    assert_eq!((survey.records, survey.checkpoints), (5, 1));

    // No checkpoint store: the records before the frame are delivered, then it stops there.
    let spool = open(&cfg);
    let sink = Arc::new(Memory::default());
    let mut d =
        super::drain::Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()));
    let err = d.run_until_empty(1).unwrap_err().to_string();
    assert!(
        err.contains("is a custody checkpoint, and the target keeps no"),
        "{err}"
    );
    assert_eq!(delivered(&sink), vec![1, 2, 3]);
    drop((d, spool));

    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let target = FileStore {
        root: out.clone(),
        file_mode: 0o600,
    };
    let spool = open(&cfg);
    let mut d = into_target(&spool, &sink, &target, Default::default());
    d.run_until_empty(1).unwrap();
    assert_eq!(d.checkpoints_put(), 1);
    assert_eq!(delivered(&sink), vec![1, 2, 3, 4, 5]);
    let stored = target.checkpoints().unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].1, TEXT);
    assert_eq!(spool.records(), 0);
    drop((d, spool));
    let survey = super::scan::walk(&cfg.dir, |_| true).unwrap();
    assert_eq!((survey.records, survey.checkpoints), (0, 0));
    // Nothing left to drain: an empty spool drains to nothing more.
    drain_all(&open(&cfg), &sink);
    assert_eq!(delivered(&sink).len(), 5);

    // A frame naming another checkpoint than its text claims is never stored under that name:
    // quarantined (its bytes kept), the drain goes on (atk50b finding 7).
    let spool = open(&cfg);
    spool
        .append_checkpoint(("runner-1", 1), TEXT.as_bytes())
        .unwrap();
    spool.append(&[envelope(6)]).unwrap();
    let mut d = into_target(&spool, &sink, &target, Default::default());
    d.run_until_empty(1).unwrap();
    assert_eq!(d.checkpoints_put(), 0);
    assert_eq!(target.checkpoints().unwrap().len(), 1);
    assert_eq!(delivered(&sink), vec![1, 2, 3, 4, 5, 6]);
    let kept = std::fs::read_dir(&cfg.dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("quarantine-")
        })
        .count();
    assert_eq!(kept, 1);
    drop((d, spool));

    // A checkpoint frame the drain stops at (no checkpoint store) is set aside by the
    // operator, its bytes kept, and the drain moves past it (atk50b finding 6).
    let spool = open(&cfg);
    spool
        .append_checkpoint(("runner-1", 1), TEXT.as_bytes())
        .unwrap();
    spool.append(&[envelope(7)]).unwrap();
    let mut d =
        super::drain::Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()));
    let err = d.run_until_empty(1).unwrap_err().to_string();
    let at = err.split("the frame at segment ").nth(1).unwrap();
    let mut nums = at
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty());
    let segment: u64 = nums.next().unwrap().parse().unwrap();
    let offset: u64 = nums.next().unwrap().parse().unwrap();
    drop((d, spool));
    super::aside::set_aside(&cfg, segment, offset).unwrap();
    drain_all(&open(&cfg), &sink);
    assert_eq!(delivered(&sink), vec![1, 2, 3, 4, 5, 6, 7]);
}

/// Checkpoint `index` of runner r1, signed by the Ed25519 seed `seed` under key id `key_id`
/// (a real key file, read as the runner reads it), and the public key it verifies under.
fn signed(dir: &std::path::Path, seed: u8, key_id: &str, index: u64) -> (String, [u8; 32]) {
    signed_after(dir, seed, key_id, (index, ""))
}

/// [`signed`], its `previous` given (the drain puts a checkpoint only after the one it links to).
fn signed_after(
    dir: &std::path::Path,
    seed: u8,
    key_id: &str,
    (index, previous): (u64, &str),
) -> (String, [u8; 32]) {
    use crate::message::protection::checkpoint::{self as cp, Body, CheckpointConfig, Signer};
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    let key = dir.join(format!("cp-{seed}.key"));
    std::fs::write(
        &key,
        base64::engine::general_purpose::STANDARD.encode([seed; 32]),
    )
    .unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = CheckpointConfig {
        enabled: true,
        signing_key_file: key,
        key_id: key_id.into(),
        ..CheckpointConfig::default()
    };
    let signer = Signer::load(&cfg).unwrap();
    let leaves = vec![(index + 1, [index as u8; 32])];
    let body = Body {
        runner_id: "r1".into(),
        key_id: key_id.into(),
        sink: "spool".into(),
        index,
        first_sequence: index + 1,
        last_sequence: index + 1,
        count: 1,
        root: cp::merkle_root(&leaves),
        previous: previous.into(),
        gaps: vec![],
        created_at: "2026-01-01T00:00:00Z".into(),
        stream: "ORDERS".into(),
        stream_incarnation: String::new(),
    };
    let text = String::from_utf8(cp::seal(&body, &leaves, &signer)).unwrap();
    (text, signer.public_key())
}

/// A drainer of `spool` into `sink`, putting checkpoint frames into `target`, checked with
/// `trusted`.
fn into_target(
    spool: &Arc<super::Spool>,
    sink: &Arc<Memory>,
    target: &FileStore,
    trusted: crate::message::protection::checkpoint::TrustedKeys,
) -> super::drain::Drainer {
    super::drain::Drainer::new(spool.clone(), sink.clone(), Arc::new(Metrics::default()))
        .with_checkpoint_store(Box::new(target.clone()))
        .with_trusted_keys(trusted)
}

fn quarantine_files(cfg: &super::SpoolConfig) -> usize {
    std::fs::read_dir(&cfg.dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("quarantine-")
        })
        .count()
}

/// The place a drain error names (`... at segment S offset O ...`).
fn place_named(err: &str) -> (u64, u64) {
    let at = err.split("at segment ").nth(1).unwrap();
    let mut nums = at
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty());
    let segment = nums.next().unwrap().parse().unwrap();
    (segment, nums.next().unwrap().parse().unwrap())
}

/// A spool kept in clear proves nothing about who wrote a checkpoint frame: one planted under
/// the runner's next index by whoever could write the directory (signed with another key
/// under the runner's key id) is never put: the drain stops at it, kept (a wrong key given to
/// the drain reads the same way, and must not move genuine checkpoints out: atk51c finding
/// 3), the operator sets it aside, and the runner's real checkpoint of that index is put
/// after it; a frame in clear under a key id not trusted here stops the drain, naming the
/// remedy, until the key is given.
#[test]
fn a_checkpoint_frame_in_clear_is_put_only_when_it_verifies() {
    use crate::message::protection::checkpoint::TrustedKeys;
    let tmp = tempfile::tempdir().unwrap();
    let cfg = super::tests::config(tmp.path());
    let (real, public) = signed(tmp.path(), 3, "cp1", 0);
    let (planted, _) = signed(tmp.path(), 9, "cp1", 0);
    let mut trusted = TrustedKeys::default();
    trusted.0.insert("cp1".into(), public);
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let target = FileStore {
        root: out.clone(),
        file_mode: 0o600,
    };

    let spool = open(&cfg);
    let e = |s| super::tests::envelope(s);
    spool.append(&[e(1), e(2)]).unwrap();
    spool
        .append_checkpoint(("r1", 0), planted.as_bytes())
        .unwrap();
    spool.append(&[e(3)]).unwrap();
    spool.append_checkpoint(("r1", 0), real.as_bytes()).unwrap();
    spool.append(&[e(4)]).unwrap();
    let sink = Arc::new(Memory::default());
    let mut d = into_target(&spool, &sink, &target, trusted.clone());
    let err = d.run_until_empty(1).unwrap_err().to_string();
    assert!(
        err.contains("does not verify under the key this drain trusts")
            && err.contains("svc spool set-aside"),
        "{err}"
    );
    assert_eq!(delivered(&sink), vec![1, 2]);
    assert!(target.checkpoints().unwrap().is_empty());
    drop((d, spool));
    let (segment, offset) = place_named(&err);
    super::aside::set_aside(&cfg, segment, offset).unwrap();
    let spool = open(&cfg);
    let mut d = into_target(&spool, &sink, &target, trusted.clone());
    d.run_until_empty(1).unwrap();
    assert_eq!(d.checkpoints_put(), 1);
    assert_eq!(delivered(&sink), vec![1, 2, 3, 4]);
    let stored = target.checkpoints().unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].1, real,
        "the real checkpoint, not the planted one"
    );
    assert_eq!(
        quarantine_files(&cfg),
        1,
        "the planted frame's bytes are kept (set aside)"
    );
    drop((d, spool));

    // Another key id: nothing in clear is put unchecked; the drain stops at it and names the
    // remedy; given the key, it goes on.
    let outer: serde_json::Value = serde_json::from_str(&real).unwrap();
    let previous = crate::message::protection::checkpoint::body_digest(
        outer["signed"].as_str().unwrap().as_bytes(),
    );
    let (other, other_public) = signed_after(tmp.path(), 5, "edge7", (1, &previous));
    let spool = open(&cfg);
    spool
        .append_checkpoint(("r1", 1), other.as_bytes())
        .unwrap();
    spool.append(&[e(5)]).unwrap();
    let mut d = into_target(&spool, &sink, &target, trusted.clone());
    let err = d.run_until_empty(1).unwrap_err().to_string();
    assert!(
        err.contains("signed by key id edge7, which this drain does not trust")
            && err.contains("--public-key ID=FILE"),
        "{err}"
    );
    assert_eq!(target.checkpoints().unwrap().len(), 1);
    drop((d, spool));
    trusted.0.insert("edge7".into(), other_public);
    let spool = open(&cfg);
    let mut d = into_target(&spool, &sink, &target, trusted);
    d.run_until_empty(1).unwrap();
    assert_eq!(d.checkpoints_put(), 1);
    assert_eq!(target.checkpoints().unwrap().len(), 2);
    assert_eq!(delivered(&sink), vec![1, 2, 3, 4, 5]);
}

/// A sealed frame is bound to its place by the spool's key, and still checked when its key id
/// is trusted here: one whose signature does not verify is never put (the drain stops at it,
/// kept); a frame that is no checkpoint at all is quarantined and the drain goes on.
#[test]
fn a_sealed_checkpoint_frame_that_does_not_verify_is_never_put() {
    use crate::message::protection::checkpoint::TrustedKeys;
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    let (_, public) = signed(tmp.path(), 3, "cp1", 0);
    let (forged, _) = signed(tmp.path(), 9, "cp1", 0);
    let mut trusted = TrustedKeys::default();
    trusted.0.insert("cp1".into(), public);
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let target = FileStore {
        root: out,
        file_mode: 0o600,
    };
    let spool = open(&cfg);
    spool.append(&[envelope(1)]).unwrap();
    spool
        .append_checkpoint(("r1", 0), forged.as_bytes())
        .unwrap();
    spool.append(&[envelope(2)]).unwrap();
    let sink = Arc::new(Memory::default());
    let mut d = into_target(&spool, &sink, &target, trusted.clone());
    let err = d.run_until_empty(1).unwrap_err().to_string();
    assert!(err.contains("FORGED"), "{err}");
    assert_eq!(d.checkpoints_put(), 0);
    assert!(target.checkpoints().unwrap().is_empty());
    assert_eq!(delivered(&sink), vec![1]);
    drop((d, spool));
    let (segment, offset) = place_named(&err);
    super::aside::set_aside(&cfg, segment, offset).unwrap();

    // Not a checkpoint at all (its signed body names the runner and index, nothing else).
    let spool = open(&cfg);
    spool
        .append_checkpoint(("runner-1", 0), TEXT.as_bytes())
        .unwrap();
    spool.append(&[envelope(3)]).unwrap();
    let mut d = into_target(&spool, &sink, &target, trusted);
    d.run_until_empty(1).unwrap();
    assert_eq!(d.checkpoints_put(), 0);
    assert!(target.checkpoints().unwrap().is_empty());
    assert_eq!(delivered(&sink), vec![1, 2, 3]);
    assert_eq!(quarantine_files(&cfg), 2, "set aside, and quarantined");
}

/// The drained head (`super::drained`) is recorded after a checkpoint's put and before the
/// drain position moves past its frame: a record that fails (here a directory at its name)
/// stops the step with the frame kept in the spool, as a crash between the put and the record
/// would leave it (the spool's chain then still holds the checkpoint the target holds last);
/// the next drain finds the checkpoint stored, records it, and goes on to the last one put.
#[test]
fn the_drained_head_is_recorded_before_the_position_moves_past_its_frame() {
    use crate::message::protection::checkpoint::{verify, TrustedKeys};
    let tmp = tempfile::tempdir().unwrap();
    let k1 = key_file(tmp.path(), "s1", 7);
    let cfg = sealed(tmp.path(), &k1, &[]);
    let (zero, public) = signed(tmp.path(), 3, "cp1", 0);
    let mut trusted = TrustedKeys::default();
    trusted.0.insert("cp1".into(), public);
    let digest = verify(&zero, &trusted).unwrap().digest;
    let (one, _) = signed_after(tmp.path(), 3, "cp1", (1, &digest));
    let spool = open(&cfg);
    spool.append(&[envelope(1)]).unwrap();
    spool.append_checkpoint(("r1", 0), zero.as_bytes()).unwrap();
    spool.append(&[envelope(2)]).unwrap();
    spool.append_checkpoint(("r1", 1), one.as_bytes()).unwrap();
    assert_eq!(spool.drained_head("r1").unwrap(), None);
    let blocker = cfg.dir.join(super::drained::name("r1"));
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("x"), b"x").unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let target = FileStore {
        root: out,
        file_mode: 0o600,
    };
    let sink = Arc::new(Memory::default());
    let mut d = into_target(&spool, &sink, &target, trusted.clone());
    let err = d.run_until_empty(1).unwrap_err().to_string();
    assert!(
        err.contains("is in the target, but its drained head could not be recorded"),
        "{err}"
    );
    assert_eq!(target.get("r1", 0).unwrap().as_deref(), Some(zero.as_str()));
    drop(d);
    // The position did not move past the frame: the spool's chain still holds checkpoint 0.
    let frames = SpoolStore::new(spool.clone()).checkpoints().unwrap();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].1, zero);

    std::fs::remove_dir_all(&blocker).unwrap();
    let mut d = into_target(&spool, &sink, &target, trusted);
    d.run_until_empty(1).unwrap();
    assert_eq!(d.checkpoints_put(), 2);
    assert_eq!(delivered(&sink), vec![1, 2]);
    let (name, text) = spool.drained_head("r1").unwrap().unwrap();
    assert_eq!((name, text), (super::drained::name("r1"), one));
    assert_eq!(spool.drained_head("r2").unwrap(), None);
}
