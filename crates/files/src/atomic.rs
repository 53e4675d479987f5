//! Whole-file replacement in a directory other accounts may write (the metrics snapshot, the
//! exporter's textfile output): readers see the previous file or the new one, never a torn
//! one, and nothing another account planted is written to, truncated, blocked on or renamed.
//!
//! The content goes to an unnamed file (`O_TMPFILE`), which gets its exact mode on the handle
//! (`fchmod`, not subject to the umask), loses any access ACL inherited from the directory,
//! and is fsynced; it is then linked at a temporary name with an unpredictable part
//! (`.<name>.tmp.<16 hex digits>`; `linkat` never follows a link there and fails if the name
//! is taken), renamed over the target, and the directory is fsynced. Where `O_TMPFILE` is
//! missing, the temporary name is created exclusively instead
//! (`O_CREAT|O_EXCL|O_NOFOLLOW|O_NONBLOCK`): a planted file, link or FIFO at that name makes
//! the create fail, and a new name is drawn.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use rustix::fs::{Mode, OFlags, CWD};

use super::{owner, unnamed};

/// Attempts at a free temporary name before giving up (each name is 64 random bits: a taken
/// one means someone planted it, not bad luck).
const NAME_ATTEMPTS: usize = 8;

/// Cleared the first time the kernel refuses `linkat(AT_EMPTY_PATH)`.
static EMPTY_PATH_LINK: AtomicBool = AtomicBool::new(true);

/// Writes `bytes` to `path` atomically with exactly `mode` (see the module comment).
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir_path = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    // The directory is the operator's choice (configuration): it may be reached through a link.
    let dir = rustix::fs::openat(
        CWD,
        &dir_path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let temp = publish_temp(&dir, name, bytes, mode)?;
    if let Err(e) = rustix::fs::renameat(&dir, &temp, &dir, name) {
        let _ = rustix::fs::unlinkat(&dir, &temp, rustix::fs::AtFlags::empty());
        return Err(e.into());
    }
    File::from(dir).sync_all()
}

/// A fresh, complete, fsynced file at a new unpredictable name in `dir`; returns the name.
fn publish_temp(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    bytes: &[u8],
    mode: u32,
) -> io::Result<PathBuf> {
    let unnamed = if unnamed::proc_fd_available() {
        match unnamed::open_in(dir, mode) {
            Ok(f) => Some(f),
            Err(e) if unnamed::unsupported(&e) => None,
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    if let Some(file) = unnamed {
        fill(&file, bytes, mode)?;
        for _ in 0..NAME_ATTEMPTS {
            let temp = temp_name(name);
            match unnamed::link(&file, dir, &temp, &EMPTY_PATH_LINK) {
                Ok(()) => return Ok(temp),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        return Err(no_free_name());
    }
    for _ in 0..NAME_ATTEMPTS {
        let temp = temp_name(name);
        let created = rustix::fs::openat(
            dir,
            &temp,
            OFlags::WRONLY
                | OFlags::CREATE
                | OFlags::EXCL
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::from_bits_truncate(mode),
        );
        let file = match created {
            Ok(fd) => File::from(fd),
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        };
        if let Err(e) = fill(&file, bytes, mode) {
            let _ = rustix::fs::unlinkat(dir, &temp, rustix::fs::AtFlags::empty());
            return Err(e);
        }
        return Ok(temp);
    }
    Err(no_free_name())
}

fn temp_name(name: &std::ffi::OsStr) -> PathBuf {
    let mut temp = OsString::from(".");
    temp.push(name);
    temp.push(format!(".tmp.{:016x}", rand::random::<u64>()));
    PathBuf::from(temp)
}

fn no_free_name() -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free temporary name after {NAME_ATTEMPTS} random draws"),
    )
}

/// Exact mode, no inherited access ACL, content, fsync.
fn fill(mut file: &File, bytes: &[u8], mode: u32) -> io::Result<()> {
    rustix::fs::fchmod(file, Mode::from_bits_truncate(mode))?;
    owner::strip_access_acl(file)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_with_the_exact_mode_and_leaves_no_temporary_name() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("svc.prom");
        write_atomically(&path, b"one\n", 0o644).unwrap();
        write_atomically(&path, b"two\n", 0o640).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two\n");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!(meta.nlink(), 1);
        assert_eq!(entries(d.path()), vec!["svc.prom"]);
    }

    #[test]
    fn a_link_at_the_old_temporary_name_is_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let old = format!(".m.json.tmp.{}", std::process::id());
        std::os::unix::fs::symlink(&victim, d.path().join(&old)).unwrap();
        write_atomically(&d.path().join("m.json"), b"{}", 0o640).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(d.path().join("m.json")).unwrap(), b"{}");
    }
}
