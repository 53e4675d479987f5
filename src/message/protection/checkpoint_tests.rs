use super::*;
use crate::message::protection::checkpoint_audit::{audit, Finding, RecordRead, StoredRecord};

/// A record of runner r1 on stream ORDERS, the incarnation [`chain`] signs.
fn read(sequence: u64, digest: [u8; 32]) -> RecordRead {
    RecordRead {
        stream: "ORDERS".into(),
        incarnation: INCARNATION.into(),
        sequence,
        runner_id: "r1".into(),
        digest,
    }
}

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

/// A chain of `n` checkpoints of two records each, sequences 1.., runner r1, stream ORDERS
/// in one incarnation.
fn chain(s: &Signer, n: u64) -> (Vec<(String, String)>, Vec<StoredRecord>) {
    chain_in(s, n, |_| INCARNATION)
}

const INCARNATION: &str = "20260101T000000Z";

/// [`chain`] with the incarnation of checkpoint `i` given by `incarnation(i)`; sequences go
/// on across incarnations.
fn chain_in(
    s: &Signer,
    n: u64,
    incarnation: impl Fn(u64) -> &'static str,
) -> (Vec<(String, String)>, Vec<StoredRecord>) {
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
            stream: "ORDERS".into(),
            stream_incarnation: incarnation(i).into(),
        };
        prev = body_digest(&body.encode());
        let text = String::from_utf8(seal(&body, &leaves, s)).unwrap();
        cps.push((format!("cp{i}"), text));
        for (seq, d) in leaves {
            recs.push(StoredRecord {
                place: format!("r{seq}"),
                read: Ok(RecordRead {
                    incarnation: incarnation(i).into(),
                    ..read(seq, d)
                }),
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
    recs.retain(|r| !matches!(r.read, Ok(RecordRead { sequence: 4, .. })));
    let r = audit(&recs, &cps, &trusted(&s));
    assert_eq!(r.missing, vec![4]);
    assert!(!r.complete());
}

#[test]
fn altered_uncovered_forged_unknown_and_removed_are_reported() {
    let s = signer();
    let (mut cps, mut recs) = chain(&s, 3);
    recs[0].read = Ok(read(1, [9u8; 32]));
    recs.push(StoredRecord {
        place: "late".into(),
        read: Ok(read(99, [0u8; 32])),
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

/// Issue 47 attack finding 4: a sequence names a message only within one stream incarnation.
/// A record of another incarnation (or stream) with a signed sequence and the signed digest
/// does not stand in for the signed record: the signed one is MISSING, the other uncovered.
#[test]
fn a_record_is_matched_by_stream_incarnation_and_sequence_not_sequence_alone() {
    let s = signer();
    let (cps, mut recs) = chain(&s, 2);
    let Ok(signed) = recs[2].read.clone() else {
        panic!("a read record")
    };
    for (stream, incarnation) in [("ORDERS", "20270101T000000Z"), ("OTHER", INCARNATION)] {
        recs[2].read = Ok(RecordRead {
            stream: stream.into(),
            incarnation: incarnation.into(),
            ..signed.clone()
        });
        let r = audit(&recs, &cps, &trusted(&s));
        assert_eq!((r.missing.clone(), r.uncovered.clone()), (vec![3], vec![3]));
        assert_eq!(r.intact, 3);
        let lines: Vec<&str> = r.findings.iter().map(|f| f.line.as_str()).collect();
        assert!(
            lines.contains(
                &"sequence 3: MISSING (signed in checkpoint 1 of runner r1 for stream ORDERS \
                  incarnation 20260101T000000Z, no record)"
            ),
            "{lines:?}"
        );
        assert!(
            lines.contains(&&*format!(
                "sequence 3 (r3, stream {stream} incarnation {incarnation}): present, in no \
                 checkpoint yet"
            )),
            "{lines:?}"
        );
    }
}

/// A stream created again: the runner's chain goes on (still linked, so the held head keeps
/// the earlier incarnation's checkpoints), each incarnation's records match their own
/// checkpoints, and the change is a note, not a failure.
#[test]
fn a_chain_going_on_into_a_new_incarnation_is_noted_and_complete() {
    let s = signer();
    let (cps, recs) = chain_in(&s, 3, |i| {
        if i < 2 {
            INCARNATION
        } else {
            "20260202T000000Z"
        }
    });
    let r = audit(&recs, &cps, &trusted(&s));
    assert!(r.complete(), "{:?}", r.findings);
    assert_eq!(r.intact, 6);
    let notes: Vec<&Finding> = r.findings.iter().filter(|f| !f.failed).collect();
    assert_eq!(notes.len(), 1, "{:?}", r.findings);
    assert!(
        notes[0].line.contains(
            "checkpoint 2 (cp2) is of stream ORDERS incarnation 20260202T000000Z, the one \
             before it of stream ORDERS incarnation 20260101T000000Z"
        ),
        "{}",
        notes[0].line
    );
}

/// A checkpoint of the first (unreleased) format, signed without `stream` and
/// `stream_incarnation`, is refused with the reason, not read as covering any stream.
#[test]
fn a_checkpoint_without_stream_and_incarnation_is_refused() {
    let s = signer();
    let body = r#"{"count":0,"created_at":"2026-01-01T00:00:00Z","first_sequence":0,"gaps":[],"index":0,"key_id":"cp1","last_sequence":0,"previous":"","root":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","runner_id":"r1","schema":"svc.custody.checkpoint.v1","sink":"file"}"#;
    let sig = base64::engine::general_purpose::STANDARD.encode(s.sign(body.as_bytes()));
    let text = serde_json::json!({
        "leaves": [], "schema": CHECKPOINT_SCHEMA, "signature": sig, "signed": body
    })
    .to_string();
    let e = verify(&text, &trusted(&s)).unwrap_err();
    assert_eq!(e, Refused::Malformed(NO_STREAM.into()));
    assert!(
        e.to_string().contains("no stream or stream_incarnation"),
        "{e}"
    );
}
