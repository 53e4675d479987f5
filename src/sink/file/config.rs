//! The `sink` block with `type` = `file`: every field, its default and its range.
//!
//! Read with [`ObjectReader`], so every problem is reported at once with its path
//! (`sink.file_mode: must be an octal permission string such as 0640`). Fields that only make
//! sense in one `mode` are rejected in the other instead of being silently ignored. The
//! operator-facing reference is `docs/sinks/file.md`; keep the two in step.

use std::path::PathBuf;

use crate::document::reader::ObjectReader;
use crate::sink::key::{KeyStrategy, KEY_STRATEGIES};
use crate::sink::layout::{
    gzip_suffix_problem, is_safe_prefix, is_simple_suffix, Compression, DuplicatePolicy,
    PayloadMode,
};

/// One file per event, or appended JSON lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileMode {
    /// One file per envelope at its deterministic key.
    PerEvent,
    /// Records appended to rolling segments, one line each (at-least-once).
    Jsonl,
}

impl FileMode {
    pub fn name(self) -> &'static str {
        match self {
            FileMode::PerEvent => "per_event",
            FileMode::Jsonl => "jsonl",
        }
    }
}

const MODES: &[(&str, FileMode)] = &[
    ("per_event", FileMode::PerEvent),
    ("jsonl", FileMode::Jsonl),
];
/// `write_concurrency`: the per_event sink's file writer threads, shared by every sink worker
/// (files in flight at once). Default 16: the files in flight before the writers were shared
/// (2 sink workers x 8), and the concurrency at which this host's disk peaks in its fast
/// phases (docs/sinks/file.md, Performance). 1 to 64.
pub const DEFAULT_WRITE_CONCURRENCY: i64 = 16;
pub const MAX_WRITE_CONCURRENCY: i64 = 64;
/// Longest accepted `directory` value, in bytes (Linux `PATH_MAX` is 4096 with the NUL).
pub const MAX_DIRECTORY_BYTES: usize = 4095;
/// Default permissions of written files.
pub const DEFAULT_FILE_MODE: u32 = 0o640;
/// `segment_max_bytes`: default 64 MiB, 4 KiB to 16 GiB.
pub const DEFAULT_SEGMENT_MAX_BYTES: i64 = 64 * 1024 * 1024;
pub const MIN_SEGMENT_MAX_BYTES: i64 = 4096;
pub const MAX_SEGMENT_MAX_BYTES: i64 = 16 * 1024 * 1024 * 1024;
/// `segment_max_age_seconds`: default 300, 1 to 86400.
pub const DEFAULT_SEGMENT_MAX_AGE_SECONDS: i64 = 300;
pub const MAX_SEGMENT_MAX_AGE_SECONDS: i64 = 86_400;
/// `max_record_bytes`: default 16 MiB, 1 KiB to 1 GiB (the object-store sink's object limit).
pub const DEFAULT_MAX_RECORD_BYTES: i64 = 16 * 1024 * 1024;
pub const MIN_MAX_RECORD_BYTES: i64 = 1024;
pub const MAX_MAX_RECORD_BYTES: i64 = 1024 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub struct FileSinkConfig {
    /// Output directory. Created (with parents) at start-up and by `svc test-sink`, never while
    /// running: a vanished directory (an unmounted volume) fails writes instead of silently
    /// filling the parent file system.
    pub directory: PathBuf,
    /// Defaults to `per_event`.
    pub mode: FileMode,
    /// Defaults to `idempotency_key` (per_event only).
    pub key_strategy: KeyStrategy,
    /// Safe relative path below `directory` under which everything is written. Defaults to none.
    pub key_prefix: Option<String>,
    /// Inserts the escaped subject as a directory above the key (per_event only). Defaults to
    /// false.
    pub per_subject_directories: bool,
    /// Defaults to `skip_existing` (per_event only).
    pub duplicate_policy: DuplicatePolicy,
    /// Files of one batch written and fsynced in parallel (per_event only). Defaults to 8.
    pub write_concurrency: usize,
    /// Defaults to `none`.
    pub compression: Compression,
    /// Defaults to `.json` / `.json.gz` (per_event) or `.jsonl` / `.jsonl.gz` (jsonl).
    pub file_suffix: String,
    /// Defaults to `json_or_envelope` (the only value).
    pub payload_mode: PayloadMode,
    /// Permission bits of written files, applied exactly (the umask does not apply). Defaults
    /// to 0o640.
    pub file_mode: u32,
    /// Largest serialized (uncompressed) record; larger records fail permanently. Defaults to
    /// 16 MiB.
    pub max_record_bytes: u64,
    /// A jsonl segment is rolled before a batch would make it larger. Defaults to 64 MiB.
    pub segment_max_bytes: u64,
    /// A jsonl segment older than this is rolled when the next batch arrives. Defaults to 300.
    pub segment_max_age_seconds: u64,
}

