//! atk52c: attacks on the drained head (issue 47, e9c00d8): `svc spool drain` records the last
//! checkpoint it put into the target in `drained-head-<sha256 of the runner id>`, and a spool
//! sink's start while the target's checkpoint store cannot be read checks the spool's chain
//! against it. The `fixed_...` tests failed on e9c00d8 (a hole; each says what it
//! expected); the `fixed_...` ones pass since the start refuses a spool chain that does not
//! begin at checkpoint 0 when no drained head is recorded, and a spool that may keep frames in
//! clear has none it can vouch for. `held_...` tests pass.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::atk50b::{edge, only_segment, out, spool_cmd, wait_until_either};
use crate::custody_checkpoints::{case_with, publish_range, records_in, wait_acked, Case};
use crate::support::protection::*;

fn drained_heads(c: &Case) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(c.dir.path().join("spool"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("drained-head-")
        })
        .collect();
    v.sort();
    v
}

/// The target's checkpoint store out of reach (a plain file at its directory's name).
fn target_unreadable(c: &Case) {
    let store = out(c).join(".svc-checkpoints");
    let aside = c.dir.path().join("checkpoints-aside");
    if store.exists() {
        std::fs::rename(&store, &aside).unwrap();
    } else {
        std::fs::create_dir(&aside).unwrap(); // no checkpoint put yet
    }
    std::fs::write(&store, b"not a directory").unwrap();
}

fn write_0600(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Stops a runner that started (true) and returns its log.
fn stop(runner: &mut crate::support::process::Runner, started: bool) -> String {
    if started {
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(30));
    }
    runner.log_text()
}

/// (start, end, text) of each CHECKPOINT frame in clear (`0x43`) of a segment.
fn clear_checkpoints(data: &[u8]) -> Vec<(usize, usize, String)> {
    let (mut at, mut out) = (8, Vec::new());
    while at + 12 <= data.len() {
        let len = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap()) as usize;
        let body = &data[at + 12..at + 12 + len];
        if body[0] == 0x43 {
            let skip = 1 + 8 + 1 + body[9] as usize + 8;
            let text = String::from_utf8(body[skip..].to_vec()).unwrap();
            out.push((at, at + 12 + len, text));
        }
        at += 12 + len;
    }
    out
}

/// A spool sink kept in clear (`allow_unencrypted`) into a file target, a checkpoint every 3.
fn clear_edge() -> Case {
    case_with(
        3,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "spool", "dir": dir.join("spool"), "max_bytes": 64 << 20,
                   "allow_unencrypted": true,
                   "target": {"type": "file", "directory": dir.join("out")}})
        },
        json!({}),
    )
}

/// FIXED (a spool that may keep frames in clear has no drained head the start vouches for).
/// Found: class 4, another account in the spool's directory; severity low-medium: a spool in
/// clear, `allow_unencrypted`; docs/spool.md and src/sink/spool/drained.rs say a drained head
/// "planted by someone who could write the spool's directory proves nothing"). 9 records,
/// checkpoints 0, 1, 2 in clear frames. Someone who can write the directory copies checkpoint
/// 1's signed text out of its frame and flips one byte in that frame: `svc spool drain` puts 0,
/// quarantines 1 and stops at 2 (atk51b finding 2's hole); the drained head it records is 0.
/// The attacker replaces it with checkpoint 1's genuine text (it verifies, it is this
/// runner's). A start while the target cannot be read then finds the spool's chain (2) "right
/// after" the drained head and the head file (2) in it: the runner starts, appending behind
/// the hole the drain stays stopped at; checkpoint 1 is in neither the target nor the spool.
/// Expected: refused as with the genuine drained head ("begins at checkpoint 2, but the drain
/// put checkpoint 0 into the target last"); a drained head must prove it was put (e.g. bound
/// by the spool's key, or its index checked against a record the attacker cannot forge).
#[test]
fn fixed_a_genuine_undrained_checkpoint_planted_as_drained_head_hides_the_hole() {
    let c = clear_edge();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 9);
    wait_acked(&c.server, 9);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let seg = only_segment(&c);
    let mut data = std::fs::read(&seg).unwrap();
    let cps = clear_checkpoints(&data);
    assert_eq!(cps.len(), 3);
    let one = cps[1].2.clone();
    data[(cps[1].0 + cps[1].1) / 2] ^= 0x01;
    std::fs::write(&seg, &data).unwrap();
    let (code, drained) = spool_cmd(&c, "drain");
    assert_eq!(code, 1, "{drained}");
    assert_eq!(records_in(&out(&c)), 9, "{drained}");
    let heads = drained_heads(&c);
    assert_eq!(heads.len(), 1, "{drained}");
    // The genuine drained head (checkpoint 0) refuses, as custody_drained_head shows; planted:
    write_0600(&heads[0], one.as_bytes());
    target_unreadable(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(
        !started,
        "the runner STARTED with checkpoint 1 in neither the target nor the spool (the drained \
         head replaced by checkpoint 1's genuine text, copied from its frame before the frame \
         was damaged); expected a refusal naming the hole. Log:\n{log}"
    );
}

