//! Answers of cloud APIs and metadata services (crates/observe/src/connectors): the first input byte
//! picks the parser, the rest is the answer body.
//!
//! Calls `oci::check_answer` (OCI PostMetricData), `siem_hec::check_answer` (HEC),
//! `oci::instance::token_of` (federation answer), `oci::instance::federation_failure` (federation
//! error JSON), `oci::instance::region_id` (metadata-service region answer) and
//! `oci::auth::jwt_expiry` (the session token's claims).
//! Properties: no panic; every error text an operator sees has no control character and is
//! bounded however large the answer; an accepted token is a single printable word; an
//! accepted region is a normalized identifier that `region_id` maps to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::observe::connectors::oci::{self, auth as oci_auth, instance as oci_instance};
use svc::observe::connectors::siem_hec;
use svc_fuzz::{assert_clean_display, split_selector, MAX_ERROR_CHARS};

const NOW: i64 = 1_718_000_000;

fuzz_target!(|data: &[u8]| {
    let Some((sel, body)) = split_selector(data) else {
        return;
    };
    match sel % 6 {
        0 => {
            if let Err(e) = oci::check_answer(body) {
                assert_clean_display("cloud_a answer", &e, MAX_ERROR_CHARS);
            }
        }
        1 => {
            if let Err(e) = siem_hec::check_answer(body) {
                assert_clean_display("siem_hec answer", &e, MAX_ERROR_CHARS);
            }
        }
        2 => match oci_instance::token_of(body, NOW) {
            Ok(token) => {
                assert!(!token.is_empty());
                assert!(
                    !token
                        .chars()
                        .any(|c| c.is_whitespace() || c == '"' || c.is_control()),
                    "token {token:?}"
                );
            }
            Err(e) => assert_clean_display("federation answer", &e, MAX_ERROR_CHARS),
        },
        3 => {
            let status = 400 + u16::from(body.first().copied().unwrap_or(0));
            assert_clean_display(
                "federation failure",
                &oci_instance::federation_failure(status, body),
                MAX_ERROR_CHARS,
            );
        }
        4 => {
            let Ok(text) = std::str::from_utf8(body) else {
                return;
            };
            match oci_instance::region_id(text) {
                Ok(id) => {
                    assert!(id.len() <= 64 && !id.is_empty());
                    assert!(
                        id.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                        "region {id:?}"
                    );
                    assert_eq!(oci_instance::region_id(&id).as_deref(), Ok(id.as_str()));
                }
                Err(e) => assert_clean_display("region answer", &e, MAX_ERROR_CHARS),
            }
        }
        _ => {
            let Ok(text) = std::str::from_utf8(body) else {
                return;
            };
            let _ = oci_auth::jwt_expiry(text);
        }
    }
});
