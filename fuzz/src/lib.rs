//! Properties shared by the fuzz targets (`fuzz_targets/*.rs`): what every error shown to an
//! operator, and every line of text that leaves the exporter, must satisfy whatever bytes a
//! peer sent. A violated property panics, which libFuzzer reports as a crash with its input.

/// An error as an operator reads it (Display): non-empty and free of control characters, so a
/// peer can neither forge a log line (`\n`, `\r`) nor drive a terminal (ESC, C1, bidi controls).
/// `max_chars` bounds its length (peer text is cut at 256 characters where it is quoted).
pub fn assert_clean_display(what: &str, text: &str, max_chars: usize) {
    assert!(!text.is_empty(), "{what}: empty error text");
    if let Some(c) = text.chars().find(|&c| is_unsafe_char(c)) {
        panic!("{what}: control character {c:?} in error text {text:?}");
    }
    let n = text.chars().count();
    assert!(
        n <= max_chars,
        "{what}: error text of {n} characters (limit {max_chars})"
    );
}

/// Like [`assert_clean_display`] for a multi-line document (exposition text): each line clean.
pub fn assert_clean_lines(what: &str, text: &str) {
    for line in text.split('\n') {
        if let Some(c) = line.chars().find(|&c| is_unsafe_char(c)) {
            panic!("{what}: control character {c:?} in line {line:?}");
        }
    }
}

/// C0, DEL, C1, line/paragraph separators and the bidi embedding/isolate controls: what
/// `svc::text::peer::PeerText` escapes.
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A bound for error texts that quote peer text: `PeerText` shows at most 256 characters, each
/// escaped to at most 10 (`\u{10ffff}`), and an error may quote up to three such pieces.
/// Inputs are at most 4096 bytes here (libFuzzer's default `-max_len`); the unit tests of
/// each parser check the bound with megabyte inputs.
pub const MAX_ERROR_CHARS: usize = 3 * (256 * 10 + 3) + 512;

/// Splits fuzz input into a selector byte and the rest (for targets that drive several entry
/// points or configurations from one input).
pub fn split_selector(data: &[u8]) -> Option<(u8, &[u8])> {
    data.split_first().map(|(s, rest)| (*s, rest))
}
