//! A small S3 client: SigV4-signed PUT/GET/HEAD/DELETE over one `ureq` agent whose connection
//! pool keeps TCP (and TLS) connections alive between requests.
//!
//! Why not rust-s3: its sync backend (attohttpc) opens a new TCP connection for every request,
//! so a sustained run leaves one TIME_WAIT socket per object and exhausts local ports; it also
//! compiles a second rustls crypto provider (aws-lc-rs) next to ureq's ring, which makes the
//! first HTTPS request panic unless a process default is installed. Here only ring is compiled
//! in and ureq selects it explicitly, so a bad certificate is an ordinary error.
//!
//! Errors never contain a secret, a signature or a credential-bearing URL (endpoints with
//! credentials are rejected by config validation; the Authorization header is never printed),
//! and whatever the store says is scrubbed of every secret the request carried (key id,
//! secret, session token, signature) before it is kept: an error document may quote the
//! request.
//!
//! Answers are classified by their status first: a body over the bound is cut, never a reason
//! to lose the status (a 500 with a huge body is still a 500, retried; a 2xx PUT whose body is
//! huge still stored the object).

use std::fmt;
use std::io::Read;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ureq::http::{Method, Request};
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig, TlsProvider};
use ureq::unversioned::transport::DefaultConnector;
use ureq::Agent;

use super::config::{endpoint_problem, AddressingStyle, ObjectStoreConfig};
pub use super::error::S3Error;
use super::error::{classify, read_failure};
use crate::aws::credentials::Credentials;
use crate::aws::provider::Provider;
use crate::aws::{endpoint_override, sigv4, Env};
use crate::sink::resolver::CachingResolver;
use crate::text::secrets::Secrets;

/// Largest error or GET body read into memory.
const MAX_ERROR_BODY: u64 = 64 * 1024;
/// One deadline for a whole listing ([`S3Client::list_keys`]).
pub const LIST_DEADLINE: Duration = Duration::from_secs(3600);
/// A listing's page cap: `max_keys / LIST_MIN_PAGE_KEYS + LIST_EXTRA_PAGES` (S3 answers up
/// to 1000 keys a page).
pub const LIST_MIN_PAGE_KEYS: usize = 100;
pub const LIST_EXTRA_PAGES: usize = 100;
/// Pages in a row with no key while the store says "truncated" before the listing fails.
pub const LIST_MAX_EMPTY_PAGES: usize = 8;
/// Region when neither the config nor `AWS_REGION`/`AWS_DEFAULT_REGION` names one.
pub const DEFAULT_REGION: &str = "us-east-1";

/// Scheme and authority of the service endpoint (no path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    /// `host[:port]` as written in the URL (IPv6 in brackets).
    pub authority: String,
    /// True for the provider's default endpoint (not configured).
    pub default: bool,
}

impl Endpoint {
    fn parse(text: &str) -> Endpoint {
        // Invariant: validated by `endpoint_problem` before this is called.
        let u = url::Url::parse(text).expect("validated endpoint URL");
        let host = u.host_str().unwrap_or_default();
        let authority = match u.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        Endpoint {
            https: u.scheme() == "https",
            authority,
            default: false,
        }
    }
}

/// Picks the endpoint: config `endpoint_url`, else `AWS_ENDPOINT_URL_S3`, else
/// `AWS_ENDPOINT_URL` (both subject to the same rules as the config field, and ignored when
/// `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`), else `https://s3.<region>.amazonaws.com`.
pub fn resolve_endpoint(
    cfg: &ObjectStoreConfig,
    region: &str,
    env: &dyn Env,
) -> Result<Endpoint, String> {
    if let Some(u) = &cfg.endpoint_url {
        return Ok(Endpoint::parse(u));
    }
    if let Some((var, u)) = endpoint_override(env, "AWS_ENDPOINT_URL_S3") {
        if let Some(why) = endpoint_problem(&u, cfg.allow_http_for_local_testing) {
            return Err(format!("environment variable {var}: {why}"));
        }
        return Ok(Endpoint::parse(&u));
    }
    Ok(Endpoint {
        https: true,
        authority: format!("s3.{region}.amazonaws.com"),
        default: true,
    })
}

