//! A small, synchronous PostgreSQL client (frontend/backend protocol 3.0) on `std::net`.
//!
//! Why in-tree: the runner must stay free of an async runtime, and the popular sync `postgres`
//! crate is a wrapper that embeds tokio. The relational sink needs only a narrow slice of the
//! protocol, implemented here and nothing more:
//! - startup over TCP, optionally upgraded to TLS (SSLRequest + rustls, certificate and host
//!   name verified);
//! - authentication: trust, cleartext password, MD5, SCRAM-SHA-256 (see [`super::auth`]);
//!   Kerberos, GSSAPI, SSPI and certificate authentication are refused with a clear error;
//! - the simple query protocol (for `BEGIN`, `COMMIT`, `SAVEPOINT`, `SET`, DDL);
//! - the extended query protocol with text-format parameters and results (unnamed statement and
//!   portal; one Parse/Bind/Execute/Sync round trip per statement);
//! - ErrorResponse with SQLSTATE; NoticeResponse, ParameterStatus and NotificationResponse are
//!   consumed.
//!
//! Not supported: COPY, binary formats, cancellation requests, multiple hosts, Unix sockets.
//!
//! Failure model: any I/O error, timeout, protocol violation or FATAL server error marks the
//! connection broken ([`Connection::is_broken`]); the caller drops it and connects anew. A
//! non-fatal server error leaves the connection usable after the server's ReadyForQuery.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use super::auth;

/// Largest backend message accepted (DataRows of this sink are small; a larger length means a
/// corrupt stream or a hostile server).
const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Protocol 3.0.
const PROTOCOL_VERSION: i32 = 196_608;
const SSL_REQUEST_CODE: i32 = 80_877_103;

/// How the connection is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP (the config allows it only for loopback hosts).
    Disable,
    /// TLS required; the certificate chain and the host name are verified.
    VerifyFull,
}

/// Everything needed to open a connection. Holds no secret: the password is resolved by the
/// caller at connect time and passed separately.
#[derive(Clone)]
pub struct ConnectParams {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub database: String,
    pub application_name: String,
    pub tls: TlsMode,
    /// Trust anchors for `VerifyFull` (from the configured CA file or the system store).
    pub tls_config: Option<Arc<rustls::ClientConfig>>,
    pub connect_timeout: Duration,
    /// Read/write timeout of the socket: a silent network outage surfaces as an error.
    pub io_timeout: Duration,
}

impl fmt::Debug for ConnectParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectParams")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// An error response from the server. `message` comes from the server's `M` field; the `D`
/// (detail) field is never kept because it can quote row values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// `ERROR`, `FATAL` or `PANIC` (the non-localized `V` field when present).
    pub severity: String,
    /// SQLSTATE, e.g. `42P01`.
    pub code: String,
    pub message: String,
}

impl ServerError {
    pub fn is_fatal(&self) -> bool {
        self.severity == "FATAL" || self.severity == "PANIC"
    }
}

/// A database client error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbError {
    /// The connection could not be opened or was lost (I/O error, timeout, TLS failure, server
    /// closed it). Nothing about an in-flight transaction is known.
    Connection(String),
    /// The server answered with an error.
    Server(ServerError),
    /// The server broke the protocol or asked for something unsupported.
    Protocol(String),
}