/// HELD (class 4, a stale genuine drained head replayed; class 3/6 a FIFO or a directory at
/// its name). Checkpoint 0 drained (its drained head copied), then checkpoints 1..3 drained:
/// the spool holds none, the drained head is 3, the head file 3. With the target unreadable:
/// the stale drained head 0 planted back is refused (`is TRUNCATED`); a FIFO at the name is
/// refused at once (no hang); a directory at the name is refused; the genuine one (3) starts.
#[test]
fn held_a_stale_drained_head_replayed_or_a_fifo_at_its_name_is_refused() {
    let c = edge(3);
    let run = |from, to, log: &str| {
        let mut runner = start_runner(&c.cfg, &c.dir.path().join(log));
        publish_range(&c.server, from, to);
        wait_acked(&c.server, to);
        runner.signal("TERM");
        assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    };
    run(1, 3, "svc1.log");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    let heads = drained_heads(&c);
    assert_eq!(heads.len(), 1, "{text}");
    let stale = std::fs::read(&heads[0]).unwrap();
    run(4, 12, "svc2.log");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    let genuine = std::fs::read(&heads[0]).unwrap();
    assert_ne!(stale, genuine);
    target_unreadable(&c);

    write_0600(&heads[0], &stale);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc3.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(!started && log.contains("is TRUNCATED"), "stale: {log}");

    std::fs::remove_file(&heads[0]).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&heads[0])
        .status()
        .unwrap();
    assert!(made.success());
    let t = std::time::Instant::now();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc4.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(
        !started && log.contains("not a regular file"),
        "fifo: {log}"
    );
    eprintln!("fifo: refused in {:?}", t.elapsed());

    std::fs::remove_file(&heads[0]).unwrap();
    std::fs::create_dir(&heads[0]).unwrap();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc5.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(!started && log.contains("not a regular file"), "dir: {log}");

    std::fs::remove_dir(&heads[0]).unwrap();
    write_0600(&heads[0], &genuine);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc6.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(started, "genuine: {log}");
}

/// HELD (class 1/2: the drained head's write fails after the put, the state a kill -9 or a
/// full disk between the put and the record leaves). Checkpoint 0 drained; a directory put at
/// the drained head's name makes the next record fail: the drain puts checkpoint 1 into the
/// target, exits 1 naming `drain stuck` and keeps the frame. Put back to what a crash leaves
/// (the old drained head, 0), a start while the target cannot be read accepts the spool's
/// chain (1, right after 0) and goes on; with the target back the drain finds checkpoint 1
/// stored, records it, and exits 0 with every record delivered.
#[test]
fn held_a_drained_head_that_cannot_be_written_keeps_the_frame_and_the_start_goes_on() {
    let c = edge(3);
    let run = |from, to, log: &str| {
        let mut runner = start_runner(&c.cfg, &c.dir.path().join(log));
        publish_range(&c.server, from, to);
        wait_acked(&c.server, to);
        runner.signal("TERM");
        assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    };
    run(1, 3, "svc1.log");
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    let heads = drained_heads(&c);
    assert_eq!(heads.len(), 1, "{text}");
    let zero = std::fs::read(&heads[0]).unwrap();
    run(4, 6, "svc2.log");
    std::fs::remove_file(&heads[0]).unwrap();
    std::fs::create_dir(&heads[0]).unwrap();
    std::fs::write(heads[0].join("x"), b"x").unwrap();
    let t = std::time::Instant::now();
    let (code, text) = spool_cmd(&c, "drain");
    eprintln!("stuck drain: exit {code} in {:?}: {text}", t.elapsed());
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("drain stuck"), "{text}");
    assert_eq!(records_in(&out(&c)), 6, "{text}");
    std::fs::remove_dir_all(&heads[0]).unwrap();
    write_0600(&heads[0], &zero);
    let store = out(&c).join(".svc-checkpoints");
    let aside = c.dir.path().join("checkpoints-aside");
    target_unreadable(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc3.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(started, "{log}");
    std::fs::remove_file(&store).unwrap();
    std::fs::rename(&aside, &store).unwrap();
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert_ne!(std::fs::read(&heads[0]).unwrap(), zero, "{text}");
    assert_eq!(records_in(&out(&c)), 6, "{text}");
}

