//! The relational sink's MySQL/MariaDB engine (`sink.engine: "mysql"`): the same rows, table
//! layout and column names as the PostgreSQL engine, through the in-tree client in `mysql/`.
//!
//! Custody: a batch is one transaction (`START TRANSACTION ... COMMIT`); outcomes are
//! `Durable` only after the server confirmed `COMMIT`. Per table, the batch's keys are looked
//! up first: a key already stored with the same subject and payload digest is
//! `AlreadyDurable` (a redelivery never makes a second row), a key holding another event is a
//! `Permanent` collision, and the new rows go in as ONE multi-row `INSERT` (split only past
//! [`MAX_STATEMENT_BYTES`]). A concurrent writer of the same key makes the INSERT fail with a
//! duplicate key: the batch is `Transient` and the retry finds the row stored.
//!
//! JSON columns are `LONGTEXT ... CHECK (JSON_VALID(...))`, not the `JSON` type (MySQL's
//! reorders keys and rewrites numbers): the payload text is kept byte-exact. Values are string
//! literals escaped for utf8mb4 and the session's backslash mode (`mysql::quote`); the session
//! is set to `utf8mb4`, strict mode, UTC and READ COMMITTED at connect.
//!
//! A row the server rejects on its data (SQLSTATE class 22 or 23 other than a duplicate key,
//! e.g. JSON the server's JSON_VALID refuses or a key longer than the column): the group is
//! retried row by row in the same transaction (a failed statement rolls back only itself), so
//! only the offending rows become `Permanent`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::{RelationalConfig, TableName, WriteMode};
use super::row::decimal;
use super::row_key;
use super::upsert::field_key;
use crate::db::error::DbError;
use crate::db::mysql::{self, Connection};
use crate::db::params::{self, ConnectParams, TlsMode};
use crate::db::transport::tls_client_config;
use crate::message::envelope::Envelope;
use crate::metrics::Metrics;
use crate::sink::{FailureClass, Sink, SinkError, WriteOutcome};

const KIND: &str = "relational_db";
/// Largest INSERT statement sent (MySQL's and MariaDB's default `max_allowed_packet` is 16 or
/// 64 MiB); a batch over it is split into several statements of the same transaction.
pub const MAX_STATEMENT_BYTES: usize = 8 << 20;
const MAX_IDLE_CONNECTIONS: usize = 16;
/// MySQL's duplicate-key error (SQLSTATE 23000).
const ER_DUP_ENTRY: &str = "ERROR 1062";

/// Column name and MySQL DDL type, in the PostgreSQL engine's order and with its names.
pub const COLUMNS: &[(&str, &str)] = &[
    ("idempotency_key", "VARCHAR(768) NOT NULL"),
    ("subject", "TEXT NOT NULL"),
    ("stream", "VARCHAR(255) NOT NULL"),
    ("stream_incarnation", "TEXT NULL"),
    ("stream_sequence", "BIGINT UNSIGNED NOT NULL"),
    ("consumer", "TEXT NOT NULL"),
    ("consumer_sequence", "BIGINT UNSIGNED NOT NULL"),
    ("message_id", "TEXT NULL"),
    ("priority", "TEXT NOT NULL"),
    ("classification", "TEXT NOT NULL"),
    ("labels", "TEXT NOT NULL"),
    (
        "labels_list",
        "LONGTEXT NOT NULL CHECK (JSON_VALID(labels_list))",
    ),
    ("payload", "LONGTEXT NOT NULL CHECK (JSON_VALID(payload))"),
    ("payload_original_format", "VARCHAR(16) NOT NULL"),
    ("payload_wrapped", "BOOLEAN NOT NULL"),
    ("payload_sha256", "CHAR(64) NOT NULL"),
    ("payload_size_bytes", "BIGINT UNSIGNED NOT NULL"),
    (
        "security_labels_json",
        "LONGTEXT NULL CHECK (JSON_VALID(security_labels_json))",
    ),
    (
        "mission_metadata_json",
        "LONGTEXT NULL CHECK (JSON_VALID(mission_metadata_json))",
    ),
    (
        "metadata_json",
        "LONGTEXT NOT NULL CHECK (JSON_VALID(metadata_json))",
    ),
    ("received_at", "DATETIME(6) NOT NULL"),
    (
        "custody_json",
        "LONGTEXT NULL CHECK (JSON_VALID(custody_json))",
    ),
];

/// `` `schema`.`table` `` (identifiers are `[a-z_][a-z0-9_]*`: nothing to escape).
pub fn table_sql(t: &TableName) -> String {
    match &t.schema {
        Some(s) => format!("`{s}`.`{}`", t.name),
        None => format!("`{}`", t.name),
    }
}

