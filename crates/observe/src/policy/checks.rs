//! Validators shared by the connector blocks: timeouts, retries, sizes, environment-variable
//! names, header maps, endpoint URLs, hosts and ports, static dimensions and tags.
//!
//! Every check reports through the block's [`ObjectReader`], so problems carry their field path,
//! and no message ever repeats a value that could be a secret (URLs are never echoed).

use std::collections::BTreeMap;

use svc_document::grammar::is_header_name;
use svc_document::grammar::{is_env_var_name, looks_secret};
use svc_document::reader::{join, ObjectReader};

/// Largest accepted `max_retries` of any connector.
pub const MAX_RETRIES: i64 = 10;
/// Largest accepted `retry_backoff_seconds`.
pub const MAX_RETRY_BACKOFF_SECONDS: f64 = 60.0;
/// Largest accepted `stale_after_seconds` (one year).
pub const MAX_STALE_AFTER_SECONDS: f64 = 31_536_000.0;
/// Bounds of every `max_*_bytes` request/response size (1 KiB to 16 MiB).
pub const MIN_BYTES: i64 = 1024;
pub const MAX_BYTES: i64 = 16 * 1024 * 1024;
/// At most this many static dimensions, tags or metadata entries per connector.
pub const MAX_DIMENSIONS: usize = 10;

/// `timeout_seconds`: greater than 0, at most `max`.
pub fn timeout(r: &mut ObjectReader<'_>, default: f64, max: f64) -> f64 {
    r.number_in("timeout_seconds", default, 0.0, true, max)
}

/// Longest `export_deadline_seconds`: an hour (the longest timer interval that makes sense for
/// a metrics export).
pub const MAX_EXPORT_DEADLINE_SECONDS: f64 = 3600.0;

/// `export_deadline_seconds`: one deadline for a whole export run (every request, retry and
/// wait); greater than 0, at most an hour, default 60.
pub fn export_deadline(r: &mut ObjectReader<'_>) -> f64 {
    r.number_in(
        "export_deadline_seconds",
        60.0,
        0.0,
        true,
        MAX_EXPORT_DEADLINE_SECONDS,
    )
}

/// `max_retries`: 0 to [`MAX_RETRIES`], default 0.
pub fn retries(r: &mut ObjectReader<'_>) -> u32 {
    r.int_in("max_retries", 0, 0, MAX_RETRIES) as u32
}

/// `retry_backoff_seconds`: 0 to 60, default 0.25.
pub fn backoff(r: &mut ObjectReader<'_>) -> f64 {
    r.number_in(
        "retry_backoff_seconds",
        0.25,
        0.0,
        false,
        MAX_RETRY_BACKOFF_SECONDS,
    )
}

/// `stale_after_seconds`: null (never stale) or greater than 0, at most one year.
pub fn stale(r: &mut ObjectReader<'_>) -> Option<f64> {
    r.opt_number_in("stale_after_seconds", 0.0, true, MAX_STALE_AFTER_SECONDS)
}

/// A byte limit from [`MIN_BYTES`] to [`MAX_BYTES`] unless other bounds are given.
pub fn bytes(r: &mut ObjectReader<'_>, key: &'static str, default: u64, min: i64, max: i64) -> u64 {
    r.int_in(key, default as i64, min, max) as u64
}

/// An optional environment-variable name; `required` names the condition that needs it.
pub fn env_name(
    r: &mut ObjectReader<'_>,
    key: &'static str,
    required: Option<&str>,
) -> Option<String> {
    match r.opt_string(key) {
        Some(n) if is_env_var_name(&n) => Some(n),
        Some(_) => {
            r.problem(
                key,
                "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
            );
            None
        }
        None => {
            if let Some(why) = required {
                r.problem(key, format!("is required when {why}"));
            }
            None
        }
    }
}

/// `headers_env`: header name -> environment-variable name. `reserved` headers (compared
/// case-insensitively) are set by the connector itself and cannot be overridden.
pub fn headers_env(r: &mut ObjectReader<'_>, reserved: &[&str]) -> BTreeMap<String, String> {
    let map = r.string_map("headers_env");
    let base = r.path_of("headers_env");
    for (name, var) in &map {
        let path = join(&base, name);
        if !is_header_name(name) {
            r.problems().push(
                path,
                "must be a header name without spaces or control characters",
            );
        } else if reserved.iter().any(|h| h.eq_ignore_ascii_case(name)) {
            r.problems()
                .push(path, "is set by the connector and cannot be overridden");
        } else if !is_env_var_name(var) {
            r.problems().push(
                path,
                "must name an environment variable ([A-Za-z_][A-Za-z0-9_]*)",
            );
        }
    }
    map
}

/// Headers every HTTP connector sets itself.
pub const RESERVED_HEADERS: &[&str] = &[
    "Content-Type",
    "Content-Length",
    "Content-Encoding",
    "Transfer-Encoding",
    "Host",
    "Connection",
];

/// The parts of an `http(s)://host[:port][/path]` URL that the checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    pub host: String,
    pub port: Option<u16>,
    /// Empty or starting with `/`.
    pub path: String,
}

