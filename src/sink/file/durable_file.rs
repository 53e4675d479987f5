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
//!   take) created exclusively (never through a link, never blocking), written and fsynced, then `link(tmp, final)` and `unlink(tmp)`
//!   (`skip_existing`, `fail_existing`), or `rename(tmp, final)` (`replace`: an atomic
//!   replacement needs a name to rename). Used for `replace`, and where `O_TMPFILE` or
//!   `/proc` is missing (found out once, then remembered). A crash may leave a `.svc-tmp-*`
//!   file; it is never read and safe to delete. The random part keeps runners with the same
//!   pid (containers, other hosts sharing a volume) apart; a temporary name found taken is
//!   another writer's and is left alone.
//!
//! Directories: every name is created and linked relative to a directory descriptor opened by
//! [`open_below`] (no link followed below the output directory, every directory owned by the
//! service's user, none with a default ACL), so nobody else can redirect a record into a
//! directory of their choosing. A name found taken under `skip_existing` counts as the durable
//! copy only when the file there is the service's and holds this record (`existing.rs`).
//!
//! Every file has exactly `file_mode` before its fsync: the mode given at creation is reduced
//! by the umask. So the mode the file got is read back (`fstat`) and set with `fchmod`
//! only where it differs. Under the usual umasks (022, 027) and the default 0640 it never
//! does, and `fchmod` is the dearer call: it changes the inode (ext4 takes the inode through
//! its `setattr` path), where `fstat` only reads it.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::config::FileSinkConfig;
use super::durable::{dir_mode, open_below, DirProblem};
use super::error;
use super::existing::RecordId;
use crate::files::{owner, unnamed};
use crate::sink::layout::{Compression, DuplicatePolicy};
use crate::sink::{FailureClass, WriteOutcome};

/// Where one envelope's record goes.
pub struct Target {
    /// Path relative to the output directory (used in errors and logs).
    pub rel: String,
    pub path: PathBuf,
    /// The record it is for: a file found at `path` counts only when it holds that record.
    pub id: Option<RecordId>,
}

impl Target {
    pub fn dir(&self) -> &Path {
        self.path
            .parent()
            .expect("a key always has a file name below the output directory")
    }

