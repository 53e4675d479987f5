//! Authentication plugins of the MySQL client: which plugins a server may ask for
//! ([`AuthPolicy`], `sink.require_auth` for the `mysql` engine) and their scrambles.
//!
//! Supported: `caching_sha2_password` (MySQL 8's default; the fast path's SHA-256 scramble;
//! full authentication over TLS, where the password is sent inside the verified TLS session as
//! MySQL's own clients do, or over plain TCP only with `allow_rsa_key_exchange`: the password
//! XOR the nonce, RSA-OAEP (SHA-1, as MySQL and PyMySQL use) encrypted to the public key the
//! server sends when asked, [`rsa_encrypt_password`]) and `mysql_native_password` (MariaDB's
//! and older MySQL's default: a SHA-1 scramble, SHA-1 from `ring`). Never supported, refused
//! before anything is sent for them: cleartext plugins (`mysql_clear_password`, `dialog`,
//! `sha256_password` outside TLS) and every other plugin (`gssapi`, `unix_socket`...).
//! MariaDB's `client_ed25519` is answered: an Ed25519 signature of the server's 32-byte nonce
//! with the secret scalar and prefix taken from SHA-512(password) itself (not from a 32-byte
//! seed, so `ring`, which only takes a seed, cannot make it; ed25519-dalek's `hazmat`
//! `ExpandedSecretKey` does, [`sign_ed25519`], checked against the real MariaDB).
//!
//! The server's RSA key asked for over plain TCP is not authenticated: a man in the middle can
//! send its own key and decrypt the password. Hence the flag is off by default and documented
//! as such (docs/sinks/relational.md).
//!
//! Pure functions over bytes: the scrambles are checked against PyMySQL's in
//! tests/mysql_client.rs and against fixed vectors below; the RSA-OAEP encryption is decrypted
//! by Python's `cryptography` (compared with PyMySQL's XOR) and by `openssl pkeyutl`.

use base64::Engine as _;
use ring::digest;
use rsa::traits::PublicKeyParts;
use svc_text::secret_bytes::{wipe, SecretBytes};

/// One authentication plugin the client can answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    CachingSha2,
    Native,
    /// MariaDB's `client_ed25519` (server plugin `ed25519`).
    Ed25519,
}

impl Plugin {
    pub fn name(self) -> &'static str {
        match self {
            Plugin::CachingSha2 => "caching_sha2_password",
            Plugin::Native => "mysql_native_password",
            Plugin::Ed25519 => "client_ed25519",
        }
    }

    /// The plugin a server names, `None` for a plugin this client never answers.
    pub fn from_name(name: &str) -> Option<Plugin> {
        match name {
            "caching_sha2_password" => Some(Plugin::CachingSha2),
            "mysql_native_password" => Some(Plugin::Native),
            "client_ed25519" => Some(Plugin::Ed25519),
            _ => None,
        }
    }

    /// The answer to `nonce` for `password`; empty for an empty password (as the server
    /// expects for an account without one), except Ed25519's, which always signs.
    pub fn scramble(self, password: &[u8], nonce: &[u8]) -> Vec<u8> {
        match self {
            Plugin::Ed25519 => sign_ed25519(password, nonce).to_vec(),
            _ if password.is_empty() => Vec::new(),
            Plugin::CachingSha2 => scramble_caching_sha2(password, nonce),
            Plugin::Native => scramble_native(password, nonce),
        }
    }

    /// The nonce length the plugin's authentication switch carries.
    pub fn nonce_len(self) -> usize {
        match self {
            Plugin::Ed25519 => 32,
            _ => 20,
        }
    }
}

/// The plugins a server may ask for (`sink.require_auth` of a `mysql` engine sink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthPolicy {
    pub caching_sha2: bool,
    pub native: bool,
    pub ed25519: bool,
    /// `caching_sha2_password` full authentication over plain TCP with the RSA key the server
    /// sends when asked (`sink.allow_rsa_key_exchange`; off by default: a man in the middle
    /// can send its own key).
    pub rsa_key_exchange: bool,
}

impl Default for AuthPolicy {
    /// Every challenge-response plugin: MariaDB defaults to `mysql_native_password` (and offers
    /// `ed25519`), MySQL 8 to `caching_sha2_password`. A shop narrows it to the plugin its
    /// accounts use (e.g. `caching_sha2_password` on MySQL 8, `client_ed25519` on MariaDB).
    fn default() -> Self {
        AuthPolicy {
            caching_sha2: true,
            native: true,
            ed25519: true,
            rsa_key_exchange: false,
        }
    }
}

