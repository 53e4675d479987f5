//! The relational sink's checkpoint stores, one per engine ([`PgStore`], [`MyStore`]), and
//! the keyset-paged reads they share.

use std::collections::BTreeMap;

use std::sync::Arc;

use super::{
    checkpoints_bound, records_bound, records_of, CheckpointStore, MAX_AUDIT_CHECKPOINTS,
    MAX_AUDIT_RECORDS,
};
use crate::message::protection::checkpoint::MAX_CHECKPOINT_BYTES;
use crate::message::protection::checkpoint_audit::StoredRecord;
use crate::message::protection::custody::Custodian;
use crate::text::peer::PeerText;

/// Name of the PostgreSQL sink's checkpoint table, in the schema of its events table.
pub const PG_CHECKPOINT_TABLE: &str = "svc_custody_checkpoints";

/// The PostgreSQL sink's checkpoints: one row per checkpoint in [`PG_CHECKPOINT_TABLE`]
/// (created by `svc init-db`), committed with `synchronous_commit` on.
pub struct PgStore {
    sink: crate::sink::relational::RelationalSink,
    cfg: crate::sink::relational::config::RelationalConfig,
}

impl PgStore {
    pub fn new(cfg: &crate::sink::relational::config::RelationalConfig) -> Result<PgStore, String> {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let sink = crate::sink::relational::RelationalSink::new(cfg.clone(), metrics)
            .map_err(|e| crate::text::error_chain(&e))?;
        Ok(PgStore {
            sink,
            cfg: cfg.clone(),
        })
    }

    fn table(&self) -> String {
        match &self.cfg.table.schema {
            Some(s) => format!("\"{s}\".\"{PG_CHECKPOINT_TABLE}\""),
            None => format!("\"{PG_CHECKPOINT_TABLE}\""),
        }
    }

    /// The DDL of the checkpoint table (idempotent).
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    runner_id text NOT NULL,\n    \
             checkpoint_index bigint NOT NULL,\n    checkpoint text NOT NULL,\n    \
             stored_at timestamptz NOT NULL DEFAULT now(),\n    \
             PRIMARY KEY (runner_id, checkpoint_index)\n);\n",
            self.table()
        )
    }

    /// Creates the checkpoint table (`svc init-db`).
    pub fn create_table(&self) -> Result<(), String> {
        let ddl = self.ddl();
        self.sink
            .with_session("create the checkpoint table in", |c| {
                c.simple(&ddl).map(|_| ())
            })
            .map_err(|e| crate::text::error_chain(&e))
    }
}

impl CheckpointStore for PgStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        let sql = format!(
            "INSERT INTO {} (runner_id, checkpoint_index, checkpoint) VALUES ($1, $2, $3)",
            self.table()
        );
        let text = std::str::from_utf8(bytes).map_err(|_| "checkpoint is not UTF-8")?;
        let idx = index.to_string();
        self.sink
            .with_session("write a checkpoint to", |c| {
                c.query(&sql, &[Some(runner_id), Some(&idx), Some(text)])
                    .map(|_| ())
            })
            .map_err(|e| crate::text::error_chain(&e))
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints(None)
    }

    fn chain(&self, runner_id: &str) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints(Some(runner_id))
    }

    fn get(&self, runner_id: &str, index: u64) -> Result<Option<String>, String> {
        let sql = format!(
            "SELECT left(checkpoint, {MAX_CHECKPOINT_BYTES} + 1) FROM {} WHERE runner_id = $1 \
             AND checkpoint_index = $2::bigint",
            self.table()
        );
        let idx = index.to_string();
        let res = self
            .sink
            .with_session("read a checkpoint of", |c| {
                c.query(&sql, &[Some(runner_id), Some(&idx)])
            })
            .map_err(|e| crate::text::error_chain(&e))?;
        Ok(res
            .rows
            .into_iter()
            .next()
            .map(|r| r.into_iter().next().flatten().unwrap_or_default()))
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.scan(None)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        let mut out = Vec::new();
        for t in self.cfg.tables() {
            let table = t.sql();
            let list = format!(
                "SELECT e.idempotency_key, octet_length(row_to_json(e)::text)::text FROM \
                 {table} e WHERE $1::text IS NULL OR e.idempotency_key > $1 ORDER BY \
                 e.idempotency_key LIMIT {SQL_LIST_ROWS}"
            );
            let fetch = format!(
                "SELECT e.idempotency_key, row_to_json(e)::text FROM {table} e WHERE \
                 e.idempotency_key IN (SELECT k.v->>0 FROM jsonb_array_elements($1::jsonb) k(v))"
            );
            let mut each = record_rows(&t, seal, &mut out);
            self.paged(
                "read the records of",
                (MAX_AUDIT_RECORDS, PG_MAX_ROW_BYTES),
                (&list, &|after| vec![after.first().cloned()]),
                &fetch,
                &mut each,
            )?;
        }
        Ok(out)
    }
}

