//! PostgreSQL protocol 3.0 message codec: frontend messages built into bytes, backend messages
//! parsed from bytes. Pure (no I/O), so the connection and the fuzz target
//! ([`decode_backend_messages`]) run the very same parser.
//!
//! Every backend message is parsed strictly: its body must be consumed exactly, strings must be
//! NUL-terminated UTF-8, counts and lengths must fit the body, and the limits below hold. A
//! violation is a [`DbError::Protocol`]; the connection treats it as fatal.

use crate::error::{DbError, ServerError};
use svc_text::secrets::Secrets;

/// Largest backend message accepted. The sink's replies are small (command tags, idempotency
/// keys, a digest per duplicate row); a larger length prefix means a corrupt stream or a
/// hostile server, and is refused before anything is allocated.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Most columns in a DataRow (PostgreSQL's own limit for a table row is 1,600; a result row
/// 1,664).
pub const MAX_COLUMNS: usize = 1664;
/// Most SASL mechanisms an AuthenticationSASL may list.
pub const MAX_SASL_MECHANISMS: usize = 16;
/// Protocol 3.0.
pub const PROTOCOL_VERSION: i32 = 196_608;
pub const SSL_REQUEST_CODE: i32 = 80_877_103;

/// An authentication request (`R` message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthRequest {
    Ok,
    CleartextPassword,
    Md5Password {
        salt: [u8; 4],
    },
    /// AuthenticationSASL with the offered mechanism names.
    Sasl(Vec<String>),
    SaslContinue(Vec<u8>),
    SaslFinal(Vec<u8>),
    /// Kerberos, SCM, GSSAPI, SSPI and unknown codes: never answered.
    Unsupported(i32),
}

/// One parsed backend message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendMessage {
    Authentication(AuthRequest),
    BackendKeyData {
        pid: i32,
        secret: i32,
    },
    ParameterStatus {
        name: String,
        value: String,
    },
    /// `I` idle, `T` in a transaction, `E` failed transaction.
    ReadyForQuery(u8),
    ErrorResponse(ServerError),
    NoticeResponse(ServerError),
    NotificationResponse,
    NegotiateProtocolVersion,
    ParseComplete,
    BindComplete,
    CloseComplete,
    NoData,
    PortalSuspended,
    ParameterDescription,
    RowDescription,
    /// Text-format columns; `None` = SQL NULL.
    DataRow(Vec<Option<String>>),
    CommandComplete(String),
    EmptyQueryResponse,
    /// CopyInResponse, CopyOutResponse, CopyBothResponse: never requested by this client.
    Copy,
}

