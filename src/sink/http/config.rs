//! The `sink` block of `type: http`: where requests go, what they carry, how they are batched,
//! signed and retried, and which statuses mean what. Every problem is reported with its field
//! path, all at once. Secrets are never config values: headers and signing secrets name
//! environment variables, read when the sink is built.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::backoff::{Backoff, Jitter};
use crate::document::grammar::{is_env_var_name, is_header_name, looks_secret};
use crate::document::reader::ObjectReader;
use crate::sink::url_scheme::scheme_problem;
use crate::text::secrets::is_secret_name;

pub const DEFAULT_SUCCESS_STATUSES: &[u16] = &[200, 201, 202, 204];
pub const DEFAULT_RETRY_STATUSES: &[u16] = &[408, 425, 429, 500, 502, 503, 504];
/// Statuses that judge a record (malformed, too large, unsupported type, unprocessable).
pub const DEFAULT_DEAD_LETTER_STATUSES: &[u16] = &[400, 413, 415, 422];
/// Statuses that say the sink is unusable (credentials, permission, a moved endpoint, a
/// proxy): never a record's fault, so never a dead-letter status.
const SINK_LEVEL_STATUSES: &[u16] = &[401, 403, 404, 407];
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// Header names the sink sets itself: a static, secret or forwarded header of the same name
/// would contradict the request's framing, its signature or its idempotency key.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "expect",
    "keep-alive",
    "proxy-connection",
    "user-agent",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Post,
    Put,
    Patch,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
        }
    }
}

/// What one record of a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// The record every other sink stores (payload protection and custody included).
    Envelope,
    /// The stored payload alone (as the envelope's `payload` holds it).
    Payload,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// One message per request; the body is the record itself.
    None,
    /// A JSON array of records.
    JsonArray,
    /// One record per line, each ending in `\n`.
    Ndjson,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMethod {
    Options,
    Head,
    Get,
}

impl ProbeMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeMethod::Options => "OPTIONS",
            ProbeMethod::Head => "HEAD",
            ProbeMethod::Get => "GET",
        }
    }
}

/// The `http` sink block. Holds names of environment variables, never their values (it is
/// printed in the pipeline dump).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSinkConfig {
    pub url: String,
    pub allow_http_for_local_testing: bool,
    pub method: Method,
    pub body: BodyMode,
    pub batching: Batching,
    pub max_batch_messages: usize,
    pub max_batch_bytes: usize,
    pub max_request_bytes: usize,
    pub idempotency_header: String,
    pub gzip: bool,
    /// Static, non-secret headers.
    pub headers: BTreeMap<String, String>,
    /// Header name -> environment variable holding its value.
    pub headers_env: BTreeMap<String, String>,
    /// NATS headers (as kept by `envelope.keep_headers`) forwarded as request headers;
    /// `batching: none` only (a batch has no single message's headers).
    pub keep_headers: Vec<String>,
    /// Environment variables holding `whsec_...` signing secrets; empty = unsigned.
    pub signing_secrets_env: Vec<String>,
    pub tls_ca_file: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub proxy: Option<String>,
    pub no_proxy: Vec<String>,
    /// Whole request: connect, TLS, send, status and the bounded body read.
    pub request_timeout: Duration,
    pub max_concurrent_requests: usize,
    pub success_statuses: Vec<u16>,
    pub retry_statuses: Vec<u16>,
    /// Statuses that refuse one record for good (dead-lettered); any status in none of the
    /// three lists refuses the sink itself (NAK, never a dead letter).
    pub dead_letter_statuses: Vec<u16>,
    pub retry: Backoff,
    /// How long one write may keep retrying in the call before the batch is NAKed.
    pub retry_budget: Duration,
    pub max_retry_after: Duration,
    pub probe_method: ProbeMethod,
    pub probe_url: Option<String>,
}

