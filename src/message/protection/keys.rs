//! Key material of payload protection: where it comes from (an environment variable or a file
//! only the service user can read and owns) and how it is held (never printed, never in `Debug`).
//!
//! The JSON config only *names* a key's source; the bytes are read when the runner (or
//! `svc decrypt` / `svc verify-custody`) starts, by [`KeySource::load`]. Every error names
//! the source and the reason, never a byte of the value.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::document::grammar::is_env_var_name;
use crate::document::reader::ObjectReader;
use crate::files::owner;
use crate::text::secret_bytes::{wipe_vec, SecretString};

/// Largest key file read (a base64 key is a few dozen bytes; anything large is a mistake).
pub const MAX_KEY_FILE_BYTES: u64 = 4096;

/// Secret bytes. `Debug` and `Display` show only the length.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(bytes: Vec<u8>) -> Secret {
        Secret(bytes)
    }

    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

impl Drop for Secret {
    /// Overwrites the whole allocation before it is freed (`crate::text::secret_bytes`: what
    /// that guarantees and what it cannot).
    fn drop(&mut self) {
        wipe_vec(&mut self.0);
    }
}

/// Where a key's bytes come from. The config holds this, never the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The variable holds the base64 text.
    Env(String),
    /// The file holds the base64 text; it must not be readable by group or others.
    File(PathBuf),
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Env(v) => write!(f, "environment variable {v}"),
            KeySource::File(p) => write!(f, "key file {}", p.display()),
        }
    }
}

impl KeySource {
    /// Reads `<env_key> | <file_key>` of a key entry: exactly one must be set.
    pub fn read(
        r: &mut ObjectReader<'_>,
        env_key: &'static str,
        file_key: &'static str,
    ) -> Option<KeySource> {
        let env = r.opt_string(env_key);
        let file = r.opt_nonempty(file_key);
        match (env, file) {
            (Some(_), Some(_)) => {
                r.problem(
                    env_key,
                    format!("set either {env_key} or {file_key}, not both"),
                );
                None
            }
            (Some(v), None) if is_env_var_name(&v) => Some(KeySource::Env(v)),
            (Some(_), None) => {
                r.problem(env_key, "must be an environment variable name");
                None
            }
            (None, Some(p)) => Some(KeySource::File(PathBuf::from(p))),
            (None, None) => {
                r.problem(env_key, format!("is required (or {file_key})"));
                None
            }
        }
    }

    /// The decoded key: base64 (standard alphabet, surrounding whitespace ignored) of
    /// `min..=max` bytes. Files readable by group or others are refused.
    /// The file's or variable's text and the decoding buffer are wiped on every path.
    pub fn load(&self, min: usize, max: usize) -> Result<Secret, String> {
        self.load_with(min, max, &mut SecretString::default())
    }

    /// [`KeySource::load`] reading the text into `text`, which is zeroed (its whole capacity,
    /// left as that many NUL characters) before this returns, on every path: a test can see
    /// the text was wiped.
    pub fn load_with(
        &self,
        min: usize,
        max: usize,
        text: &mut SecretString,
    ) -> Result<Secret, String> {
        let result = self.read_and_decode(min, max, text);
        text.zero();
        result
    }

    fn read_and_decode(
        &self,
        min: usize,
        max: usize,
        text: &mut SecretString,
    ) -> Result<Secret, String> {
        *text = match self {
            KeySource::Env(name) => {
                crate::text::secret_bytes::env_secret(name).map_err(|e| match e {
                    crate::text::secret_bytes::EnvSecretError::NotSet => {
                        format!("{self} is not set")
                    }
                    crate::text::secret_bytes::EnvSecretError::NotUnicode => {
                        format!("{self} is not valid UTF-8")
                    }
                })?
            }
            KeySource::File(path) => read_private_file(path).map_err(|e| format!("{self}: {e}"))?,
        };
        let mut bytes = Secret(Vec::new());
        // On an error `bytes` drops here and is wiped.
        decode_base64_into(text.expose(), &mut bytes.0)
            .map_err(|_| format!("{self} does not hold standard base64"))?;
        if bytes.0.len() < min || bytes.0.len() > max {
            let want = if min == max {
                format!("{min}")
            } else {
                format!("{min} to {max}")
            };
            return Err(format!(
                "{self} decodes to {} bytes; {want} bytes are required",
                bytes.0.len()
            ));
        }
        Ok(bytes)
    }
}

/// Decodes base64 into a buffer that never reallocates (in `text::secret_bytes`, which the
/// exporter's OCI signer shares).
pub use crate::text::secret_bytes::decode_base64_into;

/// Reads a small file that must be a regular file readable by its owner only. Checked on the
/// opened handle (so the check and the read concern the same file): opened without following
/// a link at the name and without blocking (a FIFO there is refused at once), owned by the
/// service's user or root (as root, a key another account owns is theirs to choose).
pub fn read_private_file(path: &Path) -> Result<SecretString, String> {
    read_private_file_up_to(path, MAX_KEY_FILE_BYTES)
}

