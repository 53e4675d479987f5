//! MySQL client/server protocol packets: framing (3-byte length, sequence id, 16 MiB
//! continuation), length-encoded integers and strings, and the pure parsers of what a server
//! sends (initial handshake v10 incl. MariaDB's, OK, ERR, EOF, column counts, text rows).
//!
//! Every server-chosen size is bounded here: a logical packet by [`MAX_PACKET_BYTES`], a
//! handshake's strings and plugin data by their protocol sizes, an error's text by
//! `error::ServerError`. Parsers never panic on any input (the `mysql_packet` fuzz target).

use std::io::Read;

use crate::error::{io_err, DbError, ServerError};
use svc_text::secrets::Secrets;

/// Largest logical packet accepted from the server (a result row, an error, a handshake).
pub const MAX_PACKET_BYTES: usize = 16 << 20;
/// Largest payload of one physical packet; a payload of exactly this size continues.
pub const MAX_FRAGMENT: usize = 0xFF_FFFF;
/// Most columns a result set may announce.
pub const MAX_COLUMNS: u64 = 4096;

// Capability flags (https://dev.mysql.com/doc/dev/mysql-server/latest/group__group__cs__capabilities__flags.html).
pub const CLIENT_LONG_PASSWORD: u32 = 0x1;
pub const CLIENT_LONG_FLAG: u32 = 0x4;
pub const CLIENT_CONNECT_WITH_DB: u32 = 0x8;
/// Never set by this client: a server could ask to read any local file.
pub const CLIENT_LOCAL_FILES: u32 = 0x80;
pub const CLIENT_PROTOCOL_41: u32 = 0x200;
pub const CLIENT_SSL: u32 = 0x800;
pub const CLIENT_TRANSACTIONS: u32 = 0x2000;
pub const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
/// Never set by this client: one statement per COM_QUERY.
pub const CLIENT_MULTI_STATEMENTS: u32 = 0x1_0000;
pub const CLIENT_PLUGIN_AUTH: u32 = 0x8_0000;
pub const CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA: u32 = 0x20_0000;

/// Server status flag: a transaction is open.
pub const SERVER_STATUS_IN_TRANS: u16 = 0x1;
/// Server status flag: NO_BACKSLASH_ESCAPES is in effect.
pub const SERVER_STATUS_NO_BACKSLASH_ESCAPES: u16 = 0x200;

/// utf8mb4_general_ci: the connection's character set (every row is UTF-8).
pub const UTF8MB4_GENERAL_CI: u8 = 45;

/// Reads one logical packet (joining continuations) and checks its sequence id; `seq` is the
/// expected id and is advanced past every fragment read.
pub fn read_packet<R: Read>(r: &mut R, seq: &mut u8) -> Result<Vec<u8>, DbError> {
    let mut out = Vec::new();
    loop {
        let mut head = [0u8; 4];
        r.read_exact(&mut head).map_err(|e| io_err("read", e))?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], 0]) as usize;
        if head[3] != *seq {
            return Err(DbError::Protocol(format!(
                "packet out of order (sequence {} where {} was expected)",
                head[3], *seq
            )));
        }
        *seq = seq.wrapping_add(1);
        if out.len() + len > MAX_PACKET_BYTES {
            return Err(DbError::Protocol(format!(
                "the server sent a packet larger than {MAX_PACKET_BYTES} bytes"
            )));
        }
        let start = out.len();
        out.resize(start + len, 0);
        r.read_exact(&mut out[start..])
            .map_err(|e| io_err("read", e))?;
        if len < MAX_FRAGMENT {
            return Ok(out);
        }
    }
}

/// Frames `payload` as packets starting at sequence `seq` (advanced), appending to `out`.
pub fn frame_into(out: &mut Vec<u8>, payload: &[u8], seq: &mut u8) {
    let mut rest = payload;
    loop {
        let n = rest.len().min(MAX_FRAGMENT);
        out.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
        out.push(*seq);
        *seq = seq.wrapping_add(1);
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        if n < MAX_FRAGMENT {
            return;
        }
    }
}

