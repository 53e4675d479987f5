//! The PostgreSQL sink's SQL: the columns, the DDL of its tables (`svc init-db`), and the
//! statements a batch runs (insert, upsert, the read of existing keys).

use super::config::{RelationalConfig, TableName};
use crate::db::postgres::{Connection, DbError};

/// Columns: name, DDL type, type in the `jsonb_to_recordset` row definition.
pub(super) const COLUMNS: &[(&str, &str, &str)] = &[
    ("idempotency_key", "text NOT NULL PRIMARY KEY", "text"),
    ("subject", "text NOT NULL", "text"),
    ("stream", "text NOT NULL", "text"),
    // The stream's incarnation (its creation time, `broker/incarnation.rs`), NULL when unknown.
    ("stream_incarnation", "text", "text"),
    ("stream_sequence", "bigint NOT NULL", "bigint"),
    ("consumer", "text NOT NULL", "text"),
    ("consumer_sequence", "bigint NOT NULL", "bigint"),
    ("message_id", "text", "text"),
    ("priority", "text NOT NULL", "text"),
    ("classification", "text NOT NULL", "text"),
    ("labels", "text NOT NULL", "text"),
    ("labels_list", "text[] NOT NULL", "text[]"),
    ("payload", "jsonb NOT NULL", "jsonb"),
    ("payload_original_format", "text NOT NULL", "text"),
    ("payload_wrapped", "boolean NOT NULL", "boolean"),
    ("payload_sha256", "text NOT NULL", "text"),
    ("payload_size_bytes", "bigint NOT NULL", "bigint"),
    ("security_labels_json", "jsonb", "jsonb"),
    // Mission metadata (docs/governance.md), NULL when the record has none.
    ("mission_metadata_json", "jsonb", "jsonb"),
    ("metadata_json", "jsonb NOT NULL", "jsonb"),
    ("received_at", "timestamptz NOT NULL", "timestamptz"),
    // `svc.custody.v1` when `custody.enabled` (docs/payload-protection.md), else NULL.
    ("custody_json", "jsonb", "jsonb"),
];

/// The DDL that creates every table of the config (idempotent: `IF NOT EXISTS`).
pub fn ddl(cfg: &RelationalConfig) -> String {
    let mut out = String::new();
    let mut schemas: Vec<&str> = Vec::new();
    for t in cfg.tables() {
        if let Some(s) = &t.schema {
            if !schemas.contains(&s.as_str()) {
                schemas.push(s);
                out.push_str(&format!("CREATE SCHEMA IF NOT EXISTS \"{s}\";\n"));
            }
        }
    }
    for t in cfg.tables() {
        out.push_str(&table_ddl(t));
    }
    out
}

pub(super) fn table_ddl(t: &TableName) -> String {
    let mut s = format!("CREATE TABLE IF NOT EXISTS {} (\n", t.sql());
    for (name, ty, _) in COLUMNS {
        s.push_str(&format!("    {name} {ty},\n"));
    }
    s.push_str("    stored_at timestamptz NOT NULL DEFAULT now()\n);\n");
    // Tables created before the custody, mission metadata and stream incarnation columns
    // existed get them here (idempotent).
    s.push_str(&format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS custody_json jsonb;\n",
        t.sql()
    ));
    s.push_str(&format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS mission_metadata_json jsonb;\n",
        t.sql()
    ));
    s.push_str(&format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS stream_incarnation text;\n",
        t.sql()
    ));
    s.push_str(&format!(
        "CREATE INDEX IF NOT EXISTS \"{}\" ON {} (stream, stream_sequence);\n",
        t.derived("stream_seq_idx"),
        t.sql()
    ));
    s
}

/// Key of the advisory lock that serializes this sink's DDL across sessions and processes.
pub(super) const DDL_LOCK_KEY: i64 = 0x7376_635f_6464_6c00; // "svc_ddl\0"

/// Runs the DDL in one transaction under an advisory lock: concurrent `CREATE TABLE IF NOT
/// EXISTS` of the same table can otherwise fail with a unique violation in the catalog.
pub(super) fn run_ddl(conn: &mut Connection, cfg: &RelationalConfig) -> Result<(), DbError> {
    let sql = format!(
        "BEGIN; SELECT pg_advisory_xact_lock({DDL_LOCK_KEY}); {}COMMIT;",
        ddl(cfg)
    );
    let res = conn.simple(&sql);
    if res.is_err() && !conn.is_broken() && conn.tx_status() != b'I' {
        let _ = conn.simple("ROLLBACK");
    }
    res.map(|_| ())
}

pub(super) fn insert_sql(t: &TableName) -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    let selects: Vec<String> = COLUMNS
        .iter()
        .map(|(n, _, _)| match *n {
            // jsonb_to_recordset turns a JSON null into SQL NULL; a payload that *is* JSON
            // null must stay JSON null.
            "payload" => "COALESCE(r.payload, 'null'::jsonb)".to_string(),
            n => format!("r.{n}"),
        })
        .collect();
    let defs: Vec<String> = COLUMNS
        .iter()
        .map(|(n, _, rt)| format!("{n} {rt}"))
        .collect();
    format!(
        "INSERT INTO {} ({}) SELECT {} FROM jsonb_to_recordset($1::jsonb) AS r({}) \
         ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key",
        t.sql(),
        names.join(", "),
        selects.join(", "),
        defs.join(", ")
    )
}

/// `write_mode: upsert`: the insert, where a stored key takes every column of a row whose
/// stream sequence is not lower than the stored one's (never of an older one). The batch holds
/// one row per key ([`super::upsert::newest_per_key`]): ON CONFLICT cannot touch a row twice.
pub(super) fn upsert_sql(t: &TableName) -> String {
    let insert = insert_sql(t).replacen(
        &format!("INSERT INTO {} (", t.sql()),
        &format!("INSERT INTO {} AS t (", t.sql()),
        1,
    );
    let head = insert
        .strip_suffix(" ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key")
        .expect("insert_sql ends with its conflict clause");
    let sets: Vec<String> = COLUMNS
        .iter()
        .map(|c| c.0)
        .filter(|n| *n != "idempotency_key")
        .map(|n| format!("{n} = EXCLUDED.{n}"))
        .collect();
    format!(
        "{head} ON CONFLICT (idempotency_key) DO UPDATE SET {}, stored_at = now() \
         WHERE t.stream_sequence <= EXCLUDED.stream_sequence RETURNING idempotency_key",
        sets.join(", ")
    )
}

pub(super) fn existing_sql(t: &TableName) -> String {
    format!(
        "SELECT idempotency_key, subject, payload_sha256 FROM {} \
         WHERE idempotency_key IN (SELECT jsonb_array_elements_text($1::jsonb))",
        t.sql()
    )
}
