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

/// atk51d: hostile text in every string column (every control byte, quotes of both kinds,
/// backslash, DEL, U+2028, multi-byte characters straddling the 8-byte words, long runs):
/// the hand-written JSON parameter is serde_json's, the MySQL literal is the old per-char
/// quoting's, and the row key is the old `stream_place` format.
#[test]
fn atk51d_random_hostile_text_encodes_as_before() {
    let palette: Vec<String> = (0u8..0x20)
        .map(|b| char::from(b).to_string())
        .chain(
            [
                "\"", "'", "\\", "\u{7f}", "é", "€", "😀", "\u{2028}", "\u{202e}", "a", "~", "/",
                ".",
            ]
            .map(String::from),
        )
        .collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    macro_rules! text {
        ($max:expr) => {
            rand_text(&mut next, &palette, $max)
        };
    }
    for round in 0..3_000u64 {
        let payload: Vec<u8> = match round % 4 {
            0 => b"{}".to_vec(),
            1 => text!(40).into_bytes(),
            2 => format!("{{\"k\":{},\"n\":1.50e0}}", json!(text!(20))).into_bytes(),
            _ => (0..next() % 24).map(|_| next() as u8).collect(),
        };
        let mut e = envelope("a.b", round + 1, &payload);
        e.subject = text!(30);
        e.stream = text!(12).into();
        e.stream_incarnation = if round % 3 == 0 {
            "".into()
        } else {
            text!(10).into()
        };
        e.consumer = text!(10).into();
        e.message_id = (round % 5 != 0).then(|| text!(20));
        e.priority = text!(12);
        e.classification = text!(12);
        e.labels = text!(40);
        e.labels_list = (0..next() % 4).map(|_| text!(10)).collect();
        e.security_labels = Some(json!({ (text!(6)): text!(20) }));
        e.mission_metadata = Some(json!({"m": text!(20), "n": -1.5e300}));
        e.metadata.headers.insert(text!(8), text!(20));
        if round % 7 == 0 {
            e.stream = "".into();
        }
        if round % 11 == 0 {
            e.stream_sequence = 0;
        }
        let key = row_key(&e);
        let old = if !e.stream.is_empty() && e.stream_sequence > 0 {
            let inc = match &*e.stream_incarnation {
                "" => String::new(),
                i => crate::sink::key::safe_component(i),
            };
            let place = crate::message::envelope::stream_place(
                &crate::sink::key::safe_component(&e.stream),
                &inc,
                e.stream_sequence,
                "-",
            );
            format!("s-{place}")
        } else if let Some(m) = e.message_id.as_deref().filter(|m| !m.is_empty()) {
            format!("m-{}", crate::sink::key::safe_component(m))
        } else {
            format!("p-{}", e.payload_info.sha256)
        };
        assert_eq!(key, old, "{e:?}");
        let rows = [e];
        let keys = [key];
        assert_eq!(
            row::rows_json(&rows, &keys, &[0]).unwrap(),
            serde_json::to_string(&[row(&rows[0], &keys[0])]).unwrap(),
            "{:?}",
            rows[0]
        );
        for s in [&rows[0].subject, &rows[0].labels] {
            for nbe in [false, true] {
                assert_eq!(
                    crate::db::mysql::quote(s, nbe),
                    quote_per_char(s, nbe),
                    "{s:?}"
                );
            }
        }
    }
}

/// `mysql::quote` as it was before atk51d's range (one char at a time, `"` escaped too: an
/// escaped `\"` and a bare `"` are the same character inside `'...'`, so the comparison
/// drops that one difference).
fn quote_per_char(text: &str, nbe: bool) -> String {
    let mut out = String::from("'");
    for c in text.chars() {
        match c {
            '\'' if nbe => out.push_str("''"),
            c if nbe => out.push(c),
            '\0' => out.push_str("\\0"),
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\u{1a}' => out.push_str("\\Z"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

fn rand_text(next: &mut impl FnMut() -> u64, palette: &[String], max: u64) -> String {
    let n = next() % max;
    (0..n)
        .map(|_| palette[(next() % palette.len() as u64) as usize].as_str())
        .collect()
}
