//! The Python that runs the helper scripts (moto, the receivers, payload protection's twin,
//! the SBOM validator), and where those scripts are. Only `std`: the benches include it too.

use std::path::{Path, PathBuf};

/// `SVC_TEST_PYTHON`, else `$SVC_TEST_VENV/bin/python`, else the venv `scripts/deps.sh` makes
/// (`~/.cache/svc-test-tools/venv`), else `python3` (whose missing modules then name
/// themselves in the helper's error).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SVC_TEST_PYTHON") {
        return p.into();
    }
    let venv = match std::env::var_os("SVC_TEST_VENV") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/svc-test-tools/venv"),
    };
    let p = venv.join("bin/python");
    if p.exists() {
        p
    } else {
        "python3".into()
    }
}

/// A helper script below `tests/support/`, e.g. `receivers/http_receiver.py`.
pub fn script(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(rel)
}
