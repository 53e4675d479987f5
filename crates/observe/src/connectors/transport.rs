//! Wire transports of the push connectors: HTTP requests through ureq 3 (rustls on ring, TLS
//! verification always on, no redirects followed), and datagrams over UDP or a Unix datagram
//! socket. Each send is one attempt; the retry loop lives in [`super::with_retries`].
//!
//! Trust roots: the Mozilla roots compiled in (webpki-roots), or, when `SSL_CERT_FILE` names a
//! PEM file, the certificates in that file instead (the OpenSSL convention; lets an operator
//! trust a private CA of a SIEM or collector without disabling verification).

use std::fmt;
use std::io::{self, Read};
use std::net::UdpSocket;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig, TlsProvider};
use ureq::Agent;

use super::{Failure, HttpRequest};
use svc_text::peer::PeerText;
use svc_text::secrets::Secrets;

/// HTTP methods the connectors use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Post,
    Put,
    Get,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Get => "GET",
        }
    }
}

/// A 2xx answer.
#[derive(Debug, Clone)]
pub struct HttpReply {
    pub status: u16,
    /// At most the configured number of bytes.
    pub body: Vec<u8>,
}

/// Environment variable naming a PEM bundle that replaces the built-in roots.
pub const CA_FILE_ENV: &str = "SSL_CERT_FILE";

/// Trust roots: `SSL_CERT_FILE` when set, else the compiled-in Mozilla roots.
fn root_certs() -> Result<RootCerts, String> {
    let Some(path) = std::env::var_os(CA_FILE_ENV) else {
        return Ok(RootCerts::WebPki);
    };
    let path = PathBuf::from(path);
    let pem = std::fs::read(&path)
        .map_err(|e| format!("{CA_FILE_ENV} {}: cannot read: {e}", path.display()))?;
    let mut certs: Vec<Certificate<'static>> = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => {
                return Err(format!(
                    "{CA_FILE_ENV} {}: not valid PEM: {e}",
                    path.display()
                ))
            }
        }
    }
    if certs.is_empty() {
        return Err(format!(
            "{CA_FILE_ENV} {}: contains no PEM certificate",
            path.display()
        ));
    }
    Ok(RootCerts::Specific(Arc::new(certs)))
}

/// The HTTP client of one export: global timeout per request, status codes as values, no
/// redirects (a redirect could carry a token elsewhere), proxies from the usual environment
/// variables (`HTTPS_PROXY`, `NO_PROXY`, ...).
pub fn http_agent(timeout: Duration) -> Result<Agent, String> {
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(root_certs()?)
        .build();
    Ok(Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .user_agent(concat!("svc-observe/", env!("CARGO_PKG_VERSION")))
        .tls_config(tls)
        .build()
        .into())
}

/// Is this status worth another attempt?
pub fn retryable_status(status: u16) -> bool {
    status == 408 || status == 429 || status >= 500
}

/// Characters of an answer body quoted in an error at most.
const EXCERPT_CHARS: usize = 200;

/// A short printable excerpt of an answer body, for error messages: the peer's text, bounded
/// and escaped ([`PeerText`]). Secrets are scrubbed from the whole body before it is cut, so a
/// cut can never leave part of a secret behind.
fn excerpt(body: &[u8], secrets: &Secrets) -> String {
    let lossy = String::from_utf8_lossy(body);
    let whole = secrets.scrub(&lossy);
    let text = whole.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {}", PeerText::with_limit(text, EXCERPT_CHARS))
    }
}

/// Classifies a ureq error: TLS and URL problems are permanent, the rest (refused, reset,
/// timeout, DNS) may pass on another attempt.
fn classify(e: &ureq::Error) -> Failure {
    // Protocol errors can quote what the peer sent.
    let text = match e {
        ureq::Error::Timeout(t) => format!("timed out ({t})"),
        ureq::Error::Io(io) => PeerText::new(&io.to_string()).to_string(),
        other => PeerText::new(&other.to_string()).to_string(),
    };
    match e {
        ureq::Error::Tls(_)
        | ureq::Error::Rustls(_)
        | ureq::Error::Pem(_)
        | ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::RequireHttpsOnly(_)
        | ureq::Error::TlsRequired
        | ureq::Error::InvalidProxyUrl => Failure::Permanent(text),
        ureq::Error::Io(io) if io.kind() == io::ErrorKind::InvalidData => {
            // rustls reports certificate problems as InvalidData io errors.
            Failure::Permanent(text)
        }
        _ => Failure::Retryable(text),
    }
}

