//! A small, synchronous PostgreSQL client (frontend/backend protocol 3.0) on `std::net`.
//!
//! Why in-tree: the runner must stay free of an async runtime, and the popular sync `postgres`
//! crate is a wrapper that embeds tokio; `postgres-protocol` (its codec) was measured and not
//! adopted (see docs/sinks/relational.md). The relational sink needs only a narrow slice of the
//! protocol, implemented here and nothing more:
//! - startup over TCP, optionally upgraded to TLS (SSLRequest + rustls, certificate and host
//!   name verified) — `transport.rs`;
//! - authentication limited by an allow-list ([`AuthPolicy`], libpq's `require_auth`):
//!   SCRAM-SHA-256 and SCRAM-SHA-256-PLUS by default, MD5, cleartext and no authentication only
//!   when allowed (the state machine is in `startup.rs`, the arithmetic in `auth.rs`);
//! - the simple query protocol (for `BEGIN`, `COMMIT`, `SAVEPOINT`, `SET`, DDL);
//! - the extended query protocol with text-format parameters and results (unnamed statement and
//!   portal; one Parse/Bind/Execute/Sync round trip per statement);
//! - ErrorResponse with SQLSTATE; NoticeResponse, ParameterStatus and NotificationResponse are
//!   consumed. Messages are parsed by `codec.rs`. Connection parameters are in `params.rs`.
//!
//! Not supported: COPY, binary formats, cancellation requests, multiple hosts, Unix sockets.
//!
//! The server is a peer that may be hostile. Each operation has ONE deadline (connect: TCP, TLS
//! and authentication together; a statement: the whole round trip), not a per-read timeout;
//! every message is bounded ([`codec::MAX_MESSAGE_BYTES`]), and so are rows per statement,
//! result bytes and server parameters.
//!
//! Failure model: any I/O error, timeout, protocol violation, exceeded limit or FATAL server
//! error marks the connection broken ([`Connection::is_broken`]); a broken connection is never
//! written to again (not even Terminate) and the caller drops it and connects anew. A non-fatal
//! server error leaves the connection usable after the server's ReadyForQuery.

pub mod auth;
pub mod codec;
mod startup;

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::time::{Duration, Instant};

use crate::error::io_err;
pub use crate::error::{condition_name, DbError, ServerError};
pub use crate::params::{ConnectParams, TlsMode};
pub use crate::transport::tls_client_config;
use crate::transport::{tls_handshake, DeadlineTcp, Stream};
pub use auth::{AuthPolicy, ChannelBindingMode};
use codec::{BackendMessage, Msg, SSL_REQUEST_CODE};
use svc_text::peer::PeerText;
use svc_text::secrets::Secrets;

/// Most rows one statement may return (the sink reads at most a batch: 10,000 rows).
pub const MAX_ROWS_PER_STATEMENT: usize = 100_000;
/// Most bytes of column values (plus a per-column overhead) kept from one statement's rows.
pub const MAX_RESULT_BYTES: usize = 16 << 20;
/// Most distinct server parameters (ParameterStatus) a session keeps; a real server sends ~15.
pub const MAX_SERVER_PARAMS: usize = 64;
/// Largest ParameterStatus (name and value) accepted.
pub const MAX_PARAM_BYTES: usize = 4096;
/// How long Drop waits to write Terminate to a healthy connection.
const TERMINATE_DEADLINE: Duration = Duration::from_secs(1);

/// The result of one statement: rows in text format (`None` = SQL NULL) and the command tag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryResult {
    pub rows: Vec<Vec<Option<String>>>,
    pub tag: String,
}

/// One open session.
pub struct Connection {
    pub(super) io: BufReader<Stream>,
    broken: bool,
    /// Last ReadyForQuery status: `I` idle, `T` in a transaction, `E` failed transaction.
    pub(super) tx_status: u8,
    server_params: BTreeMap<String, String>,
    pub(super) backend_pid: i32,
    io_timeout: Duration,
    /// AuthenticationOk was received: before it, nothing but authentication is accepted.
    pub(super) authenticated: bool,
    /// The password's forms, hidden from what the server says during startup
    /// (`auth::handshake_secrets`); empty (and the forms wiped) once startup ends.
    hidden: Secrets,
}

impl Connection {
    /// Opens a session: TCP, optional TLS, startup, authentication, until ReadyForQuery, all
    /// before one deadline (`connect_timeout`). No error it returns quotes the password (or
    /// its encoded forms), whatever the server says, a TLS certificate's names included.
    pub fn connect(p: &ConnectParams, password: Option<&[u8]>) -> Result<Connection, DbError> {
        let hidden = auth::handshake_secrets(password, Some(&p.user));
        let res = Connection::open(p, password, &hidden);
        res.map_err(|e| e.hidden(&hidden))
    }

