//! Broker server monitoring (`broker_server_monitoring`): the exporter polls the broker server's
//! monitoring endpoints (`/varz`, `/jsz`, `/healthz`, ...), extracts the allowed dotted fields
//! and renders the numeric ones as text-exposition gauges. The runner never polls.
//!
//! - Only the endpoints of `allowed_endpoints` are requested: `GET <base_url><endpoint>`, no
//!   query, no redirects followed (a `3xx` fails the poll), no proxy (the monitoring listener
//!   is an internal address), `timeout_seconds` for the whole request.
//! - TLS is verified against the Mozilla roots, or only against `ca_file` when it is set;
//!   `verify_tls: false` is accepted by the policy only for a loopback `base_url`.
//! - The body is read through `take(max_response_bytes + 1)`: a longer body fails the poll
//!   without ever being held in memory beyond the limit.
//! - Each allowed field is looked up in each endpoint's JSON document by its dotted path.
//!   A number is rendered; a missing value, an object or an array is null; strings and booleans
//!   are scalars but not numbers and are never rendered. Raw monitoring JSON, the base URL,
//!   server, account, stream and consumer names never leave this module: only the numbers of
//!   the allowed paths, under names built from the endpoint and the path.
//! - Any failure (connect, TLS, status other than 200, oversize, invalid JSON) fails the whole
//!   poll: nothing partial is rendered.
//!
//! Metric names: `<namespace>_broker_<endpoint>_<path with . as _>`, lower-cased
//! (`svc_broker_varz_mem`, `svc_broker_jsz_messages`). Names the exposition lint reserves
//! get `_value` appended (a gauge ending in `_total`, `_count`, `_sum` or `_bucket`). All are
//! gauges (`# TYPE ... gauge`): the monitoring endpoints report current values and process
//! totals alike, and a gauge is the type that makes no promise the source does not keep.

use std::io::Read;
use std::time::Duration;

use serde_json::Value;

use crate::exposition::{escape_help, format_value};
use crate::policy::BrokerServerMonitoring;
use svc_text::peer::PeerText;

/// What a dotted path found.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Number(f64),
    /// A string: a scalar, never rendered (its value is not kept).
    Text,
    /// A boolean: a scalar, never rendered.
    Bool,
    /// Missing, null, an object or an array.
    Null,
}

impl FieldValue {
    /// Short description for the dry-run report (no value of a string is ever shown).
    pub fn describe(&self) -> String {
        match self {
            FieldValue::Number(v) => format!("number {}", format_value(*v)),
            FieldValue::Text => "string (not rendered)".into(),
            FieldValue::Bool => "boolean (not rendered)".into(),
            FieldValue::Null => "null (missing or not a scalar)".into(),
        }
    }
}

/// Looks up a dotted path (`jetstream.stats.memory`) in a JSON document.
pub fn extract(doc: &Value, path: &str) -> FieldValue {
    let mut cur = doc;
    for token in path.split('.') {
        match cur.get(token) {
            Some(v) => cur = v,
            None => return FieldValue::Null,
        }
    }
    match cur {
        Value::Number(n) => match n.as_f64() {
            Some(v) if v.is_finite() => FieldValue::Number(v),
            _ => FieldValue::Null,
        },
        Value::String(_) => FieldValue::Text,
        Value::Bool(_) => FieldValue::Bool,
        _ => FieldValue::Null,
    }
}

/// Suffixes the exposition lint reserves for other types.
const RESERVED_SUFFIXES: &[&str] = &["_total", "_count", "_sum", "_bucket"];

/// `<namespace>_broker_<endpoint>_<path>` in lower case; reserved suffixes get `_value`.
pub fn metric_name(namespace: &str, endpoint: &str, field: &str) -> String {
    let mut name = format!(
        "{namespace}_broker_{}_{}",
        endpoint.trim_start_matches('/'),
        field.replace('.', "_")
    )
    .to_ascii_lowercase();
    if RESERVED_SUFFIXES.iter().any(|s| name.ends_with(s)) {
        name.push_str("_value");
    }
    name
}

