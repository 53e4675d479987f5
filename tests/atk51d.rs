//! atk51d: the relational sink's hand-written encoders (MySQL literals quoted in place with
//! escapes found eight bytes at a time, the PostgreSQL batch's JSON written by hand, the row
//! key in one string) against hostile text, read back from the real MariaDB and PostgreSQL
//! byte for byte: every byte 0x00-0x7f, quotes of both kinds, backslashes, multi-byte
//! characters straddling the 8-byte words, U+2028, long values, in every backslash and quote
//! mode of the session.

use std::sync::Arc;

use serde_json::json;

use crate::support::mysql::{root, MyDb};
use crate::support::postgres::{envelope, parse_cfg, TestDb};
use svc::message::envelope::Envelope;
use svc::metrics::Metrics;
use svc::sink::relational::my_sink::MySqlSink;
use svc::sink::Sink;

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02X}")).collect()
}

/// The SHA-256 of `s` in lower-case hex: what the read-backs compare (a long value's hex
/// would outgrow the test client's answer limit).
fn digest(s: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Hostile strings: every ASCII byte alone and inside words, escapes next to each other,
/// multi-byte characters at every offset of an 8-byte word, a long mixed value.
fn hostile(nul: bool) -> Vec<String> {
    let mut v: Vec<String> = (0u8..0x80)
        .filter(|&b| nul || b != 0)
        .flat_map(|b| {
            let c = char::from(b);
            [c.to_string(), format!("abcdefg{c}hijklmnop{c}{c}")]
        })
        .collect();
    for s in [
        "'",
        "\"",
        "\\",
        "\\'",
        "''",
        "\\\\'",
        "\\\"",
        "'; DROP TABLE x; --",
        "\" OR 1=1 --",
        "\u{2028}\u{2029}\u{202e}\u{feff}",
        "\\u0000",
        "\\ud800",
        "é'😀\\€\r\n\u{1a}",
    ] {
        v.push(s.to_string());
    }
    for at in 0..17 {
        for mb in ["é", "€", "😀", "\u{2028}"] {
            v.push(format!("{}{mb}'{mb}\\\"{mb}", "x".repeat(at)));
        }
    }
    let unit = if nul {
        "ab'c\"d\\e\0f\r\ng\u{1a}hé😀\u{7f}"
    } else {
        "ab'c\"d\\e\u{1}f\r\ng\u{1a}hé😀\u{7f}"
    };
    // Long, yet within a TEXT column (64 KiB) and the test client's 1 MiB answer.
    v.push(unit.repeat(2_000));
    v
}

#[test]
fn mysql_literals_round_trip_every_byte_in_every_sql_mode() {
    let strings = hostile(true);
    for mode in [
        "",
        "NO_BACKSLASH_ESCAPES",
        "ANSI_QUOTES",
        "NO_BACKSLASH_ESCAPES,ANSI_QUOTES",
    ] {
        let mut c = root();
        c.query(&format!("SET SESSION sql_mode = '{mode}'"))
            .unwrap();
        assert_eq!(c.no_backslash_escapes(), mode.starts_with("NO_"), "{mode}");
        for s in &strings {
            let lit = c.quote(s);
            let got = c
                .query(&format!("SELECT HEX({lit}), CHAR_LENGTH({lit})"))
                .unwrap_or_else(|e| panic!("{mode}: {s:?}: {e}"));
            assert_eq!(got.rows[0][0].as_deref(), Some(&*hex(s)), "{mode}: {s:?}");
            let chars = s.chars().count().to_string();
            assert_eq!(got.rows[0][1].as_deref(), Some(&*chars), "{mode}: {s:?}");
        }
    }
}

/// Envelopes with `s` in every string field the row carries.
fn hostile_envelopes(strings: &[String]) -> Vec<Envelope> {
    strings
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut e = envelope("a", i as u64 + 1, s.as_bytes());
            e.subject = s.clone();
            // A long key would exceed the index's limit (as before this range): long values
            // go in every column but the key's.
            if s.len() < 1000 {
                e.stream_incarnation = s.as_str().into();
            }
            e.consumer = s.as_str().into();
            e.message_id = Some(s.clone());
            e.priority = s.clone();
            e.classification = s.clone();
            e.labels = s.clone();
            e.labels_list = vec![s.clone(), "x".into()];
            e.mission_metadata = Some(json!({ (s.clone()): s }));
            e
        })
        .collect()
}

