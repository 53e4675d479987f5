//! The spool directory as a boundary: created 0700, never reached through a link at its own
//! name, owned by the service's user, without a default ACL; every file in it opened by
//! `openat` on the directory handle without following links, created 0600 exclusively, and
//! read with a bound. A lock file (`flock`) keeps it to one process.

use std::fmt;
use std::fs::{DirBuilder, File};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, CWD};

use crate::files::owner;
use crate::metrics::Metrics;

/// Mode of the spool directory.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file in it.
pub const FILE_MODE: u32 = 0o600;
const LOCK_NAME: &str = "lock";
const POSITION_NAME: &str = "position";
const POSITION_MAGIC: &[u8; 8] = b"SVCPOS01";

/// Why the spool cannot be used; `Display` names the directory and the cause, never data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolError(pub String);

impl fmt::Display for SpoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpoolError {}

/// `spool <dir>: <what>: <cause>`.
pub fn fail(dir: &Path, what: &str, cause: impl fmt::Display) -> SpoolError {
    SpoolError(format!("spool {}: {what}: {cause}", dir.display()))
}

/// Fsyncs the directory that holds `path`.
fn sync_parent(path: &Path) -> Result<(), SpoolError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| fail(path, "fsync the parent directory", e))
}

/// Opens (with `create`, creating) the spool directory and checks it.
pub fn open_dir(path: &Path, create: bool) -> Result<OwnedFd, SpoolError> {
    if create {
        match DirBuilder::new().mode(DIR_MODE).create(path) {
            // Created now: its entry in the parent is durable before anything in it is
            // reported durable (a power cut could otherwise lose the whole spool).
            Ok(()) => sync_parent(path)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail(path, "create directory", e)),
        }
    }
    let fd = rustix::fs::openat(
        CWD,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => fail(
            path,
            "open directory",
            "not a directory, or a symbolic link (links are not followed)",
        ),
        e => fail(path, "open directory", io::Error::from(e)),
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| fail(path, "stat", io::Error::from(e)))?;
    owner::check_owner(&stat, false).map_err(|e| fail(path, "directory", e))?;
    if owner::has_default_acl(&fd).map_err(|e| fail(path, "read ACL", e))? {
        return Err(fail(
            path,
            "directory",
            "has a default ACL (files created in it would grant other accounts access)",
        ));
    }
    if create && stat.st_mode & 0o077 != 0 {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE))
            .map_err(|e| fail(path, "chmod 0700", io::Error::from(e)))?;
    }
    Ok(fd)
}

/// Takes the spool's lock for this process; another holder makes it fail at once.
pub fn lock(dir: &OwnedFd, path: &Path) -> Result<OwnedFd, SpoolError> {
    let fd = rustix::fs::openat(
        dir,
        LOCK_NAME,
        OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )
    .map_err(|e| fail(path, "open lock file", io::Error::from(e)))?;
    regular_and_mine(&fd, path, LOCK_NAME)?;
    rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).map_err(|e| match e {
        rustix::io::Errno::WOULDBLOCK => fail(
            path,
            "locked",
            "another process (a runner or `svc spool drain`) is using this spool directory",
        ),
        e => fail(path, "lock", io::Error::from(e)),
    })?;
    Ok(fd)
}

fn regular_and_mine(fd: &OwnedFd, path: &Path, name: &str) -> Result<(), SpoolError> {
    let stat = rustix::fs::fstat(fd).map_err(|e| fail(path, name, io::Error::from(e)))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(fail(path, name, "is not a regular file"));
    }
    owner::check_owner(&stat, false).map_err(|e| fail(path, name, e))?;
    owner::check_single_link(&stat).map_err(|e| fail(path, name, e))
}

/// Opens an existing file of the spool for reading (or writing with `write`).
pub fn open_file(dir: &OwnedFd, path: &Path, name: &str, write: bool) -> Result<File, SpoolError> {
    let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
    let fd = rustix::fs::openat(
        dir,
        name,
        access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(path, &format!("open {name}"), io::Error::from(e)))?;
    regular_and_mine(&fd, path, name)?;
    Ok(File::from(fd))
}