impl FileSinkConfig {
    /// A per_event config with every default, writing below `directory`.
    pub fn new(directory: impl Into<PathBuf>) -> FileSinkConfig {
        FileSinkConfig {
            directory: directory.into(),
            mode: FileMode::PerEvent,
            key_strategy: KeyStrategy::IdempotencyKey,
            key_prefix: None,
            per_subject_directories: false,
            duplicate_policy: DuplicatePolicy::SkipExisting,
            write_concurrency: DEFAULT_WRITE_CONCURRENCY as usize,
            compression: Compression::None,
            file_suffix: ".json".into(),
            payload_mode: PayloadMode::JsonOrEnvelope,
            file_mode: DEFAULT_FILE_MODE,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES as u64,
            segment_max_bytes: DEFAULT_SEGMENT_MAX_BYTES as u64,
            segment_max_age_seconds: DEFAULT_SEGMENT_MAX_AGE_SECONDS as u64,
        }
    }

    /// Reads the fields of the `sink` block (its `type` was already read; the caller finishes
    /// the reader, which reports unknown fields).
    pub fn read(r: &mut ObjectReader<'_>) -> FileSinkConfig {
        let directory = read_directory(r);
        let mode = r.one_of("mode", FileMode::PerEvent, MODES);
        let per_event = mode == FileMode::PerEvent;

        let key_strategy = per_event_only(r, per_event, "key_strategy", |r| {
            r.one_of("key_strategy", KeyStrategy::IdempotencyKey, KEY_STRATEGIES)
        })
        .unwrap_or(KeyStrategy::IdempotencyKey);
        let key_prefix = r.opt_string("key_prefix");
        if let Some(p) = &key_prefix {
            if !is_safe_prefix(p) {
                r.problem(
                    "key_prefix",
                    "must be /-separated segments of letters, digits, _, - and . (no leading or \
                     trailing slash, no empty, . or .. segment, at most 256 bytes)",
                );
            } else if p.split('/').any(|seg| seg.starts_with('.')) {
                r.problem(
                    "key_prefix",
                    "segments must not start with . (dot names are reserved for the sink's \
                     temporary and probe files)",
                );
            }
        }
        let per_subject_directories =
            per_event_only(r, per_event, "per_subject_directories", |r| {
                r.bool_or("per_subject_directories", false)
            })
            .unwrap_or(false);
        let duplicate_policy = per_event_only(r, per_event, "duplicate_policy", |r| {
            DuplicatePolicy::read(r)
        })
        .unwrap_or(DuplicatePolicy::SkipExisting);
        let write_concurrency = per_event_only(r, per_event, "write_concurrency", |r| {
            r.int_in(
                "write_concurrency",
                DEFAULT_WRITE_CONCURRENCY,
                1,
                MAX_WRITE_CONCURRENCY,
            )
        })
        .unwrap_or(DEFAULT_WRITE_CONCURRENCY) as usize;

        let compression = Compression::read(r);
        let gzip = compression == Compression::Gzip;
        let default_suffix = match (per_event, gzip) {
            (true, false) => ".json",
            (true, true) => ".json.gz",
            (false, false) => ".jsonl",
            (false, true) => ".jsonl.gz",
        };
        let file_suffix = r.string_or("file_suffix", default_suffix);
        if !is_simple_suffix(&file_suffix) {
            r.problem(
                "file_suffix",
                "must be a simple extension such as .json or .json.gz (dot-separated letters \
                 and digits, 2 to 32 bytes)",
            );
        } else if let Some(mismatch) = gzip_suffix_problem(compression, &file_suffix) {
            r.problem("file_suffix", mismatch.message());
        }

        let payload_mode = PayloadMode::read(r);
        let file_mode = read_file_mode(r);
        let max_record_bytes = r.int_in(
            "max_record_bytes",
            DEFAULT_MAX_RECORD_BYTES,
            MIN_MAX_RECORD_BYTES,
            MAX_MAX_RECORD_BYTES,
        ) as u64;

        let segment_max_bytes = jsonl_only(r, per_event, "segment_max_bytes", |r| {
            r.int_in(
                "segment_max_bytes",
                DEFAULT_SEGMENT_MAX_BYTES,
                MIN_SEGMENT_MAX_BYTES,
                MAX_SEGMENT_MAX_BYTES,
            )
        })
        .unwrap_or(DEFAULT_SEGMENT_MAX_BYTES) as u64;
        let segment_max_age_seconds = jsonl_only(r, per_event, "segment_max_age_seconds", |r| {
            r.int_in(
                "segment_max_age_seconds",
                DEFAULT_SEGMENT_MAX_AGE_SECONDS,
                1,
                MAX_SEGMENT_MAX_AGE_SECONDS,
            )
        })
        .unwrap_or(DEFAULT_SEGMENT_MAX_AGE_SECONDS) as u64;

        FileSinkConfig {
            directory,
            mode,
            key_strategy,
            key_prefix,
            per_subject_directories,
            duplicate_policy,
            write_concurrency,
            compression,
            file_suffix,
            payload_mode,
            file_mode,
            max_record_bytes,
            segment_max_bytes,
            segment_max_age_seconds,
        }
    }
}