/// What each stored row must read back as, in the order of `hostile_envelopes`.
fn expected(batch: &[Envelope]) -> Vec<Vec<String>> {
    batch
        .iter()
        .map(|e| {
            let inc: &str = &e.stream_incarnation;
            let cons: &str = &e.consumer;
            let list = serde_json::to_string(&e.labels_list).unwrap();
            [
                &*svc::sink::relational::row_key(e),
                &e.subject,
                inc,
                cons,
                e.message_id.as_deref().unwrap(),
                &e.priority,
                &e.classification,
                &e.labels,
                &list,
                e.payload.json(),
            ]
            .iter()
            .enumerate()
            // An empty incarnation is stored as NULL.
            .map(|(n, s)| match (n, s.is_empty()) {
                (2, true) => "NULL".to_string(),
                _ => digest(s),
            })
            .collect()
        })
        .collect()
}

const COLS: [&str; 10] = [
    "idempotency_key",
    "subject",
    "stream_incarnation",
    "consumer",
    "message_id",
    "priority",
    "classification",
    "labels",
    "labels_list",
    "payload",
];

#[test]
fn mysql_sink_stores_hostile_fields_byte_for_byte() {
    for mode in ["insert", "upsert"] {
        mysql_stores_hostile_fields(mode);
    }
}

fn mysql_stores_hostile_fields(mode: &str) {
    let db = MyDb::new("atk51d");
    let cfg = json!({
        "write_mode": mode,
        "type": "relational_db",
        "engine": "mysql",
        "dsn": format!("mysql://root@127.0.0.1:3306/{}", db.name),
        "tls_mode": "disable",
        "table": "events",
        "auto_create_tables": true,
    });
    let s = MySqlSink::new(parse_cfg(&cfg), Arc::new(Metrics::default())).unwrap();
    let batch = hostile_envelopes(&hostile(true));
    let out = s.write_batch(&batch);
    let bad: Vec<String> = out
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.is_durable())
        .map(|(i, o)| {
            format!(
                "{i}: {}",
                &format!("{o:?}")[..300.min(format!("{o:?}").len())]
            )
        })
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
    let sel: Vec<String> = COLS.iter().map(|c| format!("SHA2({c}, 256)")).collect();
    let got: Vec<Vec<String>> = db
        .rows(&format!(
            "SELECT {} FROM events ORDER BY stream_sequence",
            sel.join(",")
        ))
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|c| c.unwrap_or_else(|| "NULL".into()))
                .collect()
        })
        .collect();
    assert_eq!(got.len(), batch.len());
    for (i, (g, w)) in got.iter().zip(expected(&batch)).enumerate() {
        assert!(*g == w, "row {i}: {:?}", &batch[i].subject.get(..60));
    }
    // Redelivered: every row already durable (the keys read back match), or for upsert
    // written again over itself; nothing else stored.
    let again = s.write_batch(&batch);
    let fresh = again
        .iter()
        .filter(|o| !matches!(o, svc::sink::WriteOutcome::AlreadyDurable))
        .count();
    if mode == "insert" {
        assert_eq!(fresh, 0);
    } else {
        assert!(again.iter().all(|o| o.is_durable()), "{mode}");
    }
    let after: Vec<Vec<Option<String>>> = db.rows(&format!(
        "SELECT {} FROM events ORDER BY stream_sequence",
        sel.join(",")
    ));
    assert_eq!(after.len(), batch.len(), "{mode}");
}

#[test]
fn postgres_sink_stores_hostile_fields_byte_for_byte() {
    for mode in ["insert", "upsert"] {
        postgres_stores_hostile_fields(mode);
    }
}