/// Region: config `region_name`, else `AWS_REGION`, else `AWS_DEFAULT_REGION`, else
/// [`DEFAULT_REGION`].
pub fn resolve_region(cfg: &ObjectStoreConfig, env: &dyn Env) -> String {
    cfg.region_name
        .clone()
        .or_else(|| env.var("AWS_REGION"))
        .or_else(|| env.var("AWS_DEFAULT_REGION"))
        .filter(|r| {
            !r.is_empty()
                && r.len() <= 64
                && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        .unwrap_or_else(|| DEFAULT_REGION.to_string())
}

/// A successful response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Whether [`S3Client::send`] copies the response headers into its [`Reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseHeaders {
    Keep,
    Skip,
}

/// Client of one bucket.
pub struct S3Client {
    agent: Agent,
    endpoint: Endpoint,
    path_style: bool,
    bucket: String,
    region: String,
    /// The credentials, kept fresh by the provider (temporary ones are refreshed ahead of
    /// expiry on the provider's thread; reading them here never waits for a source).
    creds: Provider,
    /// The SigV4 signing key of the current day, with the credentials it was derived from,
    /// held weakly (a refresh changes them: the key is derived again; the replaced ones drop).
    signing_key: Mutex<Option<(Weak<Credentials>, Arc<sigv4::SigningKey>)>>,
}

impl fmt::Debug for S3Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Client")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("creds", &self.creds)
            .finish()
    }
}

/// Options of the HTTP agent.
pub struct ClientOptions {
    pub timeout: Duration,
    /// Idle connections kept per host: at least the number of concurrent requests, so a
    /// sustained run reuses connections instead of closing them (TIME_WAIT). 0 disables
    /// keep-alive (one connection per request; only the benchmark uses that, as a baseline).
    pub pool_per_host: usize,
    pub ca_pem: Option<Vec<u8>>,
}

