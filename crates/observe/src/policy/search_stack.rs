//! `search_stack`: the search-stack profile over OTLP (to a collector-style endpoint only).

use std::collections::BTreeMap;

use serde::Serialize;

use super::checks;
use super::push::{self, PushSettings};
use svc_document::reader::ObjectReader;

/// The only ingestion mode: OTLP to a collector-style endpoint, never direct index writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IngestionPath {
    OtlpCollector,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchStack {
    /// Defaults to false; needs the top-level `enabled` too.
    pub enabled: bool,
    /// Defaults to null; required when enabled.
    pub endpoint: Option<String>,
    /// Timeout, export deadline, retries, backoff, staleness and size bound.
    #[serde(flatten)]
    pub push: PushSettings,
    pub headers_env: BTreeMap<String, String>,
    /// Defaults to `otlp_collector`, the only value.
    pub ingestion_path: IngestionPath,
    /// Static data-stream dataset hint. Defaults to `svc.metrics`.
    pub data_stream_dataset: String,
    /// Static data-stream namespace hint. Defaults to `default`.
    pub data_stream_namespace: String,
}

impl SearchStack {
    pub fn read(r: &mut ObjectReader<'_>) -> SearchStack {
        let enabled = r.bool_or("enabled", false);
        let endpoint = checks::endpoint(
            r,
            "endpoint",
            enabled.then_some("the connector is enabled"),
            None,
        );
        let push = PushSettings::read(r, &push::HTTP);
        let headers_env = checks::headers_env(r, checks::RESERVED_HEADERS);
        let ingestion_path = r.one_of(
            "ingestion_path",
            IngestionPath::OtlpCollector,
            &[("otlp_collector", IngestionPath::OtlpCollector)],
        );
        // Data-stream naming rules of the search stack: lowercase, no hyphen, at most 100.
        let data_stream_dataset = r.string_or("data_stream_dataset", "svc.metrics");
        if !data_stream_part(&data_stream_dataset, true) {
            r.problem(
                "data_stream_dataset",
                "must be 1 to 100 characters of [a-z0-9_.] starting with a letter",
            );
        }
        let data_stream_namespace = r.string_or("data_stream_namespace", "default");
        if !data_stream_part(&data_stream_namespace, false) {
            r.problem(
                "data_stream_namespace",
                "must be 1 to 100 characters of [a-z0-9_] starting with a letter",
            );
        }
        SearchStack {
            enabled,
            endpoint,
            push,
            headers_env,
            ingestion_path,
            data_stream_dataset,
            data_stream_namespace,
        }
    }
}

fn data_stream_part(s: &str, dots: bool) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || (dots && b == b'.')
        })
}
