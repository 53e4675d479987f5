//! The request-head parser of the scrape endpoint: pure, strict, and resumable.
//!
//! [`parse_request_head`] is the entry point (also the fuzz target `http_request_head`). It
//! works in two passes:
//!
//! 1. [`scan`]: a byte pass that finds the end of the head (`CRLF CRLF`) and refuses, as soon
//!    as the byte arrives, what RFC 9112 allows a server to be lenient about and what
//!    request smuggling behind a proxy feeds on: a bare LF (RFC 9112 §2.2 lets a recipient
//!    accept one as a line end), a bare CR, NUL and every other control character except HTAB,
//!    obs-fold (a header line starting with SP or HTAB, §5.2), and empty lines before the
//!    request line. It only looks backwards from each byte, so the event loop resumes it where
//!    the previous read stopped: a head trickled in byte by byte is scanned once in total, not
//!    once per read.
//! 2. `httparse` tokenizes the complete head (method and header-name tokens, target, version).
//!    It is already in the binary through ureq, is fuzzed upstream, and has no runtime. It is
//!    lenient where pass 1 is not (it accepts bare LF line ends and skips leading empty lines),
//!    which is why pass 1 exists; pass 1 alone does not check the token grammar.
//!
//! Then the semantics: an HTTP/1.1 request needs exactly one `Host` (RFC 9112 §3.2), HTTP/1.0 at
//! most one, and its value must be a plausible `uri-host[:port]`; `Content-Length` must be
//! digits and appear once; `Transfer-Encoding` or a non-zero length marks a body (answered 400
//! by the router: a scrape has none).
//!
//! The head limit is exact: a head is the request line, the header lines and the empty line
//! that ends them; one of exactly [`MAX_HEAD_BYTES`] bytes is accepted, one byte more is
//! [`HeadError::TooLarge`].

/// Largest request head accepted, terminating empty line included.
pub const MAX_HEAD_BYTES: usize = 8192;
/// Most header lines accepted in one head.
pub const MAX_HEADERS: usize = 64;

/// Why a head was refused, or that it is not complete yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// No end of head yet, and nothing wrong so far: read more.
    Incomplete,
    /// The head is (or would be) longer than [`MAX_HEAD_BYTES`]: `431`.
    TooLarge,
    /// More than [`MAX_HEADERS`] header lines: `431`.
    TooManyHeaders,
    /// Not a strict HTTP/1.x request head: `400`, with the reason.
    Malformed(&'static str),
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::Incomplete => f.write_str("request head incomplete"),
            HeadError::TooLarge => write!(f, "request head over {MAX_HEAD_BYTES} bytes"),
            HeadError::TooManyHeaders => write!(f, "more than {MAX_HEADERS} header lines"),
            HeadError::Malformed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for HeadError {}

/// A complete, valid request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead<'a> {
    pub method: &'a str,
    /// Origin-form target (starts with `/`), query included.
    pub target: &'a str,
    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub minor_version: u8,
    /// The `Host` value (trimmed); `None` only on HTTP/1.0 without one.
    pub host: Option<&'a str>,
    /// The connection may stay open after the response.
    pub keep_alive: bool,
    /// The request announces a body (`Transfer-Encoding`, or `Content-Length` other than 0).
    pub has_body: bool,
    /// Bytes of input the head occupies; what follows is the next request.
    pub len: usize,
}

/// Result of [`scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// The head ends after this many bytes.
    Complete(usize),
    /// No end yet; every byte up to this offset is valid (resume from here).
    Incomplete(usize),
    Refused(HeadError),
}

/// Pass 1 over `buf[from..]`, given that `buf[..from]` was scanned before without finding the
/// end. Stops at the first end of head; bytes after it are not looked at.
pub fn scan(buf: &[u8], from: usize) -> Scan {
    let stop = buf.len().min(MAX_HEAD_BYTES);
    for i in from..stop {
        let b = buf[i];
        let prev = if i > 0 { Some(buf[i - 1]) } else { None };
        if prev == Some(b'\r') && b != b'\n' {
            return Scan::Refused(HeadError::Malformed("bare CR in request head"));
        }
        match b {
            b'\n' if prev != Some(b'\r') => {
                return Scan::Refused(HeadError::Malformed("bare LF in request head"));
            }
            b'\n' => {
                if i >= 3 && buf[i - 3] == b'\r' && buf[i - 2] == b'\n' {
                    return Scan::Complete(i + 1);
                }
                if i == 1 {
                    return Scan::Refused(HeadError::Malformed(
                        "empty line before the request line",
                    ));
                }
            }
            0 => return Scan::Refused(HeadError::Malformed("NUL in request head")),
            b'\r' | b'\t' => {}
            c if c < 0x20 || c == 0x7f => {
                return Scan::Refused(HeadError::Malformed("control character in request head"));
            }
            _ => {}
        }
        // A header line (not the request line) starting with whitespace is obs-fold.
        let line_start = i >= 2 && prev == Some(b'\n');
        if line_start && (b == b' ' || b == b'\t') {
            return Scan::Refused(HeadError::Malformed(
                "obsolete line folding in request head",
            ));
        }
        if i == 0 && (b == b' ' || b == b'\t') {
            return Scan::Refused(HeadError::Malformed("whitespace before the request line"));
        }
    }
    if buf.len() >= MAX_HEAD_BYTES {
        // No end within the limit: any completion would be over it.
        Scan::Refused(HeadError::TooLarge)
    } else {
        Scan::Incomplete(stop)
    }
}

