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
