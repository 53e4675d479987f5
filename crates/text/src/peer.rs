//! Text that came from a peer (a server's error code or message, a mechanism list, a header
//! value), made safe to put in a log line or an error shown to an operator.
//!
//! A hostile or broken peer controls these bytes: unbounded, they make megabyte log lines;
//! with a newline or an escape sequence, they forge log lines or drive the operator's terminal.
//! [`PeerText`] displays at most [`PEER_TEXT_MAX_CHARS`] characters, escapes every control
//! character (`\n`, `\r`, `\t`, `\\`, other controls as `\u{..}`) and marks a cut with `...`.
//! It never allocates unless formatted, so it can wrap a borrowed buffer in an error path.

use std::fmt;

use super::terminal::is_terminal_control;

/// Characters of peer text shown at most; enough for any real error message's gist.
pub const PEER_TEXT_MAX_CHARS: usize = 256;

/// Displays peer-supplied text bounded and escaped. See the module comment.
#[derive(Clone, Copy)]
pub struct PeerText<'a> {
    text: &'a str,
    max_chars: usize,
}

impl<'a> PeerText<'a> {
    /// At most [`PEER_TEXT_MAX_CHARS`] characters of `text`.
    pub fn new(text: &'a str) -> Self {
        Self::with_limit(text, PEER_TEXT_MAX_CHARS)
    }

    /// At most `max_chars` characters of `text`.
    pub fn with_limit(text: &'a str, max_chars: usize) -> Self {
        PeerText { text, max_chars }
    }
}

/// Peer bytes that may not be UTF-8: invalid sequences become U+FFFD, then as [`PeerText`].
pub fn peer_bytes(bytes: &[u8]) -> String {
    let lossy = String::from_utf8_lossy(&bytes[..bytes.len().min(PEER_TEXT_MAX_CHARS * 4)]);
    PeerText::new(&lossy).to_string()
}

impl fmt::Display for PeerText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        for (shown, c) in self.text.chars().enumerate() {
            if shown == self.max_chars {
                return f.write_str("...");
            }
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                '\\' => f.write_str("\\\\")?,
                // C0, DEL, C1, and the bidi/line controls a terminal or log viewer may act on.
                c if is_terminal_control(c) => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

impl fmt::Debug for PeerText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_cannot_start_a_new_log_line() {
        let forged = "AccessDenied\n2026-01-01T00:00:00Z INFO svc: all good\r\x1b[2J\0";
        let shown = PeerText::new(forged).to_string();
        assert!(!shown.contains('\n') && !shown.contains('\r') && !shown.contains('\x1b'));
        assert!(!shown.contains('\0'));
        assert_eq!(
            shown,
            "AccessDenied\\n2026-01-01T00:00:00Z INFO svc: all good\\r\\u{1b}[2J\\u{0}"
        );
    }

    #[test]
    fn long_text_is_cut_with_a_mark() {
        let long = "x".repeat(10_000);
        let shown = PeerText::new(&long).to_string();
        assert_eq!(shown.len(), PEER_TEXT_MAX_CHARS + 3);
        assert!(shown.ends_with("..."));
        assert_eq!(PeerText::with_limit("abc", 3).to_string(), "abc");
        assert_eq!(PeerText::with_limit("abcd", 3).to_string(), "abc...");
    }

    #[test]
    fn bidi_overrides_and_backslashes_are_escaped() {
        assert_eq!(PeerText::new("a\u{202e}b\\").to_string(), "a\\u{202e}b\\\\");
        assert_eq!(
            PeerText::new("\u{200e}\u{200f}\u{61c}\u{9b}").to_string(),
            "\\u{200e}\\u{200f}\\u{61c}\\u{9b}"
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_not_trusted() {
        let shown = peer_bytes(b"bad\xff\xfe\nend");
        assert_eq!(shown, "bad\u{fffd}\u{fffd}\\nend");
        let huge = vec![b'a'; 1 << 20];
        assert!(peer_bytes(&huge).len() <= PEER_TEXT_MAX_CHARS + 3);
    }
}
