//! The `spool` block (fallback beside any sink) and the `sink` block with `type` = `spool`.
//! The operator-facing reference is `docs/spool.md`; keep the two in step.

use std::path::PathBuf;
use std::time::Duration;

use super::seal::SpoolEncryption;
use crate::document::reader::ObjectReader;
use crate::sink::SinkConfig;

/// Default size at which the segment being appended to is closed and a new one begun.
pub const DEFAULT_SEGMENT_BYTES: i64 = 16 << 20;
/// Default `after_seconds`.
pub const DEFAULT_AFTER_SECONDS: f64 = 30.0;
/// Records the drain hands to the sink at once (one `write_batch`), by default.
pub const DEFAULT_DRAIN_BATCH: i64 = 500;

/// Where and how large the spool is, and when the fallback starts using it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpoolConfig {
    /// The spool directory (created 0700 when missing; its parent must exist).
    pub dir: PathBuf,
    /// Bytes of segment files at most (required): a batch that would pass it is refused.
    pub max_bytes: u64,
    /// Records held at most. Defaults to no bound beyond `max_bytes`.
    pub max_records: u64,
    /// How long the sink must fail transiently before batches go to the spool. Defaults to 30 s.
    pub after: Duration,
    /// Segment size. Defaults to 16 MiB.
    pub segment_bytes: u64,
    /// Records per drain write. Defaults to 500.
    pub drain_batch: usize,
    /// Longest pause between drain probes of a sink that still fails. Defaults to 30 s.
    pub max_backoff: Duration,
    /// The key new records are sealed with and older keys for reading (docs/spool.md).
    pub encryption: Option<SpoolEncryption>,
    /// Records may be stored (without `encryption`) and read in clear: asked for explicitly.
    pub allow_unencrypted: bool,
}

impl SpoolConfig {
    /// Reads the fields of a `spool` block (or of a `sink` block of type `spool`) without
    /// finishing the reader.
    pub fn read_fields(r: &mut ObjectReader<'_>) -> SpoolConfig {
        let dir = r.req_string("dir");
        if dir.is_empty() && r.has("dir") {
            r.problem("dir", "must not be empty");
        }
        let dir = PathBuf::from(dir);
        let max_bytes = r
            .opt_int_in("max_bytes", 1 << 16, i64::MAX)
            .unwrap_or_else(|| {
                if !r.has("max_bytes") {
                    r.problem("max_bytes", "is required");
                }
                1 << 16
            }) as u64;
        let max_records = r.int_in("max_records", i64::MAX, 1, i64::MAX) as u64;
        let after = r
            .opt_number_in("after_seconds", 0.0, false, 86_400.0)
            .unwrap_or(DEFAULT_AFTER_SECONDS);
        let segment_bytes = r.int_in("segment_bytes", DEFAULT_SEGMENT_BYTES, 4096, 1 << 30) as u64;
        let drain_batch = r.int_in("drain_batch", DEFAULT_DRAIN_BATCH, 1, 100_000) as usize;
        let max_backoff = r
            .opt_number_in("max_backoff_seconds", 0.0, true, 3_600.0)
            .unwrap_or(30.0);
        let encryption = r.object("encryption").and_then(SpoolEncryption::read);
        let allow_unencrypted = r.bool_or("allow_unencrypted", false);
        if !r.has("encryption") && !allow_unencrypted {
            r.problem(
                "encryption",
                "is required: the spool keeps every record on local disk, so it is encrypted \
                 at rest with a key file (encryption.key_id, encryption.key_file); a spool in \
                 clear must be asked for with allow_unencrypted: true",
            );
        }
        SpoolConfig {
            dir,
            max_bytes,
            max_records,
            after: Duration::from_secs_f64(after),
            segment_bytes,
            drain_batch,
            max_backoff: Duration::from_secs_f64(max_backoff),
            encryption,
            allow_unencrypted,
        }
    }

    /// Reads a top-level `spool` block.
    pub fn read(mut r: ObjectReader<'_>) -> SpoolConfig {
        let cfg = Self::read_fields(&mut r);
        r.finish();
        cfg
    }
}

/// `sink.type` = `spool`: every batch goes to the spool; `svc spool drain` later delivers it
/// to `target`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpoolSinkConfig {
    pub spool: SpoolConfig,
    /// The sink `svc spool drain` delivers to.
    pub target: Box<SinkConfig>,
}

impl SpoolSinkConfig {
    /// Reads the fields after `type`; `None` when `target` is missing or invalid.
    pub fn read(r: &mut ObjectReader<'_>) -> Option<SpoolSinkConfig> {
        let spool = SpoolConfig::read_fields(r);
        let target = match r.object("target") {
            Some(t) => SinkConfig::read(t)?,
            None => {
                r.problem(
                    "target",
                    "is required (the sink `svc spool drain` delivers to)",
                );
                return None;
            }
        };
        if matches!(target, SinkConfig::Spool(_)) {
            r.problem("target", "must not be a spool");
            return None;
        }
        Some(SpoolSinkConfig {
            spool,
            target: Box::new(target),
        })
    }
}
