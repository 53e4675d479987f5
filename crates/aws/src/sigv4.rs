//! AWS Signature Version 4, for every AWS request the crate sends (S3 object operations,
//! CloudWatch `PutMetricData`).
//!
//! Pure functions, no I/O: the caller supplies the time, the credentials and the request parts,
//! and gets back the headers to send (`X-Amz-Date`, optional `X-Amz-Security-Token`,
//! `Authorization`). The algorithm is the documented one:
//!
//! 1. canonical request = method, canonical URI, canonical query, canonical headers (lower-case
//!    names, trimmed values, sorted), signed header list, payload hash (hex SHA-256 of the body,
//!    or [`UNSIGNED_PAYLOAD`] where the service allows it, as S3 does);
//! 2. string to sign = `AWS4-HMAC-SHA256`, the timestamp, the scope
//!    `<yyyymmdd>/<region>/<service>/aws4_request`, hex SHA-256 of the canonical request;
//! 3. signing key = HMAC chain `AWS4<secret>` -> date -> region -> service -> `aws4_request`;
//! 4. `Authorization: AWS4-HMAC-SHA256 Credential=<akid>/<scope>, SignedHeaders=..., Signature=...`.
//!
//! URIs and query parameters are encoded with [`uri_encode`] (RFC 3986 unreserved characters
//! kept; `/` kept in S3 object keys, encoded in query-protocol values). HMAC-SHA256 and
//! SHA-256 come from `ring`. The secret is only ever fed to the HMAC; nothing here formats it.
//!
//! References: "Signature Version 4 signing process" (general reference) and "Authenticating
//! Requests (AWS Signature Version 4)" (S3 API); the tests reproduce their published examples
//! and requests signed by botocore.

use std::borrow::Cow;

use ring::{digest, hmac};

use super::credentials::Credentials;
use svc_text::rfc3339::Rfc3339;
use svc_text::secret_bytes::{wipe_string, SecretBytes, SecretString};

/// The signing algorithm name.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// The payload hash of a request whose body is not signed (S3 over TLS).
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// Hex SHA-256 of bytes: the payload hash of a body (`x-amz-content-sha256`).
pub fn hex_sha256(bytes: &[u8]) -> String {
    svc_text::hex::lower(digest::digest(&digest::SHA256, bytes).as_ref())
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
}

/// An HMAC that is itself a key: copied at once into a wiping owner.
fn hmac_secret(key: &[u8], data: &[u8]) -> SecretBytes {
    SecretBytes::copy_of(hmac_sha256(key, data).as_ref())
}

/// SigV4 `UriEncode`: every byte except the unreserved characters `A-Za-z0-9-_.~` becomes
/// `%XX` (upper-case hex of the UTF-8 bytes). With `encode_slash` false, `/` is kept: the
/// form for S3 object keys in the path. With `encode_slash` true: the form for query
/// parameter names and values (and the query-protocol form bodies of CloudWatch).
pub fn uri_encode(s: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (b == b'/' && !encode_slash) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The parts of a request that are signed.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// Upper-case method (`POST`).
    pub method: &'a str,
    /// The `Host` header value exactly as sent (`host` or `host:port`).
    pub host: &'a str,
    /// Absolute path, already URI-encoded (`/`, `/bucket/a/b.json`).
    pub path: &'a str,
    /// Query string without `?`, already in canonical (sorted, encoded) form; empty for none.
    pub query: &'a str,
    /// Further headers to sign besides `host`, `x-amz-date` and `x-amz-security-token`
    /// (e.g. `content-type`, S3's `x-amz-content-sha256`), as sent.
    pub headers: &'a [(&'a str, &'a str)],
    /// Hex SHA-256 of the body ([`hex_sha256`]) or [`UNSIGNED_PAYLOAD`].
    pub payload_sha256: &'a str,
}