/// Appends a length-encoded integer.
pub fn put_lenenc(out: &mut Vec<u8>, n: u64) {
    match n {
        0..=250 => out.push(n as u8),
        251..=0xFFFF => {
            out.push(0xFC);
            out.extend_from_slice(&(n as u16).to_le_bytes());
        }
        0x1_0000..=0xFF_FFFF => {
            out.push(0xFD);
            out.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
        }
        _ => {
            out.push(0xFE);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
}

fn malformed(what: &str) -> DbError {
    DbError::Protocol(format!("malformed {what} packet"))
}

/// A reader over one packet's payload; every read is bounds-checked.
pub struct Cursor<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Cursor<'a> {
    pub fn new(b: &'a [u8], what: &'static str) -> Cursor<'a> {
        Cursor { b, what }
    }
    pub fn rest(&self) -> &'a [u8] {
        self.b
    }
    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DbError> {
        if n > self.b.len() {
            return Err(malformed(self.what));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }
    pub fn u8(&mut self) -> Result<u8, DbError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, DbError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self) -> Result<u32, DbError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A NUL-terminated string (the NUL consumed); without a NUL, the rest when `to_end`.
    pub fn cstr(&mut self, to_end: bool) -> Result<&'a [u8], DbError> {
        match self.b.iter().position(|&c| c == 0) {
            Some(i) => {
                let s = &self.b[..i];
                self.b = &self.b[i + 1..];
                Ok(s)
            }
            None if to_end => Ok(self.take(self.b.len())?),
            None => Err(malformed(self.what)),
        }
    }
    /// A length-encoded integer; `None` for the NULL marker 0xFB.
    pub fn lenenc(&mut self) -> Result<Option<u64>, DbError> {
        let first = self.u8()?;
        Ok(Some(match first {
            0..=250 => first as u64,
            0xFB => return Ok(None),
            0xFC => self.u16()? as u64,
            0xFD => {
                let b = self.take(3)?;
                u32::from_le_bytes([b[0], b[1], b[2], 0]) as u64
            }
            0xFE => {
                let b = self.take(8)?;
                u64::from_le_bytes(b.try_into().map_err(|_| malformed(self.what))?)
            }
            _ => return Err(malformed(self.what)),
        }))
    }
    /// A length-encoded string; `None` for NULL.
    pub fn lenenc_bytes(&mut self) -> Result<Option<&'a [u8]>, DbError> {
        match self.lenenc()? {
            None => Ok(None),
            Some(n) if n > self.b.len() as u64 => Err(malformed(self.what)),
            Some(n) => Ok(Some(self.take(n as usize)?)),
        }
    }
}

/// The server's initial handshake (protocol version 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    pub server_version: String,
    pub connection_id: u32,
    pub capabilities: u32,
    pub status: u16,
    /// The 20-byte nonce (parts 1 and 2, trailing NUL removed).
    pub nonce: Vec<u8>,
    /// The server's default authentication plugin.
    pub plugin: String,
    /// MariaDB announces itself by clearing CLIENT_LONG_PASSWORD ("CLIENT_MYSQL").
    pub mariadb: bool,
}

/// Longest server version string accepted.
const MAX_VERSION_BYTES: usize = 128;
/// Longest plugin name accepted.
pub const MAX_PLUGIN_NAME_BYTES: usize = 64;