/// Why a URL was rejected (never containing the URL).
pub fn parse_endpoint(url: &str) -> Result<Endpoint, &'static str> {
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters");
    }
    let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err("must be an http:// or https:// URL");
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        return Err(
            "must not contain credentials; use the connector's environment-variable fields",
        );
    }
    if tail.contains('?') || tail.contains('#') {
        return Err("must not contain a query string or fragment");
    }
    let (host, port) =
        split_host_port(authority).ok_or("must have a valid host and optional port")?;
    Ok(Endpoint {
        https,
        host,
        port,
        path: tail.to_string(),
    })
}

/// `host[:port]` or `[v6][:port]`.
fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let close = rest.find(']')?;
        let host = &rest[..close];
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return None;
        }
        (format!("[{host}]"), &rest[close + 1..])
    } else {
        let (h, p) = match authority.rfind(':') {
            Some(i) => (&authority[..i], &authority[i..]),
            None => (authority, ""),
        };
        if !is_host_name(h) {
            return None;
        }
        (h.to_ascii_lowercase(), p)
    };
    let port = match port.strip_prefix(':') {
        None if port.is_empty() => None,
        None => return None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return None,
        },
    };
    Some((host, port))
}

/// A DNS name or IPv4 literal: 1 to 253 bytes of `[A-Za-z0-9.-]`, labels not empty.
pub fn is_host_name(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Loopback hosts: `localhost`, `127.0.0.0/8`, `[::1]`.
pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") || host == "[::1]" || host == "::1" {
        return true;
    }
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => false,
    }
}

/// Reads an endpoint URL field: credentials, query and fragment are rejected; plain http only
/// for loopback hosts. `required` names the condition under which it must be present;
/// `path_rule` is `(path, condition)`: the path the URL must have when the condition holds.
pub fn endpoint(
    r: &mut ObjectReader<'_>,
    key: &'static str,
    required: Option<&str>,
    path_rule: Option<(&str, &str)>,
) -> Option<String> {
    let url = r.opt_string(key);
    let Some(url) = url else {
        if let Some(why) = required {
            r.problem(key, format!("is required when {why}"));
        }
        return None;
    };
    match parse_endpoint(&url) {
        Err(why) => r.problem(key, why),
        Ok(ep) => {
            if !ep.https && !is_loopback_host(&ep.host) {
                r.problem(
                    key,
                    "plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https",
                );
            }
            if let Some((path, why)) = path_rule {
                if ep.path != path {
                    r.problem(key, format!("path must be {path} when {why}"));
                }
            }
        }
    }
    Some(url)
}

/// `host` of a datagram connector: a DNS name or IP literal.
pub fn host(r: &mut ObjectReader<'_>, default: &str) -> String {
    let h = r.string_or("host", default);
    let ok = is_host_name(&h) || h.parse::<std::net::IpAddr>().is_ok();
    if !ok {
        r.problem("host", "must be a host name or IP address");
    }
    h
}

/// `port`: 1 to 65535.
pub fn port(r: &mut ObjectReader<'_>, default: u16) -> u16 {
    r.int_in("port", default as i64, 1, 65535) as u16
}

/// Datagram transport of the StatsD and syslog connectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Udp,
    Unixgram,
}

/// `transport` and `socket_path` together: `unixgram` needs an absolute `socket_path`.
pub fn transport(r: &mut ObjectReader<'_>) -> (Transport, Option<String>) {
    let transport = r.one_of(
        "transport",
        Transport::Udp,
        &[("udp", Transport::Udp), ("unixgram", Transport::Unixgram)],
    );
    let socket_path = r.opt_string("socket_path");
    match (&socket_path, transport) {
        (None, Transport::Unixgram) => {
            r.problem("socket_path", "is required when transport is unixgram")
        }
        (Some(p), _) if !p.starts_with('/') || p.contains('\0') || p.len() > 107 => r.problem(
            "socket_path",
            "must be an absolute path of at most 107 bytes",
        ),
        _ => {}
    }
    (transport, socket_path)
}

/// Words that make a dimension or tag name sensitive (spec, cloud-B list) or high-cardinality.
const SENSITIVE_NAME_WORDS: &[&str] = &[
    "subject",
    "classification",
    "label",
    "message",
    "table",
    "file",
    "host",
    "user",
    "token",
    "secret",
    "password",
    "credential",
    "payload",
    "header",
    "stream",
    "consumer",
    "account",
    "url",
    "endpoint",
    "path",
];
const HIGH_CARDINALITY_NAME_WORDS: &[&str] = &[
    "id",
    "uuid",
    "guid",
    "request",
    "trace",
    "span",
    "timestamp",
    "ip",
    "address",
    "sequence",
];

