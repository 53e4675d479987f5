//! One per_event record, durably under its final name: the final name appears only with
//! complete, fsynced content, and racing writers of one key are decided by the file system.
//!
//! Two ways, chosen per write:
//! - **unnamed** (`skip_existing`, `fail_existing`; the default where the file system has
//!   `O_TMPFILE`): `open(dir, O_TMPFILE)`, `write`, `fsync`, then
//!   `linkat(<fd>, "", final, AT_EMPTY_PATH)` (or, where the kernel refuses that,
//!   `linkat("/proc/self/fd/<fd>", final, AT_SYMLINK_FOLLOW)`), which fails with `EEXIST` when
//!   the final name exists (exclusive creation with no check-then-write race), and a few
//!   files later an `fsync` of the same descriptor again ([`Publication::named`]). The file
//!   has no name before the link, so there is nothing to remove afterwards and a crash at any
//!   point leaves nothing behind. Per file: open, fstat, write, fsync, linkat, fsync, close
//!   (and an fchmod where the mode needs it, see below).
//!
//!   Why the second fsync: the link raises the inode's link count from 0 to 1, and that count
//!   lives in the inode, not in the directory. With a journal the directory's fsync commits
//!   both together, but ext4 without a journal writes only the directory's own blocks then,
//!   and its fsync of a file writes that file's inode (`ext4_fsync_nojournal`). A crash
//!   before the kernel's writeback (about 30 s) would leave the durable name pointing to an
//!   inode that says "no links", which `e2fsck` treats as deleted and whose entry it
//!   clears: an acknowledged record lost. The second fsync writes the new count. The writer
//!   runs it a few files later ([`super::writer_pool::FINISH_AFTER`]), not right after the
//!   link: one inode-table block holds the inodes of the files created around the same time,
//!   and once their links are done, one write of the block serves them all; the others'
//!   fsyncs find it clean and have only the cache flush left, and concurrent flushes are
//!   merged. Not the whole batch later either: without a journal, ext4 skips the free inodes
//!   of a table block that is dirty in memory if they were deleted within the last six
//!   minutes (one minute when clean), scanning past each on every allocation, so after bulk
//!   deletions every block left dirty between a link and its fsync costs every new file time
//!   (measured: docs/sinks/file.md, Performance). (Kernels before a 2026 stable fix, "ext4:
//!   ... fsync in nojournal mode", skipped that inode write even in a file's fsync; there,
//!   without a journal, the count reaches the disk only with writeback.)
//! - **named**: a dot-named temporary file (`.svc-tmp-<pid>-<random>-<n>`, a name no key can
//!   take) created exclusively, written and fsynced, then `link(tmp, final)` and `unlink(tmp)`
//!   (`skip_existing`, `fail_existing`), or `rename(tmp, final)` (`replace`: an atomic
//!   replacement needs a name to rename). Used for `replace`, and where `O_TMPFILE` or
//!   `/proc` is missing (found out once, then remembered). A crash may leave a `.svc-tmp-*`
//!   file; it is never read and safe to delete. The random part keeps runners with the same
//!   pid (containers, other hosts sharing a volume) apart; a temporary name found taken is
//!   another writer's and is left alone.
//!
//! Every file has exactly `file_mode` before its fsync: the mode given at creation is reduced
//! by the umask, or, in a directory with a default ACL, by that ACL's entries, which no umask
//! reading can predict. So the mode the file got is read back (`fstat`) and set with `fchmod`
//! only where it differs. Under the usual umasks (022, 027) and the default 0640 it never
//! does, and `fchmod` is the dearer call: it changes the inode (ext4 takes the inode through
//! its `setattr` path), where `fstat` only reads it.

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

/// What [`DurableFiles::write`] did.
#[derive(Debug)]
pub struct Publication {
    pub outcome: WriteOutcome,
    /// An unnamed file that was just given its name: `outcome` holds only once it has been
    /// fsynced again (its link count; see the module comment).
    pub named: Option<File>,
}

impl From<WriteOutcome> for Publication {
    fn from(outcome: WriteOutcome) -> Publication {
        Publication {
            outcome,
            named: None,
        }
    }
}

pub struct DurableFiles {
    root: PathBuf,
    file_mode: u32,
    dir_mode: u32,
    policy: DuplicatePolicy,
    /// `O_TMPFILE` and `/proc/self/fd` work here (cleared the first time they do not).
    unnamed: AtomicBool,
    /// `linkat(AT_EMPTY_PATH)` works (cleared the first time the kernel refuses it).
    empty_path_link: AtomicBool,
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
            empty_path_link: AtomicBool::new(true),
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

    /// Unnamed files linked through /proc only (tests of the older kernels' way).
    #[cfg(test)]
    pub fn linked_through_proc(mut self) -> DurableFiles {
        self.empty_path_link = AtomicBool::new(false);
        self
    }

    #[cfg(test)]
    pub fn temp_tag(&self) -> &str {
        &self.temp_tag
    }