impl Handshake {
    pub fn parse(p: &[u8]) -> Result<Handshake, DbError> {
        if p.first() == Some(&0xFF) {
            return Err(DbError::Server(parse_err(p)?));
        }
        let mut c = Cursor::new(p, "handshake");
        let version = c.u8()?;
        if version != 10 {
            return Err(DbError::Protocol(format!(
                "unsupported protocol version {version} (not a MySQL/MariaDB server, or older \
                 than 4.1)"
            )));
        }
        let server_version = c.cstr(false)?;
        if server_version.len() > MAX_VERSION_BYTES {
            return Err(malformed("handshake"));
        }
        let connection_id = c.u32()?;
        let mut nonce = c.take(8)?.to_vec();
        c.u8()?; // filler
        let mut capabilities = c.u16()? as u32;
        let _charset = c.u8()?;
        let status = c.u16()?;
        capabilities |= (c.u16()? as u32) << 16;
        let data_len = c.u8()? as usize;
        c.take(10)?; // reserved (MariaDB: 6 filler, then 4 bytes of extended capabilities)
        let need = CLIENT_PROTOCOL_41 | CLIENT_SECURE_CONNECTION | CLIENT_PLUGIN_AUTH;
        if capabilities & need != need {
            return Err(DbError::Protocol(
                "the server lacks protocol 4.1 authentication with plugins (too old or not \
                 MySQL/MariaDB)"
                    .into(),
            ));
        }
        // Part 2: max(13, data_len - 8) bytes, the last a NUL.
        let part2 = data_len.saturating_sub(8).max(13);
        let tail = c.take(part2)?;
        nonce.extend_from_slice(&tail[..part2 - 1]);
        if nonce.len() != 20 {
            return Err(DbError::Protocol(format!(
                "handshake nonce of {} bytes (20 expected)",
                nonce.len()
            )));
        }
        let plugin = c.cstr(true)?;
        if plugin.len() > MAX_PLUGIN_NAME_BYTES {
            return Err(malformed("handshake"));
        }
        Ok(Handshake {
            server_version: String::from_utf8_lossy(server_version).into_owned(),
            connection_id,
            capabilities,
            status,
            nonce,
            plugin: String::from_utf8_lossy(plugin).into_owned(),
            mariadb: capabilities & CLIENT_LONG_PASSWORD == 0,
        })
    }
}

/// An ERR packet (0xFF): error number, SQLSTATE (protocol 4.1 marker `#`), message.
pub fn parse_err(p: &[u8]) -> Result<ServerError, DbError> {
    parse_err_hiding(p, &Secrets::new())
}

/// [`parse_err`] with every value of `hidden` (the password, during connect) replaced by
/// `<redacted>` before the message is cut.
pub fn parse_err_hiding(p: &[u8], hidden: &Secrets) -> Result<ServerError, DbError> {
    let mut c = Cursor::new(p, "error");
    if c.u8()? != 0xFF {
        return Err(malformed("error"));
    }
    let number = c.u16()?;
    let (state, message) = if c.rest().first() == Some(&b'#') {
        c.u8()?;
        let s = c.take(5)?;
        (String::from_utf8_lossy(s).into_owned(), c.rest())
    } else {
        ("HY000".to_string(), c.rest())
    };
    // Bound the bytes before decoding; ServerError bounds the characters again.
    let message = &message[..message.len().min(2048)];
    let mut text = String::from_utf8_lossy(message).into_owned();
    if number == 1064 {
        // ER_PARSE_ERROR quotes the statement near the error: row data.
        text = "syntax error (the server's text is withheld: it quotes the statement)".into();
    }
    Ok(ServerError::hiding(
        &format!("ERROR {number}"),
        &state,
        &text,
        hidden,
    ))
}

/// An OK packet (0x00, or 0xFE ending a result set under CLIENT_DEPRECATE_EOF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OkPacket {
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    pub warnings: u16,
}

pub fn parse_ok(p: &[u8]) -> Result<OkPacket, DbError> {
    let mut c = Cursor::new(p, "ok");
    let head = c.u8()?;
    if head != 0x00 && head != 0xFE {
        return Err(malformed("ok"));
    }
    let affected_rows = c.lenenc()?.ok_or_else(|| malformed("ok"))?;
    let last_insert_id = c.lenenc()?.ok_or_else(|| malformed("ok"))?;
    let status = c.u16()?;
    let warnings = c.u16()?;
    Ok(OkPacket {
        affected_rows,
        last_insert_id,
        status,
        warnings,
    })
}

/// An EOF packet: 0xFE and fewer than 9 bytes. Returns its status flags.
pub fn parse_eof(p: &[u8]) -> Option<u16> {
    if p.first() != Some(&0xFE) || p.len() >= 9 {
        return None;
    }
    Some(if p.len() >= 5 {
        u16::from_le_bytes([p[3], p[4]])
    } else {
        0
    })
}