impl S3Client {
    pub fn new(
        endpoint: Endpoint,
        bucket: &str,
        region: &str,
        style: AddressingStyle,
        creds: Provider,
        opts: ClientOptions,
    ) -> Result<S3Client, S3Error> {
        let roots = match &opts.ca_pem {
            None => RootCerts::WebPki,
            Some(pem) => {
                let mut certs: Vec<Certificate<'static>> = Vec::new();
                for item in ureq::tls::parse_pem(pem) {
                    match item {
                        Ok(PemItem::Certificate(c)) => certs.push(c),
                        Ok(_) => {}
                        Err(e) => {
                            return Err(S3Error::Other(format!("ca_file: not valid PEM: {e}")))
                        }
                    }
                }
                if certs.is_empty() {
                    return Err(S3Error::Other(
                        "ca_file: contains no PEM certificate".into(),
                    ));
                }
                RootCerts::Specific(Arc::new(certs))
            }
        };
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(roots)
            .build();
        let config = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(opts.timeout))
            .max_redirects(0)
            .max_idle_connections(opts.pool_per_host * 2)
            .max_idle_connections_per_host(opts.pool_per_host)
            .max_idle_age(Duration::from_secs(4))
            .user_agent(concat!("svc/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls)
            .build();
        let agent = Agent::with_parts(config, DefaultConnector::new(), CachingResolver::default());
        let path_style = match style {
            AddressingStyle::Path => true,
            AddressingStyle::Virtual => false,
            AddressingStyle::Auto => !endpoint.default || bucket.contains('.'),
        };
        Ok(S3Client {
            agent,
            endpoint,
            path_style,
            bucket: bucket.to_string(),
            region: region.to_string(),
            creds,
            signing_key: Mutex::new(None),
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Host header and canonical URI of an object (or of the bucket when `key` is `None`).
    fn target(&self, key: Option<&str>) -> (String, String) {
        let encoded = key.map(|k| sigv4::uri_encode(k, false));
        if self.path_style {
            let path = match &encoded {
                Some(k) => format!("/{}/{k}", self.bucket),
                None => format!("/{}", self.bucket),
            };
            (self.endpoint.authority.clone(), path)
        } else {
            let path = match &encoded {
                Some(k) => format!("/{k}"),
                None => "/".to_string(),
            };
            (format!("{}.{}", self.bucket, self.endpoint.authority), path)
        }
    }

    /// The signing key of `scope`'s day for `creds`: derived on the first request of each
    /// day and after each credential refresh, then kept. The credentials it was derived
    /// from are held weakly: once the provider replaces them (refresh) and no request holds
    /// them, they drop and are wiped, even if no request comes to derive the next key (a
    /// strong reference kept the first credentials, replaced or not, until the next request).
    /// A `Weak` keeps the allocation, so its address cannot be reused by later credentials.
    fn signing_key(
        &self,
        creds: &Arc<Credentials>,
        scope: &sigv4::Scope<'_>,
    ) -> Arc<sigv4::SigningKey> {
        let mut kept = self.signing_key.lock().unwrap_or_else(|e| e.into_inner());
        match kept.as_ref() {
            Some((c, k)) if std::ptr::eq(c.as_ptr(), Arc::as_ptr(creds)) && k.fits(scope) => {
                k.clone()
            }
            _ => {
                let k = Arc::new(sigv4::SigningKey::derive(&creds.secret_access_key, scope));
                *kept = Some((Arc::downgrade(creds), k.clone()));
                k
            }
        }
    }

    /// The credentials provider (where they come from, refresh count).
    pub fn credentials(&self) -> &Provider {
        &self.creds
    }

    /// Sends one signed request. `headers` are signed too. Non-2xx answers become
    /// [`S3Error::Status`]. The response headers are copied into the reply only with
    /// [`ResponseHeaders::Keep`] (copying them costs a dozen allocations per request).
    pub fn send(
        &self,
        method: Method,
        key: Option<&str>,
        headers: &[(String, String)],
        body: &[u8],
        body_limit: u64,
        response_headers: ResponseHeaders,
    ) -> Result<Reply, S3Error> {
        let target = Target { key, query: "" };
        self.send_to(method, target, headers, body, body_limit, response_headers)
    }

    /// [`Self::send`] to an object or the bucket with a query (already in canonical form:
    /// sorted, encoded, `name=value`).
    fn send_to(
        &self,
        method: Method,
        Target { key, query }: Target<'_>,
        headers: &[(String, String)],
        body: &[u8],
        body_limit: u64,
        response_headers: ResponseHeaders,
    ) -> Result<Reply, S3Error> {
        let creds = self.creds.current().map_err(S3Error::Credentials)?;
        let (host, path) = self.target(key);
        let payload_sha256 = sigv4::hex_sha256(body);
        let amz_date = sigv4::amz_date(time::OffsetDateTime::now_utc());
        let mut to_sign: Vec<(&str, &str)> = Vec::with_capacity(headers.len() + 1);
        to_sign.push(("x-amz-content-sha256", &payload_sha256));
        to_sign.extend(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let scope = sigv4::Scope {
            region: &self.region,
            service: "s3",
            amz_date: &amz_date,
        };
        let signed = sigv4::sign_with_key(
            &sigv4::Request {
                method: method.as_str(),
                host: &host,
                path: &path,
                query,
                headers: &to_sign,
                payload_sha256: &payload_sha256,
            },
            &scope,
            &creds,
            &self.signing_key(&creds, &scope),
        );
        let scheme = if self.endpoint.https { "https" } else { "http" };
        let uri = match query {
            "" => format!("{scheme}://{host}{path}"),
            q => format!("{scheme}://{host}{path}?{q}"),
        };
        let mut builder = Request::builder()
            .method(method.clone())
            .uri(&uri)
            .header("host", host.as_str());
        for (k, v) in to_sign.iter().copied() {
            builder = builder.header(k, v);
        }
        // X-Amz-Date, X-Amz-Security-Token (with a session token) and Authorization.
        for (k, v) in &signed.headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let result = if method == Method::PUT || method == Method::POST {
            let req = builder
                .body(body)
                .map_err(|e| S3Error::Other(format!("build request: {e}")))?;
            self.agent.run(req)
        } else {
            let req = builder
                .body(())
                .map_err(|e| S3Error::Other(format!("build request: {e}")))?;
            self.agent.run(req)
        };
        // What the request carried that a peer could quote back; built on error paths only.
        let secrets = || {
            let mut s = Secrets::of([
                creds.access_key_id.as_str(),
                creds.secret_access_key.as_str(),
            ]);
            if let Some(t) = &creds.session_token {
                s.add(t);
            }
            for (k, v) in &signed.headers {
                if k.eq_ignore_ascii_case("authorization") {
                    s.add_authorization(v);
                }
            }
            s
        };
        let mut resp = result.map_err(|e| classify(e).hidden(&secrets()))?;
        let status = resp.status().as_u16();
        let headers: Vec<(String, String)> = if response_headers == ResponseHeaders::Keep {
            resp.headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_ascii_lowercase(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        let ok = (200..300).contains(&status);
        let limit = if ok { body_limit } else { MAX_ERROR_BODY };
        let mut body = Vec::new();
        if method != Method::HEAD {
            // One byte more than the bound tells a body at the bound from one over it. Reading
            // the body to its end is what lets the pool reuse the connection; a body over the
            // bound is left unread and its connection closed.
            resp.body_mut()
                .as_reader()
                .take(limit.saturating_add(1))
                .read_to_end(&mut body)
                .map_err(|e| read_failure(status, e).hidden(&secrets()))?;
        }
        let over = body.len() as u64 > limit;
        if over {
            body.truncate(limit as usize);
        }
        if !ok {
            // The status decides; the body only gives the words. Scrubbed whole, then cut.
            let lossy = String::from_utf8_lossy(&body);
            let scrubbed = secrets().scrub(&lossy).into_owned();
            return Err(S3Error::from_answer(status, scrubbed.as_bytes()));
        }
        if over && method == Method::GET {
            return Err(S3Error::BodyTooLarge { status, limit });
        }
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// PUT of one object with the given (signed) headers; `Ok` is the 2xx status.
    pub fn put_object(
        &self,
        key: &str,
        body: &[u8],
        headers: &[(String, String)],
    ) -> Result<u16, S3Error> {
        self.send(
            Method::PUT,
            Some(key),
            headers,
            body,
            MAX_ERROR_BODY,
            ResponseHeaders::Skip,
        )
        .map(|r| r.status)
    }

    /// Whether the bucket has Object Lock enabled (`GET ?object-lock`): false when the store
    /// says it has no Object Lock configuration.
    pub fn object_lock_enabled(&self) -> Result<bool, S3Error> {
        let target = Target {
            key: None,
            query: "object-lock=",
        };
        match self.send_to(
            Method::GET,
            target,
            &[],
            b"",
            64 * 1024,
            ResponseHeaders::Skip,
        ) {
            Ok(reply) => {
                let xml = String::from_utf8_lossy(&reply.body);
                Ok(
                    super::error::xml_field(&xml, "ObjectLockEnabled").as_deref()
                        == Some("Enabled"),
                )
            }
            Err(S3Error::Status { code, .. }) if code == "ObjectLockConfigurationNotFoundError" => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// GET of one object; `None` when it does not exist.
    pub fn get_object(&self, key: &str, limit: u64) -> Result<Option<Reply>, S3Error> {
        not_found_as_none(self.send(
            Method::GET,
            Some(key),
            &[],
            b"",
            limit,
            ResponseHeaders::Keep,
        ))
    }

    /// HEAD of one object; `None` when it does not exist.
    pub fn head_object(&self, key: &str) -> Result<Option<Reply>, S3Error> {
        not_found_as_none(self.send(Method::HEAD, Some(key), &[], b"", 0, ResponseHeaders::Keep))
    }

    pub fn delete_object(&self, key: &str) -> Result<(), S3Error> {
        self.send(
            Method::DELETE,
            Some(key),
            &[],
            b"",
            MAX_ERROR_BODY,
            ResponseHeaders::Skip,
        )
        .map(|_| ())
    }

    /// The keys below `prefix` (ListObjectsV2, page by page), at most `max_keys` of them
    /// (more is an error: the store is hostile and the caller holds them all).
    pub fn list_keys(&self, prefix: &str, max_keys: usize) -> Result<Vec<String>, String> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        let deadline = std::time::Instant::now() + LIST_DEADLINE;
        let max_pages = max_keys / LIST_MIN_PAGE_KEYS + LIST_EXTRA_PAGES;
        let (mut pages, mut empty) = (0usize, 0usize);
        loop {
            pages += 1;
            if pages > max_pages {
                return Err(format!(
                    "list {prefix}: more than {max_pages} pages (the store keeps answering \
                     \"truncated\" with few keys)"
                ));
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "list {prefix}: not done within {} s (one deadline for the whole listing)",
                    LIST_DEADLINE.as_secs()
                ));
            }
            let mut query = String::new();
            if let Some(t) = &token {
                query.push_str(&format!(
                    "continuation-token={}&",
                    sigv4::uri_encode(t, true)
                ));
            }
            query.push_str(&format!(
                "list-type=2&prefix={}",
                sigv4::uri_encode(prefix, true)
            ));
            let target = Target {
                key: None,
                query: &query,
            };
            let reply = self
                .send_to(
                    Method::GET,
                    target,
                    &[],
                    b"",
                    8 << 20,
                    ResponseHeaders::Skip,
                )
                .map_err(|e| format!("list {prefix}: {e}"))?;
            let xml = String::from_utf8_lossy(&reply.body);
            let before = keys.len();
            keys.extend(xml_all(&xml, "Key").into_iter().map(|k| xml_unescape(&k)));
            empty = if keys.len() == before { empty + 1 } else { 0 };
            if empty > LIST_MAX_EMPTY_PAGES {
                return Err(format!(
                    "list {prefix}: {empty} pages in a row with no key, still \"truncated\""
                ));
            }
            if keys.len() > max_keys {
                return Err(format!("more than {max_keys} objects below {prefix}"));
            }
            let truncated = super::error::xml_field(&xml, "IsTruncated").as_deref() == Some("true");
            match super::error::xml_field(&xml, "NextContinuationToken") {
                Some(t) if truncated && !t.is_empty() => token = Some(xml_unescape(&t)),
                _ => return Ok(keys),
            }
        }
    }

    /// HEAD of the bucket: proves it exists and the credentials are accepted.
    pub fn head_bucket(&self) -> Result<(), S3Error> {
        self.send(Method::HEAD, None, &[], b"", 0, ResponseHeaders::Skip)
            .map(|_| ())
    }
}

fn not_found_as_none(r: Result<Reply, S3Error>) -> Result<Option<Reply>, S3Error> {
    match r {
        Ok(reply) => Ok(Some(reply)),
        Err(S3Error::Status { status: 404, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where a request goes: an object (`key`) or the bucket, with a canonical query.
/// Every `<name>...</name>` text of a flat XML answer.
fn xml_all(xml: &str, name: &str) -> Vec<String> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(after[..j].to_string());
        rest = &after[j + close.len()..];
    }
    out
}

/// XML's five predefined entities (what S3 escapes in a key).
fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#13;", "\r")
        .replace("&amp;", "&")
}

struct Target<'a> {
    key: Option<&'a str>,
    query: &'a str,
}

#[cfg(test)]
mod tests {
    use super::super::error::xml_field;
    use super::*;
    use crate::sink::FailureClass;

    fn client(endpoint: Endpoint, bucket: &str, style: AddressingStyle) -> S3Client {
        S3Client::new(
            endpoint,
            bucket,
            "eu-west-1",
            style,
            Provider::fixed(
                Credentials {
                    access_key_id: "AKID".into(),
                    secret_access_key: "s".into(),
                    session_token: None,
                },
                crate::aws::credentials::Source::Environment,
            ),
            ClientOptions {
                timeout: Duration::from_secs(1),
                pool_per_host: 1,
                ca_pem: None,
            },
        )
        .unwrap()
    }

    /// Expired temporary credentials whose refresh fails: no request is sent, and the error
    /// is one the sink treats as transient (the message is redelivered).
    #[test]
    fn expired_credentials_send_nothing() {
        use crate::aws::parse::Issued;
        let fetch: crate::aws::provider::Fetch = Box::new(|| {
            Ok((
                Issued {
                    credentials: Credentials {
                        access_key_id: "ASIAOLD".into(),
                        secret_access_key: "s".into(),
                        session_token: Some("t".into()),
                    },
                    expiration: Some(time::OffsetDateTime::now_utc() - Duration::from_secs(1)),
                },
                crate::aws::credentials::Source::Environment,
            ))
        });
        let c = S3Client::new(
            Endpoint {
                https: false,
                // Nothing listens there: a request would be a connection error instead.
                authority: "127.0.0.1:9".into(),
                default: false,
            },
            "b",
            "eu-west-1",
            AddressingStyle::Path,
            Provider::refreshing(fetch).unwrap(),
            ClientOptions {
                timeout: Duration::from_secs(1),
                pool_per_host: 1,
                ca_pem: None,
            },
        )
        .unwrap();
        let e = c.put_object("k", b"x", &[]).unwrap_err();
        assert!(matches!(e, S3Error::Credentials(_)), "{e}");
        assert!(!e.is_retryable() && e.permanent_class().is_none());
        assert!(
            e.to_string()
                .starts_with("no valid credentials: credentials from "),
            "{e}"
        );
    }

    /// The signing key's cache does not keep the credentials it was derived from: once the
    /// provider replaces them and no request holds them, they drop (and wipe), although no
    /// request came to derive the next key (atk51a's end-to-end figure: the first secret key
    /// stayed in memory after nine refreshes). The key is still reused while they live.
    #[test]
    fn the_signing_key_cache_keeps_no_replaced_credentials() {
        let c = client(
            Endpoint {
                https: false,
                authority: "127.0.0.1:9".into(),
                default: false,
            },
            "b",
            AddressingStyle::Path,
        );
        let scope = sigv4::Scope {
            region: "eu-west-1",
            service: "s3",
            amz_date: "20261129T120000Z",
        };
        let creds = Arc::new(Credentials {
            access_key_id: "ASIAFIRST".into(),
            secret_access_key: "first-secret-access-key".into(),
            session_token: Some("first-token".into()),
        });
        let k1 = c.signing_key(&creds, &scope);
        assert!(Arc::ptr_eq(&k1, &c.signing_key(&creds, &scope)), "reused");
        let weak = Arc::downgrade(&creds);
        drop(creds);
        assert!(
            weak.upgrade().is_none(),
            "the cache keeps the replaced credentials"
        );
        let next = Arc::new(Credentials {
            access_key_id: "ASIANEXT".into(),
            secret_access_key: "next-secret-access-key".into(),
            session_token: None,
        });
        assert!(
            !Arc::ptr_eq(&k1, &c.signing_key(&next, &scope)),
            "derived again"
        );
    }

    #[test]
    fn addressing_styles() {
        let aws = Endpoint {
            https: true,
            authority: "s3.eu-west-1.amazonaws.com".into(),
            default: true,
        };
        let custom = Endpoint {
            https: true,
            authority: "minio.internal:9000".into(),
            default: false,
        };
        let auto = AddressingStyle::Auto;
        assert_eq!(
            client(aws.clone(), "acme", auto).target(Some("a/b c.json")),
            (
                "acme.s3.eu-west-1.amazonaws.com".to_string(),
                "/a/b%20c.json".to_string()
            )
        );
        assert_eq!(
            client(aws.clone(), "acme.logs", auto).target(Some("k")),
            (
                "s3.eu-west-1.amazonaws.com".to_string(),
                "/acme.logs/k".to_string()
            )
        );
        assert_eq!(
            client(custom.clone(), "acme", auto).target(None),
            ("minio.internal:9000".to_string(), "/acme".to_string())
        );
        assert_eq!(
            client(custom, "acme", AddressingStyle::Virtual).target(None),
            ("acme.minio.internal:9000".to_string(), "/".to_string())
        );
        assert_eq!(
            client(aws, "acme", AddressingStyle::Path).target(Some("k")),
            (
                "s3.eu-west-1.amazonaws.com".to_string(),
                "/acme/k".to_string()
            )
        );
    }

    #[test]
    fn endpoint_and_region_resolution() {
        use std::collections::HashMap;
        let cfg = |extra: &str| {
            let text = format!(
                r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                   "subject": "a"}}, "sink": {{"type": "object_store", "bucket": "abc"{extra}}}}}"#
            );
            match crate::config::RuntimeConfig::parse(&text).unwrap().sink {
                crate::sink::SinkConfig::ObjectStore(c) => *c,
                _ => unreachable!(),
            }
        };
        let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let c = cfg("");
        assert_eq!(resolve_region(&c, &env(&[])), "us-east-1");
        assert_eq!(
            resolve_region(&c, &env(&[("AWS_DEFAULT_REGION", "eu-north-1")])),
            "eu-north-1"
        );
        assert_eq!(
            resolve_region(
                &cfg(r#", "region_name": "ap-south-1""#),
                &env(&[("AWS_REGION", "x")])
            ),
            "ap-south-1"
        );
        let e = resolve_endpoint(&c, "eu-north-1", &env(&[])).unwrap();
        assert_eq!(
            (e.authority.as_str(), e.https, e.default),
            ("s3.eu-north-1.amazonaws.com", true, true)
        );
        let e = resolve_endpoint(
            &c,
            "r",
            &env(&[
                ("AWS_ENDPOINT_URL", "https://generic.example"),
                ("AWS_ENDPOINT_URL_S3", "https://s3.example:8443"),
            ]),
        )
        .unwrap();
        assert_eq!(e.authority, "s3.example:8443");
        let ignored = env(&[
            ("AWS_ENDPOINT_URL_S3", "https://s3.example"),
            ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"),
        ]);
        assert!(resolve_endpoint(&c, "r", &ignored).unwrap().default);
        let err = resolve_endpoint(
            &c,
            "r",
            &env(&[("AWS_ENDPOINT_URL", "https://user:pw@s3.example")]),
        )
        .unwrap_err();
        assert_eq!(
            err,
            "environment variable AWS_ENDPOINT_URL: must not contain credentials"
        );
        let configured = cfg(r#", "endpoint_url": "https://cfg.example""#);
        let e = resolve_endpoint(
            &configured,
            "r",
            &env(&[("AWS_ENDPOINT_URL_S3", "https://s3.example")]),
        )
        .unwrap();
        assert_eq!(e.authority, "cfg.example", "config wins");
    }

    #[test]
    fn error_classes() {
        let st = |status: u16, code: &str| S3Error::Status {
            status,
            code: code.into(),
            message: String::new(),
        };
        assert!(st(412, "PreconditionFailed").is_precondition_failed());
        for s in [409, 429, 500, 503] {
            assert!(st(s, "").is_retryable(), "{s}");
        }
        for s in [400, 403, 404, 412] {
            assert!(!st(s, "").is_retryable(), "{s}");
        }
        assert_eq!(
            st(400, "EntityTooLarge").permanent_class(),
            Some(FailureClass::TooLarge)
        );
        assert_eq!(
            st(400, "KeyTooLongError").permanent_class(),
            Some(FailureClass::InvalidKey)
        );
        assert_eq!(st(403, "AccessDenied").permanent_class(), None);
        assert_eq!(
            st(403, "SignatureDoesNotMatch").to_string(),
            "status 403 SignatureDoesNotMatch (check the credentials and the bucket policy)"
        );
        assert_eq!(
            xml_field("<Error><Code>A&amp;B</Code></Error>", "Code").as_deref(),
            Some("A&B")
        );
    }

    /// A fake S3 endpoint answering every request on one connection with `status` and `body`
    /// (it reads the request head only: the requests of this test have no body).
    fn hostile_endpoint(status: u16, body: Vec<u8>) -> (Endpoint, std::thread::JoinHandle<()>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if line == "\r\n" {
                    break;
                }
                line.clear();
            }
            let mut out = stream;
            let head = format!(
                "HTTP/1.1 {status} Nope\r\ncontent-type: application/xml\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = out.write_all(head.as_bytes());
            let _ = out.write_all(&body);
        });
        let endpoint = Endpoint {
            https: false,
            authority: format!("127.0.0.1:{port}"),
            default: false,
        };
        (endpoint, server)
    }

    #[test]
    fn a_hostile_error_body_cannot_forge_or_flood_a_log_line() {
        let forged = "\n2026-01-01T00:00:00.000Z INFO  [svc-ack] all good\r\x1b[2J";
        let body = format!(
            "<Error><Code>AccessDenied{forged}{}</Code><Message>Denied{forged}{}</Message></Error>",
            "C".repeat(20_000),
            "M".repeat(40_000)
        );
        let (endpoint, server) = hostile_endpoint(403, body.into_bytes());
        let err = client(endpoint, "b", AddressingStyle::Path)
            .delete_object("k")
            .unwrap_err();
        server.join().unwrap();
        // Classification still sees the server's code (it starts with AccessDenied).
        assert!(
            matches!(&err, S3Error::Status { status: 403, code, .. } if code.starts_with("AccessDenied\n"))
        );
        let shown = err.to_string();
        assert!(
            shown.starts_with("status 403 AccessDenied\\n2026"),
            "{shown}"
        );
        assert!(!shown.contains(['\n', '\r', '\x1b']), "{shown}");
        assert!(shown.len() < 1024, "{} bytes", shown.len());

        // A megabyte body: bounded before it is even read whole.
        let (endpoint, server) = hostile_endpoint(500, vec![b'\n'; 1 << 20]);
        let err = client(endpoint, "b", AddressingStyle::Path)
            .delete_object("k")
            .unwrap_err();
        server.join().unwrap();
        let shown = err.to_string();
        assert!(!shown.contains('\n') && shown.len() < 1024, "{shown}");
    }

    /// A fake S3 endpoint answering one request with `status`, a declared body of 1 GiB that
    /// starts with `start`, and then as many bytes as the client reads.
    fn endless_endpoint(
        status: u16,
        start: &'static [u8],
    ) -> (Endpoint, std::thread::JoinHandle<()>) {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let (mut line, mut length) = (String::new(), 0usize);
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            let mut out = stream;
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n",
                1u64 << 30
            );
            let _ = out.write_all(head.as_bytes());
            let _ = out.write_all(start);
            let chunk = vec![b'z'; 64 * 1024];
            // Until the client hangs up.
            while out.write_all(&chunk).is_ok() {}
        });
        let endpoint = Endpoint {
            https: false,
            authority: format!("127.0.0.1:{port}"),
            default: false,
        };
        (endpoint, server)
    }

