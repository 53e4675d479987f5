//! Answers of the AWS credential sources (crates/aws/src/parse.rs, crates/aws/src/process.rs): STS XML, the
//! JSON of the instance metadata service and of container endpoints, the JSON a
//! `credential_process` prints, and that command's line split into words. The first input byte
//! picks the parser.
//!
//! Calls `aws::parse::parse_sts_credentials` ("AssumeRole"), `parse_sts_error`,
//! `parse_metadata_credentials`, `parse_process_credentials` and `aws::process::split_words`.
//! Properties: no panic; errors and the STS error text render without control characters and
//! bounded; accepted credentials are fit for HTTP headers (visible ASCII, no space, within
//! the documented lengths), non-empty, and temporary where the source only issues temporary
//! ones; `Debug` of what was issued shows no value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::aws::parse::{
    parse_metadata_credentials, parse_process_credentials, parse_sts_credentials, parse_sts_error,
    Issued, MAX_KEY_ID_CHARS, MAX_SECRET_CHARS,
};
use svc::aws::process::split_words;
use svc_fuzz::{assert_clean_display, is_unsafe_char, split_selector, MAX_ERROR_CHARS};

fn header_safe(what: &str, v: &str, max: usize) {
    assert!(!v.is_empty(), "{what} empty");
    assert!(v.chars().count() <= max, "{what} of {} characters", v.len());
    assert!(
        v.bytes().all(|b| (0x21..0x7f).contains(&b)),
        "{what} {v:?} not header-safe"
    );
}

fn check(r: Result<Issued, String>, temporary: bool) {
    match r {
        Ok(i) => {
            let c = &i.credentials;
            header_safe("access key id", &c.access_key_id, MAX_KEY_ID_CHARS);
            header_safe("secret", &c.secret_access_key, MAX_SECRET_CHARS);
            if let Some(t) = &c.session_token {
                header_safe("token", t, MAX_SECRET_CHARS);
            }
            if temporary {
                assert!(c.session_token.is_some() && i.expiration.is_some());
            }
            let debug = format!("{i:?}");
            for v in [&c.access_key_id, &c.secret_access_key] {
                assert!(
                    v.len() < 12 || !debug.contains(v.as_str()),
                    "Debug shows a value"
                );
            }
        }
        Err(e) => assert_clean_display("aws answer", &e, MAX_ERROR_CHARS),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, body)) = split_selector(data) else {
        return;
    };
    match sel % 5 {
        0 => check(parse_sts_credentials("AssumeRole", body), true),
        1 => {
            let shown = parse_sts_error(body);
            assert!(
                !shown.chars().any(is_unsafe_char),
                "STS error text {shown:?}"
            );
            assert!(
                shown.chars().count() <= MAX_ERROR_CHARS,
                "STS error text of {} chars",
                shown.len()
            );
        }
        2 => check(parse_metadata_credentials(body), true),
        3 => check(parse_process_credentials(body), false),
        _ => {
            let Ok(line) = std::str::from_utf8(body) else {
                return;
            };
            match split_words(line) {
                Ok(words) => {
                    // Words come out unquoted; re-quoting each in single quotes (with '\''
                    // for a quote) splits back to the same words.
                    let quoted: Vec<String> = words
                        .iter()
                        .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
                        .collect();
                    assert_eq!(split_words(&quoted.join(" ")).as_ref(), Ok(&words));
                }
                Err(e) => assert_clean_display("command line", &e, MAX_ERROR_CHARS),
            }
        }
    }
});