/// One text-protocol row of `columns` values (`None` = NULL), checked to be UTF-8.
pub fn parse_row(p: &[u8], columns: usize) -> Result<Vec<Option<String>>, DbError> {
    let mut c = Cursor::new(p, "row");
    let mut row = Vec::with_capacity(columns.min(p.len() + 1));
    for _ in 0..columns {
        row.push(match c.lenenc_bytes()? {
            None => None,
            Some(b) => Some(
                std::str::from_utf8(b)
                    .map_err(|_| DbError::Protocol("a result value is not utf-8".into()))?
                    .to_string(),
            ),
        });
    }
    if !c.is_empty() {
        return Err(malformed("row"));
    }
    Ok(row)
}

/// What the first packet of a COM_QUERY answer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryHead {
    Ok(OkPacket),
    Err(ServerError),
    /// LOCAL INFILE request (0xFB): always refused.
    LocalInfile,
    /// A result set of this many columns.
    Columns(usize),
}

pub fn parse_query_head(p: &[u8]) -> Result<QueryHead, DbError> {
    match p.first() {
        Some(0x00) => Ok(QueryHead::Ok(parse_ok(p)?)),
        Some(0xFF) => Ok(QueryHead::Err(parse_err(p)?)),
        Some(0xFB) => Ok(QueryHead::LocalInfile),
        Some(_) => {
            let mut c = Cursor::new(p, "column count");
            let n = c.lenenc()?.ok_or_else(|| malformed("column count"))?;
            if !c.is_empty() || n == 0 {
                return Err(malformed("column count"));
            }
            if n > MAX_COLUMNS {
                return Err(DbError::Protocol(format!(
                    "the server announced {n} columns (at most {MAX_COLUMNS} accepted)"
                )));
            }
            Ok(QueryHead::Columns(n as usize))
        }
        None => Err(malformed("query answer")),
    }
}