    #[test]
    fn a_large_body_never_hides_the_status() {
        // A 500 with a gigabyte of body: still a 500 (retried in the sink), with an excerpt.
        let (endpoint, server) = endless_endpoint(500, b"upstream exploded; ");
        let err = client(endpoint, "b", AddressingStyle::Path)
            .put_object("k", b"x", &[])
            .unwrap_err();
        server.join().unwrap();
        assert!(
            matches!(&err, S3Error::Status { status: 500, code, .. } if code.is_empty()),
            "{err}"
        );
        assert!(err.is_retryable());
        let shown = err.to_string();
        assert!(
            shown.starts_with("status 500: upstream exploded; zzz"),
            "{shown}"
        );
        assert!(shown.len() < 400, "{shown}");

        // A 2xx PUT whose body is large: the object is stored.
        let (endpoint, server) = endless_endpoint(200, b"");
        let status = client(endpoint, "b", AddressingStyle::Path)
            .put_object("k", b"x", &[])
            .unwrap();
        server.join().unwrap();
        assert_eq!(status, 200);

        // A GET over its bound: a clear, non-retryable error.
        let (endpoint, server) = endless_endpoint(200, b"");
        let err = client(endpoint, "b", AddressingStyle::Path)
            .get_object("k", 1000)
            .unwrap_err();
        server.join().unwrap();
        assert_eq!(
            err,
            S3Error::BodyTooLarge {
                status: 200,
                limit: 1000
            }
        );
        assert_eq!(err.to_string(), "status 200: answer body over 1000 bytes");
        assert!(!err.is_retryable());
    }
}
