//! `statsd` and `agent_statsd`: one datagram per approved aggregate metric over UDP or a Unix
//! datagram socket; `agent_statsd` uses the tagged dialect and may carry static tags.

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks::{self, Transport};
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

/// Upper bound of the datagram connectors' `timeout_seconds`.
pub const MAX_TIMEOUT_SECONDS: f64 = push::MAX_TIMEOUT_SECONDS;
/// Largest UDP payload over IPv4.
pub const MAX_DATAGRAM_BYTES: i64 = push::MAX_DATAGRAM_BYTES;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Statsd {
    /// Defaults to false.
    pub enabled: bool,
    /// `udp` or `unixgram`. Defaults to `udp`.
    pub transport: Transport,
    /// Defaults to `127.0.0.1`.
    pub host: String,
    /// 1 to 65535. Defaults to 8125.
    pub port: u16,
    /// Required for `unixgram`. Defaults to null.
    pub socket_path: Option<String>,
    /// Defaults to null (the policy namespace is used).
    pub metric_prefix: Option<String>,
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentStatsd {
    #[serde(flatten)]
    pub base: Statsd,
    /// Static low-cardinality tags. Defaults to {}.
    pub tags: BTreeMap<String, String>,
    /// Adds prepared labels (e.g. `subject_family`) as tags. Defaults to false.
    pub include_metric_labels_as_tags: bool,
}

impl Statsd {
    pub fn read(r: &mut ObjectReader<'_>) -> Statsd {
        let enabled = r.bool_or("enabled", false);
        let (transport, socket_path) = checks::transport(r);
        let host = checks::host(r, "127.0.0.1");
        let port = checks::port(r, 8125);
        let metric_prefix = r.opt_string("metric_prefix");
        if let Some(p) = &metric_prefix {
            let ok = !p.is_empty()
                && p.len() <= 64
                && (p.as_bytes()[0].is_ascii_alphabetic() || p.as_bytes()[0] == b'_')
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
            if !ok {
                r.problem(
                    "metric_prefix",
                    "must be 1 to 64 characters of [A-Za-z0-9_.] starting with a letter or _",
                );
            }
        }
        let push = PushSettings::read(r, &push::STATSD);
        Statsd {
            enabled,
            transport,
            host,
            port,
            socket_path,
            metric_prefix,
            push,
        }
    }
}

impl AgentStatsd {
    pub fn read(r: &mut ObjectReader<'_>) -> AgentStatsd {
        let base = Statsd::read(r);
        let tags = checks::dimensions(r, "tags", BTreeMap::new(), false);
        let include_metric_labels_as_tags = r.bool_or("include_metric_labels_as_tags", false);
        AgentStatsd {
            base,
            tags,
            include_metric_labels_as_tags,
        }
    }
}