/// The DDL that creates every table of the config (idempotent: `IF NOT EXISTS`); a schema is a
/// MySQL database.
pub fn ddl(cfg: &RelationalConfig) -> String {
    let mut out = String::new();
    let mut schemas: Vec<&str> = Vec::new();
    for t in cfg.tables() {
        if let Some(s) = &t.schema {
            if !schemas.contains(&s.as_str()) {
                schemas.push(s);
                out.push_str(&format!(
                    "CREATE DATABASE IF NOT EXISTS `{s}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;\n"
                ));
            }
        }
    }
    for t in cfg.tables() {
        let mut s = format!("CREATE TABLE IF NOT EXISTS {} (\n", table_sql(t));
        for (name, ty) in COLUMNS {
            s.push_str(&format!("    {name} {ty},\n"));
        }
        s.push_str("    stored_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),\n");
        s.push_str("    PRIMARY KEY (idempotency_key),\n");
        s.push_str(&format!(
            "    KEY `{}` (stream, stream_sequence)\n",
            t.derived("stream_seq_idx")
        ));
        s.push_str(") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;\n");
        out.push_str(&s);
    }
    out
}

/// The statement that exports a table's rows as JSON lines for `svc verify-custody` (as
/// `row_to_json` does for PostgreSQL): one `JSON_OBJECT` per row with every column under its
/// name, the JSON columns as JSON (`JSON_EXTRACT(c, '$')`, which MariaDB returns as the
/// stored text) and `payload_wrapped` as a JSON boolean. Run it with
/// `mariadb --batch --raw --skip-column-names` (docs/sinks/relational.md).
pub fn custody_export_sql(t: &TableName) -> String {
    let members: Vec<String> = COLUMNS
        .iter()
        .map(|(name, ty)| {
            if ty.contains("JSON_VALID") {
                format!("'{name}', JSON_EXTRACT({name}, '$')")
            } else if *name == "payload_wrapped" {
                format!("'{name}', {name} IS TRUE")
            } else {
                format!("'{name}', {name}")
            }
        })
        .chain(std::iter::once("'stored_at', stored_at".to_string()))
        .collect();
    format!(
        "SELECT JSON_OBJECT({}) FROM {} ORDER BY stream, stream_sequence",
        members.join(", "),
        table_sql(t)
    )
}

/// `received_at` (RFC 3339) as a UTC `DATETIME(6)` literal body.
fn datetime(rfc3339: &str) -> Result<String, String> {
    if let Some(fast) = utc_datetime(rfc3339) {
        return Ok(fast);
    }
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("received_at is not RFC 3339: {e}"))?
        .to_offset(time::UtcOffset::UTC);
    Ok(format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    ))
}

/// [`datetime`] without the parser for the text the runner stamps (`text::rfc3339`:
/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, already UTC): the fields are copied, the fraction cut or
/// padded to six digits (as `microsecond()` truncates). `None` for anything else, or a day,
/// hour, minute or second out of range (a leap second included): the parser decides those.
fn utc_datetime(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).filter(|d| d.iter().all(u8::is_ascii_digit));
    let two = |at: usize| digits(at..at + 2).map(|d| (d[0] - b'0') * 10 + (d[1] - b'0'));
    let fraction = match b.get(19..b.len().checked_sub(1)?)? {
        [] => &[][..],
        [b'.', f @ ..] if (1..=9).contains(&f.len()) && f.iter().all(u8::is_ascii_digit) => f,
        _ => return None,
    };
    let shape = b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[b.len() - 1] == b'Z';
    let year = digits(0..4)?
        .iter()
        .fold(0u32, |y, d| y * 10 + u32::from(d - b'0'));
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month = two(5)?;
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let in_range = (1..=12).contains(&month)
        && (1..=days).contains(&two(8)?)
        && two(11)? < 24
        && two(14)? < 60
        && two(17)? < 60;
    if !(shape && in_range) {
        return None;
    }
    let mut out = String::with_capacity(26);
    out.push_str(&text[..10]);
    out.push(' ');
    out.push_str(&text[11..19]);
    out.push('.');
    for i in 0..6 {
        out.push(fraction.get(i).map_or('0', |d| char::from(*d)));
    }
    Some(out)
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string(v).map_err(|e| format!("encode row: {e}"))
}

/// One row's `(...)` tuple of SQL literals, in [`COLUMNS`] order.
fn values(env: &Envelope, key: &str, nbe: bool) -> Result<String, String> {
    let mut out = String::with_capacity(1024 + env.payload.json().len());
    push_values(&mut out, env, key, nbe)?;
    Ok(out)
}

/// [`values`] appended to `out` (left as it was on an error): each literal is quoted straight
/// into it, JSON columns from their serialized text, the payload from its own.
fn push_values(out: &mut String, env: &Envelope, key: &str, nbe: bool) -> Result<(), String> {
    let mark = out.len();
    let done = push_literals(out, env, key, nbe);
    if done.is_err() {
        out.truncate(mark);
    }
    done
}

