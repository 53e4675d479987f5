//! Relational sink: envelopes become rows in PostgreSQL, one transaction per batch.
//!
//! Custody: a batch is written inside `BEGIN ... COMMIT`; outcomes are `Durable` only after the
//! server confirmed `COMMIT`. Every row carries an idempotency key under a unique constraint;
//! `INSERT ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key` tells which
//! rows are new, so a redelivered message lands once and is reported `AlreadyDurable`.
//!
//! Duplicates, and the two counters (see `docs/sinks/relational.md`):
//! - `db_duplicates_total`: rows whose key already existed (an earlier delivery, or an earlier
//!   row of the same batch) — every duplicate detected.
//! - `db_duplicate_ignored_total`: the subset confirmed to be the same event (same subject and
//!   payload SHA-256 as the stored row) and therefore ignored without error. A key that holds a
//!   *different* event (a reused message ID, a row a runner before stream incarnations wrote
//!   for a stream since created again) is never
//!   overwritten and never dropped silently: it is a `Permanent` outcome for operator review.
//!   So `db_duplicates_total - db_duplicate_ignored_total` counts key collisions.
//!
//! Failures:
//! - Connection lost, timeout, server shutting down, missing table, permissions, deadlock: the
//!   whole batch is `Transient` (nothing committed, or commit outcome unknown — the idempotent
//!   insert makes a retry safe). A broken connection is dropped (with every idle pooled one) and
//!   the next batch connects anew.
//! - A row the database rejects on its data (SQLSTATE classes 22, 23, 54, e.g. `\u0000` in
//!   JSON, a value out of range, an operator's CHECK constraint): the batch is retried row by row
//!   under savepoints in one transaction, so only the offending rows become `Permanent`.
//!
//! Driver: the in-tree protocol client ([`crate::db::postgres`]) on `std::net`, because the
//! default build must not carry an async runtime and the sync `postgres` crate embeds tokio.

pub mod config;
pub mod my_sink;
mod row;
mod sql;
pub mod upsert;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{FailureClass, Sink, SinkError, WriteOutcome};
use crate::db::postgres::{ConnectParams, Connection, DbError, TlsMode};
use crate::message::envelope::Envelope;
use crate::metrics::Metrics;
pub use config::{Dsn, RelationalConfig, TableName, TableRoute, WriteMode};

use row::row;
pub use row::{row_columns_and_object, row_key};
pub use sql::ddl;
use sql::{existing_sql, insert_sql, run_ddl, upsert_sql};

const KIND: &str = "relational_db";

/// Seconds the client waits beyond `statement_timeout_seconds` for a whole statement round
/// trip before it gives up on the connection.
pub const IO_DEADLINE_MARGIN_SECONDS: u64 = 10;

/// Idle connections kept for reuse. Concurrency is bounded by the callers (sink workers and
/// fan-out threads); connections beyond this many are closed after use.
const MAX_IDLE_CONNECTIONS: usize = 16;