/// Largest row text a PostgreSQL read-back fetches (a statement's result is bounded by the
/// client, `wire::MAX_RESULT_BYTES`); a longer one is named unreadable.
const PG_MAX_ROW_BYTES: u64 = (crate::db::postgres::MAX_RESULT_BYTES - (64 << 10)) as u64;

impl PgStore {
    /// The checkpoints of every runner, or of `runner` only, paged by key ([`paged_rows`]).
    /// The list orders by the table's own columns (`t.`): unqualified, `ORDER BY
    /// checkpoint_index` named the output column, the `::text` cast, and past 10,000 checkpoints
    /// the pages (compared as numbers) read some twice and skipped others (atk58).
    fn read_checkpoints(&self, runner: Option<&str>) -> Result<Vec<(String, String)>, String> {
        let t = self.table();
        let list = format!(
            "SELECT t.runner_id, t.checkpoint_index::text, octet_length(t.checkpoint)::text \
             FROM {t} t WHERE ($3::text IS NULL OR t.runner_id = $3) AND ($1::text IS NULL OR \
             (t.runner_id, t.checkpoint_index) > ($1, $2::bigint)) ORDER BY t.runner_id, \
             t.checkpoint_index LIMIT {SQL_LIST_ROWS}"
        );
        let fetch = format!(
            "SELECT t.runner_id, t.checkpoint_index::text, t.checkpoint FROM {t} t JOIN \
             jsonb_array_elements($1::jsonb) k(v) ON t.runner_id = k.v->>0 AND \
             t.checkpoint_index = (k.v->>1)::bigint"
        );
        let mut out = Vec::new();
        let mut each = checkpoint_rows(&mut out);
        let params = |after: &[String]| {
            vec![
                after.first().cloned(),
                after.get(1).cloned(),
                runner.map(str::to_string),
            ]
        };
        self.paged(
            "read the checkpoints of",
            (
                MAX_AUDIT_CHECKPOINTS,
                MAX_CHECKPOINT_BYTES.min(PG_MAX_ROW_BYTES),
            ),
            (&list, &params),
            &fetch,
            &mut each,
        )?;
        drop(each);
        Ok(out)
    }

    /// [`paged_rows`] on one session: `list` is run with the parameters `params` gives for
    /// the last key listed (empty: from the start), `fetch` with the keys as a JSON array.
    #[allow(clippy::type_complexity)]
    fn paged(
        &self,
        what: &str,
        bounds: (usize, u64),
        (list, params): (&str, &dyn Fn(&[String]) -> Vec<Option<String>>),
        fetch: &str,
        each: &mut dyn FnMut(&[String], Result<String, String>) -> Result<(), String>,
    ) -> Result<(), String> {
        self.sink
            .with_session(what, |c| {
                paged_rows(
                    c,
                    bounds,
                    &|c, after| {
                        let p = params(after.unwrap_or_default());
                        let p: Vec<Option<&str>> = p.iter().map(Option::as_deref).collect();
                        c.query(list, &p).map(|r| r.rows)
                    },
                    &|c, keys| {
                        let keys = serde_json::to_string(keys).unwrap_or_default();
                        c.query(fetch, &[Some(&keys)]).map(|r| r.rows)
                    },
                    each,
                )
            })
            .map_err(|e| crate::text::error_chain(&e))
    }
}

/// The `each` of a paged read of a records table `table` (key: the idempotency key): each
/// row's records into `out`, an unreadable row named with its error, bounded.
fn record_rows<'a>(
    table: &'a impl std::fmt::Display,
    seal: Option<&'a Custodian>,
    out: &'a mut Vec<StoredRecord>,
) -> impl FnMut(&[String], Result<String, String>) -> Result<(), String> + 'a {
    move |k, text| {
        let place = format!("{table} row {}", PeerText::new(&k[0]));
        match text {
            Ok(text) => records_of(&place, &text, seal, out),
            Err(e) => out.push(StoredRecord {
                place,
                read: Err(e),
            }),
        }
        records_bound(out.len())
    }
}