fn push_literals(out: &mut String, env: &Envelope, key: &str, nbe: bool) -> Result<(), String> {
    let q = |out: &mut String, s: &str| mysql::quote_into(out, s, nbe);
    let opt = |out: &mut String, s: Option<&str>| match s {
        Some(s) => mysql::quote_into(out, s, nbe),
        None => out.push_str("NULL"),
    };
    let received_at = datetime(&env.metadata.received_at)?;
    out.push('(');
    for s in [key, &env.subject, &env.stream] {
        q(out, s);
        out.push(',');
    }
    opt(
        out,
        Some(&*env.stream_incarnation).filter(|i| !i.is_empty()),
    );
    out.push(',');
    out.push_str(decimal(env.stream_sequence, &mut [0; 20]));
    out.push(',');
    q(out, &env.consumer);
    out.push(',');
    out.push_str(decimal(env.consumer_sequence, &mut [0; 20]));
    out.push(',');
    opt(out, env.message_id.as_deref());
    for s in [&env.priority, &env.classification, &env.labels] {
        out.push(',');
        q(out, s);
    }
    out.push(',');
    q(out, &crate::text::json::string_array(&env.labels_list));
    out.push(',');
    q(out, env.payload.json());
    out.push(',');
    q(out, env.payload_info.original_format.name());
    out.push_str(if env.payload_info.wrapped {
        ",TRUE,"
    } else {
        ",FALSE,"
    });
    q(out, &env.payload_info.sha256);
    out.push(',');
    out.push_str(decimal(env.payload_info.size_bytes, &mut [0; 20]));
    for v in [&env.security_labels, &env.mission_metadata] {
        out.push(',');
        opt(out, v.as_ref().map(json).transpose()?.as_deref());
    }
    out.push(',');
    q(
        out,
        &env.metadata
            .to_json()
            .map_err(|e| format!("encode row: {e}"))?,
    );
    out.push(',');
    q(out, &received_at);
    out.push(',');
    opt(out, env.custody.as_ref().map(json).transpose()?.as_deref());
    out.push(')');
    Ok(())
}

/// `ON DUPLICATE KEY UPDATE` of `write_mode: upsert`: every column takes the new value when
/// the new row's stream sequence is not older than the stored one's; `stream_sequence` is
/// assigned last (MySQL evaluates the assignments left to right, later ones see earlier ones).
fn upsert_clause() -> String {
    let newer = "VALUES(stream_sequence) >= stream_sequence";
    let mut sets: Vec<String> = COLUMNS
        .iter()
        .map(|c| c.0)
        .filter(|n| !matches!(*n, "idempotency_key" | "stream_sequence"))
        .map(|n| format!("{n} = IF({newer}, VALUES({n}), {n})"))
        .collect();
    sets.push(format!(
        "stored_at = IF({newer}, CURRENT_TIMESTAMP(6), stored_at)"
    ));
    sets.push("stream_sequence = GREATEST(stream_sequence, VALUES(stream_sequence))".into());
    format!(" ON DUPLICATE KEY UPDATE {}", sets.join(", "))
}

/// The multi-row INSERT the sink sends for `batch` into `table` (insert mode, every row new),
/// for the benchmark's `mariadb` command-line baseline of the same rows.
pub fn insert_statement(
    table: &TableName,
    batch: &[Envelope],
    no_backslash_escapes: bool,
) -> Result<String, String> {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    let tuples = batch
        .iter()
        .map(|e| values(e, &row_key(e), no_backslash_escapes))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(format!(
        "INSERT INTO {} ({}) VALUES {}",
        table_sql(table),
        names.join(","),
        tuples.join(",")
    ))
}

/// Errors that blame a row's data (not a duplicate key: that is a concurrent writer). Some
/// data errors carry the generic SQLSTATE HY000: incorrect string value (1366), incorrect
/// datetime (1292), MySQL's CHECK constraint violation (3819).
fn is_row_error(e: &DbError) -> bool {
    match e {
        DbError::Server(s) => {
            (matches!(s.code.get(..2), Some("22" | "23")) && s.severity != ER_DUP_ENTRY)
                || matches!(
                    s.severity.as_str(),
                    "ERROR 1366" | "ERROR 1292" | "ERROR 3819"
                )
        }
        _ => false,
    }
}

/// The MySQL/MariaDB sink.
pub struct MySqlSink {
    cfg: RelationalConfig,
    params: ConnectParams,
    pool: Mutex<Vec<Connection>>,
    metrics: Arc<Metrics>,
}

/// How one batch attempt failed.
struct BatchFailure {
    error: DbError,
    commit_sent: bool,
}

impl From<DbError> for BatchFailure {
    fn from(error: DbError) -> Self {
        BatchFailure {
            error,
            commit_sent: false,
        }
    }
}

