//! Directory creation and the directory fsyncs that make new names durable.
//!
//! A file's data is durable after `fsync(file)`; its *name* is durable only after `fsync` of
//! the directory holding it, and a newly created directory's name only after `fsync` of its
//! parent. [`DirSync`] collects those directories while a batch is written so each is synced
//! once per batch, before any outcome of the batch is reported durable.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};

use crate::files::owner;

/// Mode of directories the sink creates: the file mode plus search (x) wherever it grants
/// read, and always full access for the owner (the sink must create entries in them).
pub fn dir_mode(file_mode: u32) -> u32 {
    file_mode | ((file_mode & 0o444) >> 2) | 0o700
}

/// Flushes a directory's entries to stable storage.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Why a directory below the output directory cannot be used.
#[derive(Debug)]
pub enum DirProblem {
    /// Something another account may have put there: a symbolic link, a directory it owns, a
    /// default ACL. Permanent (redelivery would meet it again); the text says what and where.
    Refused(String),
    /// An I/O failure, or a regular file in the way (transient, as before links were checked).
    Failed(io::Error),
}

/// Opens the directory `rel` below `root` (the configured output directory), creating the
/// missing ones with `mode`, set on the open handle (`fchmod`, never by path, so a directory
/// swapped for a link after the `mkdir` cannot redirect it). `root` itself is never created
/// (a vanished, unmounted output volume fails writes instead of being recreated on the parent
/// file system).
///
/// Below `root` no symbolic link is followed, and every directory on the way must be owned by
/// the service's user; `root` by the service's user or root. None may have a default ACL
/// (files created in it would inherit entries granting other accounts access; see
/// docs/security.md, "Shared directories"). With those rules nobody else can rename, replace
/// or add entries in the directories below `root` that a record's name goes through; what
/// another account that may write `root` itself can still do (rename a directory away) is
/// caught by the directory fsyncs, which reopen by the same rules ([`DirSync::sync`]). The parent of every directory created (or found created by a racing
/// writer) is pushed to `parents`: those must be fsynced before the new names are durable.
pub fn open_below(
    root: &Path,
    rel: &Path,
    mode: u32,
    parents: &mut Vec<PathBuf>,
) -> Result<OwnedFd, DirProblem> {
    walk_below(root, rel, Some(mode), parents)
}

/// [`open_below`] without creating anything: a missing directory is an error.
pub fn open_existing_below(root: &Path, rel: &Path) -> Result<OwnedFd, DirProblem> {
    walk_below(root, rel, None, &mut Vec::new())
}

/// [`open_below`]; creates missing directories only with `create` (their mode).
fn walk_below(
    root: &Path,
    rel: &Path,
    create: Option<u32>,
    parents: &mut Vec<PathBuf>,
) -> Result<OwnedFd, DirProblem> {
    let mut dir = rustix::fs::openat(
        CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => DirProblem::Failed(io::Error::new(
            io::ErrorKind::NotFound,
            "output directory is missing",
        )),
        e => DirProblem::Failed(e.into()),
    })?;
    check_dir(&dir, "output directory", true)?;
    let mut path = root.to_path_buf();
    let mut shown = PathBuf::new();
    for name in rel.components() {
        let name = name.as_os_str();
        shown.push(name);
        let what = || format!("directory {}", shown.display());
        let next = match owner::open_dir_at(&dir, Path::new(name)) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let Some(mode) = create else {
                    return Err(DirProblem::Failed(e));
                };
                match rustix::fs::mkdirat(&dir, name, Mode::from_bits_truncate(mode)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(DirProblem::Failed(e.into())),
                }
                let fd = owner::open_dir_at(&dir, Path::new(name))
                    .map_err(|e| not_a_dir(&dir, name, &what(), e))?;
                check_dir(&fd, &what(), false)?;
                // The umask may have removed bits: the configured mode, exactly, on the handle.
                // (Also on a directory a racing writer of ours created: same mode.)
                rustix::fs::fchmod(&fd, Mode::from_bits_truncate(mode))
                    .map_err(|e| DirProblem::Failed(e.into()))?;
                parents.push(path.clone());
                path.push(name);
                dir = fd;
                continue;
            }
            Err(e) => return Err(not_a_dir(&dir, name, &what(), e)),
        };
        check_dir(&next, &what(), false)?;
        path.push(name);
        dir = next;
    }
    Ok(dir)
}