/// Where and when: `<yyyymmdd>/<region>/<service>/aws4_request` plus the timestamp.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub region: &'a str,
    pub service: &'a str,
    /// `YYYYMMDDTHHMMSSZ` (UTC).
    pub amz_date: &'a str,
}

impl Scope<'_> {
    fn date(&self) -> &str {
        &self.amz_date[..8.min(self.amz_date.len())]
    }

    fn credential_scope(&self) -> String {
        format!(
            "{}/{}/{}/aws4_request",
            self.date(),
            self.region,
            self.service
        )
    }
}

/// `YYYYMMDDTHHMMSSZ` of a time, in UTC: the RFC 3339 text of its second without the
/// separators (svc_text::rfc3339, written by hand: this runs for every request). Years outside
/// 0000-9999 become the epoch, as there.
pub fn amz_date(t: time::OffsetDateTime) -> String {
    let second = i128::from(t.unix_timestamp()) * 1_000_000_000;
    Rfc3339::from_unix_nanos(second)
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect()
}

/// Headers to add to the request, in the order they should be sent. The values are wiped
/// when it drops (`X-Amz-Security-Token` is the session token); `Debug` shows the names only.
#[derive(Clone, PartialEq, Eq)]
pub struct Signed {
    pub headers: Vec<(String, String)>,
}

impl Drop for Signed {
    fn drop(&mut self) {
        for (_, v) in &mut self.headers {
            wipe_string(v);
        }
    }
}

impl std::fmt::Debug for Signed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.headers.iter().map(|(n, _)| n))
            .finish()
    }
}

/// Collapses runs of spaces and trims, as the canonical header value requires. Borrows the
/// value when it is already canonical (the usual case: one allocation fewer per header).
fn canonical_value(v: &str) -> Cow<'_, str> {
    let b = v.as_bytes();
    let canonical = v.is_ascii()
        && b.first() != Some(&b' ')
        && b.last() != Some(&b' ')
        && !b.windows(2).any(|w| w == b"  ")
        && !b.iter().any(|c| (0x09..=0x0d).contains(c));
    if canonical {
        Cow::Borrowed(v)
    } else {
        Cow::Owned(v.split_whitespace().collect::<Vec<_>>().join(" "))
    }
}

/// Lower-case header name, borrowed when it is lower-case already.
fn lower_name(n: &str) -> Cow<'_, str> {
    if n.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(n.to_ascii_lowercase())
    } else {
        Cow::Borrowed(n)
    }
}

/// The canonical request (step 1) and the signed-header list.
pub fn canonical_request(
    req: &Request<'_>,
    amz_date: &str,
    session_token: Option<&str>,
) -> (String, String) {
    let mut headers: Vec<(Cow<'_, str>, Cow<'_, str>)> = Vec::with_capacity(req.headers.len() + 3);
    headers.extend(
        req.headers
            .iter()
            .map(|(n, v)| (lower_name(n), canonical_value(v))),
    );
    headers.push(("host".into(), canonical_value(req.host)));
    headers.push(("x-amz-date".into(), amz_date.into()));
    if let Some(t) = session_token {
        headers.push(("x-amz-security-token".into(), canonical_value(t)));
    }
    headers.sort();
    let mut signed = String::with_capacity(headers.iter().map(|(n, _)| n.len() + 1).sum());
    for (i, (n, _)) in headers.iter().enumerate() {
        if i > 0 {
            signed.push(';');
        }
        signed.push_str(n);
    }
    // Reserved at its exact size: with a session token in it, a buffer that grew would
    // leave partial copies of the token in freed memory.
    let exact = req.method.len()
        + req.path.len()
        + req.query.len()
        + headers
            .iter()
            .map(|(n, v)| n.len() + v.len() + 2)
            .sum::<usize>()
        + signed.len()
        + req.payload_sha256.len()
        + 5;
    let mut canon = String::with_capacity(exact);
    canon.push_str(req.method);
    canon.push('\n');
    canon.push_str(req.path);
    canon.push('\n');
    canon.push_str(req.query);
    canon.push('\n');
    for (n, v) in &headers {
        canon.push_str(n);
        canon.push(':');
        canon.push_str(v);
        canon.push('\n');
    }
    canon.push('\n');
    canon.push_str(&signed);
    canon.push('\n');
    canon.push_str(req.payload_sha256);
    debug_assert_eq!(canon.len(), exact);
    // A value made canonical is a copy (the session token's too, should it hold blanks).
    for (_, v) in &mut headers {
        if let Cow::Owned(v) = v {
            wipe_string(v);
        }
    }
    (canon, signed)
}

