//! AWS shared credentials and config files (crates/aws/src/credentials.rs, `aws::parse_ini`): files
//! the service does not own.
//!
//! Writes the input to a file named by `AWS_SHARED_CREDENTIALS_FILE` (first byte even) or
//! `AWS_CONFIG_FILE` (odd) and calls `aws::credentials::load_profile` and
//! `ProfileSettings::static_keys` (the file step of the chain) for the profiles `default` and
//! `fuzz`. The chain's network sources have their own target (`aws_answers`).
//! Properties: no panic; errors render without control characters; no value of the file ever
//! appears in an error: the result (its text, or which fields are set) is identical when every
//! value in the file is replaced by a different value of the same emptiness; accepted
//! credentials are the non-empty values of the profile's section, and `Debug` hides them.
#![no_main]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use svc::aws::credentials::{load_profile, Credentials};
use svc_fuzz::{assert_clean_display, split_selector};

fn dir() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        // tmpfs when there is one: two small files are rewritten per execution.
        let shm = PathBuf::from("/dev/shm");
        let base = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("svc-fuzz-aws-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    })
}

/// Every value (after the first `=` of a key line, trimmed) replaced, character by character,
/// by a different character: emptiness and line structure stay, no substring of a value does.
fn replace_values(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim();
        let is_other =
            t.is_empty() || t.starts_with(['#', ';']) || (t.starts_with('[') && t.ends_with(']'));
        match line.split_once('=') {
            Some((k, v)) if !is_other => {
                let lead = &v[..v.len() - v.trim_start().len()];
                let core = v.trim();
                let swapped: String = core
                    .chars()
                    .map(|c| if c == 'Z' { 'Y' } else { 'Z' })
                    .collect();
                out.push_str(k);
                out.push('=');
                out.push_str(lead);
                out.push_str(&swapped);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The result with secrets reduced to which fields are present.
fn shape(r: Result<(Credentials, String), String>) -> Result<(bool, String), String> {
    r.map(|(c, source)| {
        // Debug does not depend on the values: it shows none of them.
        let other = Credentials {
            access_key_id: "id".into(),
            secret_access_key: "secret".into(),
            session_token: c.session_token.as_ref().map(|_| "token".into()),
        };
        assert_eq!(
            format!("{c:?}"),
            format!("{other:?}"),
            "Debug shows a value"
        );
        assert!(!c.access_key_id.is_empty() && !c.secret_access_key.is_empty());
        (c.session_token.is_some(), source)
    })
}

fn run(text: &str, in_config: bool) -> [Result<(bool, String), String>; 2] {
    let path = dir().join(if in_config { "config" } else { "credentials" });
    std::fs::write(&path, text).expect("write temp file");
    let missing = dir().join("missing").to_string_lossy().into_owned();
    let shown = path.to_string_lossy().into_owned();
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert(
        "AWS_SHARED_CREDENTIALS_FILE".into(),
        if in_config {
            missing.clone()
        } else {
            shown.clone()
        },
    );
    env.insert(
        "AWS_CONFIG_FILE".into(),
        if in_config { shown } else { missing },
    );
    let mut out = Vec::new();
    for profile in ["default", "fuzz"] {
        let r = load_profile(profile, &env).and_then(|settings| match settings {
            Some(s) => s
                .static_keys(profile)
                .map(|found| found.map(|(c, source)| (c, source.to_string()))),
            None => Ok(None),
        });
        if let Err(e) = &r {
            assert_clean_display("credentials", e, 4096);
        }
        out.push(match r {
            Ok(Some(found)) => shape(Ok(found)),
            Ok(None) => Err("none".into()),
            Err(e) => Err(e),
        });
    }
    [out.remove(0), out.remove(0)]
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let in_config = sel & 1 == 1;
    let original: String = text.lines().flat_map(|l| [l, "\n"]).collect();
    let a = run(&original, in_config);
    let b = run(&replace_values(&original), in_config);
    assert_eq!(a, b, "a value of the file changed the result's text");
});
