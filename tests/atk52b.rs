//! atk52b: attacks on h52perf (b6db0a7, merged in 2fa198f): the envelope metadata JSON written
//! by hand (`EventMetadata::write_json`) and the MySQL `labels_list` array, stored in the real
//! PostgreSQL (`jsonb`) and MariaDB (`LONGTEXT CHECK (JSON_VALID)`), with header names and
//! values a publisher chooses (every character up to U+0800, U+2028, bidi controls, characters
//! straddling 8-byte words), the largest delivery count and security labels with big numbers.
//! The scan/parse and escaper attacks are unit tests in `crates/document/src/canonical.rs` and
//! `src/message/envelope.rs` (`held_atk52b_...`).
//!
//! `held_...`: an attack that held (these pass). `found_...`: a finding's reproduction; it fails
//! on today's code (2fa198f) and says what it expected.

use std::sync::Arc;

use serde_json::json;

use crate::support::mysql::MyDb;
use crate::support::postgres::{envelope, parse_cfg, TestDb};
use svc::message::envelope::Envelope;
use svc::metrics::Metrics;
use svc::sink::relational::my_sink::MySqlSink;
use svc::sink::Sink;

fn sha(s: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Envelopes whose metadata headers (names and values) and `labels_list` hold hostile text:
/// every character up to U+0800 (NUL only when `nul`), packed runs across 8-byte words.
fn hostile_metadata(nul: bool) -> Vec<Envelope> {
    let mut chars: Vec<char> = (0u32..0x800)
        .filter_map(char::from_u32)
        .filter(|&c| nul || c != '\0')
        .collect();
    chars.extend([
        '\u{2028}',
        '\u{2029}',
        '\u{202e}',
        '\u{2066}',
        '\u{feff}',
        '\u{10ffff}',
    ]);
    let mut out = Vec::new();
    for (i, chunk) in chars.chunks(16).enumerate() {
        let mut e = envelope("a", i as u64 + 1, br#"{"k":1}"#);
        for (n, c) in chunk.iter().enumerate() {
            e.metadata.headers.insert(
                format!("{}{c}", "h".repeat(n % 9)),
                format!("{c}{}{c}{c}", "v".repeat(n)),
            );
        }
        let packed: String = chunk.iter().collect();
        e.metadata.headers.insert(packed.clone(), packed.repeat(3));
        e.metadata.delivery_count = [u64::MAX, 0, 1 << 53, (1 << 53) + 1][i % 4];
        e.metadata.security_labels = Some(json!({
            "big": u64::MAX, "neg": i64::MIN, "s": packed, "f": 0.1, "g": 1e300,
        }));
        e.labels_list = chunk.iter().map(|c| format!("{c}{packed}")).collect();
        out.push(e);
    }
    out
}

fn all_durable(out: &[svc::sink::WriteOutcome]) {
    let bad: Vec<String> = out
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.is_durable())
        .map(|(i, o)| {
            format!(
                "{i}: {}",
                format!("{o:?}").chars().take(300).collect::<String>()
            )
        })
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
}

/// MariaDB keeps LONGTEXT as written: `metadata_json` and `labels_list` are byte for byte what
/// serde_json writes of the metadata and the label list (SHA-256 compared), and JSON_VALID.
#[test]
fn held_mariadb_metadata_and_labels_are_serde_bytes() {
    let db = MyDb::new("atk52b");
    let cfg = json!({
        "type": "relational_db", "engine": "mysql",
        "dsn": format!("mysql://root@127.0.0.1:3306/{}", db.name),
        "tls_mode": "disable", "table": "events", "auto_create_tables": true,
    });
    let s = MySqlSink::new(parse_cfg(&cfg), Arc::new(Metrics::default())).unwrap();
    let batch = hostile_metadata(true);
    all_durable(&s.write_batch(&batch));
    let got = db.rows(
        "SELECT SHA2(metadata_json, 256), SHA2(labels_list, 256), \
         JSON_VALID(metadata_json), JSON_VALID(labels_list) FROM events ORDER BY stream_sequence",
    );
    assert_eq!(got.len(), batch.len());
    for (i, (g, e)) in got.iter().zip(&batch).enumerate() {
        let g: Vec<&str> = g.iter().map(|c| c.as_deref().unwrap_or("NULL")).collect();
        let meta = serde_json::to_string(&e.metadata).unwrap();
        let labels = serde_json::to_string(&e.labels_list).unwrap();
        assert_eq!(g, [&*sha(&meta), &*sha(&labels), "1", "1"], "row {i}");
    }
}

/// PostgreSQL `jsonb` reads the hand-written metadata back as the value serde_json writes of
/// it (jsonb re-lays it out, so compared as JSON values), and `labels_list` as the text array.
#[test]
fn held_postgres_metadata_reads_back_as_serde_value() {
    let db = TestDb::new("atk52b");
    let (s, _) = db.relational_sink(json!({"auto_create_tables": true}));
    let batch = hostile_metadata(false);
    all_durable(&s.write_batch(&batch));
    let got = db.rows(
        "SELECT metadata_json::text, array_to_json(labels_list)::text FROM events \
         ORDER BY stream_sequence",
    );
    assert_eq!(got.len(), batch.len());
    for (i, (g, e)) in got.iter().zip(&batch).enumerate() {
        let stored: serde_json::Value = serde_json::from_str(g[0].as_deref().unwrap()).unwrap();
        // jsonb holds numbers as numeric: u64::MAX and i64::MIN come back exact.
        let sent: serde_json::Value = serde_json::to_value(&e.metadata).unwrap();
        assert_eq!(stored, sent, "row {i}");
        let labels: Vec<String> = serde_json::from_str(g[1].as_deref().unwrap()).unwrap();
        assert_eq!(labels, e.labels_list, "row {i}");
    }
}

/// Hostile payloads for the end-to-end run: duplicate keys spelled with an escape, many
/// distinct keys in sorted runs, out-of-range and long numbers, a lone surrogate, `\u0000`,
/// nesting at and past the bound, a string ending on an 8-byte word edge, whitespace, `-0`.
fn hostile_payloads() -> Vec<Vec<u8>> {
    let keys = (0..3000)
        .map(|n| format!("\"k{n}\":{n}"))
        .collect::<Vec<_>>()
        .join(",");
    [
        r#"{"a":1,"\u0061":2}"#.to_string(),
        format!("{{{keys}}}"),
        r#"{"k":1e400}"#.into(),
        format!("[1{}]", "0".repeat(70)),
        r#"["\ud800"]"#.into(),
        r#"{"s":"\u0000"}"#.into(),
        // 31 deep: MariaDB's JSON_VALID takes at most 31 (deeper is wrapped as text: fixed_... below).
        format!("{}1{}", "[".repeat(31), "]".repeat(31)),
        format!("{}1{}", "[".repeat(128), "]".repeat(128)),
        "\"abcdef\"".into(),
        " { \"a\" : [ 1 , 2 ] , \"\\u00e9\":\"\u{2028}\" } ".into(),
        "-0".into(),
        r#"{"a":{"b":1},"c":{"b":2,"\u0062":3}}"#.into(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect()
}

/// `svc run` from a real broker into PostgreSQL and MariaDB: hostile payloads and a kept
/// header whose value holds control characters, U+2028, quotes, backslashes and multi-byte
/// characters. Every message acked and stored once; the stored payload and its format are
/// what `normalize_payload` (the code under attack, in-process) makes of the bytes; MariaDB's
/// `metadata_json` is JSON_VALID and holds the header byte for byte; PostgreSQL's reads back.
#[test]
fn held_svc_run_stores_hostile_payloads_and_metadata_in_both_databases() {
    use crate::support::broker::NatsServer;
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    for c in ["my", "pg"] {
        server.create_consumer("ORDERS", c, "orders.>", std::time::Duration::from_secs(30));
    }
    let header = "\u{1}\u{1f}\u{7f}\u{2028}\u{202e}\"\\é😀abcdefgh";
    let payloads = hostile_payloads();
    for p in &payloads {
        server.raw_publish(b"orders.x", &[(b"X-H", header.as_bytes())], p);
    }
    let n = payloads.len() as u64;
    let my = MyDb::new("atk52brun");
    run_until_acked(
        &server,
        "my",
        json!({"type": "relational_db", "engine": "mysql", "tls_mode": "disable",
               "dsn": format!("mysql://root@127.0.0.1:3306/{}", my.name),
               "table": "events", "auto_create_tables": true}),
        n,
    );
    let pg = TestDb::new("atk52brun");
    run_until_acked(
        &server,
        "pg",
        pg.sink(json!({"auto_create_tables": true})),
        n,
    );
    let my_rows = my.rows(
        "SELECT stream_sequence, payload_original_format, SHA2(payload, 256), \
         JSON_VALID(metadata_json), JSON_UNQUOTE(JSON_EXTRACT(metadata_json, '$.headers.\"X-H\"')) \
         FROM events ORDER BY stream_sequence",
    );
    let pg_rows = pg.rows(
        "SELECT stream_sequence, payload_original_format, payload::text, metadata_json->'headers'->>'X-H' \
         FROM events ORDER BY stream_sequence",
    );
    assert_eq!(
        (my_rows.len(), pg_rows.len()),
        (payloads.len(), payloads.len())
    );
    for (i, p) in payloads.iter().enumerate() {
        let (want, info) = svc::message::envelope::normalize_payload(p);
        let m: Vec<&str> = my_rows[i]
            .iter()
            .map(|c| c.as_deref().unwrap_or("NULL"))
            .collect();
        let g: Vec<&str> = pg_rows[i]
            .iter()
            .map(|c| c.as_deref().unwrap_or("NULL"))
            .collect();
        let seq = (i + 1).to_string();
        let format = info.original_format.name();
        assert_eq!(
            m,
            [&*seq, format, &*sha(want.json()), "1", header],
            "MariaDB row {i}"
        );
        assert_eq!(
            (g[0], g[1], g[3]),
            (&*seq, format, header),
            "PostgreSQL row {i}"
        );
        // jsonb re-lays out numbers (`-0` comes back `0`): compared in canonical form, the
        // form custody compares (zero is `0` whatever its sign).
        assert_eq!(
            canonical(g[2]),
            canonical(want.json()),
            "PostgreSQL row {i}"
        );
    }
}

fn canonical(text: &str) -> String {
    let mut out = Vec::new();
    svc::document::canonical::write(&mut out, &svc::document::canonical::parse(text).unwrap());
    String::from_utf8(out).unwrap()
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
        "envelope": {"keep_headers": ["X-H"]},
        "delivery": {"batch_size": 64, "fetch_expiry_ms": 200, "shutdown_timeout_seconds": 10},
        "sink": sink,
        "logging": {"level": "info"}
    });
    let cfg = crate::support::write_config(dir.path(), "c.json", &cfg);
    let mut runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    let start = std::time::Instant::now();
    while server.try_consumer_state("ORDERS", consumer) != Some((n, 0, 0)) {
        if start.elapsed() > std::time::Duration::from_secs(30) {
            runner.signal("TERM");
            let _ = runner.wait_timeout(std::time::Duration::from_secs(20));
            panic!(
                "not every message acked: {:?}\n{}",
                server.try_consumer_state("ORDERS", consumer),
                runner.log_text()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    runner.signal("TERM");
    let status = runner
        .wait_timeout(std::time::Duration::from_secs(20))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{}", runner.log_text());
}

/// FIXED (the normalizer keeps JSON to 31 levels, MariaDB's bound, and wraps deeper payloads
/// as text for every sink). Found: atk52b finding (class 12, two views disagree;
/// pre-existing, not from h52perf): the
/// normalizer keeps a JSON payload nested up to 127 deep as JSON (`MAX_JSON_DEPTH`, serde's
/// bound), but MariaDB 10.11's `JSON_VALID` refuses nesting of 32 or more
/// (`SELECT JSON_VALID(CONCAT(REPEAT('[',32),'1',REPEAT(']',32)))` is 0, 31 is 1), so the
/// `CHECK (JSON_VALID(payload))` rejects the row (error 4025): a 65-byte payload a publisher
/// chooses is never stored in MariaDB (value_rejected, permanent; without a dead letter
/// redelivered without end, as `svc run` showed in
/// `held_svc_run_stores_hostile_payloads_and_metadata_in_both_databases` before its payload
/// was cut to 31). Expected: the row stored (e.g. such a payload wrapped as text, as past 127).
#[test]
fn fixed_mariadb_refuses_a_json_payload_nested_32_deep() {
    let db = MyDb::new("atk52bdeep");
    let cfg = json!({
        "type": "relational_db", "engine": "mysql",
        "dsn": format!("mysql://root@127.0.0.1:3306/{}", db.name),
        "tls_mode": "disable", "table": "events", "auto_create_tables": true,
    });
    let s = MySqlSink::new(parse_cfg(&cfg), Arc::new(Metrics::default())).unwrap();
    let batch: Vec<Envelope> = [31usize, 32, 64, 127]
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            let p = format!("{}1{}", "[".repeat(d), "]".repeat(d));
            envelope("a", i as u64 + 1, p.as_bytes())
        })
        .collect();
    let formats: Vec<&str> = batch
        .iter()
        .map(|e| e.payload_info.original_format.name())
        .collect();
    assert_eq!(
        formats,
        ["json", "text", "text", "text"],
        "kept as JSON to 31 levels, wrapped as text past them"
    );
    let out = s.write_batch(&batch);
    let refused: Vec<usize> = [31usize, 32, 64, 127]
        .iter()
        .zip(&out)
        .filter(|(_, o)| !o.is_durable())
        .map(|(d, _)| *d)
        .collect();
    assert!(
        refused.is_empty(),
        "expected every payload the normalizer keeps as JSON to be stored by MariaDB; \
         refused at nesting depths {refused:?}: {:?}",
        out.iter()
            .map(|o| format!("{o:?}").chars().take(200).collect::<String>())
            .collect::<Vec<_>>()
    );
}