/// Creates a new file (it must not exist), mode 0600 whatever the umask, open for writing.
pub fn create_file(dir: &OwnedFd, path: &Path, name: &str) -> Result<File, SpoolError> {
    create(dir, path, name, OFlags::RDWR)
}

/// [`create_file`] in append mode: every write lands at the end of the file, also after a
/// failed write was cut back (a file offset left past the cut would leave a hole of zeros).
pub fn create_appending(dir: &OwnedFd, path: &Path, name: &str) -> Result<File, SpoolError> {
    create(dir, path, name, OFlags::WRONLY | OFlags::APPEND)
}

fn create(dir: &OwnedFd, path: &Path, name: &str, access: OFlags) -> Result<File, SpoolError> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::CREATE | OFlags::EXCL | access | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )
    .map_err(|e| fail(path, &format!("create {name}"), io::Error::from(e)))?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE))
        .map_err(|e| fail(path, &format!("chmod {name}"), io::Error::from(e)))?;
    Ok(File::from(fd))
}

/// Removes a file and makes the removal durable.
pub fn remove(dir: &OwnedFd, path: &Path, name: &str) -> Result<(), SpoolError> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => sync(dir, path),
        Err(e) => Err(fail(path, &format!("remove {name}"), io::Error::from(e))),
    }
}

/// fsync of the directory: new and removed names become durable.
pub fn sync(dir: &OwnedFd, path: &Path) -> Result<(), SpoolError> {
    rustix::fs::fsync(dir).map_err(|e| fail(path, "fsync directory", io::Error::from(e)))
}

/// Names in the directory, sorted.
pub fn names(dir: &OwnedFd, path: &Path) -> Result<Vec<String>, SpoolError> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(path, "list", io::Error::from(e)))?;
    let mut out = Vec::new();
    let mut entries = rustix::fs::Dir::read_from(fd.as_fd())
        .map_err(|e| fail(path, "list", io::Error::from(e)))?;
    for entry in entries.by_ref() {
        let entry = entry.map_err(|e| fail(path, "list", io::Error::from(e)))?;
        if let Ok(name) = entry.file_name().to_str() {
            out.push(name.to_string());
        }
    }
    out.sort();
    Ok(out)
}

