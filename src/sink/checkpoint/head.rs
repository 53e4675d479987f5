//! The runner's own copy of its checkpoint chain head (`custody.checkpoints.head_file`,
//! default `<config file>.custody-head`): kept outside the sink, so a sink whose chain was
//! cut back, removed or emptied is noticed at start instead of being continued from the cut.
//!
//! One JSON object, written atomically with mode 0600 after every checkpoint:
//! `{"schema":"svc.custody.checkpoint-head.v1","runner_id":"..","index":N,"digest":"<hex>"}`.
//! Read as the replay state file is: no link followed, a regular file of the service's user
//! with one name and no access for other accounts, bounded, in a directory only the service's
//! user or root can change.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const HEAD_SCHEMA: &str = "svc.custody.checkpoint-head.v1";
/// Largest head file read.
pub const MAX_HEAD_BYTES: u64 = 4096;

/// A chain head: the last checkpoint's index and body digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    pub schema: String,
    pub runner_id: String,
    pub index: u64,
    pub digest: String,
}

impl Head {
    pub fn new(runner_id: &str, index: u64, digest: &str) -> Head {
        Head {
            schema: HEAD_SCHEMA.into(),
            runner_id: runner_id.into(),
            index,
            digest: digest.into(),
        }
    }

    /// No checkpoint yet (an empty digest, index 0): written at a runner's first start, so a
    /// kill -9 between the first checkpoint's put and the head file's write finds a head the
    /// chain extends by one, not a missing head file (which means lost: atk53b finding 3).
    pub fn none_yet(runner_id: &str) -> Head {
        Head::new(runner_id, 0, "")
    }

    /// Checkpoint 0's put begun (an empty digest, index 1: one checkpoint may exist), written
    /// before that put: a start that finds no checkpoint where it can read (a spool drained,
    /// its target down) then knows checkpoint 0 may be in the target, and does not sign
    /// another checkpoint 0 (atk54 finding 5).
    pub fn first_put_begun(runner_id: &str) -> Head {
        Head::new(runner_id, 1, "")
    }

    /// No checkpoint's head known: [`Head::none_yet`] or [`Head::first_put_begun`].
    pub fn is_none_yet(&self) -> bool {
        self.digest.is_empty()
    }

    /// [`Head::first_put_begun`]: checkpoint 0 may have been put.
    pub fn may_hold_checkpoint_0(&self) -> bool {
        self.digest.is_empty() && self.index == 1
    }

    /// `RUNNER:INDEX:DIGEST`, as `svc verify-custody --head` takes it.
    pub fn arg(&self) -> String {
        format!("{}:{}:{}", self.runner_id, self.index, self.digest)
    }
}

/// Where the head lives.
#[derive(Debug, Clone)]
pub struct HeadFile {
    pub path: PathBuf,
}

impl HeadFile {
    pub fn new(path: &Path) -> Result<HeadFile, String> {
        if path.as_os_str().is_empty() {
            return Err("custody.checkpoints.head_file: not set".into());
        }
        Ok(HeadFile {
            path: path.to_path_buf(),
        })
    }

    fn shown(&self) -> String {
        format!(
            "custody.checkpoints.head_file {}",
            crate::text::peer::PeerText::new(&self.path.to_string_lossy())
        )
    }

    /// Refuses a head file whose directory another account can change (any directory, link
    /// or link's directory on its path: `files::owner::changeable_by_others`): it could put an
    /// older head of the runner's own back, and a chain cut back to it would be continued at
    /// start (atk50a finding 3; the replay state's rule).
    fn check_directory(&self) -> Result<(), String> {
        crate::files::owner::file_directory_changeable_by_others(&self.path).map_err(
            |(dir, why)| {
                format!(
                    "{}: its directory {}: {why}: another account could put an older head back \
                 and have a chain cut back to it continued; keep it in a directory only the \
                 service's user (or root) can write, on a path only they can change",
                    self.shown(),
                    crate::text::peer::PeerText::new(&dir.to_string_lossy())
                )
            },
        )
    }