/// [`read_private_file`] for a private file that may be larger than a key: at most `max`
/// bytes (a NATS credentials file holds a JWT as well as the seed).
pub fn read_private_file_up_to(path: &Path, max: u64) -> Result<SecretString, String> {
    use std::os::unix::fs::PermissionsExt;
    let file = open_trusted(path)?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "is readable or writable by group or others (mode {mode:04o}); \
             restrict it to the service user (chmod 600)"
        ));
    }
    let mut text = SecretString::with_capacity(read_capacity(meta.len(), max));
    read_bounded(file, max, text.expose_mut())?;
    Ok(text)
}

/// Room for a file of `len` bytes (as stat said, at most `max`) and one more byte, so reading
/// it whole never reallocates (a reallocation would leave a copy of a secret unwiped).
fn read_capacity(len: u64, max: u64) -> usize {
    usize::try_from(len.min(max) + 1).unwrap_or(usize::MAX)
}

/// Reads a small public file (an Ed25519 public key): not secret, but trusted (whoever can
/// write it chooses which signatures pass), so the same rules as a private key file except
/// readability: a regular file, no link, owned by the service's user or root, and writable by
/// its owner only.
pub fn read_public_file(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let file = open_trusted(path)?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "is writable by group or others (mode {mode:04o}); \
             restrict writing to its owner (chmod 644)"
        ));
    }
    let mut text = String::new();
    read_bounded(file, MAX_KEY_FILE_BYTES, &mut text)?;
    Ok(text)
}

/// Opens a key file: no link at the name, never blocking, a regular file owned by the
/// service's user or root.
fn open_trusted(path: &Path) -> Result<std::fs::File, String> {
    let (file, stat) = owner::open_regular(path).map_err(|e| e.to_string())?;
    owner::check_owner(&stat, true).map_err(|e| e.to_string())?;
    Ok(file)
}

fn read_bounded(file: std::fs::File, max: u64, text: &mut String) -> Result<(), String> {
    file.take(max + 1)
        .read_to_string(text)
        .map_err(|e| format!("cannot read: {e}"))?;
    if text.len() as u64 > max {
        return Err(format!("is larger than {max} bytes"));
    }
    Ok(())
}

/// True for a key id: 1 to 64 characters of `A-Z a-z 0-9 _ - .`.
pub fn is_key_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn debug_never_shows_the_bytes() {
        let s = Secret::new(b"hunter2hunter2".to_vec());
        let d = format!("{s:?}");
        assert!(!d.contains("hunter2"), "{d}");
        assert!(d.contains("14 bytes"));
    }

    #[test]
    fn key_files_must_be_private_and_base64_of_the_right_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        std::fs::write(&path, format!("{key}\n")).unwrap();
        let src = KeySource::File(path.clone());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = src.load(32, 32).unwrap_err();
        assert!(e.contains("group or others") && e.contains("0640"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(src.load(32, 32).unwrap().expose(), &[7u8; 32]);
        let e = src.load(16, 16).unwrap_err();
        assert!(e.contains("32 bytes") && !e.contains(&key), "{e}");
        std::fs::write(&path, "not base64 at all!").unwrap();
        let e = src.load(32, 32).unwrap_err();
        assert!(e.contains("base64") && !e.contains("at all"), "{e}");
    }

    #[test]
    fn key_files_are_never_links_fifos_or_writable_by_others() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        std::fs::write(d.join("k"), &key).unwrap();
        std::fs::set_permissions(d.join("k"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(d.join("k"), d.join("link")).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(d.join("fifo"))
            .status()
            .unwrap();
        assert!(status.success());
        let started = std::time::Instant::now();
        let e = KeySource::File(d.join("fifo")).load(32, 32).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let e = KeySource::File(d.join("link")).load(32, 32).unwrap_err();
        assert!(e.contains("symbolic link") && !e.contains(&key), "{e}");
        assert!(read_public_file(&d.join("link"))
            .unwrap_err()
            .contains("symbolic link"));
        std::fs::set_permissions(d.join("k"), std::fs::Permissions::from_mode(0o664)).unwrap();
        let e = read_public_file(&d.join("k")).unwrap_err();
        assert!(e.contains("writable by group or others"), "{e}");
        std::fs::set_permissions(d.join("k"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_public_file(&d.join("k")).unwrap(), key);
    }

    /// The key file's text is wiped once the key is decoded: read through `load_with`, the
    /// buffer that held it is all zeros afterwards, on success and on a refused length.
    #[test]
    fn the_key_files_text_is_wiped_after_loading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        std::fs::write(&path, format!("{key}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let src = KeySource::File(path);
        let mut text = SecretString::default();
        let secret = src.load_with(32, 32, &mut text).unwrap();
        assert_eq!(secret.expose(), &[7u8; 32]);
        assert!(text.len() > key.len(), "the text was read into the buffer");
        assert!(text.expose().bytes().all(|b| b == 0), "text left behind");
        let mut text = SecretString::default();
        let e = src.load_with(16, 16, &mut text).unwrap_err();
        assert!(e.contains("32 bytes") && !e.contains(&key), "{e}");
        assert!(text.len() > key.len() && text.expose().bytes().all(|b| b == 0));
    }

    #[test]
    fn env_keys_report_the_variable_not_the_value() {
        let e = KeySource::Env("SVC_TEST_KEYS_SURELY_UNSET".into())
            .load(32, 32)
            .unwrap_err();
        assert!(e.contains("SVC_TEST_KEYS_SURELY_UNSET is not set"), "{e}");
    }
}
