//! Cloud A (OCI) request signatures: signature version 1, the draft-cavage HTTP signature
//! scheme with RSA-SHA256 as the vendor documents it.
//!
//! For a request with a body (`POST`, `PUT`, `PATCH`) the signed headers are, in this order,
//! `date (request-target) host content-length content-type x-content-sha256`; without a body
//! `date (request-target) host`. The signing string is one `name: value` line per signed header
//! joined with `\n` (`(request-target)` is the lower-case method, a space and the path with its
//! query). `x-content-sha256` is the base64 SHA-256 of the body. The header sent is
//!
//! ```text
//! Authorization: Signature version="1",keyId="<key id>",algorithm="rsa-sha256",
//!     headers="date (request-target) host content-length content-type x-content-sha256",
//!     signature="<base64 RSA PKCS#1 v1.5 SHA-256 of the signing string>"
//! ```
//!
//! The key id is `<tenancy>/<user>/<fingerprint>` for an API key and `ST$<session token>` for
//! a resource or instance principal session. Keys are PEM, PKCS#1 (`RSA PRIVATE KEY`) or PKCS#8
//! (`PRIVATE KEY`); encrypted PEM is refused with a clear error (no cipher in the tree to
//! decrypt it). Signing uses `ring`, which requires a 2048-bit or larger modulus, as OCI does.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use sha2::{Digest, Sha256};

use svc_text::secret_bytes::decode_base64_into;
use svc_text::secret_bytes::{SecretBytes, SecretString};

/// Headers signed for a request with a body, in signing order.
pub const BODY_HEADERS: &str =
    "date (request-target) host content-length content-type x-content-sha256";
/// Headers signed for a request without a body.
pub const PLAIN_HEADERS: &str = "date (request-target) host";

/// A private key that could not be used. Messages never contain key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError(pub String);

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeyError {}

/// The DER body of the first PEM block and its label.
fn pem_block(pem: &str) -> Result<(String, SecretBytes), KeyError> {
    let begin = pem
        .find("-----BEGIN ")
        .ok_or_else(|| KeyError("is not a PEM private key (no BEGIN line)".into()))?;
    let rest = &pem[begin + 11..];
    let label_end = rest
        .find("-----")
        .ok_or_else(|| KeyError("is not a PEM private key (malformed BEGIN line)".into()))?;
    let label = rest[..label_end].to_string();
    let body_start = label_end + 5;
    let end_marker = format!("-----END {label}-----");
    let end = rest[body_start..]
        .find(&end_marker)
        .ok_or_else(|| KeyError(format!("PEM block {label} has no END line")))?;
    let body = &rest[body_start..body_start + end];
    if body.contains("Proc-Type:") || body.contains("DEK-Info:") {
        return Err(KeyError(
            "is an encrypted PEM key; this release cannot decrypt keys (decrypt it with `openssl pkey` and protect the file with permissions 0600)".into(),
        ));
    }
    // The body of a private key: built and decoded in wiping owners, each reserved once.
    let mut b64 = SecretString::with_capacity(body.len());
    body.split_whitespace()
        .for_each(|w| b64.expose_mut().push_str(w));
    let mut der = SecretBytes::default();
    decode_base64_into(b64.expose(), der.expose_mut())
        .map_err(|_| KeyError(format!("PEM block {label} is not valid base64")))?;
    Ok((label, der))
}

/// Loads an RSA private key from PEM text (PKCS#1 or PKCS#8).
pub fn load_private_key(pem: &str) -> Result<RsaKeyPair, KeyError> {
    let (label, der) = pem_block(pem)?;
    let parsed = match label.as_str() {
        // ring's key pair keeps its own copy (not wiped on drop); `der` is wiped.
        "RSA PRIVATE KEY" => RsaKeyPair::from_der(der.expose()),
        "PRIVATE KEY" => RsaKeyPair::from_pkcs8(der.expose()),
        "ENCRYPTED PRIVATE KEY" => {
            return Err(KeyError(
                "is an encrypted PKCS#8 key; this release cannot decrypt keys (decrypt it with `openssl pkey` and protect the file with permissions 0600)".into(),
            ))
        }
        other => {
            return Err(KeyError(format!(
                "is a PEM {other} block, not an RSA private key"
            )))
        }
    };
    parsed.map_err(|e| {
        KeyError(format!(
            "is not a usable RSA private key ({e}; 2048 bits or more required)"
        ))
    })
}

