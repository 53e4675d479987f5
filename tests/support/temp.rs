//! Per-test directories (the benches include this file too).

use std::path::{Path, PathBuf};

/// A test's own directory below the system temp directory (`tempfile`), removed when dropped;
/// the tag in its name tells whose it is when a crashed run leaves it behind.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("svc-{tag}-"))
                .tempdir()
                .unwrap(),
        )
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The path of `name` inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// Writes `text` to `name` inside the directory; returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}
