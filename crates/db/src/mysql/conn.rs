//! One MySQL/MariaDB session: connect (handshake v10, optional TLS, authentication under the
//! plugin allow-list), `COM_QUERY` with OK/ERR or a text result set, `COM_PING`, `COM_QUIT`.
//!
//! Each operation has ONE deadline (connect: TCP, TLS and authentication together; a query: the
//! whole round trip). Any I/O error, timeout, protocol violation or exceeded limit marks the
//! connection broken; a broken connection is never written to again. A server error that
//! leaves the stream in step (an ERR answering a query) keeps it usable.

use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

use super::auth::{AuthPolicy, Plugin};
use super::packet::{self as pk, Handshake, QueryHead};
use crate::error::{io_err, password_secrets, DbError};
use crate::params::{ConnectParams, TlsMode};
use crate::transport::{tls_handshake, DeadlineTcp, Stream};
use svc_text::peer::PeerText;
use svc_text::secrets::Secrets;

/// Most rows one statement may return.
pub const MAX_ROWS_PER_STATEMENT: usize = 100_000;
/// Most bytes of values (plus a per-column overhead) kept from one statement's rows.
pub const MAX_RESULT_BYTES: usize = 16 << 20;
/// Most packets of the authentication exchange after the client's response.
use svc_text::secret_bytes::SecretBytes;
const MAX_AUTH_PACKETS: usize = 4;
/// How long Drop waits to write COM_QUIT to a healthy connection.
const QUIT_DEADLINE: Duration = Duration::from_secs(1);
/// Largest packet the client announces it accepts (the server's `max_allowed_packet` bounds
/// what it sends; the reader enforces its own bound).
const CLIENT_MAX_PACKET: u32 = pk::MAX_PACKET_BYTES as u32;

const COM_QUIT: u8 = 0x01;
const COM_QUERY: u8 = 0x03;
const COM_PING: u8 = 0x0E;

/// The answer to one statement: rows in text form (`None` = SQL NULL), or the OK's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryResult {
    pub rows: Vec<Vec<Option<String>>>,
    pub affected_rows: u64,
}

/// One open session.
pub struct Connection {
    io: BufReader<Stream>,
    broken: bool,
    /// Server status flags from the last OK or EOF.
    status: u16,
    io_timeout: Duration,
    server_version: String,
    mariadb: bool,
    /// The password's forms, hidden from what the server says during connect
    /// (`db::error::password_secrets`); empty (and the forms wiped) once connected.
    hidden: Secrets,
}

/// How the client answered so far during authentication.
struct AuthState<'a> {
    plugin: Plugin,
    nonce: Vec<u8>,
    password: &'a [u8],
    tls: bool,
    switched: bool,
    /// The client asked for the server's RSA key (`allow_rsa_key_exchange`, plain TCP).
    key_requested: bool,
    /// The client answered full authentication (the password over TLS or RSA-sealed).
    full_sent: bool,
    /// A plugin of `require_auth` answered the server (in the handshake response or after a
    /// switch): an OK before that means the server asked for nothing the policy allows.
    answered: bool,
}

impl Connection {
    /// Opens a session before one deadline (`connect_timeout`): TCP, the server's handshake,
    /// TLS when `p.tls` asks for it, authentication with a plugin `policy` allows, then
    /// `SET NAMES utf8mb4`. No error it returns quotes the password (or its encoded forms),
    /// whatever the server says.
    pub fn connect(
        p: &ConnectParams,
        policy: &AuthPolicy,
        password: Option<&[u8]>,
    ) -> Result<Connection, DbError> {
        let hidden = password_secrets(password);
        let res = Connection::open(p, policy, password, &hidden);
        res.map_err(|e| e.hidden(&hidden))
    }

