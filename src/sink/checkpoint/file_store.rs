//! The file sink's checkpoint store ([`FileStore`]) and the bounded, link-refusing reads the
//! stores share.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    checkpoints_bound, records_bound, records_of, shown_path, CheckpointStore, FILE_CHECKPOINT_DIR,
    MAX_RECORD_FILE_BYTES,
};
use crate::message::protection::checkpoint::MAX_CHECKPOINT_BYTES;
use crate::message::protection::checkpoint_audit::StoredRecord;
use crate::message::protection::custody::Custodian;
use crate::text::peer::PeerText;

/// Reads a regular file (never through a link: opened `O_NOFOLLOW` and checked on the open
/// handle) up to `max` bytes; `dir` is the directory `name` is opened in.
pub(super) fn read_bounded_at(dir: impl AsFd, name: &Path, max: u64) -> Result<String, String> {
    let (file, _) = crate::files::owner::open_regular_at(dir, name).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(max + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read: {e}"))?;
    if text.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(text)
}

/// [`read_bounded_at`] for a path.
pub(super) fn read_bounded(path: &Path, max: u64) -> Result<String, String> {
    read_bounded_at(rustix::fs::CWD, path, max)
}

/// The file sink's checkpoints: `<directory>/.svc-checkpoints/<hex runner id>-<index>.json`,
/// written as records are (temporary name, fsync, link to the final name, which never
/// replaces an existing checkpoint, directory fsync).
#[derive(Debug, Clone)]
pub struct FileStore {
    pub root: PathBuf,
    pub file_mode: u32,
}

impl FileStore {
    fn dir(&self) -> PathBuf {
        self.root.join(FILE_CHECKPOINT_DIR)
    }

    fn walk(
        &self,
        dir: &Path,
        depth: usize,
        seal: Option<&Custodian>,
        out: &mut Vec<StoredRecord>,
    ) -> Result<(), String> {
        let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", shown_path(dir)))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", shown_path(dir)))?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue; // temporary files and the checkpoint directory
            }
            let path = entry.path();
            let place = path
                .strip_prefix(&self.root)
                .unwrap_or(&path)
                .display()
                .to_string();
            let ft = entry.file_type().map_err(|e| format!("{place}: {e}"))?;
            if ft.is_dir() && depth < 32 {
                self.walk(&path, depth + 1, seal, out)?;
            } else if ft.is_file() {
                match read_bounded(&path, MAX_RECORD_FILE_BYTES) {
                    Ok(text) => {
                        records_of(&place, &text, seal, out);
                        records_bound(out.len())?;
                    }
                    Err(e) => out.push(StoredRecord {
                        place,
                        read: Err(e),
                    }),
                }
            }
        }
        Ok(())
    }
}

impl FileStore {
    /// The checkpoint directory, opened without following a link at its name.
    fn open_dir(&self) -> std::io::Result<OwnedFd> {
        let root = rustix::fs::open(
            &self.root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let fd = rustix::fs::openat(
            &root,
            FILE_CHECKPOINT_DIR,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                std::io::Error::other("not a directory (a link or a file at that name): refused")
            }
            e => e.into(),
        })?;
        Ok(fd)
    }
}

/// A put's temporary name for checkpoint `name`: unique between processes and between the
/// threads of one process (the checkpoint thread and a drain's put of the same name: one
/// put's error path never unlinks another's file; atk51b finding 1).
pub(super) fn temp_name(name: &str) -> String {
    static PUTS: AtomicU64 = AtomicU64::new(0);
    format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        PUTS.fetch_add(1, Ordering::Relaxed)
    )
}