/// Reads `file` from `offset`, at most `limit` bytes.
pub fn read_at(file: &File, offset: u64, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    // Sized from the file once: growing a buffer while reading a 16 MiB segment copied it
    // over and over, the largest cost of a drain. `read_to_end` fills the reserved space
    // without zeroing it first.
    let size = file.metadata()?.len();
    let want = limit.min(size.saturating_sub(offset));
    let mut buf = Vec::with_capacity(
        usize::try_from(want).map_err(|_| io::Error::other("segment larger than memory"))?,
    );
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    // A file that grew since is read only to the size it had; one that shrank, to its end.
    f.take(want).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Where the drain stands: the next record to deliver is at `offset` of segment `segment`
/// (an offset before the header means the first record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

/// The durable drain position; `None` when none was written (or it is unreadable, logged:
/// the drain then starts at the oldest segment, and idempotent sinks absorb the repeats).
pub fn read_position(dir: &OwnedFd, path: &Path) -> Option<Position> {
    let file = match open_file(dir, path, POSITION_NAME, false) {
        Ok(f) => f,
        Err(_) => return None,
    };
    let data = read_at(&file, 0, 64).ok()?;
    let parsed = parse_position(&data);
    if parsed.is_none() {
        log::warn!(
            "spool {}: the drain position is unreadable; draining from the oldest segment",
            path.display()
        );
    }
    parsed
}

fn parse_position(data: &[u8]) -> Option<Position> {
    if data.len() != 28 || !data.starts_with(POSITION_MAGIC) {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let sum = u32::from_le_bytes(data[24..28].try_into().expect("4 bytes"));
    (crc32fast::hash(&data[..24]) == sum).then(|| Position {
        segment: word(8),
        offset: word(16),
    })
}

/// Overwrites the drain position in place and fsyncs it. In place, not by replacing the
/// file: a spool on a full disk must still record progress, or it could never free a
/// segment. The 28 bytes lie in one sector; a torn write fails the checksum and the drain
/// restarts at the oldest segment (repeats an idempotent sink absorbs).
pub fn write_position(dir: &OwnedFd, path: &Path, pos: Position) -> Result<(), SpoolError> {
    use std::os::unix::fs::FileExt;
    let mut data = POSITION_MAGIC.to_vec();
    data.extend_from_slice(&pos.segment.to_le_bytes());
    data.extend_from_slice(&pos.offset.to_le_bytes());
    let sum = crc32fast::hash(&data);
    data.extend_from_slice(&sum.to_le_bytes());
    let file = match open_file(dir, path, POSITION_NAME, true) {
        Ok(f) => f,
        // Refused (a link, another owner, more than one name): that error, not a create's.
        Err(e) if rustix::fs::statat(dir, POSITION_NAME, AtFlags::SYMLINK_NOFOLLOW).is_ok() => {
            return Err(e)
        }
        // The first position comes into being whole (temporary name, fsync, rename, directory
        // fsync): created in place, a kill between the create and the write left an empty file
        // and the next start drained again from the oldest segment (the crash explorer's
        // `spool_appends_survive_a_kill_at_every_call`, a kill at the first pwrite64).
        Err(_) => return keep(dir, path, POSITION_NAME, &data).map(|_| ()),
    };
    file.write_all_at(&data, 0)
        .and_then(|()| file.sync_data())
        .map_err(|e| fail(path, "write drain position", e))
}

/// `segment-<id>.spool`.
pub fn segment_name(id: u64) -> String {
    format!("segment-{id:016}.spool")
}

/// The id of a segment file name.
pub fn segment_id(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("segment-")?.strip_suffix(".spool")?;
    (digits.len() == 16 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Name of the quarantine file of the damaged bytes at `offset` of segment `id`.
pub fn quarantine_name(id: u64, offset: u64) -> String {
    format!("quarantine-{id:016}-{offset:012}.bad")
}

/// Name of the file keeping the records at `offset` of segment `id` the sink refused for good.
pub fn rejected_name(id: u64, offset: u64) -> String {
    format!("rejected-{id:016}-{offset:012}.spool")
}

/// The segment a rejected file's name gives (`rejected-<segment>-<offset>.spool`).
pub fn rejected_segment(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("rejected-")?.get(..16)?;
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| digits.parse().ok())?
}

/// The offset a rejected file's name gives (`rejected-<segment>-<offset>.spool`, maybe with
/// `~N` before the extension): where its record was sealed.
pub fn rejected_offset(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("rejected-")?.get(17..)?;
    let digits = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count().min(20)];
    digits.parse().ok()
}

/// Keeps damaged bytes of segment `segment` in their quarantine file, once, and counts them;
/// false when an earlier pass had kept them already (the opening scan, which did not count
/// them as waiting records); an error when they could not be kept (they stay in the segment).
pub fn quarantine(
    dir: &OwnedFd,
    path: &Path,
    metrics: &Metrics,
    segment: u64,
    offset: u64,
    bytes: &[u8],
) -> Result<bool, SpoolError> {
    let name = quarantine_name(segment, offset);
    match keep(dir, path, &name, bytes)? {
        (Kept::New, name) => {
            Metrics::add(&metrics.counters.spool_quarantined_total, 1);
            log::error!(
                "spool {}: {} damaged bytes at {} offset {offset} moved to {name}",
                path.display(),
                bytes.len(),
                segment_name(segment)
            );
            Ok(true)
        }
        (Kept::Already, _) => Ok(false),
    }
}

/// What [`keep`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Written now.
    New,
    /// A complete file with exactly these bytes was there already (an earlier pass kept them
    /// and a crash came before the drain position moved on); it is durable now.
    Already,
}

/// Alternative names [`keep`] tries when a file with other bytes holds `name`.
const KEEP_NAMES: usize = 100;

/// `name`, or for `k > 0` `name` with `~k` before its extension
/// (`quarantine-…-000000000040~1.bad`).
fn alternate_name(name: &str, k: usize) -> String {
    match (k, name.rfind('.')) {
        (0, _) => name.to_string(),
        (_, Some(dot)) => format!("{}~{k}{}", &name[..dot], &name[dot..]),
        (_, None) => format!("{name}~{k}"),
    }
}

/// A temporary name for `name` with nothing at it: `.<name>.tmp`, once a file a crash or a
/// full disk left there is removed, else `.<name>.tmp~1`, ... A directory or anything else
/// that cannot be removed at a name (another account's, planted in a shared spool
/// directory) takes that name out of use instead of stopping every later drain.
fn free_temp_name(dir: &OwnedFd, path: &Path, name: &str) -> Result<String, SpoolError> {
    for k in 0..KEEP_NAMES {
        let temp = alternate_name(&format!(".{name}.tmp"), k);
        match rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => return Ok(temp),
            Err(_) => continue,
        }
    }
    Err(fail(
        path,
        &format!("keep {name}"),
        format!("{KEEP_NAMES} things that cannot be removed hold its temporary names"),
    ))
}