impl BackendMessage {
    /// A short name for errors.
    pub fn name(&self) -> &'static str {
        match self {
            BackendMessage::Authentication(_) => "authentication request",
            BackendMessage::BackendKeyData { .. } => "backend key data",
            BackendMessage::ParameterStatus { .. } => "parameter status",
            BackendMessage::ReadyForQuery(_) => "ready for query",
            BackendMessage::ErrorResponse(_) => "error response",
            BackendMessage::NoticeResponse(_) => "notice",
            BackendMessage::NotificationResponse => "notification",
            BackendMessage::NegotiateProtocolVersion => "protocol version negotiation",
            BackendMessage::ParseComplete => "parse complete",
            BackendMessage::BindComplete => "bind complete",
            BackendMessage::CloseComplete => "close complete",
            BackendMessage::NoData => "no data",
            BackendMessage::PortalSuspended => "portal suspended",
            BackendMessage::ParameterDescription => "parameter description",
            BackendMessage::RowDescription => "row description",
            BackendMessage::DataRow(_) => "data row",
            BackendMessage::CommandComplete(_) => "command complete",
            BackendMessage::EmptyQueryResponse => "empty query response",
            BackendMessage::Copy => "copy response",
        }
    }

    /// Parses the body of a message with type byte `tag`.
    pub fn parse(tag: u8, body: &[u8]) -> Result<BackendMessage, DbError> {
        BackendMessage::parse_hiding(tag, body, &Secrets::new())
    }

    /// [`BackendMessage::parse`] with every value of `hidden` (the password, during startup)
    /// replaced by `<redacted>` in what the server says: errors, notices, parameter values.
    pub fn parse_hiding(tag: u8, body: &[u8], hidden: &Secrets) -> Result<BackendMessage, DbError> {
        let mut b = Body { b: body };
        let m = match tag {
            b'R' => BackendMessage::Authentication(parse_auth(&mut b)?),
            b'K' => BackendMessage::BackendKeyData {
                pid: b.i32()?,
                secret: b.i32()?,
            },
            b'S' => BackendMessage::ParameterStatus {
                name: hidden.scrub(b.cstr()?).into_owned(),
                value: hidden.scrub(b.cstr()?).into_owned(),
            },
            b'Z' => match b.take(1)?[0] {
                s @ (b'I' | b'T' | b'E') => BackendMessage::ReadyForQuery(s),
                _ => return Err(violation("invalid transaction status in ReadyForQuery")),
            },
            b'E' => BackendMessage::ErrorResponse(parse_error_fields(&mut b, hidden)?),
            b'N' => BackendMessage::NoticeResponse(parse_error_fields(&mut b, hidden)?),
            b'A' => {
                b.i32()?;
                b.cstr()?;
                b.cstr()?;
                BackendMessage::NotificationResponse
            }
            b'v' => {
                b.i32()?;
                let n = b.i32()?;
                for _ in 0..n.max(0) {
                    b.cstr()?;
                }
                BackendMessage::NegotiateProtocolVersion
            }
            b'1' => BackendMessage::ParseComplete,
            b'2' => BackendMessage::BindComplete,
            b'3' => BackendMessage::CloseComplete,
            b'n' => BackendMessage::NoData,
            b's' => BackendMessage::PortalSuspended,
            b't' => {
                let n = b.i16()?;
                b.take(usize::try_from(n).map_err(|_| violation("negative count"))? * 4)?;
                BackendMessage::ParameterDescription
            }
            b'T' => {
                let n = usize::try_from(b.i16()?).map_err(|_| violation("negative count"))?;
                for _ in 0..n {
                    b.cstr()?;
                    b.take(18)?; // table oid, column, type oid, size, modifier, format
                }
                BackendMessage::RowDescription
            }
            b'D' => BackendMessage::DataRow(parse_data_row(&mut b)?),
            b'C' => BackendMessage::CommandComplete(b.cstr()?.to_string()),
            b'I' => BackendMessage::EmptyQueryResponse,
            b'G' | b'H' | b'W' => {
                b.rest();
                BackendMessage::Copy
            }
            other => {
                return Err(DbError::Protocol(format!(
                    "unknown message type 0x{other:02x}"
                )))
            }
        };
        if !b.b.is_empty() {
            return Err(violation("trailing bytes after a message"));
        }
        Ok(m)
    }
}

/// Checks a message header (type byte and length) and returns the body length. Refuses a
/// length beyond [`MAX_MESSAGE_BYTES`] before anything is allocated for it.
pub fn body_len(head: [u8; 5]) -> Result<usize, DbError> {
    let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    match usize::try_from(len) {
        Ok(n) if (4..=MAX_MESSAGE_BYTES + 4).contains(&n) => Ok(n - 4),
        _ => Err(DbError::Protocol(format!(
            "message length {len} is outside 4 to {} bytes",
            MAX_MESSAGE_BYTES + 4
        ))),
    }
}

/// Parses a stream of framed backend messages held in memory: the pure entry point of the fuzz
/// target `pg_backend`. A trailing incomplete message is an error, as is any message the
/// connection itself would refuse to parse.
pub fn decode_backend_messages(mut bytes: &[u8]) -> Result<Vec<BackendMessage>, DbError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let head: [u8; 5] = bytes
            .get(..5)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| violation("truncated message header"))?;
        let len = body_len(head)?;
        let body = bytes
            .get(5..5 + len)
            .ok_or_else(|| violation("truncated message body"))?;
        out.push(BackendMessage::parse(head[0], body)?);
        bytes = &bytes[5 + len..];
    }
    Ok(out)
}

fn violation(what: &str) -> DbError {
    DbError::Protocol(what.to_string())
}

fn parse_auth(b: &mut Body<'_>) -> Result<AuthRequest, DbError> {
    Ok(match b.i32()? {
        0 => AuthRequest::Ok,
        3 => AuthRequest::CleartextPassword,
        5 => AuthRequest::Md5Password {
            salt: b.take(4)?.try_into().expect("4 bytes"),
        },
        10 => {
            let mut mechanisms = Vec::new();
            loop {
                let m = b.cstr()?;
                if m.is_empty() {
                    break;
                }
                if mechanisms.len() == MAX_SASL_MECHANISMS {
                    return Err(violation("too many sasl mechanisms"));
                }
                mechanisms.push(m.to_string());
            }
            AuthRequest::Sasl(mechanisms)
        }
        11 => AuthRequest::SaslContinue(b.rest().to_vec()),
        12 => AuthRequest::SaslFinal(b.rest().to_vec()),
        other => {
            b.rest();
            AuthRequest::Unsupported(other)
        }
    })
}