/// One HTTP attempt of at most `timeout` (the whole request). 2xx (and a passing body check)
/// is success; 408, 429 and 5xx are
/// retryable; other statuses are permanent failures. Error texts carry the status and a short
/// scrubbed excerpt of the answer, never a request header.
pub fn send_http(
    agent: &Agent,
    req: &HttpRequest,
    max_response_bytes: u64,
    secrets: &Secrets,
    timeout: Duration,
) -> Result<HttpReply, Failure> {
    let result = match req.method {
        super::Method::Get => {
            let mut b = agent
                .get(&req.url)
                .config()
                .timeout_global(Some(timeout))
                .build();
            for h in &req.headers {
                b = b.header(h.name.as_str(), h.wire_value());
            }
            b.call()
        }
        m => {
            let b = if m == super::Method::Put {
                agent.put(&req.url)
            } else {
                agent.post(&req.url)
            };
            let mut b = b.config().timeout_global(Some(timeout)).build();
            for h in &req.headers {
                b = b.header(h.name.as_str(), h.wire_value());
            }
            b.send(&req.body[..])
        }
    };
    let mut resp = result.map_err(|e| {
        let f = classify(&e);
        match f {
            Failure::Retryable(t) => Failure::Retryable(secrets.scrub(&t).into_owned()),
            Failure::Permanent(t) => Failure::Permanent(secrets.scrub(&t).into_owned()),
        }
    })?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    let read = resp
        .body_mut()
        .as_reader()
        .take(max_response_bytes)
        .read_to_end(&mut body);
    if let Err(e) = read {
        // The status line arrived; a broken body of a 2xx answer is still an unknown result.
        return Err(Failure::Retryable(format!(
            "HTTP {status}, reading the answer failed: {e}"
        )));
    }
    if (200..300).contains(&status) {
        if let Some(check) = req.check {
            // The check quotes the receiver's text cut to a bound: it reads the body with the
            // secrets already scrubbed, so a cut never leaves part of one behind.
            let scrubbed;
            let checked: &[u8] = match std::str::from_utf8(&body) {
                Ok(text) => {
                    scrubbed = secrets.scrub(text);
                    scrubbed.as_bytes()
                }
                // Not UTF-8, so not JSON either: the check quotes none of it.
                Err(_) => &body,
            };
            check(checked).map_err(Failure::Permanent)?;
        }
        return Ok(HttpReply { status, body });
    }
    let why = format!("HTTP {status}{}", excerpt(&body, secrets));
    if retryable_status(status) {
        Err(Failure::Retryable(why))
    } else {
        Err(Failure::Permanent(why))
    }
}

/// Where datagrams go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatagramTarget {
    Udp { host: String, port: u16 },
    Unix { path: PathBuf },
}

impl fmt::Display for DatagramTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatagramTarget::Udp { host, port } if host.contains(':') => {
                write!(f, "udp [{host}]:{port}")
            }
            DatagramTarget::Udp { host, port } => write!(f, "udp {host}:{port}"),
            DatagramTarget::Unix { path } => write!(f, "unixgram {}", path.display()),
        }
    }
}

/// A connected datagram socket. Connecting a UDP socket lets the kernel report an ICMP
/// "port unreachable" as an error on a later send, so a receiver that is down shows up as
/// failed sends instead of silence (best effort, as the spec says).
#[derive(Debug)]
pub enum DatagramSocket {
    Udp(UdpSocket),
    Unix(UnixDatagram, PathBuf),
}

impl DatagramSocket {
    pub fn open(target: &DatagramTarget, timeout: Duration) -> io::Result<DatagramSocket> {
        match target {
            DatagramTarget::Udp { host, port } => {
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, *port))?
                    .next()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
                let bind = if addr.is_ipv4() {
                    "0.0.0.0:0"
                } else {
                    "[::]:0"
                };
                let s = UdpSocket::bind(bind)?;
                s.set_write_timeout(Some(timeout))?;
                s.connect(addr)?;
                Ok(DatagramSocket::Udp(s))
            }
            DatagramTarget::Unix { path } => {
                let s = UnixDatagram::unbound()?;
                s.set_write_timeout(Some(timeout))?;
                Ok(DatagramSocket::Unix(s, path.clone()))
            }
        }
    }

    /// Sends one datagram (one attempt) waiting at most `timeout` for room in the receiver's
    /// queue: a Unix receiver that stops reading blocks every send once its queue is full.
    pub fn send_within(&self, bytes: &[u8], timeout: Duration) -> Result<(), Failure> {
        // A zero timeout means "block forever" to the kernel: at least a millisecond.
        let timeout = Some(timeout.max(Duration::from_millis(1)));
        let set = match self {
            DatagramSocket::Udp(s) => s.set_write_timeout(timeout),
            DatagramSocket::Unix(s, _) => s.set_write_timeout(timeout),
        };
        set.map_err(|e| Failure::Permanent(format!("cannot set the send timeout: {e}")))?;
        self.send(bytes)
    }

    /// Sends one datagram (one attempt). A short send is a failure.
    pub fn send(&self, bytes: &[u8]) -> Result<(), Failure> {
        let r = match self {
            DatagramSocket::Udp(s) => s.send(bytes),
            DatagramSocket::Unix(s, path) => s.send_to(bytes, path),
        };
        match r {
            Ok(n) if n == bytes.len() => Ok(()),
            Ok(n) => Err(Failure::Retryable(format!(
                "short send: {n} of {} bytes",
                bytes.len()
            ))),
            // Too large for the socket: another attempt cannot help.
            Err(e) if e.raw_os_error() == Some(90) => Err(Failure::Permanent(e.to_string())),
            Err(e) => Err(Failure::Retryable(e.to_string())),
        }
    }
}
