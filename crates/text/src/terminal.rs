//! What may reach an operator's terminal from data someone else chose (a publisher's subject,
//! headers and payload; a spool record): one rule for which characters are escaped, used by
//! the log's peer text (`PeerText`, in `text/peer.rs`), `svc inspect` (text and jsonl) and
//! `svc spool inspect`.
//!
//! Escaped: C0 controls, DEL and C1 controls (U+009B is a one-byte CSI: it starts an escape
//! sequence on many terminals), the bidi embeddings and overrides U+202A-U+202E, the isolates
//! U+2066-U+2069, the marks U+200E, U+200F and U+061C (they reorder what is shown around
//! them), the line and paragraph separators U+2028, U+2029 (a new line in some viewers), and
//! the invisible characters that hide or join text without showing (U+180E, U+200B-U+200D,
//! U+2060-U+2064, U+FEFF, the tag characters U+E0000-U+E007F).

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::Value;

/// True for a character a terminal or a log viewer may act on instead of showing.
pub fn is_terminal_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200d}'
                | '\u{2060}'..='\u{2064}'
                | '\u{feff}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// A text line with every terminal control shown as `\u{..}` (other characters, backslashes
/// included, as they are: a line whose parts were escaped already is not escaped twice).
pub fn text_line(line: &str) -> Cow<'_, str> {
    if !line.chars().any(is_terminal_control) {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        if is_terminal_control(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `v` as one line of JSON in which every terminal control is a `\uXXXX` escape: the same
/// JSON value for a parser, nothing raw for a terminal (serde_json escapes C0 only).
pub fn json_line(v: &Value) -> String {
    let text = serde_json::to_string(v).unwrap_or_else(|_| "null".into());
    if !text.chars().any(is_terminal_control) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        // Invariant: outside strings, serde_json writes ASCII punctuation, digits and
        // letters only, so every control found here sits inside a string.
        if is_terminal_control(c) {
            // UTF-16 units: a tag character (beyond U+FFFF) is a surrogate pair in JSON.
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(out, "\\u{:04x}", unit);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Cuts every string inside `v` to `max_chars` characters (a cut string ends in `...`), so
/// one field cannot make a line of any length.
pub fn bound_strings(v: &mut Value, max_chars: usize) {
    match v {
        Value::String(s) => {
            if let Some((at, _)) = s.char_indices().nth(max_chars) {
                s.truncate(at);
                s.push_str("...");
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| bound_strings(i, max_chars)),
        Value::Object(m) => m.values_mut().for_each(|i| bound_strings(i, max_chars)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character the issue names, and one of each class.
    const HOSTILE: &[char] = &[
        '\u{1b}',
        '\u{7f}',
        '\u{9b}',
        '\u{9d}',
        '\u{202a}',
        '\u{202e}',
        '\u{2066}',
        '\u{2069}',
        '\u{200e}',
        '\u{200f}',
        '\u{061c}',
        '\u{2028}',
        '\u{2029}',
        '\n',
        '\u{200b}',
        '\u{200d}',
        '\u{2060}',
        '\u{feff}',
        '\u{180e}',
        '\u{e0041}',
        '\u{e007f}',
    ];

    #[test]
    fn every_terminal_control_is_escaped_in_text_and_json() {
        let text: String = HOSTILE.iter().flat_map(|c| [*c, 'x']).collect();
        let line = text_line(&text);
        assert!(!line.chars().any(is_terminal_control), "{line}");
        assert!(line.contains("\\u{9b}x\\u{9d}x\\u{202a}"), "{line}");
        let v = serde_json::json!({"s": text, "n": [1, "\u{202e}"]});
        let json = json_line(&v);
        assert!(!json.chars().any(is_terminal_control), "{json}");
        assert!(json.contains("\\u009bx"), "{json}");
        // A tag character is a surrogate pair, as JSON writes characters beyond U+FFFF.
        assert!(json.contains("\\udb40\\udc41x"), "{json}");
        // The same JSON value for a parser.
        assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), v);
        assert!(matches!(text_line("plain \\ text é"), Cow::Borrowed(_)));
    }

    #[test]
    fn strings_are_bounded_everywhere_in_a_value() {
        let mut v = serde_json::json!({"a": "x".repeat(5000), "b": ["é".repeat(20)], "c": 7});
        bound_strings(&mut v, 10);
        assert_eq!(v["a"], format!("{}...", "x".repeat(10)));
        assert_eq!(v["b"][0], format!("{}...", "é".repeat(10)));
        assert_eq!(v["c"], 7);
    }
}