    /// Writes `body` to `target`. Directories created on the way are pushed to `created`'s
    /// parents list (they must be fsynced before the new names are durable).
    pub fn write(&self, target: &Target, body: &[u8], created: &mut Vec<PathBuf>) -> Publication {
        if self.policy != DuplicatePolicy::Replace && self.unnamed.load(Ordering::Relaxed) {
            match self.write_unnamed(target, body, created) {
                Some(publication) => return publication,
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
        self.write_named(target, body, created).into()
    }

    /// `None` when `O_TMPFILE` is not supported here.
    fn write_unnamed(
        &self,
        target: &Target,
        body: &[u8],
        created: &mut Vec<PathBuf>,
    ) -> Option<Publication> {
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
            Err(e) => return Some(transient(&target.rel, e).into()),
        };
        if let Err(e) = self.fill(&file, body) {
            return Some(transient(&target.rel, e).into());
        }
        let linked = self.link(&file, &target.path);
        // The link raised the inode's link count from 0 to 1 after its fsync; see the
        // module comment for why that needs a second one.
        let named = linked.is_ok().then_some(file);
        Some(Publication {
            outcome: self.outcome(target, linked),
            named,
        })
    }

    /// Gives the unnamed `file` its name: `linkat(<fd>, "", AT_EMPTY_PATH)` where the kernel
    /// allows that (Linux 6.10 and later for a file the process opened itself; before, only
    /// with `CAP_DAC_READ_SEARCH`), else `linkat("/proc/self/fd/<fd>", AT_SYMLINK_FOLLOW)`,
    /// which walks a path through /proc for every file (a quarter of `linkat`'s time in a
    /// profile of the writers; docs/sinks/file.md, Performance).
    fn link(&self, file: &File, path: &Path) -> io::Result<()> {
        if self.empty_path_link.load(Ordering::Relaxed) {
            match rustix::fs::linkat(file, "", CWD, path, AtFlags::EMPTY_PATH) {
                // A refusal (ENOENT, as for a missing directory): decided below.
                Err(rustix::io::Errno::NOENT) => {}
                linked => return linked.map_err(io::Error::from),
            }
        }
        let linked = rustix::fs::linkat(
            CWD,
            format!("/proc/self/fd/{}", file.as_raw_fd()),
            CWD,
            path,
            AtFlags::SYMLINK_FOLLOW,
        );
        // The same link through /proc worked: the empty path was refused, not the name.
        if linked.is_ok() && self.empty_path_link.swap(false, Ordering::Relaxed) {
            log::debug!(
                "file sink: this kernel refuses linkat(AT_EMPTY_PATH); linking through /proc"
            );
        }
        linked.map_err(io::Error::from)
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
        if file.metadata()?.permissions().mode() & 0o7777 != self.file_mode {
            // fchmod is not subject to the umask (nor to a default ACL): the mode is exact.
            file.set_permissions(Permissions::from_mode(self.file_mode))?;
        }
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
                // An earlier delivery (or a racing worker) wrote it, possibly a process that
                // died between its link and its second fsync: fsync it here, and the
                // directory sync of this batch makes its name durable before we say so.
                _ => match sync_by_name(&target.path) {
                    Ok(()) => WriteOutcome::AlreadyDurable,
                    Err(e) => WriteOutcome::Transient(error(format!(
                        "make the existing {rel} durable: {e}"
                    ))),
                },
            },
            _ => transient(rel, e),
        }
    }
}

/// fsync of a file under its final name (never following a symbolic link there).
pub fn sync_by_name(path: &Path) -> io::Result<()> {
    let fd = rustix::fs::openat(
        CWD,
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    File::from(fd).sync_all()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::file::tests::Scratch;

    fn files(s: &Scratch) -> DurableFiles {
        let cfg = FileSinkConfig::new(s.path().join("out"));
        fs::create_dir(&cfg.directory).unwrap();
        DurableFiles::new(&cfg)
    }

    fn unnamed_file(dir: &Path, body: &[u8]) -> File {
        let mut file = File::from(
            rustix::fs::openat(CWD, dir, OFlags::WRONLY | OFlags::TMPFILE, Mode::RUSR).unwrap(),
        );
        file.write_all(body).unwrap();
        file
    }

    #[test]
    fn both_ways_of_linking_name_the_file_once() {
        for way in ["empty path", "/proc"] {
            let s = Scratch::new();
            let files = match way {
                "/proc" => files(&s).linked_through_proc(),
                _ => files(&s),
            };
            let out = s.path().join("out");
            let path = out.join("1.json");
            files.link(&unnamed_file(&out, b"first"), &path).unwrap();
            let second = files.link(&unnamed_file(&out, b"second"), &path);
            assert_eq!(
                second.unwrap_err().kind(),
                io::ErrorKind::AlreadyExists,
                "{way}"
            );
            assert_eq!(fs::read(&path).unwrap(), b"first", "{way}");
            assert_eq!(s.files("out"), vec!["1.json"], "{way}");
        }
    }

    #[test]
    fn a_missing_directory_does_not_count_as_a_refused_empty_path() {
        let s = Scratch::new();
        let files = files(&s);
        let file = unnamed_file(&s.path().join("out"), b"x");
        let gone = s.path().join("out/gone/1.json");
        let e = files.link(&file, &gone).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            files.empty_path_link.load(Ordering::Relaxed),
            "the /proc way failed as well: the empty path stays in use"
        );
        files.link(&file, &s.path().join("out/1.json")).unwrap();
    }
}