/// Why a static dimension or tag name is rejected, if it is.
pub fn dimension_name_problem(name: &str) -> Option<&'static str> {
    let shape = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphabetic()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if !shape {
        return Some("must be 1 to 64 characters of [A-Za-z0-9_.-] starting with a letter");
    }
    let lower = name.to_ascii_lowercase();
    if looks_secret(name)
        || SENSITIVE_NAME_WORDS.iter().any(|w| lower.contains(w))
        || lower.split(['_', '-', '.']).any(|t| t == "key")
    {
        return Some("looks sensitive (names like subject, label, message, table, file, host, user, token, secret, key are rejected)");
    }
    if lower
        .split(['_', '-', '.'])
        .any(|t| HIGH_CARDINALITY_NAME_WORDS.contains(&t))
    {
        return Some(
            "looks high-cardinality (ids, addresses, timestamps are not static dimensions)",
        );
    }
    None
}

/// Why a static dimension or tag value is rejected, if it is.
pub fn dimension_value_problem(value: &str) -> Option<&'static str> {
    let shape = !value.is_empty()
        && value.len() <= 128
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b));
    if !shape {
        return Some("must be 1 to 128 characters of [A-Za-z0-9_.:/-]");
    }
    if looks_secret(value) {
        return Some("looks like a secret");
    }
    // Long digit or hex runs are ids, hashes or keys, not static low-cardinality values.
    let mut run = 0;
    for b in value.bytes() {
        run = if b.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 16 {
            return Some("looks high-cardinality or secret (long hex or digit run)");
        }
    }
    None
}

/// A static dimension or tag map: at most [`MAX_DIMENSIONS`] entries, every name and value
/// checked. `at_least_one` makes an empty map a problem.
pub fn dimensions(
    r: &mut ObjectReader<'_>,
    key: &'static str,
    default: BTreeMap<String, String>,
    at_least_one: bool,
) -> BTreeMap<String, String> {
    let present = r.has(key);
    let map = if present { r.string_map(key) } else { default };
    let base = r.path_of(key);
    if map.len() > MAX_DIMENSIONS {
        r.problem(key, format!("must have at most {MAX_DIMENSIONS} entries"));
    }
    if at_least_one && map.is_empty() {
        r.problem(key, "must have at least one static dimension");
    }
    for (name, value) in &map {
        let path = join(&base, name);
        if let Some(why) = dimension_name_problem(name) {
            r.problems().push(path, why);
        } else if let Some(why) = dimension_value_problem(value) {
            r.problems().push(path, format!("value {why}"));
        }
    }
    map
}

/// A bounded, low-cardinality, non-sensitive static string (SIEM source, sourcetype, ...).
pub fn static_value(r: &mut ObjectReader<'_>, key: &'static str, default: &str) -> String {
    let v = r.string_or(key, default);
    if let Some(why) = dimension_value_problem(&v) {
        r.problem(key, why);
    }
    v
}

/// An identifier-like label for a generated configuration component. The collector's
/// configuration language refers to components as `<type>.<label>.<export>`, so a label must
/// be an identifier there: letters, digits and `_` (a `-` would read as a subtraction).
pub fn component_label(r: &mut ObjectReader<'_>, key: &'static str, default: &str) -> String {
    let v = r.string_or(key, default);
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.as_bytes()[0].is_ascii_alphabetic()
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !ok {
        r.problem(
            key,
            "must be 1 to 64 characters of [A-Za-z0-9_] starting with a letter (an identifier of the collector configuration)",
        );
    } else if looks_secret(&v) {
        r.problem(key, "must not look like a credential");
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let ep = parse_endpoint("https://collector.example:4318/v1/metrics").unwrap();
        assert_eq!(
            ep,
            Endpoint {
                https: true,
                host: "collector.example".into(),
                port: Some(4318),
                path: "/v1/metrics".into()
            }
        );
        assert_eq!(parse_endpoint("http://[::1]:9/x").unwrap().host, "[::1]");
        assert_eq!(parse_endpoint("http://127.0.0.1").unwrap().path, "");
        for bad in [
            "ftp://x",
            "https://user:pw@x/",
            "https://x/?token=1",
            "https://x/#f",
            "https://x:0/",
            "https://x:99999/",
            "https://x:/",
            "https:///v1",
            "https://a b/",
            "https://[zz]/",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_hosts() {
        for h in ["localhost", "127.0.0.1", "127.9.9.9", "[::1]"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["10.0.0.1", "localhost.example", "0.0.0.0", "[::]"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn dimension_rules() {
        for ok in ["source", "env", "team", "region_name", "service"] {
            assert_eq!(dimension_name_problem(ok), None, "{ok}");
        }
        for bad in [
            "subject",
            "subject_family",
            "Classification",
            "labels",
            "message_type",
            "table",
            "file_path",
            "hostname",
            "user",
            "api_key",
            "key",
            "secret",
            "token",
            "request_id",
            "client_ip",
            "",
            "1abc",
            "a b",
        ] {
            assert!(dimension_name_problem(bad).is_some(), "{bad}");
        }
        for ok in ["svc", "prod", "eu-west-1", "svc:metrics"] {
            assert_eq!(dimension_value_problem(ok), None, "{ok}");
        }
        for bad in ["", "a b", "deadbeefdeadbeef00", "my-secret", "x,y", "a|b"] {
            assert!(dimension_value_problem(bad).is_some(), "{bad}");
        }
    }
}
