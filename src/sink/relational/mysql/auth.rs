//! Authentication plugins of the MySQL client: which plugins a server may ask for
//! ([`AuthPolicy`], `sink.require_auth` for the `mysql` engine) and their scrambles.
//!
//! Supported: `caching_sha2_password` (MySQL 8's default; the fast path's SHA-256 scramble, and
//! full authentication only over TLS, where the password is sent inside the verified TLS
//! session as MySQL's own clients do) and `mysql_native_password` (MariaDB's and older MySQL's
//! default: a SHA-1 scramble, SHA-1 from `ring`). Never supported, refused before anything is
//! sent for them: cleartext plugins (`mysql_clear_password`, `dialog`, `sha256_password`
//! outside TLS), full `caching_sha2_password` authentication over plain TCP (it needs RSA
//! encryption with the server's public key, which `ring` does not offer), and every other
//! plugin (MariaDB's `client_ed25519`, `gssapi`...).
//!
//! Pure functions over bytes: the scrambles are checked against PyMySQL's in
//! tests/mysql_client.rs and against fixed vectors below.

use ring::digest;

/// One authentication plugin the client can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    CachingSha2,
    Native,
}

impl Plugin {
    pub fn name(self) -> &'static str {
        match self {
            Plugin::CachingSha2 => "caching_sha2_password",
            Plugin::Native => "mysql_native_password",
        }
    }

    /// The plugin a server names, `None` for a plugin this client never answers.
    pub fn from_name(name: &str) -> Option<Plugin> {
        match name {
            "caching_sha2_password" => Some(Plugin::CachingSha2),
            "mysql_native_password" => Some(Plugin::Native),
            _ => None,
        }
    }

    /// The answer to `nonce` for `password`; empty for an empty password (as the server
    /// expects for an account without one).
    pub fn scramble(self, password: &[u8], nonce: &[u8]) -> Vec<u8> {
        if password.is_empty() {
            return Vec::new();
        }
        match self {
            Plugin::CachingSha2 => scramble_caching_sha2(password, nonce),
            Plugin::Native => scramble_native(password, nonce),
        }
    }
}

/// The plugins a server may ask for (`sink.require_auth` of a `mysql` engine sink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthPolicy {
    pub caching_sha2: bool,
    pub native: bool,
}

impl Default for AuthPolicy {
    /// Both challenge-response plugins: MariaDB has only `mysql_native_password`, MySQL 8
    /// defaults to `caching_sha2_password`. A shop on MySQL 8 narrows it to
    /// `caching_sha2_password`.
    fn default() -> Self {
        AuthPolicy {
            caching_sha2: true,
            native: true,
        }
    }
}

impl AuthPolicy {
    /// Parses `caching_sha2_password,mysql_native_password` (comma-separated, each once).
    pub fn parse(text: &str) -> Result<AuthPolicy, &'static str> {
        let mut p = AuthPolicy {
            caching_sha2: false,
            native: false,
        };
        if text.trim().is_empty() {
            return Err("must name at least one plugin (caching_sha2_password, \
                        mysql_native_password)");
        }
        for name in text.split(',') {
            let slot = match name.trim() {
                "caching_sha2_password" => &mut p.caching_sha2,
                "mysql_native_password" => &mut p.native,
                "mysql_clear_password" | "dialog" | "sha256_password" => {
                    return Err("cleartext plugins are never allowed (the password would \
                                leave the client as it is)")
                }
                _ => {
                    return Err("must be a comma-separated list of caching_sha2_password, \
                                mysql_native_password")
                }
            };
            if *slot {
                return Err("names a plugin twice");
            }
            *slot = true;
        }
        Ok(p)
    }

    pub fn allows(&self, p: Plugin) -> bool {
        match p {
            Plugin::CachingSha2 => self.caching_sha2,
            Plugin::Native => self.native,
        }
    }

    /// The plugin offered first when the server's default is not allowed.
    pub fn preferred(&self) -> Plugin {
        if self.caching_sha2 {
            Plugin::CachingSha2
        } else {
            Plugin::Native
        }
    }

    pub fn names(&self) -> String {
        [Plugin::CachingSha2, Plugin::Native]
            .into_iter()
            .filter(|p| self.allows(*p))
            .map(Plugin::name)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Checks a plugin the server asks for; the error names it (as peer text) and the list.
    pub fn check(&self, server_name: &str) -> Result<Plugin, String> {
        let shown = crate::text::peer::PeerText::with_limit(server_name, 64);
        match Plugin::from_name(server_name) {
            Some(p) if self.allows(p) => Ok(p),
            Some(_) => Err(format!(
                "the server asked for authentication plugin {shown}, which sink.require_auth \
                 ({}) does not allow; nothing was sent for it",
                self.names()
            )),
            None => Err(format!(
                "the server asked for authentication plugin {shown}, which this client never \
                 answers (cleartext or unsupported; allowed: {}); nothing was sent for it",
                self.names()
            )),
        }
    }
}