/// Every parser over one packet, for the fuzz target: returns whether any accepted it.
pub fn parse_any(p: &[u8]) -> bool {
    let mut accepted = Handshake::parse(p).is_ok();
    accepted |= parse_err(p).is_ok();
    accepted |= parse_ok(p).is_ok();
    accepted |= parse_eof(p).is_some();
    accepted |= parse_query_head(p).is_ok();
    accepted |= parse_row(p, (p.first().copied().unwrap_or(0) % 8) as usize).is_ok();
    accepted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_round_trips_and_splits_at_16_mib() {
        let mut out = Vec::new();
        let mut seq = 3;
        frame_into(&mut out, b"hello", &mut seq);
        assert_eq!(out, b"\x05\x00\x00\x03hello");
        assert_eq!(seq, 4);
        let big = vec![7u8; MAX_FRAGMENT];
        let mut out = Vec::new();
        let mut seq = 0;
        frame_into(&mut out, &big, &mut seq);
        // A payload of exactly 0xFFFFFF bytes is followed by an empty packet.
        assert_eq!(out.len(), 4 + MAX_FRAGMENT + 4);
        assert_eq!(seq, 2);
        let mut rseq = 0;
        let back = read_packet(&mut &out[..], &mut rseq).unwrap();
        assert_eq!(back.len(), MAX_FRAGMENT);
        assert_eq!(rseq, 2);
    }

    #[test]
    fn reader_refuses_out_of_order_and_oversized_packets() {
        let mut seq = 0;
        let e = read_packet(&mut &b"\x01\x00\x00\x05x"[..], &mut seq).unwrap_err();
        assert!(e.to_string().contains("out of order"), "{e}");
        // Two full fragments announce 32 MiB: refused before reading the second.
        let mut huge = vec![0xFF, 0xFF, 0xFF, 0];
        huge.extend(vec![0u8; MAX_FRAGMENT]);
        huge.extend([0xFF, 0xFF, 0xFF, 1]);
        let mut seq = 0;
        let e = read_packet(&mut &huge[..], &mut seq).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        let mut seq = 0;
        let e = read_packet(&mut &b"\x09\x00\x00\x00abc"[..], &mut seq).unwrap_err();
        assert!(matches!(e, DbError::Connection(_)), "{e}");
    }

    #[test]
    fn lenenc_round_trips() {
        for n in [
            0u64,
            250,
            251,
            0xFFFF,
            0x1_0000,
            0xFF_FFFF,
            0x100_0000,
            u64::MAX,
        ] {
            let mut b = Vec::new();
            put_lenenc(&mut b, n);
            let mut c = Cursor::new(&b, "t");
            assert_eq!(c.lenenc().unwrap(), Some(n));
            assert!(c.is_empty());
        }
        assert_eq!(Cursor::new(&[0xFB], "t").lenenc().unwrap(), None);
        assert!(Cursor::new(&[0xFF], "t").lenenc().is_err());
        assert!(Cursor::new(&[0xFE, 1], "t").lenenc().is_err());
    }

    pub(crate) fn handshake_bytes(caps: u32, plugin: &str) -> Vec<u8> {
        let mut p = vec![10];
        p.extend_from_slice(b"5.5.5-10.11.19-MariaDB\0");
        p.extend_from_slice(&7u32.to_le_bytes());
        p.extend_from_slice(b"abcdefgh\0");
        p.extend_from_slice(&(caps as u16).to_le_bytes());
        p.push(45);
        p.extend_from_slice(&2u16.to_le_bytes());
        p.extend_from_slice(&((caps >> 16) as u16).to_le_bytes());
        p.push(21);
        p.extend_from_slice(&[0; 10]);
        p.extend_from_slice(b"ijklmnopqrst\0");
        p.extend_from_slice(plugin.as_bytes());
        p.push(0);
        p
    }

    #[test]
    fn handshake_v10_parses_and_refuses_old_servers() {
        let caps = CLIENT_PROTOCOL_41 | CLIENT_SECURE_CONNECTION | CLIENT_PLUGIN_AUTH | CLIENT_SSL;
        let h = Handshake::parse(&handshake_bytes(caps, "mysql_native_password")).unwrap();
        assert_eq!(h.nonce, b"abcdefghijklmnopqrst");
        assert_eq!(h.plugin, "mysql_native_password");
        assert_eq!(h.connection_id, 7);
        assert!(h.mariadb);
        let e = Handshake::parse(&handshake_bytes(CLIENT_PROTOCOL_41, "x")).unwrap_err();
        assert!(e.to_string().contains("too old"), "{e}");
        let mut v9 = handshake_bytes(caps, "x");
        v9[0] = 9;
        assert!(Handshake::parse(&v9).is_err());
        let full = handshake_bytes(caps, "mysql_native_password");
        for cut in 0..full.len() - 23 {
            assert!(Handshake::parse(&full[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn err_packets_keep_sqlstate_and_bound_text() {
        let mut p = vec![0xFF];
        p.extend_from_slice(&1045u16.to_le_bytes());
        p.extend_from_slice(b"#28000Access denied\nfor user");
        let e = parse_err(&p).unwrap();
        assert_eq!(e.code, "28000");
        let shown = DbError::Server(e).to_string();
        assert!(shown.starts_with("server error 1045 28000"), "{shown}");
        assert!(!shown.contains('\n'), "{shown}");
        let mut p = vec![0xFF];
        p.extend_from_slice(&1064u16.to_le_bytes());
        p.extend_from_slice(b"#42000near 'secret row'");
        let shown = DbError::Server(parse_err(&p).unwrap()).to_string();
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn query_heads_rows_and_eof() {
        assert_eq!(
            parse_query_head(&[0xFB, b'/']).unwrap(),
            QueryHead::LocalInfile
        );
        assert_eq!(parse_query_head(&[2]).unwrap(), QueryHead::Columns(2));
        assert!(parse_query_head(&[0xFC, 0xFF, 0xFF]).is_err());
        let ok = parse_query_head(&[0, 1, 0, 1, 0, 0, 0]).unwrap();
        assert!(matches!(ok, QueryHead::Ok(o) if o.affected_rows == 1 && o.status == 1));
        assert_eq!(
            parse_row(b"\x01a\xfb", 2).unwrap(),
            vec![Some("a".to_string()), None]
        );
        assert!(parse_row(b"\x05a", 1).is_err());
        assert!(parse_row(b"\x01a\x01b", 1).is_err());
        assert_eq!(parse_eof(&[0xFE, 0, 0, 2, 0]), Some(2));
        assert_eq!(parse_eof(&[0xFE; 9]), None);
    }
}
