//! Directory creation and the directory fsyncs that make new names durable.
//!
//! A file's data is durable after `fsync(file)`; its *name* is durable only after `fsync` of
//! the directory holding it, and a newly created directory's name only after `fsync` of its
//! parent. [`DirSync`] collects those directories while a batch is written so each is synced
//! once per batch, before any outcome of the batch is reported durable.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of directories the sink creates: the file mode plus search (x) wherever it grants
/// read, and always full access for the owner (the sink must create entries in them).
pub fn dir_mode(file_mode: u32) -> u32 {
    file_mode | ((file_mode & 0o444) >> 2) | 0o700
}

/// Flushes a directory's entries to stable storage.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and its missing ancestors, but never `root` or anything above it: `root` is
/// the configured output directory, created only at start-up, so a vanished (unmounted) output
/// volume fails writes instead of being recreated on the parent file system. The parent of
/// every directory created here (or found created by a racing writer) is pushed to `parents`:
/// those must be fsynced before the new names are durable.
pub fn create_below(
    root: &Path,
    dir: &Path,
    mode: u32,
    parents: &mut Vec<PathBuf>,
) -> io::Result<()> {
    if dir == root || !dir.starts_with(root) {
        return if dir.is_dir() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                "output directory is missing",
            ))
        };
    }
    let parent = dir.parent().unwrap_or(root);
    match DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {
            // The umask may have removed bits; the configured mode is applied exactly.
            fs::set_permissions(dir, Permissions::from_mode(mode))?;
            parents.push(parent.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if dir.is_dir() {
                // Possibly created by a racing writer that has not synced its parent yet.
                parents.push(parent.to_path_buf());
                Ok(())
            } else {
                Err(io::Error::other("a non-directory is in the way"))
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            create_below(root, parent, mode, parents)?;
            create_below(root, dir, mode, parents)
        }
        Err(e) => Err(e),
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
                fs::set_permissions(d, Permissions::from_mode(mode))?;
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
    /// directory failed, the directory and the error.
    pub fn sync(self) -> Vec<(usize, PathBuf, io::Error)> {
        let mut order: Vec<usize> = (0..self.dirs.len()).collect();
        order.sort_by_key(|&d| std::cmp::Reverse(self.dirs[d].components().count()));
        let mut failed: HashMap<usize, io::Error> = HashMap::new();
        for d in order {
            if let Err(e) = sync_dir(&self.dirs[d]) {
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

    #[test]
    fn dir_mode_adds_search_where_readable() {
        assert_eq!(dir_mode(0o640), 0o750);
        assert_eq!(dir_mode(0o644), 0o755);
        assert_eq!(dir_mode(0o600), 0o700);
        assert_eq!(dir_mode(0o440), 0o750);
    }

    #[test]
    fn create_below_never_recreates_the_root() {
        let s = Scratch::new();
        let root = s.path().join("out");
        let mut parents = Vec::new();
        let err = create_below(&root, &root.join("a/b"), 0o750, &mut parents).unwrap_err();
        assert_eq!(err.to_string(), "output directory is missing");
        assert!(!root.exists());

        fs::create_dir(&root).unwrap();
        create_below(&root, &root.join("a/b"), 0o750, &mut parents).unwrap();
        assert!(root.join("a/b").is_dir());
        assert_eq!(parents, vec![root.clone(), root.join("a")]);
        let mode = fs::metadata(root.join("a/b")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o750);
    }

    #[test]
    fn create_below_reports_a_file_in_the_way() {
        let s = Scratch::new();
        let root = s.path().to_path_buf();
        fs::write(root.join("a"), b"x").unwrap();
        let mut parents = Vec::new();
        let err = create_below(&root, &root.join("a"), 0o750, &mut parents).unwrap_err();
        assert_eq!(err.to_string(), "a non-directory is in the way");
        let err = create_below(&root, &root.join("a/b"), 0o750, &mut parents).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(20), "ENOTDIR: {err}");
        assert!(parents.is_empty());
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