    fn open(
        p: &ConnectParams,
        password: Option<&[u8]>,
        hidden: &Secrets,
    ) -> Result<Connection, DbError> {
        let deadline = Instant::now() + p.connect_timeout;
        let tcp = DeadlineTcp::connect(&p.host, p.port, deadline)?;
        let stream = match p.tls {
            TlsMode::Disable => Stream::Plain(tcp),
            TlsMode::VerifyFull => Stream::Tls(Box::new(start_tls(tcp, p)?)),
        };
        let mut conn = Connection {
            io: BufReader::with_capacity(64 * 1024, stream),
            broken: false,
            tx_status: b'I',
            server_params: BTreeMap::new(),
            backend_pid: 0,
            io_timeout: p.io_timeout,
            authenticated: false,
            hidden: hidden.clone(),
        };
        let res = conn.startup(p, password);
        // The forms are wiped as they drop.
        conn.hidden = Secrets::new();
        // Invariant: a connection that failed startup is never written again (no Terminate).
        res.map_err(|e| conn.fail(e))?;
        Ok(conn)
    }

    /// True when the connection must not be used again.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Transaction status from the last ReadyForQuery (`I`, `T` or `E`).
    pub fn tx_status(&self) -> u8 {
        self.tx_status
    }

    /// A server parameter reported by the server, e.g. `server_version` (peer text: wrap it in
    /// [`PeerText`] before showing it).
    pub fn server_param(&self, name: &str) -> Option<&str> {
        self.server_params.get(name).map(String::as_str)
    }

    /// The backend's process ID (as `pg_backend_pid()` reports it).
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// Runs one or more statements with the simple query protocol; returns one result per
    /// statement. The first error is returned after the server is ready again. The whole round
    /// trip must finish within `io_timeout`.
    pub fn simple(&mut self, sql: &str) -> Result<Vec<QueryResult>, DbError> {
        self.usable()?;
        let mut out = Vec::new();
        Msg::new(b'Q').cstr(sql).finish_into(&mut out)?;
        self.round_trip(&out)
    }

    /// Runs one statement with the extended protocol and text parameters (`None` = NULL),
    /// within `io_timeout` for the whole round trip.
    pub fn query(&mut self, sql: &str, params: &[Option<&str>]) -> Result<QueryResult, DbError> {
        self.usable()?;
        let nparams = i16::try_from(params.len())
            .map_err(|_| DbError::Protocol("too many parameters".into()))?;
        let mut out = Vec::with_capacity(
            sql.len()
                + 64
                + params
                    .iter()
                    .map(|p| p.map_or(0, str::len) + 4)
                    .sum::<usize>(),
        );
        Msg::new(b'P')
            .cstr("")
            .cstr(sql)
            .i16(0)
            .finish_into(&mut out)?;
        let mut bind = Msg::new(b'B').cstr("").cstr("").i16(0).i16(nparams);
        for p in params {
            bind = match p {
                None => bind.i32(-1),
                Some(v) => {
                    let len = i32::try_from(v.len())
                        .map_err(|_| DbError::Protocol("parameter larger than 2 GiB".into()))?;
                    bind.i32(len).bytes(v.as_bytes())
                }
            };
        }
        bind.i16(0).finish_into(&mut out)?;
        Msg::new(b'E').cstr("").i32(0).finish_into(&mut out)?;
        Msg::new(b'S').finish_into(&mut out)?;
        let mut results = self.round_trip(&out)?;
        Ok(results.pop().unwrap_or_default())
    }

    fn usable(&self) -> Result<(), DbError> {
        if self.broken {
            return Err(DbError::Connection("connection is broken".into()));
        }
        Ok(())
    }

    /// Sends `out` and collects the results, all before one deadline. Any failure but a
    /// non-fatal server error (reported after ReadyForQuery, so the stream is in step) breaks
    /// the connection.
    fn round_trip(&mut self, out: &[u8]) -> Result<Vec<QueryResult>, DbError> {
        self.io
            .get_mut()
            .set_deadline(Instant::now() + self.io_timeout);
        let res = self.send(out).and_then(|_| self.collect_results());
        match res {
            Err(DbError::Server(e)) if !e.is_fatal() => Err(DbError::Server(e)),
            Err(e) => Err(self.fail(e)),
            ok => ok,
        }
    }