/// RFC 7231 `Date` value (`Thu, 05 Jan 2014 21:31:40 GMT`).
pub fn http_date(t: time::OffsetDateTime) -> String {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        DAYS[t.weekday().number_days_from_monday() as usize],
        t.day(),
        MONTHS[u8::from(t.month()) as usize - 1],
        t.year(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Base64 SHA-256 of a body (`x-content-sha256`).
pub fn content_sha256(body: &[u8]) -> String {
    B64.encode(Sha256::digest(body))
}

/// The request parts that are signed.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// Upper- or lower-case method; signed lower-case.
    pub method: &'a str,
    /// `Host` header exactly as sent.
    pub host: &'a str,
    /// Path with query (`/20180401/metrics`).
    pub path: &'a str,
    /// `(content-type, body)` for requests with a body.
    pub body: Option<(&'a str, &'a [u8])>,
}

/// The signing string and the `headers` parameter for a request sent at `date`.
pub fn signing_string(req: &Request<'_>, date: &str) -> (String, &'static str) {
    let mut s = format!(
        "date: {date}\n(request-target): {} {}\nhost: {}",
        req.method.to_ascii_lowercase(),
        req.path,
        req.host
    );
    match req.body {
        Some((content_type, body)) => {
            s.push_str(&format!(
                "\ncontent-length: {}\ncontent-type: {content_type}\nx-content-sha256: {}",
                body.len(),
                content_sha256(body)
            ));
            (s, BODY_HEADERS)
        }
        None => (s, PLAIN_HEADERS),
    }
}

/// A key id and its private key. `Debug` shows neither.
pub struct Signer {
    key_id: String,
    key: RsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer { <redacted> }")
    }
}

impl Signer {
    pub fn new(key_id: String, key: RsaKeyPair) -> Signer {
        Signer {
            key_id,
            key,
            rng: SystemRandom::new(),
        }
    }

