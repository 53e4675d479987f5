//! Lower-case hexadecimal: the form of every digest the service writes or signs.
//!
//! A lookup table rather than `format!("{b:02x}")`: the payload digest is encoded once per
//! message, and the formatter machinery cost more than the SHA-256 itself.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two digits of every byte value, looked up once per byte (a digit at a time into a
/// zeroed buffer cost twice as much per digest).
const PAIRS: [[u8; 2]; 256] = {
    let mut t = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [DIGITS[b >> 4], DIGITS[b & 0x0f]];
        b += 1;
    }
    t
};

/// Lower-case hex of `bytes`, two characters per byte.
pub fn lower(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(*b)]);
    }
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Lower-case hex of the SHA-256 digest of `data`: the payload digest of every envelope, and
/// the exporter's short digest of a subject family.
pub fn sha256(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    lower(&Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lower_case_digits_per_byte() {
        assert_eq!(super::lower(&[]), "");
        assert_eq!(super::lower(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        let every: Vec<u8> = (0..=255).collect();
        let by_format: String = every.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(super::lower(&every), by_format);
    }
}
