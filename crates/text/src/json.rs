//! JSON text written by hand where serde's machinery cost more than the text: strings
//! escaped exactly as serde_json escapes them, so what is written is byte for byte what
//! `serde_json::to_writer` wrote (the relational sink's rows, the envelope's metadata).

/// `s` as a JSON string, escaped as serde_json escapes it (`"`, `\`, control characters);
/// the runs between escapes, found eight bytes at a time ([`crate::scan`]), are copied
/// whole.
pub fn push_str(out: &mut Vec<u8>, s: &str) {
    use crate::scan::{byte_mask, find, less_mask};
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    let mut unicode = *b"\\u0000";
    let word_has = |w| (less_mask(w, 0x20) | byte_mask(w, b'"') | byte_mask(w, b'\\')) != 0;
    while let Some(at) = find(bytes, run, word_has, |b| {
        b < 0x20 || b == b'"' || b == b'\\'
    }) {
        let b = bytes[at];
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            _ => {
                unicode[4] = HEX[usize::from(b >> 4)];
                unicode[5] = HEX[usize::from(b & 15)];
                &unicode
            }
        };
        out.extend_from_slice(&bytes[run..at]);
        out.extend_from_slice(short);
        run = at + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// `n` in decimal, written into `buf` (the formatter's machinery cost more than the digits).
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[at..]).expect("decimal digits are ASCII")
}

/// `items` as a JSON array of strings: what `serde_json::to_string` makes of them.
pub fn string_array(items: &[String]) -> String {
    let mut out = Vec::with_capacity(2 + items.iter().map(|s| s.len() + 3).sum::<usize>());
    out.push(b'[');
    for (n, s) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        push_str(&mut out, s);
    }
    out.push(b']');
    String::from_utf8(out).expect("JSON text is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_arrays_are_what_serde_writes() {
        let odd: Vec<String> = (0u8..0x80)
            .map(|b| char::from(b).to_string())
            .chain(["é😀\u{2028}", "a\"b\\c", "", "\u{7f}x\u{1f}"].map(String::from))
            .collect();
        for s in &odd {
            let mut out = Vec::new();
            push_str(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
        for items in [&odd[..], &odd[..1], &[]] {
            assert_eq!(string_array(items), serde_json::to_string(items).unwrap());
        }
        let mut buf = [0; 20];
        for n in [0, 7, 10, 4_294_967_296, u64::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string());
        }
    }
}