/// The owner and default-ACL rules of [`open_below`].
fn check_dir(dir: &OwnedFd, what: &str, root_too: bool) -> Result<(), DirProblem> {
    let stat = rustix::fs::fstat(dir).map_err(|e| DirProblem::Failed(e.into()))?;
    owner::check_owner(&stat, root_too).map_err(|e| DirProblem::Refused(format!("{what} {e}")))?;
    match owner::has_default_acl(dir) {
        Ok(false) => Ok(()),
        Ok(true) => Err(DirProblem::Refused(format!(
            "{what} has a default ACL (files created in it would grant other accounts \
             access); remove it (setfacl -k) or choose another directory"
        ))),
        Err(e) => Err(DirProblem::Failed(e)),
    }
}

/// An open of a name expected to be a directory failed: a link is refused, anything else fails.
fn not_a_dir(dir: &OwnedFd, name: &std::ffi::OsStr, what: &str, e: io::Error) -> DirProblem {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW);
    match st {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
            DirProblem::Refused(format!(
                "{what} is a symbolic link (links below the output directory are not followed)"
            ))
        }
        Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {
            DirProblem::Failed(io::Error::other("a non-directory is in the way"))
        }
        _ => DirProblem::Failed(e),
    }
}

impl std::fmt::Display for DirProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirProblem::Refused(why) => f.write_str(why),
            DirProblem::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Creates `dir` with all its ancestors (start-up and `svc test-sink` only) and syncs the parent
