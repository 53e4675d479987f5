//! atk52b: attacks on h52perf (b6db0a7, merged in 2fa198f): the envelope metadata JSON written
//! by hand (`EventMetadata::write_json`) and the MySQL `labels_list` array, stored in the real
//! PostgreSQL (`jsonb`) and MariaDB (`LONGTEXT CHECK (JSON_VALID)`), with header names and
//! values a publisher chooses (every character up to U+0800, U+2028, bidi controls, characters
//! straddling 8-byte words), the largest delivery count and security labels with big numbers.
//! The scan/parse and escaper attacks are unit tests in `src/document/canonical.rs` and
//! `src/message/envelope.rs` (`held_atk52b_...`).
//!
//! `held_...`: an attack that held (these pass). `found_...`: none.

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
