//! `svc show-effective-config`: the configuration as the runner reads it, every default filled
//! in, in reading order (the order of `docs/configuration.md`). The values are recorded by the
//! readers themselves while they validate ([`crate::document::effective`]), so the output
//! cannot drift from the defaults the runner uses, and it is a valid configuration that reads
//! back to the same [`RuntimeConfig`] and prints the same bytes again, except where a value is
//! redacted: the values of a URL's query and its path segments after the first (`url`,
//! `probe_url`: the HTTP sink treats the query as secret, and webhook URLs carry their
//! secret in the path) and of a header whose name is secret ([`is_secret_name`]) print as
//! `<redacted>`, and read back as that text.

use serde_json::Value;

use super::RuntimeConfig;
use crate::document::effective::{self, Node};
use crate::document::reader::{parse_json, Invalid};
use crate::text::secrets::{is_secret_name, REDACTED};

/// Rounds of filling absent blocks with `{}` (a block found in one round can hold more).
const FILL_ROUNDS: usize = 4;

/// Validates `text` (the same problems as `svc validate`) and renders the effective
/// configuration as pretty JSON. An absent block is shown read from `{}` (every default)
/// wherever `{}` reads to exactly the configuration that leaving it out does; elsewhere it
/// stays `null`.
pub fn effective_json(text: &str) -> Result<String, Invalid> {
    let cfg = RuntimeConfig::parse(text)?;
    let mut doc = parse_json(text)?;
    let mut tried: Vec<String> = Vec::new();
    for _ in 0..FILL_ROUNDS {
        let (_, captured) = effective::capture(|| RuntimeConfig::parse(&doc.to_string()));
        let mut changed = false;
        for path in captured.absent_objects {
            if tried.contains(&path) {
                continue;
            }
            let mut with = doc.clone();
            if effective::insert(&mut with, &path, Value::Object(Default::default()))
                && RuntimeConfig::parse(&with.to_string()).is_ok_and(|c| c == cfg)
            {
                doc = with;
                changed = true;
            }
            tried.push(path);
        }
        if !changed {
            break;
        }
    }
    let (read, mut captured) = effective::capture(|| RuntimeConfig::parse(&doc.to_string()));
    read?;
    redact(&mut captured.tree);
    Ok(captured.tree.to_json_pretty())
}

/// Hides what may be secret in the recorded document: the query values of every `*url`
/// field, and the value of every entry of a `headers` object whose name is secret.
fn redact(node: &mut Node) {
    match node {
        Node::Object(entries) => {
            for (key, child) in entries.iter_mut() {
                match child {
                    Node::Leaf(Value::String(url)) if key.ends_with("url") => {
                        *url = without_query_values(&without_secret_path(url));
                    }
                    Node::Object(headers) if key == "headers" => {
                        for (name, value) in headers.iter_mut() {
                            if is_secret_name(name) {
                                *value = Node::Leaf(Value::String(REDACTED.into()));
                            }
                        }
                    }
                    _ => redact(child),
                }
            }
        }
        Node::Array(items) => items.iter_mut().for_each(redact),
        Node::Leaf(_) => {}
    }
}

/// `https://hooks.slack.com/services/T0/B0/XyZ` -> `https://hooks.slack.com/services/<redacted>`:
/// webhook URLs (Slack, Discord, Teams) carry their secret in the path; the first segment
/// stays (an operator recognises the endpoint), the rest goes. Query and fragment are kept.
fn without_secret_path(url: &str) -> String {
    let end = url.find(['?', '#']).unwrap_or(url.len());
    let (before, after) = url.split_at(end);
    let Some(scheme_end) = before.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let Some(path_start) = before[scheme_end..].find('/').map(|i| i + scheme_end) else {
        return url.to_string();
    };
    let path = &before[path_start + 1..];
    match path.split_once('/') {
        Some((first, rest)) if !rest.is_empty() => {
            format!("{}/{first}/{REDACTED}{after}", &before[..path_start])
        }
        _ => url.to_string(),
    }
}

