//! Attack review atk50a: `files::owner::changeable_by_others` (the replay state's and the
//! `--sink` file's directory check) with a second real account (`svc-attacker`), and the
//! custody checkpoints' runner-caused gaps told by `svc-ack`. Each test states what it did and
//! what it saw; the ones here pass (the boundary held). Reproductions of what did not hold are
//! kept outside the tree (RULES.md) and listed in the review's report.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use svc::files::owner::changeable_by_others;
use svc::pipeline::replay::state::StateFile;

use crate::support::accounts::{attacker_does, attacker_uid};
use crate::support::TempDir;

fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

fn dir_in(base: &Path, name: &str, m: u32) -> PathBuf {
    let d = base.join(name);
    std::fs::create_dir(&d).unwrap();
    mode(&d, m);
    d
}

fn give_to_attacker(p: &Path) {
    let uid = rustix::fs::Uid::from_raw(attacker_uid());
    rustix::fs::chownat(
        rustix::fs::CWD,
        p,
        Some(uid),
        None,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

/// A base directory the attacker can traverse (the test's temp directory is 0700).
fn base(tag: &str) -> TempDir {
    let t = TempDir::new(tag);
    mode(t.path(), 0o755);
    t
}

fn refused(dir: &Path, what: &str) -> String {
    changeable_by_others(dir).unwrap_or_else(|| panic!("{what}: {} not refused", dir.display()))
}

/// Held. A directory of another account in a sticky world-writable directory (as one in
/// /tmp): refused (its owner can rename what the service keeps there), named with its owner.
#[test]
fn another_accounts_directory_in_a_sticky_directory_is_refused() {
    let t = base("atk50a-sticky");
    let tmp = dir_in(t.path(), "tmp", 0o1777);
    let theirs = dir_in(&tmp, "theirs", 0o755);
    give_to_attacker(&theirs);
    let own = dir_in(&theirs, "own", 0o700);
    let e = refused(&own, "another account's directory");
    assert!(
        e.contains(&format!("owned by uid {}", attacker_uid())),
        "{e}"
    );
    // Ours in the sticky directory holds.
    let ours = dir_in(&tmp, "ours", 0o700);
    assert_eq!(changeable_by_others(&ours), None);
}

/// Held. An ancestor writable by its group (whatever the group: here the service's own, 0) is
/// refused; so is a directory another account made writable through an access ACL (the ACL's
/// mask shows in the group bits).
#[test]
fn group_writable_ancestors_and_acl_grants_are_refused() {
    let t = base("atk50a-group");
    let shared = dir_in(t.path(), "shared", 0o775);
    let own = dir_in(&shared, "own", 0o700);
    assert!(refused(&own, "group-writable ancestor").contains("(mode 0775)"));
    mode(&shared, 0o755);
    assert_eq!(changeable_by_others(&own), None);
    // system.posix_acl_access: version 2; USER_OBJ rwx, USER(attacker) rwx, GROUP_OBJ r-x,
    // MASK rwx, OTHER r-x.
    let mut acl = 2u32.to_le_bytes().to_vec();
    let uid = attacker_uid();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 7, uid),
        (0x04, 5, u32::MAX),
        (0x10, 7, u32::MAX),
        (0x20, 5, u32::MAX),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    match rustix::fs::setxattr(
        &shared,
        "system.posix_acl_access",
        &acl,
        rustix::fs::XattrFlags::empty(),
    ) {
        Ok(()) => {
            attacker_does(0, &format!("mkdir {}/planted", shared.display()));
            let e = refused(&own, "ACL grant to another account");
            assert!(e.contains("can be written by other accounts"), "{e}");
        }
        // A file system without ACLs: nothing to grant.
        Err(rustix::io::Errno::OPNOTSUPP) => {}
        Err(e) => panic!("setxattr: {e}"),
    }
}

/// Held. `..` after a link of another account, a link loop, a path longer than PATH_MAX and
/// a non-UTF-8 directory name of another account: each refused with a reason, none followed
/// into a directory whose check was skipped.
#[test]
fn dot_dot_loops_long_and_non_utf8_paths_are_refused() {
    use std::os::unix::ffi::OsStrExt;
    let t = base("atk50a-paths");
    let safe = dir_in(t.path(), "safe", 0o755);
    let theirs = dir_in(t.path(), "theirs", 0o755);
    let link = t.path().join("their-link");
    std::os::unix::fs::symlink(&theirs, &link).unwrap();
    give_to_attacker(&link);
    // their-link/../safe resolves to safe, but the attacker can point the link elsewhere.
    let through = link.join("..").join("safe");
    assert!(refused(&through, "..").contains("owned by uid"));
    let a = t.path().join("loop-a");
    std::os::unix::fs::symlink(t.path().join("loop-b"), &a).unwrap();
    std::os::unix::fs::symlink(&a, t.path().join("loop-b")).unwrap();
    refused(&a, "link loop");
    let long = safe.join("x".repeat(200)).join("y".repeat(4000));
    refused(&long, "longer than PATH_MAX");
    let odd = t
        .path()
        .join(std::ffi::OsStr::from_bytes(b"odd-\xff\xfe-name"));
    std::fs::create_dir(&odd).unwrap();
    give_to_attacker(&odd);
    assert!(refused(&odd, "non-UTF-8").contains("owned by uid"));
    assert_eq!(changeable_by_others(&safe), None);
}

/// Held. A directory reached as /proc/self/fd/N (a descriptor of this process): the link is
/// resolved and the real path checked, so another account's directory behind it is refused.
#[test]
fn a_directory_behind_proc_self_fd_is_checked_as_resolved() {
    use std::os::fd::AsRawFd;
    let t = base("atk50a-procfd");
    let theirs = dir_in(t.path(), "theirs", 0o755);
    give_to_attacker(&theirs);
    let inner = dir_in(&theirs, "inner", 0o700);
    let fd = std::fs::File::open(&inner).unwrap();
    let via = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    assert!(refused(&via, "/proc/self/fd").contains("owned by uid"));
}

/// Held. A replay state in a directory the attacker owns: `read` and `lock` are refused
/// before anything is read or created there (the lock file is not made).
#[test]
fn a_state_file_under_another_accounts_directory_is_neither_read_nor_locked() {
    let t = base("atk50a-state");
    let theirs = dir_in(t.path(), "theirs", 0o755);
    give_to_attacker(&theirs);
    let file = StateFile {
        path: theirs.join("svc.json.replay-state"),
    };
    let e = file.read().unwrap_err();
    assert!(
        e.contains("another account could put an old state back"),
        "{e}"
    );
    assert!(file.lock().is_err());
    assert!(!theirs.join("svc.json.replay-state.lock").exists());
}