const METHODS: &[(&str, Method)] = &[
    ("POST", Method::Post),
    ("PUT", Method::Put),
    ("PATCH", Method::Patch),
];
const BODIES: &[(&str, BodyMode)] = &[
    ("envelope", BodyMode::Envelope),
    ("payload", BodyMode::Payload),
];
const BATCHINGS: &[(&str, Batching)] = &[
    ("none", Batching::None),
    ("json_array", Batching::JsonArray),
    ("ndjson", Batching::Ndjson),
];
const PROBES: &[(&str, ProbeMethod)] = &[
    ("OPTIONS", ProbeMethod::Options),
    ("HEAD", ProbeMethod::Head),
    ("GET", ProbeMethod::Get),
];

impl HttpSinkConfig {
    /// Sink workers that keep every request thread busy when `delivery.sink_workers` is not
    /// set: a worker holds one batch, a batch of `batch_size` makes this many requests, so
    /// `max_concurrent_requests` threads need that many batches at once, and one more worker
    /// prepares the next batch while the others wait for their verdicts. With 2 workers,
    /// batches of 256 in requests of 100 kept at most 6 of 8 request threads busy.
    pub fn workers_to_fill(&self, batch_size: usize) -> usize {
        let per_batch = match self.batching {
            Batching::None => batch_size,
            Batching::JsonArray | Batching::Ndjson => batch_size.div_ceil(self.max_batch_messages),
        };
        self.max_concurrent_requests.div_ceil(per_batch.max(1)) + 1
    }

    /// Reads the fields after `type`; every problem is recorded on `r`.
    pub fn read(r: &mut ObjectReader<'_>) -> HttpSinkConfig {
        let allow_http = r.bool_or("allow_http_for_local_testing", false);
        let url = r.req_string("url");
        if !url.is_empty() {
            if let Some(why) = url_problem(&url, allow_http) {
                r.problem("url", why);
            }
        }
        let method = r.one_of("method", Method::Post, METHODS);
        let body = r.one_of("body", BodyMode::Envelope, BODIES);
        let batching = r.one_of("batching", Batching::JsonArray, BATCHINGS);
        let max_batch_messages = r.int_in("max_batch_messages", 100, 1, 10_000) as usize;
        let max_batch_bytes = r.int_in("max_batch_bytes", 1_048_576, 1024, 268_435_456) as usize;
        let max_request_bytes =
            r.int_in("max_request_bytes", 4_194_304, 1024, 268_435_456) as usize;
        if max_request_bytes < max_batch_bytes {
            r.problem("max_request_bytes", "must be at least max_batch_bytes");
        }
        let idempotency_header = r.header_name_or("idempotency_header", DEFAULT_IDEMPOTENCY_HEADER);
        // The narrow rule here: `Idempotency-Key` (the default) names a key, not a secret.
        if is_reserved(&idempotency_header) || looks_secret(&idempotency_header) {
            r.problem(
                "idempotency_header",
                "names a header the sink cannot use for the key",
            );
        }
        let gzip = r.bool_or("gzip", false);
        let headers = r.string_map("headers");
        let headers_env = r.string_map("headers_env");
        let keep_headers = r.string_list("keep_headers");
        check_headers(
            r,
            &headers,
            &headers_env,
            &keep_headers,
            &idempotency_header,
        );
        if batching != Batching::None && !keep_headers.is_empty() {
            r.problem(
                "keep_headers",
                "needs batching none (a batched request has no single message's headers)",
            );
        }
        let signing_secrets_env = r.string_list("signing_secrets_env");
        for (i, v) in signing_secrets_env.iter().enumerate() {
            if !is_env_var_name(v) {
                r.problems().push(
                    format!("{}[{i}]", r.path_of("signing_secrets_env")),
                    "must be an environment variable name",
                );
            }
        }
        let tls_ca_file = path_field(r, "tls_ca_file");
        let tls_cert_file = path_field(r, "tls_cert_file");
        let tls_key_file = path_field(r, "tls_key_file");
        match (&tls_cert_file, &tls_key_file) {
            (Some(_), None) => r.problem("tls_key_file", "is required with tls_cert_file"),
            (None, Some(_)) => r.problem("tls_cert_file", "is required with tls_key_file"),
            _ => {}
        }
        let proxy = r.opt_string("proxy");
        if let Some(why) = proxy.as_deref().and_then(proxy_problem) {
            r.problem("proxy", why);
        }
        let no_proxy = r.string_list("no_proxy");
        if !no_proxy.is_empty() && proxy.is_none() {
            r.problem("no_proxy", "is only used with proxy");
        }
        let request_timeout =
            Duration::from_secs_f64(r.number_in("request_timeout_seconds", 10.0, 0.0, true, 300.0));
        let max_concurrent_requests = r.int_in("max_concurrent_requests", 8, 1, 256) as usize;
        let success_statuses = status_list(r, "success_statuses", DEFAULT_SUCCESS_STATUSES);
        if let Some(bad) = success_statuses.iter().find(|s| !(200..300).contains(*s)) {
            r.problem("success_statuses", format!("{bad} is not a 2xx status"));
        }
        let retry_statuses = status_list(r, "retry_statuses", DEFAULT_RETRY_STATUSES);
        if let Some(both) = retry_statuses.iter().find(|s| success_statuses.contains(s)) {
            r.problem("retry_statuses", format!("{both} is also a success status"));
        }
        let dead_letter_statuses = dead_letter_list(r, &success_statuses, &retry_statuses);
        let retry = Backoff::read_sink_retry(r, 1, Jitter::Equal);
        let retry_budget =
            Duration::from_secs(r.int_in("retry_budget_seconds", 30, 0, 3600) as u64);
        let max_retry_after =
            Duration::from_secs(r.int_in("max_retry_after_seconds", 60, 0, 3600) as u64);
        let probe_method = r.one_of("probe_method", ProbeMethod::Options, PROBES);
        let probe_url = r.opt_string("probe_url");
        if let Some(why) = probe_url
            .as_deref()
            .and_then(|u| url_problem(u, allow_http))
        {
            r.problem("probe_url", why);
        }
        HttpSinkConfig {
            url,
            allow_http_for_local_testing: allow_http,
            method,
            body,
            batching,
            max_batch_messages,
            max_batch_bytes,
            max_request_bytes,
            idempotency_header,
            gzip,
            headers,
            headers_env,
            keep_headers,
            signing_secrets_env,
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
            proxy,
            no_proxy,
            request_timeout,
            max_concurrent_requests,
            success_statuses,
            retry_statuses,
            dead_letter_statuses,
            retry,
            retry_budget,
            max_retry_after,
            probe_method,
            probe_url,
        }
    }
}