/// The string to sign (step 2).
pub fn string_to_sign(scope: &Scope<'_>, canonical_request: &str) -> String {
    format!(
        "{ALGORITHM}\n{}\n{}\n{}",
        scope.amz_date,
        scope.credential_scope(),
        hex_sha256(canonical_request.as_bytes())
    )
}

/// The signing key of step 3, `AWS4<secret>` -> date -> region -> service -> `aws4_request`,
/// for one day, region and service. Deriving it takes four HMACs; a client that signs many
/// requests with the same credentials keeps it for the day ([`SigningKey::fits`]) and only
/// computes the final HMAC per request. `AWS4<secret>`, each intermediate key and the key
/// itself are held in wiping owners (`svc_text::secret_bytes`); ring's `hmac::Key` (not
/// wiped on drop) is built per signature and dropped with it.
#[derive(Clone)]
pub struct SigningKey {
    date: String,
    region: String,
    service: String,
    key: SecretBytes,
}

impl SigningKey {
    /// Derives the key of `scope`'s day, region and service from the secret access key.
    pub fn derive(secret: &str, scope: &Scope<'_>) -> SigningKey {
        let mut k_secret = SecretBytes::with_capacity(4 + secret.len());
        k_secret.expose_mut().extend_from_slice(b"AWS4");
        k_secret.expose_mut().extend_from_slice(secret.as_bytes());
        let mut key = hmac_secret(k_secret.expose(), scope.date().as_bytes());
        for part in [
            scope.region.as_bytes(),
            scope.service.as_bytes(),
            b"aws4_request",
        ] {
            // The previous key drops (wiped) as the next one replaces it.
            key = hmac_secret(key.expose(), part);
        }
        SigningKey {
            date: scope.date().to_string(),
            region: scope.region.to_string(),
            service: scope.service.to_string(),
            key,
        }
    }

    /// True when this key signs requests of `scope`: same day, region and service.
    pub fn fits(&self, scope: &Scope<'_>) -> bool {
        self.date == scope.date() && self.region == scope.region && self.service == scope.service
    }

    /// Hex HMAC of the string to sign: the signature.
    fn signature(&self, string_to_sign: &str) -> String {
        svc_text::hex::lower(hmac_sha256(self.key.expose(), string_to_sign.as_bytes()).as_ref())
    }
}