fn sha1(parts: &[&[u8]]) -> Vec<u8> {
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    for p in parts {
        ctx.update(p);
    }
    ctx.finish().as_ref().to_vec()
}

fn sha256(parts: &[&[u8]]) -> Vec<u8> {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    ctx.finish().as_ref().to_vec()
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// `mysql_native_password`: SHA1(password) XOR SHA1(nonce + SHA1(SHA1(password))).
pub fn scramble_native(password: &[u8], nonce: &[u8]) -> Vec<u8> {
    let stage1 = sha1(&[password]);
    let stage2 = sha1(&[&stage1]);
    xor(&stage1, &sha1(&[nonce, &stage2]))
}

/// `caching_sha2_password`: SHA256(password) XOR SHA256(SHA256(SHA256(password)) + nonce).
pub fn scramble_caching_sha2(password: &[u8], nonce: &[u8]) -> Vec<u8> {
    let p1 = sha256(&[password]);
    let p2 = sha256(&[&p1]);
    xor(&p1, &sha256(&[&p2, nonce]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &[u8] = b"abcdefghijklmnopqrst";

    #[test]
    fn scrambles_match_fixed_vectors() {
        // Computed with PyMySQL 1.1 (pymysql._auth.scramble_native_password and
        // scramble_caching_sha2); tests/mysql_client.rs recomputes them live.
        assert_eq!(
            crate::text::hex::lower(&scramble_native(b"secret", NONCE)),
            "8817c50fa779daef010ee7577825b0847df9842e"
        );
        assert_eq!(
            crate::text::hex::lower(&scramble_caching_sha2(b"secret", NONCE)),
            "c76e2898612a4cf042c77fa8c4702c4c64c0c2c557c53c4d75595aaa6abae809"
        );
        assert!(Plugin::Native.scramble(b"", NONCE).is_empty());
        // SHA-1 itself (FIPS 180 "abc").
        assert_eq!(
            crate::text::hex::lower(&sha1(&[b"abc"])),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    #[test]
    fn policy_parses_and_refuses_cleartext() {
        assert_eq!(
            AuthPolicy::parse("caching_sha2_password").unwrap(),
            AuthPolicy {
                caching_sha2: true,
                native: false
            }
        );
        assert!(AuthPolicy::parse("mysql_clear_password")
            .unwrap_err()
            .contains("cleartext"));
        assert!(AuthPolicy::parse("").is_err());
        assert!(AuthPolicy::parse("mysql_native_password,mysql_native_password").is_err());
        let only_sha2 = AuthPolicy::parse("caching_sha2_password").unwrap();
        let e = only_sha2.check("mysql_native_password").unwrap_err();
        assert!(e.contains("does not allow"), "{e}");
        let e = AuthPolicy::default().check("dialog\n").unwrap_err();
        assert!(e.contains("never answers") && !e.contains('\n'), "{e}");
        assert_eq!(
            AuthPolicy::default().check("mysql_native_password"),
            Ok(Plugin::Native)
        );
    }
}