    fn open(
        p: &ConnectParams,
        policy: &AuthPolicy,
        password: Option<&[u8]>,
        hidden: &Secrets,
    ) -> Result<Connection, DbError> {
        let deadline = Instant::now() + p.connect_timeout;
        let mut tcp = DeadlineTcp::connect(&p.host, p.port, deadline)?;
        let mut seq = 0u8;
        // Unbuffered: nothing after the handshake may be read before TLS starts.
        let hello = pk::read_packet(&mut tcp, &mut seq)?;
        let h = Handshake::parse(&hello)?;
        let mut caps = pk::CLIENT_LONG_PASSWORD
            | pk::CLIENT_LONG_FLAG
            | pk::CLIENT_PROTOCOL_41
            | pk::CLIENT_TRANSACTIONS
            | pk::CLIENT_SECURE_CONNECTION
            | pk::CLIENT_PLUGIN_AUTH
            | pk::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA;
        if !p.database.is_empty() {
            caps |= pk::CLIENT_CONNECT_WITH_DB;
        }
        let stream = match p.tls {
            TlsMode::Disable => Stream::Plain(tcp),
            TlsMode::VerifyFull => {
                if h.capabilities & pk::CLIENT_SSL == 0 {
                    return Err(DbError::Connection(
                        "server does not accept tls (tls_mode verify_full requires it)".into(),
                    ));
                }
                caps |= pk::CLIENT_SSL;
                let mut out = Vec::new();
                pk::frame_into(&mut out, &login_head(caps), &mut seq);
                tcp.write_all(&out).map_err(|e| io_err("tls request", e))?;
                Stream::Tls(Box::new(tls_handshake(tcp, p.tls_config.clone(), &p.host)?))
            }
        };
        debug_assert_eq!(
            caps & (pk::CLIENT_LOCAL_FILES | pk::CLIENT_MULTI_STATEMENTS),
            0
        );
        let mut conn = Connection {
            io: BufReader::with_capacity(64 * 1024, stream),
            broken: false,
            status: h.status,
            io_timeout: p.io_timeout,
            server_version: hidden.scrub(&h.server_version).into_owned(),
            mariadb: h.mariadb,
            hidden: hidden.clone(),
        };
        let res = conn.authenticate(p, policy, password, &h, caps, seq);
        // Invariant: a connection that failed startup is never written again (no COM_QUIT).
        res.map_err(|e| conn.fail(e))?;
        // Still the connect deadline: the session is not ready before its character set is.
        conn.round_trip(COM_QUERY, b"SET NAMES utf8mb4", deadline)?;
        conn.hidden = Secrets::new();
        Ok(conn)
    }