fn is_reserved(name: &str) -> bool {
    RESERVED_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
}

/// Static headers must not look secret ([`is_secret_name`]: their values are in the config
/// file, the pipeline dump and `show-effective-config`); secret headers come from the environment; forwarded ones are never secret-looking.
/// None may name a header the sink sets, and no name may appear twice across the three.
fn check_headers(
    r: &ObjectReader<'_>,
    headers: &BTreeMap<String, String>,
    headers_env: &BTreeMap<String, String>,
    keep: &[String],
    idempotency_header: &str,
) {
    let problems = r.problems();
    let mut seen: Vec<String> = vec![idempotency_header.to_ascii_lowercase()];
    let mut name_problem = |field: String, name: &str| -> bool {
        if !is_header_name(name) {
            problems.push(
                field,
                "must be a header name without spaces or control characters",
            );
        } else if is_reserved(name) || name.eq_ignore_ascii_case(idempotency_header) {
            problems.push(field, "is set by the sink itself");
        } else if seen.contains(&name.to_ascii_lowercase()) {
            problems.push(field, "duplicate header name (names are case-insensitive)");
        } else {
            seen.push(name.to_ascii_lowercase());
            return false;
        }
        true
    };
    for (name, value) in headers {
        let field = format!("{}.{name}", r.path_of("headers"));
        if name_problem(field.clone(), name) {
            continue;
        }
        if is_secret_name(name) {
            problems.push(
                field,
                "looks like a secret-bearing header; put its value in an environment variable \
                 and name it in headers_env",
            );
        } else if value.len() > 4096 || value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            problems.push(
                field,
                "must be at most 4096 bytes without control characters",
            );
        }
    }
    for (name, var) in headers_env {
        let field = format!("{}.{name}", r.path_of("headers_env"));
        if name_problem(field.clone(), name) {
            continue;
        }
        if !is_env_var_name(var) {
            problems.push(field, "must name an environment variable");
        }
    }
    for (i, name) in keep.iter().enumerate() {
        let field = format!("{}[{i}]", r.path_of("keep_headers"));
        if name_problem(field.clone(), name) {
            continue;
        }
        if is_secret_name(name) {
            problems.push(
                field,
                "looks like a secret-bearing header and is never forwarded",
            );
        } else if name.to_ascii_lowercase().starts_with("nats-") {
            problems.push(
                field,
                "names a broker header (Nats-*); those are never forwarded",
            );
        }
    }
}

