//! The drained head (h52f2, issue 47): `svc spool drain` records in the spool directory the
//! last custody checkpoint it put into the target for each runner id (`drained-head-<sha256 of
//! the runner id>`, the signed text), and a spool sink's runner that starts while the target's
//! checkpoint store cannot be read checks the spool's part of the chain against it. End to
//! end with a real broker, runner, encrypted spool and file target; the target is made
//! unreadable by replacing its `.svc-checkpoints` directory with a plain file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::atk50b::{edge, out, spool_cmd, wait_until_either};
use crate::custody_checkpoints::{publish_range, records_in, verify, wait_acked, Case};
use crate::support::protection::*;

/// The drained-head files in the case's spool.
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

/// Takes the target's checkpoint store out of reach (a plain file at its directory's name);
/// returns the put-back action's paths.
fn target_unreadable(c: &Case) -> (PathBuf, PathBuf) {
    let store = out(c).join(".svc-checkpoints");
    let aside = c.dir.path().join("checkpoints-aside");
    std::fs::rename(&store, &aside).unwrap();
    std::fs::write(&store, b"not a directory").unwrap();
    (store, aside)
}

fn target_back((store, aside): &(PathBuf, PathBuf)) {
    std::fs::remove_file(store).unwrap();
    std::fs::rename(aside, store).unwrap();
}

fn write_0600(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// FIXED (atk51b finding 2, the start's half; failed before h52f2: the runner bound its
/// consumer and appended behind the frame the drain stays stopped at). Checkpoint 1's frame
/// damaged: the drain puts checkpoint 0 into the target, quarantines 1 and stops at 2. A start
/// while the target cannot be read used to check the spool's part alone (2.. links and
/// reaches the head file) and went on, the hole hidden until the target was read again. Now
/// the spool's chain must hold or follow the drained head (checkpoint 0): refused, naming the
/// hole and the file; with the target back, the whole-chain check refuses it too.
#[test]
fn a_start_with_the_target_unreadable_refuses_a_spool_chain_with_a_hole() {
    let c = crate::atk50b::damaged_checkpoint_1();
    let (code, drained) = spool_cmd(&c, "drain");
    assert_eq!(code, 1, "{drained}");
    assert!(
        drained.contains("does not follow the target's chain"),
        "{drained}"
    );
    assert_eq!(records_in(&out(&c)), 9, "{drained}");
    let moved = target_unreadable(&c);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    let started = wait_until_either(&mut runner);
    if started {
        runner.signal("TERM");
        runner.wait_timeout(Duration::from_secs(30));
    }
    let log = runner.log_text();
    assert!(!started, "{log}");
    assert_eq!(drained_heads(&c).len(), 1, "{drained}");
    assert!(
        log.contains("begins at checkpoint 2, but the drain put checkpoint 0 into the target last")
            && log.contains("checkpoint 1 is in neither")
            && log.contains("drained-head-"),
        "{log}"
    );
    target_back(&moved);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc3.log"));
    assert!(!wait_until_either(&mut runner), "{}", runner.log_text());
    assert!(runner.log_text().contains("is broken at checkpoint 2"));
}

/// FIXED (the availability trade-off of atk51b finding 2's fix; failed before h52f2 with
/// "start again once the target can be read"): an edge site without its downstream, its spool
/// fully drained (no checkpoint frame left) beside a head file, starts: the drained head is
/// the head file's head, so the chain goes on from it. A drained head that does not verify
/// under the runner's key (planted) or is another runner's is refused, naming the file; an
/// older spool without the file stops as before. With the target back the drain puts the new
/// checkpoints after the old ones and the audit is COMPLETE.
#[test]
fn a_drained_spool_starts_from_its_drained_head_while_the_target_cannot_be_read() {
    let c = edge(3);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 3);
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    let heads = drained_heads(&c);
    assert_eq!(heads.len(), 1, "{text}");
    let genuine = std::fs::read(&heads[0]).unwrap();
    let moved = target_unreadable(&c);

    // Planted: the signed text changed (the signature no longer verifies).
    let planted = String::from_utf8(genuine.clone()).unwrap().replacen(
        "\\\"count\\\":",
        "\\\"count\\\": ",
        1,
    );
    assert_ne!(planted.as_bytes(), &genuine[..]);
    write_0600(&heads[0], planted.as_bytes());
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    assert!(!wait_until_either(&mut runner), "{}", runner.log_text());
    let log = runner.log_text();
    let name = heads[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        log.contains("drained head") && log.contains(&name) && log.contains("does not verify"),
        "{log}"
    );

    // An older spool (no drained head): the start stops as before.
    std::fs::remove_file(&heads[0]).unwrap();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc3.log"));
    assert!(!wait_until_either(&mut runner), "{}", runner.log_text());
    assert!(
        runner
            .log_text()
            .contains("start again once the target can be read"),
        "{}",
        runner.log_text()
    );

    // The genuine drained head: the start goes on from it.
    write_0600(&heads[0], &genuine);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc4.log"));
    assert!(wait_until_either(&mut runner), "{}", runner.log_text());
    publish_range(&c.server, 4, 6);
    wait_acked(&c.server, 6);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    target_back(&moved);
    let (code, text) = spool_cmd(&c, "drain");
    assert_eq!(code, 0, "{text}");
    assert_eq!(records_in(&out(&c)), 6);
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert!(code == 0 && text.ends_with("COMPLETE\n"), "{text}");
}
