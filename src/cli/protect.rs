//! `svc decrypt` and `svc verify-custody`: operator tools over stored records.
//!
//! A record file holds one JSON object (a per-event file, an object-store object, a relational
//! row exported as JSON), a JSON array of them, or JSON lines (the jsonl file sink). Reads are
//! bounded by [`MAX_RECORD_FILE_BYTES`]. Neither command prints key material; `decrypt`
//! prints plaintext only to standard output, for the operator who asked.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use crate::config::RuntimeConfig;
use crate::message::protection::custody::{Custodian, Verdict};
use crate::message::protection::encryption::Encryptor;
use crate::text::peer::PeerText;

/// Largest record file read at once (a jsonl segment is bounded by the sink's rotation).
pub const MAX_RECORD_FILE_BYTES: u64 = 1 << 30;

/// The records of a file (see the module docs), each with its position for reports.
fn read_records(path: &Path) -> Result<Vec<(String, Value)>, String> {
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
    parse_records(&name, &text)
}

/// The records of a record file's text (see the module docs), each with its position
/// (`name`, `name[i]` or `name:line`) for reports. Pure, for `svc decrypt`, `svc
/// verify-custody` and the `payload_record` fuzz target; an error names the line and the kind
/// of JSON error, never the text.
pub fn parse_records(name: &str, text: &str) -> Result<Vec<(String, Value)>, String> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(match v {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("{name}[{i}]"), v))
                .collect(),
            v => vec![(name.to_string(), v)],
        });
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v = serde_json::from_str(line).map_err(|e| {
            format!(
                "{name}:{}: not a JSON record ({})",
                i + 1,
                e.classify_name()
            )
        })?;
        out.push((format!("{name}:{}", i + 1), v));
    }
    Ok(out)
}

trait Classify {
    fn classify_name(&self) -> &'static str;
}

impl Classify for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "read error",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "data error",
            serde_json::error::Category::Eof => "truncated",
        }
    }
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
    let records = match read_records(record) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("svc: decrypt: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for (at, v) in records {
        match enc.decrypt_record(&v) {
            Ok(plain) => {
                let _ = out.write_all(&plain);
                let _ = out.write_all(b"\n");
            }
            Err(e) => {
                eprintln!("svc: decrypt: {at}: {e}");
                failed = true;
            }
        }
    }
    let _ = out.flush();
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Where a record says it comes from, for `svc verify-custody`'s report line:
/// ` (stream S sequence N)`, or nothing without a string `stream` and a `stream_sequence`.
pub fn record_place(v: &Value) -> String {
    match (
        v.get("stream").and_then(Value::as_str),
        v.get("stream_sequence"),
    ) {
        // Both are the store's text: a sequence that is not an integer is shown as the
        // peer text it is (bounded, escaped), not as raw JSON.
        (Some(s), Some(n)) => match n.as_u64() {
            Some(n) => format!(" (stream {} sequence {n})", PeerText::new(s)),
            None => format!(
                " (stream {} sequence {})",
                PeerText::new(s),
                PeerText::new(&n.to_string())
            ),
        },
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
        let records = match read_records(file) {
            Ok(r) => r,
            Err(e) => {
                println!("{e}: unverifiable");
                unverifiable += 1;
                continue;
            }
        };
        for (at, v) in records {
            let place = record_place(&v);
            match custodian.verify(&v) {
                Verdict::Intact => {
                    intact += 1;
                    println!("{at}{place}: intact");
                }
                Verdict::Altered => {
                    altered += 1;
                    println!("{at}{place}: ALTERED");
                }
                Verdict::Unverifiable(why) => {
                    unverifiable += 1;
                    println!("{at}{place}: unverifiable ({why})");
                }
            }
        }
    }
    println!("{intact} intact, {altered} altered, {unverifiable} unverifiable");
    if altered + unverifiable > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_files_are_one_object_an_array_or_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let one = read_records(&write("one.json", "{\"a\": 1}\n")).unwrap();
        assert_eq!(one.len(), 1);
        assert!(one[0].0.ends_with("one.json"));
        let arr = read_records(&write("arr.json", "[{\"a\":1},{\"a\":2}]")).unwrap();
        assert!(arr[1].0.ends_with("arr.json[1]"));
        let lines = read_records(&write("l.jsonl", "{\"a\":1}\n\n{\"a\":2}\n")).unwrap();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].0.ends_with("l.jsonl:3"), "{}", lines[1].0);
        assert_eq!(lines[1].1["a"], 2);
        let e = read_records(&write("bad.jsonl", "{\"a\":1}\n{\"secret\": oops\n")).unwrap_err();
        assert!(
            e.ends_with("bad.jsonl:2: not a JSON record (syntax error)"),
            "{e}"
        );
        assert!(!e.contains("secret"), "{e}");
        let e = read_records(&dir.path().join("missing")).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
    }

    /// Found by the `payload_record` fuzz target: a `stream_sequence` that is not an integer
    /// went into the report line as raw JSON (bidi controls, DEL, any length).
    #[test]
    fn the_report_line_shows_a_hostile_place_escaped_and_bounded() {
        let v: Value = serde_json::from_str(
            r#"{"stream":"S\u202e","stream_sequence":{"n":"7\u202e\u007f"},"subject":"s"}"#,
        )
        .unwrap();
        let place = record_place(&v);
        assert!(
            !place.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{place:?}"
        );
        assert!(place.contains("sequence {"), "{place}");
        let long = serde_json::json!({"stream": "S", "stream_sequence": "9".repeat(100_000)});
        assert!(record_place(&long).chars().count() < 400);
        let ok = serde_json::json!({"stream": "ORDERS", "stream_sequence": 7});
        assert_eq!(record_place(&ok), " (stream ORDERS sequence 7)");
        assert_eq!(record_place(&serde_json::json!({"stream": 1})), "");
    }
}
