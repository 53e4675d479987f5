//! Opening files and directories the service trusts: without following a symbolic link at the
//! last component, without blocking on a FIFO, and checking on the open handle (never by
//! path, so the check and the use concern the same inode) what it is and who owns it.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, Stat, CWD};

/// The effective uid of this process: the service's user.
pub fn service_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Why a file the service trusts was refused. `Display` never shows its content.
#[derive(Debug)]
pub enum Refusal {
    /// The open itself failed.
    Open(io::Error),
    /// A symbolic link is at the name.
    Link,
    /// A FIFO, device, socket or directory is at the name.
    NotRegular,
    /// Owned by an account the rule does not allow.
    Owner { uid: u32, allowed: String },
    /// The file has other names (hard links): writing it in place would write them too.
    Links(u64),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Open(e) => write!(f, "cannot open: {e}"),
            Refusal::Link => f.write_str("is a symbolic link (links are not followed)"),
            Refusal::NotRegular => f.write_str("is not a regular file"),
            Refusal::Owner { uid, allowed } => {
                write!(f, "is owned by uid {uid}; it must belong to {allowed}")
            }
            Refusal::Links(n) => write!(
                f,
                "has {n} hard links; a file the service writes in place must have exactly one \
                 (another name may be planted to redirect the write)"
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// Opens `name` in `dir` (or `path` with `CWD`) read-only, not following a link at the name,
/// never blocking (a FIFO opens at once and is then refused), and requires a regular file.
pub fn open_regular_at(dir: impl AsFd, name: &Path) -> Result<(File, Stat), Refusal> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => Refusal::Link,
        e => Refusal::Open(e.into()),
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| Refusal::Open(e.into()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(Refusal::NotRegular);
    }
    Ok((File::from(fd), stat))
}

/// [`open_regular_at`] for a path.
pub fn open_regular(path: &Path) -> Result<(File, Stat), Refusal> {
    open_regular_at(CWD, path)
}

/// Requires `stat`'s owner to be the service's user, or root when `root_too`.
pub fn check_owner(stat: &Stat, root_too: bool) -> Result<(), Refusal> {
    let me = service_uid();
    let uid = stat.st_uid;
    if uid == me || (root_too && uid == 0) {
        return Ok(());
    }
    let allowed = match (root_too, me) {
        (_, 0) | (false, _) => format!("the service's user (uid {me})"),
        (true, _) => format!("the service's user (uid {me}) or root"),
    };
    Err(Refusal::Owner { uid, allowed })
}

/// Why a directory path is one another account could change: `dir` itself or any entry the
/// kernel passes through to reach it, walked one component at a time as the kernel resolves it
/// (every directory, every symbolic link and the directory each link sits in, again inside
/// each link's target), that is owned by another account than the service's user or root, or
/// (a directory) writable by other accounts without the sticky bit. Such an account could
/// rename what the service keeps there (or the whole directory) and put an older copy back, or
/// point a link elsewhere (a link inside another account's directory, or through
/// `/proc/<pid>/cwd` of another account's process). `None`: only the service's user or root
/// can change it. The text names the place and the reason.
pub fn changeable_by_others(dir: &Path) -> Option<String> {
    let absolute = match std::env::current_dir() {
        Ok(cwd) => cwd.join(dir),
        Err(e) => return Some(format!("{}: {e}", dir.display())),
    };
    let mut walk = Walk {
        resolved: PathBuf::from("/"),
        left: absolute
            .components()
            .map(Component::as_os_str)
            .map(PathBuf::from)
            .collect(),
        links: 0,
    };
    let root = entry(Path::new("/")).err();
    root.or_else(|| std::iter::from_fn(|| walk.step()).find_map(Result::err))
}

/// [`changeable_by_others`] for the directory a file of the service lives in (`.` for a bare
/// name): `Err` with that directory as written (to name it) and the reason.
pub fn file_directory_changeable_by_others(file: &Path) -> Result<(), (&Path, String)> {
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match changeable_by_others(dir) {
        None => Ok(()),
        Some(why) => Err((dir, why)),
    }
}

/// Most symbolic links one path may pass through (the kernel's own bound, `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// The resolution of a path, one component at a time.
struct Walk {
    /// Where the walk is: a path without links, every entry on it checked.
    resolved: PathBuf,
    /// The components still to walk, the first next.
    left: std::collections::VecDeque<PathBuf>,
    links: usize,
}

impl Walk {
    /// Walks one component: `None` at the end, `Err` naming an entry others could change.
    fn step(&mut self) -> Option<Result<(), String>> {
        let part = self.left.pop_front()?;
        match part.as_os_str().to_str() {
            Some("/") => self.resolved = PathBuf::from("/"),
            Some(".") => {}
            Some("..") => {
                self.resolved.pop();
            }
            _ => return Some(self.enter(&part)),
        }
        Some(Ok(()))
    }

