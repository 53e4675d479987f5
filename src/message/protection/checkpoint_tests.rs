use super::*;
use crate::message::protection::checkpoint_audit::{audit, StoredRecord};

fn signer() -> Signer {
    Signer {
        key_id: "cp1".into(),
        pair: Ed25519KeyPair::from_seed_unchecked(&[7u8; 32]).unwrap(),
    }
}

fn trusted(s: &Signer) -> TrustedKeys {
    let mut t = TrustedKeys::default();
    t.0.insert("cp1".into(), s.public_key());
    t
}

/// A chain of `n` checkpoints of two records each, sequences 1.., runner r1.
fn chain(s: &Signer, n: u64) -> (Vec<(String, String)>, Vec<StoredRecord>) {
    let mut prev = String::new();
    let mut cps = Vec::new();
    let mut recs = Vec::new();
    for i in 0..n {
        let leaves: Vec<(u64, [u8; 32])> = (1..=2).map(|k| (2 * i + k, [k as u8; 32])).collect();
        let body = Body {
            runner_id: "r1".into(),
            key_id: "cp1".into(),
            sink: "file".into(),
            index: i,
            first_sequence: leaves[0].0,
            last_sequence: leaves[1].0,
            count: 2,
            root: merkle_root(&leaves),
            previous: prev.clone(),
            gaps: vec![],
            created_at: "2026-01-01T00:00:00Z".into(),
        };
        prev = body_digest(&body.encode());
        let text = String::from_utf8(seal(&body, &leaves, s)).unwrap();
        cps.push((format!("cp{i}"), text));
        for (seq, d) in leaves {
            recs.push(StoredRecord {
                place: format!("r{seq}"),
                read: Ok((seq, "r1".into(), d)),
            });
        }
    }
    (cps, recs)
}

#[test]
fn merkle_root_follows_rfc6962() {
    let a = (1u64, [1u8; 32]);
    let b = (2u64, [2u8; 32]);
    let c = (3u64, [3u8; 32]);
    let (la, lb, lc) = (
        leaf_hash(a.0, &a.1),
        leaf_hash(b.0, &b.1),
        leaf_hash(c.0, &c.1),
    );
    assert_eq!(merkle_root(&[a]), la);
    // Three leaves: split at 2, so (a b) c.
    assert_eq!(
        merkle_root(&[a, b, c]),
        node_hash(&node_hash(&la, &lb), &lc)
    );
    assert_eq!(merkle_root(&[]), sha256(b""));
}

#[test]
fn an_untouched_chain_is_complete_and_a_deleted_record_is_named() {
    let s = signer();
    let (cps, mut recs) = chain(&s, 3);
    let r = audit(&recs, &cps, &trusted(&s));
    assert!(r.complete(), "{:?}", r.findings);
    assert_eq!(r.intact, 6);
    recs.retain(|r| !matches!(r.read, Ok((4, _, _))));
    let r = audit(&recs, &cps, &trusted(&s));
    assert_eq!(r.missing, vec![4]);
    assert!(!r.complete());
}

#[test]
fn altered_uncovered_forged_unknown_and_removed_are_reported() {
    let s = signer();
    let (mut cps, mut recs) = chain(&s, 3);
    recs[0].read = Ok((1, "r1".into(), [9u8; 32]));
    recs.push(StoredRecord {
        place: "late".into(),
        read: Ok((99, "r1".into(), [0u8; 32])),
    });
    let r = audit(&recs, &cps, &trusted(&s));
    assert_eq!(r.altered, vec![1]);
    assert_eq!(r.uncovered, vec![99]);

    // Removing the middle checkpoint breaks the chain.
    let removed = cps.remove(1);
    let r = audit(&recs, &cps, &trusted(&s));
    assert_eq!(r.chain_problems, 1, "{:?}", r.findings);
    cps.insert(1, removed);

    // A byte of the signed body changed: forged.
    cps[2].1 = cps[2].1.replace("\\\"count\\\":2", "\\\"count\\\":3");
    let r = audit(&recs, &cps, &trusted(&s));
    assert!(
        r.findings.iter().any(|f| f.line.contains("FORGED")),
        "{:?}",
        r.findings
    );

    // A key the verifier does not hold.
    let mut other = TrustedKeys::default();
    other.0.insert("cp2".into(), s.public_key());
    let r = audit(&recs, &cps, &other);
    assert!(r.findings.iter().any(|f| f.line.contains("unknown key")));
}
