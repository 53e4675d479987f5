//! A small, synchronous MySQL/MariaDB client (client/server protocol 4.1) on `std::net`: the
//! relational sink's second engine.
//!
//! Why in-tree: the `mysql` crate brings about 24 crate versions (among them `rustls-pemfile`,
//! refused by scripts/audit.sh, and a second webpki), `mysql_common` alone 11-19 and is only a
//! codec, and every async client pulls tokio (docs/sinks/relational.md). The sink needs a
//! narrow slice of the protocol, implemented here and nothing more:
//! - the initial handshake v10 (MySQL's and MariaDB's), optionally upgraded to TLS with
//!   SSLRequest and the same rustls verification as the PostgreSQL client (`transport.rs`);
//! - authentication limited by an allow-list of plugins ([`auth::AuthPolicy`]):
//!   `caching_sha2_password` and `mysql_native_password`; cleartext plugins never;
//! - `COM_QUERY` answered by OK, ERR (with SQLSTATE) or a text result set; `COM_PING`;
//!   `COM_QUIT`. Parsers are in `packet.rs`, the session in `conn.rs`.
//!
//! Never requested: `CLIENT_LOCAL_FILES` (a server's LOCAL INFILE request is refused and the
//! connection closed), `CLIENT_MULTI_STATEMENTS`, compression, prepared statements.
//!
//! The server is a peer that may be hostile: every packet is bounded
//! ([`packet::MAX_PACKET_BYTES`]), so are columns, rows and result bytes per statement, the
//! authentication exchange and error text; each operation has one deadline. Note that MySQL
//! authentication does not prove the server knows the password: only TLS with verify-full
//! authenticates the server.

pub mod auth;
pub mod conn;
pub mod packet;

pub use auth::{AuthPolicy, Plugin};
pub use conn::{Connection, QueryResult};

/// `text` as a single-quoted utf8mb4 string literal. With backslash escapes (MySQL's default
/// `sql_mode`) NUL, `'`, backslash, CR, LF and Ctrl-Z are escaped with a backslash (a `"` is
/// an ordinary character inside `'...'` in every `sql_mode`, ANSI_QUOTES included: a JSON
/// value's many quotes go as they are); under NO_BACKSLASH_ESCAPES a backslash is an ordinary
/// character and only `'` is doubled.
/// utf8mb4 never has 0x5c or 0x27 inside a multi-byte character, so byte-wise escaping is exact.
pub fn quote(text: &str, no_backslash_escapes: bool) -> String {
    let mut out = String::with_capacity(text.len() + 2 + text.len() / 16);
    quote_into(&mut out, text, no_backslash_escapes);
    out
}

/// [`quote`] appended to `out`: the runs between escaped bytes are copied whole, found eight
/// bytes at a time ([`svc_text::scan`]), so a row's literals go straight into its statement
/// (no string per value, no UTF-8 decoding).
pub fn quote_into(out: &mut String, text: &str, no_backslash_escapes: bool) {
    use svc_text::scan::{byte_mask, find, has_byte, less_mask};
    out.reserve(text.len() + 2);
    out.push('\'');
    let bytes = text.as_bytes();
    let mut run = 0;
    loop {
        let at = if no_backslash_escapes {
            find(bytes, run, |w| has_byte(w, b'\''), |b| b == b'\'')
        } else {
            find(
                bytes,
                run,
                // NUL, LF, CR and Ctrl-Z are control characters: one test for the four.
                |w| (less_mask(w, 0x20) | byte_mask(w, b'\'') | byte_mask(w, b'\\')) != 0,
                |b| matches!(b, 0 | b'\'' | b'\\' | b'\n' | b'\r' | 0x1a),
            )
        };
        let Some(at) = at else { break };
        let escaped = match bytes[at] {
            b'\'' if no_backslash_escapes => "''",
            0 => "\\0",
            b'\'' => "\\'",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            _ => "\\Z",
        };
        // Every escaped byte is ASCII: `run..at` and `at + 1..` start and end on characters.
        out.push_str(&text[run..at]);
        out.push_str(escaped);
        run = at + 1;
    }
    out.push_str(&text[run..]);
    out.push('\'');
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quoting_in_both_modes() {
        assert_eq!(quote("a'b\\c\0\n", false), "'a\\'b\\\\c\\0\\n'");
        assert_eq!(quote("a'b\\c", true), "'a''b\\c'");
        assert_eq!(quote("ü€😀", false), "'ü€😀'");
        assert_eq!(quote("\"\r\u{1a}é'", false), "'\"\\r\\Zé\\''");
        assert_eq!(quote("'é'\0\\", true), "'''é''\0\\'");
        let mut out = String::from("(");
        super::quote_into(&mut out, "a\nb", false);
        assert_eq!(out, "('a\\nb'");
    }
}
