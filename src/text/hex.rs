//! Lower-case hexadecimal: the form of every digest the service writes or signs.
//!
//! A lookup table rather than `format!("{b:02x}")`: the payload digest is encoded once per
//! message, and the formatter machinery cost more than the SHA-256 itself.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes`, two characters per byte.
pub fn lower(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[(b >> 4) as usize];
        pair[1] = DIGITS[(b & 0x0f) as usize];
    }
    String::from_utf8(out).expect("hex digits are ASCII")
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lower_case_digits_per_byte() {
        assert_eq!(super::lower(&[]), "");
        assert_eq!(super::lower(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