    /// The key id (`<tenancy>/<user>/<fingerprint>` or `ST$<token>`): identifiers and, for a
    /// session, a bearer token. Callers only use it to scrub it from printed text.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Base64 RSA-SHA256 (PKCS#1 v1.5) signature of a string.
    pub fn sign_bytes(&self, data: &[u8]) -> Result<String, KeyError> {
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &self.rng, data, &mut sig)
            .map_err(|_| KeyError("RSA signing failed".into()))?;
        Ok(B64.encode(sig))
    }

    /// The headers to send with the request: `date`, then for a body `content-type`,
    /// `content-length` and `x-content-sha256`, then `authorization`.
    pub fn sign(
        &self,
        req: &Request<'_>,
        now: time::OffsetDateTime,
    ) -> Result<Vec<(String, String)>, KeyError> {
        let date = http_date(now);
        let (string, headers) = signing_string(req, &date);
        let signature = self.sign_bytes(string.as_bytes())?;
        let mut out = vec![("date".to_string(), date)];
        if let Some((content_type, body)) = req.body {
            out.push(("content-type".into(), content_type.to_string()));
            out.push(("content-length".into(), body.len().to_string()));
            out.push(("x-content-sha256".into(), content_sha256(body)));
        }
        out.push((
            "authorization".into(),
            format!(
                "Signature version=\"1\",keyId=\"{}\",algorithm=\"rsa-sha256\",headers=\"{headers}\",signature=\"{signature}\"",
                self.key_id
            ),
        ));
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    /// A test-only RSA 2048 key pair made once by openssl (`genrsa`; `pkey`; `rsa -traditional`;
    /// `rsa -RSAPublicKey_out -outform DER`): (PKCS#8 PEM, PKCS#1 PEM, public key DER
    /// (PKCS#1)). Kept as files so the unit tests need no openssl, and still read keys another
    /// implementation wrote.
    pub(crate) fn openssl_key_pair() -> (String, String, Vec<u8>) {
        (
            include_str!("testdata/test-key.pkcs8.pem").to_string(),
            include_str!("testdata/test-key.pkcs1.pem").to_string(),
            include_bytes!("testdata/test-key.public.der").to_vec(),
        )
    }

    #[test]
    fn http_dates() {
        let t = time::OffsetDateTime::from_unix_timestamp(1_388_957_500).unwrap();
        assert_eq!(http_date(t), "Sun, 05 Jan 2014 21:31:40 GMT");
    }

    #[test]
    fn signing_strings() {
        let body = br#"{"a":1}"#;
        let (s, h) = signing_string(
            &Request {
                method: "POST",
                host: "telemetry-ingestion.eu-frankfurt-1.oraclecloud.com",
                path: "/20180401/metrics",
                body: Some(("application/json", body)),
            },
            "Thu, 05 Jan 2014 21:31:40 GMT",
        );
        assert_eq!(h, BODY_HEADERS);
        assert_eq!(
            s,
            format!(
                "date: Thu, 05 Jan 2014 21:31:40 GMT\n(request-target): post /20180401/metrics\nhost: telemetry-ingestion.eu-frankfurt-1.oraclecloud.com\ncontent-length: 7\ncontent-type: application/json\nx-content-sha256: {}",
                content_sha256(body)
            )
        );
        let (s, h) = signing_string(
            &Request {
                method: "GET",
                host: "h",
                path: "/x?y=1",
                body: None,
            },
            "D",
        );
        assert_eq!(
            (s.as_str(), h),
            (
                "date: D\n(request-target): get /x?y=1\nhost: h",
                PLAIN_HEADERS
            )
        );
    }

    #[test]
    fn signatures_verify_with_the_public_key() {
        let (pkcs8, pkcs1, public) = openssl_key_pair();
        for pem in [&pkcs8, &pkcs1] {
            let signer = Signer::new("t/u/f".into(), load_private_key(pem).unwrap());
            let body = b"{}";
            let req = Request {
                method: "POST",
                host: "h",
                path: "/20180401/metrics",
                body: Some(("application/json", body)),
            };
            let now = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
            let headers = signer.sign(&req, now).unwrap();
            let auth = &headers
                .iter()
                .find(|(n, _)| n == "authorization")
                .unwrap()
                .1;
            assert!(auth.starts_with("Signature version=\"1\",keyId=\"t/u/f\",algorithm=\"rsa-sha256\",headers=\"date (request-target) host content-length content-type x-content-sha256\",signature=\""));
            let sig = auth
                .rsplit("signature=\"")
                .next()
                .unwrap()
                .trim_end_matches('"');
            let sig = B64.decode(sig).unwrap();
            let (string, _) = signing_string(&req, &http_date(now));
            UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &public)
                .verify(string.as_bytes(), &sig)
                .expect("signature verifies");
            assert!(UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &public)
                .verify(b"tampered", &sig)
                .is_err());
            assert_eq!(format!("{signer:?}"), "Signer { <redacted> }");
        }
    }

    #[test]
    fn key_errors_name_no_material() {
        let e = load_private_key("nothing").unwrap_err();
        assert_eq!(e.0, "is not a PEM private key (no BEGIN line)");
        let enc = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAAA\n-----END RSA PRIVATE KEY-----\n";
        assert!(load_private_key(enc)
            .unwrap_err()
            .0
            .contains("encrypted PEM key"));
        let enc8 =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        assert!(load_private_key(enc8)
            .unwrap_err()
            .0
            .contains("encrypted PKCS#8"));
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(
            load_private_key(cert).unwrap_err().0,
            "is a PEM CERTIFICATE block, not an RSA private key"
        );
        let junk = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LW1hdGVyaWFs\n-----END PRIVATE KEY-----\n";
        let e = load_private_key(junk).unwrap_err().0;
        assert!(e.starts_with("is not a usable RSA private key"), "{e}");
        assert!(!e.contains("c2VjcmV0"));
    }
}
