//! `svc decrypt` and `svc verify-custody`: operator tools over stored records.
//!
//! A record file holds one JSON object (a per-event file, an object-store object, a relational
//! row exported as JSON), a JSON array of them, or JSON lines (the jsonl file sink). Reads are
//! bounded by [`MAX_RECORD_FILE_BYTES`]. Neither command prints key material; `decrypt`
//! prints plaintext only to standard output, for the operator who asked.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::value::RawValue;
use serde_json::Value;

use super::output::{self, say};
use crate::config::RuntimeConfig;
use crate::document::canonical::{self, Json};
use crate::message::protection::custody::{Custodian, Verdict};
use crate::message::protection::encryption::Encryptor;
use crate::text::peer::PeerText;

/// Largest record file read at once (a jsonl segment is bounded by the sink's rotation).
pub const MAX_RECORD_FILE_BYTES: u64 = 1 << 30;

/// A record file's text, read whole (bounded).
fn read_file(path: &Path) -> Result<String, String> {
    let name = path.display().to_string();
    let mut text = String::new();
    let read = if name == "-" {
        std::io::stdin()
            .take(MAX_RECORD_FILE_BYTES + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_RECORD_FILE_BYTES + 1).read_to_string(&mut text))
    };
    read.map_err(|e| format!("{name}: cannot read: {e}"))?;
    if text.len() as u64 > MAX_RECORD_FILE_BYTES {
        return Err(format!("{name}: larger than {MAX_RECORD_FILE_BYTES} bytes"));
    }
    Ok(text)
}

/// One record of a file: its position (`name`, `name[i]` or `name:line`) and its JSON text,
/// or why that one record cannot be read.
pub type RecordText<'a> = (String, Result<&'a str, String>);

/// The records of a record file's text (see the module docs), each on its own: a line that
/// is not JSON is reported as that one record, never for the whole file (it would hide an
/// altered record beside it). Pure, for `svc decrypt`, `svc verify-custody` and the
/// `payload_record` fuzz target; no error quotes the text.
pub fn parse_records<'a>(name: &str, text: &'a str) -> Vec<RecordText<'a>> {
    if let Ok(whole) = serde_json::from_str::<&RawValue>(text) {
        if let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(whole.get()) {
            return items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("{name}[{i}]"), Ok(v.get())))
                .collect();
        }
        return vec![(name.to_string(), Ok(whole.get()))];
    }
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| (format!("{name}:{}", i + 1), Ok(line)))
        .collect()
}

/// A record read strictly (no duplicate keys, exact numbers); the error names the kind.
fn strict(text: Result<&str, String>) -> Result<Json<'_>, String> {
    let text = text?;
    canonical::parse(text).map_err(|e| format!("not a JSON record: {e}"))
}