fn read_directory(r: &mut ObjectReader<'_>) -> PathBuf {
    if !r.has("directory") {
        r.problem("directory", "is required");
        return PathBuf::new();
    }
    let Some(dir) = r.opt_string("directory") else {
        return PathBuf::new();
    };
    if dir.is_empty() {
        r.problem("directory", "must not be empty");
    } else if dir.chars().any(char::is_control) {
        r.problem("directory", "must not contain control characters");
    } else if dir.len() > MAX_DIRECTORY_BYTES {
        r.problem(
            "directory",
            format!("must be at most {MAX_DIRECTORY_BYTES} bytes"),
        );
    }
    PathBuf::from(dir)
}

/// Reads a per_event-only field, or reports it when the mode is jsonl.
fn per_event_only<T>(
    r: &mut ObjectReader<'_>,
    per_event: bool,
    key: &'static str,
    read: impl FnOnce(&mut ObjectReader<'_>) -> T,
) -> Option<T> {
    if per_event {
        Some(read(r))
    } else {
        if r.has(key) {
            r.problem(key, "only applies to mode per_event");
        }
        None
    }
}

/// Reads a jsonl-only field, or reports it when the mode is per_event.
fn jsonl_only<T>(
    r: &mut ObjectReader<'_>,
    per_event: bool,
    key: &'static str,
    read: impl FnOnce(&mut ObjectReader<'_>) -> T,
) -> Option<T> {
    if !per_event {
        Some(read(r))
    } else {
        if r.has(key) {
            r.problem(key, "only applies to mode jsonl");
        }
        None
    }
}

/// `file_mode`: an octal string such as `"0640"` or `"640"`; no execute, setuid, setgid or
/// sticky bits, not writable by others, readable by the owner.
fn read_file_mode(r: &mut ObjectReader<'_>) -> u32 {
    let Some(text) = r.opt_string("file_mode") else {
        return DEFAULT_FILE_MODE;
    };
    let digits_ok =
        (3..=4).contains(&text.len()) && text.bytes().all(|b| (b'0'..=b'7').contains(&b));
    let Some(mode) = digits_ok
        .then(|| u32::from_str_radix(&text, 8).ok())
        .flatten()
    else {
        r.problem(
            "file_mode",
            "must be an octal permission string such as 0640",
        );
        return DEFAULT_FILE_MODE;
    };
    if mode & 0o7111 != 0 {
        r.problem(
            "file_mode",
            "must not grant execute, setuid, setgid or sticky bits",
        );
    } else if mode & 0o002 != 0 {
        r.problem("file_mode", "must not be writable by others");
    } else if mode & 0o400 == 0 {
        r.problem("file_mode", "must grant the owner read permission");
    } else {
        return mode;
    }
    DEFAULT_FILE_MODE
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::reader::{parse_json, Problems};
    use crate::sink::SinkConfig;

    /// Reads a `sink` block the way the runtime config does (including unknown-field checks).
    fn read(text: &str) -> Result<FileSinkConfig, Vec<String>> {
        let v = parse_json(text).unwrap();
        let p = Problems::new();
        let cfg = SinkConfig::read(ObjectReader::at("sink".into(), &v, &p));
        let problems: Vec<String> = p.into_vec().iter().map(|p| p.to_string()).collect();
        match cfg {
            Some(SinkConfig::File(c)) if problems.is_empty() => Ok(c),
            _ => Err(problems),
        }
    }

    fn problems(text: &str) -> Vec<String> {
        read(text).err().unwrap_or_default()
    }

    #[test]
    fn minimal_block_gets_every_default() {
        let c = read(r#"{"type": "file", "directory": "/var/lib/svc/out"}"#).unwrap();
        assert_eq!(c, FileSinkConfig::new("/var/lib/svc/out"));
        assert_eq!(c.mode, FileMode::PerEvent);
        assert_eq!(c.key_strategy, KeyStrategy::IdempotencyKey);
        assert_eq!(c.duplicate_policy, DuplicatePolicy::SkipExisting);
        assert_eq!(c.compression, Compression::None);
        assert_eq!(c.file_suffix, ".json");
        assert_eq!(c.file_mode, 0o640);
        assert_eq!(c.max_record_bytes, 16 * 1024 * 1024);
        assert!(!c.per_subject_directories);
        assert_eq!(c.key_prefix, None);
        assert_eq!(c.write_concurrency, 16);
    }

    #[test]
    fn every_field_is_read() {
        let c = read(
            r#"{"type": "file", "directory": "out", "mode": "per_event",
                "key_strategy": "message_id", "key_prefix": "prod/events",
                "per_subject_directories": true, "duplicate_policy": "fail_existing",
                "compression": "gzip", "file_suffix": ".msg.json.gz",
                "payload_mode": "json_or_envelope", "file_mode": "600",
                "max_record_bytes": 2048, "write_concurrency": 1}"#,
        )
        .unwrap();
        assert_eq!(c.directory, PathBuf::from("out"));
        assert_eq!(c.key_strategy, KeyStrategy::MessageId);
        assert_eq!(c.key_prefix.as_deref(), Some("prod/events"));
        assert!(c.per_subject_directories);
        assert_eq!(c.duplicate_policy, DuplicatePolicy::FailExisting);
        assert_eq!(c.compression, Compression::Gzip);
        assert_eq!(c.file_suffix, ".msg.json.gz");
        assert_eq!(c.file_mode, 0o600);
        assert_eq!(c.max_record_bytes, 2048);
        assert_eq!(c.write_concurrency, 1);
    }

    #[test]
    fn suffix_defaults_follow_mode_and_compression() {
        let suffix = |extra: &str| {
            read(&format!(r#"{{"type": "file", "directory": "d"{extra}}}"#))
                .unwrap()
                .file_suffix
        };
        assert_eq!(suffix(""), ".json");
        assert_eq!(suffix(r#", "compression": "gzip""#), ".json.gz");
        assert_eq!(suffix(r#", "mode": "jsonl""#), ".jsonl");
        assert_eq!(
            suffix(r#", "mode": "jsonl", "compression": "gzip""#),
            ".jsonl.gz"
        );
    }

    #[test]
    fn jsonl_fields_and_defaults() {
        let c = read(r#"{"type": "file", "directory": "d", "mode": "jsonl"}"#).unwrap();
        assert_eq!(c.mode, FileMode::Jsonl);
        assert_eq!(c.segment_max_bytes, 64 * 1024 * 1024);
        assert_eq!(c.segment_max_age_seconds, 300);
        let c = read(
            r#"{"type": "file", "directory": "d", "mode": "jsonl", "segment_max_bytes": 4096,
                "segment_max_age_seconds": 86400, "key_prefix": "stream"}"#,
        )
        .unwrap();
        assert_eq!(c.segment_max_bytes, 4096);
        assert_eq!(c.segment_max_age_seconds, 86400);
    }

    #[test]
    fn every_rule_has_its_message() {
        let got = problems(
            r#"{"type": "file", "mode": "append", "key_strategy": "random",
                "key_prefix": "/abs/../x", "per_subject_directories": "yes",
                "duplicate_policy": "overwrite", "write_concurrency": 65,
                "compression": "zstd", "file_suffix": "json",
                "payload_mode": "raw", "file_mode": "rw-r-----", "max_record_bytes": 10,
                "bogus": 1}"#,
        );
        assert_eq!(
            got,
            vec![
                "sink.directory: is required",
                "sink.mode: must be one of: per_event, jsonl",
                "sink.key_strategy: must be one of: idempotency_key, stream_sequence, \
                 message_id, payload_sha256",
                "sink.key_prefix: must be /-separated segments of letters, digits, _, - and . \
                 (no leading or trailing slash, no empty, . or .. segment, at most 256 bytes)",
                "sink.per_subject_directories: must be true or false",
                "sink.duplicate_policy: must be one of: skip_existing, replace, fail_existing",
                "sink.write_concurrency: must be an integer from 1 to 64",
                "sink.compression: must be one of: none, gzip",
                "sink.file_suffix: must be a simple extension such as .json or .json.gz \
                 (dot-separated letters and digits, 2 to 32 bytes)",
                "sink.payload_mode: must be one of: json_or_envelope",
                "sink.file_mode: must be an octal permission string such as 0640",
                "sink.max_record_bytes: must be an integer from 1024 to 1073741824",
                "sink.bogus: unknown field",
            ]
        );
    }

    #[test]
    fn directory_rules() {
        let dir = |v: &str| problems(&format!(r#"{{"type": "file", "directory": {v}}}"#));
        assert_eq!(dir(r#""""#), vec!["sink.directory: must not be empty"]);
        assert_eq!(dir("7"), vec!["sink.directory: must be a string"]);
        assert_eq!(
            dir(r#""out\nput""#),
            vec!["sink.directory: must not contain control characters"]
        );
        assert_eq!(
            dir(&format!(r#""/{}""#, "a".repeat(4095))),
            vec!["sink.directory: must be at most 4095 bytes"]
        );
        assert!(dir(r#""relative/out""#).is_empty());
    }

    #[test]
    fn key_prefix_rejects_dot_segments() {
        let got = problems(r#"{"type": "file", "directory": "d", "key_prefix": "a/.hidden"}"#);
        assert_eq!(
            got,
            vec![
                "sink.key_prefix: segments must not start with . (dot names are reserved for \
                 the sink's temporary and probe files)"
            ]
        );
    }

    #[test]
    fn mode_specific_fields_are_rejected_in_the_other_mode() {
        let got = problems(
            r#"{"type": "file", "directory": "d", "mode": "jsonl",
                "key_strategy": "stream_sequence", "per_subject_directories": false,
                "duplicate_policy": "replace", "write_concurrency": 4}"#,
        );
        assert_eq!(
            got,
            vec![
                "sink.key_strategy: only applies to mode per_event",
                "sink.per_subject_directories: only applies to mode per_event",
                "sink.duplicate_policy: only applies to mode per_event",
                "sink.write_concurrency: only applies to mode per_event",
            ]
        );
        let got = problems(
            r#"{"type": "file", "directory": "d", "segment_max_bytes": 4096,
                "segment_max_age_seconds": 10}"#,
        );
        assert_eq!(
            got,
            vec![
                "sink.segment_max_bytes: only applies to mode jsonl",
                "sink.segment_max_age_seconds: only applies to mode jsonl",
            ]
        );
    }

    #[test]
    fn segment_ranges() {
        let got = problems(
            r#"{"type": "file", "directory": "d", "mode": "jsonl", "segment_max_bytes": 4095,
                "segment_max_age_seconds": 0}"#,
        );
        assert_eq!(
            got,
            vec![
                "sink.segment_max_bytes: must be an integer from 4096 to 17179869184",
                "sink.segment_max_age_seconds: must be an integer from 1 to 86400",
            ]
        );
        let got = problems(
            r#"{"type": "file", "directory": "d", "mode": "jsonl",
                "segment_max_bytes": 17179869185, "segment_max_age_seconds": 86401}"#,
        );
        assert_eq!(
            got,
            vec![
                "sink.segment_max_bytes: must be an integer from 4096 to 17179869184",
                "sink.segment_max_age_seconds: must be an integer from 1 to 86400",
            ]
        );
    }

    #[test]
    fn gzip_and_suffix_must_agree() {
        let got = problems(
            r#"{"type": "file", "directory": "d", "compression": "gzip", "file_suffix": ".json"}"#,
        );
        assert_eq!(
            got,
            vec!["sink.file_suffix: must end with .gz when compression is gzip"]
        );
        let got = problems(r#"{"type": "file", "directory": "d", "file_suffix": ".json.gz"}"#);
        assert_eq!(
            got,
            vec!["sink.file_suffix: must not end with .gz unless compression is gzip"]
        );
    }

    #[test]
    fn file_mode_rules() {
        let mode = |m: &str| {
            read(&format!(
                r#"{{"type": "file", "directory": "d", "file_mode": "{m}"}}"#
            ))
            .map(|c| c.file_mode)
        };
        assert_eq!(mode("0640"), Ok(0o640));
        assert_eq!(mode("644"), Ok(0o644));
        assert_eq!(mode("0440"), Ok(0o440));
        let bad = |m: &str, msg: &str| {
            assert_eq!(mode(m), Err(vec![format!("sink.file_mode: {msg}")]), "{m}");
        };
        let syntax = "must be an octal permission string such as 0640";
        for m in ["", "64", "06400", "0648", "0o640", "-640", "rw"] {
            bad(m, syntax);
        }
        let special = "must not grant execute, setuid, setgid or sticky bits";
        for m in ["0750", "0641", "4640", "1640", "2640"] {
            bad(m, special);
        }
        bad("0662", "must not be writable by others");
        bad("0240", "must grant the owner read permission");
        assert_eq!(
            problems(r#"{"type": "file", "directory": "d", "file_mode": 640}"#),
            vec!["sink.file_mode: must be a string"]
        );
    }
}
