//! Rules about the source tree itself, read from the files.

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

/// `unsafe` is denied crate-wide (Cargo.toml); src/allocator.rs alone may allow it, for its
/// one call to glibc's mallopt. Any other file that allows it or uses it fails here.
#[test]
fn unsafe_code_lives_only_in_the_allocator_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("crates"), &mut files);
    let mut offenders = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(root).unwrap();
        if rel == Path::new("src/allocator.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("unsafe {")
                || code.contains("unsafe fn")
                || code.contains("unsafe impl")
                || code.contains("allow(unsafe_code)")
            {
                offenders.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "unsafe outside src/allocator.rs:\n{}",
        offenders.join("\n")
    );
}

/// The top-level modules of src/, lowest first: each may use only the modules before it
/// (docs/architecture.md, "Source layout"). Plain data types live with the lowest module that
/// needs them (a block of the runtime config with the module it configures), so the order has
/// no exception.
/// The lowest ones (`text`, `db`, `document`, `files`, `host`, `aws`) are crates of the workspace
/// (crates/, as are `message::subject`, the snapshot contract `metrics::snapshot` re-exports, and
/// `observe`, the exporter, which depends on none of svc's own modules:
/// the compiler keeps their order, and `unsafe_code_lives_only_in_the_allocator_module` scans
/// them); they stay in this list at their rank, which no module of src/ may undercut.
const LAYERS: &[&str] = &[
    "text",
    "allocator",
    "db",
    "document",
    "files",
    "backoff",
    "host",
    "aws",
    "message",
    "metrics",
    "broker",
    "sink",
    "config",
    "pipeline",
    "observe",
    "cli",
];

/// The non-test lines of a file: everything before a `#[cfg(test)]` that opens a module (the
/// tests may use any layer) and nothing of a `*tests.rs` file.
fn code_lines(rel: &Path, text: &str) -> Vec<(usize, String)> {
    if rel
        .file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with("tests.rs"))
    {
        return Vec::new();
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == "#[cfg(test)]" {
            let next = lines[i + 1..]
                .iter()
                .find(|l| !l.trim_start().starts_with("#["))
                .map(|l| l.trim_start())
                .unwrap_or("");
            if next.starts_with("mod ") || next.starts_with("pub mod ") {
                break;
            }
        }
        let code = line.split("//").next().unwrap_or("");
        out.push((i + 1, code.to_string()));
    }
    out
}

/// Every `crate::<module>` a line names (in `use` or in a path).
fn named_modules(code: &str) -> Vec<&str> {
    code.match_indices("crate::")
        .filter(|(at, _)| !code[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        .filter_map(|(at, m)| {
            let rest = &code[at + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (end > 0).then(|| &rest[..end])
        })
        .collect()
}

#[test]
fn no_module_uses_a_module_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut offenders = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(root).unwrap();
        let Some(top) = rel
            .iter()
            .nth(1)
            .map(|t| t.to_string_lossy().trim_end_matches(".rs").to_string())
        else {
            continue;
        };
        let Some(own) = rank(&top) else {
            assert!(
                ["lib", "bin"].contains(&top.as_str()),
                "{}: module {top} is not in LAYERS; place it there",
                rel.display()
            );
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (n, code) in code_lines(rel, &text) {
            for used in named_modules(&code) {
                match rank(used) {
                    Some(r) if r > own => offenders.push(format!(
                        "{}:{n}: {top} uses {used}, a module above it: {}",
                        rel.display(),
                        code.trim()
                    )),
                    _ => {}
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "layer violations:\n{}",
        offenders.join("\n")
    );
}