/// Outcomes of a batch being built, with the duplicate counters.
struct Tally {
    outcomes: Vec<Option<WriteOutcome>>,
    duplicates: u64,
    ignored: u64,
}

impl MySqlSink {
    /// Builds the sink without connecting. Fails only on local problems (an unreadable CA).
    pub fn new(cfg: RelationalConfig, metrics: Arc<Metrics>) -> Result<MySqlSink, SinkError> {
        let tls_config = match cfg.tls_mode {
            TlsMode::Disable => None,
            TlsMode::VerifyFull => Some(
                tls_client_config(cfg.tls_ca_file.as_deref())
                    .map_err(|e| SinkError::new(KIND, e))?,
            ),
        };
        let params = ConnectParams {
            host: cfg.dsn.host.clone(),
            port: cfg.dsn.port,
            user: cfg.dsn.user.clone(),
            database: cfg.dsn.database.clone(),
            application_name: cfg.application_name.clone(),
            tls: cfg.tls_mode,
            tls_config,
            require_auth: cfg.require_auth,
            channel_binding: cfg.channel_binding,
            scram_min_iterations: cfg.scram_min_iterations,
            connect_timeout: Duration::from_secs(cfg.connect_timeout_seconds),
            io_timeout: Duration::from_secs(
                cfg.statement_timeout_seconds + super::IO_DEADLINE_MARGIN_SECONDS,
            ),
        };
        Ok(MySqlSink {
            cfg,
            params,
            pool: Mutex::new(Vec::new()),
            metrics,
        })
    }

    fn target(&self) -> String {
        format!(
            "{}:{}/{}",
            self.cfg.dsn.host, self.cfg.dsn.port, self.cfg.dsn.database
        )
    }

    /// A write's or the check's error: the cause flattened into the message, as the ACK path
    /// logs outcomes by `Display` and callers of `check` read its `Display`.
    fn err(&self, what: &str, e: &DbError) -> SinkError {
        SinkError::new(KIND, format!("{what} {}: {e}", self.target()))
    }

    /// A session's, the DDL's or the check's error: the cause kept as its source.
    fn caused(&self, what: &str, e: DbError) -> SinkError {
        SinkError::new(KIND, format!("{what} {}", self.target())).caused_by(e)
    }

    /// Opens a session and sets it up: strict mode, UTC, READ COMMITTED, statement timeout.
    fn connect(&self) -> Result<Connection, DbError> {
        let password = params::password_from_env(self.cfg.password_env.as_deref())?;
        let mut conn = Connection::connect(
            &self.params,
            &self.cfg.mysql_require_auth,
            password.as_ref().map(|p| p.expose().as_bytes()),
        )?;
        // Wiped now, not at the end of this function.
        drop(password);
        conn.query(
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,\
             ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', time_zone = '+00:00', \
             autocommit = 1",
        )?;
        conn.query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
        let timeout = self.cfg.statement_timeout_seconds;
        if conn.is_mariadb() {
            conn.query(&format!("SET SESSION max_statement_time = {timeout}"))?;
        }
        if self.cfg.auto_create_tables {
            for stmt in ddl(&self.cfg).split(";\n").filter(|s| !s.trim().is_empty()) {
                conn.query(stmt)?;
            }
        }
        Ok(conn)
    }

