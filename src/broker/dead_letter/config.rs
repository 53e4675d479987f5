//! The `dead_letter` block: where dead letters go and what they may carry.

use std::time::Duration;

use crate::document::grammar::is_header_name;
use crate::document::grammar::looks_secret;
use crate::document::reader::{ObjectReader, Problems};
use crate::message::subject::SubjectPattern;

/// Schema of the DLQ record.
pub const DEAD_LETTER_SCHEMA: &str = "svc.dead-letter.v1";
/// Header carrying the failure's reason code on the DLQ message (for consumers that route
/// without parsing the body).
pub const REASON_HEADER: &str = "Svc-Dlq-Reason";
pub const DEFAULT_PUBLISH_TIMEOUT_MS: i64 = 5000;
/// Most headers an operator may copy into the record.
pub const MAX_INCLUDE_HEADERS: usize = 32;
/// A copied header value longer than this is replaced by a marker (records stay small).
pub const MAX_HEADER_VALUE_BYTES: usize = 1024;

/// The `dead_letter` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterConfig {
    /// Defaults to false: no DLQ (see `docs/dead-letter.md` for what happens then).
    pub enabled: bool,
    /// Literal subject the records are published to; a stream must capture it.
    pub subject: String,
    /// Original headers copied into the record, by exact name. Defaults to none.
    pub include_headers: Vec<String>,
    /// How long to wait for the broker's confirmation. 10 to 60000 ms; defaults to 5000.
    pub publish_timeout: Duration,
    /// When set, the publish must land in this stream (`Nats-Expected-Stream`).
    pub expected_stream: Option<String>,
    /// `custody.runner_id` when custody checkpoints are on (not a `dead_letter` key): each
    /// record names the runner whose checkpoints list its original as a gap (an auditor's
    /// cross-reference; the runner reads nothing back).
    pub runner_id: String,
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        DeadLetterConfig {
            enabled: false,
            subject: String::new(),
            include_headers: Vec::new(),
            publish_timeout: Duration::from_millis(DEFAULT_PUBLISH_TIMEOUT_MS as u64),
            expected_stream: None,
            runner_id: String::new(),
        }
    }
}

impl DeadLetterConfig {
    /// Reads the `dead_letter` block (absent = disabled).
    pub fn read(r: Option<ObjectReader<'_>>) -> DeadLetterConfig {
        let Some(mut r) = r else {
            return DeadLetterConfig::default();
        };
        let enabled = r.bool_or("enabled", false);
        let subject = r.opt_string("subject").unwrap_or_default();
        if subject.is_empty() {
            if enabled {
                r.problem("subject", "is required when dead_letter.enabled is true");
            }
        } else {
            match SubjectPattern::parse(&subject) {
                Err(e) => r.problem("subject", e.to_string()),
                Ok(p) if !p.is_literal() => {
                    r.problem("subject", "must be a literal subject without wildcards")
                }
                Ok(_) if subject.starts_with('$') || subject.starts_with("_INBOX.") => r.problem(
                    "subject",
                    "must not be in a reserved subject tree ($... or _INBOX.)",
                ),
                Ok(_) => {}
            }
        }
        let include_headers = r.string_list("include_headers");
        if include_headers.len() > MAX_INCLUDE_HEADERS {
            r.problem(
                "include_headers",
                format!("must have at most {MAX_INCLUDE_HEADERS} entries"),
            );
        }
        for (i, h) in include_headers.iter().enumerate() {
            let path = format!("{}[{i}]", r.path_of("include_headers"));
            if !is_header_name(h) {
                r.problems().push(
                    path,
                    "must be a header name without spaces or control characters",
                );
            } else if looks_secret(h) {
                r.problems().push(
                    path,
                    "looks like a secret-bearing header and is never copied",
                );
            }
        }
        let publish_timeout = Duration::from_millis(r.int_in(
            "publish_timeout_ms",
            DEFAULT_PUBLISH_TIMEOUT_MS,
            10,
            60_000,
        ) as u64);
        let expected_stream = r.opt_string("expected_stream");
        if let Some(s) = &expected_stream {
            let ok = !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                r.problem(
                    "expected_stream",
                    "must be 1 to 64 characters of A-Z a-z 0-9 _ -",
                );
            }
        }
        r.finish();
        DeadLetterConfig {
            enabled,
            subject,
            include_headers,
            publish_timeout,
            expected_stream,
            runner_id: String::new(),
        }
    }

    /// Checks against the rest of the runtime config: the runner must not consume its own
    /// dead letters, and the record must not copy the headers whose values fail validation
    /// (that would echo the offending value).
    pub fn cross_check(&self, consumed: &[String], value_headers: &[&str], problems: &Problems) {
        if self.enabled && !self.subject.is_empty() {
            let patterns = consumed
                .iter()
                .filter_map(|c| SubjectPattern::parse(c).ok());
            for p in patterns {
                if p.matches(&self.subject) {
                    problems.push(
                        "dead_letter.subject",
                        "must not match nats.subject (the runner would consume its own dead letters)",
                    );
                }
            }
        }
        for (i, h) in self.include_headers.iter().enumerate() {
            if value_headers.contains(&h.as_str()) {
                problems.push(
                    format!("dead_letter.include_headers[{i}]"),
                    "names a validated header whose value may be the reason of the failure; it is never copied",
                );
            }
        }
    }
}