fn path_field(r: &mut ObjectReader<'_>, key: &'static str) -> Option<PathBuf> {
    let v = r.opt_string(key)?;
    if v.trim().is_empty() {
        r.problem(key, "must not be empty");
        return None;
    }
    Some(PathBuf::from(v))
}

fn status_list(r: &mut ObjectReader<'_>, key: &'static str, default: &[u16]) -> Vec<u16> {
    let Some(v) = r.raw(key) else {
        return default.to_vec();
    };
    let list = v.as_array().map(|items| {
        items
            .iter()
            .map(|i| {
                i.as_u64()
                    .filter(|n| (100..600).contains(n))
                    .map(|n| n as u16)
            })
            .collect::<Option<Vec<u16>>>()
    });
    match list {
        Some(Some(l)) if !l.is_empty() => l,
        _ => {
            r.problem(
                key,
                "must be a non-empty array of HTTP statuses (100 to 599)",
            );
            default.to_vec()
        }
    }
}

/// `dead_letter_statuses`: 4xx or 5xx statuses that judge a record; never one that says the
/// sink is unusable, never a success or retry status.
fn dead_letter_list(r: &mut ObjectReader<'_>, success: &[u16], retry: &[u16]) -> Vec<u16> {
    const KEY: &str = "dead_letter_statuses";
    let list = status_list(r, KEY, DEFAULT_DEAD_LETTER_STATUSES);
    for s in &list {
        let why = if !(400..600).contains(s) {
            format!("{s} is not a 4xx or 5xx status")
        } else if SINK_LEVEL_STATUSES.contains(s) {
            format!(
                "{s} says the sink is unusable (credentials, permission, a moved endpoint, a \
                 proxy), not that a record is bad; it is never dead-lettered"
            )
        } else if success.contains(s) || retry.contains(s) {
            format!("{s} is also a success or retry status")
        } else {
            continue;
        };
        r.problem(KEY, why);
        return DEFAULT_DEAD_LETTER_STATUSES.to_vec();
    }
    list
}

/// Why a request URL is not acceptable, if it is not. Never echoes the URL (it might carry
/// credentials).
pub fn url_problem(text: &str, allow_http_for_local_testing: bool) -> Option<String> {
    let Ok(u) = url::Url::parse(text) else {
        return Some("must be a valid absolute URL".into());
    };
    if !u.username().is_empty() || u.password().is_some() {
        return Some(
            "must not contain credentials (use headers_env for an Authorization header)".into(),
        );
    }
    if u.fragment().is_some() {
        return Some("must not contain a fragment".into());
    }
    let Some(host) = u.host_str() else {
        return Some("must name a host".into());
    };
    scheme_problem(u.scheme(), host, allow_http_for_local_testing)
}