    fn checkout(&self) -> Result<Connection, DbError> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match pooled {
            Some(c) => Ok(c),
            None => self.connect(),
        }
    }

    fn checkin(&self, conn: Connection) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if conn.is_broken() || conn.in_transaction() {
            pool.clear();
            return;
        }
        if pool.len() < MAX_IDLE_CONNECTIONS {
            pool.push(conn);
        }
    }

    /// Runs `f` on a pooled session set up as the sink's (the custody checkpoint store's
    /// reads and writes).
    pub fn with_session<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Connection) -> Result<T, DbError>,
    ) -> Result<T, SinkError> {
        let mut conn = self.checkout().map_err(|e| self.caused("connect to", e))?;
        let out = f(&mut conn);
        self.checkin(conn);
        out.map_err(|e| self.caused(what, e))
    }

    /// Creates every configured table (and database) if missing.
    pub fn create_tables(&self) -> Result<(), SinkError> {
        let mut conn = self.connect().map_err(|e| self.caused("connect to", e))?;
        for stmt in ddl(&self.cfg).split(";\n").filter(|s| !s.trim().is_empty()) {
            conn.query(stmt)
                .map_err(|e| self.caused("create tables in", e))?;
        }
        Ok(())
    }

    /// One transaction for the whole batch; outcomes only after COMMIT succeeded.
    fn write_tx(
        &self,
        conn: &mut Connection,
        batch: &[Envelope],
        keys: &[String],
        pre: Vec<Option<WriteOutcome>>,
    ) -> Result<Tally, BatchFailure> {
        let mut groups: BTreeMap<&TableName, Vec<usize>> = BTreeMap::new();
        for (i, env) in batch.iter().enumerate() {
            if pre[i].is_some() {
                continue; // no usable key: already Permanent
            }
            groups
                .entry(self.cfg.table_for(&env.subject))
                .or_default()
                .push(i);
        }
        let mut tally = Tally {
            outcomes: pre,
            duplicates: 0,
            ignored: 0,
        };
        conn.query("START TRANSACTION")?;
        for (table, idx) in &groups {
            self.write_group(conn, table, batch, keys, idx, &mut tally)?;
        }
        conn.query("COMMIT").map_err(|error| BatchFailure {
            error,
            commit_sent: true,
        })?;
        if conn.in_transaction() {
            return Err(DbError::Protocol("the server kept the transaction open".into()).into());
        }
        Ok(tally)
    }

    /// One table's rows: stored keys first, then one INSERT of the new rows.
    fn write_group(
        &self,
        conn: &mut Connection,
        table: &TableName,
        batch: &[Envelope],
        keys: &[String],
        idx: &[usize],
        tally: &mut Tally,
    ) -> Result<(), DbError> {
        if self.cfg.write_mode == WriteMode::Upsert {
            return self.insert_rows(conn, table, batch, keys, idx, tally);
        }
        let nbe = conn.no_backslash_escapes();
        let mut sql = format!(
            "SELECT idempotency_key, subject, payload_sha256 FROM {} WHERE idempotency_key IN (",
            table_sql(table)
        );
        let mut wanted = HashSet::with_capacity(idx.len());
        for &i in idx {
            if wanted.insert(keys[i].as_str()) {
                if wanted.len() > 1 {
                    sql.push(',');
                }
                mysql::quote_into(&mut sql, &keys[i], nbe);
            }
        }
        sql.push(')');
        let found = conn.query(&sql)?.rows;
        // Borrowed from the answer and the batch: no copy per row.
        let mut stored: HashMap<&str, (&str, &str)> = found
            .iter()
            .filter_map(|r| match r.as_slice() {
                [Some(k), Some(s), Some(d)] => Some((k.as_str(), (s.as_str(), d.as_str()))),
                _ => None,
            })
            .collect();
        let mut new_rows = Vec::new();
        let mut first_in_batch: HashMap<&str, usize> = HashMap::new();
        let mut later_in_batch: Vec<(usize, usize)> = Vec::new();
        for &i in idx {
            let env = &batch[i];
            let Some(&(subject, sha)) = stored.get(keys[i].as_str()) else {
                // First of its key: inserted now; later rows of the same key compare to it.
                stored.insert(&keys[i], (&env.subject, &env.payload_info.sha256));
                new_rows.push(i);
                first_in_batch.insert(keys[i].as_str(), i);
                continue;
            };
            if let Some(&f) = first_in_batch.get(keys[i].as_str()) {
                later_in_batch.push((i, f));
            }
            tally.duplicates += 1;
            tally.outcomes[i] = Some(
                if subject == env.subject && sha == env.payload_info.sha256 {
                    tally.ignored += 1;
                    WriteOutcome::AlreadyDurable
                } else {
                    WriteOutcome::Permanent(
                        SinkError::new(
                            KIND,
                            format!(
                            "table {table}: idempotency key {} already holds a different event \
                             (subject or payload digest differs); not overwritten",
                            keys[i]
                        ),
                        )
                        .classified(FailureClass::DuplicateExists),
                    )
                },
            );
        }
        self.insert_rows(conn, table, batch, keys, &new_rows, tally)?;
        // A later row of a key first seen in this batch is stored only if the first was.
        for (i, f) in later_in_batch {
            if !matches!(tally.outcomes[f], Some(WriteOutcome::Durable)) {
                tally.outcomes[i] = tally.outcomes[f].clone();
            }
        }
        Ok(())
    }

    /// The new rows as multi-row INSERTs (one unless over [`MAX_STATEMENT_BYTES`]); on a
    /// row-data error, one INSERT per row so only the offending rows are `Permanent`.
    fn insert_rows(
        &self,
        conn: &mut Connection,
        table: &TableName,
        batch: &[Envelope],
        keys: &[String],
        rows: &[usize],
        tally: &mut Tally,
    ) -> Result<(), DbError> {
        if rows.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
        let head = format!(
            "INSERT INTO {} ({}) VALUES ",
            table_sql(table),
            names.join(",")
        );
        let tail = match self.cfg.write_mode {
            WriteMode::Upsert => upsert_clause(),
            WriteMode::Insert => String::new(),
        };
        let nbe = conn.no_backslash_escapes();
        // Every row's tuple in one buffer, each row by its range in it.
        let mut buf = String::new();
        let mut tuples = Vec::with_capacity(rows.len());
        for &i in rows {
            let at = buf.len();
            match push_values(&mut buf, &batch[i], &keys[i], nbe) {
                Ok(()) => tuples.push((i, at..buf.len())),
                Err(e) => {
                    tally.outcomes[i] = Some(WriteOutcome::Permanent(
                        SinkError::new(KIND, format!("table {table}: row {}: {e}", keys[i]))
                            .classified(FailureClass::ValueRejected),
                    ))
                }
            }
        }
        let mut start = 0;
        while start < tuples.len() {
            let mut sql = String::with_capacity(
                head.len() + (buf.len() + tuples.len()).min(MAX_STATEMENT_BYTES) + tail.len(),
            );
            sql.push_str(&head);
            let mut end = start;
            while end < tuples.len()
                && (end == start || sql.len() + tuples[end].1.len() < MAX_STATEMENT_BYTES)
            {
                if end > start {
                    sql.push(',');
                }
                sql.push_str(&buf[tuples[end].1.clone()]);
                end += 1;
            }
            sql.push_str(&tail);
            match conn.query(&sql) {
                Ok(_) => {
                    for (i, _) in &tuples[start..end] {
                        tally.outcomes[*i] = Some(WriteOutcome::Durable);
                    }
                }
                Err(e) if is_row_error(&e) && !conn.is_broken() => {
                    log::warn!(
                        "relational sink: table {table}: batch insert rejected ({e}); retrying {} rows one by one",
                        end - start
                    );
                    for (i, v) in &tuples[start..end] {
                        let v = &buf[v.clone()];
                        tally.outcomes[*i] = Some(match conn.query(&format!("{head}{v}{tail}")) {
                            Ok(_) => WriteOutcome::Durable,
                            Err(e) if is_row_error(&e) && !conn.is_broken() => {
                                WriteOutcome::Permanent(
                                    SinkError::new(
                                        KIND,
                                        format!(
                                            "table {table}: row {} rejected by the database: {e}",
                                            keys[*i]
                                        ),
                                    )
                                    .classified(FailureClass::ValueRejected),
                                )
                            }
                            Err(e) => return Err(e),
                        });
                    }
                }
                Err(e) => return Err(e),
            }
            start = end;
        }
        Ok(())
    }

    /// Proves a table exists and accepts an insert: a probe row, rolled back.
    fn probe(&self, conn: &mut Connection, table: &TableName) -> Result<(), DbError> {
        let probe = super::probe_envelope();
        let key = format!(
            "svc-check-{}",
            crate::db::postgres::auth::new_nonce().map_err(DbError::Protocol)?
        );
        let v = values(&probe, &key, conn.no_backslash_escapes()).map_err(DbError::Protocol)?;
        let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
        conn.query("START TRANSACTION")?;
        let res = conn.query(&format!(
            "INSERT INTO {} ({}) VALUES {v}",
            table_sql(table),
            names.join(",")
        ));
        let rollback = conn.query("ROLLBACK");
        let res = res?;
        rollback?;
        if res.affected_rows != 1 {
            return Err(DbError::Protocol("probe row was not inserted".into()));
        }
        Ok(())
    }
}

