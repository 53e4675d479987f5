//! The drained head: for each runner id, the last custody checkpoint the drain put into the
//! target's checkpoint store, kept in the spool directory (`drained-head-<sha256 of the
//! runner id, hex>`, one file per runner id), so a runner's start that cannot read the target
//! still knows where the target's part of the chain ends (docs/spool.md, "Restart").
//!
//! The file holds the checkpoint's signed text as the target holds it: verifiable with the
//! runner's key, so one made up by someone who could write the spool's directory is refused
//! (the start verifies it and refuses one that does not verify or names another runner); a
//! genuine checkpoint copied out of a frame of a spool kept in clear would verify, so the start
//! takes a drained head from a sealed spool only (atk52c finding 3: docs/spool.md "Restart").
//! Written by the drain after the checkpoint's put succeeded and before the drain position
//! moves past its frame: under a temporary name, fsynced, renamed in, the directory fsynced,
//! mode 0600 ([`dir::write_new`]). A crash between the put and this write leaves the
//! frame in the spool (the position did not move): the spool's chain then holds the drained
//! head or begins right after it, which the start takes. Read without following a link, a
//! regular file of the service's user with one name, bounded.

use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType};

use super::dir::{self, fail, SpoolError};
use crate::message::protection::checkpoint::{sha256, MAX_CHECKPOINT_BYTES};

/// Names of drained-head files begin so.
pub const PREFIX: &str = "drained-head-";

/// The drained-head file of `runner_id` (fixed length whatever the runner id's).
pub fn name(runner_id: &str) -> String {
    format!(
        "{PREFIX}{}",
        crate::text::hex::lower(&sha256(runner_id.as_bytes()))
    )
}

/// Records `text` (a checkpoint of `runner_id` the target now holds) as its drained head,
/// durably, replacing the one before.
pub fn write(dir: &OwnedFd, path: &Path, runner_id: &str, text: &[u8]) -> Result<(), SpoolError> {
    dir::write_new(dir, path, &name(runner_id), text)
}

/// The drained head of `runner_id` as (file name, text); `None` when there is no file (a
/// spool nothing was drained from, or one drained by a version before the file).
pub fn read(
    dir: &OwnedFd,
    path: &Path,
    runner_id: &str,
) -> Result<Option<(String, String)>, SpoolError> {
    let name = name(runner_id);
    match rustix::fs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(fail(path, &name, std::io::Error::from(e))),
        Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile => {
            return Err(fail(
                path,
                &name,
                "is not a regular file (a link or a directory): the drain never writes one",
            ))
        }
        Ok(_) => {}
    }
    // No link followed, a regular file of the service's user with one name.
    let file = dir::open_file(dir, path, &name, false)?;
    let data =
        dir::read_at(&file, 0, MAX_CHECKPOINT_BYTES + 1).map_err(|e| fail(path, &name, e))?;
    if data.len() as u64 > MAX_CHECKPOINT_BYTES {
        return Err(fail(path, &name, "is larger than a checkpoint can be"));
    }
    let text = String::from_utf8(data)
        .map_err(|_| fail(path, &name, "is not a checkpoint (not UTF-8)"))?;
    Ok(Some((name, text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_head_is_written_replaced_and_read_back_only_from_a_plain_private_file() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("spool");
        let fd = dir::open_dir(&path, true).unwrap();
        assert_eq!(read(&fd, &path, "r1").unwrap(), None);
        write(&fd, &path, "r1", b"first").unwrap();
        write(&fd, &path, "r1", b"second").unwrap();
        write(&fd, &path, "r2", b"other").unwrap();
        let (n, t) = read(&fd, &path, "r1").unwrap().unwrap();
        assert_eq!((n.as_str(), t.as_str()), (name("r1").as_str(), "second"));
        assert_eq!(read(&fd, &path, "r2").unwrap().unwrap().1, "other");
        assert_eq!(name("r1").len(), PREFIX.len() + 64);
        use std::os::unix::fs::PermissionsExt;
        let file = path.join(name("r1"));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A second name (a hard link) or a symbolic link is refused.
        std::fs::hard_link(&file, d.path().join("again")).unwrap();
        let e = read(&fd, &path, "r1").unwrap_err().to_string();
        assert!(e.contains(&name("r1")), "{e}");
        std::fs::remove_file(d.path().join("again")).unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(path.join(name("r2")), &file).unwrap();
        let e = read(&fd, &path, "r1").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