/// A proxy is `http://host:port` without credentials (they would be a secret in the config).
fn proxy_problem(text: &str) -> Option<String> {
    let Ok(u) = url::Url::parse(text) else {
        return Some("must be a valid absolute URL".into());
    };
    if !u.username().is_empty() || u.password().is_some() {
        return Some("must not contain credentials".into());
    }
    if u.scheme() != "http" {
        return Some("must be an http:// proxy URL".into());
    }
    if u.host_str().is_none() || u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
        return Some("must be http://host[:port] only".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::SinkConfig;

    fn read(sink: &str) -> Result<HttpSinkConfig, Vec<String>> {
        let v: serde_json::Value = serde_json::from_str(sink).unwrap();
        let problems = crate::document::reader::Problems::new();
        let cfg = SinkConfig::read(ObjectReader::at("sink".into(), &v, &problems));
        if !problems.is_empty() {
            return Err(problems
                .into_vec()
                .into_iter()
                .map(|p| p.to_string())
                .collect());
        }
        match cfg {
            Some(SinkConfig::Http(c)) => Ok(*c),
            _ => panic!("not an http sink"),
        }
    }

    #[test]
    fn defaults_follow_the_documentation() {
        let c = read(r#"{"type": "http", "url": "https://ingest.example.com/events"}"#).unwrap();
        assert_eq!(c.method, Method::Post);
        assert_eq!(c.body, BodyMode::Envelope);
        assert_eq!(c.batching, Batching::JsonArray);
        assert_eq!(c.max_batch_messages, 100);
        assert_eq!(c.max_batch_bytes, 1_048_576);
        assert_eq!(c.max_request_bytes, 4_194_304);
        assert_eq!(c.idempotency_header, "Idempotency-Key");
        assert_eq!(c.success_statuses, vec![200, 201, 202, 204]);
        assert_eq!(c.retry_statuses, vec![408, 425, 429, 500, 502, 503, 504]);
        assert_eq!(c.dead_letter_statuses, vec![400, 413, 415, 422]);
        assert_eq!(c.probe_method, ProbeMethod::Options);
        assert_eq!(c.max_retry_after, Duration::from_secs(60));
        assert!(!c.gzip && c.signing_secrets_env.is_empty());
    }

    #[test]
    fn urls_follow_the_object_store_rules() {
        let p = |u: &str, allow: bool| {
            read(&format!(
                r#"{{"type": "http", "url": "{u}", "allow_http_for_local_testing": {allow}}}"#
            ))
            .err()
            .unwrap_or_default()
        };
        assert!(p("https://h.example/x?y=1", false).is_empty());
        assert!(p("http://127.0.0.1:8080/hook", true).is_empty());
        assert_eq!(
            p("http://127.0.0.1:8080/hook", false),
            vec![
                "sink.url: must use https (http is allowed only with \
                  allow_http_for_local_testing = true and a loopback host)"
            ]
        );
        assert_eq!(
            p("http://example.com/hook", true),
            vec![
                "sink.url: http is allowed only for the loopback hosts localhost, 127.0.0.1 \
                  and [::1]"
            ]
        );
        assert_eq!(
            p("https://user:pw@h.example/", false),
            vec![
                "sink.url: must not contain credentials (use headers_env for an \
                  Authorization header)"
            ]
        );
        assert_eq!(
            p("https://h.example/#frag", false),
            vec!["sink.url: must not contain a fragment"]
        );
        assert_eq!(
            p("ftp://h.example/", false),
            vec!["sink.url: must be an https URL"]
        );
    }

    #[test]
    fn secret_headers_are_refused_in_static_headers_and_reserved_names_everywhere() {
        let problems = read(
            r#"{"type": "http", "url": "https://h.example/",
                "headers": {"Authorization": "Bearer abc", "X-Api-Key": "k", "X-Team": "ops",
                            "Content-Type": "text/plain"},
                "headers_env": {"Authorization": "SVC_TOKEN", "X-Team": "T", "X-Ok": "not a var"},
                "keep_headers": ["Trace-Id"]}"#,
        )
        .unwrap_err();
        assert_eq!(
            problems,
            vec![
                "sink.headers.Authorization: looks like a secret-bearing header; put its value \
                 in an environment variable and name it in headers_env",
                "sink.headers.Content-Type: is set by the sink itself",
                "sink.headers.X-Api-Key: looks like a secret-bearing header; put its value in \
                 an environment variable and name it in headers_env",
                "sink.headers_env.Authorization: duplicate header name (names are \
                 case-insensitive)",
                "sink.headers_env.X-Ok: must name an environment variable",
                "sink.headers_env.X-Team: duplicate header name (names are case-insensitive)",
                "sink.keep_headers: needs batching none (a batched request has no single \
                 message's headers)",
            ]
        );
        let problems = read(
            r#"{"type": "http", "url": "https://h.example/", "batching": "none",
                "keep_headers": ["Authorization", "Nats-Msg-Id", "Idempotency-Key", "Trace-Id"]}"#,
        )
        .unwrap_err();
        assert_eq!(
            problems,
            vec![
                "sink.keep_headers[0]: looks like a secret-bearing header and is never forwarded",
                "sink.keep_headers[1]: names a broker header (Nats-*); those are never forwarded",
                "sink.keep_headers[2]: is set by the sink itself",
            ]
        );
    }

    #[test]
    fn dead_letter_statuses_judge_records_never_the_sink() {
        let p = |list: &str| {
            read(&format!(
                r#"{{"type": "http", "url": "https://h.example/", "dead_letter_statuses": {list}}}"#
            ))
            .err()
            .unwrap_or_default()
        };
        assert!(p("[400, 409, 410, 422]").is_empty());
        assert_eq!(
            p("[400, 401]"),
            vec![
                "sink.dead_letter_statuses: 401 says the sink is unusable (credentials, \
                 permission, a moved endpoint, a proxy), not that a record is bad; it is never \
                 dead-lettered"
            ]
        );
        assert_eq!(
            p("[301]"),
            vec!["sink.dead_letter_statuses: 301 is not a 4xx or 5xx status"]
        );
        assert_eq!(
            p("[503]"),
            vec!["sink.dead_letter_statuses: 503 is also a success or retry status"]
        );
        assert_eq!(
            p("[]"),
            vec![
                "sink.dead_letter_statuses: must be a non-empty array of HTTP statuses (100 to \
                 599)"
            ]
        );
    }

    #[test]
    fn header_names_that_carry_keys_are_secret_under_one_rule() {
        for name in [
            "Ocp-Apim-Subscription-Key",
            "X-Functions-Key",
            "X-Auth-Key",
            "X-Hub-Signature",
            "X-Signature",
            "Authentication",
            "X-Access-Key",
            "Proxy-Authorization",
            "X-Otp",
            "X-Pin",
            "X-Csrf",
            "X-Sas",
        ] {
            let problems = read(&format!(
                r#"{{"type": "http", "url": "https://h.example/", "headers": {{"{name}": "v"}}}}"#
            ))
            .unwrap_err();
            assert_eq!(
                problems,
                vec![format!(
                    "sink.headers.{name}: looks like a secret-bearing header; put its value in \
                     an environment variable and name it in headers_env"
                )]
            );
            let env = format!(
                r#"{{"type": "http", "url": "https://h.example/", "headers_env": {{"{name}": "V"}}}}"#
            );
            assert!(read(&env).is_ok(), "{name} from the environment");
        }
    }

    #[test]
    fn statuses_tls_and_proxy_are_checked_together() {
        let problems = read(
            r#"{"type": "http", "url": "https://h.example/", "success_statuses": [200, 302],
                "retry_statuses": [200, 700], "tls_cert_file": "/etc/c.pem",
                "proxy": "http://u:p@proxy.example:3128", "no_proxy": ["a.example"],
                "max_batch_bytes": 8192, "max_request_bytes": 4096}"#,
        )
        .unwrap_err();
        assert_eq!(
            problems,
            vec![
                "sink.max_request_bytes: must be at least max_batch_bytes",
                "sink.tls_key_file: is required with tls_cert_file",
                "sink.proxy: must not contain credentials",
                "sink.success_statuses: 302 is not a 2xx status",
                "sink.retry_statuses: must be a non-empty array of HTTP statuses (100 to 599)",
            ]
        );
    }
}