/// Parses the request head at the start of `bytes` (pure: no I/O, no allocation beyond the
/// header table on the stack). `Err(Incomplete)` means "valid so far, read more".
pub fn parse_request_head(bytes: &[u8]) -> Result<RequestHead<'_>, HeadError> {
    match scan(bytes, 0) {
        Scan::Complete(end) => parse_complete(&bytes[..end]),
        Scan::Incomplete(_) => Err(HeadError::Incomplete),
        Scan::Refused(e) => Err(e),
    }
}

/// Pass 2 and the semantic checks, over a head [`scan`] found complete and valid.
pub(crate) fn parse_complete(head: &[u8]) -> Result<RequestHead<'_>, HeadError> {
    let malformed = |why| Err(HeadError::Malformed(why));
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => n,
        Ok(_) => return malformed("request head not terminated"),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(httparse::Error::HeaderName) => return malformed("invalid header name"),
        Err(httparse::Error::HeaderValue) => return malformed("invalid header value"),
        Err(httparse::Error::Version) => return malformed("unsupported HTTP version"),
        Err(httparse::Error::NewLine | httparse::Error::Token | httparse::Error::Status) => {
            return malformed("invalid request line")
        }
    };
    let (Some(method), Some(target), Some(minor_version)) = (req.method, req.path, req.version)
    else {
        return malformed("invalid request line");
    };
    if !target.starts_with('/') || !target.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return malformed("request target must be an absolute path");
    }
    let mut host = None;
    let mut hosts = 0;
    let mut content_length = None;
    let mut has_body = false;
    let mut close = false;
    let mut keep_alive_token = false;
    for h in req.headers.iter() {
        // obs-text is legal in general, but a header skipped for it is a header this server
        // does not see while a proxy in front may (`Transfer-Encoding: \x80chunked` would hide
        // a body): refused in every header, as no scraper sends it.
        let value = match std::str::from_utf8(h.value) {
            Ok(v) if v.is_ascii() => v,
            _ => return malformed("non-ASCII value in a request header"),
        };
        let value = value.trim_matches([' ', '\t']);
        if h.name.eq_ignore_ascii_case("host") {
            hosts += 1;
            if !value.bytes().all(host_byte) {
                return malformed("invalid Host header");
            }
            host = Some(value);
        } else if h.name.eq_ignore_ascii_case("content-length") {
            if content_length.is_some() {
                return malformed("more than one Content-Length header");
            }
            if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
                return malformed("invalid Content-Length header");
            }
            content_length = Some(value);
            has_body |= value.bytes().any(|b| b != b'0');
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            has_body = true;
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(|t| t.trim_matches([' ', '\t'])) {
                close |= token.eq_ignore_ascii_case("close");
                keep_alive_token |= token.eq_ignore_ascii_case("keep-alive");
            }
        }
    }
    match (minor_version, hosts) {
        (1, 0) => return malformed("missing Host header"),
        (_, n) if n > 1 => return malformed("more than one Host header"),
        _ => {}
    }
    let keep_alive = !close && (minor_version == 1 || keep_alive_token);
    Ok(RequestHead {
        method,
        target,
        minor_version,
        host,
        keep_alive,
        has_body,
        len,
    })
}