impl CheckpointStore for FileStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.dir();
        let mode = crate::sink::file::durable::dir_mode(self.file_mode);
        match fs::DirBuilder::new().mode(mode).create(&dir) {
            Ok(()) => {
                crate::sink::file::durable::sync_dir(&self.root).map_err(|e| e.to_string())?
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("create {FILE_CHECKPOINT_DIR}: {e}")),
        }
        let name = checkpoint_name(runner_id, index);
        let tmp = temp_name(&name);
        let dirfd = self
            .open_dir()
            .map_err(|e| format!("open {FILE_CHECKPOINT_DIR}: {e}"))?;
        let write = || -> std::io::Result<()> {
            let fd = rustix::fs::openat(
                &dirfd,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(self.file_mode),
            )?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(self.file_mode))?;
            let mut f = fs::File::from(fd);
            f.write_all(bytes)?;
            f.sync_all()?;
            // A link, not a rename: an existing checkpoint of that name is never replaced.
            rustix::fs::linkat(
                &dirfd,
                tmp.as_str(),
                &dirfd,
                name.as_str(),
                rustix::fs::AtFlags::empty(),
            )?;
            rustix::fs::unlinkat(&dirfd, tmp.as_str(), rustix::fs::AtFlags::empty())?;
            rustix::fs::fsync(&dirfd)?;
            Ok(())
        };
        write().map_err(|e| {
            let _ = rustix::fs::unlinkat(&dirfd, tmp.as_str(), rustix::fs::AtFlags::empty());
            format!("write {FILE_CHECKPOINT_DIR}/{name}: {e}")
        })
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints("")
    }

    /// The files named for `runner_id` only (the name is the runner id in hex, then `-`, which
    /// hex never holds: no other runner's name begins so).
    fn chain(&self, runner_id: &str) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints(&format!(
            "{}-",
            crate::text::hex::lower(runner_id.as_bytes())
        ))
    }

    /// The one file named for (`runner_id`, `index`).
    fn get(&self, runner_id: &str, index: u64) -> Result<Option<String>, String> {
        let name = checkpoint_name(runner_id, index);
        let dirfd = match self.open_dir() {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{FILE_CHECKPOINT_DIR}: {e}")),
        };
        let none = rustix::fs::AtFlags::SYMLINK_NOFOLLOW;
        match rustix::fs::statat(&dirfd, name.as_str(), none) {
            Err(rustix::io::Errno::NOENT) => Ok(None),
            _ => read_bounded_at(&dirfd, Path::new(&name), MAX_CHECKPOINT_BYTES)
                .map(Some)
                .map_err(|e| format!("{FILE_CHECKPOINT_DIR}/{name}: {e}")),
        }
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.scan(None)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        let mut out = Vec::new();
        self.walk(&self.root, 0, seal, &mut out)?;
        Ok(out)
    }
}

impl FileStore {
    /// The checkpoint files whose names begin with `prefix`, as (place, text), bounded.
    fn read_checkpoints(&self, prefix: &str) -> Result<Vec<(String, String)>, String> {
        let dirfd = match self.open_dir() {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{FILE_CHECKPOINT_DIR}: {e}")),
        };
        let listed = rustix::fs::openat(
            &dirfd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("{FILE_CHECKPOINT_DIR}: {e}"))?;
        let entries = rustix::fs::Dir::read_from(&listed)
            .map_err(|e| format!("{FILE_CHECKPOINT_DIR}: {e}"))?;
        let (mut out, mut total) = (Vec::new(), 0usize);
        for entry in entries {
            let entry = entry.map_err(|e| format!("{FILE_CHECKPOINT_DIR}: {e}"))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") || !name.starts_with(prefix) {
                continue;
            }
            let place = format!("{FILE_CHECKPOINT_DIR}/{}", PeerText::new(&name));
            // An unreadable one is still a checkpoint the audit must count: refused, not gone.
            let text =
                read_bounded_at(&dirfd, Path::new(&name), MAX_CHECKPOINT_BYTES).unwrap_or_default();
            checkpoints_bound(&mut total, &text)?;
            out.push((place, text));
        }
        out.sort();
        Ok(out)
    }
}

/// The file name of checkpoint `index` of `runner_id`.
fn checkpoint_name(runner_id: &str, index: u64) -> String {
    format!(
        "{}-{index:020}.json",
        crate::text::hex::lower(runner_id.as_bytes())
    )
}
