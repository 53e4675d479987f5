//! Cloud A (OCI) `instance_principal`: the vendor's instance-principal federation, as the OCI
//! SDKs implement it (`InstancePrincipalsSecurityTokenProvider`, `X509FederationClient`).
//!
//! 1. Instance metadata service v2 (`http://169.254.169.254/opc/v2/`, header
//!    `Authorization: Bearer Oracle`, never through a proxy): `instance/region`,
//!    `identity/cert.pem` (leaf certificate), `identity/key.pem` (its private key),
//!    `identity/intermediate.pem`.
//! 2. The tenancy OCID from the leaf certificate's subject: the `OU` (or `O`) attribute
//!    `opc-tenant:<ocid>` (older certificates: `opc-identity:<ocid>`).
//! 3. A fresh RSA 2048 session key pair, in memory only.
//! 4. `POST https://auth.<region>.oraclecloud.com/v1/x509` with
//!    `{"certificate", "publicKey", "intermediateCertificates", "purpose": "DEFAULT",
//!    "fingerprintAlgorithm": "SHA256"}` (base64 DER, no PEM armour), signed (OCI signature
//!    v1, headers `date (request-target) content-length content-type x-content-sha256`: no
//!    `host`, as in the Python, Go and Ruby SDKs) with key id
//!    `<tenancy>/fed-x509-sha256/<SHA-256 fingerprint of the leaf>` and the leaf private key.
//!    The answer is `{"token": "<JWT>"}`.
//! 5. Requests are then signed with key id `ST$<token>` and the session private key.
//!
//! The token is fetched once per export run (a run lasts far less than its lifetime).
//! Test-only hooks (loopback hosts only): `SVC_OCI_METADATA_OVERRIDE` replaces
//! `http://169.254.169.254`, `SVC_OCI_FEDERATION_OVERRIDE` replaces
//! `https://auth.<region>.oraclecloud.com`.
//!
//! Errors name the step; none contains a key, a certificate, a token or an OCID.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::signature::RsaKeyPair;
use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey};
use sha2::{Digest, Sha256};

use super::super::cloud;
use super::identity::{jwt_expiry, Identity};
use super::signature::{self, load_private_key, Signer};
use svc_host::Env;
use svc_text::peer::PeerText;

/// Test-only replacement of `http://169.254.169.254` (loopback only).
pub const METADATA_OVERRIDE_ENV: &str = "SVC_OCI_METADATA_OVERRIDE";
/// Test-only replacement of `https://auth.<region>.oraclecloud.com` (loopback only).
pub const FEDERATION_OVERRIDE_ENV: &str = "SVC_OCI_FEDERATION_OVERRIDE";
/// The instance metadata service.
pub const METADATA_BASE: &str = "http://169.254.169.254";
/// Path of the federation endpoint.
pub const FEDERATION_PATH: &str = "/v1/x509";
/// Largest metadata or federation answer read.
const MAX_ANSWER_BYTES: u64 = 65_536;

/// Why the instance principal identity could not be established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceError {
    /// A step failed at run time (service unreachable, refused, bad answer): exit 1.
    Failed(String),
    /// The environment is unusable (a bad override variable, unusable material): exit 2.
    Invalid(String),
}

impl InstanceError {
    pub fn message(&self) -> &str {
        match self {
            InstanceError::Failed(m) | InstanceError::Invalid(m) => m,
        }
    }
}

