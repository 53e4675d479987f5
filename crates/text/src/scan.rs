//! Finding the few bytes that need escaping in text that mostly needs none, eight bytes at a
//! time: the relational sink escapes every string of every row (JSON for PostgreSQL, SQL
//! literals for MySQL), and a byte-by-byte loop cost more than the rest of building the row.
//!
//! The word tests are exact for "some byte of the word is ..." (the classic zero-byte test
//! `(x - 0x01..) & !x & 0x80..` can misplace the byte, never miss or invent one), so a word
//! they pass is scanned byte by byte and a word they refuse holds no such byte.

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Some byte of `w` is below `n` (`n` at most 128).
pub fn has_less(w: u64, n: u8) -> bool {
    less_mask(w, n) != 0
}

/// Some byte of `w` is `b`.
pub fn has_byte(w: u64, b: u8) -> bool {
    byte_mask(w, b) != 0
}

/// Not zero when some byte of `w` is below `n` (`n` at most 128); masks of several tests are
/// or-ed before the one branch.
pub fn less_mask(w: u64, n: u8) -> u64 {
    w.wrapping_sub(LO * u64::from(n)) & !w & HI
}

/// Not zero when some byte of `w` is `b`.
pub fn byte_mask(w: u64, b: u8) -> u64 {
    less_mask(w ^ (LO * u64::from(b)), 1)
}

/// The first index at or after `from` whose byte is `special`. `word_has` tells whether an
/// 8-byte word may hold one: it must be true whenever one of the word's bytes is special, and
/// may be true for others (their bytes are then checked one by one).
pub fn find(
    bytes: &[u8],
    from: usize,
    word_has: impl Fn(u64) -> bool,
    special: impl Fn(u8) -> bool,
) -> Option<usize> {
    let mut i = from.min(bytes.len());
    while let Some(word) = bytes.get(i..i + 8) {
        let w = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        if word_has(w) {
            if let Some(p) = word.iter().position(|&b| special(b)) {
                return Some(i + p);
            }
        }
        i += 8;
    }
    bytes[i..].iter().position(|&b| special(b)).map(|p| i + p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_tests_are_exact() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Words rich in the bytes under test.
            let w = x & 0x7f3f_ff1f_5c22_0a27;
            let bytes = w.to_le_bytes();
            for b in [0u8, b'\'', b'"', b'\\', b'\n', 0x1a, 0xff] {
                assert_eq!(has_byte(w, b), bytes.contains(&b), "{w:#x} {b}");
            }
            for n in [1u8, 0x20, 0x80] {
                assert_eq!(has_less(w, n), bytes.iter().any(|&c| c < n), "{w:#x} {n}");
            }
        }
    }

    #[test]
    fn find_sees_every_special_byte_at_every_offset() {
        let json = |w: u64| has_less(w, 0x20) || has_byte(w, b'"') || has_byte(w, b'\\');
        let special = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
        for len in 0..40 {
            for at in 0..len {
                for s in [b'"', b'\\', 0, 0x1f] {
                    let mut text = vec![b'a'; len];
                    text[at] = s;
                    for from in 0..=at {
                        assert_eq!(find(&text, from, json, special), Some(at));
                    }
                    assert_eq!(find(&text, at + 1, json, special), None);
                }
            }
            let plain = "é😀 x".repeat(len);
            assert_eq!(find(plain.as_bytes(), 0, json, special), None);
            // A word test that passes words without a special byte finds the same.
            let mut text = "\u{1}x".repeat(len).into_bytes();
            text.push(b'"');
            let quote = |b: u8| b == b'"';
            assert_eq!(
                find(&text, 0, |w| has_less(w, 0x20), quote),
                Some(text.len() - 1)
            );
        }
    }

    /// atk51d: `find` against a byte-by-byte scan over random bytes rich in the special ones
    /// (every byte 0x00-0x1f, `'`, `"`, `\`, 0x7f, UTF-8 lead and continuation bytes), from
    /// every start, for the JSON and both MySQL predicates.
    #[test]
    fn find_is_a_naive_scan_over_random_text() {
        const PALETTE: &[u8] =
            b"\0\x01\x08\x09\n\x0b\x0c\r\x1a\x1f \"'\\az\x7f\x80\xbf\xc3\xe2\xf0\xff";
        let json = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
        let my = |b: u8| matches!(b, 0 | b'\'' | b'\\' | b'\n' | b'\r' | 0x1a);
        let nbe = |b: u8| b == b'\'';
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 41) as usize;
            let dense = next() % 4;
            let text: Vec<u8> = (0..len)
                .map(|_| match next() % (1 + dense * 8) {
                    0 => PALETTE[(next() % PALETTE.len() as u64) as usize],
                    _ => b'a' + (next() % 26) as u8,
                })
                .collect();
            for from in 0..=len + 1 {
                let naive = |p: &dyn Fn(u8) -> bool| {
                    text.get(from..)
                        .and_then(|t| t.iter().position(|&b| p(b)))
                        .map(|q| q + from)
                };
                let w_json =
                    |w| (less_mask(w, 0x20) | byte_mask(w, b'"') | byte_mask(w, b'\\')) != 0;
                let w_my =
                    |w| (less_mask(w, 0x20) | byte_mask(w, b'\'') | byte_mask(w, b'\\')) != 0;
                assert_eq!(
                    find(&text, from, w_json, json),
                    naive(&json),
                    "{text:?} {from}"
                );
                assert_eq!(find(&text, from, w_my, my), naive(&my), "{text:?} {from}");
                let w_nbe = |w| has_byte(w, b'\'');
                assert_eq!(
                    find(&text, from, w_nbe, nbe),
                    naive(&nbe),
                    "{text:?} {from}"
                );
            }
        }
    }
}