/// FOUND (class 4, severity low: docs/spool.md "Restart" names it as a limit, but it is the
/// same hole as the planted head above with nothing to copy, for the usual ENCRYPTED spool).
/// Checkpoint 1's sealed frame damaged: the drain puts 0, quarantines 1, stops at 2, records
/// drained head 0. Someone who can write the spool's directory removes that one file; a start
/// while the target cannot be read takes the spool for one "drained by an older version",
/// checks its chain (2) alone against the head file (2) and starts (a warning its only trace),
/// appending behind the hole. Expected: a spool that has recorded drained heads (the drain
/// could say so in a place bound by the spool's key, e.g. its meta file or a sealed frame)
/// refuses a start whose drained head went missing, as it refuses the genuine one ("begins at
/// checkpoint 2, but the drain put checkpoint 0 into the target last").
#[test]
fn fixed_a_removed_drained_head_hides_the_hole_of_an_encrypted_spool() {
    let c = crate::atk50b::damaged_checkpoint_1();
    let (code, drained) = spool_cmd(&c, "drain");
    assert_eq!(code, 1, "{drained}");
    let heads = drained_heads(&c);
    assert_eq!(heads.len(), 1, "{drained}");
    std::fs::remove_file(&heads[0]).unwrap();
    target_unreadable(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(
        !started,
        "the runner STARTED with checkpoint 1 in neither the target nor the spool (its drained \
         head file removed); expected a refusal naming the hole. Log:\n{log}"
    );
}

/// FOUND (class 3, one damaged byte, no attacker; severity medium: atk51b finding 2's hole,
/// which e9c00d8 closes only after a first checkpoint was put). 9 records, sealed checkpoint
/// frames 0, 1, 2; one byte flipped in checkpoint 0's frame. `svc spool drain` delivers records
/// 1..6, quarantines 0 and stops at 1 (it does not follow the target's empty chain): no
/// checkpoint was ever put, so no drained head is recorded. A start while the target cannot be
/// read takes the spool for one "drained by an older version", checks its chain (1, 2) alone
/// against the head file (2) and starts, appending behind the hole the drain stays stopped at;
/// checkpoint 0 is in neither the target nor the spool. Expected: refused as for a hole after
/// a drained head (the drain could record that it quarantined or stopped at a checkpoint
/// frame, or a spool whose chain begins after 0 without a drained head is refused unless the
/// spool predates drained heads).
#[test]
fn fixed_a_damaged_first_checkpoint_leaves_no_drained_head_and_the_start_hides_the_hole() {
    let c = edge(3);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 9);
    wait_acked(&c.server, 9);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let seg = only_segment(&c);
    let mut data = std::fs::read(&seg).unwrap();
    let cps = crate::atk50b::sealed_checkpoint_frames(&data);
    // A checkpoint every 3 records, cut where the batches fall: 2 or more frames.
    assert!(cps.len() >= 2, "{} checkpoint frames", cps.len());
    data[(cps[0].0 + cps[0].1) / 2] ^= 0x01;
    std::fs::write(&seg, &data).unwrap();
    let (code, drained) = spool_cmd(&c, "drain");
    assert_eq!(code, 1, "{drained}");
    // The records before checkpoint 1 delivered, the rest wait behind it (the drain stops).
    assert!(records_in(&out(&c)) >= 3, "{drained}");
    let heads = drained_heads(&c).len();
    target_unreadable(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(
        !started,
        "the runner STARTED with checkpoint 0 in neither the target nor the spool (its frame \
         damaged and quarantined by the drain, {heads} drained-head files); expected a refusal \
         naming the hole. Drain: {drained}\nLog:\n{log}"
    );
}

/// FOUND (class 3, the same root as the test above, before any drain: an edge site whose
/// spool was never drained). One byte flipped in checkpoint 0's sealed frame; the target's
/// store cannot be read (it never held a checkpoint). The start reads the spool's chain as 1,
/// 2 (the damaged frame unread), finds no drained head, checks 1, 2 alone against the head
/// file and starts. Expected: refused (a spool never drained holds the chain from checkpoint
/// 0, so a chain beginning at 1 there has a hole).
#[test]
fn fixed_a_damaged_first_checkpoint_of_a_never_drained_spool_is_not_seen_at_the_start() {
    let c = edge(3);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 9);
    wait_acked(&c.server, 9);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let seg = only_segment(&c);
    let mut data = std::fs::read(&seg).unwrap();
    let cps = crate::atk50b::sealed_checkpoint_frames(&data);
    // A checkpoint every 3 records, cut where the batches fall: 2 or more frames.
    assert!(cps.len() >= 2, "{} checkpoint frames", cps.len());
    data[(cps[0].0 + cps[0].1) / 2] ^= 0x01;
    std::fs::write(&seg, &data).unwrap();
    target_unreadable(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    let started = wait_until_either(&mut runner);
    let log = stop(&mut runner, started);
    assert!(
        !started,
        "the runner STARTED with checkpoint 0's frame damaged in a spool never drained; \
         expected a refusal naming the hole. Log:\n{log}"
    );
}