/// The `each` of a paged read of the checkpoint table (key: runner id, index): (place, text)
/// into `out`, bounded in bytes. An unreadable one is still a checkpoint the audit must
/// count: refused (empty text), not gone.
fn checkpoint_rows(
    out: &mut Vec<(String, String)>,
) -> impl FnMut(&[String], Result<String, String>) -> Result<(), String> + '_ {
    let mut total = 0usize;
    move |k, text| {
        let place = format!(
            "{PG_CHECKPOINT_TABLE} row ({}, {})",
            PeerText::new(&k[0]),
            PeerText::new(&k[1])
        );
        let text = text.unwrap_or_default();
        checkpoints_bound(&mut total, &text)?;
        out.push((place, text));
        Ok(())
    }
}

/// Keys listed per statement by a relational read-back (MySQL and PostgreSQL).
const SQL_LIST_ROWS: usize = 10_000;
/// Texts fetched per statement by a relational read-back (bytes, and rows): well under the
/// clients' bounds (100,000 rows, 16 MiB for one statement).
const SQL_FETCH_BYTES: u64 = 8 << 20;
const SQL_FETCH_ROWS: usize = 1_000;

/// Rows of one statement's result.
type Rows = Vec<Vec<Option<String>>>;
type DbError = crate::db::error::DbError;

/// Every row of a table in key order, paged on session `c`: `list` gives (key columns...,
/// length) after the given last key (`None`: from the start), at most [`SQL_LIST_ROWS`] rows;
/// `fetch` gives (key columns..., text) of the given keys. Calls `each(key, text)` in key
/// order; a text longer than `max` is given as `Err`. At most `most` rows.
#[allow(clippy::type_complexity)]
fn paged_rows<C>(
    c: &mut C,
    (most, max): (usize, u64),
    list: &dyn Fn(&mut C, Option<&[String]>) -> Result<Rows, DbError>,
    fetch: &dyn Fn(&mut C, &[Vec<String>]) -> Result<Rows, DbError>,
    each: &mut dyn FnMut(&[String], Result<String, String>) -> Result<(), String>,
) -> Result<(), DbError> {
    let mut after: Option<Vec<String>> = None;
    let mut seen = 0usize;
    loop {
        let listed = list(c, after.as_deref())?;
        let done = listed.len() < SQL_LIST_ROWS;
        let rows: Vec<(Vec<String>, u64)> = listed
            .into_iter()
            .map(|r| {
                let mut r: Vec<String> = r.into_iter().map(Option::unwrap_or_default).collect();
                let len = r.pop().and_then(|l| l.parse().ok()).unwrap_or(u64::MAX);
                (r, len)
            })
            .collect();
        seen += rows.len();
        if seen > most {
            return Err(DbError::Protocol(format!(
                "more than {most} rows: past the read-back bound"
            )));
        }
        after = rows.last().map(|r| r.0.clone());
        fetch_groups(c, &rows, max, fetch, each)?;
        if done {
            return Ok(());
        }
    }
}

/// Fetches the texts of listed rows in groups of at most [`SQL_FETCH_BYTES`] and
/// [`SQL_FETCH_ROWS`]; a row longer than `max` is not fetched (`Err`).
#[allow(clippy::type_complexity)]
fn fetch_groups<C>(
    c: &mut C,
    rows: &[(Vec<String>, u64)],
    max: u64,
    fetch: &dyn Fn(&mut C, &[Vec<String>]) -> Result<Rows, DbError>,
    each: &mut dyn FnMut(&[String], Result<String, String>) -> Result<(), String>,
) -> Result<(), DbError> {
    let mut i = 0;
    while i < rows.len() {
        let (mut j, mut bytes) = (i, 0u64);
        while j < rows.len() && j - i < SQL_FETCH_ROWS && rows[j].1 <= max {
            if j > i && bytes + rows[j].1 > SQL_FETCH_BYTES {
                break;
            }
            bytes += rows[j].1;
            j += 1;
        }
        if j == i {
            // Longer than `max`: named, never read.
            each(&rows[i].0, Err(format!("larger than {max} bytes"))).map_err(DbError::Protocol)?;
            i += 1;
            continue;
        }
        let keys: Vec<Vec<String>> = rows[i..j].iter().map(|r| r.0.clone()).collect();
        let mut texts: BTreeMap<Vec<String>, String> = BTreeMap::new();
        for r in fetch(c, &keys)? {
            let mut r: Vec<String> = r.into_iter().map(Option::unwrap_or_default).collect();
            let text = r.pop().unwrap_or_default();
            texts.insert(r, text);
        }
        for k in &keys {
            // A row deleted between the listing and the fetch is gone: not reported.
            if let Some(t) = texts.remove(k) {
                each(k, Ok(t)).map_err(DbError::Protocol)?;
            }
        }
        i = j;
    }
    Ok(())
}