/// `https://h/p?token=abc&x` -> `https://h/p?token=<redacted>&x=<redacted>`: the names
/// stay (an operator recognises the parameter), every value goes.
fn without_query_values(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|p| format!("{}={REDACTED}", p.split('=').next().unwrap_or_default()))
        .collect();
    let mut out = format!("{base}?{}", pairs.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nats_field(text: &str, key: &str) -> Value {
        let shown: Value = serde_json::from_str(&effective_json(text).unwrap()).unwrap();
        shown["nats"][key].clone()
    }

    /// The HTTP sink's `sink_workers` comes from its request shape when not set: shown as
    /// the number the runner uses, and reading it back changes nothing.
    #[test]
    fn sink_workers_are_shown_as_the_runner_uses_them() {
        let doc = |sink: &str| {
            format!(
                r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                              "subject": "a.>"}}, "sink": {sink}}}"#
            )
        };
        let workers = |text: &str| {
            let shown: Value = serde_json::from_str(&effective_json(text).unwrap()).unwrap();
            shown["delivery"]["sink_workers"].clone()
        };
        let http = doc(r#"{"type": "http", "url": "https://receiver.example/in"}"#);
        assert_eq!(workers(&http), 4);
        assert_eq!(
            workers(&doc(r#"{"type": "file", "directory": "/tmp/x"}"#)),
            2
        );
        let shown = effective_json(&http).unwrap();
        assert_eq!(effective_json(&shown).unwrap(), shown);
        assert_eq!(
            RuntimeConfig::parse(&shown).unwrap(),
            RuntimeConfig::parse(&http).unwrap()
        );
    }

    #[test]
    fn tls_and_consumer_mode_are_shown_as_the_runner_applies_them() {
        let doc = |nats: &str| {
            format!(
                r#"{{"nats": {{"stream": "S", "consumer": "c", "subject": "a.>", {nats}}},
                     "sink": {{"type": "file", "directory": "/tmp/x"}}}}"#
            )
        };
        let tls = doc(r#""url": "tls://broker.example:4222""#);
        assert_eq!(nats_field(&tls, "tls_required"), Value::Bool(true));
        assert_eq!(nats_field(&tls, "consumer_mode"), "bind");
        let plain = doc(r#""url": "nats://127.0.0.1:4222", "create_consumer": true"#);
        assert_eq!(nats_field(&plain, "tls_required"), Value::Bool(false));
        assert_eq!(nats_field(&plain, "consumer_mode"), "create");
        let shown = effective_json(&tls).unwrap();
        assert_eq!(effective_json(&shown).unwrap(), shown);
        assert_eq!(
            RuntimeConfig::parse(&shown).unwrap(),
            RuntimeConfig::parse(&tls).unwrap()
        );
    }

    #[test]
    fn the_http_sink_query_and_secret_headers_are_redacted() {
        let text = r#"{"nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                                 "subject": "a.>"},
                       "sink": {"type": "http",
                                "url": "https://h.example/hook?token=q-secret-7788&tenant=blue",
                                "probe_url": "https://h.example/ping?sig=abc123def",
                                "headers": {"X-Team": "payments"}}}"#;
        let shown = effective_json(text).unwrap();
        assert!(
            !shown.contains("q-secret-7788") && !shown.contains("abc123def"),
            "{shown}"
        );
        assert!(
            shown.contains(r#""url": "https://h.example/hook?token=<redacted>&tenant=<redacted>""#),
            "{shown}"
        );
        assert!(shown.contains(r#""X-Team": "payments""#), "{shown}");
        assert!(
            shown.contains(r#""probe_url": "https://h.example/ping?sig=<redacted>""#),
            "{shown}"
        );
        // What it prints is a valid configuration that prints the same bytes again.
        assert_eq!(effective_json(&shown).unwrap(), shown);
        // A webhook URL carries its secret in the path (Slack, Discord, Teams).
        let slack = text.replace(
            "https://h.example/hook?token=q-secret-7788&tenant=blue",
            "https://hooks.slack.com/services/T0AB12/B0CD34/q-secret-7788",
        );
        let shown = effective_json(&slack).unwrap();
        assert!(
            !shown.contains("q-secret-7788") && !shown.contains("T0AB12"),
            "{shown}"
        );
        assert!(
            shown.contains(r#""url": "https://hooks.slack.com/services/<redacted>""#),
            "{shown}"
        );
        let mut node = Node::Object(vec![(
            "headers".into(),
            Node::Object(vec![
                ("X-Auth-Key".into(), Node::Leaf(Value::String("k-1".into()))),
                ("X-Team".into(), Node::Leaf(Value::String("ops".into()))),
            ]),
        )]);
        redact(&mut node);
        let json = node.to_json_pretty();
        assert!(
            json.contains(r#""X-Auth-Key": "<redacted>""#) && json.contains("ops"),
            "{json}"
        );
    }
}
