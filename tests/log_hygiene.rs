//! Operators read Display text: no log line of the service formats a value with `Debug`
//! (`{:?}`, `{e:?}`, `{:#?}`), which printed errors as `Transient(SinkError { sink: "file",
//! .. })`. This scans every log macro call and `eprintln!` under src/ (tests inside the sources
//! included: a log call there is copied into code soon enough).

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text of each call of `name!(...)` in `source`, parentheses balanced (string contents
/// are not parsed: a parenthesis inside a format string is rare enough in log lines, and an
/// unbalanced one only makes the call longer, never hides a Debug format).
fn calls<'a>(source: &'a str, name: &str) -> Vec<(usize, &'a str)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = source[from..].find(name) {
        let start = from + at;
        let open = start + name.len() - 1;
        from = open;
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in source[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        if let Some(end) = end {
            let line = source[..start].matches('\n').count() + 1;
            found.push((line, &source[start..end]));
        }
    }
    found
}

/// The carried broker client (third_party/nats) formats what the server sent into its errors
/// and log lines: a wrong token ended `svc run` with `unexpected line while connecting:
/// Err("Authorization Violation")`. Its log lines, and every error text it builds
/// (`format!`), use Display too; svc shows them as peer text.
#[test]
fn the_carried_client_formats_nothing_with_debug() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("third_party/nats/src"),
        &mut files,
    );
    assert!(files.len() > 10, "scanned too few files: {}", files.len());
    let mut offenders = Vec::new();
    let mut scanned = 0;
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        // Doc examples (`/// println!("{:?}", x)`) are not the client's output.
        let code: String = source
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("//") {
                    ""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        for macro_name in [
            "log::trace!(",
            "log::debug!(",
            "log::info!(",
            "log::warn!(",
            "log::error!(",
            "trace!(",
            "eprintln!(",
            "format!(",
        ] {
            for (line, call) in calls(&code, macro_name) {
                scanned += 1;
                if call.contains(":?}") || call.contains(":#?}") {
                    offenders.push(format!("{}:{line}: {call}", file.display()));
                }
            }
        }
    }
    assert!(scanned > 50, "found too few calls: {scanned}");
    assert!(
        offenders.is_empty(),
        "Debug in the client's output:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn no_log_line_formats_with_debug() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 20, "scanned too few files: {}", files.len());
    let mut offenders = Vec::new();
    let mut scanned = 0;
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        for macro_name in [
            "log::trace!(",
            "log::debug!(",
            "log::info!(",
            "log::warn!(",
            "log::error!(",
            "eprintln!(",
        ] {
            for (line, call) in calls(&source, macro_name) {
                scanned += 1;
                if call.contains(":?}") || call.contains(":#?}") {
                    offenders.push(format!("{}:{line}: {call}", file.display()));
                }
            }
        }
    }
    assert!(scanned > 30, "found too few log calls: {scanned}");
    assert!(
        offenders.is_empty(),
        "Debug in log lines:\n{}",
        offenders.join("\n")
    );
}