/// The MySQL/MariaDB sink's checkpoints: one row per checkpoint in [`PG_CHECKPOINT_TABLE`]
/// (the same name and columns as PostgreSQL's, created by `svc init-db`) in the events table's
/// database, each INSERT committed (autocommit) before it returns. Reads are paged by key so
/// no statement passes the client's bounds (100,000 rows, 16 MiB): keys and lengths first,
/// then the texts in groups of at most [`SQL_FETCH_BYTES`] ([`paged_rows`]).
pub struct MyStore {
    sink: crate::sink::relational::my_sink::MySqlSink,
    cfg: crate::sink::relational::config::RelationalConfig,
}

/// Largest row text a MySQL read-back fetches (a statement's result is bounded by the
/// client, `mysql::conn::MAX_RESULT_BYTES`); a longer one is named unreadable.
const MY_MAX_ROW_BYTES: u64 = (crate::db::mysql::conn::MAX_RESULT_BYTES - (64 << 10)) as u64;

impl MyStore {
    pub fn new(cfg: &crate::sink::relational::config::RelationalConfig) -> Result<MyStore, String> {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let sink = crate::sink::relational::my_sink::MySqlSink::new(cfg.clone(), metrics)
            .map_err(|e| crate::text::error_chain(&e))?;
        Ok(MyStore {
            sink,
            cfg: cfg.clone(),
        })
    }

    fn table(&self) -> String {
        match &self.cfg.table.schema {
            Some(s) => format!("`{s}`.`{PG_CHECKPOINT_TABLE}`"),
            None => format!("`{PG_CHECKPOINT_TABLE}`"),
        }
    }

    /// The DDL of the checkpoint table (idempotent).
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    runner_id VARCHAR(255) NOT NULL,\n    \
             checkpoint_index BIGINT UNSIGNED NOT NULL,\n    checkpoint LONGTEXT NOT NULL,\n    \
             stored_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),\n    \
             PRIMARY KEY (runner_id, checkpoint_index)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 \
             COLLATE=utf8mb4_bin;\n",
            self.table()
        )
    }

    /// Creates the checkpoint table (`svc init-db`).
    pub fn create_table(&self) -> Result<(), String> {
        let ddl = self.ddl();
        self.sink
            .with_session("create the checkpoint table in", |c| {
                c.query(ddl.trim_end().trim_end_matches(';')).map(|_| ())
            })
            .map_err(|e| crate::text::error_chain(&e))
    }

    /// [`paged_rows`] on one session: `list` and `fetch` give the statements.
    #[allow(clippy::type_complexity)]
    fn paged(
        &self,
        what: &str,
        most: usize,
        max: u64,
        list: &dyn Fn(&crate::db::mysql::Connection, Option<&[String]>) -> String,
        fetch: &dyn Fn(&crate::db::mysql::Connection, &[Vec<String>]) -> String,
        each: &mut dyn FnMut(&[String], Result<String, String>) -> Result<(), String>,
    ) -> Result<(), String> {
        self.sink
            .with_session(what, |c| {
                paged_rows(
                    c,
                    (most, max),
                    &|c, after| {
                        let sql = list(c, after);
                        c.query(&sql).map(|r| r.rows)
                    },
                    &|c, keys| {
                        let sql = fetch(c, keys);
                        c.query(&sql).map(|r| r.rows)
                    },
                    each,
                )
            })
            .map_err(|e| crate::text::error_chain(&e))
    }
}