    /// The stored head; `None` when there is no file yet.
    pub fn read(&self) -> Result<Option<Head>, String> {
        let shown = self.shown();
        self.check_directory()?;
        let Some(text) = crate::files::owner::read_private(&self.path, MAX_HEAD_BYTES)
            .map_err(|e| format!("{shown}: {e}"))?
        else {
            return Ok(None);
        };
        let head: Head = serde_json::from_slice(&text)
            .map_err(|e| format!("{shown}: not a checkpoint head file ({e})"))?;
        if head.schema != HEAD_SCHEMA {
            return Err(format!("{shown}: schema is not {HEAD_SCHEMA}"));
        }
        if head.is_none_yet() && head.index > 1 {
            return Err(format!(
                "{shown}: not a checkpoint head file (no digest, index {})",
                head.index
            ));
        }
        Ok(Some(head))
    }

    /// Replaces the head atomically and durably, mode 0600.
    pub fn write(&self, head: &Head) -> Result<(), String> {
        self.check_directory()?;
        let mut bytes = serde_json::to_vec(head).unwrap_or_default();
        bytes.push(b'\n');
        crate::files::atomic::write_atomically(&self.path, &bytes, 0o600)
            .map_err(|e| format!("{}: cannot be written: {e}", self.shown()))
    }
}

/// The gaps a stop could not have listed by a stored checkpoint (the store failing at the
/// last cut: atk56 finding 4), kept beside the head file (`<head_file>.gaps`, the head file's
/// rules) until the next start lists them. One JSON object:
/// `{"schema":"svc.custody.kept-gaps.v1","runner_id":"..","gaps":[[stream,incarnation,seq,reason],..]}`.
pub const KEPT_GAPS_SCHEMA: &str = "svc.custody.kept-gaps.v1";
/// Gaps kept at most; past it each is logged with its sequence as listed nowhere.
pub const MAX_KEPT_GAPS: usize = 65_536;
/// Largest kept-gaps file read: [`MAX_KEPT_GAPS`] entries of a stream name and incarnation of
/// up to 256 bytes each.
pub const MAX_KEPT_GAPS_BYTES: u64 = 40 * 1024 * 1024;

/// One kept gap: (stream, incarnation, sequence, reason).
pub type KeptGap = (String, String, u64, String);

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeptGaps {
    schema: String,
    runner_id: String,
    gaps: Vec<KeptGap>,
}

impl HeadFile {
    fn gaps_path(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".gaps");
        PathBuf::from(name)
    }

    fn gaps_shown(&self) -> String {
        format!(
            "custody checkpoints' kept gaps {}",
            crate::text::peer::PeerText::new(&self.gaps_path().to_string_lossy())
        )
    }

    /// The gaps a stop kept for runner `runner_id` (none without a file).
    pub fn read_gaps(&self, runner_id: &str) -> Result<Vec<KeptGap>, String> {
        let shown = self.gaps_shown();
        self.check_directory()?;
        let Some(text) = crate::files::owner::read_private(&self.gaps_path(), MAX_KEPT_GAPS_BYTES)
            .map_err(|e| format!("{shown}: {e}"))?
        else {
            return Ok(Vec::new());
        };
        let kept: KeptGaps = serde_json::from_slice(&text)
            .map_err(|e| format!("{shown}: not a kept-gaps file ({e})"))?;
        if kept.schema != KEPT_GAPS_SCHEMA {
            return Err(format!("{shown}: schema is not {KEPT_GAPS_SCHEMA}"));
        }
        if kept.runner_id != runner_id {
            return Err(format!(
                "{shown}: kept by runner {}, not this one ({})",
                crate::text::peer::PeerText::new(&kept.runner_id),
                crate::text::peer::PeerText::new(runner_id)
            ));
        }
        if kept.gaps.len() > MAX_KEPT_GAPS {
            return Err(format!("{shown}: more than {MAX_KEPT_GAPS} gaps"));
        }
        Ok(kept.gaps)
    }

    /// Keeps `gaps` (at most [`MAX_KEPT_GAPS`]) atomically and durably, mode 0600, replacing
    /// what was kept.
    pub fn write_gaps(&self, runner_id: &str, gaps: Vec<KeptGap>) -> Result<(), String> {
        self.check_directory()?;
        let kept = KeptGaps {
            schema: KEPT_GAPS_SCHEMA.into(),
            runner_id: runner_id.into(),
            gaps,
        };
        let mut bytes = serde_json::to_vec(&kept).unwrap_or_default();
        bytes.push(b'\n');
        crate::files::atomic::write_atomically(&self.gaps_path(), &bytes, 0o600)
            .map_err(|e| format!("{}: cannot be written: {e}", self.gaps_shown()))
    }

    /// Removes the kept gaps once a stored checkpoint lists them (nothing when none are kept).
    pub fn remove_gaps(&self) -> Result<(), String> {
        match std::fs::remove_file(self.gaps_path()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: cannot be removed: {e}", self.gaps_shown())),
        }
    }
}