fn parse_data_row(b: &mut Body<'_>) -> Result<Vec<Option<String>>, DbError> {
    let n = usize::try_from(b.i16()?).map_err(|_| violation("negative column count"))?;
    if n > MAX_COLUMNS {
        return Err(violation("too many columns in a data row"));
    }
    // Each column takes at least its 4-byte length: a count the body cannot hold is refused
    // before the row is allocated.
    if n * 4 > b.b.len() {
        return Err(violation("data row shorter than its column count"));
    }
    let mut row = Vec::with_capacity(n);
    for _ in 0..n {
        let len = b.i32()?;
        if len == -1 {
            row.push(None);
        } else {
            let len = usize::try_from(len).map_err(|_| violation("negative column length"))?;
            let v = std::str::from_utf8(b.take(len)?)
                .map_err(|_| violation("column value is not utf-8"))?;
            row.push(Some(v.to_string()));
        }
    }
    Ok(row)
}

/// Reads ErrorResponse / NoticeResponse fields. Only severity, SQLSTATE and message are kept:
/// D (detail), H (hint), W (where) and the rest may quote row data.
fn parse_error_fields(b: &mut Body<'_>, hidden: &Secrets) -> Result<ServerError, DbError> {
    let (mut severity, mut severity_v, mut code, mut message) = ("", None, "", "");
    loop {
        let kind = b.take(1)?[0];
        if kind == 0 {
            break;
        }
        let value = b.cstr()?;
        match kind {
            b'S' => severity = value,
            b'V' => severity_v = Some(value),
            b'C' => code = value,
            b'M' => message = value,
            _ => {}
        }
    }
    Ok(ServerError::hiding(
        severity_v.unwrap_or(severity),
        code,
        message,
        hidden,
    ))
}

/// Builds a frontend message: tag, length, body.
pub struct Msg(Vec<u8>, usize);

