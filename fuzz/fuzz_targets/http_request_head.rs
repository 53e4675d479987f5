//! HTTP request head of the `/metrics` endpoint (crates/observe/src/http/head.rs): any client that
//! reaches the listener controls it.
//!
//! Calls `observe::http::parse_request_head` (what the I/O loop runs on a connection's buffer)
//! and `observe::http::head::scan` resumed at a split point, as the loop resumes it after each
//! read.
//! Properties: no panic; an accepted head is at most `MAX_HEAD_BYTES`, ends with its CRLFCRLF,
//! holds no NUL, bare CR, bare LF, other control byte (HTAB aside) or obs-fold, has a target
//! starting with `/`, exactly one `Host` on HTTP/1.1 (at most one on 1.0), and its body flag
//! matches its headers; `Incomplete` only below the limit; resuming the scan at any earlier
//! stop gives the same answer as one scan; every refusal renders clean.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::observe::http::head::{scan, Scan};
use svc::observe::http::{parse_request_head, HeadError, MAX_HEAD_BYTES};
use svc_fuzz::assert_clean_display;

fuzz_target!(|data: &[u8]| {
    // Resumability: a first read of `k` bytes, then the rest.
    let k = data.first().map_or(0, |&b| b as usize * 37) % (data.len() + 1);
    let whole = scan(data, 0);
    if let Scan::Incomplete(stop) = scan(&data[..k], 0) {
        assert!(stop <= k);
        assert_eq!(
            scan(data, stop),
            whole,
            "resumed scan differs (split at {k})"
        );
    }

    match parse_request_head(data) {
        Ok(h) => {
            let head = &data[..h.len];
            assert!(h.len <= MAX_HEAD_BYTES, "head of {} bytes accepted", h.len);
            assert!(head.ends_with(b"\r\n\r\n"));
            assert_eq!(whole, Scan::Complete(h.len));
            for (i, &b) in head.iter().enumerate() {
                assert!(b != 0, "NUL accepted");
                assert!(
                    b >= 0x20 || matches!(b, b'\r' | b'\n' | b'\t'),
                    "control {b:#x} accepted"
                );
                assert!(b != 0x7f, "DEL accepted");
                if b == b'\n' {
                    assert!(i > 0 && head[i - 1] == b'\r', "bare LF accepted");
                }
                if b == b'\r' {
                    assert_eq!(head.get(i + 1), Some(&b'\n'), "bare CR accepted");
                }
            }
            let text = std::str::from_utf8(&head[..head.len() - 4]).ok();
            assert!(h.target.starts_with('/'));
            assert!(h.minor_version <= 1);
            if let Some(text) = text {
                let lines: Vec<&str> = text.split("\r\n").collect();
                assert!(
                    !lines[1..].iter().any(|l| l.starts_with([' ', '\t'])),
                    "obs-fold accepted"
                );
                let headers: Vec<(&str, &str)> = lines[1..]
                    .iter()
                    .filter_map(|l| l.split_once(':'))
                    .collect();
                let hosts = headers
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
                    .count();
                if h.minor_version == 1 {
                    assert_eq!(hosts, 1, "HTTP/1.1 with {hosts} Host headers accepted");
                    assert!(h.host.is_some());
                } else {
                    assert!(hosts <= 1);
                }
                let body = headers.iter().any(|(n, v)| {
                    n.eq_ignore_ascii_case("transfer-encoding")
                        || (n.eq_ignore_ascii_case("content-length")
                            && v.trim_matches([' ', '\t']).bytes().any(|b| b != b'0'))
                });
                assert_eq!(h.has_body, body, "body flag of {text:?}");
            }
        }
        Err(HeadError::Incomplete) => {
            assert!(data.len() < MAX_HEAD_BYTES);
            assert!(matches!(whole, Scan::Incomplete(_)));
        }
        Err(e) => assert_clean_display("head refusal", &e.to_string(), 256),
    }
});