/// Parses `RUNNER:INDEX:DIGEST` (the runner id may itself hold `:`).
pub fn parse_head_arg(arg: &str) -> Result<Head, String> {
    let bad = |why: &str| {
        format!(
            "--head {}: {why} (give RUNNER:INDEX:DIGEST)",
            crate::text::peer::PeerText::new(arg)
        )
    };
    let mut parts = arg.rsplitn(3, ':');
    let digest = parts.next().unwrap_or_default();
    let index = parts.next().ok_or_else(|| bad("no index"))?;
    let runner = parts.next().ok_or_else(|| bad("no runner id"))?;
    let index: u64 = index.parse().map_err(|_| bad("index is not a number"))?;
    let hex = digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex {
        return Err(bad("digest is not 64 lowercase hex digits"));
    }
    if runner.is_empty() {
        return Err(bad("empty runner id"));
    }
    Ok(Head::new(runner, index, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_args_and_files() {
        let d = "ab".repeat(32);
        let h = parse_head_arg(&format!("run:ner:7:{d}")).unwrap();
        assert_eq!((h.runner_id.as_str(), h.index), ("run:ner", 7));
        assert_eq!(parse_head_arg(&h.arg()).unwrap(), h);
        assert!(parse_head_arg("r:x:ab").is_err());
        assert!(parse_head_arg(&format!("r:1:{}", "AB".repeat(32))).is_err());
        let dir = tempfile::tempdir().unwrap();
        let f = HeadFile::new(&dir.path().join("c.json.custody-head")).unwrap();
        assert_eq!(f.read().unwrap(), None);
        f.write(&h).unwrap();
        assert_eq!(f.read().unwrap(), Some(h));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&f.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(f.read().unwrap_err().contains("mode 644"));
        let link = HeadFile::new(&dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(&f.path, &link.path).unwrap();
        assert!(link.read().is_err());
    }

    #[test]
    fn kept_gaps_are_read_back_by_their_runner_only() {
        let dir = tempfile::tempdir().unwrap();
        let f = HeadFile::new(&dir.path().join("c.json.custody-head")).unwrap();
        assert_eq!(f.read_gaps("r1").unwrap(), Vec::<KeptGap>::new());
        let gaps = vec![(
            "S".to_string(),
            "i1".to_string(),
            7,
            "terminated".to_string(),
        )];
        f.write_gaps("r1", gaps.clone()).unwrap();
        assert_eq!(f.read_gaps("r1").unwrap(), gaps);
        let other = f.read_gaps("r2").unwrap_err();
        assert!(
            other.contains("kept by runner r1, not this one (r2)"),
            "{other}"
        );
        use std::os::unix::fs::PermissionsExt;
        let path = dir.path().join("c.json.custody-head.gaps");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, b"{\"schema\":\"x\"}").unwrap();
        assert!(f
            .read_gaps("r1")
            .unwrap_err()
            .contains("not a kept-gaps file"));
        f.remove_gaps().unwrap();
        f.remove_gaps().unwrap();
        assert_eq!(f.read_gaps("r1").unwrap(), Vec::<KeptGap>::new());
    }
}
