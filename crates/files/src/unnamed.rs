//! Unnamed files: `open(dir, O_TMPFILE)`, written and fsynced with no name anyone could open,
//! replace or plant a link at, then given a name with `linkat`, which never follows a link at
//! the new name and fails with `EEXIST` when the name is taken (exclusive creation without a
//! check-then-write race). A crash before the link leaves nothing behind.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, CWD};

/// An unnamed file in the directory `dir` (a descriptor), write-only, with `mode` reduced by
/// the umask (callers set the exact mode on the handle afterwards).
pub fn open_in(dir: impl AsFd, mode: u32) -> io::Result<File> {
    rustix::fs::openat(
        dir,
        ".",
        OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map(File::from)
    .map_err(io::Error::from)
}

/// Gives the unnamed `file` the name `name` in the directory `dir`:
/// `linkat(<fd>, "", AT_EMPTY_PATH)` where the kernel allows that (Linux 6.10 and later for a
/// file the process opened itself; before, only with `CAP_DAC_READ_SEARCH`), else
/// `linkat("/proc/self/fd/<fd>", AT_SYMLINK_FOLLOW)`, which walks a path through /proc for
/// every file (a quarter of `linkat`'s time in a profile of the file sink's writers;
/// docs/sinks/file.md, Performance). `empty_path` starts true and is cleared the first time
/// the kernel refuses the empty path.
pub fn link(file: &File, dir: impl AsFd, name: &Path, empty_path: &AtomicBool) -> io::Result<()> {
    let dir = dir.as_fd();
    if empty_path.load(Ordering::Relaxed) {
        match rustix::fs::linkat(file, "", dir, name, AtFlags::EMPTY_PATH) {
            // A refusal (ENOENT, as for a missing directory): decided below.
            Err(rustix::io::Errno::NOENT) => {}
            linked => return linked.map_err(io::Error::from),
        }
    }
    let linked = rustix::fs::linkat(
        CWD,
        format!("/proc/self/fd/{}", file.as_raw_fd()),
        dir,
        name,
        AtFlags::SYMLINK_FOLLOW,
    );
    // The same link through /proc worked: the empty path was refused, not the name.
    if linked.is_ok() && empty_path.swap(false, Ordering::Relaxed) {
        log::debug!("this kernel refuses linkat(AT_EMPTY_PATH); linking through /proc");
    }
    linked.map_err(io::Error::from)
}

/// `O_TMPFILE` refused by the kernel or the file system (not a failure of this write).
pub fn unsupported(e: &io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL)
    )
}

/// `/proc/self/fd` is there (the fallback of [`link`] needs it).
pub fn proc_fd_available() -> bool {
    Path::new("/proc/self/fd").is_dir()
}
