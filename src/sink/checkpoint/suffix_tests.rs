//! The chain read back from a store holding its suffix only (the spool as the sink): which
//! suffixes and head files the runner's start takes, and which it refuses.

use std::os::unix::fs::PermissionsExt;

use base64::Engine as _;

use std::fs;
use std::path::Path;

use super::super::file_store::temp_name;
use super::*;
use crate::message::protection::checkpoint::{merkle_root, CheckpointConfig, Verified};

/// The checkpoints 0..n of runner r1 (one leaf each), signed with a real key file.
fn signed_chain(dir: &Path, n: u64) -> (Vec<(String, String)>, TrustedKeys) {
    let key = dir.join("cp.key");
    fs::write(
        &key,
        base64::engine::general_purpose::STANDARD.encode([3u8; 32]),
    )
    .unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = CheckpointConfig {
        enabled: true,
        signing_key_file: key,
        key_id: "cp1".into(),
        ..CheckpointConfig::default()
    };
    let signer = Signer::load(&cfg).unwrap();
    let mut trusted = TrustedKeys::default();
    trusted.0.insert("cp1".into(), signer.public_key());
    let (mut previous, mut out) = (String::new(), Vec::new());
    for i in 0..n {
        let leaves = vec![(i + 1, [i as u8; 32])];
        let body = Body {
            runner_id: "r1".into(),
            key_id: "cp1".into(),
            sink: "spool".into(),
            index: i,
            first_sequence: i + 1,
            last_sequence: i + 1,
            count: 1,
            root: merkle_root(&leaves),
            previous: previous.clone(),
            gaps: vec![],
            created_at: "2026-01-01T00:00:00Z".into(),
            stream: "ORDERS".into(),
            stream_incarnation: String::new(),
        };
        previous = checkpoint::body_digest(&body.encode());
        let text = String::from_utf8(seal(&body, &leaves, &signer)).unwrap();
        out.push((format!("frame {i}"), text));
    }
    (out, trusted)
}

fn digest_of(v: &[Verified], index: u64) -> String {
    v.iter()
        .find(|c| c.body.index == index)
        .unwrap()
        .digest
        .clone()
}

#[test]
fn a_suffix_that_links_and_reaches_the_head_is_taken_and_any_other_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (all, trusted) = signed_chain(dir.path(), 6);
    let file = HeadFile::new(&dir.path().join("head")).unwrap();
    let whole = own_chain(all.clone(), &trusted, "r1", false).unwrap();
    let head = |i: u64| Some(Head::new("r1", i, &digest_of(&whole, i)));
    let suffix = own_chain(all[3..].to_vec(), &trusted, "r1", true).unwrap();
    assert_eq!(suffix.len(), 3);
    // A whole-chain store never starts past 0.
    assert!(own_chain(all[3..].to_vec(), &trusted, "r1", false).is_err());
    // A hole in the suffix.
    let holed = vec![all[3].clone(), all[5].clone()];
    let e = own_chain(holed, &trusted, "r1", true).unwrap_err();
    assert!(e.contains("is broken at checkpoint 5"), "{e}");

    let ok =
        |chain: &[Verified], h: Option<Head>| check_suffix_head(chain, h.as_ref(), "r1", &file);
    assert!(ok(&suffix, head(5)).is_ok(), "the head is its end");
    assert!(
        ok(&suffix, head(4)).is_ok(),
        "the head file one behind (a crash after a put)"
    );
    assert!(
        ok(&suffix, head(2)).is_ok(),
        "it begins right after the head"
    );
    assert!(ok(&[], head(5)).is_ok(), "everything drained");
    assert!(ok(&[], None).is_ok(), "a new chain");
    let e = ok(&suffix, head(1)).unwrap_err();
    // One sentence, single spaces (atk50b finding 8: a continuation without its backslash).
    assert!(
        e.contains("begins at checkpoint 3, which does not follow the head file"),
        "{e}"
    );
    assert!(!e.contains("  "), "{e}");
    let e = ok(&suffix, Some(Head::new("r1", 7, &digest_of(&whole, 5)))).unwrap_err();
    assert!(e.contains("TRUNCATED"), "{e}");
    let e = ok(&suffix, Some(Head::new("r1", 4, &digest_of(&whole, 5)))).unwrap_err();
    assert!(e.contains("holds another checkpoint 4"), "{e}");
    let e = ok(&suffix, Some(Head::new("r1", 2, &digest_of(&whole, 1)))).unwrap_err();
    assert!(e.contains("does not follow"), "{e}");
    let e = ok(&suffix, None).unwrap_err();
    assert!(e.contains("head file"), "{e}");
    let e = ok(&suffix, Some(Head::new("r2", 5, &digest_of(&whole, 5)))).unwrap_err();
    assert!(e.contains("is runner r2's"), "{e}");
}