impl DbError {
    /// The SQLSTATE of a server error.
    pub fn code(&self) -> Option<&str> {
        match self {
            DbError::Server(e) => Some(&e.code),
            _ => None,
        }
    }
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DbError::Connection(m) => write!(f, "connection: {m}"),
            DbError::Protocol(m) => write!(f, "protocol: {m}"),
            DbError::Server(e) => {
                write!(f, "server {} {}", e.severity.to_lowercase(), e.code)?;
                if let Some(name) = condition_name(&e.code) {
                    write!(f, " ({name})")?;
                }
                if message_is_safe(&e.code) {
                    write!(f, ": {}", e.message)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for DbError {}

/// True when the server's message text cannot quote row data: connection, authentication,
/// catalog, resource and operator classes. Data-exception and constraint messages (classes 22,
/// 23) may echo values, so only their SQLSTATE is shown.
fn message_is_safe(code: &str) -> bool {
    matches!(
        code.get(..2),
        Some("08" | "28" | "3D" | "3F" | "40" | "42" | "53" | "55" | "57" | "58" | "25" | "0A")
    ) && !matches!(code, "42804")
}

/// Condition names of the SQLSTATEs this sink meets most often (PostgreSQL appendix A).
pub fn condition_name(code: &str) -> Option<&'static str> {
    Some(match code {
        "08000" => "connection_exception",
        "08003" => "connection_does_not_exist",
        "08006" => "connection_failure",
        "08P01" => "protocol_violation",
        "0A000" => "feature_not_supported",
        "22001" => "string_data_right_truncation",
        "22003" => "numeric_value_out_of_range",
        "22007" => "invalid_datetime_format",
        "22008" => "datetime_field_overflow",
        "22021" => "character_not_in_repertoire",
        "22P02" => "invalid_text_representation",
        "22P05" => "untranslatable_character",
        "23502" => "not_null_violation",
        "23503" => "foreign_key_violation",
        "23505" => "unique_violation",
        "23514" => "check_violation",
        "25P02" => "in_failed_sql_transaction",
        "28000" => "invalid_authorization_specification",
        "28P01" => "invalid_password",
        "3D000" => "invalid_catalog_name",
        "3F000" => "invalid_schema_name",
        "40001" => "serialization_failure",
        "40P01" => "deadlock_detected",
        "42501" => "insufficient_privilege",
        "42601" => "syntax_error",
        "42703" => "undefined_column",
        "42804" => "datatype_mismatch",
        "42P01" => "undefined_table",
        "42P10" => "invalid_column_reference",
        "53000" => "insufficient_resources",
        "53100" => "disk_full",
        "53300" => "too_many_connections",
        "54000" => "program_limit_exceeded",
        "55P03" => "lock_not_available",
        "57014" => "query_canceled",
        "57P01" => "admin_shutdown",
        "57P02" => "crash_shutdown",
        "57P03" => "cannot_connect_now",
        _ => return None,
    })
}

/// The result of one statement: rows in text format (`None` = SQL NULL) and the command tag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryResult {
    pub rows: Vec<Vec<Option<String>>>,
    pub tag: String,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// One open session.
pub struct Connection {
    io: BufReader<Stream>,
    broken: bool,
    /// Last ReadyForQuery status: `I` idle, `T` in a transaction, `E` failed transaction.
    tx_status: u8,
    server_params: BTreeMap<String, String>,
    backend_pid: i32,
}

/// Builds a frontend message: tag, length, body.
struct Msg(Vec<u8>, usize);

impl Msg {
    fn new(tag: u8) -> Msg {
        Msg(vec![tag, 0, 0, 0, 0], 1)
    }
    /// A startup-phase message (no tag byte).
    fn untagged() -> Msg {
        Msg(vec![0, 0, 0, 0], 0)
    }
    fn i16(mut self, v: i16) -> Msg {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Msg {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn cstr(mut self, s: &str) -> Msg {
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self
    }
    fn bytes(mut self, b: &[u8]) -> Msg {
        self.0.extend_from_slice(b);
        self
    }
    /// Finishes the message into `out`, filling in the length.
    fn finish_into(mut self, out: &mut Vec<u8>) -> Result<(), DbError> {
        // Invariant: field 1 is where the length field starts (after the tag, if any).
        let start = self.1;
        let len = i32::try_from(self.0.len() - start)
            .map_err(|_| DbError::Protocol("message larger than 2 GiB".into()))?;
        self.0[start..start + 4].copy_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&self.0);
        Ok(())
    }
}

/// Reads big-endian fields out of a backend message body.
struct Body<'a> {
    b: &'a [u8],
}

impl<'a> Body<'a> {
    fn i16(&mut self) -> Result<i16, DbError> {
        let (h, t) = self.split(2)?;
        self.b = t;
        Ok(i16::from_be_bytes([h[0], h[1]]))
    }
    fn i32(&mut self) -> Result<i32, DbError> {
        let (h, t) = self.split(4)?;
        self.b = t;
        Ok(i32::from_be_bytes([h[0], h[1], h[2], h[3]]))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DbError> {
        let (h, t) = self.split(n)?;
        self.b = t;
        Ok(h)
    }
    fn cstr(&mut self) -> Result<&'a str, DbError> {
        let end = self
            .b
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| DbError::Protocol("unterminated string".into()))?;
        let s = std::str::from_utf8(&self.b[..end])
            .map_err(|_| DbError::Protocol("string is not utf-8".into()))?;
        self.b = &self.b[end + 1..];
        Ok(s)
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
    fn split(&self, n: usize) -> Result<(&'a [u8], &'a [u8]), DbError> {
        if self.b.len() < n {
            return Err(DbError::Protocol("truncated message".into()));
        }
        Ok(self.b.split_at(n))
    }
}

fn parse_error_fields(body: &[u8]) -> Result<ServerError, DbError> {
    let mut b = Body { b: body };
    let mut severity = String::new();
    let mut severity_v = None;
    let mut code = String::new();
    let mut message = String::new();
    loop {
        let kind = b.take(1)?[0];
        if kind == 0 {
            break;
        }
        let value = b.cstr()?;
        match kind {
            b'S' => severity = value.to_string(),
            b'V' => severity_v = Some(value.to_string()),
            b'C' => code = value.to_string(),
            b'M' => message = value.chars().take(512).collect(),
            _ => {} // D (detail), H (hint), W (where) etc. are dropped: they may quote data.
        }
    }
    Ok(ServerError {
        severity: severity_v.unwrap_or(severity),
        code,
        message,
    })
}

fn io_err(phase: &str, e: io::Error) -> DbError {
    let what = match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "timed out".to_string(),
        io::ErrorKind::UnexpectedEof => "server closed the connection".to_string(),
        _ => e.to_string(),
    };
    DbError::Connection(format!("{phase}: {what}"))
}

impl Connection {
    /// Opens a session: TCP, optional TLS, startup, authentication, until ReadyForQuery.
    pub fn connect(p: &ConnectParams, password: Option<&[u8]>) -> Result<Connection, DbError> {
        let addrs: Vec<_> = (p.host.as_str(), p.port)
            .to_socket_addrs()
            .map_err(|e| DbError::Connection(format!("resolve {}: {e}", p.host)))?
            .collect();
        let mut last = DbError::Connection(format!("resolve {}: no address", p.host));
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, p.connect_timeout) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = io_err(&format!("connect {}:{}", p.host, p.port), e),
            }
        }
        let tcp = tcp.ok_or(last)?;
        let _ = tcp.set_nodelay(true);
        // The startup phase is bounded by the connect timeout, later I/O by the I/O timeout.
        tcp.set_read_timeout(Some(p.connect_timeout))
            .and_then(|_| tcp.set_write_timeout(Some(p.connect_timeout)))
            .map_err(|e| io_err("socket options", e))?;

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
        };
        conn.startup(p, password)?;
        let tcp = match conn.io.get_ref() {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        };
        tcp.set_read_timeout(Some(p.io_timeout))
            .and_then(|_| tcp.set_write_timeout(Some(p.io_timeout)))
            .map_err(|e| io_err("socket options", e))?;
        Ok(conn)
    }

    fn startup(&mut self, p: &ConnectParams, password: Option<&[u8]>) -> Result<(), DbError> {
        let mut out = Vec::new();
        Msg::untagged()
            .i32(PROTOCOL_VERSION)
            .cstr("user")
            .cstr(&p.user)
            .cstr("database")
            .cstr(&p.database)
            .cstr("application_name")
            .cstr(&p.application_name)
            .cstr("client_encoding")
            .cstr("UTF8")
            .bytes(&[0])
            .finish_into(&mut out)?;
        self.send(&out)?;

        let mut scram: Option<auth::Scram> = None;
        let mut scram_done = false;
        loop {
            let (tag, body) = self.read_message()?;
            let mut b = Body { b: &body };
            match tag {
                b'R' => {
                    let code = b.i32()?;
                    let need_password = || {
                        password.ok_or_else(|| {
                            DbError::Protocol(
                                "the server requires a password but sink.password_env is not set"
                                    .into(),
                            )
                        })
                    };
                    let mut out = Vec::new();
                    match code {
                        0 => {
                            if scram.is_some() && !scram_done {
                                return Err(self.fail(DbError::Protocol(
                                    "server ended scram authentication without proving the password"
                                        .into(),
                                )));
                            }
                        }
                        3 => Msg::new(b'p')
                            .bytes(need_password()?)
                            .bytes(&[0])
                            .finish_into(&mut out)?,
                        5 => {
                            let salt: [u8; 4] = b.take(4)?.try_into().expect("4 bytes");
                            Msg::new(b'p')
                                .cstr(&auth::md5_password(&p.user, need_password()?, &salt))
                                .finish_into(&mut out)?
                        }
                        10 => {
                            let mut mechanisms = Vec::new();
                            loop {
                                let m = b.cstr()?;
                                if m.is_empty() {
                                    break;
                                }
                                mechanisms.push(m.to_string());
                            }
                            if !mechanisms.iter().any(|m| m == "SCRAM-SHA-256") {
                                return Err(self.fail(DbError::Protocol(format!(
                                    "server offers only unsupported sasl mechanisms: {}",
                                    mechanisms.join(", ")
                                ))));
                            }
                            need_password()?;
                            let s =
                                auth::Scram::new("", auth::new_nonce().map_err(DbError::Protocol)?);
                            let first = s.client_first();
                            Msg::new(b'p')
                                .cstr("SCRAM-SHA-256")
                                .i32(first.len() as i32)
                                .bytes(first.as_bytes())
                                .finish_into(&mut out)?;
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram.as_mut().ok_or_else(|| {
                                DbError::Protocol("sasl continue without sasl start".into())
                            })?;
                            let server_first = std::str::from_utf8(b.rest())
                                .map_err(|_| DbError::Protocol("sasl data is not utf-8".into()))?;
                            let fin = s
                                .client_final(need_password()?, server_first)
                                .map_err(DbError::Protocol)?;
                            Msg::new(b'p').bytes(fin.as_bytes()).finish_into(&mut out)?;
                        }
                        12 => {
                            let s = scram.as_ref().ok_or_else(|| {
                                DbError::Protocol("sasl final without sasl start".into())
                            })?;
                            let server_final = std::str::from_utf8(b.rest())
                                .map_err(|_| DbError::Protocol("sasl data is not utf-8".into()))?;
                            s.verify_server_final(server_final)
                                .map_err(DbError::Protocol)?;
                            scram_done = true;
                        }
                        other => {
                            let name = match other {
                                2 => "kerberos v5",
                                6 => "scm credentials",
                                7 | 8 => "gssapi",
                                9 => "sspi",
                                _ => "unknown",
                            };
                            return Err(self.fail(DbError::Protocol(format!(
                                "server requires unsupported authentication method {other} ({name})"
                            ))));
                        }
                    }
                    if !out.is_empty() {
                        self.send(&out)?;
                    }
                }
                b'K' => {
                    self.backend_pid = b.i32()?;
                }
                b'Z' => {
                    self.tx_status = b.take(1)?[0];
                    return Ok(());
                }
                b'E' => {
                    let e = parse_error_fields(&body)?;
                    self.broken = true;
                    return Err(DbError::Server(e));
                }
                b'v' => {} // NegotiateProtocolVersion: we asked for nothing optional.
                other => {
                    return Err(self.fail(DbError::Protocol(format!(
                        "unexpected message '{}' during startup",
                        other as char
                    ))))
                }
            }
        }
    }

    /// True when the connection must not be used again.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Transaction status from the last ReadyForQuery (`I`, `T` or `E`).
    pub fn tx_status(&self) -> u8 {
        self.tx_status
    }

    /// A server parameter reported at startup, e.g. `server_version`.
    pub fn server_param(&self, name: &str) -> Option<&str> {
        self.server_params.get(name).map(String::as_str)
    }

    /// The backend's process ID (as `pg_backend_pid()` reports it).
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// Runs one or more statements with the simple query protocol; returns one result per
    /// statement. The first error is returned after the server is ready again.
    pub fn simple(&mut self, sql: &str) -> Result<Vec<QueryResult>, DbError> {
        self.usable()?;
        let mut out = Vec::new();
        Msg::new(b'Q').cstr(sql).finish_into(&mut out)?;
        self.send(&out)?;
        self.collect_results()
    }

    /// Runs one statement with the extended protocol and text parameters (`None` = NULL).
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
        self.send(&out)?;
        let mut results = self.collect_results()?;
        Ok(results.pop().unwrap_or_default())
    }

    fn usable(&self) -> Result<(), DbError> {
        if self.broken {
            return Err(DbError::Connection("connection is broken".into()));
        }
        Ok(())
    }

    /// Reads until ReadyForQuery, gathering rows and command tags.
    fn collect_results(&mut self) -> Result<Vec<QueryResult>, DbError> {
        let mut results = Vec::new();
        let mut current = QueryResult::default();
        let mut first_error: Option<ServerError> = None;
        loop {
            let (tag, body) = match self.read_message() {
                Ok(m) => m,
                // A FATAL error followed by the server closing the socket: report the error.
                Err(e) => return Err(first_error.map(DbError::Server).unwrap_or(e)),
            };
            let mut b = Body { b: &body };
            match tag {
                b'1' | b'2' | b'n' | b's' | b't' => {} // parse/bind complete, no data, suspended, param desc
                b'T' => {} // RowDescription: every column is text format.
                b'D' => {
                    let n = b.i16()?;
                    let mut row = Vec::with_capacity(n.max(0) as usize);
                    for _ in 0..n {
                        let len = b.i32()?;
                        if len < 0 {
                            row.push(None);
                        } else {
                            let v = b.take(len as usize)?;
                            row.push(Some(String::from_utf8(v.to_vec()).map_err(|_| {
                                self.fail(DbError::Protocol("column value is not utf-8".into()))
                            })?));
                        }
                    }
                    current.rows.push(row);
                }
                b'C' => {
                    current.tag = b.cstr()?.to_string();
                    results.push(std::mem::take(&mut current));
                }
                b'I' => results.push(std::mem::take(&mut current)), // empty query
                b'E' => {
                    let e = parse_error_fields(&body)?;
                    if e.is_fatal() {
                        self.broken = true;
                        return Err(DbError::Server(e));
                    }
                    first_error.get_or_insert(e);
                    current = QueryResult::default();
                }
                b'Z' => {
                    self.tx_status = b.take(1)?[0];
                    return match first_error {
                        Some(e) => Err(DbError::Server(e)),
                        None => Ok(results),
                    };
                }
                b'G' | b'H' | b'W' => {
                    return Err(self.fail(DbError::Protocol("copy is not supported".into())))
                }
                other => {
                    return Err(self.fail(DbError::Protocol(format!(
                        "unexpected message '{}'",
                        other as char
                    ))))
                }
            }
        }
    }

    /// Marks the connection broken and passes the error through.
    fn fail(&mut self, e: DbError) -> DbError {
        self.broken = true;
        e
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), DbError> {
        let stream = self.io.get_mut();
        if let Err(e) = stream.write_all(bytes).and_then(|_| stream.flush()) {
            self.broken = true;
            return Err(io_err("write", e));
        }
        Ok(())
    }

    /// Reads one backend message, consuming asynchronous ones (notices, parameter status,
    /// notifications) on the way.
    fn read_message(&mut self) -> Result<(u8, Vec<u8>), DbError> {
        loop {
            let mut head = [0u8; 5];
            if let Err(e) = self.io.read_exact(&mut head) {
                self.broken = true;
                return Err(io_err("read", e));
            }
            let tag = head[0];
            let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
            if len < 4 || len as usize - 4 > MAX_MESSAGE_BYTES {
                return Err(self.fail(DbError::Protocol(format!("invalid message length {len}"))));
            }
            let mut body = vec![0u8; len as usize - 4];
            if let Err(e) = self.io.read_exact(&mut body) {
                self.broken = true;
                return Err(io_err("read", e));
            }
            match tag {
                b'N' => {
                    if let Ok(n) = parse_error_fields(&body) {
                        log::debug!("relational sink: server notice {}", n.code);
                    }
                }
                b'S' => {
                    let mut b = Body { b: &body };
                    if let (Ok(k), Ok(v)) = (b.cstr(), b.cstr()) {
                        self.server_params.insert(k.to_string(), v.to_string());
                    }
                }
                b'A' => {} // LISTEN/NOTIFY is never used by this client.
                _ => return Ok((tag, body)),
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !self.broken {
            // Terminate: polite goodbye; errors are irrelevant now.
            let _ = self.io.get_mut().write_all(&[b'X', 0, 0, 0, 4]);
            let _ = self.io.get_mut().flush();
        }
    }
}

/// SSLRequest, then a rustls handshake that verifies chain and host name.
fn start_tls(
    mut tcp: TcpStream,
    p: &ConnectParams,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, DbError> {
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
    let config = p
        .tls_config
        .clone()
        .ok_or_else(|| DbError::Protocol("tls requested without trust anchors".into()))?;
    let name = rustls::pki_types::ServerName::try_from(p.host.clone())
        .map_err(|_| DbError::Connection(format!("tls: invalid server name {}", p.host)))?;
    let mut conn = rustls::ClientConnection::new(config, name)
        .map_err(|e| DbError::Connection(format!("tls: {e}")))?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            // rustls reports certificate problems as InvalidData wrapping its own error.
            return Err(DbError::Connection(format!("tls handshake: {e}")));
        }
    }
    Ok(rustls::StreamOwned::new(conn, tcp))
}