impl std::fmt::Debug for SigningKey {
    // The key stands in for the secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("date", &self.date)
            .field("region", &self.region)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// The signature (step 3): hex HMAC of the string to sign under the derived key.
pub fn signature(secret: &str, scope: &Scope<'_>, string_to_sign: &str) -> String {
    SigningKey::derive(secret, scope).signature(string_to_sign)
}

/// Signs a request: returns `X-Amz-Date`, `X-Amz-Security-Token` (with a session token) and
/// `Authorization`.
pub fn sign(req: &Request<'_>, scope: &Scope<'_>, creds: &Credentials) -> Signed {
    let key = SigningKey::derive(&creds.secret_access_key, scope);
    sign_with_key(req, scope, creds, &key)
}

/// [`sign`] with a signing key the caller derived earlier from `creds`' secret.
///
/// Invariant: `key` comes from `SigningKey::derive(&creds.secret_access_key, s)` for a scope
/// `s` it [`fits`](SigningKey::fits) with `scope` (checked in debug builds).
pub fn sign_with_key(
    req: &Request<'_>,
    scope: &Scope<'_>,
    creds: &Credentials,
    key: &SigningKey,
) -> Signed {
    debug_assert!(key.fits(scope), "signing key of another day or scope");
    let (canon, signed_headers) =
        canonical_request(req, scope.amz_date, creds.session_token.as_deref());
    // It holds the session token, if any: wiped when it drops.
    let canon = SecretString::new(canon);
    let sts = string_to_sign(scope, canon.expose());
    let sig = key.signature(&sts);
    let mut headers = vec![("X-Amz-Date".to_string(), scope.amz_date.to_string())];
    if let Some(t) = &creds.session_token {
        // An exact copy, wiped with `Signed`.
        headers.push(("X-Amz-Security-Token".to_string(), t.clone()));
    }
    headers.push((
        "Authorization".to_string(),
        format!(
            "{ALGORITHM} Credential={}/{}, SignedHeaders={signed_headers}, Signature={sig}",
            creds.access_key_id,
            scope.credential_scope()
        ),
    ));
    Signed { headers }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const BODY: &str = "Action=PutMetricData&Version=2010-08-01&Namespace=svc%2Fmetrics&MetricData.member.1.MetricName=svc_messages_acked_total&MetricData.member.1.Value=42";
    const FORM: &str = "application/x-www-form-urlencoded; charset=utf-8";

    fn creds(token: Option<&str>) -> Credentials {
        Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: SECRET.into(),
            session_token: token.map(str::to_string),
        }
    }

    fn auth(signed: &Signed) -> &str {
        &signed
            .headers
            .iter()
            .find(|(n, _)| n == "Authorization")
            .unwrap()
            .1
    }

    /// `Debug` of the signed headers shows their names, never the session token; the canonical
    /// request is built at its exact size (no reallocation leaves a copy of the token behind).
    #[test]
    fn signed_headers_debug_shows_names_only() {
        let token = "IQoJb3JpZ2luX2VjE/Nz+session-token";
        let req = Request {
            method: "PUT",
            host: "h:9000",
            path: "/b/k",
            query: "a=1",
            headers: &[("Content-Type", "  application/json  ")],
            payload_sha256: UNSIGNED_PAYLOAD,
        };
        let scope = Scope {
            region: "r",
            service: "s3",
            amz_date: "20261129T120000Z",
        };
        let signed = sign(&req, &scope, &creds(Some(token)));
        let shown = format!("{signed:?}");
        assert_eq!(
            shown,
            r#"["X-Amz-Date", "X-Amz-Security-Token", "Authorization"]"#
        );
        let (canon, _) = canonical_request(&req, scope.amz_date, Some(token));
        assert_eq!(canon.capacity(), canon.len());
        assert!(canon.contains("content-type:application/json\n"), "{canon}");
    }