/// Region short codes the metadata service may answer with, mapped to region identifiers
/// (the SDKs' table for the commercial realm).
const SHORT_REGIONS: &[(&str, &str)] = &[
    ("ams", "eu-amsterdam-1"),
    ("arn", "eu-stockholm-1"),
    ("auh", "me-abudhabi-1"),
    ("bog", "sa-bogota-1"),
    ("bom", "ap-mumbai-1"),
    ("cdg", "eu-paris-1"),
    ("cwl", "uk-cardiff-1"),
    ("dxb", "me-dubai-1"),
    ("fra", "eu-frankfurt-1"),
    ("gru", "sa-saopaulo-1"),
    ("hyd", "ap-hyderabad-1"),
    ("iad", "us-ashburn-1"),
    ("icn", "ap-seoul-1"),
    ("jed", "me-jeddah-1"),
    ("jnb", "af-johannesburg-1"),
    ("kix", "ap-osaka-1"),
    ("lhr", "uk-london-1"),
    ("lin", "eu-milan-1"),
    ("mad", "eu-madrid-1"),
    ("mel", "ap-melbourne-1"),
    ("mrs", "eu-marseille-1"),
    ("mtz", "il-jerusalem-1"),
    ("nrt", "ap-tokyo-1"),
    ("ord", "us-chicago-1"),
    ("phx", "us-phoenix-1"),
    ("qro", "mx-queretaro-1"),
    ("scl", "sa-santiago-1"),
    ("sin", "ap-singapore-1"),
    ("sjc", "us-sanjose-1"),
    ("syd", "ap-sydney-1"),
    ("vap", "sa-valparaiso-1"),
    ("vcp", "sa-vinhedo-1"),
    ("xsp", "ap-singapore-2"),
    ("yny", "ap-chuncheon-1"),
    ("yul", "ca-montreal-1"),
    ("yyz", "ca-toronto-1"),
    ("zrh", "eu-zurich-1"),
];

/// The metadata service's region answer (short code or identifier) -> region identifier.
pub fn region_id(answer: &str) -> Result<String, String> {
    let a = answer.trim().to_ascii_lowercase();
    if let Some((_, id)) = SHORT_REGIONS.iter().find(|(code, _)| *code == a) {
        return Ok((*id).to_string());
    }
    let parts: Vec<&str> = a.split('-').collect();
    let ok = parts.len() >= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric()))
        && parts
            .last()
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
        && a.len() <= 64;
    if ok {
        Ok(a)
    } else {
        Err("the region answer is neither a known region code nor a region identifier".into())
    }
}

/// The DER bodies of every PEM block labelled `label`, in order.
pub fn pem_blocks(pem: &str, label: &str) -> Result<Vec<Vec<u8>>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(i) = rest.find(&begin) {
        let after = &rest[i + begin.len()..];
        let j = after
            .find(&end)
            .ok_or_else(|| format!("a PEM {label} block has no END line"))?;
        let b64: String = after[..j].split_whitespace().collect();
        out.push(
            B64.decode(b64.as_bytes())
                .map_err(|_| format!("a PEM {label} block is not valid base64"))?,
        );
        rest = &after[j + end.len()..];
    }
    Ok(out)
}

/// One DER element: (tag, content, rest). Definite lengths only (DER).
fn der_next(data: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let bad = || "the certificate is not valid DER".to_string();
    let (&tag, rest) = data.split_first().ok_or_else(bad)?;
    if tag & 0x1f == 0x1f {
        return Err(bad()); // multi-byte tags do not occur in the fields read here
    }
    let (&first, mut rest) = rest.split_first().ok_or_else(bad)?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return Err(bad());
        }
        let mut len = 0usize;
        for &b in &rest[..n] {
            len = (len << 8) | b as usize;
        }
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return Err(bad());
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// id-at-organizationalUnitName (2.5.4.11) and id-at-organizationName (2.5.4.10).
const OID_OU: &[u8] = &[0x55, 0x04, 0x0b];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// The `(OID, string value)` attributes of a certificate's subject.
pub fn subject_attributes(cert_der: &[u8]) -> Result<Vec<(Vec<u8>, String)>, String> {
    let bad = |what: &str| format!("the certificate is not valid DER ({what})");
    let (tag, cert, _) = der_next(cert_der)?;
    if tag != SEQUENCE {
        return Err(bad("Certificate"));
    }
    let (tag, mut tbs, _) = der_next(cert)?;
    if tag != SEQUENCE {
        return Err(bad("TBSCertificate"));
    }
    // [0] version (optional), serialNumber, signature, issuer, validity, subject
    let (tag, _, rest) = der_next(tbs)?;
    if tag == 0xa0 {
        tbs = rest;
    }
    for field in ["serialNumber", "signature", "issuer", "validity"] {
        let (_, _, rest) = der_next(tbs).map_err(|_| bad(field))?;
        tbs = rest;
    }
    let (tag, mut subject, _) = der_next(tbs)?;
    if tag != SEQUENCE {
        return Err(bad("subject"));
    }
    let mut out = Vec::new();
    while !subject.is_empty() {
        let (tag, mut rdn, rest) = der_next(subject)?;
        if tag != SET {
            return Err(bad("RelativeDistinguishedName"));
        }
        subject = rest;
        while !rdn.is_empty() {
            let (tag, atv, rest) = der_next(rdn)?;
            if tag != SEQUENCE {
                return Err(bad("AttributeTypeAndValue"));
            }
            rdn = rest;
            let (tag, oid, rest) = der_next(atv)?;
            if tag != OID {
                return Err(bad("attribute type"));
            }
            let (tag, value, _) = der_next(rest)?;
            // UTF8String, PrintableString, T61String, IA5String
            if [0x0c, 0x13, 0x14, 0x16].contains(&tag) {
                if let Ok(s) = std::str::from_utf8(value) {
                    out.push((oid.to_vec(), s.to_string()));
                }
            }
        }
    }
    Ok(out)
}