/// Makes a file holding exactly `bytes` durable under `name`: written under a temporary name,
/// fsynced, renamed in, and the directory fsynced, so the name never holds a partial file
/// (a crash or a full disk leaves at most the temporary name, replaced next time). A file
/// already at `name` with the same bytes counts as kept (an earlier pass kept them). Anything
/// else at `name` (other bytes, a directory, a link) is never replaced: it may be the only
/// copy of other records (segment numbers start again at 1 after a damaged position on an
/// empty spool); the bytes go to the first free alternative name (`name` with `~1`, `~2`, ...).
pub fn keep(
    dir: &OwnedFd,
    path: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(Kept, String), SpoolError> {
    for k in 0..KEEP_NAMES {
        let candidate = alternate_name(name, k);
        if rustix::fs::statat(dir, candidate.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_err() {
            write_new(dir, path, &candidate, bytes)?;
            return Ok((Kept::New, candidate));
        }
        if let Ok(existing) = open_file(dir, path, &candidate, false) {
            let same = read_at(&existing, 0, bytes.len() as u64 + 1).is_ok_and(|d| d == bytes);
            if same {
                existing
                    .sync_all()
                    .map_err(|e| fail(path, &format!("fsync {candidate}"), e))?;
                sync(dir, path)?;
                return Ok((Kept::Already, candidate));
            }
        }
    }
    Err(fail(
        path,
        &format!("keep {name}"),
        format!("{KEEP_NAMES} files with other contents hold its names"),
    ))
}

/// Writes a new file `name` by temporary name and rename, then fsyncs the directory; a file
/// at `name` is replaced whole (never written in place).
pub fn write_new(dir: &OwnedFd, path: &Path, name: &str, bytes: &[u8]) -> Result<(), SpoolError> {
    let temp = free_temp_name(dir, path, name)?;
    let written = create_file(dir, path, &temp).and_then(|mut f| {
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| fail(path, &format!("write {name}"), e))
    });
    let renamed = written.and_then(|()| {
        rustix::fs::renameat(dir, temp.as_str(), dir, name).map_err(|e| {
            fail(
                path,
                &format!("rename {temp} to {name}"),
                io::Error::from(e),
            )
        })
    });
    if let Err(e) = renamed {
        let _ = rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty());
        return Err(e);
    }
    sync(dir, path)
}