impl AuthPolicy {
    /// Parses `caching_sha2_password,mysql_native_password` (comma-separated, each once).
    pub fn parse(text: &str) -> Result<AuthPolicy, &'static str> {
        let mut p = AuthPolicy {
            caching_sha2: false,
            native: false,
            ed25519: false,
            rsa_key_exchange: false,
        };
        if text.trim().is_empty() {
            return Err("must name at least one plugin (caching_sha2_password, \
                        mysql_native_password, client_ed25519)");
        }
        for name in text.split(',') {
            let slot = match name.trim() {
                "caching_sha2_password" => &mut p.caching_sha2,
                "mysql_native_password" => &mut p.native,
                "client_ed25519" | "ed25519" => &mut p.ed25519,
                "mysql_clear_password" | "dialog" | "sha256_password" => {
                    return Err("cleartext plugins are never allowed (the password would \
                                leave the client as it is)")
                }
                _ => {
                    return Err("must be a comma-separated list of caching_sha2_password, \
                                mysql_native_password, client_ed25519")
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
            Plugin::Ed25519 => self.ed25519,
        }
    }

    /// The plugin named in the handshake response when the server's default is not allowed:
    /// the server then switches to the account's plugin, checked again. Never Ed25519 (its
    /// nonce is the switch's 32 bytes, not the handshake's 20): with only `client_ed25519`
    /// allowed, `mysql_native_password` is named with an empty answer, which reveals nothing.
    pub fn preferred(&self) -> Plugin {
        if self.caching_sha2 {
            Plugin::CachingSha2
        } else {
            Plugin::Native
        }
    }

    pub fn names(&self) -> String {
        [Plugin::CachingSha2, Plugin::Native, Plugin::Ed25519]
            .into_iter()
            .filter(|p| self.allows(*p))
            .map(Plugin::name)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Checks a plugin the server asks for; the error names it (as peer text) and the list.
    pub fn check(&self, server_name: &str) -> Result<Plugin, String> {
        let shown = svc_text::peer::PeerText::with_limit(server_name, 64);
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

/// The digests below are of passwords (or of what stands for one): held in wiping owners.
fn sha1(parts: &[&[u8]]) -> SecretBytes {
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    for p in parts {
        ctx.update(p);
    }
    SecretBytes::copy_of(ctx.finish().as_ref())
}

fn sha256(parts: &[&[u8]]) -> SecretBytes {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    SecretBytes::copy_of(ctx.finish().as_ref())
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// `mysql_native_password`: SHA1(password) XOR SHA1(nonce + SHA1(SHA1(password))).
pub fn scramble_native(password: &[u8], nonce: &[u8]) -> Vec<u8> {
    let stage1 = sha1(&[password]);
    let stage2 = sha1(&[stage1.expose()]);
    xor(stage1.expose(), sha1(&[nonce, stage2.expose()]).expose())
}

/// MariaDB's `client_ed25519`: the Ed25519 signature of `nonce` whose secret scalar (clamped)
/// and nonce prefix are the two halves of SHA-512(password) (MariaDB's `crypto_sign` in
/// plugin/auth_ed25519), the public key that scalar times the base point.
pub fn sign_ed25519(password: &[u8], nonce: &[u8]) -> [u8; 64] {
    use ed25519_dalek::hazmat::{raw_sign, ExpandedSecretKey};
    let mut az = [0u8; 64];
    az.copy_from_slice(digest::digest(&digest::SHA512, password).as_ref());
    let esk = ExpandedSecretKey::from_bytes(&az);
    // ed25519-dalek is built without its `zeroize` feature: `esk` is not wiped on drop.
    wipe(&mut az);
    let public = ed25519_dalek::VerifyingKey::from(&esk);
    raw_sign::<sha2::Sha512>(&esk, nonce, &public).to_bytes()
}

/// The public key MariaDB stores for an ed25519 account (`PASSWORD('...')` of the `ed25519`
/// plugin is its base64 without padding), for tests.
pub fn ed25519_public_key(password: &[u8]) -> [u8; 32] {
    let mut az = [0u8; 64];
    az.copy_from_slice(digest::digest(&digest::SHA512, password).as_ref());
    let esk = ed25519_dalek::hazmat::ExpandedSecretKey::from_bytes(&az);
    wipe(&mut az);
    ed25519_dalek::VerifyingKey::from(&esk).to_bytes()
}

/// `caching_sha2_password`: SHA256(password) XOR SHA256(SHA256(SHA256(password)) + nonce).
pub fn scramble_caching_sha2(password: &[u8], nonce: &[u8]) -> Vec<u8> {
    let p1 = sha256(&[password]);
    let p2 = sha256(&[p1.expose()]);
    xor(p1.expose(), sha256(&[p2.expose(), nonce]).expose())
}

/// Largest PEM key accepted from a server (a 4096-bit SPKI PEM is about 800 bytes).
pub const MAX_PUBLIC_KEY_PEM_BYTES: usize = 8192;
/// Smallest RSA modulus accepted (the `rsa` crate refuses more than 4096 bits).
pub const MIN_RSA_BITS: usize = 2048;
const SHA1_LEN: usize = 20;

/// A server's RSA public key: PEM, SubjectPublicKeyInfo (`BEGIN PUBLIC KEY`, what MySQL
/// sends) or PKCS#1 (`BEGIN RSA PUBLIC KEY`); at least [`MIN_RSA_BITS`]. Errors never quote
/// the text.
pub fn parse_public_key(pem: &[u8]) -> Result<rsa::RsaPublicKey, String> {
    use rsa::pkcs1::DecodeRsaPublicKey;
    use rsa::pkcs8::DecodePublicKey;
    if pem.len() > MAX_PUBLIC_KEY_PEM_BYTES {
        return Err(format!(
            "the server's RSA key is larger than {MAX_PUBLIC_KEY_PEM_BYTES} bytes"
        ));
    }
    let text = std::str::from_utf8(pem).map_err(|_| "the server's RSA key is not PEM text")?;
    let text = text.trim_matches(|c: char| c == '\0' || c.is_ascii_whitespace());
    let (label, body) = pem_body(text).ok_or("the server's RSA key is not one PEM block")?;
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| "the server's RSA key is not valid base64")?;
    let key = match label {
        "PUBLIC KEY" => rsa::RsaPublicKey::from_public_key_der(&der).ok(),
        "RSA PUBLIC KEY" => rsa::RsaPublicKey::from_pkcs1_der(&der).ok(),
        _ => return Err("the server's key is not an RSA public key PEM block".into()),
    }
    .ok_or("the server's RSA key is malformed (or over 4096 bits)")?;
    if key.n().bits() < MIN_RSA_BITS {
        return Err(format!(
            "the server's RSA key has {} bits (at least {MIN_RSA_BITS} required)",
            key.n().bits()
        ));
    }
    Ok(key)
}

/// The label and the base64 body (whitespace removed) of the single PEM block `text` is.
fn pem_body(text: &str) -> Option<(&str, String)> {
    let rest = text.strip_prefix("-----BEGIN ")?;
    let (label, rest) = rest.split_once("-----")?;
    let end = format!("-----END {label}-----");
    let body = rest.strip_suffix(end.as_str())?;
    Some((
        label,
        body.chars().filter(|c| !c.is_ascii_whitespace()).collect(),
    ))
}

/// MGF1 with SHA-1 (RFC 8017 B.2.1): `len` bytes.
fn mgf1_sha1(seed: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + SHA1_LEN);
    let mut counter = 0u32;
    while out.len() < len {
        out.extend_from_slice(sha1(&[seed, &counter.to_be_bytes()]).expose());
        counter += 1;
    }
    out.truncate(len);
    out
}

/// EME-OAEP encoding with SHA-1, MGF1-SHA-1 and an empty label (RFC 8017 7.1.1 step 2) of
/// `msg` for a modulus of `k` bytes, with `seed` (20 random bytes). `msg` is a password (XOR
/// a public nonce) and the encoding can be undone without a key: both buffers are wiping
/// owners, each allocated once at its final size.
pub fn oaep_sha1_encode(
    msg: &[u8],
    k: usize,
    seed: &[u8; SHA1_LEN],
) -> Result<SecretBytes, String> {
    if k < 2 * SHA1_LEN + 2 || msg.len() > k - 2 * SHA1_LEN - 2 {
        return Err(format!(
            "the password is too long for the server's RSA key (at most {} bytes)",
            k.saturating_sub(2 * SHA1_LEN + 3)
        ));
    }
    let mut em = SecretBytes::with_capacity(k);
    let out = em.expose_mut();
    out.push(0);
    out.extend_from_slice(seed);
    out.extend_from_slice(sha1(&[b""]).expose());
    out.resize(k - msg.len() - 1, 0);
    out.push(1);
    out.extend_from_slice(msg);
    // out = 0 || seed || db; mask db with MGF1(seed), then the seed with MGF1(masked db).
    let (seed_part, db) = out[1..].split_at_mut(SHA1_LEN);
    for (b, m) in db.iter_mut().zip(mgf1_sha1(seed, k - SHA1_LEN - 1)) {
        *b ^= m;
    }
    for (b, m) in seed_part.iter_mut().zip(mgf1_sha1(db, SHA1_LEN)) {
        *b ^= m;
    }
    Ok(em)
}

/// `caching_sha2_password` full authentication over plain TCP: (password + NUL) XOR the
/// nonce (repeated), RSA-OAEP-SHA1 encrypted to the server's key `pem`. What PyMySQL's
/// `sha2_rsa_encrypt` and MySQL's client send.
pub fn rsa_encrypt_password(password: &[u8], nonce: &[u8], pem: &[u8]) -> Result<Vec<u8>, String> {
    let key = parse_public_key(pem)?;
    if nonce.is_empty() {
        return Err("empty authentication nonce".into());
    }
    let mut msg = SecretBytes::with_capacity(password.len() + 1);
    msg.expose_mut().extend_from_slice(password);
    msg.expose_mut().push(0);
    for (i, b) in msg.expose_mut().iter_mut().enumerate() {
        *b ^= nonce[i % nonce.len()];
    }
    let mut seed = [0u8; SHA1_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
        .map_err(|_| "no random bytes for RSA-OAEP")?;
    let k = key.size();
    let em = oaep_sha1_encode(msg.expose(), k, &seed)?;
    // The big integer of the plaintext is the rsa crate's (not wiped).
    let c = rsa::BigUint::from_bytes_be(em.expose()).modpow(key.e(), key.n());
    let c = c.to_bytes_be();
    let mut out = vec![0u8; k - c.len()];
    out.extend_from_slice(&c);
    Ok(out)
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
            svc_text::hex::lower(&scramble_native(b"secret", NONCE)),
            "8817c50fa779daef010ee7577825b0847df9842e"
        );
        assert_eq!(
            svc_text::hex::lower(&scramble_caching_sha2(b"secret", NONCE)),
            "c76e2898612a4cf042c77fa8c4702c4c64c0c2c557c53c4d75595aaa6abae809"
        );
        assert!(Plugin::Native.scramble(b"", NONCE).is_empty());
        // SHA-1 itself (FIPS 180 "abc").
        assert_eq!(
            svc_text::hex::lower(sha1(&[b"abc"]).expose()),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    #[test]
    fn policy_parses_and_refuses_cleartext() {
        assert_eq!(
            AuthPolicy::parse("caching_sha2_password").unwrap(),
            AuthPolicy {
                caching_sha2: true,
                native: false,
                ed25519: false,
                rsa_key_exchange: false,
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

    #[test]
    fn oaep_encoding_matches_rfc_8017_and_refuses_bad_keys() {
        // RSAES-OAEP intermediate values of RSA Laboratories' pkcs-1v2-1d2-vec (oaep-int.txt),
        // 1024-bit key: the message, the seed and the encoded message EM (start and end).
        let hex = |t: &str| -> Vec<u8> {
            (0..t.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&t[i..i + 2], 16).unwrap())
                .collect()
        };
        let msg = hex("d436e99569fd32a7c8a05bbc90d32c49");
        let seed: [u8; 20] = hex("aafd12f659cae63489b479e5076ddec2f06cb58f")
            .try_into()
            .unwrap();
        let em = oaep_sha1_encode(&msg, 128, &seed).unwrap();
        assert_eq!(em.len(), 128);
        assert_eq!(
            svc_text::hex::lower(&em.expose()[..16]),
            "00eb7a19ace9e3006350e329504b45e2"
        );
        assert!(oaep_sha1_encode(&[0; 87], 128, &seed).is_err());
        assert!(oaep_sha1_encode(&[0; 86], 128, &seed).is_ok());
        for bad in [
            &b"not a key"[..],
            b"-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----\n",
            b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ] {
            let e = parse_public_key(bad).unwrap_err();
            assert!(!e.contains("AAAA") && !e.contains("!!!"), "{e}");
        }
        assert!(parse_public_key(&vec![b'A'; MAX_PUBLIC_KEY_PEM_BYTES + 1])
            .unwrap_err()
            .contains("larger than"));
    }
}
