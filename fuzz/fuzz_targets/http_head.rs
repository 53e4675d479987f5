//! HTTP request head of the `/metrics` endpoint (src/observe/http.rs): any client that
//! reaches the listener controls it.
//!
//! Frames the input as the server does (the head ends at the first CRLFCRLF; without one it
//! is incomplete) and calls `observe::http::fuzz_parse_head` (a thin wrapper of the private
//! `parse_head`) on the head without its final CRLFCRLF.
//! Properties (current parser): no panic; an accepted head has an upper-case method, a target
//! starting with `/` without spaces or control bytes, and `HTTP/1.0` without a keep-alive
//! token is not kept alive; a Content-Length other than 0 or any Transfer-Encoding counts as a
//! body. With `--features strict` (the strict parser of issue 13, item 3): no NUL, bare CR,
//! bare LF or obs-fold in an accepted head, exactly one `Host` on HTTP/1.1, and at most
//! `MAX_HEAD_BYTES`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::observe::http::fuzz_parse_head;

fuzz_target!(|data: &[u8]| {
    let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
        return;
    };
    let head = &data[..end];
    let Some((method, target, keep_alive, has_body)) = fuzz_parse_head(head) else {
        return;
    };
    assert!(!method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase()));
    assert!(target.starts_with('/'));
    assert!(
        !target.bytes().any(|b| b <= b' ' || b == 0x7f),
        "target {target:?}"
    );
    let text = std::str::from_utf8(head).expect("an accepted head is UTF-8");
    let request_line = text.split("\r\n").next().unwrap();
    let http10 = request_line.ends_with(" HTTP/1.0");
    assert!(
        http10 || request_line.ends_with(" HTTP/1.1"),
        "version of {request_line:?}"
    );
    let headers: Vec<(&str, &str)> = text
        .split("\r\n")
        .skip(1)
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .collect();
    if http10 {
        assert!(!keep_alive, "HTTP/1.0 is never kept alive");
    }
    let body_header = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding")
            || (n.eq_ignore_ascii_case("content-length") && v.trim() != "0")
    });
    assert_eq!(has_body, body_header, "body detection of {text:?}");

    #[cfg(feature = "strict")]
    {
        use svc::observe::http::MAX_HEAD_BYTES;
        assert!(
            head.len() + 4 <= MAX_HEAD_BYTES,
            "head of {} bytes accepted",
            head.len() + 4
        );
        assert!(!head.contains(&0), "NUL accepted in {text:?}");
        for (i, &b) in head.iter().enumerate() {
            if b == b'\n' {
                assert!(
                    i > 0 && head[i - 1] == b'\r',
                    "bare LF accepted in {text:?}"
                );
            }
            if b == b'\r' {
                assert!(
                    head.get(i + 1) == Some(&b'\n'),
                    "bare CR accepted in {text:?}"
                );
            }
        }
        assert!(
            !text
                .split("\r\n")
                .skip(1)
                .any(|l| l.starts_with([' ', '\t'])),
            "obs-fold accepted in {text:?}"
        );
        if !http10 {
            let hosts = headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
                .count();
            assert_eq!(hosts, 1, "HTTP/1.1 head with {hosts} Host headers accepted");
        }
    }
});