/// The tenancy OCID of an instance certificate (`OU` or `O` = `opc-tenant:<ocid>` or
/// `opc-identity:<ocid>`).
pub fn tenancy_of(cert_der: &[u8]) -> Result<String, String> {
    let attrs = subject_attributes(cert_der)?;
    for want in [OID_OU, OID_O] {
        for (oid, value) in &attrs {
            if oid.as_slice() != want {
                continue;
            }
            for prefix in ["opc-tenant:", "opc-identity:"] {
                if let Some(ocid) = value.strip_prefix(prefix) {
                    if ocid.starts_with("ocid1.tenancy.")
                        && ocid
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                    {
                        return Ok(ocid.to_string());
                    }
                    return Err(format!(
                        "the leaf certificate's {prefix} attribute is not a tenancy OCID"
                    ));
                }
            }
        }
    }
    Err("the leaf certificate's subject has no opc-tenant: or opc-identity: attribute".into())
}

/// SHA-256 fingerprint of a certificate: colon-separated upper-case hex.
pub fn fingerprint_sha256(cert_der: &[u8]) -> String {
    Sha256::digest(cert_der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A fresh RSA 2048 session key pair: the signing key (never leaves memory) and the public key
/// as DER SubjectPublicKeyInfo.
pub fn session_key_pair() -> Result<(RsaKeyPair, Vec<u8>), String> {
    let mut rng = rand::rngs::OsRng;
    let private = rsa::RsaPrivateKey::new(&mut rng, 2048)
        .map_err(|e| format!("generating the RSA session key pair failed: {e}"))?;
    let public = private
        .to_public_key()
        .to_public_key_der()
        .map_err(|e| format!("encoding the session public key failed: {e}"))?
        .into_vec();
    let pkcs8 = private
        .to_pkcs8_der()
        .map_err(|_| "encoding the session private key failed".to_string())?;
    let key = RsaKeyPair::from_pkcs8(pkcs8.as_bytes())
        .map_err(|_| "the session private key was refused by the signer".to_string())?;
    Ok((key, public))
}

/// The federation request body.
pub fn federation_body(
    leaf_der: &[u8],
    session_public_der: &[u8],
    intermediates: &[Vec<u8>],
) -> Vec<u8> {
    let body = serde_json::json!({
        "certificate": B64.encode(leaf_der),
        "publicKey": B64.encode(session_public_der),
        "intermediateCertificates": intermediates.iter().map(|c| B64.encode(c)).collect::<Vec<_>>(),
        "purpose": "DEFAULT",
        "fingerprintAlgorithm": "SHA256",
    });
    serde_json::to_vec(&body).expect("JSON values always serialize")
}

/// Headers the federation request signs: as the Python, Go and Ruby SDKs do, `host` is not
/// among them (the `Host` header is still sent).
pub const FEDERATION_HEADERS: &str =
    "date (request-target) content-length content-type x-content-sha256";

/// The federation signing string for a JSON body sent at `date`.
pub fn federation_signing_string(body: &[u8], date: &str) -> String {
    format!(
        "date: {date}\n(request-target): post {FEDERATION_PATH}\ncontent-length: {}\ncontent-type: application/json\nx-content-sha256: {}",
        body.len(),
        signature::content_sha256(body)
    )
}

/// The headers of the federation request (`date`, `content-type`, `x-content-sha256`,
/// `authorization`), signed with the leaf key.
pub fn federation_headers(
    leaf: &Signer,
    body: &[u8],
    now: time::OffsetDateTime,
) -> Result<Vec<(String, String)>, signature::KeyError> {
    let date = signature::http_date(now);
    let signature = leaf.sign_bytes(federation_signing_string(body, &date).as_bytes())?;
    Ok(vec![
        ("date".into(), date),
        ("content-type".into(), "application/json".into()),
        ("x-content-sha256".into(), signature::content_sha256(body)),
        (
            "authorization".into(),
            format!(
                "Signature version=\"1\",keyId=\"{}\",algorithm=\"rsa-sha256\",headers=\"{FEDERATION_HEADERS}\",signature=\"{signature}\"",
                leaf.key_id()
            ),
        ),
    ])
}

/// The token of a federation answer.
pub fn token_of(answer: &[u8], now_epoch: i64) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_slice(answer)
        .map_err(|_| "the federation answer is not JSON".to_string())?;
    let token = v
        .get("token")
        .and_then(serde_json::Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or("the federation answer has no token")?;
    if token
        .chars()
        .any(|c| c.is_whitespace() || c == '"' || c.is_control())
    {
        return Err("the federation answer's token is not a session token".into());
    }
    if let Some(exp) = jwt_expiry(token) {
        if exp <= now_epoch {
            return Err(
                "the federation answer's token is already expired (check the clock)".into(),
            );
        }
    }
    Ok(token.to_string())
}

fn read_body(resp: ureq::http::Response<ureq::Body>) -> Result<(u16, Vec<u8>), String> {
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let bytes = body
        .with_config()
        .limit(MAX_ANSWER_BYTES)
        .read_to_vec()
        .map_err(|e| format!("reading the answer failed: {e}"))?;
    Ok((status, bytes))
}

/// The short error description of a failed federation answer (`code` and `message` of OCI's
/// error JSON, cut; nothing else of the body).
pub fn federation_failure(status: u16, body: &[u8]) -> String {
    let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let field = |k: &str| {
        v.as_ref()
            .and_then(|v| v.get(k))
            .and_then(serde_json::Value::as_str)
            .map(|s| PeerText::with_limit(s, 160).to_string())
    };
    match (field("code"), field("message")) {
        (Some(c), Some(m)) => format!("HTTP {status} ({c}: {m})"),
        (Some(c), None) => format!("HTTP {status} ({c})"),
        _ => format!("HTTP {status}"),
    }
}

/// `instance_principal`: the identity from the metadata service and the federation service.
/// Each request takes at most `timeout`, and all of them end by the run's `deadline`.
pub fn identity(
    env: &dyn Env,
    timeout: Duration,
    deadline: &super::super::Deadline,
    now: time::OffsetDateTime,
) -> Result<Identity, InstanceError> {
    let invalid = |e: super::super::ExportError| InstanceError::Invalid(e.to_string());
    let metadata = cloud::loopback_override(env, METADATA_OVERRIDE_ENV)
        .map_err(invalid)?
        .unwrap_or_else(|| METADATA_BASE.to_string());
    let federation_override =
        cloud::loopback_override(env, FEDERATION_OVERRIDE_ENV).map_err(invalid)?;

    // 1. Instance metadata service v2: no proxy may see these answers.
    let md_agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .proxy(None)
        .build()
        .into();
    let fetch = |path: &str| -> Result<String, InstanceError> {
        let step = format!("instance principal step 1 (instance metadata /opc/v2/{path})");
        let limit = deadline
            .cap(timeout)
            .map_err(|e| InstanceError::Failed(format!("{step}: {e}")))?;
        let resp = md_agent
            .get(format!("{metadata}/opc/v2/{path}"))
            .config()
            .timeout_global(Some(limit))
            .build()
            .header("Authorization", "Bearer Oracle")
            .call()
            .map_err(|e| {
                InstanceError::Failed(format!("{step} failed: {}", PeerText::new(&e.to_string())))
            })?;
        let (status, body) =
            read_body(resp).map_err(|e| InstanceError::Failed(format!("{step}: {e}")))?;
        if status != 200 {
            return Err(InstanceError::Failed(format!(
                "{step} answered HTTP {status}"
            )));
        }
        String::from_utf8(body)
            .map_err(|_| InstanceError::Failed(format!("{step}: the answer is not UTF-8 text")))
    };
    let region = region_id(&fetch("instance/region")?).map_err(|e| {
        InstanceError::Failed(format!(
            "instance principal step 1 (instance metadata /opc/v2/instance/region): {e}"
        ))
    })?;
    let leaf_pem = fetch("identity/cert.pem")?;
    let key_pem = fetch("identity/key.pem")?;
    let intermediate_pem = fetch("identity/intermediate.pem")?;
    let material = |what: &str, e: String| {
        InstanceError::Failed(format!(
            "instance principal step 1 (instance metadata identity/{what}): {e}"
        ))
    };
    let leaf = pem_blocks(&leaf_pem, "CERTIFICATE")
        .map_err(|e| material("cert.pem", e))?
        .into_iter()
        .next()
        .ok_or_else(|| material("cert.pem", "no PEM CERTIFICATE block".into()))?;
    let intermediates = pem_blocks(&intermediate_pem, "CERTIFICATE")
        .map_err(|e| material("intermediate.pem", e))?;
    if intermediates.is_empty() {
        return Err(material(
            "intermediate.pem",
            "no PEM CERTIFICATE block".into(),
        ));
    }
    let leaf_key = load_private_key(&key_pem)
        .map_err(|e| material("key.pem", format!("the leaf private key {e}")))?;
    drop(key_pem);

    // 2. The tenancy from the leaf certificate.
    let tenancy = tenancy_of(&leaf).map_err(|e| {
        InstanceError::Failed(format!(
            "instance principal step 2 (tenancy of the leaf certificate): {e}"
        ))
    })?;

    // 3. The session key pair.
    let (session_key, session_public) = session_key_pair()
        .map_err(|e| InstanceError::Failed(format!("instance principal step 3: {e}")))?;

    // 4. The federation request, signed with the leaf key.
    let base =
        federation_override.unwrap_or_else(|| format!("https://auth.{region}.oraclecloud.com"));
    let body = federation_body(&leaf, &session_public, &intermediates);
    let leaf_signer = Signer::new(
        format!("{tenancy}/fed-x509-sha256/{}", fingerprint_sha256(&leaf)),
        leaf_key,
    );
    let step = "instance principal step 4 (federation service /v1/x509)";
    let headers = federation_headers(&leaf_signer, &body, now)
        .map_err(|e| InstanceError::Failed(format!("{step}: signing failed: {e}")))?;
    let agent = super::super::transport::http_agent(timeout).map_err(InstanceError::Invalid)?;
    let limit = deadline
        .cap(timeout)
        .map_err(|e| InstanceError::Failed(format!("{step}: {e}")))?;
    let mut req = agent
        .post(format!("{base}{FEDERATION_PATH}"))
        .config()
        .timeout_global(Some(limit))
        .build();
    // ureq sets Host and Content-Length itself
    for (name, value) in &headers {
        req = req.header(name.as_str(), value.as_str());
    }
    let resp = req
        .send(&body[..])
        .map_err(|e| InstanceError::Failed(format!("{step} failed: {e}")))?;
    let (status, answer) =
        read_body(resp).map_err(|e| InstanceError::Failed(format!("{step}: {e}")))?;
    if status != 200 {
        return Err(InstanceError::Failed(format!(
            "{step} refused the instance certificate: {}",
            federation_failure(status, &answer)
        )));
    }
    let token = token_of(&answer, now.unix_timestamp())
        .map_err(|e| InstanceError::Failed(format!("{step}: {e}")))?;

    // 5. Requests are signed with the session key.
    Ok(Identity {
        signer: Signer::new(format!("ST${token}"), session_key),
        source: "instance principal (session token from the federation service)".into(),
    })
}

#[cfg(test)]
mod tests {
    /// deny.toml ignores RUSTSEC-2023-0071 (the Marvin timing side channel in rsa's
    /// private-key operations) because svc uses rsa only to generate the session key pair and
    /// ring performs every private-key operation. This keeps it so: the rsa crate's paths
    /// appear in this file alone, for generation and encoding, and in the MySQL sink's
    /// public-key encryption (no private key there).
    #[test]
    fn rsa_only_generates_keys() {
        fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    rust_files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        rust_files(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        // Built from parts, so this test's own text is not a use.
        let needle = ["rsa", "::"].concat();
        let allowed = [
            format!("use {needle}pkcs8::{{EncodePrivateKey, EncodePublicKey}};"),
            format!("let private = {needle}RsaPrivateKey::new(&mut rng, 2048)"),
        ];
        let mut uses = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            // A comment that mentions the crate is not a use of it.
            let code = text.lines().filter(|l| !l.trim_start().starts_with("//"));
            for line in code.filter(|l| l.contains(&needle)) {
                uses.push((file.display().to_string(), line.trim().to_string()));
            }
        }
        // The MySQL sink's RSA key exchange encrypts with the server's public key (OAEP with
        // a public exponent): no private key, so no Marvin side channel. Its lines may name
        // public keys and big integers, never a private key or a decryption.
        let public_only = |file: &str, line: &str| {
            file.ends_with("mysql/auth.rs")
                && !["Private", "decrypt", "sign"]
                    .iter()
                    .any(|w| line.contains(w))
        };
        let (mysql, others): (Vec<_>, Vec<_>) = uses
            .iter()
            .partition(|(file, line)| public_only(file, line));
        assert!(mysql.len() <= 8, "{mysql:#?}");
        assert_eq!(others.len(), allowed.len(), "{others:#?}");
        for (file, line) in &others {
            assert!(file.ends_with("instance.rs"), "{file}: {line}");
            assert!(allowed.contains(line), "{file}: {line}");
        }
    }

    use super::*;

    /// Found by `fuzz/fuzz_targets/cloud_answers.rs`: the federation error's `code` and
    /// `message` reached the error text with their control characters.
    #[test]
    fn federation_failures_are_escaped() {
        assert_eq!(
            federation_failure(
                401,
                br#"{"code":"NotAuth\nenticated","message":"pr\u007fvided"}"#
            ),
            "HTTP 401 (NotAuth\\nenticated: pr\\u{7f}vided)"
        );
        assert_eq!(federation_failure(502, b"<html>"), "HTTP 502");
    }

    #[test]
    fn regions() {
        assert_eq!(region_id("fra\n").unwrap(), "eu-frankfurt-1");
        assert_eq!(region_id("IAD").unwrap(), "us-ashburn-1");
        assert_eq!(region_id("eu-frankfurt-1").unwrap(), "eu-frankfurt-1");
        assert_eq!(region_id("us-chicago-1").unwrap(), "us-chicago-1");
        assert!(region_id("xyz").is_err());
        assert!(region_id("eu-frankfurt").is_err());
        assert!(region_id("eu/../x-1").is_err());
    }

    #[test]
    fn tenancy_and_fingerprint_of_openssl_certificates() {
        // Made once with `openssl req -x509 -newkey rsa:2048 -subj SUBJECT`; the fingerprints
        // are what `openssl x509 -noout -fingerprint -sha256` printed for them.
        for (name, pem, fingerprint, want) in [
            ("a", include_str!("testdata/cert-a.pem"), "5C:B8:E8:B0:45:04:DC:BD:DF:2C:D9:82:6A:FF:83:B3:89:8E:62:A4:E2:62:BA:A6:48:91:90:78:61:15:22:1D", Ok("ocid1.tenancy.oc1..aaaatest")),
            ("b", include_str!("testdata/cert-b.pem"), "86:A3:55:FF:EE:FB:52:7F:AF:88:24:5E:33:C8:6D:E6:2A:53:93:17:65:E4:4C:24:70:A2:73:AB:44:27:CF:4B", Ok("ocid1.tenancy.oc1..older")),
            ("c", include_str!("testdata/cert-c.pem"), "7C:3D:C8:85:AB:18:C3:54:16:12:3C:97:D8:03:AD:CF:54:EC:39:C6:EF:EF:CB:88:CB:21:53:9F:CB:2A:C6:7C", Err("the leaf certificate's subject has no opc-tenant: or opc-identity: attribute")),
            ("d", include_str!("testdata/cert-d.pem"), "CD:BD:63:25:80:72:E7:57:4D:4D:08:E6:F0:8D:F1:EF:B4:C3:A5:CC:69:B4:A2:2C:2F:FA:06:46:C6:20:C9:AA", Err("the leaf certificate's opc-tenant: attribute is not a tenancy OCID")),
        ] {
            let der = pem_blocks(pem, "CERTIFICATE").unwrap().remove(0);
            assert_eq!(tenancy_of(&der).as_deref(), want.map_err(str::to_string).as_deref(), "{name}");
            assert_eq!(fingerprint_sha256(&der), fingerprint, "{name}");
        }
        assert!(tenancy_of(b"\x30\x03\x02\x01").is_err());
        assert!(tenancy_of(b"").is_err());
        assert!(pem_blocks(
            "-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----",
            "CERTIFICATE"
        )
        .is_err());
    }

    #[test]
    fn session_keys_sign_and_export_their_public_key() {
        let (key, public) = session_key_pair().unwrap();
        let signer = Signer::new("ST$t".into(), key);
        let sig = B64.decode(signer.sign_bytes(b"data").unwrap()).unwrap();
        // SubjectPublicKeyInfo: SEQUENCE { AlgorithmIdentifier, BIT STRING { RSAPublicKey } }
        let (tag, spki, _) = der_next(&public).unwrap();
        assert_eq!(tag, SEQUENCE);
        let (_, _, rest) = der_next(spki).unwrap();
        let (tag, bits, _) = der_next(rest).unwrap();
        assert_eq!(tag, 0x03);
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            &bits[1..],
        )
        .verify(b"data", &sig)
        .expect("verifies");
        let (_, other) = session_key_pair().unwrap();
        assert_ne!(public, other, "every run has its own key pair");
    }

    #[test]
    fn federation_signature_leaves_out_host() {
        let (key, public) = session_key_pair().unwrap();
        let signer = Signer::new("t/fed-x509-sha256/AB".into(), key);
        let now = time::OffsetDateTime::from_unix_timestamp(1_388_957_500).unwrap();
        let h = federation_headers(&signer, b"{}", now).unwrap();
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["date", "content-type", "x-content-sha256", "authorization"]
        );
        let auth = &h[3].1;
        assert!(auth.starts_with("Signature version=\"1\",keyId=\"t/fed-x509-sha256/AB\",algorithm=\"rsa-sha256\",headers=\"date (request-target) content-length content-type x-content-sha256\",signature=\""), "{auth}");
        let string = federation_signing_string(b"{}", "Sun, 05 Jan 2014 21:31:40 GMT");
        assert_eq!(string, format!("date: Sun, 05 Jan 2014 21:31:40 GMT\n(request-target): post /v1/x509\ncontent-length: 2\ncontent-type: application/json\nx-content-sha256: {}", signature::content_sha256(b"{}")));
        let sig = B64
            .decode(
                auth.rsplit("signature=\"")
                    .next()
                    .unwrap()
                    .trim_end_matches('"'),
            )
            .unwrap();
        let (_, spki, _) = der_next(&public).unwrap();
        let (_, _, rest) = der_next(spki).unwrap();
        let (_, bits, _) = der_next(rest).unwrap();
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            &bits[1..],
        )
        .verify(string.as_bytes(), &sig)
        .expect("verifies");
    }

    #[test]
    fn federation_bodies_and_answers() {
        let b: serde_json::Value =
            serde_json::from_slice(&federation_body(b"leaf", b"pub", &[b"int".to_vec()])).unwrap();
        assert_eq!(
            b,
            serde_json::json!({"certificate": "bGVhZg==", "publicKey": "cHVi",
            "intermediateCertificates": ["aW50"], "purpose": "DEFAULT", "fingerprintAlgorithm": "SHA256"})
        );
        assert_eq!(token_of(br#"{"token": "a.b.c"}"#, 0).unwrap(), "a.b.c");
        assert_eq!(
            token_of(b"{}", 0).unwrap_err(),
            "the federation answer has no token"
        );
        assert_eq!(
            token_of(b"<html>", 0).unwrap_err(),
            "the federation answer is not JSON"
        );
        assert!(token_of(br#"{"token": "a b"}"#, 0).is_err());
        assert_eq!(
            federation_failure(401, br#"{"code": "NotAuthenticated", "message": "bad"}"#),
            "HTTP 401 (NotAuthenticated: bad)"
        );
        assert_eq!(federation_failure(502, b"<html>"), "HTTP 502");
        // The federation service's words are peer text: bounded and escaped.
        let forged = serde_json::json!({
            "code": format!("Bad\n2026-01-01T00:00:00Z INFO ok{}", "c".repeat(100_000)),
            "message": format!("\u{1b}[2J\u{202e}{}", "m".repeat(100_000)),
        });
        let shown = federation_failure(401, forged.to_string().as_bytes());
        assert!(shown.starts_with("HTTP 401 (Bad\\n2026"), "{shown}");
        assert!(!shown.contains(['\n', '\x1b', '\u{202e}']), "{shown}");
        assert!(shown.len() < 400, "{} bytes", shown.len());
    }
}