/// Bytes of `uri-host [ ":" port ]` (reg-name, IPv4, bracketed IPv6 / IPvFuture).
fn host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(bytes: &[u8]) -> RequestHead<'_> {
        parse_request_head(bytes)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(bytes)))
    }

    fn refused(bytes: &[u8]) -> HeadError {
        match parse_request_head(bytes) {
            Ok(h) => panic!("accepted {h:?} from {:?}", String::from_utf8_lossy(bytes)),
            Err(e) => e,
        }
    }

    #[test]
    fn valid_heads() {
        let h = ok(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nrest");
        assert_eq!(
            h,
            RequestHead {
                method: "GET",
                target: "/metrics",
                minor_version: 1,
                host: Some("x"),
                keep_alive: false,
                has_body: false,
                len: 53,
            }
        );
        assert!(ok(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").keep_alive);
        let h = ok(b"GET /metrics HTTP/1.0\r\n\r\n");
        assert!(!h.keep_alive && h.host.is_none());
        assert!(ok(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(ok(b"GET /m HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n").has_body);
        assert!(!ok(b"GET /m HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").has_body);
        assert!(ok(b"GET /m HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").has_body);
        // HTAB inside a value, bracketed IPv6 with port, empty Host (allowed by RFC 9110).
        ok(b"GET /m?a=1 HTTP/1.1\r\nHost: [::1]:9108\r\nX-A: a\tb\r\n\r\n");
        ok(b"GET /m HTTP/1.1\r\nHost:\r\n\r\n");
    }

    #[test]
    fn incomplete_is_not_an_error_until_the_limit() {
        assert_eq!(refused(b""), HeadError::Incomplete);
        assert_eq!(
            refused(b"GET /m HTTP/1.1\r\nHost: x\r\n"),
            HeadError::Incomplete
        );
        assert_eq!(
            refused(b"GET /m HTTP/1.1\r\nHost: x\r\n\r"),
            HeadError::Incomplete
        );
    }

    #[test]
    fn lenient_forms_are_refused() {
        let cases: &[(&[u8], &str)] = &[
            // Bare LF ending a header line: the "body" would run as a second request.
            (b"GET /m HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", "bare LF"),
            (b"GET /m HTTP/1.1\nHost: x\n\n", "bare LF"),
            (b"GET /m HTTP/1.1\r\nHost: x\r\n\n", "bare LF"),
            (b"GET /m HTTP/1.1\r\nHost: x\rX: y\r\n\r\n", "bare CR"),
            (b"GET /m HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n", "bare CR"),
            (b"GET /m HTTP/1.1\r\nHost: x\r\nX: a\0b\r\n\r\n", "NUL"),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n",
                "control",
            ),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n",
                "control",
            ),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n",
                "folding",
            ),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nX: a\r\n\tb\r\n\r\n",
                "folding",
            ),
            (b"\r\nGET /m HTTP/1.1\r\nHost: x\r\n\r\n", "empty line"),
            (b" GET /m HTTP/1.1\r\nHost: x\r\n\r\n", "whitespace"),
            (b"GET /m HTTP/1.1\r\n\r\n", "missing Host"),
            (
                b"GET /m HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
                "more than one Host",
            ),
            (
                b"GET /m HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n",
                "more than one Host",
            ),
            (b"GET /m HTTP/1.1\r\nHost: a b\r\n\r\n", "Host"),
            (b"GET /m HTTP/1.1\r\nHost: a/b\r\n\r\n", "Host"),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                "Content-Length",
            ),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                "Content-Length",
            ),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 1\r\n\r\n",
                "Content-Length",
            ),
            (b"GET /m HTTP/1.1\r\nHost : x\r\n\r\n", "header name"),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n",
                "header name",
            ),
            (b"GET  /m HTTP/1.1\r\nHost: x\r\n\r\n", "request line"),
            (b"GET /m HTTP/1.1 extra\r\nHost: x\r\n\r\n", "request line"),
            (b"GET /m HTTP/2\r\nHost: x\r\n\r\n", "version"),
            (b"GET m HTTP/1.1\r\nHost: x\r\n\r\n", "absolute path"),
            (
                b"GET http://h/m HTTP/1.1\r\nHost: h\r\n\r\n",
                "absolute path",
            ),
            (b"GARBAGE\r\n\r\n", ""),
            // obs-text in any header: a Transfer-Encoding skipped for it would hide a body,
            // and a request pipelined behind it would be answered.
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \x80chunked\r\n\r\n",
                "non-ASCII",
            ),
            (
                b"GET /m HTTP/1.1\r\nHost: x\r\nUser-Agent: caf\xc3\xa9\r\n\r\n",
                "non-ASCII",
            ),
        ];
        for (bytes, why) in cases {
            match refused(bytes) {
                HeadError::Malformed(m) => assert!(
                    m.contains(why),
                    "{:?}: reason {m:?}, expected {why:?}",
                    String::from_utf8_lossy(bytes)
                ),
                e => panic!("{:?}: {e:?}", String::from_utf8_lossy(bytes)),
            }
        }
    }

    #[test]
    fn refused_as_soon_as_the_byte_arrives() {
        // No need to wait for the end of the head (or the timeout) to refuse these.
        assert!(matches!(
            refused(b"GET /m HTTP/1.1\n"),
            HeadError::Malformed(_)
        ));
        assert!(matches!(refused(b"GET /m\0"), HeadError::Malformed(_)));
        assert!(matches!(
            refused(b"GET /m HTTP/1.1\r\nHost: x\r\n "),
            HeadError::Malformed(_)
        ));
    }

    /// A head of exactly the limit is accepted; one byte more is refused, complete or not.
    #[test]
    fn the_head_limit_is_exact() {
        let head = |len: usize| {
            let start = b"GET /m HTTP/1.1\r\nHost: x\r\nX: ";
            let mut v = start.to_vec();
            v.resize(len - 4, b'a');
            v.extend_from_slice(b"\r\n\r\n");
            assert_eq!(v.len(), len);
            v
        };
        assert_eq!(ok(&head(MAX_HEAD_BYTES)).len, MAX_HEAD_BYTES);
        assert_eq!(refused(&head(MAX_HEAD_BYTES + 1)), HeadError::TooLarge);
        // The limit alone decides while incomplete, whatever follows.
        let partial = &head(MAX_HEAD_BYTES + 1)[..MAX_HEAD_BYTES];
        assert_eq!(refused(partial), HeadError::TooLarge);
        assert_eq!(
            refused(&partial[..MAX_HEAD_BYTES - 1]),
            HeadError::Incomplete
        );
        // Bytes after a complete head (a pipelined request) do not count.
        let mut two = head(MAX_HEAD_BYTES);
        two.extend_from_slice(&head(MAX_HEAD_BYTES));
        assert_eq!(ok(&two).len, MAX_HEAD_BYTES);
        let many: String = (0..MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(
            refused(format!("GET /m HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes()),
            HeadError::TooManyHeaders
        );
    }

    /// Random heads built from the grammar's own bytes never panic, and whatever is accepted
    /// is a CRLF-only head within the limit whose scan, resumed anywhere, agrees.
    #[test]
    fn random_heads_never_panic_and_accepted_ones_are_strict() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let pieces: &[&[u8]] = &[
            b"GET",
            b" ",
            b"/metrics",
            b"HTTP/1.1",
            b"HTTP/1.0",
            b"\r\n",
            b"\r",
            b"\n",
            b"Host",
            b":",
            b" x",
            b"\t",
            b"\0",
            b"Content-Length",
            b"0",
            b"7",
            b"Transfer-Encoding",
            b"Connection",
            b"close",
            b"\r\n\r\n",
            b"\xff",
            b"a",
        ];
        let mut accepted = 0;
        for _ in 0..50_000 {
            let mut input = Vec::new();
            if rng.gen_bool(0.7) {
                input.extend_from_slice(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
            }
            for _ in 0..rng.gen_range(0..12) {
                input.extend_from_slice(pieces[rng.gen_range(0..pieces.len())]);
            }
            if rng.gen_bool(0.5) {
                input.extend_from_slice(b"\r\n\r\n");
            }
            if let Ok(h) = parse_request_head(&input) {
                accepted += 1;
                let head = &input[..h.len];
                assert!(h.len <= MAX_HEAD_BYTES && head.ends_with(b"\r\n\r\n"));
                for (i, b) in head.iter().enumerate() {
                    assert!(*b != 0 && (*b != b'\n' || head[i - 1] == b'\r'));
                    assert!(*b != b'\r' || head[i + 1] == b'\n');
                }
                let cut = rng.gen_range(0..=h.len);
                if let Scan::Incomplete(at) = scan(&input[..cut], 0) {
                    assert_eq!(scan(&input, at), Scan::Complete(h.len));
                }
            }
        }
        assert!(
            accepted > 1000,
            "only {accepted} accepted: the generator is too hostile"
        );
    }

    /// Scanning resumed at every offset gives the answer of one scan over the whole input.
    #[test]
    fn scan_resumes_anywhere() {
        let inputs: &[&[u8]] = &[
            b"GET /m HTTP/1.1\r\nHost: x\r\nX: y\r\n\r\nGET",
            b"GET /m HTTP/1.1\r\nHost: x\nX: y\r\n\r\n",
            b"GET /m HTTP/1.1\r\nHost: x\r\n y\r\n\r\n",
            b"GET /m HTTP/1.1\r\nHost: x\r\nX: a\rb",
        ];
        for input in inputs {
            let whole = scan(input, 0);
            for cut in 0..=input.len() {
                let first = scan(&input[..cut], 0);
                let got = match first {
                    Scan::Incomplete(at) => scan(input, at),
                    other => other,
                };
                assert_eq!(
                    got,
                    whole,
                    "{:?} cut at {cut}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }
}