/// The fields of one endpoint, in `allowed_fields` order.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointFields {
    /// `/varz`, ...
    pub endpoint: String,
    pub fields: Vec<(String, FieldValue)>,
}

/// The outcome of one successful poll, in `allowed_endpoints` order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Poll {
    pub endpoints: Vec<EndpointFields>,
}

/// Extracts every allowed field from one endpoint's document.
pub fn extract_all(endpoint: &str, doc: &Value, fields: &[String]) -> EndpointFields {
    EndpointFields {
        endpoint: endpoint.to_string(),
        fields: fields
            .iter()
            .map(|f| (f.clone(), extract(doc, f)))
            .collect(),
    }
}

/// Rendering switches (`include_help`, `include_type` of the block).
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions<'a> {
    pub namespace: &'a str,
    pub include_help: bool,
    pub include_type: bool,
}

/// Renders the numeric fields as gauges, sorted by name. A name produced twice (paths that
/// differ only in case) is rendered once, from its first field.
pub fn render(poll: &Poll, o: &RenderOptions<'_>) -> String {
    let mut lines: Vec<(String, String, f64)> = Vec::new();
    for ep in &poll.endpoints {
        for (field, v) in &ep.fields {
            let FieldValue::Number(v) = v else { continue };
            let name = metric_name(o.namespace, &ep.endpoint, field);
            if lines.iter().any(|(n, _, _)| *n == name) {
                continue;
            }
            let help = format!(
                "Broker server monitoring: field {field} of {}.",
                ep.endpoint
            );
            lines.push((name, help, *v));
        }
    }
    lines.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    for (name, help, v) in lines {
        if o.include_help {
            out.push_str(&format!("# HELP {name} {}\n", escape_help(&help)));
        }
        if o.include_type {
            out.push_str(&format!("# TYPE {name} gauge\n"));
        }
        out.push_str(&format!("{name} {}\n", format_value(v)));
    }
    out
}

/// Why a poll failed. Messages name the endpoint path, never the base URL.
#[derive(Debug)]
pub enum PollError {
    /// The policy cannot be used as is (no base URL, unreadable CA file).
    Config(String),
    /// An endpoint could not be polled.
    Endpoint { endpoint: String, reason: String },
}

impl std::fmt::Display for PollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollError::Config(why) => write!(f, "broker_server_monitoring: {why}"),
            PollError::Endpoint { endpoint, reason } => {
                // The reason can quote the server (a transport error's text).
                write!(
                    f,
                    "broker_server_monitoring: poll of {endpoint} failed: {}",
                    PeerText::new(reason)
                )
            }
        }
    }
}

impl std::error::Error for PollError {}

/// Reads at most `max` bytes; a longer body is an error (the rest is never read).
pub fn read_bounded(reader: impl Read, max: u64) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(max.min(64 * 1024) as usize);
    reader
        .take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading the response failed: {e}"))?;
    if buf.len() as u64 > max {
        return Err(format!(
            "the response is larger than max_response_bytes {max}"
        ));
    }
    Ok(buf)
}

/// The HTTP client of the poller (TLS per policy, no redirects, no proxy, global timeout).
pub fn agent(cfg: &BrokerServerMonitoring) -> Result<ureq::Agent, PollError> {
    use ureq::tls::{parse_pem, PemItem, RootCerts, TlsConfig};
    let mut tls = TlsConfig::builder();
    if let Some(ca) = &cfg.ca_file {
        let pem = std::fs::read(ca)
            .map_err(|e| PollError::Config(format!("cannot read ca_file {ca}: {e}")))?;
        let certs: Vec<_> = parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if certs.is_empty() {
            return Err(PollError::Config(format!(
                "ca_file {ca} contains no PEM certificate"
            )));
        }
        tls = tls.root_certs(RootCerts::new_with_certs(&certs));
    }
    if !cfg.verify_tls {
        tls = tls.disable_verification(true);
    }
    Ok(ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs_f64(cfg.timeout_seconds)))
        .max_redirects(0)
        .http_status_as_error(false)
        .proxy(None)
        .user_agent(concat!("svc-observe/", env!("CARGO_PKG_VERSION")))
        .tls_config(tls.build())
        .build()
        .new_agent())
}

