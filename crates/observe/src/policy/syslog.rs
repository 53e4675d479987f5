//! `syslog`: one RFC 5424-style message per approved aggregate metric over UDP or a Unix
//! datagram socket (the spec's block headed "the service").

use serde::Serialize;

use super::checks::{self, Transport};
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

/// Facility names and their RFC 5424 codes.
pub const FACILITIES: &[(&str, u8)] = &[
    ("kern", 0),
    ("user", 1),
    ("mail", 2),
    ("daemon", 3),
    ("auth", 4),
    ("syslog", 5),
    ("lpr", 6),
    ("news", 7),
    ("uucp", 8),
    ("cron", 9),
    ("authpriv", 10),
    ("ftp", 11),
    ("ntp", 12),
    ("audit", 13),
    ("alert", 14),
    ("clock", 15),
    ("local0", 16),
    ("local1", 17),
    ("local2", 18),
    ("local3", 19),
    ("local4", 20),
    ("local5", 21),
    ("local6", 22),
    ("local7", 23),
];
/// Severity names and their RFC 5424 codes.
pub const SEVERITIES: &[(&str, u8)] = &[
    ("emerg", 0),
    ("alert", 1),
    ("crit", 2),
    ("err", 3),
    ("warning", 4),
    ("notice", 5),
    ("info", 6),
    ("debug", 7),
];

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Syslog {
    /// Defaults to false.
    pub enabled: bool,
    /// Defaults to `udp`.
    pub transport: Transport,
    /// Defaults to `127.0.0.1`.
    pub host: String,
    /// 1 to 65535. Defaults to 514.
    pub port: u16,
    /// Required for `unixgram`. Defaults to null.
    pub socket_path: Option<String>,
    /// Defaults to `local0`.
    pub facility: String,
    /// Defaults to `info`.
    pub severity: String,
    /// RFC 5424 HOSTNAME. Defaults to `-`.
    pub hostname: String,
    /// RFC 5424 APP-NAME. Defaults to `svc`.
    pub app_name: String,
    /// RFC 5424 PROCID. Defaults to `-`.
    pub procid: String,
    /// RFC 5424 MSGID. Defaults to `metrics`.
    pub msgid: String,
    /// SD-ID of the metric parameters. Defaults to `svc`.
    pub structured_data_id: String,
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
}

impl Syslog {
    /// The RFC 5424 PRI value of the configured facility and severity.
    pub fn priority(&self) -> u8 {
        let f = FACILITIES
            .iter()
            .find(|(n, _)| *n == self.facility)
            .map_or(16, |(_, c)| *c);
        let s = SEVERITIES
            .iter()
            .find(|(n, _)| *n == self.severity)
            .map_or(6, |(_, c)| *c);
        f * 8 + s
    }

    pub fn read(r: &mut ObjectReader<'_>) -> Syslog {
        let enabled = r.bool_or("enabled", false);
        let (transport, socket_path) = checks::transport(r);
        let host = checks::host(r, "127.0.0.1");
        let port = checks::port(r, 514);
        let facility = r.string_or("facility", "local0");
        if !FACILITIES.iter().any(|(n, _)| *n == facility) {
            r.problem(
                "facility",
                "must be a syslog facility name (kern, user, daemon, local0 to local7, ...)",
            );
        }
        let severity = r.string_or("severity", "info");
        if !SEVERITIES.iter().any(|(n, _)| *n == severity) {
            r.problem(
                "severity",
                "must be one of: emerg, alert, crit, err, warning, notice, info, debug",
            );
        }
        let hostname = header_field(r, "hostname", "-", 255);
        let app_name = header_field(r, "app_name", "svc", 48);
        let procid = header_field(r, "procid", "-", 128);
        let msgid = header_field(r, "msgid", "metrics", 32);
        let structured_data_id = r.string_or("structured_data_id", "svc");
        let sd_ok = !structured_data_id.is_empty()
            && structured_data_id.len() <= 32
            && structured_data_id
                .bytes()
                .all(|b| (33..=126).contains(&b) && !b"= ]\"".contains(&b));
        if !sd_ok {
            r.problem(
                "structured_data_id",
                "must be 1 to 32 printable ASCII characters without = ] \" or space",
            );
        }
        let push = PushSettings::read(r, &push::SYSLOG);
        Syslog {
            enabled,
            transport,
            host,
            port,
            socket_path,
            facility,
            severity,
            hostname,
            app_name,
            procid,
            msgid,
            structured_data_id,
            push,
        }
    }
}

/// An RFC 5424 header field: 1 to `max` printable US-ASCII characters (33 to 126).
fn header_field(r: &mut ObjectReader<'_>, key: &'static str, default: &str, max: usize) -> String {
    let v = r.string_or(key, default);
    let ok = !v.is_empty() && v.len() <= max && v.bytes().all(|b| (33..=126).contains(&b));
    if !ok {
        r.problem(
            key,
            format!("must be 1 to {max} printable ASCII characters without spaces"),
        );
    }
    v
}
