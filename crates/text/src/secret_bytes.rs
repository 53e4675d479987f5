//! Wiping secrets from memory when they are no longer needed: [`wipe`], [`wipe_vec`] and
//! [`wipe_string`] overwrite a buffer with zeros, and [`SecretBytes`] / [`SecretString`] own a
//! secret, wipe it when dropped and never print it (`Debug` and `Display` show
//! `<redacted>`). The crate forbids `unsafe`, so this is written in safe Rust only.
//!
//! What is guaranteed:
//! - the zeros are written: after the stores, the buffer is passed to
//!   [`std::hint::black_box`], which the optimizer must assume reads it, so the stores cannot
//!   be dropped as "dead before the free" (the usual way a plain `fill(0)` before a `drop`
//!   disappears);
//! - [`wipe_vec`] and [`wipe_string`] overwrite the whole capacity, not only the length: bytes
//!   a `truncate` or a failed decode left past the end are wiped too (the vector is grown to
//!   its capacity with zeros, which never reallocates, then cleared);
//! - the owners wipe on drop, on every path (an early `?` return included), and never
//!   reallocate on their own; [`SecretBytes::with_capacity`] reserves once so a buffer built
//!   in place does not leave a smaller copy behind in freed memory.
//!
//! What it cannot do:
//! - copies it does not see: a `Vec` that grew before it reached an owner left its old
//!   allocation to the allocator unwiped; a value moved (a fixed array on the stack, a
//!   register spill) can leave a copy in a stack slot; [`std::hint::black_box`] is a hint
//!   the Rust documentation calls "best effort", not a guarantee of the language;
//! - copies made by code the service does not own: the process environment block (a
//!   `*_env` variable stays there for the life of the process: the relational sinks read
//!   it again at every connect), the kernel's socket and page cache, and libraries that hold keys
//!   in their own types: ring's `hmac::Key` and `Ed25519KeyPair` and its digest outputs
//!   (`Copy` types), ed25519-dalek's `ExpandedSecretKey` (built without its `zeroize`
//!   feature here), rustls' session keys and send buffers, ureq's header values, the nats
//!   client's `Options` (user, password, token as plain strings, kept for reconnects; its
//!   CONNECT fields are its own wiping type) and the nkeys key pair;
//! - pages swapped out or written to a core dump before the wipe. The systemd units in
//!   contrib/ set `LimitCORE=0` (no core dump) and `MemoryDenyWriteExecute=yes`; swap is the
//!   host's choice (encrypted swap, or none).

use std::fmt;

/// What a secret prints as (the secrets module re-exports it for scrubbed text).
pub const REDACTED: &str = "<redacted>";

/// Overwrites `buf` with zeros; the stores are kept (see the module comment).
pub fn wipe(buf: &mut [u8]) {
    buf.fill(0);
    std::hint::black_box(&mut *buf);
}

/// Overwrites all of `v`'s capacity with zeros and leaves it empty, keeping the allocation.
pub fn wipe_vec(v: &mut Vec<u8>) {
    zero_capacity(v);
    v.clear();
}

/// Grows `v` to its capacity (which never reallocates, and makes the spare bytes reachable)
/// and overwrites all of it with zeros; `v` is left full of zeros.
pub fn zero_capacity(v: &mut Vec<u8>) {
    let cap = v.capacity();
    v.resize(cap, 0);
    wipe(v);
}

/// Overwrites all of `s`'s capacity with zeros and leaves it empty, keeping the allocation.
pub fn wipe_string(s: &mut String) {
    let mut bytes = std::mem::take(s).into_bytes();
    wipe_vec(&mut bytes);
    // Empty, so valid UTF-8; the same allocation goes back.
    *s = String::from_utf8(bytes).unwrap_or_default();
}

/// Secret bytes, wiped on drop. `Debug` and `Display` print `<redacted>`. No `PartialEq`: a
/// comparison of secrets must be constant-time (`ring::constant_time`), which `==` is not.
#[derive(Clone, Default)]
pub struct SecretBytes(Vec<u8>);

impl SecretBytes {
    /// Takes ownership of `bytes` (no copy).
    pub fn new(bytes: Vec<u8>) -> SecretBytes {
        SecretBytes(bytes)
    }

    /// An empty buffer with room for `n` bytes, to be built in place without reallocation.
    pub fn with_capacity(n: usize) -> SecretBytes {
        SecretBytes(Vec::with_capacity(n))
    }

    /// A copy of `bytes` in an allocation of exactly their length.
    pub fn copy_of(bytes: &[u8]) -> SecretBytes {
        let mut v = Vec::with_capacity(bytes.len());
        v.extend_from_slice(bytes);
        SecretBytes(v)
    }

    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The buffer, to fill in place. A push beyond the capacity reallocates and leaves the
    /// old allocation unwiped: reserve first.
    pub fn expose_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Wipes now and leaves the buffer empty (dropping does the same).
    pub fn wipe(&mut self) {
        wipe_vec(&mut self.0);
    }