impl CheckpointStore for MyStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "checkpoint is not UTF-8")?;
        let table = self.table();
        self.sink
            .with_session("write a checkpoint to", |c| {
                let sql = format!(
                    "INSERT INTO {table} (runner_id, checkpoint_index, checkpoint) VALUES \
                     ({}, {index}, {})",
                    c.quote(runner_id),
                    c.quote(text)
                );
                c.query(&sql).map(|_| ())
            })
            .map_err(|e| crate::text::error_chain(&e))
    }

    fn get(&self, runner_id: &str, index: u64) -> Result<Option<String>, String> {
        let table = self.table();
        let max = MAX_CHECKPOINT_BYTES.min(MY_MAX_ROW_BYTES);
        let res = self
            .sink
            .with_session("read a checkpoint of", |c| {
                // One longer than the bound reads as empty (it matches no checkpoint).
                let sql = format!(
                    "SELECT IF(LENGTH(checkpoint) <= {max}, checkpoint, '') FROM {table} \
                     WHERE runner_id = {} AND checkpoint_index = {index}",
                    c.quote(runner_id)
                );
                c.query(&sql)
            })
            .map_err(|e| crate::text::error_chain(&e))?;
        Ok(res
            .rows
            .into_iter()
            .next()
            .map(|r| r.into_iter().next().flatten().unwrap_or_default()))
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints(None)
    }

    fn chain(&self, runner_id: &str) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints(Some(runner_id))
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.scan(None)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        use crate::sink::relational::my_sink::custody_export_sql;
        let mut out = Vec::new();
        for t in self.cfg.tables() {
            // `SELECT JSON_OBJECT(...) FROM <table> ORDER BY ...`: the row as the export shows it.
            let export = custody_export_sql(t);
            let (object, rest) = export
                .split_once(" FROM ")
                .ok_or("the export statement has no FROM")?;
            let table = rest.split(" ORDER BY ").next().unwrap_or(rest).to_string();
            let object = object.trim_start_matches("SELECT ").to_string();
            let list = |c: &crate::db::mysql::Connection, after: Option<&[String]>| {
                let from = match after {
                    Some([k]) => format!("WHERE idempotency_key > {}", c.quote(k)),
                    _ => String::new(),
                };
                format!(
                    "SELECT idempotency_key, LENGTH({object}) FROM {table} {from} ORDER BY \
                     idempotency_key LIMIT {SQL_LIST_ROWS}"
                )
            };
            let fetch = |c: &crate::db::mysql::Connection, keys: &[Vec<String>]| {
                let keys: Vec<String> = keys.iter().map(|k| c.quote(&k[0])).collect();
                format!(
                    "SELECT idempotency_key, {object} FROM {table} WHERE idempotency_key IN ({})",
                    keys.join(", ")
                )
            };
            let mut each = record_rows(&t, seal, &mut out);
            self.paged(
                "read the records of",
                MAX_AUDIT_RECORDS,
                MY_MAX_ROW_BYTES,
                &list,
                &fetch,
                &mut each,
            )?;
        }
        Ok(out)
    }
}

impl MyStore {
    /// The checkpoints of every runner, or of `runner` only, paged by key ([`paged_rows`]).
    /// The list orders by the table's own columns (`t.`): unqualified, `ORDER BY
    /// checkpoint_index` named the output column, the `::text` cast, and past 10,000 checkpoints
    /// the pages (compared as numbers) read some twice and skipped others (atk58).
    fn read_checkpoints(&self, runner: Option<&str>) -> Result<Vec<(String, String)>, String> {
        let t = self.table();
        let list = |c: &crate::db::mysql::Connection, after: Option<&[String]>| {
            let mut cond = Vec::new();
            if let Some(r) = runner {
                cond.push(format!("runner_id = {}", c.quote(r)));
            }
            if let Some([r, i]) = after {
                cond.push(format!(
                    "(runner_id, checkpoint_index) > ({}, {i})",
                    c.quote(r)
                ));
            }
            let from = match cond.is_empty() {
                true => String::new(),
                false => format!("WHERE {}", cond.join(" AND ")),
            };
            format!(
                "SELECT runner_id, CAST(checkpoint_index AS CHAR), LENGTH(checkpoint) FROM {t} \
                 {from} ORDER BY runner_id, checkpoint_index LIMIT {SQL_LIST_ROWS}"
            )
        };
        let fetch = |c: &crate::db::mysql::Connection, keys: &[Vec<String>]| {
            let keys: Vec<String> = keys
                .iter()
                .map(|k| format!("({}, {})", c.quote(&k[0]), k[1].parse::<u64>().unwrap_or(0)))
                .collect();
            format!(
                "SELECT runner_id, CAST(checkpoint_index AS CHAR), checkpoint FROM {t} WHERE \
                 (runner_id, checkpoint_index) IN ({})",
                keys.join(", ")
            )
        };
        let mut out = Vec::new();
        let mut each = checkpoint_rows(&mut out);
        self.paged(
            "read the checkpoints of",
            MAX_AUDIT_CHECKPOINTS,
            MAX_CHECKPOINT_BYTES.min(MY_MAX_ROW_BYTES),
            &list,
            &fetch,
            &mut each,
        )?;
        drop(each);
        Ok(out)
    }
}