/// FIXED (atk51b finding 1, side finding): the temporary name of a FileStore put differs
/// between two puts of one process and one name (the checkpoint thread and a drain's put);
/// before, both were `.<name>.<pid>.tmp` and one put's error path unlinked the other's file.
#[test]
fn two_puts_of_one_name_in_one_process_use_two_temporary_names() {
    let name = "72-00000000000000000000.json";
    let (a, b) = (temp_name(name), temp_name(name));
    assert_ne!(a, b);
    assert!(
        a.starts_with(&format!(".{name}.{}.", std::process::id())),
        "{a}"
    );
}

/// The start with the target out of reach (`super::super::drained::check`): the spool's chain
/// must hold the drained head or begin right after it; a chain with a hole (the drain put 0,
/// quarantined 1's damaged frame, stopped at 2) is refused; the drained head is verified and
/// must be this runner's; with no checkpoint left in the spool it is what the chain goes on
/// from.
#[test]
fn the_spool_chain_must_hold_or_follow_the_drained_head() {
    use super::super::drained::check;
    let dir = tempfile::tempdir().unwrap();
    let (all, trusted) = signed_chain(dir.path(), 6);
    let suffix = |from: usize| own_chain(all[from..].to_vec(), &trusted, "r1", true).unwrap();
    let rec = |i: usize| ("/s/drained-head-x".to_string(), all[i].1.clone());
    // Begins right after it (the position moved past its frame).
    assert_eq!(
        check(&suffix(3), &rec(2), &trusted, "r1")
            .unwrap()
            .body
            .index,
        2
    );
    // Holds it (a crash between the record and the position's move).
    assert!(check(&suffix(3), &rec(3), &trusted, "r1").is_ok());
    assert!(check(&suffix(3), &rec(5), &trusted, "r1").is_ok());
    // A hole: the spool begins at 2, the target holds up to 0.
    let e = check(&suffix(2), &rec(0), &trusted, "r1").unwrap_err();
    assert!(
        e.contains("begins at checkpoint 2, but the drain put checkpoint 0 into the target last")
            && e.contains("checkpoint 1 is in neither")
            && e.contains("/s/drained-head-x"),
        "{e}"
    );
    assert!(!e.contains("  "), "{e}");
    let e = check(&suffix(4), &rec(0), &trusted, "r1").unwrap_err();
    assert!(e.contains("checkpoints 1 to 3 are in neither"), "{e}");
    // Past the spool's chain: another chain.
    let e = check(&suffix(3), &rec(1), &trusted, "r1").unwrap_err();
    assert!(
        e.contains("checkpoints 3 to 5") || e.contains("neither"),
        "{e}"
    );
    let e = check(&suffix(0)[..2], &rec(4), &trusted, "r1").unwrap_err();
    assert!(e.contains("does not hold or follow checkpoint 4"), "{e}");
    // Nothing left in the spool: the drained head is the chain's end.
    assert_eq!(check(&[], &rec(5), &trusted, "r1").unwrap().body.index, 5);
    // Planted or another runner's: refused, the file named.
    let planted = (
        "/s/drained-head-x".to_string(),
        all[5].1.replace("ORDERS", "OTHERS"),
    );
    let e = check(&[], &planted, &trusted, "r1").unwrap_err();
    assert!(e.contains("/s/drained-head-x does not verify"), "{e}");
    let e = check(&[], &rec(5), &trusted, "r9").unwrap_err();
    assert!(
        e.contains("is a checkpoint of runner r1, not of this runner r9"),
        "{e}"
    );
}