/// Every relational sink of a sink config with its name: the sink itself (`sink`) or the
/// `relational_db` children of a fan-out (by child name).
pub fn configs_in(sink: &super::SinkConfig) -> Vec<(String, &RelationalConfig)> {
    match sink {
        super::SinkConfig::RelationalDb(c) => vec![("sink".to_string(), c)],
        super::SinkConfig::Fanout(f) => f
            .sinks
            .iter()
            .filter_map(|(name, c)| match c {
                super::SinkConfig::RelationalDb(c) => Some((name.clone(), c)),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// SQLSTATE classes that blame the row's data, not the destination.
fn is_row_error(e: &DbError) -> bool {
    matches!(e.code().and_then(|c| c.get(..2)), Some("22" | "23" | "54"))
}

/// Per-table statements, prepared once as text.
struct TableSql {
    insert: String,
    existing: String,
    /// `write_mode: upsert`: newer content (by stream sequence) replaces.
    upsert: String,
}

/// The PostgreSQL sink.
pub struct RelationalSink {
    cfg: RelationalConfig,
    params: ConnectParams,
    sql: HashMap<TableName, TableSql>,
    pool: Mutex<Vec<Connection>>,
    metrics: Arc<Metrics>,
}

/// How one batch attempt ended when it did not produce outcomes.
struct BatchFailure {
    error: DbError,
    /// COMMIT was sent: the server may have committed.
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

impl RelationalSink {
    /// Builds the sink without connecting (connections are opened by the first batch or
    /// [`Sink::check`]). Fails only on local problems: an unreadable CA file.
    pub fn new(cfg: RelationalConfig, metrics: Arc<Metrics>) -> Result<RelationalSink, SinkError> {
        let tls_config = match cfg.tls_mode {
            TlsMode::Disable => None,
            TlsMode::VerifyFull => Some(
                crate::db::transport::tls_client_config(cfg.tls_ca_file.as_deref())
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
            // The server cancels a statement at statement_timeout; the client gives up on the
            // whole round trip a little later, which catches a silent network outage and a
            // server that drips its answer.
            io_timeout: Duration::from_secs(
                cfg.statement_timeout_seconds + IO_DEADLINE_MARGIN_SECONDS,
            ),
        };
        let sql = cfg
            .tables()
            .into_iter()
            .map(|t| {
                (
                    t.clone(),
                    TableSql {
                        insert: insert_sql(t),
                        upsert: upsert_sql(t),
                        existing: existing_sql(t),
                    },
                )
            })
            .collect();
        Ok(RelationalSink {
            cfg,
            params,
            sql,
            pool: Mutex::new(Vec::new()),
            metrics,
        })
    }

    /// Where the sink connects, for messages: `host:port/database` (no user, no secret).
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

    /// Opens a new session and prepares it: timeouts, durable commits, optional DDL.
    fn connect(&self) -> Result<Connection, DbError> {
        let password = crate::db::params::password_from_env(self.cfg.password_env.as_deref())?;
        let mut conn = Connection::connect(
            &self.params,
            password.as_ref().map(|p| p.expose().as_bytes()),
        )?;
        // Wiped now, not at the end of this function.
        drop(password);
        // Commit means durable: a server or role default of synchronous_commit=off would
        // acknowledge commits that a crash can still lose.
        let res = conn.simple(&format!(
            "SET statement_timeout = {}; SHOW synchronous_commit",
            self.cfg.statement_timeout_seconds * 1000
        ))?;
        let sync = res
            .get(1)
            .and_then(|r| r.rows.first())
            .and_then(|r| r.first().cloned().flatten());
        if sync.as_deref() == Some("off") {
            conn.simple("SET synchronous_commit = on")?;
            log::info!("relational sink: synchronous_commit was off for this session; set to on");
        }
        if self.cfg.auto_create_tables {
            run_ddl(&mut conn, &self.cfg)?;
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

    /// Returns a healthy, idle connection to the pool; a broken one is dropped together with
    /// every idle one (after a server restart they are all dead).
    fn checkin(&self, conn: Connection) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if conn.is_broken() || conn.tx_status() != b'I' {
            pool.clear();
            return;
        }
        if pool.len() < MAX_IDLE_CONNECTIONS {
            pool.push(conn);
        }
    }

    /// Runs `f` on a new prepared session (custody checkpoints: their table and the audit's
    /// reads), with errors naming the target, never a secret.
    pub fn with_session<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Connection) -> Result<T, DbError>,
    ) -> Result<T, SinkError> {
        let mut conn = self.connect().map_err(|e| self.caused("connect to", e))?;
        f(&mut conn).map_err(|e| self.caused(what, e))
    }

    /// Creates every configured table (and schema) if missing.
    pub fn create_tables(&self) -> Result<(), SinkError> {
        let mut conn = self.connect().map_err(|e| self.caused("connect to", e))?;
        run_ddl(&mut conn, &self.cfg).map_err(|e| self.caused("create tables in", e))?;
        Ok(())
    }

    /// One transaction for the whole batch. Returns outcomes only after COMMIT succeeded,
    /// plus the duplicate counts to add to the metrics.
    fn write_tx(
        &self,
        conn: &mut Connection,
        batch: &[Envelope],
        keys: &[String],
        pre: Vec<Option<WriteOutcome>>,
    ) -> Result<(Vec<WriteOutcome>, u64, u64), BatchFailure> {
        if conn.tx_status() != b'I' {
            return Err(DbError::Protocol("connection is not idle".into()).into());
        }
        // Group rows by table, keeping batch order inside each group.
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
        let upsert = self.cfg.write_mode == WriteMode::Upsert;
        let mut outcomes = pre;
        let (mut duplicates, mut ignored) = (0u64, 0u64);

        conn.simple("BEGIN")?;
        for (table, all) in &groups {
            let (sql, idx) = self.group_rows(table, batch, keys, all, &mut outcomes);
            let (sql, idx) = (&sql, &idx[..]);
            let inserted = if groups.len() > 1 {
                // A savepoint per table keeps other tables' rows if this group needs the
                // row-by-row path.
                conn.simple("SAVEPOINT svc_group")?;
                let r = self.insert_group(conn, sql, table, batch, keys, idx, true, &mut outcomes);
                if r.is_ok() {
                    conn.simple("RELEASE SAVEPOINT svc_group")?;
                }
                r?
            } else {
                self.insert_group(conn, sql, table, batch, keys, idx, false, &mut outcomes)?
            };

            if upsert {
                // Written, or older than the stored row: either way the newest content is stored.
                for &i in idx {
                    outcomes[i].get_or_insert(WriteOutcome::Durable);
                }
                continue;
            }
            // Rows not inserted now are duplicates (or were rejected above): compare with
            // what is stored under their key.
            let mut first_seen: HashMap<&str, usize> = HashMap::with_capacity(idx.len());
            let mut dup_rows = Vec::new();
            for &i in idx {
                if outcomes[i].is_some() {
                    continue; // permanently rejected row
                }
                let k = keys[i].as_str();
                let first = *first_seen.entry(k).or_insert(i);
                if first == i && inserted.contains(k) {
                    outcomes[i] = Some(WriteOutcome::Durable);
                } else {
                    dup_rows.push(i);
                }
            }
            if dup_rows.is_empty() {
                continue;
            }
            let wanted: Vec<&str> = dup_rows.iter().map(|&i| keys[i].as_str()).collect();
            let json = serde_json::to_string(&wanted).expect("strings serialize");
            let stored = conn.query(&sql.existing, &[Some(&json)])?;
            let stored: HashMap<String, (String, String)> = stored
                .rows
                .into_iter()
                .filter_map(|r| {
                    let mut it = r.into_iter();
                    Some((it.next()??, (it.next()??, it.next()??)))
                })
                .collect();
            for i in dup_rows {
                duplicates += 1;
                let env = &batch[i];
                outcomes[i] = Some(match stored.get(&keys[i]) {
                    Some((subject, sha))
                        if *subject == env.subject && *sha == env.payload_info.sha256 =>
                    {
                        ignored += 1;
                        WriteOutcome::AlreadyDurable
                    }
                    Some(_) => WriteOutcome::Permanent(
                        SinkError::new(
                            KIND,
                            format!(
                                "table {table}: idempotency key {} already holds a different \
                                 event (subject or payload digest differs); not overwritten",
                                keys[i]
                            ),
                        )
                        .classified(FailureClass::DuplicateExists),
                    ),
                    // Vanished between insert and select: only possible if someone deleted it
                    // concurrently. Retry on redelivery.
                    None => WriteOutcome::Transient(SinkError::new(
                        KIND,
                        format!("table {table}: row {} neither inserted nor found", keys[i]),
                    )),
                });
            }
        }

        let done = conn.simple("COMMIT").map_err(|error| BatchFailure {
            error,
            commit_sent: true,
        })?;
        if done.last().map(|r| r.tag.as_str()) != Some("COMMIT") {
            return Err(DbError::Protocol("the server rolled the transaction back".into()).into());
        }
        Ok((
            outcomes
                .into_iter()
                .map(|o| o.expect("every row has an outcome"))
                .collect(),
            duplicates,
            ignored,
        ))
    }

    /// The statement and rows of one table's group: as is for `insert`; for `upsert` the
    /// newest row per key with the upsert statement (the superseded rows are `Durable`).
    fn group_rows(
        &self,
        table: &TableName,
        batch: &[Envelope],
        keys: &[String],
        idx: &[usize],
        outcomes: &mut [Option<WriteOutcome>],
    ) -> (TableSql, Vec<usize>) {
        let sql = &self.sql[table];
        if self.cfg.write_mode == WriteMode::Insert {
            let same = TableSql {
                insert: sql.insert.clone(),
                existing: sql.existing.clone(),
                upsert: String::new(),
            };
            return (same, idx.to_vec());
        }
        let keep = upsert::newest_per_key(batch, keys, idx);
        let kept: std::collections::HashSet<usize> = keep.iter().copied().collect();
        for &i in idx {
            if !kept.contains(&i) {
                outcomes[i] = Some(WriteOutcome::Durable);
            }
        }
        let up = TableSql {
            insert: sql.upsert.clone(),
            existing: sql.existing.clone(),
            upsert: String::new(),
        };
        (up, keep)
    }

    /// Inserts one table's rows; on a row-data error falls back to one savepoint per row and
    /// marks the rejected rows `Permanent`. Returns the keys inserted now.
    #[allow(clippy::too_many_arguments)]
    fn insert_group(
        &self,
        conn: &mut Connection,
        sql: &TableSql,
        table: &TableName,
        batch: &[Envelope],
        keys: &[String],
        idx: &[usize],
        in_group_savepoint: bool,
        outcomes: &mut [Option<WriteOutcome>],
    ) -> Result<std::collections::HashSet<String>, DbError> {
        let json = row::rows_json(batch, keys, idx)
            .map_err(|e| DbError::Protocol(format!("encode rows: {e}")))?;
        let rejected = match conn.query(&sql.insert, &[Some(&json)]) {
            Ok(res) => return Ok(collect_keys(res)),
            Err(e) if is_row_error(&e) && !conn.is_broken() => e,
            Err(e) => return Err(e),
        };
        log::warn!(
            "relational sink: table {table}: batch insert rejected ({rejected}); retrying {} rows one by one",
            idx.len()
        );
        // The transaction is aborted: undo to the group savepoint (earlier tables' rows stay),
        // or restart the transaction when this is the only group.
        if in_group_savepoint {
            conn.simple("ROLLBACK TO SAVEPOINT svc_group")?;
        } else {
            conn.simple("ROLLBACK")?;
            conn.simple("BEGIN")?;
        }
        let mut inserted = std::collections::HashSet::new();
        for &i in idx {
            let one = row::rows_json(batch, keys, &[i])
                .map_err(|e| DbError::Protocol(format!("encode row: {e}")))?;
            conn.simple("SAVEPOINT svc_row")?;
            match conn.query(&sql.insert, &[Some(&one)]) {
                Ok(res) => {
                    inserted.extend(collect_keys(res));
                    conn.simple("RELEASE SAVEPOINT svc_row")?;
                }
                Err(e) if is_row_error(&e) && !conn.is_broken() => {
                    conn.simple("ROLLBACK TO SAVEPOINT svc_row")?;
                    outcomes[i] = Some(WriteOutcome::Permanent(
                        SinkError::new(
                            KIND,
                            format!(
                                "table {table}: row {} rejected by the database: {e}",
                                keys[i]
                            ),
                        )
                        .classified(FailureClass::ValueRejected),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(inserted)
    }

    /// Proves one table exists, matches the sink's columns and unique key, and accepts an
    /// insert: a probe row inside a transaction that is rolled back.
    fn probe(&self, conn: &mut Connection, table: &TableName) -> Result<(), DbError> {
        let probe = probe_envelope();
        let key = format!(
            "svc-check-{}",
            crate::db::postgres::auth::new_nonce().map_err(DbError::Protocol)?
        );
        let json = serde_json::to_string(&[row(&probe, &key)]).expect("probe serializes");
        conn.simple("BEGIN")?;
        let res = conn.query(&self.sql[table].insert, &[Some(&json)]);
        let rollback = conn.simple("ROLLBACK");
        let res = res?;
        rollback?;
        if collect_keys(res).len() != 1 {
            return Err(DbError::Protocol("probe row was not inserted".into()));
        }
        Ok(())
    }
}

fn collect_keys(res: crate::db::postgres::QueryResult) -> std::collections::HashSet<String> {
    let mut keys = std::collections::HashSet::with_capacity(res.rows.len());
    keys.extend(
        res.rows
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten()),
    );
    keys
}

/// A synthetic envelope for [`RelationalSink::check`]'s rolled-back probe insert.
fn probe_envelope() -> Envelope {
    crate::message::envelope::normalize(
        &crate::message::envelope::RawMessage {
            subject: "svc.check".into(),
            stream: "SVC_CHECK".into(),
            stream_incarnation: Default::default(),
            consumer: "svc-check".into(),
            stream_sequence: 1,
            consumer_sequence: 1,
            delivery_count: 1,
            published_unix_nanos: None,
            headers: Vec::new(),
            data: b"{\"probe\":true}".to_vec(),
            unreadable: None,
            header_block: Default::default(),
        },
        crate::message::envelope::now_unix_nanos(),
        &crate::message::envelope::EnvelopeConfig::default(),
    )
    .0
}

impl Sink for RelationalSink {
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
                    upsert::field_key(env, pointer).unwrap_or_else(|e| {
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
            Ok((outcomes, duplicates, ignored)) => {
                self.checkin(conn);
                Metrics::add(&self.metrics.counters.db_duplicates_total, duplicates);
                Metrics::add(&self.metrics.counters.db_duplicate_ignored_total, ignored);
                outcomes
            }
            Err(BatchFailure { error, commit_sent }) => {
                if !conn.is_broken() && conn.tx_status() != b'I' && conn.simple("ROLLBACK").is_err()
                {
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
        let version = crate::text::peer::PeerText::with_limit(
            conn.server_param("server_version").unwrap_or("?"),
            64,
        )
        .to_string();
        let mut missing = Vec::new();
        for t in self.cfg.tables() {
            match self.probe(&mut conn, t) {
                Ok(()) => {}
                Err(e) if e.code() == Some("42P01") || e.code() == Some("3F000") => {
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
                    "missing table(s) in {}: {}; create them with the DDL in \
                     docs/sinks/relational.md or set sink.auto_create_tables",
                    self.target(),
                    missing.join(", ")
                ),
            ));
        }
        let tls = match self.cfg.tls_mode {
            TlsMode::Disable => "tls disabled",
            TlsMode::VerifyFull => "tls verified",
        };
        Ok(format!(
            "postgresql {version} at {} ({tls}): {} table(s) exist and accept inserts \
             (probe rolled back)",
            self.target(),
            self.cfg.tables().len()
        ))
    }
}