impl Sink for MySqlSink {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let mut pre: Vec<Option<WriteOutcome>> = vec![None; batch.len()];
        let keys: Vec<String> = match (&self.cfg.write_mode, &self.cfg.key_field) {
            (WriteMode::Upsert, Some(pointer)) => batch
                .iter()
                .enumerate()
                .map(|(i, env)| {
                    field_key(env, pointer).unwrap_or_else(|e| {
                        pre[i] = Some(WriteOutcome::Permanent(
                            SinkError::new(KIND, e).classified(FailureClass::InvalidKey),
                        ));
                        String::new()
                    })
                })
                .collect(),
            _ => batch.iter().map(row_key).collect(),
        };
        let all_transient = |e: SinkError| vec![WriteOutcome::Transient(e); batch.len()];
        let mut conn = match self.checkout() {
            Ok(c) => c,
            Err(e) => return all_transient(self.err("connect to", &e)),
        };
        match self.write_tx(&mut conn, batch, &keys, pre) {
            Ok(t) => {
                self.checkin(conn);
                Metrics::add(&self.metrics.counters.db_duplicates_total, t.duplicates);
                Metrics::add(&self.metrics.counters.db_duplicate_ignored_total, t.ignored);
                t.outcomes
                    .into_iter()
                    .map(|o| o.expect("every row has an outcome"))
                    .collect()
            }
            Err(BatchFailure { error, commit_sent }) => {
                if !conn.is_broken() && conn.in_transaction() && conn.query("ROLLBACK").is_err() {
                    log::debug!("relational sink: rollback after a failed batch failed");
                }
                let broken = conn.is_broken();
                self.checkin(conn);
                let what = if commit_sent {
                    "commit (outcome unknown, retried on redelivery) on"
                } else {
                    "write batch (nothing committed) to"
                };
                let err = self.err(what, &error);
                if broken {
                    log::warn!("{err}; the connection is dropped and reopened on the next batch");
                }
                all_transient(err)
            }
        }
    }

    fn check(&self) -> Result<String, SinkError> {
        let mut conn = self.connect().map_err(|e| self.err("connect to", &e))?;
        let version =
            crate::text::peer::PeerText::with_limit(conn.server_version(), 64).to_string();
        let mut missing = Vec::new();
        for t in self.cfg.tables() {
            match self.probe(&mut conn, t) {
                Ok(()) => {}
                Err(e) if matches!(e.code(), Some("42S02" | "42000")) => {
                    missing.push(t.to_string())
                }
                Err(e) => {
                    return Err(SinkError::new(
                        KIND,
                        format!("table {t} in {} is not writable: {e}", self.target()),
                    ))
                }
            }
        }
        if !missing.is_empty() {
            return Err(SinkError::new(
                KIND,
                format!(
                    "missing table(s) in {}: {}; create them with `svc init-db` or set \
                     sink.auto_create_tables",
                    self.target(),
                    missing.join(", ")
                ),
            ));
        }
        let flush = conn
            .query("SELECT @@innodb_flush_log_at_trx_commit")
            .ok()
            .and_then(|r| r.rows.into_iter().next())
            .and_then(|r| r.into_iter().next().flatten());
        let durable = if flush.as_deref() == Some("1") {
            ""
        } else {
            "; WARNING: innodb_flush_log_at_trx_commit is not 1, a committed batch can be lost \
             in a server crash"
        };
        let tls = match self.cfg.tls_mode {
            TlsMode::Disable => "tls disabled",
            TlsMode::VerifyFull => "tls verified",
        };
        Ok(format!(
            "mysql {version} at {} ({tls}): {} table(s) exist and accept inserts (probe rolled \
             back){durable}",
            self.target(),
            self.cfg.tables().len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> RelationalConfig {
        let v = crate::document::reader::parse_json(&format!(
            r#"{{"engine":"mysql","dsn":"mysql://svc@db/x","table":"audit.events"{extra}}}"#
        ))
        .unwrap();
        let p = crate::document::reader::Problems::new();
        let mut r = crate::document::reader::ObjectReader::at("sink".into(), &v, &p);
        let c = RelationalConfig::read(&mut r);
        r.finish();
        assert!(p.is_empty());
        c
    }

    /// docs/sinks/relational.md quotes this DDL: it must stay what `svc init-db` prints.
    #[test]
    fn ddl_is_the_documented_one() {
        let doc = include_str!("../../../docs/sinks/relational.md");
        let ddl = ddl(&cfg(""));
        assert!(doc.contains(&ddl), "docs/sinks/relational.md lacks:\n{ddl}");
        assert!(!ddl.contains(" JSON "), "the JSON type rewrites payloads");
    }

    #[test]
    fn upsert_assigns_the_sequence_last_and_datetimes_are_utc() {
        let c = upsert_clause();
        assert!(c.ends_with("stream_sequence = GREATEST(stream_sequence, VALUES(stream_sequence))"));
        assert!(!c.contains("idempotency_key ="));
        assert_eq!(
            datetime("2026-11-28T07:19:43.123456789+02:00").unwrap(),
            "2026-11-28 05:19:43.123456"
        );
        assert!(datetime("yesterday").is_err());
    }

    /// The DATETIME of the runner's own stamps, copied without the parser, is the parser's.
    #[test]
    fn datetimes_without_the_parser_are_the_parsers() {
        let by_parser = |t: &str| {
            let t = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .unwrap();
            format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
                t.microsecond()
            )
        };
        let mut n: i128 = 1_700_000_000_123_456_789;
        for i in 0..5_000i128 {
            n = n
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407)
                .rem_euclid(253_402_300_799_999_999_999);
            // Every fraction length, whole seconds included.
            let n = n - n % 10i128.pow((i % 10) as u32);
            let stamp = crate::text::rfc3339::Rfc3339::from_unix_nanos(n);
            assert_eq!(datetime(&stamp).unwrap(), by_parser(&stamp), "{}", &*stamp);
        }
        for t in [
            "2026-02-29T00:00:00Z",
            "2100-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T00:00:60Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00.1234567890Z",
            "2026-01-01 00:00:00Z",
            "2026-01-01T00:00:00+00:00",
        ] {
            assert_eq!(utc_datetime(t), None, "{t}");
        }
        assert_eq!(
            utc_datetime("2026-11-28T07:19:43.1Z").as_deref(),
            Some("2026-11-28 07:19:43.100000")
        );
        for (t, day) in [
            (
                "2024-02-29T23:59:59.999999999Z",
                "2024-02-29 23:59:59.999999",
            ),
            ("2000-02-29T00:00:00Z", "2000-02-29 00:00:00.000000"),
            ("2026-12-31T00:00:00Z", "2026-12-31 00:00:00.000000"),
        ] {
            assert_eq!(utc_datetime(t).as_deref(), Some(day));
            assert_eq!(by_parser(t), day);
        }
    }

    /// A row's tuple as it was built before it was written in place (one string per literal,
    /// joined): the same literals in the same order.
    fn values_as_before(env: &Envelope, key: &str, nbe: bool) -> String {
        let q = |s: &str| mysql::quote(s, nbe);
        let opt = |s: Option<&str>| s.map_or_else(|| "NULL".to_string(), q);
        let js = |v: &dyn erased::Json| q(&v.text());
        let opt_json = |v: Option<&dyn erased::Json>| v.map_or_else(|| "NULL".to_string(), js);
        let parts = [
            q(key),
            q(&env.subject),
            q(&env.stream),
            opt(Some(&*env.stream_incarnation).filter(|i| !i.is_empty())),
            env.stream_sequence.to_string(),
            q(&env.consumer),
            env.consumer_sequence.to_string(),
            opt(env.message_id.as_deref()),
            q(&env.priority),
            q(&env.classification),
            q(&env.labels),
            js(&env.labels_list),
            js(&env.payload),
            q(serde_json::to_value(env.payload_info.original_format)
                .unwrap()
                .as_str()
                .unwrap()),
            if env.payload_info.wrapped {
                "TRUE"
            } else {
                "FALSE"
            }
            .to_string(),
            q(&env.payload_info.sha256),
            env.payload_info.size_bytes.to_string(),
            opt_json(env.security_labels.as_ref().map(|v| v as &dyn erased::Json)),
            opt_json(
                env.mission_metadata
                    .as_ref()
                    .map(|v| v as &dyn erased::Json),
            ),
            js(&env.metadata),
            q(&datetime(&env.metadata.received_at).unwrap()),
            opt_json(env.custody.as_ref().map(|v| v as &dyn erased::Json)),
        ];
        format!("({})", parts.join(","))
    }

    mod erased {
        pub trait Json {
            fn text(&self) -> String;
        }
        impl<T: serde::Serialize> Json for T {
            fn text(&self) -> String {
                serde_json::to_string(self).unwrap()
            }
        }
    }

    #[test]
    fn tuples_are_what_they_were() {
        use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};
        let env = |subject: &str, data: &[u8]| {
            normalize(
                &RawMessage::sample(subject, 3, data),
                1_700_000_001_000_000_000,
                &EnvelopeConfig::default(),
            )
            .0
        };
        let mut odd = env("a.b", b"{\"k\":\"it's \\\\ \\n\"}");
        odd.subject = "a'b\\c\0\n\r\u{1a}\"é😀".into();
        odd.stream_incarnation = "20261128T071943Z".into();
        odd.message_id = Some("m'1".into());
        odd.labels_list = vec!["x'".into()];
        odd.security_labels = Some(serde_json::json!({"l": "s'\\"}));
        odd.mission_metadata = Some(serde_json::json!({"m": 1}));
        for e in [env("a.b", b"{}"), env("t", b"text 'q' \\"), odd] {
            for nbe in [false, true] {
                let key = row_key(&e);
                assert_eq!(
                    values(&e, &key, nbe).unwrap(),
                    values_as_before(&e, &key, nbe)
                );
            }
        }
    }

    /// atk51d: stamps one byte away from the runner's shape (a digit, a separator, a sign, a
    /// letter, a non-ASCII byte, a byte added or removed): whenever the copy answers, the
    /// parser accepts the text and gives the same DATETIME.
    #[test]
    fn datetime_copies_only_what_the_parser_reads_the_same() {
        let parser = |t: &str| {
            let t = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .ok()?
                .to_offset(time::UtcOffset::UTC);
            Some(format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
                t.microsecond()
            ))
        };
        let bytes: &[&str] = &[
            "0", "1", "2", "3", "5", "9", "-", ":", ".", "T", "t", "Z", "z", " ", "+", "é", "",
        ];
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as usize
        };
        let seeds = [
            "2024-02-29T23:59:59.999999999Z",
            "2026-11-28T07:19:43.1Z",
            "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59.123456Z",
        ];
        for _ in 0..200_000 {
            let mut t = seeds[next() % seeds.len()].to_string();
            for _ in 0..1 + next() % 2 {
                let at = next() % (t.len() + 1);
                let at = (0..=at).rev().find(|&a| t.is_char_boundary(a)).unwrap_or(0);
                let end = (at + next() % 2).min(t.len());
                let end = (end..=t.len()).find(|&e| t.is_char_boundary(e)).unwrap();
                t.replace_range(at..end, bytes[next() % bytes.len()]);
            }
            if let Some(fast) = utc_datetime(&t) {
                assert_eq!(Some(fast), parser(&t), "{t:?}");
            }
        }
    }
}
