//! The HTTP client of the sink: one `ureq` agent (rustls on ring, the same stack as the
//! object-store sink) whose keep-alive pool is shared by every request thread, with the
//! configured trust (system store or `tls_ca_file`), client certificate, proxy and a single
//! deadline per request. Redirects are never followed, and a response body is read to
//! [`MAX_RESPONSE_BODY`] at most: a receiver answering a gigabyte costs 64 KiB and the
//! connection.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use ureq::http::{Method, Request};
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};
use ureq::unversioned::transport::DefaultConnector;
use ureq::Agent;

use super::config::HttpSinkConfig;
use super::outcome::{classify, judge, read_failure, HttpError, Statuses, MAX_RESPONSE_BODY};
use crate::message::protection::keys::read_private_file;
use crate::sink::resolver::CachingResolver;

/// Largest certificate (chain) or CA file read.
const MAX_CERT_FILE_BYTES: u64 = 1 << 20;
/// Idle keep-alive connections kept beyond one per request thread, so a sustained run never
/// closes a connection after one request.
const POOL_SPARE: usize = 2;

/// An answer that was read (success or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
}

pub struct Client {
    agent: Agent,
    cfg: Arc<HttpSinkConfig>,
}

impl Client {
    /// Builds the agent: reads the CA file and the client identity (the key file must be
    /// private: the payload keys' rule).
    pub fn new(cfg: Arc<HttpSinkConfig>) -> Result<Client, String> {
        let roots = match &cfg.tls_ca_file {
            Some(path) => {
                let pem = read_public(path)
                    .map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
                let certs = certificates(&pem)
                    .map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
                RootCerts::Specific(Arc::new(certs))
            }
            None => system_roots()?,
        };
        let client_cert = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
            (Some(cert), Some(key)) => Some(client_identity(cert, key)?),
            _ => None,
        };
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(roots)
            .client_cert(client_cert)
            .build();
        let proxy = match &cfg.proxy {
            Some(p) => {
                let u = url::Url::parse(p).map_err(|_| "proxy: not a valid URL".to_string())?;
                let mut b = ureq::Proxy::builder(ureq::ProxyProtocol::Http)
                    .host(u.host_str().unwrap_or_default())
                    .port(u.port_or_known_default().unwrap_or(80));
                for n in &cfg.no_proxy {
                    b = b.no_proxy(n);
                }
                Some(b.build().map_err(|e| format!("proxy: {e}"))?)
            }
            None => None,
        };
        let pool = cfg.max_concurrent_requests + POOL_SPARE;
        let config = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(cfg.request_timeout))
            .max_redirects(0)
            .max_idle_connections(pool * 2)
            .max_idle_connections_per_host(pool)
            .max_idle_age(std::time::Duration::from_secs(4))
            .user_agent(concat!("svc/", env!("CARGO_PKG_VERSION")))
            .proxy(proxy)
            .tls_config(tls)
            .build();
        let agent = Agent::with_parts(config, DefaultConnector::new(), CachingResolver::default());
        Ok(Client { agent, cfg })
    }

    /// Sends one request to the sink's URL and judges the answer by the configured statuses.
    pub fn send(&self, headers: &[(String, String)], body: &[u8]) -> Result<Answer, HttpError> {
        let method = Method::from_bytes(self.cfg.method.as_str().as_bytes())
            .map_err(|e| HttpError::Other(format!("method: {e}")))?;
        let mut b = Request::builder().method(method).uri(self.cfg.url.as_str());
        for (k, v) in headers {
            b = b.header(k.as_str(), v.as_str());
        }
        let req = b
            .body(body)
            .map_err(|e| HttpError::Other(format!("build request: {e}")))?;
        let mut resp = self.agent.run(req).map_err(classify)?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut text = Vec::new();
        // A body over the bound is left unread and its connection dropped, never drained:
        // the status decides, the body only gives the words.
        resp.body_mut()
            .as_reader()
            .take(MAX_RESPONSE_BODY)
            .read_to_end(&mut text)
            .map_err(|e| read_failure(status, e))?;
        match judge(
            status,
            &text,
            retry_after.as_deref(),
            Statuses {
                success: &self.cfg.success_statuses,
                retry: &self.cfg.retry_statuses,
                dead_letter: &self.cfg.dead_letter_statuses,
            },
            SystemTime::now(),
        ) {
            None => Ok(Answer { status }),
            Some(e) => Err(e),
        }
    }

    /// The probe of `svc test-sink`: its method on the probe URL (or the sink's URL). Any
    /// answer is returned with its status; only a failure to get one is an error.
    pub fn probe(&self, headers: &[(String, String)]) -> Result<u16, HttpError> {
        let method = Method::from_bytes(self.cfg.probe_method.as_str().as_bytes())
            .map_err(|e| HttpError::Other(format!("probe method: {e}")))?;
        let url = self.cfg.probe_url.as_deref().unwrap_or(&self.cfg.url);
        let mut b = Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            b = b.header(k.as_str(), v.as_str());
        }
        let req = b
            .body(())
            .map_err(|e| HttpError::Other(format!("build probe: {e}")))?;
        let mut resp = self.agent.run(req).map_err(classify)?;
        let status = resp.status().as_u16();
        if method != Method::HEAD {
            let mut sink = Vec::new();
            let _ = resp
                .body_mut()
                .as_reader()
                .take(MAX_RESPONSE_BODY)
                .read_to_end(&mut sink);
        }
        Ok(status)
    }
}

