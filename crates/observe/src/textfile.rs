//! The textfile connector (`scrape-textfile`): renders the approved metrics into a `*.prom`
//! file for the node exporter's textfile collector, written atomically and with an exact mode
//! ([`svc_files::atomic`], [`TEXTFILE_MODE`]), so the collector never reads a torn file.
//!
//! Failing closed: when the snapshot is missing, invalid or stale, or the subject-family pass
//! fails closed, the file is replaced by one comment line saying the metrics are withheld and
//! the command fails (exit 1): the previous values must not keep being served as if current.
//! A disabled policy needs no snapshot and writes one comment line saying so (exit 0).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::exposition::{self, Options};
use crate::families::Overflow;
use crate::policy::Policy;
use crate::select::{self, Stale};
use svc_files::atomic::write_atomically;
use svc_snapshot::{Snapshot, MAX_SNAPSHOT_BYTES};

/// Mode of the textfile output (`svc.prom`, the broker-monitoring file): readable by everyone,
/// because the node exporter runs as its own user, and writable by the exporter's user only.
/// Set exactly, whatever the umask. The content is what the node exporter serves anyway.
pub const TEXTFILE_MODE: u32 = 0o644;

/// A snapshot that could not be used.
#[derive(Debug)]
pub enum SnapshotError {
    /// The file could not be read (missing, permissions).
    Read { path: PathBuf, source: io::Error },
    /// The file is not a valid `svc.metrics.snapshot.v1` document.
    Invalid { path: PathBuf, reason: String },
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Read { path, source } => {
                write!(f, "cannot read snapshot {}: {source}", path.display())
            }
            SnapshotError::Invalid { path, reason } => {
                write!(f, "snapshot {} is not usable: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for SnapshotError {}

/// Reads, parses and checks a snapshot file, trusting nothing in it: the file must be a
/// regular file (opened non-blocking, so a FIFO in its place cannot hang the reader) of at
/// most [`MAX_SNAPSHOT_BYTES`] (a bigger one is refused unread), a valid document, and dated
/// no later than [`svc_snapshot::MAX_CLOCK_SKEW_SECONDS`] ahead of now ([`Snapshot::check_times`]): a
/// snapshot from the future would never go stale. It must belong to a trusted account
/// (`check_owner` below) and hold only plausible values ([`Snapshot::check_values`]).
pub fn read_snapshot(path: &Path, expected_owner: Option<u32>) -> Result<Snapshot, SnapshotError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read = |source| SnapshotError::Read {
        path: path.to_path_buf(),
        source,
    };
    let invalid = |reason: String| SnapshotError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(read)?;
    let meta = file.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    check_owner(path, &meta, expected_owner).map_err(invalid)?;
    let too_big = |len: u64| {
        invalid(format!(
            "the file is {len} bytes, over the {MAX_SNAPSHOT_BYTES}-byte limit for snapshots"
        ))
    };
    if meta.len() > MAX_SNAPSHOT_BYTES {
        return Err(too_big(meta.len()));
    }
    // The file may grow between the stat and the read: never read past the limit.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_SNAPSHOT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_SNAPSHOT_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|_| invalid("the file is not UTF-8".into()))?;
    // The parser's message quotes the file (an unknown field name, a wrong schema): peer text.
    let snapshot = Snapshot::parse(&text).map_err(|reason| {
        invalid(svc_text::peer::PeerText::with_limit(&reason, 512).to_string())
    })?;
    snapshot
        .check_times(svc_snapshot::now_epoch_seconds())
        .map_err(invalid)?;
    snapshot.check_values().map_err(invalid)?;
    Ok(snapshot)
}

/// Whom a snapshot may belong to: the policy's `expected_owner` where set; else the
/// exporter's own user, root, or the owner of the directory holding it (the runner's state
/// directory in the packages, whose owner could replace the file anyway). Anyone else may
/// have forged it.
fn check_owner(path: &Path, meta: &std::fs::Metadata, expected: Option<u32>) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let uid = meta.uid();
    if let Some(expected) = expected {
        return if uid == expected {
            Ok(())
        } else {
            Err(format!(
                "the file belongs to uid {uid}, not to expected_owner {expected}: refused as \
                 possibly forged"
            ))
        };
    }
    let me = svc_files::owner::service_uid();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir_owner = std::fs::metadata(dir).map(|m| m.uid()).ok();
    if uid == me || uid == 0 || Some(uid) == dir_owner {
        return Ok(());
    }
    Err(format!(
        "the file belongs to uid {uid}, not to this exporter's user (uid {me}), root, or the \
         owner of its directory: refused as possibly forged"
    ))
}

/// Why a render could not be produced (the exporter withholds the metrics).
#[derive(Debug)]
pub enum RenderError {
    Snapshot(SnapshotError),
    Stale(Stale),
    Overflow(Overflow),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Snapshot(e) => e.fmt(f),
            RenderError::Stale(e) => e.fmt(f),
            RenderError::Overflow(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RenderError {}

impl RenderError {
    /// A short reason without paths, for the withheld marker line.
    pub fn short(&self) -> &'static str {
        match self {
            RenderError::Snapshot(SnapshotError::Read { .. }) => "snapshot unavailable",
            RenderError::Snapshot(SnapshotError::Invalid { .. }) => "snapshot invalid",
            RenderError::Stale(_) => "snapshot stale",
            RenderError::Overflow(_) => "subject-family overflow",
        }
    }
}

/// Reads the snapshot, checks freshness, selects and renders with the scrape switches.
pub fn render_snapshot(
    snapshot_path: &Path,
    policy: &Policy,
    allow_stale: bool,
) -> Result<String, RenderError> {
    let snapshot =
        read_snapshot(snapshot_path, policy.expected_owner).map_err(RenderError::Snapshot)?;
    select::check_fresh(&snapshot, policy.scrape.stale_after_seconds, allow_stale)
        .map_err(RenderError::Stale)?;
    let selection = select::select(&snapshot, policy).map_err(RenderError::Overflow)?;
    Ok(exposition::render(
        &selection,
        &Options {
            namespace: &policy.namespace,
            include_help: policy.scrape.include_help,
            include_type: policy.scrape.include_type,
        },
    ))
}

/// What `scrape-textfile` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The rendering was written to this file.
    Written { path: PathBuf, bytes: usize },
    /// The rendering went to stdout (`--dry-run`).
    Printed,
    /// The policy disables the export; the disabled line was written or printed.
    Disabled { path: Option<PathBuf> },
}

/// Failures of `scrape-textfile`.
#[derive(Debug)]
pub enum TextfileError {
    /// Neither `--output` nor `scrape.output_file` names a destination (invalid input).
    NoOutput,
    /// Metrics withheld; the marker line was written to `path` when there is one.
    Withheld {
        cause: RenderError,
        marker_written: Option<PathBuf>,
    },
    /// Writing the file failed; the previous file is untouched.
    Write { path: PathBuf, source: io::Error },
}

impl std::fmt::Display for TextfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TextfileError::NoOutput => {
                f.write_str("no output file: pass --output or set scrape.output_file in the policy")
            }
            TextfileError::Withheld { cause, .. } => write!(f, "metrics withheld: {cause}"),
            TextfileError::Write { path, source } => {
                write!(f, "cannot write {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for TextfileError {}

/// Arguments of `scrape-textfile`.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub snapshot: &'a Path,
    pub policy: &'a Policy,
    pub dry_run: bool,
    pub output: Option<&'a Path>,
    pub allow_stale: bool,
}

/// Runs `scrape-textfile`; `stdout` receives the `--dry-run` rendering.
pub fn run(req: &Request<'_>, stdout: &mut dyn Write) -> Result<Outcome, TextfileError> {
    let destination: Option<PathBuf> = if req.dry_run {
        None
    } else {
        match req.output {
            Some(p) => Some(p.to_path_buf()),
            None => match &req.policy.scrape.output_file {
                Some(p) => Some(PathBuf::from(p)),
                None => return Err(TextfileError::NoOutput),
            },
        }
    };
    let emit = |bytes: &[u8], stdout: &mut dyn Write| -> Result<(), TextfileError> {
        match &destination {
            Some(path) => write_atomically(path, bytes, TEXTFILE_MODE).map_err(|source| {
                TextfileError::Write {
                    path: path.clone(),
                    source,
                }
            }),
            None => stdout
                .write_all(bytes)
                .and_then(|_| stdout.flush())
                .map_err(|source| TextfileError::Write {
                    path: PathBuf::from("<stdout>"),
                    source,
                }),
        }
    };

    let disabled = if !req.policy.enabled {
        Some("enabled=false")
    } else if !req.policy.scrape.enabled {
        Some("scrape.enabled=false")
    } else {
        None
    };
    if let Some(reason) = disabled {
        emit(exposition::disabled_line(reason).as_bytes(), stdout)?;
        return Ok(Outcome::Disabled { path: destination });
    }

    match render_snapshot(req.snapshot, req.policy, req.allow_stale) {
        Ok(text) => {
            emit(text.as_bytes(), stdout)?;
            Ok(match destination {
                Some(path) => Outcome::Written {
                    path,
                    bytes: text.len(),
                },
                None => Outcome::Printed,
            })
        }
        Err(cause) => {
            let mut marker_written = None;
            if let Some(path) = &destination {
                let line = format!("# svc-observe: metrics withheld ({})\n", cause.short());
                if write_atomically(path, line.as_bytes(), TEXTFILE_MODE).is_ok() {
                    marker_written = Some(path.clone());
                }
            }
            Err(TextfileError::Withheld {
                cause,
                marker_written,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("svc-read-snap-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn snapshot_text(generated_ahead_seconds: f64) -> String {
        let now = svc_snapshot::now_epoch_seconds();
        // What the runner writes before anything happened (its capture of an empty registry).
        let snap = Snapshot {
            schema: svc_snapshot::SCHEMA.into(),
            namespace: "svc".into(),
            generated_at_epoch_seconds: now + generated_ahead_seconds,
            started_at_epoch_seconds: now - 10.0,
            counters: svc_snapshot::Counters::NAMES
                .iter()
                .map(|n| (n.to_string(), 0))
                .collect(),
            gauges: BTreeMap::from([("last_sink_success_epoch_seconds".to_string(), 0.0)]),
            summaries: svc_snapshot::SUMMARY_NAMES
                .iter()
                .map(|n| (n.to_string(), svc_snapshot::Summary::default()))
                .collect(),
            labeled_metrics: Vec::new(),
            subject_families: Vec::new(),
            priority_lanes: Vec::new(),
        };
        serde_json::to_string_pretty(&snap).unwrap()
    }

    fn invalid_reason(path: &Path) -> String {
        match read_snapshot(path, None) {
            Err(SnapshotError::Invalid { reason, .. }) => reason,
            Err(e) => panic!("expected an invalid snapshot, got {e}"),
            Ok(_) => panic!("accepted {}", path.display()),
        }
    }

    #[test]
    fn a_snapshot_from_the_future_is_invalid() {
        let d = dir("future");
        let path = d.join("snap.json");
        std::fs::write(&path, snapshot_text(0.0)).unwrap();
        read_snapshot(&path, None).unwrap();
        std::fs::write(&path, snapshot_text(3600.0)).unwrap();
        let reason = invalid_reason(&path);
        assert!(reason.contains("in the future"), "{reason}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_oversize_file_is_refused_unread() {
        let d = dir("big");
        let path = d.join("snap.json");
        // Exactly the limit is read (and then fails as JSON); one byte more is not read.
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_SNAPSHOT_BYTES).unwrap();
        assert!(invalid_reason(&path).contains("not valid"));
        f.set_len(MAX_SNAPSHOT_BYTES + 1).unwrap();
        let reason = invalid_reason(&path);
        assert!(reason.contains("over the 1048576-byte limit"), "{reason}");
        // A sparse 1 TiB file is refused as fast as a small one: nothing is read.
        f.set_len(1 << 40).unwrap();
        assert!(invalid_reason(&path).contains("1099511627776 bytes"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Text from the file reaches the error escaped and bounded.
    #[test]
    fn file_text_in_errors_is_escaped_and_bounded() {
        let d = dir("peer");
        let path = d.join("snap.json");
        let evil = format!("x\n2026-01-01 ERROR forged{}", "y".repeat(5000));
        let mut v: serde_json::Value = serde_json::from_str(&snapshot_text(0.0)).unwrap();
        v["schema"] = evil.clone().into();
        std::fs::write(&path, v.to_string()).unwrap();
        let reason = invalid_reason(&path);
        assert!(!reason.contains('\n'), "{reason}");
        assert!(reason.len() < 1200, "{} chars", reason.len());
        let mut v: serde_json::Value = serde_json::from_str(&snapshot_text(0.0)).unwrap();
        v[evil.as_str()] = 1.into();
        std::fs::write(&path, v.to_string()).unwrap();
        let reason = invalid_reason(&path);
        assert!(!reason.contains('\n') && reason.len() < 1200, "{reason}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_fifo_or_directory_is_refused_without_blocking() {
        let d = dir("fifo");
        let fifo = d.join("snap.json");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(ok.success());
        assert_eq!(invalid_reason(&fifo), "not a regular file");
        assert_eq!(invalid_reason(&d), "not a regular file");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
