//! One per_event record, durably under its final name: the final name appears only with
//! complete, fsynced content, and racing writers of one key are decided by the file system.
//!
//! Two ways, chosen per write:
//! - **unnamed** (`skip_existing`, `fail_existing`; the default where the file system has
//!   `O_TMPFILE`): `open(dir, O_TMPFILE)`, `write`, `fsync`, then
//!   `linkat("/proc/self/fd/<fd>", final, AT_SYMLINK_FOLLOW)`, which fails with `EEXIST` when
//!   the final name exists (exclusive creation with no check-then-write race). The file has no
//!   name before the link, so there is nothing to remove afterwards and a crash at any point
//!   leaves nothing behind. Six calls per file: open, fchmod, write, fsync, linkat, close.
//! - **named**: a dot-named temporary file (`.svc-tmp-<pid>-<random>-<n>`, a name no key can
//!   take) created exclusively, written and fsynced, then `link(tmp, final)` and `unlink(tmp)`
//!   (`skip_existing`, `fail_existing`), or `rename(tmp, final)` (`replace`: an atomic
//!   replacement needs a name to rename). Used for `replace`, and where `O_TMPFILE` or
//!   `/proc` is missing (found out once, then remembered). A crash may leave a `.svc-tmp-*`
//!   file; it is never read and safe to delete. The random part keeps runners with the same
//!   pid (containers, other hosts sharing a volume) apart; a temporary name found taken is
//!   another writer's and is left alone.
//!
//! Every file gets an `fchmod` to exactly `file_mode` before its fsync: the mode given at
//! creation is reduced by the umask, or, in a directory with a default ACL, by that ACL's
//! entries, which no umask reading can predict. It costs no I/O of its own (the inode is
//! written by the fsync that follows anyway).

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, CWD};

use super::config::{DuplicatePolicy, FileSinkConfig};
use super::durable::{create_below, dir_mode};
use super::error;
use crate::sink::{FailureClass, WriteOutcome};

/// Where one envelope's record goes.
pub struct Target {
    /// Path relative to the output directory (used in errors and logs).
    pub rel: String,
    pub path: PathBuf,
}

impl Target {
    pub fn dir(&self) -> &Path {
        self.path
            .parent()
            .expect("a key always has a file name below the output directory")
    }
}

pub struct DurableFiles {
    root: PathBuf,
    file_mode: u32,
    dir_mode: u32,
    policy: DuplicatePolicy,
    /// `O_TMPFILE` and `/proc/self/fd` work here (cleared the first time they do not).
    unnamed: AtomicBool,
    /// `<pid>-<random>`: this instance's part of every temporary name.
    temp_tag: String,
    temp_counter: AtomicU64,
}

impl DurableFiles {
    pub fn new(cfg: &FileSinkConfig) -> DurableFiles {
        DurableFiles {
            root: cfg.directory.clone(),
            file_mode: cfg.file_mode,
            dir_mode: dir_mode(cfg.file_mode),
            policy: cfg.duplicate_policy,
            unnamed: AtomicBool::new(Path::new("/proc/self/fd").is_dir()),
            temp_tag: format!("{}-{:08x}", std::process::id(), rand::random::<u32>()),
            temp_counter: AtomicU64::new(0),
        }
    }

    /// Only the named way (tests of the fallback).
    #[cfg(test)]
    pub fn named_only(mut self) -> DurableFiles {
        self.unnamed = AtomicBool::new(false);
        self
    }

    #[cfg(test)]
    pub fn temp_tag(&self) -> &str {
        &self.temp_tag
    }

    /// Writes `body` to `target`. Directories created on the way are pushed to `created`'s
    /// parents list (they must be fsynced before the new names are durable).
    pub fn write(&self, target: &Target, body: &[u8], created: &mut Vec<PathBuf>) -> WriteOutcome {
        if self.policy != DuplicatePolicy::Replace && self.unnamed.load(Ordering::Relaxed) {
            match self.write_unnamed(target, body, created) {
                Some(outcome) => return outcome,
                None => {
                    if self.unnamed.swap(false, Ordering::Relaxed) {
                        log::info!(
                            "file sink: O_TMPFILE is not supported below the output \
                             directory; per_event writes through named temporary files"
                        );
                    }
                }
            }
        }
        self.write_named(target, body, created)
    }