    /// Reads until ReadyForQuery, gathering rows and command tags, within the row and byte
    /// limits.
    fn collect_results(&mut self) -> Result<Vec<QueryResult>, DbError> {
        let mut results = Vec::new();
        let mut current = QueryResult::default();
        let mut first_error: Option<ServerError> = None;
        let (mut rows, mut bytes) = (0usize, 0usize);
        loop {
            let msg = match self.read_message() {
                Ok(m) => m,
                // A FATAL error followed by the server closing the socket: report the error.
                Err(e) => return Err(first_error.map(DbError::Server).unwrap_or(e)),
            };
            match msg {
                BackendMessage::ParseComplete
                | BackendMessage::BindComplete
                | BackendMessage::NoData
                | BackendMessage::ParameterDescription
                | BackendMessage::RowDescription => {}
                BackendMessage::DataRow(row) => {
                    rows += 1;
                    bytes += row
                        .iter()
                        .map(|c| c.as_ref().map_or(0, String::len) + 24)
                        .sum::<usize>();
                    if rows > MAX_ROWS_PER_STATEMENT || bytes > MAX_RESULT_BYTES {
                        return Err(DbError::Protocol(format!(
                            "the server sent more than {MAX_ROWS_PER_STATEMENT} rows or \
                             {MAX_RESULT_BYTES} bytes for one statement"
                        )));
                    }
                    current.rows.push(row);
                }
                BackendMessage::CommandComplete(tag) => {
                    current.tag = tag;
                    results.push(std::mem::take(&mut current));
                }
                BackendMessage::EmptyQueryResponse => results.push(std::mem::take(&mut current)),
                BackendMessage::ErrorResponse(e) => {
                    if e.is_fatal() {
                        return Err(DbError::Server(e));
                    }
                    first_error.get_or_insert(e);
                    current = QueryResult::default();
                }
                BackendMessage::ReadyForQuery(status) => {
                    self.tx_status = status;
                    return match first_error {
                        Some(e) => Err(DbError::Server(e)),
                        None => Ok(results),
                    };
                }
                BackendMessage::Copy => {
                    return Err(DbError::Protocol("copy is not supported".into()))
                }
                other => return Err(DbError::Protocol(format!("unexpected {}", other.name()))),
            }
        }
    }

    /// Marks the connection broken and passes the error through.
    pub(super) fn fail(&mut self, e: DbError) -> DbError {
        self.broken = true;
        e
    }

    pub(super) fn send(&mut self, bytes: &[u8]) -> Result<(), DbError> {
        let stream = self.io.get_mut();
        if let Err(e) = stream.write_all(bytes).and_then(|_| stream.flush()) {
            self.broken = true;
            return Err(io_err("write", e));
        }
        Ok(())
    }

    /// Reads one backend message, consuming asynchronous ones (notices, parameter status,
    /// notifications) on the way. Every error here breaks the connection.
    pub(super) fn read_message(&mut self) -> Result<BackendMessage, DbError> {
        let res = self.read_message_inner();
        res.map_err(|e| self.fail(e))
    }

    fn read_message_inner(&mut self) -> Result<BackendMessage, DbError> {
        loop {
            let mut head = [0u8; 5];
            self.io
                .read_exact(&mut head)
                .map_err(|e| io_err("read", e))?;
            let len = codec::body_len(head)?;
            if head[0] == b'S' && len > MAX_PARAM_BYTES {
                return Err(DbError::Protocol(format!(
                    "parameter status larger than {MAX_PARAM_BYTES} bytes"
                )));
            }
            let mut body = vec![0u8; len];
            self.io
                .read_exact(&mut body)
                .map_err(|e| io_err("read", e))?;
            match BackendMessage::parse_hiding(head[0], &body, &self.hidden)? {
                BackendMessage::NoticeResponse(n) => {
                    log::debug!(
                        "relational sink: server notice {}",
                        PeerText::with_limit(&n.code, 16)
                    );
                }
                BackendMessage::ParameterStatus { .. } if !self.authenticated => {
                    return Err(DbError::Protocol(
                        "parameter status before authentication completed".into(),
                    ));
                }
                BackendMessage::ParameterStatus { name, value } => {
                    if self.server_params.len() >= MAX_SERVER_PARAMS
                        && !self.server_params.contains_key(&name)
                    {
                        return Err(DbError::Protocol(format!(
                            "the server sent more than {MAX_SERVER_PARAMS} parameters"
                        )));
                    }
                    self.server_params.insert(name, value);
                }
                BackendMessage::NotificationResponse => {} // LISTEN is never used.
                m => return Ok(m),
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !self.broken {
            // Terminate: polite goodbye, bounded in time; errors are irrelevant now.
            let stream = self.io.get_mut();
            stream.set_deadline(Instant::now() + TERMINATE_DEADLINE);
            let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
            let _ = stream.flush();
        }
    }
}

/// SSLRequest, then a rustls handshake that verifies chain and host name, all before the
/// stream's deadline.
fn start_tls(
    mut tcp: DeadlineTcp,
    p: &ConnectParams,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, DeadlineTcp>, DbError> {
    let mut out = Vec::new();
    Msg::untagged()
        .i32(SSL_REQUEST_CODE)
        .finish_into(&mut out)?;
    tcp.write_all(&out).map_err(|e| io_err("tls request", e))?;
    // Exactly one byte, read unbuffered: anything the server sends before the handshake must
    // not be mistaken for protected data.
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .map_err(|e| io_err("tls request", e))?;
    match answer[0] {
        b'S' => {}
        b'N' => {
            return Err(DbError::Connection(
                "server does not accept tls (tls_mode verify_full requires it)".into(),
            ))
        }
        _ => {
            return Err(DbError::Protocol(
                "unexpected answer to the tls request".into(),
            ))
        }
    }
    tls_handshake(tcp, p.tls_config.clone(), &p.host)
}