/// Polls one endpoint and returns its JSON document.
pub fn fetch(
    agent: &ureq::Agent,
    base_url: &str,
    endpoint: &str,
    max_response_bytes: u64,
) -> Result<Value, PollError> {
    let fail = |reason: String| PollError::Endpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let url = format!("{}{endpoint}", base_url.trim_end_matches('/'));
    let resp = agent
        .get(&url)
        .header("Accept", "application/json")
        .call()
        .map_err(|e| fail(describe_error(&e)))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(fail(format!("HTTP status {status}")));
    }
    if let Some(len) = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > max_response_bytes {
            return Err(fail(format!(
                "the response is larger than max_response_bytes {max_response_bytes} (Content-Length {len})"
            )));
        }
    }
    let (_, body) = resp.into_parts();
    let bytes = read_bounded(body.into_reader(), max_response_bytes).map_err(fail)?;
    serde_json::from_slice(&bytes).map_err(|_| fail("the response is not valid JSON".into()))
}

/// A transport error in words, without the URL.
pub fn describe_error(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "timed out".into(),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::Io(io) => format!("I/O error: {io}"),
        ureq::Error::BadUri(_) => "bad URL".into(),
        other => other.to_string(),
    }
}

/// Polls every allowed endpoint in order; the first failure fails the poll.
pub fn poll(cfg: &BrokerServerMonitoring) -> Result<Poll, PollError> {
    let base = cfg
        .base_url
        .as_deref()
        .ok_or_else(|| PollError::Config("base_url is not set".into()))?;
    let agent = agent(cfg)?;
    let mut out = Poll::default();
    for endpoint in &cfg.allowed_endpoints {
        let doc = fetch(&agent, base, endpoint, cfg.max_response_bytes)?;
        out.endpoints
            .push(extract_all(endpoint, &doc, &cfg.allowed_fields));
    }
    Ok(out)
}

/// `--help` of `broker-monitoring-poll`.
pub const HELP: &str = "\
Usage: svc-observe broker-monitoring-poll <policy_file> [--dry-run] [--output <path>]

Polls the broker server's monitoring endpoints listed in
broker_server_monitoring.allowed_endpoints under broker_server_monitoring.base_url, extracts
the allowed dotted fields and renders the numeric ones as gauges
(<namespace>_broker_<endpoint>_<field>) in the text exposition format, written atomically to
--output (a .prom file of its own in the textfile collector directory, next to the file of
scrape-textfile). Needs enabled, broker_server_monitoring.enabled and
broker_server_monitoring.scrape_enabled; otherwise one comment line says which switch is off
and nothing is polled. A failed poll (connection, TLS, status other than 200, a body over
max_response_bytes, invalid JSON) replaces the file with one comment line and exits 1.

Options:
  --dry-run        Print the rendering to stdout and the value found for each field to
                   stderr (strings are never shown); write nothing
  --output <path>  Destination file (must end in .prom)

Exit codes: 0 written (or disabled by policy), 1 poll or write failed, 2 invalid policy or
usage.
";

/// Exit codes (those of `svc-observe`).
const EXIT_OK: u8 = 0;
const EXIT_FAILURE: u8 = 1;
const EXIT_INVALID: u8 = 2;

/// The one comment line written when a switch is off.
pub fn disabled_line(reason: &str) -> String {
    format!("# svc-observe: broker server monitoring is disabled by policy ({reason})\n")
}

/// The one comment line that replaces the file when a poll fails.
pub const WITHHELD_LINE: &str = "# svc-observe: broker server monitoring withheld (poll failed)\n";