    /// Overwrites the whole capacity with zeros and leaves that many zero bytes, so a test
    /// can see what was wiped ([`zero_capacity`]).
    pub fn zero(&mut self) {
        zero_capacity(&mut self.0);
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        wipe_vec(&mut self.0);
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Secret text, wiped on drop. `Debug` and `Display` print `<redacted>` (no `PartialEq`,
/// as [`SecretBytes`]).
#[derive(Clone, Default)]
pub struct SecretString(String);

impl SecretString {
    /// Takes ownership of `s` (no copy).
    pub fn new(s: String) -> SecretString {
        SecretString(s)
    }

    /// An empty string with room for `n` bytes, to be read into without reallocation.
    pub fn with_capacity(n: usize) -> SecretString {
        SecretString(String::with_capacity(n))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The string, to fill in place (reserve first: see [`SecretBytes::expose_mut`]).
    pub fn expose_mut(&mut self) -> &mut String {
        &mut self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Wipes now and leaves the string empty (dropping does the same).
    pub fn wipe(&mut self) {
        wipe_string(&mut self.0);
    }

    /// Overwrites the whole capacity with zeros and leaves that many NUL characters (valid
    /// UTF-8), so a test can see what was wiped.
    pub fn zero(&mut self) {
        let mut bytes = std::mem::take(&mut self.0).into_bytes();
        zero_capacity(&mut bytes);
        self.0 = String::from_utf8(bytes).unwrap_or_default();
    }
}

impl Drop for SecretString {
    fn drop(&mut self) {
        wipe_string(&mut self.0);
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Why [`env_secret`] found no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvSecretError {
    NotSet,
    NotUnicode,
}

/// Reads the environment variable `name` into a [`SecretString`] without an intermediate
/// copy (a non-UTF-8 value is wiped before the error returns). The environment block itself
/// keeps the value (see the module comment).
pub fn env_secret(name: &str) -> Result<SecretString, EnvSecretError> {
    use std::os::unix::ffi::OsStringExt;
    let raw = std::env::var_os(name).ok_or(EnvSecretError::NotSet)?;
    match raw.into_string() {
        Ok(s) => Ok(SecretString::new(s)),
        Err(raw) => {
            wipe_vec(&mut raw.into_vec());
            Err(EnvSecretError::NotUnicode)
        }
    }
}

/// Reads the file at `path` into a [`SecretString`] with no other copy: the bytes go into one
/// wiping buffer reserved at the file's size plus one (so `read_to_end` does not grow it,
/// unless the file grows while it is read), then are checked as UTF-8 in place. Text that is
/// not UTF-8 (a DER key named by mistake) is wiped before the `InvalidData` error returns,
/// which `std::fs::read_to_string` does not do.
pub fn read_secret_text(path: &std::path::Path) -> std::io::Result<SecretString> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut buf = SecretBytes::with_capacity(usize::try_from(len).unwrap_or(0).saturating_add(1));
    f.read_to_end(buf.expose_mut())?;
    match String::from_utf8(std::mem::take(buf.expose_mut())) {
        Ok(text) => Ok(SecretString::new(text)),
        Err(e) => {
            wipe_vec(&mut e.into_bytes());
            Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "stream did not contain valid UTF-8",
            ))
        }
    }
}

/// Decodes standard base64 (surrounding whitespace ignored) into `out`, reserved once for the
/// largest result so the decoder never reallocates (no unwiped copy of a key is left in freed
/// memory). On an error `out` may hold part of the key: the caller owns it and wipes it.
pub fn decode_base64_into(text: &str, out: &mut Vec<u8>) -> Result<(), base64::DecodeError> {
    use base64::Engine as _;
    let text = text.trim();
    out.clear();
    out.reserve_exact(base64::decoded_len_estimate(text.len()));
    base64::engine::general_purpose::STANDARD.decode_vec(text, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wipe_overwrites_every_byte() {
        let mut buf = *b"hunter2hunter2";
        wipe(&mut buf);
        assert_eq!(buf, [0u8; 14]);
    }

    #[test]
    fn the_whole_capacity_is_overwritten_not_only_the_length() {
        let mut v = b"correct horse battery staple".to_vec();
        let cap = v.capacity();
        v.truncate(7);
        zero_capacity(&mut v);
        assert_eq!(v.len(), cap, "the bytes past the length are reached");
        assert!(v.iter().all(|&b| b == 0), "{v:?}");
        let mut w = b"correct horse battery staple".to_vec();
        w.truncate(7);
        wipe_vec(&mut w);
        assert!(w.is_empty());
        assert_eq!(w.capacity(), cap, "the allocation is kept");
    }

    #[test]
    fn wipe_string_empties_and_keeps_the_allocation() {
        let mut s = String::with_capacity(64);
        s.push_str("s3cr3t-password");
        wipe_string(&mut s);
        assert!(s.is_empty());
        assert_eq!(s.capacity(), 64);
    }

    #[test]
    fn debug_and_display_never_show_the_value() {
        let b = SecretBytes::copy_of(b"hunter2");
        let s = SecretString::new("hunter2".to_string());
        for shown in [
            format!("{b:?}"),
            format!("{b}"),
            format!("{s:?}"),
            format!("{s}"),
            format!("{:?}", Some(&s)),
            format!("{b:#?}"),
        ] {
            assert_eq!(shown.replace("Some(", "").replace(')', ""), REDACTED);
            assert!(!shown.contains("hunter2"));
        }
    }

    #[test]
    fn read_secret_text_reads_utf8_and_refuses_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (text, binary) = (dir.path().join("t"), dir.path().join("b"));
        std::fs::write(&text, "-----BEGIN PRIVATE KEY-----\nabc\n").unwrap();
        std::fs::write(&binary, [0x30, 0x82, 0xff, 0xfe]).unwrap();
        let t = read_secret_text(&text).unwrap();
        assert_eq!(t.expose(), "-----BEGIN PRIVATE KEY-----\nabc\n");
        let e = read_secret_text(&binary).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let e = read_secret_text(&dir.path().join("none")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn env_secret_reads_without_printing_and_names_the_reason() {
        // PATH is set for every test run; the environment is not changed here (other test
        // threads read it).
        let s = env_secret("PATH").unwrap();
        assert_eq!(s.expose(), std::env::var("PATH").unwrap());
        assert_eq!(format!("{s:?}"), REDACTED);
        assert_eq!(
            env_secret("SVC_TEST_SECRET_BYTES_VAR_SURELY_UNSET").unwrap_err(),
            EnvSecretError::NotSet
        );
    }
}