/// Builds the rustls client configuration: trust anchors from a PEM file, or the system store.
pub fn tls_client_config(
    ca_file: Option<&std::path::Path>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| format!("read tls_ca_file {}: {e}", path.display()))?;
            let mut added = 0;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                let cert = cert
                    .map_err(|e| format!("tls_ca_file {}: not valid pem: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
                added += 1;
            }
            if added == 0 {
                return Err(format!(
                    "tls_ca_file {}: holds no certificate",
                    path.display()
                ));
            }
        }
        None => {
            let certs = rustls_native_certs::load_native_certs()
                .map_err(|e| format!("load the system trust store: {e}"))?;
            let (_, _ignored) = roots.add_parsable_certificates(certs);
            if roots.is_empty() {
                return Err("the system trust store holds no usable certificate".into());
            }
        }
    }
    // One explicit provider: no dependence on a process-wide default (see TESTING.md).
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("tls: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_framed_with_their_length() {
        let mut out = Vec::new();
        Msg::new(b'Q').cstr("BEGIN").finish_into(&mut out).unwrap();
        assert_eq!(out, b"Q\0\0\0\x0aBEGIN\0");
        let mut out = Vec::new();
        Msg::untagged()
            .i32(SSL_REQUEST_CODE)
            .finish_into(&mut out)
            .unwrap();
        assert_eq!(out, [0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f]);
    }

    #[test]
    fn error_fields_drop_detail() {
        let body = b"SERROR\0VERROR\0C22P02\0Minvalid input syntax for type json\0DToken \"secret\" is invalid.\0\0";
        let e = parse_error_fields(body).unwrap();
        assert_eq!(e.code, "22P02");
        assert_eq!(e.severity, "ERROR");
        let shown = DbError::Server(e).to_string();
        assert_eq!(shown, "server error 22P02 (invalid_text_representation)");
        assert!(!shown.contains("secret"));
        let e = ServerError {
            severity: "FATAL".into(),
            code: "28P01".into(),
            message: "password authentication failed for user \"app\"".into(),
        };
        assert_eq!(
            DbError::Server(e).to_string(),
            "server fatal 28P01 (invalid_password): password authentication failed for user \"app\""
        );
    }

    #[test]
    fn truncated_bodies_are_protocol_errors() {
        let mut b = Body { b: &[0, 1] };
        assert!(b.i32().is_err());
        let mut b = Body { b: b"abc" };
        assert!(b.cstr().is_err());
    }
}
