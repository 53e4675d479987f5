//! atk51c's reproductions of the holes it found in the dead-letter gap rescan (ffdd9bd) and
//! the drain's signature check (18829a5): each FAILED on main 57328f8 as its doc comment says
//! ("seen"), and passes since the fixes (the read-back stops by the broker's store time, skips
//! a message too large to be a dead letter, lists only the stream's current incarnation and no
//! sequence the chain signed as a record; a frame that does not verify under a key the drain
//! trusts stops the drain, kept, never quarantined).

use std::time::Duration;

use crate::atk51c::*;
use crate::custody_checkpoints::*;
use crate::support::protection::*;
use crate::support::wait_until;
use serde_json::{json, Value};

/// FIXED, finding 1 (class 7/12, medium). One record on the DLQ subject with an old `failed_at`
/// (any publisher allowed there, or another runner whose clock is more than the hour's margin
/// behind), stored after the runner's own dead letter, ends the read-back (`Take::Older` is
/// decided before whose record it is): the gap a kill -9 left unsigned is not listed again,
/// exactly the hole ffdd9bd closed (atk50a finding 4). Expected: gaps [[4,
/// refused_before_sink]]; seen: [] ("1 messages of dead-letter stream DLQ read back, 0 of this
/// runner").
#[test]
fn an_old_failed_at_of_another_runner_hides_the_runners_gap() {
    gap_after_a_kill_9_with(&["svc.dlq.orders"], |c, inc| {
        plant(
            c,
            &dead_letter("runner-other", inc, 77, "2000-01-01T00:00:00Z"),
        );
    });
}

/// FIXED, finding 4 (class 8/11, medium). The DLQ stream also captures another subject (allowed: the
/// runner only takes records under `dead_letter.subject`), and a message of 300 KiB there,
/// stored after the runner's dead letter, makes the whole read-back fail ("the answer is
/// larger than 256 KiB" is an error for the stream, not a message skipped): the gap is not
/// listed. The same for such a message on the DLQ subject itself. Expected: gaps [[4,
/// refused_before_sink]]; seen: [].
#[test]
fn one_large_message_in_the_dlq_stream_hides_the_runners_gap() {
    gap_after_a_kill_9_with(&["svc.dlq.orders", "audit.big"], |c, _| {
        let big = vec![b'x'; 300 * 1024];
        c.server.publish_with_headers("audit.big", &[], &big);
        wait_until(Duration::from_secs(10), "the large message stored", || {
            c.server.stream_messages("DLQ") == 2
        });
    });
}

/// A runner-caused gap (4, refused before the sink) not yet signed when its dead letter was
/// stored and the runner was killed (-9) at once, `after` run before the restart: the gap
/// must be listed, once. Since sign first, settle last (the message is acknowledged only once
/// a checkpoint lists its gap) nothing is read back at the start: the message is delivered
/// again, its dead letter deduplicated by the stream, its gap signed, then it is acknowledged.
fn gap_after_a_kill_9_with(dlq_subjects: &[&str], after: impl FnOnce(&Case, &str)) {
    let c = dlq_case_on(dlq_subjects);
    run_once(&c, "svc.log", (1, 3));
    let inc = c.server.incarnation(STREAM);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    publish_big(&c);
    publish_range(&c.server, 5, 5);
    wait_until(Duration::from_secs(60), "4's dead letter stored", || {
        c.server.stream_messages("DLQ") == 1
    });
    runner.sigkill();
    after(&c, &inc);
    run_once(&c, "svc3.log", (6, 6));
    let listed: Vec<Value> = gaps(&out(&c)).into_iter().map(|g| g.1).collect();
    let log = std::fs::read_to_string(c.dir.path().join("svc3.log")).unwrap();
    assert_eq!(
        listed,
        vec![json!([4, "refused_before_sink"])],
        "the restart's log: {log}"
    );
}