/// `svc decrypt`: exit 0 when every record decrypted, 1 when one did not, 2 on usage.
pub fn decrypt(cfg: &RuntimeConfig, record: &Path) -> ExitCode {
    if !cfg.payload_encryption.enabled {
        eprintln!("svc: decrypt: payload_encryption is not enabled in this configuration");
        return ExitCode::from(2);
    }
    let enc = match Encryptor::load(&cfg.payload_encryption) {
        Ok(e) => e,
        Err(errors) => {
            for e in errors {
                eprintln!("svc: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let text = match read_file(record) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("svc: decrypt: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for (at, rec) in parse_records(&record.display().to_string(), &text) {
        // Strict first (a duplicated `payload` or `stream` could be read two ways), then
        // as the tree the decryption reads.
        let opened = strict(rec.clone()).and_then(|_| {
            let v: Value = serde_json::from_str(rec?).map_err(|_| "not a JSON record")?;
            enc.decrypt_record(&v).map_err(|e| e.to_string())
        });
        match opened {
            Ok(plain) => {
                if let Err(e) = out.write_all(&plain).and_then(|()| out.write_all(b"\n")) {
                    return output::write_failed(&e);
                }
            }
            Err(e) => {
                eprintln!("svc: decrypt: {at}: {e}");
                failed = true;
            }
        }
    }
    if let Err(e) = out.flush() {
        return output::write_failed(&e);
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Where a record says it comes from, for `svc verify-custody`'s report line:
/// ` (stream S sequence N)`, or nothing without a string `stream` and a `stream_sequence`.
pub fn record_place(v: &Json<'_>) -> String {
    match (
        v.get("stream").and_then(Json::as_str),
        v.get("stream_sequence"),
    ) {
        // Both are the store's text: anything but a plain integer is shown as the peer text
        // it is (bounded, escaped), not as raw JSON.
        (Some(s), Some(n)) => {
            let mut text = Vec::new();
            canonical::write(&mut text, n);
            let text = String::from_utf8_lossy(&text);
            if text.bytes().all(|b| b.is_ascii_digit()) && text.len() <= 20 {
                format!(" (stream {} sequence {text})", PeerText::new(s))
            } else {
                format!(
                    " (stream {} sequence {})",
                    PeerText::new(s),
                    PeerText::new(&text)
                )
            }
        }
        _ => String::new(),
    }
}

/// `svc verify-custody`: one line per record; exit 1 when any is altered or unverifiable.
pub fn verify_custody(cfg: &RuntimeConfig, files: &[PathBuf]) -> ExitCode {
    let custodian = match Custodian::load(&cfg.custody) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("svc: {e}");
            return ExitCode::from(2);
        }
    };
    let (mut intact, mut altered, mut unverifiable) = (0u64, 0u64, 0u64);
    for file in files {
        let text = match read_file(file) {
            Ok(t) => t,
            Err(e) => {
                say!("{e}: unverifiable");
                unverifiable += 1;
                continue;
            }
        };
        for (at, rec) in parse_records(&file.display().to_string(), &text) {
            let (place, verdict) = match strict(rec) {
                Ok(doc) => (record_place(&doc), custodian.verify(&doc)),
                Err(why) => (String::new(), Verdict::Unverifiable(why)),
            };
            match verdict {
                Verdict::Intact => {
                    intact += 1;
                    say!("{at}{place}: intact");
                }
                Verdict::Altered => {
                    altered += 1;
                    say!("{at}{place}: ALTERED");
                }
                Verdict::Unverifiable(why) => {
                    unverifiable += 1;
                    say!("{at}{place}: unverifiable ({why})");
                }
            }
        }
    }
    say!("{intact} intact, {altered} altered, {unverifiable} unverifiable");
    if altered + unverifiable > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The checkpoints and records of the configured sink; with `sink.type` = `spool`, of the
/// spool and its target as one (`sink::checkpoint::spool::UnionStore`). The outer error: no
/// store for this sink (exit 2); the inner: the store cannot be read (exit 1, no verdict).
#[allow(clippy::type_complexity)]
fn read_sink(
    sink: &crate::sink::SinkConfig,
) -> Result<
    Result<
        (
            Vec<(String, String)>,
            Vec<crate::message::protection::checkpoint_audit::StoredRecord>,
        ),
        String,
    >,
    String,
> {
    if let crate::sink::SinkConfig::Spool(s) = sink {
        if let Some(why) = crate::sink::checkpoint::unavailable(sink) {
            return Err(format!("custody.checkpoints: {why}"));
        }
        let union = crate::sink::checkpoint::spool::UnionStore::new(s)?;
        return Ok(union.read());
    }
    let store = crate::sink::checkpoint::store_for(sink)?;
    Ok(store
        .checkpoints()
        .and_then(|c| store.records().map(|r| (c, r))))
}

/// `svc verify-custody <config> --public-key [ID=]FILE...`: the configured sink's records
/// against its signed checkpoints, with public keys only. One line per finding, then a
/// summary; exit 0 when complete, 1 when anything is missing, altered, uncovered or refused,
/// 2 for configuration or key errors.
pub fn verify_checkpoints(cfg: &RuntimeConfig, keys: &[String], heads: &[String]) -> ExitCode {
    use crate::message::protection::checkpoint::TrustedKeys;
    use crate::message::protection::checkpoint_audit::audit_to_heads;
    let mut held = Vec::new();
    for h in heads {
        match crate::sink::checkpoint::head::parse_head_arg(h) {
            Ok(h) => held.push((h.runner_id, h.index, h.digest)),
            Err(e) => {
                eprintln!("svc: verify-custody: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let mut trusted = TrustedKeys::default();
    for k in keys {
        if let Err(e) = trusted.add(k, &cfg.custody.checkpoints.key_id) {
            eprintln!("svc: verify-custody: {e}");
            return ExitCode::from(2);
        }
    }
    let read = match read_sink(&cfg.sink) {
        Ok(read) => read,
        Err(e) => {
            eprintln!("svc: verify-custody: {e}");
            return ExitCode::from(2);
        }
    };
    let (checkpoints, records) = match read {
        Ok(x) => x,
        Err(e) => {
            eprintln!("svc: verify-custody: cannot read the sink: {e}");
            return ExitCode::from(1);
        }
    };
    let report = audit_to_heads(&records, &checkpoints, &trusted, &held);
    let mut out = std::io::stdout().lock();
    for f in &report.findings {
        if let Err(e) = writeln!(out, "{}", f.line) {
            return output::write_failed(&e);
        }
    }
    if let Err(e) = writeln!(out, "{}", report.summary()).and_then(|()| out.flush()) {
        return output::write_failed(&e);
    }
    if report.complete() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_files_are_one_object_an_array_or_json_lines() {
        let one = parse_records("one.json", "{\"a\": 1}\n");
        assert_eq!(one, [("one.json".to_string(), Ok("{\"a\": 1}"))]);
        let arr = parse_records("arr.json", "[{\"a\":1},{\"a\":2}]");
        assert_eq!(arr[1], ("arr.json[1]".to_string(), Ok("{\"a\":2}")));
        let lines = parse_records("l.jsonl", "{\"a\":1}\n\n{\"a\":2}\n");
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1], ("l.jsonl:3".to_string(), Ok("{\"a\":2}")));
        let dir = tempfile::tempdir().unwrap();
        let e = read_file(&dir.path().join("missing")).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
    }

    /// One unreadable record is reported as that record: the ones beside it are still read
    /// (a whole file given up would hide an altered record next to it).
    #[test]
    fn a_bad_line_is_one_bad_record() {
        let text = "{\"a\":1}\n{\"secret\": oops\n{\"b\":2,\"b\":3}\n{\"c\":3}\n";
        let records = parse_records("bad.jsonl", text);
        assert_eq!(records.len(), 4);
        let read: Vec<Result<Json<'_>, String>> =
            records.into_iter().map(|(_, r)| strict(r)).collect();
        assert!(read[0].is_ok() && read[3].is_ok());
        let e = read[1].as_ref().unwrap_err();
        assert_eq!(e, "not a JSON record: not JSON (syntax error at byte 11)");
        assert!(!e.contains("secret") && !e.contains("oops"), "{e}");
        let e = read[2].as_ref().unwrap_err();
        assert_eq!(e, "not a JSON record: an object has a duplicate key");
    }

    fn place(text: &str) -> String {
        record_place(&canonical::parse(text).unwrap())
    }

    /// Found by the `payload_record` fuzz target: a `stream_sequence` that is not an integer
    /// went into the report line as raw JSON (bidi controls, DEL, any length).
    #[test]
    fn the_report_line_shows_a_hostile_place_escaped_and_bounded() {
        let hostile =
            place(r#"{"stream":"S\u202e","stream_sequence":{"n":"7\u202e\u007f"},"subject":"s"}"#);
        assert!(
            !hostile.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{hostile:?}"
        );
        assert!(hostile.contains("sequence {"), "{hostile}");
        let long = format!(
            r#"{{"stream": "S", "stream_sequence": "{}"}}"#,
            "9".repeat(100_000)
        );
        assert!(place(&long).chars().count() < 400);
        assert_eq!(
            place(r#"{"stream": "ORDERS", "stream_sequence": 7}"#),
            " (stream ORDERS sequence 7)"
        );
        assert_eq!(place(r#"{"stream": 1}"#), "");
    }
}