/// The system trust store (what the relational sink's TLS trusts too).
fn system_roots() -> Result<RootCerts, String> {
    let native = rustls_native_certs::load_native_certs();
    let certs: Vec<Certificate<'static>> = native
        .certs
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    if certs.is_empty() {
        return Err(
            "the system trust store holds no certificate (install ca-certificates or set \
             tls_ca_file)"
                .into(),
        );
    }
    Ok(RootCerts::Specific(Arc::new(certs)))
}

fn certificates(pem: &[u8]) -> Result<Vec<Certificate<'static>>, String> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("not valid PEM: {e}")),
        }
    }
    if certs.is_empty() {
        return Err("contains no PEM certificate".into());
    }
    Ok(certs)
}

/// A certificate or CA file: not secret, opened as a key is (no link at the name, never
/// blocking on a FIFO planted there), read bounded.
fn read_public(path: &Path) -> Result<Vec<u8>, String> {
    let (file, _) = crate::files::owner::open_regular(path).map_err(|e| e.to_string())?;
    let mut pem = Vec::new();
    file.take(MAX_CERT_FILE_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(|e| format!("cannot read: {e}"))?;
    if pem.len() as u64 > MAX_CERT_FILE_BYTES {
        return Err(format!("larger than {MAX_CERT_FILE_BYTES} bytes"));
    }
    Ok(pem)
}

/// The client certificate chain and its key; the key file must be readable by its owner
/// only, as the broker's `nats.tls_key_file` and the payload keys.
fn client_identity(cert: &Path, key: &Path) -> Result<ClientCert, String> {
    let pem = read_public(cert).map_err(|e| format!("tls_cert_file {}: {e}", cert.display()))?;
    let chain = certificates(&pem).map_err(|e| format!("tls_cert_file {}: {e}", cert.display()))?;
    let key_pem =
        read_private_file(key).map_err(|e| format!("tls_key_file {}: {e}", key.display()))?;
    let private = PrivateKey::from_pem(key_pem.expose().as_bytes()).map_err(|_| {
        format!(
            "tls_key_file {}: holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
            key.display()
        )
    })?;
    check_identity(&chain, key_pem.expose().as_bytes())
        .map_err(|e| format!("tls_cert_file {}: {e}", cert.display()))?;
    Ok(ClientCert::new_with_certs(&chain, private))
}

/// Gives the pair to rustls once here: ureq builds its TLS config on the first connection
/// and panics when rustls refuses the pair (an X.509 v1 certificate, a key of another
/// certificate), where an operator needs an error at start.
fn check_identity(chain: &[Certificate<'static>], key_pem: &[u8]) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = chain
        .iter()
        .map(|c| CertificateDer::from(c.der().to_vec()))
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| "the key file holds no usable PEM private key".to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(certs, key)
        .map(|_| ())
        .map_err(|e| format!("not usable as a client certificate with its key: {e}"))
}