    /// `None` when `O_TMPFILE` is not supported here.
    fn write_unnamed(
        &self,
        target: &Target,
        body: &[u8],
        created: &mut Vec<PathBuf>,
    ) -> Option<WriteOutcome> {
        let dir = target.dir();
        let open = || {
            rustix::fs::openat(
                CWD,
                dir,
                OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                Mode::from_bits_truncate(self.file_mode),
            )
            .map(File::from)
            .map_err(io::Error::from)
        };
        let file = match self.open_in(dir, created, open) {
            Ok(f) => f,
            Err(e) if unsupported(&e) => return None,
            Err(e) => return Some(transient(&target.rel, e)),
        };
        if let Err(e) = self.fill(&file, body) {
            return Some(transient(&target.rel, e));
        }
        let linked = rustix::fs::linkat(
            CWD,
            format!("/proc/self/fd/{}", file.as_raw_fd()),
            CWD,
            &target.path,
            AtFlags::SYMLINK_FOLLOW,
        )
        .map_err(io::Error::from);
        Some(self.outcome(target, linked))
    }

    fn write_named(
        &self,
        target: &Target,
        body: &[u8],
        created: &mut Vec<PathBuf>,
    ) -> WriteOutcome {
        let dir = target.dir();
        let temp = dir.join(format!(
            ".svc-tmp-{}-{}",
            self.temp_tag,
            self.temp_counter.fetch_add(1, Ordering::Relaxed)
        ));
        let open = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(self.file_mode)
                .open(&temp)
        };
        let written = self
            .open_in(dir, created, open)
            .and_then(|f| self.fill(&f, body));
        if let Err(e) = written {
            // A name found taken belongs to another writer: never remove it.
            if e.kind() != io::ErrorKind::AlreadyExists {
                let _ = fs::remove_file(&temp);
            }
            return transient(&target.rel, e);
        }
        let published = match self.policy {
            DuplicatePolicy::Replace => fs::rename(&temp, &target.path),
            DuplicatePolicy::SkipExisting | DuplicatePolicy::FailExisting => {
                fs::hard_link(&temp, &target.path)
            }
        };
        // A successful rename consumed the temporary name; otherwise it must go. Its removal
        // is made durable by the batch's directory sync (or is harmless if lost in a crash:
        // it is a dot name).
        if self.policy != DuplicatePolicy::Replace || published.is_err() {
            let _ = fs::remove_file(&temp);
        }
        self.outcome(target, published)
    }

    /// `open()`s a file in `dir`, creating `dir` (never the output directory itself) and
    /// retrying once when it is missing.
    fn open_in(
        &self,
        dir: &Path,
        created: &mut Vec<PathBuf>,
        open: impl Fn() -> io::Result<File>,
    ) -> io::Result<File> {
        match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_below(&self.root, dir, self.dir_mode, created).and_then(|()| open())
            }
            r => r,
        }
    }

    /// Exact mode, content, fsync.
    fn fill(&self, mut file: &File, body: &[u8]) -> io::Result<()> {
        // fchmod is not subject to the umask (nor to a default ACL): the mode is exact.
        file.set_permissions(Permissions::from_mode(self.file_mode))?;
        file.write_all(body)?;
        file.sync_all()
    }

    /// The outcome of giving the file its final name.
    fn outcome(&self, target: &Target, published: io::Result<()>) -> WriteOutcome {
        let rel = &target.rel;
        let Err(e) = published else {
            return WriteOutcome::Durable;
        };
        match fs::symlink_metadata(&target.path) {
            Ok(m) if !m.file_type().is_file() => WriteOutcome::Permanent(
                error(format!("{rel} exists and is not a regular file"))
                    .classified(FailureClass::DestinationConflict),
            ),
            Ok(_) if e.kind() == io::ErrorKind::AlreadyExists => match self.policy {
                DuplicatePolicy::FailExisting => WriteOutcome::Permanent(
                    error(format!(
                        "{rel} already exists (duplicate_policy fail_existing)"
                    ))
                    .classified(FailureClass::DuplicateExists),
                ),
                // An earlier delivery (or a racing worker) wrote it; the directory sync of
                // this batch makes sure its name is durable before we say so.
                _ => WriteOutcome::AlreadyDurable,
            },
            _ => transient(rel, e),
        }
    }
}

fn transient(rel: &str, e: io::Error) -> WriteOutcome {
    WriteOutcome::Transient(error(format!("write {rel}: {e}")))
}

/// `O_TMPFILE` refused by the kernel or the file system (not a failure of this write).
fn unsupported(e: &io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL)
    )
}