    /// The server's version string (peer text).
    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    /// True when the server announced itself as MariaDB.
    pub fn is_mariadb(&self) -> bool {
        self.mariadb
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// True while the server reports an open transaction.
    pub fn in_transaction(&self) -> bool {
        self.status & pk::SERVER_STATUS_IN_TRANS != 0
    }

    /// True when the session's `sql_mode` has NO_BACKSLASH_ESCAPES (as of the last answer).
    pub fn no_backslash_escapes(&self) -> bool {
        self.status & pk::SERVER_STATUS_NO_BACKSLASH_ESCAPES != 0
    }

    /// `text` as a string literal of this session (utf8mb4; backslash escapes or not, as the
    /// server's last status said).
    pub fn quote(&self, text: &str) -> String {
        super::quote(text, self.no_backslash_escapes())
    }

    fn authenticate(
        &mut self,
        p: &ConnectParams,
        policy: &AuthPolicy,
        password: Option<&[u8]>,
        h: &Handshake,
        caps: u32,
        mut seq: u8,
    ) -> Result<(), DbError> {
        // The server's default plugin is a hint: when it is not allowed, the preferred allowed
        // plugin answers and the server switches to the account's plugin (checked again).
        let plugin = match policy.check(&h.plugin) {
            Ok(p) if p != Plugin::Ed25519 => p,
            _ => policy.preferred(),
        };
        let password = password.unwrap_or_default();
        let mut st = AuthState {
            plugin,
            nonce: h.nonce.clone(),
            password,
            tls: p.tls == TlsMode::VerifyFull,
            switched: false,
            key_requested: false,
            full_sent: false,
            answered: policy.allows(plugin),
        };
        let mut body = login_head(caps);
        body.extend_from_slice(p.user.as_bytes());
        body.push(0);
        // Only the preferred plugin may be named without being allowed (see `preferred`): it
        // answers with nothing.
        let answer = if policy.allows(plugin) {
            plugin.scramble(password, &st.nonce)
        } else {
            Vec::new()
        };
        pk::put_lenenc(&mut body, answer.len() as u64);
        body.extend_from_slice(&answer);
        if caps & pk::CLIENT_CONNECT_WITH_DB != 0 {
            body.extend_from_slice(p.database.as_bytes());
            body.push(0);
        }
        body.extend_from_slice(plugin.name().as_bytes());
        body.push(0);
        self.send_packet(&body, &mut seq)?;
        for _ in 0..MAX_AUTH_PACKETS {
            let packet = pk::read_packet(&mut self.io, &mut seq)?;
            if self.auth_step(policy, &mut st, &packet, &mut seq)? {
                return Ok(());
            }
        }
        Err(DbError::Protocol(
            "the server prolonged authentication beyond the expected exchange".into(),
        ))
    }

    /// One server packet of the authentication exchange; true once the server sent OK.
    fn auth_step(
        &mut self,
        policy: &AuthPolicy,
        st: &mut AuthState<'_>,
        packet: &[u8],
        seq: &mut u8,
    ) -> Result<bool, DbError> {
        match packet.first() {
            // An impostor needs no secret to say OK: a login no allowed plugin answered is
            // refused, as PostgreSQL's `require_auth` refuses a server asking for nothing.
            Some(0x00) if !st.answered => Err(DbError::Protocol(format!(
                "the server accepted the login before any plugin of require_auth ({}) answered \
                 it; refused",
                policy.names()
            ))),
            Some(0x00) => {
                self.status = pk::parse_ok(packet)?.status;
                Ok(true)
            }
            Some(0xFF) => Err(DbError::Server(pk::parse_err_hiding(packet, &self.hidden)?)),
            Some(0xFE) => {
                if st.switched {
                    return Err(DbError::Protocol(
                        "the server asked for a second authentication switch".into(),
                    ));
                }
                let mut c = pk::Cursor::new(&packet[1..], "authentication switch");
                let name = c.cstr(false)?;
                let name =
                    String::from_utf8_lossy(&name[..name.len().min(pk::MAX_PLUGIN_NAME_BYTES)]);
                let plugin = policy.check(&name).map_err(DbError::Protocol)?;
                let data = c.rest();
                // The challenge-response plugins' data ends with a NUL; Ed25519's 32 random
                // bytes are all nonce.
                let nonce = match plugin {
                    Plugin::Ed25519 => data,
                    _ => data.strip_suffix(&[0]).unwrap_or(data),
                };
                if nonce.len() != plugin.nonce_len() {
                    return Err(DbError::Protocol(format!(
                        "authentication switch nonce of {} bytes ({} expected)",
                        nonce.len(),
                        plugin.nonce_len()
                    )));
                }
                *st = AuthState {
                    plugin,
                    nonce: nonce.to_vec(),
                    switched: true,
                    answered: true,
                    ..*st
                };
                let answer = plugin.scramble(st.password, &st.nonce);
                self.send_packet(&answer, seq)?;
                Ok(false)
            }
            Some(0x01) if st.plugin == Plugin::CachingSha2 => {
                self.sha2_more_data(policy, st, &packet[1..], seq)
            }
            Some(b) => Err(DbError::Protocol(format!(
                "unexpected packet 0x{b:02x} during authentication"
            ))),
            None => Err(DbError::Protocol(
                "empty packet during authentication".into(),
            )),
        }
    }

    /// `caching_sha2_password`'s "more data" packet: fast authentication succeeded (3), full
    /// authentication needed (4: the password over TLS, or the RSA key asked for when
    /// allowed), or the server's RSA key (PEM) after the client asked for it.
    fn sha2_more_data(
        &mut self,
        policy: &AuthPolicy,
        st: &mut AuthState<'_>,
        data: &[u8],
        seq: &mut u8,
    ) -> Result<bool, DbError> {
        match data {
            // Fast authentication succeeded; OK follows.
            [0x03] if !st.key_requested && !st.full_sent => Ok(false),
            [0x04] if st.key_requested || st.full_sent => Err(DbError::Protocol(
                "the server asked for full authentication twice".into(),
            )),
            [0x04] if st.tls => {
                // Full authentication: the password inside the verified TLS session.
                let mut clear = SecretBytes::with_capacity(st.password.len() + 1);
                clear.expose_mut().extend_from_slice(st.password);
                clear.expose_mut().push(0);
                st.full_sent = true;
                self.send_secret_packet(clear.expose(), seq)?;
                Ok(false)
            }
            [0x04] if policy.rsa_key_exchange => {
                // Ask for the server's public key (unauthenticated: see the module docs).
                st.key_requested = true;
                self.send_packet(&[0x02], seq)?;
                Ok(false)
            }
            [0x04] => Err(DbError::Protocol(
                "caching_sha2_password full authentication needs tls (tls_mode verify_full) \
                 or the server's RSA key, which sink.allow_rsa_key_exchange does not allow; \
                 nothing was sent (log in once over tls to fill the server's cache)"
                    .into(),
            )),
            pem if st.key_requested && !st.full_sent && pem.starts_with(b"-----BEGIN ") => {
                st.full_sent = true;
                let sealed = super::auth::rsa_encrypt_password(st.password, &st.nonce, pem)
                    .map_err(DbError::Protocol)?;
                self.send_packet(&sealed, seq)?;
                Ok(false)
            }
            _ => Err(DbError::Protocol(
                "unexpected caching_sha2_password data from the server".into(),
            )),
        }
    }

    /// Runs one statement (`COM_QUERY`) within `io_timeout` for the whole round trip.
    pub fn query(&mut self, sql: &str) -> Result<QueryResult, DbError> {
        self.round_trip(COM_QUERY, sql.as_bytes(), Instant::now() + self.io_timeout)
    }

    /// `COM_PING`: the server answers OK.
    pub fn ping(&mut self) -> Result<(), DbError> {
        self.round_trip(COM_PING, b"", Instant::now() + self.io_timeout)
            .map(|_| ())
    }

    fn round_trip(
        &mut self,
        command: u8,
        arg: &[u8],
        deadline: Instant,
    ) -> Result<QueryResult, DbError> {
        if self.broken {
            return Err(DbError::Connection("connection is broken".into()));
        }
        self.io.get_mut().set_deadline(deadline);
        let mut body = Vec::with_capacity(arg.len() + 1);
        body.push(command);
        body.extend_from_slice(arg);
        let mut seq = 0u8;
        let res = self
            .send_packet(&body, &mut seq)
            .and_then(|_| self.read_answer(&mut seq));
        match res {
            // An ERR answering the statement leaves the stream in step.
            Err(DbError::Server(e)) => Err(DbError::Server(e)),
            Err(e) => Err(self.fail(e)),
            ok => ok,
        }
    }

    fn read_answer(&mut self, seq: &mut u8) -> Result<QueryResult, DbError> {
        let head = pk::read_packet(&mut self.io, seq)?;
        if head.first() == Some(&0xFF) {
            return Err(DbError::Server(pk::parse_err_hiding(&head, &self.hidden)?));
        }
        let columns = match pk::parse_query_head(&head)? {
            QueryHead::Ok(ok) => {
                self.status = ok.status;
                return Ok(QueryResult {
                    rows: Vec::new(),
                    affected_rows: ok.affected_rows,
                });
            }
            QueryHead::Err(e) => return Err(DbError::Server(e)),
            QueryHead::LocalInfile => {
                return Err(DbError::Protocol(
                    "the server asked to read a local file (LOAD DATA LOCAL INFILE); refused, \
                     and the connection is closed"
                        .into(),
                ))
            }
            QueryHead::Columns(n) => n,
        };
        for _ in 0..columns {
            let def = pk::read_packet(&mut self.io, seq)?;
            if def.first() == Some(&0xFF) {
                return Err(DbError::Protocol("error inside column definitions".into()));
            }
        }
        let eof = pk::read_packet(&mut self.io, seq)?;
        pk::parse_eof(&eof).ok_or_else(|| {
            DbError::Protocol("malformed result set (no end of column definitions)".into())
        })?;
        self.read_rows(columns, seq)
    }

    fn read_rows(&mut self, columns: usize, seq: &mut u8) -> Result<QueryResult, DbError> {
        let mut result = QueryResult::default();
        let mut bytes = 0usize;
        loop {
            let p = pk::read_packet(&mut self.io, seq)?;
            if let Some(status) = pk::parse_eof(&p) {
                self.status = status;
                return Ok(result);
            }
            if p.first() == Some(&0xFF) {
                return Err(DbError::Server(pk::parse_err_hiding(&p, &self.hidden)?));
            }
            let row = pk::parse_row(&p, columns)?;
            bytes += row
                .iter()
                .map(|c| c.as_ref().map_or(0, String::len) + 24)
                .sum::<usize>();
            if result.rows.len() >= MAX_ROWS_PER_STATEMENT || bytes > MAX_RESULT_BYTES {
                return Err(DbError::Protocol(format!(
                    "the server sent more than {MAX_ROWS_PER_STATEMENT} rows or \
                     {MAX_RESULT_BYTES} bytes for one statement"
                )));
            }
            result.rows.push(row);
        }
    }

    fn send_packet(&mut self, payload: &[u8], seq: &mut u8) -> Result<(), DbError> {
        let mut out = Vec::with_capacity(payload.len() + 8);
        pk::frame_into(&mut out, payload, seq);
        self.write_frames(&out)
    }

    /// [`Self::send_packet`] of a secret (the password): framed in a wiping owner, allocated
    /// once (a password is far below the 16 MiB frame limit, so one header is added).
    fn send_secret_packet(&mut self, payload: &[u8], seq: &mut u8) -> Result<(), DbError> {
        let mut out = SecretBytes::with_capacity(payload.len() + 8);
        pk::frame_into(out.expose_mut(), payload, seq);
        self.write_frames(out.expose())
    }

    fn write_frames(&mut self, out: &[u8]) -> Result<(), DbError> {
        let stream = self.io.get_mut();
        if let Err(e) = stream.write_all(out).and_then(|_| stream.flush()) {
            self.broken = true;
            return Err(io_err("write", e));
        }
        Ok(())
    }

    fn fail(&mut self, e: DbError) -> DbError {
        self.broken = true;
        e
    }
}

/// The first 32 bytes of SSLRequest and HandshakeResponse41: capabilities, the largest packet
/// accepted, utf8mb4, 23 reserved bytes (MariaDB's extended capabilities among them: none).
fn login_head(caps: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(128);
    b.extend_from_slice(&caps.to_le_bytes());
    b.extend_from_slice(&CLIENT_MAX_PACKET.to_le_bytes());
    b.push(pk::UTF8MB4_GENERAL_CI);
    b.extend_from_slice(&[0; 23]);
    b
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !self.broken {
            let stream = self.io.get_mut();
            stream.set_deadline(Instant::now() + QUIT_DEADLINE);
            let _ = stream.write_all(&[1, 0, 0, 0, COM_QUIT]);
            let _ = stream.flush();
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("mysql::Connection")
            .field(
                "server_version",
                &PeerText::with_limit(&self.server_version, 64).to_string(),
            )
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}
