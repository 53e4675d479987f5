//! Relational sink tests that need no server: configuration, DDL, row keys, and an unreachable
//! server. What connects to PostgreSQL is in the integration tests (`tests/relational_client.rs`
//! on the local server, `tests/relational_cluster.rs` on a private one), so `cargo test --lib`
//! needs nothing but cargo.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};
use crate::sink::{Sink, WriteOutcome};

fn parse_cfg(v: &serde_json::Value) -> RelationalConfig {
    let problems = crate::document::reader::Problems::new();
    let mut r = crate::document::reader::ObjectReader::at("sink".into(), v, &problems);
    r.req_string("type");
    let cfg = RelationalConfig::read(&mut r);
    r.finish();
    assert!(problems.is_empty(), "{:?}", problems.into_vec());
    cfg
}

/// A normalized message with a message id (the rows of these tests are never written).
fn envelope(subject: &str, seq: u64, data: &[u8]) -> Envelope {
    normalize(
        &RawMessage {
            headers: vec![("Nats-Msg-Id".into(), format!("msg-{seq}"))],
            ..RawMessage::sample(subject, seq, data)
        },
        1_700_000_001_000_000_000,
        &EnvelopeConfig::default(),
    )
    .0
}

fn batch(subject: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<Envelope> {
    seqs.map(|s| envelope(subject, s, format!("{{\"n\":{s}}}").as_bytes()))
        .collect()
}

#[test]
fn an_unreachable_server_is_transient() {
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = parse_cfg(&json!({
        "type": "relational_db",
        "dsn": format!("postgresql://svc@127.0.0.1:{port}/x"),
        "tls_mode": "disable",
        "table": "events",
        "connect_timeout_seconds": 2,
    }));
    let sink = RelationalSink::new(cfg, Arc::new(Metrics::default())).unwrap();
    let out = sink.write_batch(&batch("a.b", 1..=2));
    match &out[1] {
        WriteOutcome::Transient(e) => assert!(
            e.message.starts_with(&format!(
                "connect to 127.0.0.1:{port}/x: connection: connect"
            )),
            "{e}"
        ),
        o => panic!("{o:?}"),
    }
    assert!(sink.check().is_err());
}

#[test]
fn ddl_is_stable() {
    let cfg = parse_cfg(&json!({
        "type": "relational_db",
        "dsn": "postgresql://svc@127.0.0.1/x",
        "tls_mode": "disable",
        "table": "events",
    }));
    let text = ddl(&cfg);
    assert!(
        include_str!("../../../docs/sinks/relational.md").contains(&text),
        "docs/sinks/relational.md must hold the current DDL verbatim:\n{text}"
    );
    assert!(text.starts_with("CREATE TABLE IF NOT EXISTS \"events\" (\n    idempotency_key text NOT NULL PRIMARY KEY,\n"), "{text}");
    assert!(text.contains("    security_labels_json jsonb,\n"));
    assert!(text.contains("    metadata_json jsonb NOT NULL,\n"));
    assert!(text.contains(
        "CREATE INDEX IF NOT EXISTS \"events_stream_seq_idx\" ON \"events\" (stream, stream_sequence);"
    ));
}

#[test]
fn row_keys_follow_the_shared_idempotency_strategy() {
    let e = envelope("a", 42, b"{}");
    assert_eq!(row_key(&e), "s-ORDERS-42");
    let mut e = envelope("a", 0, b"{}");
    e.stream_sequence = 0;
    assert_eq!(row_key(&e), "m-msg-0");
}

/// The insert's JSON parameter, written by hand, is byte for byte what serde_json makes of
/// the rows: escapes of quotes, backslashes and control characters, NULLs, labels, custody.
#[test]
fn rows_json_is_what_serde_writes() {
    let mut odd = envelope("a.b", 7, b"{\"k\":\"v\\\"\\u0001\"}");
    odd.subject = "a\"b\\c\u{1}\u{8}\u{c}\n\r\t\u{1f}\u{7f}é😀".into();
    odd.stream_incarnation = "20261128T071943Z".into();
    odd.message_id = None;
    odd.priority = "high \"x\"".into();
    odd.labels = "secret,\\x".into();
    odd.labels_list = vec!["a\"".into(), "\u{0}".into()];
    odd.security_labels = Some(json!({"level": "s\"", "n": [1, 2.5, null]}));
    odd.mission_metadata = Some(json!({"m": "\u{2}"}));
    odd.metadata.headers.insert("X-H".into(), "v\"\n".into());
    let text = envelope("t", 9, b"plain text \"quoted\"");
    let rows = [envelope("a.b", 1, b"{}"), odd, text];
    let keys: Vec<String> = rows.iter().map(row_key).collect();
    let by_serde: Vec<row::Row> = rows.iter().zip(&keys).map(|(e, k)| row(e, k)).collect();
    assert_eq!(
        row::rows_json(&rows, &keys, &[0, 1, 2]).unwrap(),
        serde_json::to_string(&by_serde).unwrap()
    );
    assert_eq!(
        row::rows_json(&rows, &keys, &[1]).unwrap(),
        serde_json::to_string(&[row(&rows[1], &keys[1])]).unwrap()
    );
}

#[test]
fn decimals_are_the_formatters() {
    for n in [
        0,
        1,
        9,
        10,
        99,
        100,
        12_345,
        u64::from(u32::MAX),
        u64::MAX - 1,
        u64::MAX,
    ] {
        assert_eq!(row::decimal(n, &mut [0; 20]), n.to_string());
    }
}
