//! HTTP sink answers (src/sink/http/outcome.rs): the status, body and `Retry-After` of
//! whatever answers on the sink's URL.
//!
//! First byte: the status (100 + byte * 2, so every class is reached). The rest is split at
//! the first NUL into a `Retry-After` value and the body. Calls `judge` with the default status
//! lists, `parse_retry_after`, `next_wait` and the scrubbing of a known secret.
//! Properties: no panic; success exactly for a success status; a retry exactly for a retry
//! status; a record refused exactly for a dead-letter status, every other status refusing the
//! sink (transient, never a dead letter); a wait never below the backoff nor above the cap (or the backoff when higher); the
//! error's Display is clean and bounded whatever the body, and the words it keeps never hold
//! the secret.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use svc::sink::http::config::{
    DEFAULT_DEAD_LETTER_STATUSES, DEFAULT_RETRY_STATUSES, DEFAULT_SUCCESS_STATUSES,
};
use svc::sink::http::outcome::{judge, next_wait, parse_retry_after, HttpError, Statuses};
use svc::text::secrets::Secrets;
use svc_fuzz::{assert_clean_display, split_selector, MAX_ERROR_CHARS};

const SECRET: &str = "tok-fuzz-5a1d0c3e9b";

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let status = 100 + u16::from(sel) * 2;
    let (retry_after, body) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (
            String::from_utf8_lossy(&rest[..i]).into_owned(),
            &rest[i + 1..],
        ),
        None => (String::new(), rest),
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let e = judge(
        status,
        body,
        Some(&retry_after),
        Statuses {
            success: DEFAULT_SUCCESS_STATUSES,
            retry: DEFAULT_RETRY_STATUSES,
            dead_letter: DEFAULT_DEAD_LETTER_STATUSES,
        },
        now,
    );
    assert_eq!(e.is_none(), DEFAULT_SUCCESS_STATUSES.contains(&status));
    let parsed = parse_retry_after(&retry_after, now);
    let backoff = Duration::from_millis(250);
    let cap = Duration::from_secs(60);
    let wait = next_wait(backoff, parsed, cap);
    assert!(wait >= backoff && wait <= cap.max(backoff));
    if let Some(e) = e {
        assert_eq!(
            e.is_transient(),
            !DEFAULT_DEAD_LETTER_STATUSES.contains(&status)
        );
        assert_eq!(
            matches!(e, HttpError::Refused { .. }),
            DEFAULT_DEAD_LETTER_STATUSES.contains(&status)
        );
        assert_eq!(e.status(), Some(status));
        let hidden = e.hidden(&Secrets::of([SECRET]));
        // The kept words, not the Display: an escape can spell the secret from bytes that
        // are not it (a TAB before `ok-fuzz-...` shows as `\tok-fuzz-...`).
        if let HttpError::Refused { body, .. }
        | HttpError::Unusable { body, .. }
        | HttpError::Retry { body, .. } = &hidden
        {
            assert!(
                !body.to_ascii_lowercase().contains(SECRET),
                "the secret kept in {body:?}"
            );
        }
        assert_clean_display("http answer", &hidden.to_string(), MAX_ERROR_CHARS);
    }
});
