//! `broker_server_monitoring`: polling of the broker server's monitoring endpoints by the
//! exporter (the runner never polls).

use serde::Serialize;

use super::checks;
use svc_document::reader::ObjectReader;

/// Monitoring endpoints that may be polled.
pub const ENDPOINTS: &[&str] = &[
    "/varz",
    "/connz",
    "/routez",
    "/subsz",
    "/accountz",
    "/accstatz",
    "/jsz",
    "/healthz",
];
/// Upper bound of `timeout_seconds` (spec "Limits").
pub const MAX_TIMEOUT_SECONDS: f64 = 30.0;
/// At most this many dotted field paths.
pub const MAX_FIELDS: usize = 100;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BrokerServerMonitoring {
    /// Defaults to false.
    pub enabled: bool,
    /// Scheme and host only; required when enabled. Defaults to null.
    pub base_url: Option<String>,
    /// Subset of [`ENDPOINTS`]. Defaults to [].
    pub allowed_endpoints: Vec<String>,
    /// Dotted JSON field paths. Defaults to [].
    pub allowed_fields: Vec<String>,
    /// Greater than 0, at most 30. Defaults to 2.
    pub timeout_seconds: f64,
    /// Defaults to 262144.
    pub max_response_bytes: u64,
    /// Defaults to true; false only for a loopback `base_url`.
    pub verify_tls: bool,
    /// Optional CA certificate file (absolute path). Defaults to null.
    pub ca_file: Option<String>,
    /// Render selected numeric fields as exposition lines. Defaults to false.
    pub scrape_enabled: bool,
    /// Defaults to true.
    pub include_help: bool,
    /// Defaults to true.
    pub include_type: bool,
}

/// Words of a field path that name an identity, an address or the topology (server, account,
/// stream and consumer names, ids, hosts, ports, URLs): never exported, even when numeric.
const IDENTITY_WORDS: &[&str] = &[
    "name", "names", "host", "hostname", "ip", "addr", "address", "url", "urls", "id", "ids",
    "pid", "port", "domain", "tags", "user", "username", "password", "token", "nkey", "key",
    "seed", "cert", "account", "stream", "consumer",
];

/// Does a dotted field path name an identity, address or topology field? Each token is split
/// into words at `_` and compared case-insensitively (`server_name`, `cluster.port`,
/// `http_port` are; `streams`, `total_connections`, `jetstream.stats.accounts` are not).
pub fn is_identity_field(path: &str) -> bool {
    path.split(['.', '_'])
        .any(|w| IDENTITY_WORDS.iter().any(|x| x.eq_ignore_ascii_case(w)))
}

impl BrokerServerMonitoring {
    pub fn read(r: &mut ObjectReader<'_>) -> BrokerServerMonitoring {
        let enabled = r.bool_or("enabled", false);
        let base_url = checks::endpoint(
            r,
            "base_url",
            enabled.then_some("the connector is enabled"),
            None,
        );
        let mut loopback = false;
        if let Some(ep) = base_url
            .as_deref()
            .and_then(|u| checks::parse_endpoint(u).ok())
        {
            loopback = checks::is_loopback_host(&ep.host);
            if !(ep.path.is_empty() || ep.path == "/") {
                r.problem("base_url", "must be scheme and host only, without a path");
            }
        }
        let allowed_endpoints = r.string_list("allowed_endpoints");
        for (i, e) in allowed_endpoints.iter().enumerate() {
            let path = format!("{}[{i}]", r.path_of("allowed_endpoints"));
            if !ENDPOINTS.contains(&e.as_str()) {
                r.problems()
                    .push(path, format!("must be one of: {}", ENDPOINTS.join(", ")));
            } else if allowed_endpoints[..i].contains(e) {
                r.problems().push(path, "is listed twice");
            }
        }
        if enabled && allowed_endpoints.is_empty() {
            r.problem(
                "allowed_endpoints",
                "must name at least one endpoint when the connector is enabled",
            );
        }
        let allowed_fields = r.string_list("allowed_fields");
        if allowed_fields.len() > MAX_FIELDS {
            r.problem(
                "allowed_fields",
                format!("must have at most {MAX_FIELDS} entries"),
            );
        }
        for (i, f) in allowed_fields.iter().enumerate() {
            let path = format!("{}[{i}]", r.path_of("allowed_fields"));
            let ok = f.len() <= 256
                && f.split('.').all(|t| {
                    !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                });
            if !ok {
                r.problems()
                    .push(path, "must be a dotted path of [A-Za-z0-9_] names");
            } else if is_identity_field(f) {
                r.problems().push(
                    path,
                    "names an identity, address or topology field (name, id, host, ip, url, port, account, stream, consumer, ...); only aggregate values may be exported",
                );
            } else if allowed_fields[..i].contains(f) {
                r.problems().push(path, "is listed twice");
            }
        }
        let timeout_seconds = checks::timeout(r, 2.0, MAX_TIMEOUT_SECONDS);
        let max_response_bytes = checks::bytes(
            r,
            "max_response_bytes",
            262_144,
            checks::MIN_BYTES,
            checks::MAX_BYTES,
        );
        let verify_tls = r.bool_or("verify_tls", true);
        if !verify_tls && base_url.is_some() && !loopback {
            r.problem("verify_tls", "may be false only for a loopback base_url");
        }
        let ca_file = r.opt_string("ca_file");
        if let Some(p) = &ca_file {
            if !p.starts_with('/') || p.contains('\0') {
                r.problem("ca_file", "must be an absolute path");
            }
        }
        if let (Some(_), Some(url)) = (&ca_file, &base_url) {
            if url.starts_with("http://") {
                r.problem("ca_file", "is only used with an https base_url");
            } else if !verify_tls {
                r.problem("ca_file", "cannot be combined with verify_tls false");
            }
        }
        let scrape_enabled = r.bool_or("scrape_enabled", false);
        if enabled && scrape_enabled && allowed_fields.is_empty() {
            r.problem(
                "allowed_fields",
                "must name at least one field when the connector and scrape_enabled are on",
            );
        }
        let include_help = r.bool_or("include_help", true);
        let include_type = r.bool_or("include_type", true);
        BrokerServerMonitoring {
            enabled,
            base_url,
            allowed_endpoints,
            allowed_fields,
            timeout_seconds,
            max_response_bytes,
            verify_tls,
            ca_file,
            scrape_enabled,
            include_help,
            include_type,
        }
    }
}
