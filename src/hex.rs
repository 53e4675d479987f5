//! Lower-case hexadecimal: the form of every digest the service writes or signs.
//!
//! A lookup table rather than `format!("{b:02x}")`: the payload digest is encoded once per
//! message, and the formatter machinery cost more than the SHA-256 itself.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes`, two characters per byte.
pub fn lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lower_case_digits_per_byte() {
        assert_eq!(super::lower(&[]), "");
        assert_eq!(super::lower(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