    /// AWS's published example (IAM ListUsers, GET with a query string).
    #[test]
    fn aws_documented_example() {
        let req = Request {
            method: "GET",
            host: "iam.amazonaws.com",
            path: "/",
            query: "Action=ListUsers&Version=2010-05-08",
            headers: &[("Content-Type", FORM)],
            payload_sha256: &hex_sha256(b""),
        };
        let scope = Scope {
            region: "us-east-1",
            service: "iam",
            amz_date: "20150830T123600Z",
        };
        let (canon, signed) = canonical_request(&req, scope.amz_date, None);
        assert_eq!(signed, "content-type;host;x-amz-date");
        assert_eq!(
            hex_sha256(canon.as_bytes()),
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
        );
        let sts = string_to_sign(&scope, &canon);
        assert_eq!(
            signature(SECRET, &scope, &sts),
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    /// The GET-object example of the S3 SigV4 documentation ("Example: GET Object"): signed
    /// payload hash in `x-amz-content-sha256`, an extra `Range` header.
    #[test]
    fn matches_the_published_s3_example() {
        let empty = hex_sha256(b"");
        assert_eq!(
            empty,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let s = sign(
            &Request {
                method: "GET",
                host: "examplebucket.s3.amazonaws.com",
                path: "/test.txt",
                query: "",
                headers: &[("Range", "bytes=0-9"), ("x-amz-content-sha256", &empty)],
                payload_sha256: &empty,
            },
            &Scope {
                region: "us-east-1",
                service: "s3",
                amz_date: "20130524T000000Z",
            },
            &Credentials {
                access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
                secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
                session_token: None,
            },
        );
        assert_eq!(
            auth(&s),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    /// Same request signed by botocore's `SigV4Auth` (time pinned to 2024-05-17T12:34:56Z).
    #[test]
    fn matches_botocore_for_put_metric_data() {
        let body_hash = hex_sha256(BODY.as_bytes());
        let req = Request {
            method: "POST",
            host: "monitoring.eu-west-1.amazonaws.com",
            path: "/",
            query: "",
            headers: &[("Content-Type", FORM)],
            payload_sha256: &body_hash,
        };
        let scope = Scope {
            region: "eu-west-1",
            service: "monitoring",
            amz_date: "20240517T123456Z",
        };
        let s = sign(&req, &scope, &creds(None));
        assert_eq!(
            auth(&s),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240517/eu-west-1/monitoring/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=fba30091039642296d409240562e51ad155b6dfb633ec10436b57bdf2a73bce3"
        );
        assert_eq!(
            s.headers[0],
            ("X-Amz-Date".into(), "20240517T123456Z".into())
        );

        let req = Request {
            host: "127.0.0.1:5000",
            ..req
        };
        let scope = Scope {
            region: "us-east-1",
            ..scope
        };
        let s = sign(&req, &scope, &creds(Some("SESSIONTOKEN/abc+def=")));
        assert_eq!(
            auth(&s),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240517/us-east-1/monitoring/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, Signature=2716930d439bbfb5b1a64da9373bc9cd27b00ab8338e23cfd350022b70b57ccf"
        );
        assert_eq!(
            s.headers[1],
            (
                "X-Amz-Security-Token".into(),
                "SESSIONTOKEN/abc+def=".into()
            )
        );
    }

    /// S3 PUTs signed by botocore 1.44's `S3SigV4Auth` (time pinned to 2024-05-17T12:34:56Z,
    /// session token): virtual-hosted over https with `UNSIGNED-PAYLOAD`, and path-style with
    /// the body hash; the key is encoded as the sink encodes it.
    #[test]
    fn matches_botocore_for_s3_put() {
        let body = br#"{"a":1}"#;
        let key = format!("a/{}", uri_encode("b c+\u{e9}.json", false));
        let scope = Scope {
            region: "eu-west-1",
            service: "s3",
            amz_date: "20240517T123456Z",
        };
        let creds = creds(Some("SESSIONTOKEN/abc+def="));
        let signed_headers = "SignedHeaders=content-type;host;if-none-match;x-amz-content-sha256;\
                              x-amz-date;x-amz-meta-svc-stream;x-amz-security-token";
        let hash = hex_sha256(body);
        for (host, path, payload, signature) in [
            (
                "svc-bucket.s3.eu-west-1.amazonaws.com".to_string(),
                format!("/{key}"),
                UNSIGNED_PAYLOAD,
                "0150be1072b05c708889807ab1c2d40b82e85ecb5d4962c24b889610b8163aa4",
            ),
            (
                "127.0.0.1:5000".to_string(),
                format!("/svc-bucket/{key}"),
                hash.as_str(),
                "b44713fdc53830f6a9ade435217c1b86d048c7aaeb3e45165643f148b5d4484e",
            ),
        ] {
            let s = sign(
                &Request {
                    method: "PUT",
                    host: &host,
                    path: &path,
                    query: "",
                    headers: &[
                        ("x-amz-content-sha256", payload),
                        ("Content-Type", "application/json"),
                        ("If-None-Match", "*"),
                        ("x-amz-meta-svc-stream", "ORDERS"),
                    ],
                    payload_sha256: payload,
                },
                &scope,
                &creds,
            );
            assert_eq!(
                auth(&s),
                format!(
                    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240517/eu-west-1/s3/aws4_request, \
                     {signed_headers}, Signature={signature}"
                )
            );
        }
        assert_eq!(
            hash,
            "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
    }

    /// A key derived once signs like `sign`, and fits only its own day, region and service.
    #[test]
    fn kept_signing_key_signs_the_same() {
        let empty = hex_sha256(b"");
        let req = Request {
            method: "PUT",
            host: "127.0.0.1:5000",
            path: "/b/k.json",
            query: "",
            headers: &[("x-amz-content-sha256", &empty)],
            payload_sha256: &empty,
        };
        let scope = |amz_date| Scope {
            region: "eu-west-1",
            service: "s3",
            amz_date,
        };
        let c = creds(Some("T"));
        let key = SigningKey::derive(SECRET, &scope("20240517T000000Z"));
        for t in ["20240517T000000Z", "20240517T235959Z"] {
            assert!(key.fits(&scope(t)));
            assert_eq!(
                sign_with_key(&req, &scope(t), &c, &key),
                sign(&req, &scope(t), &c)
            );
        }
        assert!(!key.fits(&scope("20240518T000000Z")));
        assert!(!key.fits(&Scope {
            region: "us-east-1",
            ..scope("20240517T000000Z")
        }));
        assert!(!key.fits(&Scope {
            service: "monitoring",
            ..scope("20240517T000000Z")
        }));
        assert!(!format!("{key:?}").contains(SECRET));
    }

    #[test]
    fn canonical_values() {
        for (v, want) in [
            ("application/json", "application/json"),
            ("", ""),
            ("a b", "a b"),
            ("  a   b ", "a b"),
            ("a\tb", "a b"),
            ("a\x0bb", "a b"),
            ("\u{a0}a", "a"),
            ("é  x", "é x"),
        ] {
            assert_eq!(canonical_value(v), want, "{v:?}");
        }
        assert!(matches!(canonical_value("a b"), Cow::Borrowed(_)));
        assert_eq!(lower_name("X-Amz-Meta-A"), "x-amz-meta-a");
        assert!(matches!(lower_name("content-type"), Cow::Borrowed(_)));
    }

    #[test]
    fn amz_dates() {
        let t = time::OffsetDateTime::from_unix_timestamp(1_715_949_296).unwrap();
        assert_eq!(amz_date(t), "20240517T123456Z");
        let t = time::OffsetDateTime::from_unix_timestamp(1_369_353_600).unwrap();
        assert_eq!(amz_date(t), "20130524T000000Z");
        let t = time::OffsetDateTime::from_unix_timestamp(-62_135_596_800 + 86_399).unwrap();
        assert_eq!(amz_date(t), "00010101T235959Z");
        let t = time::OffsetDateTime::from_unix_timestamp(1_703_980_799)
            .unwrap()
            .to_offset(time::UtcOffset::from_hms(5, 30, 0).unwrap());
        assert_eq!(amz_date(t), "20231230T235959Z", "converted to UTC");
    }

    #[test]
    fn uri_encoding() {
        // S3 object keys: `/` kept.
        assert_eq!(uri_encode("a/b~c.json", false), "a/b~c.json");
        assert_eq!(uri_encode("a b+é", false), "a%20b%2B%C3%A9");
        // Query protocol (CloudWatch form bodies): `/` encoded too.
        assert_eq!(uri_encode("svc/metrics", true), "svc%2Fmetrics");
        assert_eq!(
            uri_encode("a b+c=d&e~f.g-h_i", true),
            "a%20b%2Bc%3Dd%26e~f.g-h_i"
        );
        assert_eq!(uri_encode("é", true), "%C3%A9");
    }
}
