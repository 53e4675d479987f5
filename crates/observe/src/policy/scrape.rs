//! `scrape`: the textfile connector and the native HTTP scrape endpoint.

use serde::Serialize;

use super::checks;
use svc_document::reader::ObjectReader;

/// Largest accepted `scrape.http_endpoint.request_timeout_seconds`.
pub const MAX_REQUEST_TIMEOUT_SECONDS: f64 = 300.0;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scrape {
    /// Enables textfile rendering. Defaults to false.
    pub enabled: bool,
    /// Destination of the textfile (`--output` overrides). Must end in `.prom`, the only files
    /// the node exporter's textfile collector reads. Defaults to null.
    pub output_file: Option<String>,
    /// Emit `# HELP` lines. Defaults to true.
    pub include_help: bool,
    /// Emit `# TYPE` lines. Defaults to true.
    pub include_type: bool,
    /// Fail closed when the snapshot is older. Defaults to null (no bound).
    pub stale_after_seconds: Option<f64>,
    pub http_endpoint: HttpEndpoint,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HttpEndpoint {
    /// Defaults to false; the top-level `enabled` is required too.
    pub enabled: bool,
    /// Listener host. Defaults to `127.0.0.1`.
    pub host: String,
    /// Defaults to 9108.
    pub port: u16,
    /// Defaults to `/metrics`.
    pub path: String,
    /// Whole-request deadline (head received and response written). Defaults to 5.
    pub request_timeout_seconds: f64,
    /// Largest rendered body served. Defaults to 1048576.
    pub response_max_bytes: u64,
}

impl Scrape {
    pub fn read(r: &mut ObjectReader<'_>) -> Scrape {
        let enabled = r.bool_or("enabled", false);
        let output_file = r.opt_string("output_file");
        if let Some(f) = &output_file {
            if f.is_empty() || f.contains('\0') || f.ends_with('/') {
                r.problem("output_file", "must be a file path");
            } else if !f.ends_with(".prom") {
                r.problem(
                    "output_file",
                    "must end in .prom (the textfile collector reads only *.prom files)",
                );
            }
        }
        let include_help = r.bool_or("include_help", true);
        let include_type = r.bool_or("include_type", true);
        let stale_after_seconds = checks::stale(r);
        let http_endpoint = super::read_block(r, "http_endpoint", HttpEndpoint::read);
        Scrape {
            enabled,
            output_file,
            include_help,
            include_type,
            stale_after_seconds,
            http_endpoint,
        }
    }
}

impl HttpEndpoint {
    pub fn read(r: &mut ObjectReader<'_>) -> HttpEndpoint {
        let enabled = r.bool_or("enabled", false);
        let host = r.string_or("host", "127.0.0.1");
        let host_ok = checks::is_host_name(&host)
            || host.parse::<std::net::IpAddr>().is_ok()
            || (host.starts_with('[')
                && host.ends_with(']')
                && host[1..host.len() - 1]
                    .parse::<std::net::Ipv6Addr>()
                    .is_ok());
        if !host_ok {
            r.problem("host", "must be a host name or IP address");
        }
        let port = checks::port(r, 9108);
        let path = r.string_or("path", "/metrics");
        if let Some(why) = path_problem(&path) {
            r.problem("path", why);
        }
        let request_timeout_seconds = r.number_in(
            "request_timeout_seconds",
            5.0,
            0.0,
            true,
            MAX_REQUEST_TIMEOUT_SECONDS,
        );
        let response_max_bytes = checks::bytes(
            r,
            "response_max_bytes",
            1_048_576,
            checks::MIN_BYTES,
            checks::MAX_BYTES,
        );
        HttpEndpoint {
            enabled,
            host,
            port,
            path,
            request_timeout_seconds,
            response_max_bytes,
        }
    }

    /// `host:port` for binding; IPv6 literals are bracketed.
    pub fn bind_address(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The endpoint path rules: absolute, at most 256 bytes, no query, fragment, whitespace or
/// control characters.
pub fn path_problem(path: &str) -> Option<&'static str> {
    if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("must not contain whitespace or control characters")
    } else if path.contains('?') {
        Some("must not contain a query string")
    } else if path.contains('#') {
        Some("must not contain a fragment")
    } else if !path.starts_with('/') || path.len() > 256 {
        Some("must start with / and be at most 256 bytes")
    } else {
        None
    }
}