    /// Checks the entry `name` below where the walk is, and goes into it (through a link: its
    /// target's components come next).
    fn enter(&mut self, name: &Path) -> Result<(), String> {
        let here = self.resolved.join(name);
        let is_link = entry(&here)?;
        if !is_link {
            self.resolved = here;
            return Ok(());
        }
        self.links += 1;
        if self.links > MAX_LINKS {
            return Err(format!(
                "{}: more than {MAX_LINKS} symbolic links",
                here.display()
            ));
        }
        let target = std::fs::read_link(&here).map_err(|e| format!("{}: {e}", here.display()))?;
        for part in target.components().rev() {
            self.left.push_front(PathBuf::from(part.as_os_str()));
        }
        Ok(())
    }
}

/// Checks one entry of a walked path (see [`changeable`]); `Ok(true)` for a symbolic link.
fn entry(path: &Path) -> Result<bool, String> {
    let stat = rustix::fs::lstat(path)
        .map_err(|e| format!("{}: {}", path.display(), io::Error::from(e)))?;
    match changeable(&stat) {
        Some(why) => Err(format!("{} {why}", path.display())),
        None => Ok(FileType::from_raw_mode(stat.st_mode) == FileType::Symlink),
    }
}

/// [`changeable_by_others`] for one entry of the path.
fn changeable(stat: &Stat) -> Option<String> {
    if let Err(e) = check_owner(stat, true) {
        return Some(e.to_string());
    }
    if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
        return None; // its target is walked and checked next
    }
    let mode = stat.st_mode & 0o7777;
    (mode & 0o022 != 0 && mode & 0o1000 == 0)
        .then(|| format!("can be written by other accounts (mode {mode:04o}) and is not sticky"))
}

/// Requires the file of `stat` to have exactly one name. The one rule for every file the
/// service opens to write in place (today the spool's position, lock and segments, through
/// `sink::spool::dir`): a hard link planted at such a name, by anyone who could write the
/// directory once, would make the write land in another file of the service's user. Files
/// the service creates (`O_EXCL`, or `O_TMPFILE` linked in: the file sink's, the quarantine
/// and rejected files) or replaces whole by `rename` (the metrics snapshot, the textfile
/// output, [`super::atomic`]) are never written through a name someone else made.
pub fn check_single_link(stat: &Stat) -> Result<(), Refusal> {
    #[allow(clippy::unnecessary_cast)] // `st_nlink` is u32 on some targets
    let links = stat.st_nlink as u64;
    if links == 1 {
        Ok(())
    } else {
        Err(Refusal::Links(links))
    }
}

/// Reads a small private file the service wrote itself (a replay state, a checkpoint head):
/// `None` when there is none; refused unless it is a regular file of the service's user, with
/// one name and no access for other accounts, never through a link or by waiting on a FIFO,
/// and at most `max` bytes. Errors name the reason, not the file (the caller does).
pub fn read_private(path: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    let (file, stat) = match open_regular(path) {
        Ok(opened) => opened,
        Err(Refusal::Open(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    check_owner(&stat, false)
        .and_then(|()| check_single_link(&stat))
        .map_err(|e| e.to_string())?;
    if stat.st_mode & 0o077 != 0 {
        return Err(format!(
            "mode {:o} gives other accounts access; the service writes it 0600",
            stat.st_mode & 0o7777
        ));
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(Some(bytes))
}

/// Opens the directory `name` in `dir` without following a link at the name.
pub fn open_dir_at(dir: impl AsFd, name: &Path) -> io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// True when the directory has a default ACL: what is created in it inherits its entries
/// (another user may be granted read access whatever mode the creator asks for).
pub fn has_default_acl(dir: impl AsFd) -> io::Result<bool> {
    match rustix::fs::fgetxattr_query(dir, "system.posix_acl_default") {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::NODATA | rustix::io::Errno::OPNOTSUPP) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Removes an access ACL the file inherited from its directory's default ACL, so its mode
/// bits are its whole permission set.
pub fn strip_access_acl(file: impl AsFd) -> io::Result<()> {
    match rustix::fs::fremovexattr(file, "system.posix_acl_access") {
        Ok(()) | Err(rustix::io::Errno::NODATA | rustix::io::Errno::OPNOTSUPP) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_fifos_and_directories_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("f"), b"x").unwrap();
        std::os::unix::fs::symlink(d.join("f"), d.join("l")).unwrap();
        rustix::fs::mknodat(CWD, d.join("p"), FileType::Fifo, Mode::RUSR | Mode::WUSR, 0).unwrap();
        assert!(open_regular(&d.join("f")).is_ok());
        assert!(matches!(open_regular(&d.join("l")), Err(Refusal::Link)));
        assert!(matches!(
            open_regular(&d.join("p")),
            Err(Refusal::NotRegular)
        ));
        assert!(matches!(open_regular(d), Err(Refusal::NotRegular)));
        let (_, stat) = open_regular(&d.join("f")).unwrap();
        check_owner(&stat, false).unwrap();
        check_single_link(&stat).unwrap();
        std::fs::hard_link(d.join("f"), d.join("h")).unwrap();
        let (_, stat) = open_regular(&d.join("h")).unwrap();
        let err = check_single_link(&stat).unwrap_err().to_string();
        assert!(err.contains("has 2 hard links"), "{err}");
    }
}