fn postgres_stores_hostile_fields(mode: &str) {
    let db = TestDb::new("atk51d");
    let (s, _) = db.relational_sink(json!({"auto_create_tables": true, "write_mode": mode}));
    // PostgreSQL text holds no NUL (as before this range): the rest of the bytes.
    let batch = hostile_envelopes(&hostile(false));
    let out = s.write_batch(&batch);
    let bad: Vec<String> = out
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.is_durable())
        .map(|(i, o)| {
            format!(
                "{i}: {}",
                &format!("{o:?}")[..300.min(format!("{o:?}").len())]
            )
        })
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
    // text[] and jsonb come back in PostgreSQL's form: the first label's bytes, and the
    // payload compared as a JSON value.
    let mut cols: Vec<&str> = COLS[..8].to_vec();
    cols.push("labels_list[1]");
    let sel: Vec<String> = cols
        .iter()
        .map(|c| format!("encode(sha256(convert_to({c}, 'UTF8')), 'hex')"))
        .collect();
    let got = db.rows(&format!(
        "SELECT {}, payload::text FROM events ORDER BY stream_sequence",
        sel.join(",")
    ));
    assert_eq!(got.len(), batch.len());
    for (i, (g, w)) in got.iter().zip(expected(&batch)).enumerate() {
        let g: Vec<&str> = g.iter().map(|c| c.as_deref().unwrap_or("NULL")).collect();
        assert!(
            g[..8] == w[..8],
            "row {i}: {:?}",
            &batch[i].subject.get(..60)
        );
        assert_eq!(g[8], digest(&batch[i].labels_list[0]), "row {i}");
        let stored: serde_json::Value = serde_json::from_str(g[9]).unwrap();
        let sent: serde_json::Value = serde_json::from_str(batch[i].payload.json()).unwrap();
        assert_eq!(stored, sent, "row {i}");
    }
    // A NUL (which PostgreSQL text cannot hold) refuses its own row only, as before.
    let mut mixed = hostile_envelopes(&["a\0b".to_string(), "ok".into(), "\0".into()]);
    for (n, e) in mixed.iter_mut().enumerate() {
        e.stream_sequence = 10_000 + n as u64;
    }
    mixed[1].subject = "ok".into();
    mixed.push(envelope("a", 20_000, br#"{"s":"\u0000"}"#));
    let out = s.write_batch(&mixed);
    // JSON with \u0000 is kept as text (wrapped), so PostgreSQL stores it.
    assert!(out[3].is_durable(), "{out:?}");
    let wrapped = db
        .rows("SELECT payload->>'text', payload_wrapped FROM events WHERE stream_sequence = 20000");
    assert_eq!(wrapped[0][0].as_deref(), Some(r#"{"s":"\u0000"}"#));
    assert_eq!(wrapped[0][1].as_deref(), Some("t"));
    assert!(
        matches!(out[0], svc::sink::WriteOutcome::Permanent(_)),
        "{out:?}"
    );
    assert!(out[1].is_durable(), "{out:?}");
    assert!(
        matches!(out[2], svc::sink::WriteOutcome::Permanent(_)),
        "{out:?}"
    );
}

/// Hostile subjects, `Nats-Msg-Id`s and payloads a publisher sends over the raw protocol.
fn hostile_messages() -> Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let ids: [&[u8]; 8] = [
        b"m'1",
        b"m\"2\\",
        b"m\\'3 ; DROP TABLE events; --",
        b"\xc3\xa9\xe2\x80\xa8\xf0\x9f\x98\x804'",
        b"1234567'\\\"5",
        b"m\x016\x1a\x7f",
        b"\\u0000\\ud8007",
        b"x\t8",
    ];
    let payloads: [&[u8]; 8] = [
        br#"{"s":"it's \"q\" \\ \u0000 \u001a \ud800 \u2028","n":1.50,"big":12345678901234567890}"#,
        b"plain 'text' \"q\" \\ \x01\x1a\x7f \r\n",
        b"\xff\xfe not UTF-8 '\\",
        // Compact: the runner drops whitespace outside strings (by design).
        br#"["'","\"","\\","\u00e9"]"#,
        b"1234567'\\\"\xc3\xa9",
        b"\"just a string ' \\\\ \"",
        b"{\"k\":\"\xe2\x80\xa8\xe2\x80\xa9\"}",
        b"",
    ];
    let subjects: [&[u8]; 8] = [
        b"orders.a'b",
        b"orders.\"c\\d",
        b"orders.\xc3\xa9\xf0\x9f\x98\x80",
        b"orders.1234567'x",
        // No space: NATS splits the HPUB line on it.
        b"orders.x\\';--",
        b"orders.\x01\x1a\x7f",
        b"orders.plain",
        b"orders.\xe2\x80\xa8",
    ];
    (0..8)
        .map(|i| (subjects[i].to_vec(), ids[i].to_vec(), payloads[i].to_vec()))
        .collect()
}

/// One table's rows by stream sequence: digests of the text columns and the payload.
type Stored = std::collections::BTreeMap<u64, Vec<String>>;

fn by_sequence(rows: Vec<Vec<Option<String>>>) -> Stored {
    rows.into_iter()
        .map(|r| {
            let mut it = r.into_iter().map(|c| c.unwrap_or_else(|| "NULL".into()));
            let seq = it.next().unwrap().parse().unwrap();
            (seq, it.collect())
        })
        .collect()
}

fn run_until_acked(
    server: &crate::support::broker::NatsServer,
    consumer: &str,
    sink: serde_json::Value,
    n: u64,
) {
    use crate::support::process::Runner;
    let dir = tempfile::tempdir().unwrap();
    let cfg = json!({
        "nats": {"url": server.url(), "stream": "ORDERS", "consumer": consumer,
                 "subject": "orders.>"},
        "delivery": {"batch_size": 64, "fetch_expiry_ms": 200, "shutdown_timeout_seconds": 10},
        "sink": sink,
        "logging": {"level": "info"}
    });
    let cfg = crate::support::write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    crate::support::wait_until(
        std::time::Duration::from_secs(30),
        "every message acked",
        || server.try_consumer_state("ORDERS", consumer) == Some((n, 0, 0)),
    );
    runner.signal("TERM");
    let status = runner
        .wait_timeout(std::time::Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{}", runner.log_text());
}

/// `svc run` into MariaDB and into PostgreSQL from one stream of hostile messages: every
/// message acked and stored once, the subject, message id and payload as the publisher sent
/// them (MariaDB keeps the payload's text byte for byte), the same key and subject in both.
#[test]
fn svc_run_stores_hostile_messages_the_same_in_both_databases() {
    use crate::support::broker::NatsServer;
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    for c in ["my", "pg"] {
        server.create_consumer("ORDERS", c, "orders.>", std::time::Duration::from_secs(30));
    }
    let msgs = hostile_messages();
    for (subject, id, payload) in &msgs {
        server.raw_publish(subject, &[(b"Nats-Msg-Id", id)], payload);
    }
    let n = msgs.len() as u64;
    let my = MyDb::new("atk51drun");
    run_until_acked(
        &server,
        "my",
        json!({"type": "relational_db", "engine": "mysql", "tls_mode": "disable",
               "dsn": format!("mysql://root@127.0.0.1:3306/{}", my.name),
               "table": "events", "auto_create_tables": true}),
        n,
    );
    let pg = TestDb::new("atk51drun");
    run_until_acked(
        &server,
        "pg",
        pg.sink(json!({"auto_create_tables": true})),
        n,
    );
    let my_rows = by_sequence(my.rows(
        "SELECT stream_sequence, SHA2(idempotency_key, 256), SHA2(subject, 256), \
         SHA2(message_id, 256), payload FROM events",
    ));
    let pg_rows = by_sequence(pg.rows(
        "SELECT stream_sequence, encode(sha256(convert_to(idempotency_key, 'UTF8')), 'hex'), \
         encode(sha256(convert_to(subject, 'UTF8')), 'hex'), \
         encode(sha256(convert_to(message_id, 'UTF8')), 'hex'), payload::text FROM events",
    ));
    assert_eq!(my_rows.len(), msgs.len());
    assert_eq!(pg_rows.len(), msgs.len());
    for (i, (subject, id, payload)) in msgs.iter().enumerate() {
        let seq = i as u64 + 1;
        let (m, p) = (&my_rows[&seq], &pg_rows[&seq]);
        assert_eq!(m[..3], p[..3], "message {i}: key, subject, message id");
        assert_eq!(m[1], digest(std::str::from_utf8(subject).unwrap()), "{i}");
        assert_eq!(m[2], digest(std::str::from_utf8(id).unwrap()), "{i}");
        let a: serde_json::Value = serde_json::from_str(&m[3]).unwrap();
        let b: serde_json::Value = serde_json::from_str(&p[3]).unwrap();
        assert_eq!(a, b, "message {i}: payload");
        if serde_json::from_slice::<serde_json::Value>(payload).is_ok() {
            assert_eq!(m[3].as_bytes(), payload.as_slice(), "message {i}");
        }
    }
}

/// One row MariaDB refuses (a subject longer than its TEXT column) sends the batch row by
/// row: each of the others is written from its own range of the shared statement buffer,
/// byte for byte, and only the long one is refused.
#[test]
fn mysql_row_by_row_fallback_writes_each_tuple_from_its_own_range() {
    let db = MyDb::new("atk51dfb");
    let cfg = json!({
        "type": "relational_db", "engine": "mysql", "tls_mode": "disable",
        "dsn": format!("mysql://root@127.0.0.1:3306/{}", db.name),
        "table": "events", "auto_create_tables": true,
    });
    let s = MySqlSink::new(parse_cfg(&cfg), Arc::new(Metrics::default())).unwrap();
    let mut strings: Vec<String> = hostile(true).into_iter().step_by(7).collect();
    let long = 3;
    strings[long] = "x'\\\"".repeat(20_000);
    let mut batch = hostile_envelopes(&strings);
    batch[long].stream_incarnation = "".into();
    let out = s.write_batch(&batch);
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.is_durable(), i != long, "row {i}");
    }
    let sel: Vec<String> = COLS.iter().map(|c| format!("SHA2({c}, 256)")).collect();
    let got = db.rows(&format!(
        "SELECT {} FROM events ORDER BY stream_sequence",
        sel.join(",")
    ));
    let mut want = expected(&batch);
    want.remove(long);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.into_iter().zip(want).enumerate() {
        let g: Vec<String> = g.into_iter().map(|c| c.unwrap_or("NULL".into())).collect();
        assert!(g == w, "row {i}");
    }
}

/// A batch past `MAX_STATEMENT_BYTES` (8 MiB) is split into several statements cut from the
/// shared buffer at row boundaries: every row lands whole, once.
#[test]
fn mysql_batch_split_past_the_statement_limit_keeps_every_row_whole() {
    let db = MyDb::new("atk51dsplit");
    let cfg = json!({
        "type": "relational_db", "engine": "mysql", "tls_mode": "disable",
        "dsn": format!("mysql://root@127.0.0.1:3306/{}", db.name),
        "table": "events", "auto_create_tables": true,
    });
    let s = MySqlSink::new(parse_cfg(&cfg), Arc::new(Metrics::default())).unwrap();
    let unit = "ab'c\"d\\e\0f\r\ng\u{1a}hé😀\u{7f}";
    let strings: Vec<String> = (0..12)
        .map(|i| format!("{i}{}", unit.repeat(45_000 + i)))
        .collect();
    let mut batch = hostile_envelopes(&strings);
    for (i, e) in batch.iter_mut().enumerate() {
        // Short text columns; the payload carries the bulk.
        let short = format!("{i}'\\\"{}", &unit[..8]);
        e.subject = short.clone();
        e.stream_incarnation = short.as_str().into();
        e.consumer = short.as_str().into();
        e.message_id = Some(short.clone());
        e.priority = short.clone();
        e.classification = short.clone();
        e.labels = short.clone();
        e.labels_list = vec![short.clone(), "x".into()];
        e.mission_metadata = None;
    }
    let total: usize = batch.iter().map(|e| e.payload.json().len()).sum();
    assert!(
        total > svc::sink::relational::my_sink::MAX_STATEMENT_BYTES,
        "{total}"
    );
    let out = s.write_batch(&batch);
    assert!(out.iter().all(|o| o.is_durable()));
    let sel: Vec<String> = COLS.iter().map(|c| format!("SHA2({c}, 256)")).collect();
    let got = db.rows(&format!(
        "SELECT {} FROM events ORDER BY stream_sequence",
        sel.join(",")
    ));
    assert_eq!(got.len(), batch.len());
    for (i, (g, w)) in got.into_iter().zip(expected(&batch)).enumerate() {
        let g: Vec<String> = g.into_iter().map(|c| c.unwrap_or("NULL".into())).collect();
        assert!(g == w, "row {i}");
    }
}