impl Msg {
    pub fn new(tag: u8) -> Msg {
        Msg(vec![tag, 0, 0, 0, 0], 1)
    }
    /// A startup-phase message (no tag byte).
    pub fn untagged() -> Msg {
        Msg(vec![0, 0, 0, 0], 0)
    }
    pub fn i16(mut self, v: i16) -> Msg {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i32(mut self, v: i32) -> Msg {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn cstr(mut self, s: &str) -> Msg {
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self
    }
    pub fn bytes(mut self, b: &[u8]) -> Msg {
        self.0.extend_from_slice(b);
        self
    }
    /// Finishes the message into `out`, filling in the length.
    pub fn finish_into(mut self, out: &mut Vec<u8>) -> Result<(), DbError> {
        // Invariant: field 1 is where the length field starts (after the tag, if any).
        let start = self.1;
        let len = i32::try_from(self.0.len() - start)
            .map_err(|_| violation("message larger than 2 GiB"))?;
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
        let h = self.take(2)?;
        Ok(i16::from_be_bytes([h[0], h[1]]))
    }
    fn i32(&mut self) -> Result<i32, DbError> {
        let h = self.take(4)?;
        Ok(i32::from_be_bytes([h[0], h[1], h[2], h[3]]))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DbError> {
        if self.b.len() < n {
            return Err(violation("truncated message"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn cstr(&mut self) -> Result<&'a str, DbError> {
        let end = self
            .b
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| violation("unterminated string"))?;
        let s =
            std::str::from_utf8(&self.b[..end]).map_err(|_| violation("string is not utf-8"))?;
        self.b = &self.b[end + 1..];
        Ok(s)
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

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
        let m = decode_backend_messages(&frame(b'E', body)).unwrap();
        let BackendMessage::ErrorResponse(e) = &m[0] else {
            panic!("{m:?}")
        };
        assert_eq!((e.code.as_str(), e.severity.as_str()), ("22P02", "ERROR"));
        let shown = DbError::Server(e.clone()).to_string();
        assert_eq!(shown, "server error 22P02 (invalid_text_representation)");
        assert!(!shown.contains("secret"));
    }

    #[test]
    fn a_conversation_decodes() {
        let mut bytes = frame(b'R', &[0, 0, 0, 10, b'S', b'C', b'R', b'A', b'M', 0, 0]);
        bytes.extend(frame(b'S', b"server_version\x0016.4\0"));
        bytes.extend(frame(
            b'D',
            &[0, 2, 0, 0, 0, 1, b'a', 0xff, 0xff, 0xff, 0xff],
        ));
        bytes.extend(frame(b'C', b"SELECT 1\0"));
        bytes.extend(frame(b'Z', b"I"));
        let m = decode_backend_messages(&bytes).unwrap();
        assert_eq!(
            m,
            vec![
                BackendMessage::Authentication(AuthRequest::Sasl(vec!["SCRAM".into()])),
                BackendMessage::ParameterStatus {
                    name: "server_version".into(),
                    value: "16.4".into()
                },
                BackendMessage::DataRow(vec![Some("a".into()), None]),
                BackendMessage::CommandComplete("SELECT 1".into()),
                BackendMessage::ReadyForQuery(b'I'),
            ]
        );
    }

    #[test]
    fn malformed_messages_are_violations() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                frame(b'D', &[0, 2, 0, 0, 0, 1, b'a']),
                "shorter than its column count",
            ),
            (frame(b'D', &[0, 1, 0, 0, 0, 9, b'a']), "truncated"),
            (frame(b'D', &[0x01, 0x00]), "shorter than its column count"),
            (frame(b'D', &[0x7f, 0xff]), "too many columns"),
            (frame(b'D', &[0xff, 0xff]), "negative column count"),
            (
                frame(b'D', &[0, 1, 0xff, 0xff, 0xff, 0xfe]),
                "negative column length",
            ),
            (frame(b'D', &[0, 1, 0, 0, 0, 1, 0xc3]), "not utf-8"),
            (frame(b'D', &[0, 0, 9]), "trailing bytes"),
            (frame(b'Z', b"X"), "transaction status"),
            (frame(b'C', b"no terminator"), "unterminated"),
            (frame(b'?', b""), "unknown message type 0x3f"),
            (b"D\x7f\xff\xff\xff".to_vec(), "message length 2147483647"),
            (b"D\x00\x00\x00\x02".to_vec(), "message length 2 "),
            (b"Z\x00\x00".to_vec(), "truncated message header"),
            (b"Z\x00\x00\x00\x05".to_vec(), "truncated message body"),
        ];
        for (bytes, want) in cases {
            let err = decode_backend_messages(&bytes).unwrap_err();
            assert!(matches!(err, DbError::Protocol(_)), "{err}");
            assert!(err.to_string().contains(want), "{want}: {err}");
        }
        let mut many = vec![0u8, 0, 0, 10];
        for _ in 0..=MAX_SASL_MECHANISMS {
            many.extend_from_slice(b"X\0");
        }
        many.push(0);
        assert!(decode_backend_messages(&frame(b'R', &many)).is_err());
    }

    /// A cheap stand-in for the fuzz target in every `cargo test`: mutated conversations never
    /// panic, and whatever decodes re-frames within the limits.
    #[test]
    fn mutated_conversations_never_panic() {
        let mut seed = frame(b'R', &[0, 0, 0, 10, b'S', b'C', b'R', b'A', b'M', 0, 0]);
        seed.extend(frame(b'R', &[0, 0, 0, 5, 1, 2, 3, 4]));
        seed.extend(frame(b'S', b"server_version\x0016.4\0"));
        seed.extend(frame(b'K', &[0, 0, 0, 1, 0, 0, 0, 2]));
        seed.extend(frame(
            b'T',
            &[
                0, 1, b'a', 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 25, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0, 0,
            ],
        ));
        seed.extend(frame(
            b'D',
            &[0, 2, 0, 0, 0, 1, b'a', 0xff, 0xff, 0xff, 0xff],
        ));
        seed.extend(frame(b'E', b"SERROR\0C42P01\0Mno\0\0"));
        seed.extend(frame(b'C', b"SELECT 1\0"));
        seed.extend(frame(b'Z', b"I"));
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..50_000 {
            let mut m = seed.clone();
            for _ in 0..(rnd() % 4 + 1) {
                let i = (rnd() as usize) % m.len();
                match rnd() % 3 {
                    0 => m[i] = rnd() as u8,
                    1 => m.truncate(i),
                    _ => m.insert(i, rnd() as u8),
                }
                if m.is_empty() {
                    break;
                }
            }
            if let Ok(msgs) = decode_backend_messages(&m) {
                assert!(msgs.len() <= m.len() / 5);
            }
            if let Ok(t) = std::str::from_utf8(&m) {
                let _ = super::super::auth::parse_server_first("R", t);
                let _ = super::super::auth::parse_server_final(t);
            }
        }
    }
}