/// FIXED, finding 2 (class 7/12, medium). A record planted on the DLQ subject naming this runner id
/// (it is in every checkpoint), its stream, its durable and a sequence the chain signed as a
/// stored record: at its next start the runner signs that sequence as a runner-caused gap
/// (`dead_lettered`) as well; a second planted record with a made-up incarnation makes it
/// sign a checkpoint of an incarnation the stream never had (each distinct one a checkpoint
/// of its own, up to 100,000 per start). `svc verify-custody` says COMPLETE with the
/// contradiction unmentioned. Expected: no gap (the runner dead-lettered nothing) and every
/// checkpoint of the real incarnation; seen: gaps [2] and [9 of "made-up-incarnation"].
#[test]
fn a_planted_dead_letter_makes_the_runner_sign_a_stored_record_as_a_gap() {
    let c = dlq_case();
    run_once(&c, "svc.log", (1, 3));
    let inc = c.server.incarnation(STREAM);
    plant(&c, &dead_letter("runner-cp-1", &inc, 2, &rfc3339_now()));
    let made_up = "made-up-incarnation";
    plant(&c, &dead_letter("runner-cp-1", made_up, 9, &rfc3339_now()));
    run_once(&c, "svc2.log", (4, 4));
    let signed = gaps(&out(&c));
    let incs: Vec<String> = bodies(&out(&c))
        .iter()
        .map(|b| b["stream_incarnation"].as_str().unwrap().to_string())
        .collect();
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert!(
        signed.is_empty() && incs.iter().all(|i| *i == inc),
        "gaps signed: {signed:?}\ncheckpoint incarnations: {incs:?}\n\
         verify-custody (exit {code}): {text}"
    );
}

/// FIXED, finding 3 (class 11, high). `svc spool drain --public-key cp1=WRONG.pub` (the right key id,
/// another key's file: an operator's slip, or a key file replaced under the same id) quarantines
/// every genuine checkpoint frame as "FORGED (the signature does not verify)" and drains past
/// them, exit 0; the target never gets them (a frame under an unknown key id stops the drain
/// instead, which is safe). The same for a spool in clear and a sealed (encrypted) one.
/// Expected: the drain stops (or keeps the frames) and, after a drain with the right key, the
/// target holds both checkpoints and the audit is COMPLETE; seen: 2 frames quarantined, 0
/// checkpoints in the target, the audit NOT complete (6 records in no checkpoint), and the
/// runner's next start refuses for good ("the sink's chain of runner runner-cp-1 is
/// TRUNCATED: it ends before checkpoint 0 but the head file ... holds checkpoint 1") until
/// someone puts the quarantined frames back by hand. `--public-key FILE` without `ID=` is
/// taken under the configuration's own key id, so giving another runner's key that way does
/// the same.
#[test]
fn a_wrong_public_key_file_quarantines_every_genuine_checkpoint_frame() {
    wrong_key_drain(|dir| {
        json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
               "allow_unencrypted": true,
               "target": {"type": "file", "directory": dir.join("out")}})
    });
}

/// Finding 3, a sealed spool (the default: `encryption` set).
#[test]
fn a_wrong_public_key_file_quarantines_every_sealed_checkpoint_frame() {
    wrong_key_drain(|dir| {
        let key = write_private(dir, "spool.key", &[7u8; 32]);
        json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
               "encryption": {"key_id": "k1", "key_file": key},
               "target": {"type": "file", "directory": dir.join("out")}})
    });
}

fn wrong_key_drain(spool: impl FnOnce(&std::path::Path) -> Value) {
    let c = case_with(
        3,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            spool(dir)
        },
        json!({}),
    );
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 6);
    wait_acked(&c.server, 6);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let wrong = c.dir.path().join("wrong.pub");
    std::fs::write(&wrong, public_key_b64(&[0x55; 32])).unwrap();
    let cfg = c.cfg.to_str().unwrap();
    let arg = format!("cp1={}", wrong.display());
    let first = svc_guarded(&["spool", "drain", cfg, "--public-key", &arg]).unwrap();
    let right = c.public.to_str().unwrap();
    let second = svc_guarded(&["spool", "drain", cfg, "--public-key", right]).unwrap();
    let quarantined = std::fs::read_dir(c.dir.path().join("spool"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("quarantine-")
        })
        .count();
    let stored = std::fs::read_dir(out(&c).join(".svc-checkpoints"))
        .map(|d| d.count())
        .unwrap_or(0);
    let (vcode, verdict) = verify(&c, &[right]);
    assert!(
        stored == 2 && vcode == 0,
        "drain with the wrong key: {first:?}\ndrain with the right key: {second:?}\n\
         quarantine files: {quarantined}, checkpoints in the target: {stored}\n\
         verify-custody (exit {vcode}): {verdict}"
    );
}