    fn name(&self) -> &Path {
        Path::new(
            self.path
                .file_name()
                .expect("a key always has a file name below the output directory"),
        )
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
    compression: Compression,
    /// Bound on what is read of a file found at a record's name (decompressed).
    max_record_bytes: u64,
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
            compression: cfg.compression,
            max_record_bytes: cfg.max_record_bytes,
            unnamed: AtomicBool::new(unnamed::proc_fd_available()),
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
        let dir = match self.open_dir(target, created) {
            Ok(dir) => dir,
            Err(outcome) => return outcome.into(),
        };
        if self.policy != DuplicatePolicy::Replace && self.unnamed.load(Ordering::Relaxed) {
            match self.write_unnamed(&dir, target, body) {
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
        self.write_named(&dir, target, body).into()
    }

    /// The target's directory, opened (and created where missing) by [`open_below`]'s rules.
    fn open_dir(
        &self,
        target: &Target,
        created: &mut Vec<PathBuf>,
    ) -> Result<OwnedFd, WriteOutcome> {
        let rel = target
            .dir()
            .strip_prefix(&self.root)
            .expect("a target is below the output directory");
        open_below(&self.root, rel, self.dir_mode, created).map_err(|p| match p {
            DirProblem::Refused(why) => WriteOutcome::Permanent(
                error(format!("write {}: {why}", target.rel))
                    .classified(FailureClass::DestinationConflict),
            ),
            DirProblem::Failed(e) => transient(&target.rel, e),
        })
    }

    /// `None` when `O_TMPFILE` is not supported here.
    fn write_unnamed(&self, dir: &OwnedFd, target: &Target, body: &[u8]) -> Option<Publication> {
        let file = match unnamed::open_in(dir, self.file_mode) {
            Ok(f) => f,
            Err(e) if unnamed::unsupported(&e) => return None,
            Err(e) => return Some(transient(&target.rel, e).into()),
        };
        if let Err(e) = self.fill(&file, body) {
            return Some(transient(&target.rel, e).into());
        }
        let linked = unnamed::link(&file, dir, target.name(), &self.empty_path_link);
        // The link raised the inode's link count from 0 to 1 after its fsync; see the
        // module comment for why that needs a second one.
        let named = linked.is_ok().then_some(file);
        Some(Publication {
            outcome: self.outcome(dir, target, body, linked),
            named,
        })
    }

    fn write_named(&self, dir: &OwnedFd, target: &Target, body: &[u8]) -> WriteOutcome {
        let temp = PathBuf::from(format!(
            ".svc-tmp-{}-{}",
            self.temp_tag,
            self.temp_counter.fetch_add(1, Ordering::Relaxed)
        ));
        let created = rustix::fs::openat(
            dir,
            &temp,
            OFlags::WRONLY
                | OFlags::CREATE
                | OFlags::EXCL
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::from_bits_truncate(self.file_mode),
        );
        let written = match created {
            Ok(fd) => self.fill(&File::from(fd), body),
            // A name found taken belongs to another writer: never remove it.
            Err(e) => return transient(&target.rel, e.into()),
        };
        let remove = || {
            let _ = rustix::fs::unlinkat(dir, &temp, AtFlags::empty());
        };
        if let Err(e) = written {
            remove();
            return transient(&target.rel, e);
        }
        let published = match self.policy {
            DuplicatePolicy::Replace => rustix::fs::renameat(dir, &temp, dir, target.name()),
            DuplicatePolicy::SkipExisting | DuplicatePolicy::FailExisting => {
                rustix::fs::linkat(dir, &temp, dir, target.name(), AtFlags::empty())
            }
        };
        // A successful rename consumed the temporary name; otherwise it must go. Its removal
        // is made durable by the batch's directory sync (or is harmless if lost in a crash:
        // it is a dot name).
        if self.policy != DuplicatePolicy::Replace || published.is_err() {
            remove();
        }
        self.outcome(dir, target, body, published.map_err(io::Error::from))
    }

    /// Exact mode, content, fsync.
    fn fill(&self, mut file: &File, body: &[u8]) -> io::Result<()> {
        let stat = rustix::fs::fstat(file)?;
        if stat.st_mode & 0o7777 != self.file_mode {
            // fchmod is not subject to the umask: the mode is exact. (A default ACL is refused
            // on the directory, see open_below.)
            rustix::fs::fchmod(file, Mode::from_bits_truncate(self.file_mode))?;
        }
        file.write_all(body)?;
        file.sync_all()
    }

    /// The outcome of giving the file its final name.
    fn outcome(
        &self,
        dir: &OwnedFd,
        target: &Target,
        body: &[u8],
        published: io::Result<()>,
    ) -> WriteOutcome {
        let rel = &target.rel;
        let Err(e) = published else {
            return WriteOutcome::Durable;
        };
        match rustix::fs::statat(dir, target.name(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile => {
                WriteOutcome::Permanent(
                    error(format!("{rel} exists and is not a regular file"))
                        .classified(FailureClass::DestinationConflict),
                )
            }
            Ok(_) if e.kind() == io::ErrorKind::AlreadyExists => match self.policy {
                DuplicatePolicy::FailExisting => WriteOutcome::Permanent(
                    error(format!(
                        "{rel} already exists (duplicate_policy fail_existing)"
                    ))
                    .classified(FailureClass::DuplicateExists),
                ),
                _ => self.existing(dir, target, body),
            },
            _ => transient(rel, e),
        }
    }

    /// `skip_existing` found the name taken: already durable only when the file there holds
    /// this record (super::existing), and belongs to the service's user.
    fn existing(&self, dir: &OwnedFd, target: &Target, body: &[u8]) -> WriteOutcome {
        let rel = &target.rel;
        let conflict = |why: String| {
            WriteOutcome::Permanent(
                error(format!("{rel} exists and {why}")).classified(FailureClass::DuplicateExists),
            )
        };
        let (file, stat) = match owner::open_regular_at(dir, target.name()) {
            Ok(opened) => opened,
            Err(owner::Refusal::Open(e)) => {
                return WriteOutcome::Transient(error(format!("read the existing {rel}: {e}")))
            }
            Err(refused) => return conflict(refused.to_string()),
        };
        if let Err(refused) = owner::check_owner(&stat, false) {
            return conflict(refused.to_string());
        }
        // Stored records are at most max_record_bytes before compression; gzip adds little.
        let cap = self.max_record_bytes.saturating_add(64 * 1024);
        let mut stored = Vec::new();
        if let Err(e) = (&file).take(cap + 1).read_to_end(&mut stored) {
            return WriteOutcome::Transient(error(format!("read the existing {rel}: {e}")));
        }
        if stored.len() as u64 > cap {
            return conflict(format!("is larger than any record ({cap} bytes)"));
        }
        if let Some(id) = &target.id {
            let gzip = self.compression == Compression::Gzip;
            if let Err(why) = id.check(&stored, body, gzip, self.max_record_bytes) {
                return conflict(why);
            }
        } else if stored != body {
            return conflict("holds another record".into());
        }
        // An earlier delivery (or a racing worker) wrote it, possibly a process that died
        // between its link and its second fsync: fsync it here, and the directory sync of
        // this batch makes its name durable before we say so.
        match file.sync_all() {
            Ok(()) => WriteOutcome::AlreadyDurable,
            Err(e) => {
                WriteOutcome::Transient(error(format!("make the existing {rel} durable: {e}")))
            }
        }
    }
}

/// fsync of a file under its final name (never following a symbolic link there; tests).
#[cfg(test)]
pub fn sync_by_name(path: &Path) -> io::Result<()> {
    let fd = rustix::fs::openat(
        rustix::fs::CWD,
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    File::from(fd).sync_all()
}

fn transient(rel: &str, e: io::Error) -> WriteOutcome {
    WriteOutcome::Transient(error(format!("write {rel}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::file::tests::Scratch;
    use rustix::fs::CWD;
    use std::fs;

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
            unnamed::link(
                &unnamed_file(&out, b"first"),
                CWD,
                &path,
                &files.empty_path_link,
            )
            .unwrap();
            let second = unnamed::link(
                &unnamed_file(&out, b"second"),
                CWD,
                &path,
                &files.empty_path_link,
            );
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
        let e = unnamed::link(&file, CWD, &gone, &files.empty_path_link).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            files.empty_path_link.load(Ordering::Relaxed),
            "the /proc way failed as well: the empty path stays in use"
        );
        unnamed::link(
            &file,
            CWD,
            &s.path().join("out/1.json"),
            &files.empty_path_link,
        )
        .unwrap();
    }
}