/// Runs `broker-monitoring-poll` with a loaded policy; returns the exit code.
pub fn run_poll(
    policy: &crate::policy::Policy,
    dry_run: bool,
    output: Option<&std::path::Path>,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> u8 {
    use crate::textfile::TEXTFILE_MODE;
    use svc_files::atomic::write_atomically;
    let cfg = &policy.broker_server_monitoring;
    let dest = if dry_run {
        None
    } else {
        match output {
            Some(p) if p.extension().is_some_and(|e| e == "prom") => Some(p),
            Some(_) => {
                let _ = writeln!(
                    err,
                    "svc-observe broker-monitoring-poll: --output must end in .prom (the only files the textfile collector reads)"
                );
                return EXIT_INVALID;
            }
            None => {
                let _ = writeln!(
                    err,
                    "svc-observe broker-monitoring-poll: no output file: pass --output <path> (a .prom file) or --dry-run"
                );
                return EXIT_INVALID;
            }
        }
    };
    let emit = |text: &str, out: &mut dyn std::io::Write| -> std::io::Result<()> {
        match dest {
            Some(p) => write_atomically(p, text.as_bytes(), TEXTFILE_MODE),
            None => out.write_all(text.as_bytes()).and_then(|_| out.flush()),
        }
    };
    let write_failed = |e: std::io::Error, err: &mut dyn std::io::Write| {
        let where_ = dest.map_or("stdout".to_string(), |p| p.display().to_string());
        let _ = writeln!(
            err,
            "svc-observe broker-monitoring-poll: cannot write {where_}: {e}"
        );
        EXIT_FAILURE
    };
    let disabled = if !policy.enabled {
        Some("enabled=false")
    } else if !cfg.enabled {
        Some("broker_server_monitoring.enabled=false")
    } else if !cfg.scrape_enabled {
        Some("broker_server_monitoring.scrape_enabled=false")
    } else {
        None
    };
    if let Some(reason) = disabled {
        return match emit(&disabled_line(reason), out) {
            Ok(()) => EXIT_OK,
            Err(e) => write_failed(e, err),
        };
    }
    let polled = match poll(cfg) {
        Ok(p) => p,
        Err(e) => {
            if let Some(p) = dest {
                if let Err(we) = write_atomically(p, WITHHELD_LINE.as_bytes(), TEXTFILE_MODE) {
                    let _ = writeln!(
                        err,
                        "svc-observe broker-monitoring-poll: cannot write {}: {we}",
                        p.display()
                    );
                }
            }
            let _ = writeln!(err, "svc-observe broker-monitoring-poll: {e}");
            return EXIT_FAILURE;
        }
    };
    let text = render(
        &polled,
        &RenderOptions {
            namespace: &policy.namespace,
            include_help: cfg.include_help,
            include_type: cfg.include_type,
        },
    );
    if dry_run {
        for ep in &polled.endpoints {
            for (field, v) in &ep.fields {
                let _ = writeln!(
                    err,
                    "broker-monitoring-poll --dry-run: {} {field}: {}",
                    ep.endpoint,
                    v.describe()
                );
            }
        }
    }
    if let Err(e) = emit(&text, out) {
        return write_failed(e, err);
    }
    if let Some(p) = dest {
        let numbers = polled
            .endpoints
            .iter()
            .flat_map(|e| &e.fields)
            .filter(|(_, v)| matches!(v, FieldValue::Number(_)))
            .count();
        let fields: usize = polled.endpoints.iter().map(|e| e.fields.len()).sum();
        let _ = writeln!(
            out,
            "broker-monitoring-poll: polled {} endpoint{}, {numbers} of {fields} field values numeric, wrote {} bytes to {}",
            polled.endpoints.len(),
            if polled.endpoints.len() == 1 { "" } else { "s" },
            text.len(),
            p.display()
        );
    }
    EXIT_OK
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dotted_paths() {
        let doc = json!({
            "mem": 1234, "cpu": 0.5, "server_name": "n1", "jetstream": {"stats": {"memory": 7,
            "accounts": 1}, "config": {"sync_always": false}}, "connections": [1, 2],
            "big": 1e300, "nothing": null, "obj": {}
        });
        assert_eq!(extract(&doc, "mem"), FieldValue::Number(1234.0));
        assert_eq!(extract(&doc, "cpu"), FieldValue::Number(0.5));
        assert_eq!(
            extract(&doc, "jetstream.stats.memory"),
            FieldValue::Number(7.0)
        );
        assert_eq!(extract(&doc, "server_name"), FieldValue::Text);
        assert_eq!(
            extract(&doc, "jetstream.config.sync_always"),
            FieldValue::Bool
        );
        assert_eq!(extract(&doc, "connections"), FieldValue::Null);
        assert_eq!(extract(&doc, "obj"), FieldValue::Null);
        assert_eq!(extract(&doc, "nothing"), FieldValue::Null);
        assert_eq!(extract(&doc, "missing.path"), FieldValue::Null);
        assert_eq!(extract(&doc, "mem.deeper"), FieldValue::Null);
        assert_eq!(extract(&doc, "big"), FieldValue::Number(1e300));
        assert_eq!(FieldValue::Text.describe(), "string (not rendered)");
    }

    #[test]
    fn names() {
        assert_eq!(metric_name("svc", "/varz", "mem"), "svc_broker_varz_mem");
        assert_eq!(
            metric_name("svc", "/varz", "jetstream.stats.memory"),
            "svc_broker_varz_jetstream_stats_memory"
        );
        assert_eq!(
            metric_name("svc", "/connz", "total"),
            "svc_broker_connz_total_value"
        );
        assert_eq!(
            metric_name("svc", "/subsz", "num_subscriptions"),
            "svc_broker_subsz_num_subscriptions"
        );
        assert_eq!(
            metric_name("svc", "/x", "hits_count"),
            "svc_broker_x_hits_count_value"
        );
        assert_eq!(metric_name("Svc", "/varz", "Mem"), "svc_broker_varz_mem");
    }

    #[test]
    fn rendering() {
        let poll = Poll {
            endpoints: vec![
                EndpointFields {
                    endpoint: "/varz".into(),
                    fields: vec![
                        ("mem".into(), FieldValue::Number(1024.0)),
                        ("server_name".into(), FieldValue::Text),
                        ("cpu".into(), FieldValue::Number(0.25)),
                        ("Mem".into(), FieldValue::Number(1.0)),
                    ],
                },
                EndpointFields {
                    endpoint: "/healthz".into(),
                    fields: vec![("mem".into(), FieldValue::Null)],
                },
            ],
        };
        let o = RenderOptions {
            namespace: "svc",
            include_help: true,
            include_type: true,
        };
        assert_eq!(
            render(&poll, &o),
            "# HELP svc_broker_varz_cpu Broker server monitoring: field cpu of /varz.\n# TYPE svc_broker_varz_cpu gauge\nsvc_broker_varz_cpu 0.25\n# HELP svc_broker_varz_mem Broker server monitoring: field mem of /varz.\n# TYPE svc_broker_varz_mem gauge\nsvc_broker_varz_mem 1024\n"
        );
        let o = RenderOptions {
            include_help: false,
            include_type: false,
            ..o
        };
        assert_eq!(
            render(&poll, &o),
            "svc_broker_varz_cpu 0.25\nsvc_broker_varz_mem 1024\n"
        );
        assert_eq!(render(&Poll::default(), &o), "");
    }

    #[test]
    fn bounded_reads() {
        assert_eq!(read_bounded(&b"abc"[..], 3).unwrap(), b"abc");
        assert_eq!(
            read_bounded(&b"abcd"[..], 3).unwrap_err(),
            "the response is larger than max_response_bytes 3"
        );
        // An endless body is cut after max + 1 bytes.
        let endless = std::io::repeat(b'x');
        assert!(read_bounded(endless, 1024).is_err());
    }

    #[test]
    fn a_poll_failure_quotes_the_server_bounded_and_escaped() {
        let e = PollError::Endpoint {
            endpoint: "/varz".into(),
            reason: format!("protocol: bad header\n\x1b[2J{}", "h".repeat(1 << 20)),
        };
        let shown = e.to_string();
        assert!(shown.starts_with("broker_server_monitoring: poll of /varz failed: protocol"));
        assert!(
            !shown.contains(['\n', '\x1b']) && shown.len() < 400,
            "{shown}"
        );
    }
}
