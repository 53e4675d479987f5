//! Attack atk46f on the newest hardening of `svc dlq redrive` and `svc replay` (issue 46, fifth
//! look). Each test here reproduces a finding: it fails on the code as attacked and passes once
//! the finding is fixed.
//!
//! Tried and held (no test kept): a sealed dead-letter stream (`sealed: true` by a stream
//! update) is refused as `deny_delete` is, since nats-server reports a sealed stream with
//! `deny_delete` set (2.9.10: "dead-letter stream DLQ has deny_delete set", nothing stored).

use std::path::Path;
use std::time::Duration;

use crate::support::process::*;
use crate::support::*;

use super::atk46e::{big_messages, config, records};

/// FINDING 1 (medium, class 4; skips messages): atk46e's finding 6 was fixed by checking the
/// state file's own directory (`StateFile::check_directory`, state.rs: owner and mode of
/// `path.parent()` only). An ancestor that other accounts may write (no sticky bit) lets them
/// rename the whole state directory, which they need no right over: the finished state of a
/// replay goes aside with its directory (`own` -> `.kept`), the same replay is run again in
/// the directory the operator makes again and stopped half-way, and the old directory is put
/// back (`own` -> `.new`, `.kept` -> `own`). `--resume` reads "done", passes every check (the
/// directory is the service's, 0700) and exits 0: the rest of the range is never delivered. A
/// symbolic link owned by another account anywhere on the path does the same (`stat` follows
/// it; the check and each later use resolve the path again). 21 of 60 messages delivered,
/// exit 0, on the code as attacked. Fixed on branch atk46f: every directory on the path, as
/// written and as resolved, must be the service's or root's and not writable by others unless
/// sticky, and every symbolic link on the way the service's or root's
/// (`StateFile::check_directory` / `check_on_path`; unit test
/// `a_path_other_accounts_can_change_is_refused`).
#[test]
fn a_state_directory_renamed_through_a_shared_ancestor_does_not_end_a_resumed_replay() {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    // A shared directory: others may write it, no sticky bit. The state directory in it is
    // the service's own, 0700.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let own = shared.join("own");
    let mkdir = |p: &Path| {
        std::fs::DirBuilder::new().mode(0o700).create(p).unwrap();
    };
    mkdir(&own);
    let state = own.join("replay-state");
    let server = big_messages(60);
    let out = dir.path().join("out");
    let cfg = write_config(dir.path(), "svc.json", &config(&server.url(), &out));
    let cfg = cfg.to_str().unwrap();
    let state_arg = state.to_str().unwrap();
    let (code, stdout, err) = svc(&["replay", cfg, "--state", state_arg]);
    if code != 0 {
        assert!(
            err.contains(&shared.display().to_string()),
            "refused, naming the shared directory\n{stdout}{err}"
        );
        return;
    }
    assert_eq!(records(&out).len(), 60);
    // The other account: the state directory goes aside (a rename in the shared directory).
    std::fs::rename(&own, shared.join(".kept")).unwrap();
    // The sink is restored from a backup that lacks these messages; the operator makes the
    // state directory again and runs the same replay, stopped by a signal half-way.
    std::fs::remove_dir_all(&out).unwrap();
    mkdir(&own);
    let mut child = Runner::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).args([
            "replay",
            cfg,
            "--state",
            state_arg,
            "--max-rate",
            "40",
        ]),
        &dir.path().join("replay.log"),
    );
    wait_until(Duration::from_secs(30), "20 replayed", || {
        records(&out).len() >= 20
    });
    child.signal("INT");
    child.wait_timeout(Duration::from_secs(20)).unwrap();
    let stopped = records(&out).len();
    assert!(stopped < 60, "{}", child.log_text());
    // The other account puts the old directory back.
    std::fs::rename(&own, shared.join(".new")).unwrap();
    std::fs::rename(shared.join(".kept"), &own).unwrap();
    let (code, stdout, err) = svc(&["replay", cfg, "--state", state_arg, "--resume"]);
    let got = records(&out).len();
    assert!(
        code != 0 || got == 60,
        "--resume over a state directory put back through a shared ancestor: exit {code}, \
         {got} of 60 messages in the sink ({stopped} before the stop): the rest was never \
         replayed\n{stdout}{err}"
    );
}
