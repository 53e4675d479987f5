//! Errors of the PostgreSQL client: what the server said ([`ServerError`]) and how a call failed
//! ([`DbError`]).
//!
//! Everything the server sends is peer text: it reaches operators' logs only through
//! [`PeerText`] (bounded, control characters escaped), and message text of the SQLSTATE classes
//! that can quote row data is never shown at all.

use std::fmt;
use std::io;

use svc_text::peer::PeerText;
use svc_text::secrets::Secrets;

/// Characters of a server message kept (the display is bounded again by [`PeerText`]).
const MAX_SERVER_MESSAGE_CHARS: usize = 512;

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

    /// Builds the error from ErrorResponse/NoticeResponse (or MySQL ERR) fields, keeping only
    /// what is safe, with every value of `hidden` (the password, during the handshake;
    /// `Secrets::new()` after it) replaced by `<redacted>` in each field before the message
    /// is cut: a cut first could leave the start of the password behind.
    pub(crate) fn hiding(
        severity: &str,
        code: &str,
        message: &str,
        hidden: &Secrets,
    ) -> ServerError {
        ServerError {
            severity: hidden.scrub(severity).into_owned(),
            code: hidden.scrub(code).into_owned(),
            message: hidden
                .scrub(message)
                .chars()
                .take(MAX_SERVER_MESSAGE_CHARS)
                .collect(),
        }
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
    /// The server broke the protocol, asked for something unsupported or not allowed
    /// (`sink.require_auth`, `sink.channel_binding`), or sent more than the client accepts.
    Protocol(String),
}

impl DbError {
    /// The error with every value of `hidden` replaced by `<redacted>` in its text: what a
    /// connect returns, so a server that quotes the password back (in an error, a mechanism
    /// name, a version string) cannot put it into a log line.
    pub(crate) fn hidden(self, hidden: &Secrets) -> DbError {
        let hide = |t: String| match hidden.scrub(&t) {
            std::borrow::Cow::Borrowed(_) => t,
            std::borrow::Cow::Owned(o) => o,
        };
        match self {
            DbError::Connection(m) => DbError::Connection(hide(m)),
            DbError::Protocol(m) => DbError::Protocol(hide(m)),
            DbError::Server(e) => DbError::Server(ServerError {
                severity: hide(e.severity),
                code: hide(e.code),
                message: hide(e.message),
            }),
        }
    }

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
                write!(
                    f,
                    "server {} {}",
                    PeerText::with_limit(&e.severity.to_lowercase(), 16),
                    PeerText::with_limit(&e.code, 16)
                )?;
                if let Some(name) = condition_name(&e.code) {
                    write!(f, " ({name})")?;
                }
                if message_is_safe(&e.code) {
                    write!(f, ": {}", PeerText::new(&e.message))?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for DbError {}

/// What a server must not put into the client's errors during a handshake, whatever the
/// engine: the password with its escaped and encoded forms (`text::secrets::Secrets`). Empty
/// without a password, or with one that is not UTF-8 (no text can quote it as it is). Dropped,
/// hence wiped, with the handshake. PostgreSQL adds the MD5 form it stores
/// (`postgres::auth::handshake_secrets`).
pub(crate) fn password_secrets(password: Option<&[u8]>) -> Secrets {
    let mut hidden = Secrets::new();
    if let Some(text) = password.and_then(|p| std::str::from_utf8(p).ok()) {
        hidden.add(text);
    }
    hidden
}

/// Maps an I/O error of `phase` to a connection error; a timeout names the phase that expired.
pub(crate) fn io_err(phase: &str, e: io::Error) -> DbError {
    let what = match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "timed out".to_string(),
        io::ErrorKind::UnexpectedEof => "server closed the connection".to_string(),
        _ => e.to_string(),
    };
    DbError::Connection(format!("{phase}: {what}"))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_text_is_bounded_and_escaped() {
        let e = ServerError::hiding(
            "FATAL",
            "28P01",
            &format!("bad\nFAKE LOG LINE {}", "x".repeat(100_000)),
            &Secrets::new(),
        );
        assert_eq!(e.message.chars().count(), MAX_SERVER_MESSAGE_CHARS);
        let shown = DbError::Server(e).to_string();
        assert!(shown.starts_with("server fatal 28P01 (invalid_password): bad\\nFAKE LOG LINE"));
        assert!(!shown.contains('\n'));
        assert!(shown.len() < 400, "{}", shown.len());
        let e = ServerError::hiding("ERR\u{1b}[2J", "4\r2P01", "m", &Secrets::new());
        let shown = DbError::Server(e).to_string();
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\r'),
            "{shown}"
        );
    }
}