/// of each directory it created.
pub fn create_all(dir: &Path, mode: u32) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut parents = Vec::new();
    let mut missing = Vec::new();
    let mut cur = dir;
    loop {
        match fs::symlink_metadata(cur) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(cur.to_path_buf());
                match cur.parent() {
                    Some(p) if !p.as_os_str().is_empty() => cur = p,
                    _ => break,
                }
            }
            Err(e) => return Err(e),
        }
    }
    for d in missing.iter().rev() {
        match DirBuilder::new().mode(mode).create(d) {
            Ok(()) => {
                // On the handle, never by path: the name may have been swapped meanwhile.
                let fd = owner::open_dir_at(CWD, d)?;
                rustix::fs::fchmod(&fd, Mode::from_bits_truncate(mode))?;
                if let Some(p) = d.parent() {
                    parents.push(if p.as_os_str().is_empty() {
                        PathBuf::from(".")
                    } else {
                        p.to_path_buf()
                    });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    if !dir.is_dir() {
        return Err(io::Error::other("exists and is not a directory"));
    }
    for p in parents {
        sync_dir(&p)?;
    }
    Ok(())
}

/// The directories a batch must fsync, and which outcomes depend on each.
#[derive(Default)]
pub struct DirSync {
    dirs: Vec<PathBuf>,
    index: HashMap<PathBuf, usize>,
    /// (outcome index, directory index)
    deps: Vec<(usize, usize)>,
}

impl DirSync {
    /// Records that outcome `item` is durable only once `dir` is synced.
    pub fn need(&mut self, item: usize, dir: &Path) {
        let d = match self.index.get(dir) {
            Some(&d) => d,
            None => {
                self.dirs.push(dir.to_path_buf());
                self.index.insert(dir.to_path_buf(), self.dirs.len() - 1);
                self.dirs.len() - 1
            }
        };
        self.deps.push((item, d));
    }

    /// Syncs every directory once (deepest first) and returns, for each outcome whose
    /// directory failed, the directory and the error. Each directory below `root` is opened
    /// by [`open_existing_below`]'s rules, so a directory another account renamed away and
    /// replaced with a link fails the sync (and the write is retried) instead of a sync of
    /// whatever the link points to.
    pub fn sync(self, root: &Path) -> Vec<(usize, PathBuf, io::Error)> {
        let mut order: Vec<usize> = (0..self.dirs.len()).collect();
        order.sort_by_key(|&d| std::cmp::Reverse(self.dirs[d].components().count()));
        let mut failed: HashMap<usize, io::Error> = HashMap::new();
        for d in order {
            let dir = &self.dirs[d];
            let synced = match dir.strip_prefix(root) {
                Ok(rel) => open_existing_below(root, rel)
                    .map_err(|p| match p {
                        DirProblem::Failed(e) => e,
                        DirProblem::Refused(why) => io::Error::other(why),
                    })
                    .and_then(|fd| File::from(fd).sync_all()),
                Err(_) => sync_dir(dir),
            };
            if let Err(e) = synced {
                failed.insert(d, e);
            }
        }
        let mut out = Vec::new();
        for (item, d) in self.deps {
            if let Some(e) = failed.get(&d) {
                out.push((
                    item,
                    self.dirs[d].clone(),
                    io::Error::new(e.kind(), e.to_string()),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::file::tests::Scratch;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn dir_mode_adds_search_where_readable() {
        assert_eq!(dir_mode(0o640), 0o750);
        assert_eq!(dir_mode(0o644), 0o755);
        assert_eq!(dir_mode(0o600), 0o700);
        assert_eq!(dir_mode(0o440), 0o750);
    }

    fn open(root: &Path, rel: &str, parents: &mut Vec<PathBuf>) -> Result<OwnedFd, DirProblem> {
        open_below(root, Path::new(rel), 0o750, parents)
    }

    #[test]
    fn open_below_never_recreates_the_root() {
        let s = Scratch::new();
        let root = s.path().join("out");
        let mut parents = Vec::new();
        let err = open(&root, "a/b", &mut parents).unwrap_err();
        assert_eq!(err.to_string(), "output directory is missing");
        assert!(!root.exists());

        fs::create_dir(&root).unwrap();
        open(&root, "a/b", &mut parents).unwrap();
        assert!(root.join("a/b").is_dir());
        assert_eq!(parents, vec![root.clone(), root.join("a")]);
        let mode = fs::metadata(root.join("a/b")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o750);
    }

    #[test]
    fn open_below_reports_a_file_in_the_way() {
        let s = Scratch::new();
        let root = s.path().to_path_buf();
        fs::write(root.join("a"), b"x").unwrap();
        let mut parents = Vec::new();
        let err = open(&root, "a", &mut parents).unwrap_err();
        assert_eq!(err.to_string(), "a non-directory is in the way");
        let err = open(&root, "a/b", &mut parents).unwrap_err();
        assert_eq!(err.to_string(), "a non-directory is in the way");
        assert!(parents.is_empty());
    }

    #[test]
    fn open_below_never_follows_a_link() {
        let s = Scratch::new();
        let root = s.path().join("out");
        fs::create_dir_all(root.join("real")).unwrap();
        fs::create_dir(s.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(s.path().join("elsewhere"), root.join("link")).unwrap();
        let mut parents = Vec::new();
        for rel in ["link", "link/sub"] {
            match open(&root, rel, &mut parents) {
                Err(DirProblem::Refused(why)) => {
                    assert_eq!(
                        why,
                        "directory link is a symbolic link (links below the output \
                         directory are not followed)"
                    )
                }
                other => panic!("{rel}: {other:?}"),
            }
        }
        assert!(fs::read_dir(s.path().join("elsewhere"))
            .unwrap()
            .next()
            .is_none());
        open(&root, "real/sub", &mut parents).unwrap();
    }

    #[test]
    fn create_all_makes_parents_and_rejects_files() {
        let s = Scratch::new();
        let d = s.path().join("x/y/z");
        create_all(&d, 0o750).unwrap();
        assert!(d.is_dir());
        create_all(&d, 0o750).unwrap();
        fs::write(s.path().join("f"), b"x").unwrap();
        let e = create_all(&s.path().join("f"), 0o750).unwrap_err();
        assert_eq!(e.to_string(), "exists and is not a directory");
        let e = create_all(&s.path().join("f/sub"), 0o750).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(20), "ENOTDIR: {e}");
    }
}
