//! The byte transport under the PostgreSQL client: TCP with a deadline for a whole operation,
//! optionally wrapped in TLS (SSLRequest + rustls), and the `tls-server-end-point` channel
//! binding data of the server's certificate.
//!
//! Why a deadline stream: socket timeouts bound each `read`/`write` call, so a server that
//! drips one byte at a time would hold a worker for as long as it likes. [`DeadlineTcp`] sets
//! the remaining time of the current operation before every call and fails once it is spent;
//! rustls sits on top of it, so the TLS handshake obeys the same deadline.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::error::{io_err, DbError};

use svc_text::peer::PeerText;

/// A TCP stream whose every read and write must finish before the current deadline.
pub struct DeadlineTcp {
    tcp: TcpStream,
    deadline: Instant,
}

impl DeadlineTcp {
    /// Connects to the first address that answers before `deadline`.
    pub fn connect(host: &str, port: u16, deadline: Instant) -> Result<DeadlineTcp, DbError> {
        let addrs: Vec<_> = (host, port)
            .to_socket_addrs()
            .map_err(|e| DbError::Connection(format!("resolve {host}: {e}")))?
            .collect();
        let mut last = DbError::Connection(format!("resolve {host}: no address"));
        for addr in addrs {
            let Some(left) = remaining(deadline) else {
                return Err(DbError::Connection(format!(
                    "connect {host}:{port}: timed out"
                )));
            };
            match TcpStream::connect_timeout(&addr, left) {
                Ok(tcp) => {
                    let _ = tcp.set_nodelay(true);
                    return Ok(DeadlineTcp { tcp, deadline });
                }
                Err(e) => last = io_err(&format!("connect {host}:{port}"), e),
            }
        }
        Err(last)
    }

    /// Starts a new operation: every later read and write must end before `deadline`.
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    fn arm(&self, read: bool) -> io::Result<()> {
        let left = remaining(self.deadline)
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))?;
        if read {
            self.tcp.set_read_timeout(Some(left))
        } else {
            self.tcp.set_write_timeout(Some(left))
        }
    }
}

/// Time left before `deadline`, `None` once it passed (a zero socket timeout means "none").
fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| *d >= Duration::from_millis(1))
}

impl Read for DeadlineTcp {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm(true)?;
        self.tcp.read(buf)
    }
}

impl Write for DeadlineTcp {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm(false)?;
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// The session's byte stream.
pub enum Stream {
    Plain(DeadlineTcp),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, DeadlineTcp>>),
}

impl Stream {
    pub fn set_deadline(&mut self, deadline: Instant) {
        match self {
            Stream::Plain(s) => s.set_deadline(deadline),
            Stream::Tls(s) => s.sock.set_deadline(deadline),
        }
    }

    /// `tls-server-end-point` channel binding data (RFC 5929) of a TLS session, `None` over
    /// plain TCP.
    pub fn channel_binding(&self) -> Option<Result<Vec<u8>, String>> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => Some(match s.conn.peer_certificates().and_then(|c| c.first()) {
                Some(cert) => tls_server_end_point(cert.as_ref()),
                None => Err("the server presented no certificate".into()),
            }),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// The rustls handshake on `tcp` (after the engine's own TLS request was accepted): chain and
/// host name verified against `config`, all before the stream's deadline. Shared by the
/// PostgreSQL and the MySQL clients.
pub fn tls_handshake(
    mut tcp: DeadlineTcp,
    config: Option<Arc<rustls::ClientConfig>>,
    host: &str,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, DeadlineTcp>, DbError> {
    let config =
        config.ok_or_else(|| DbError::Protocol("tls requested without trust anchors".into()))?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| DbError::Connection(format!("tls: invalid server name {host}")))?;
    let mut conn = rustls::ClientConnection::new(config, name)
        .map_err(|e| DbError::Connection(format!("tls: {e}")))?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            // rustls reports certificate problems as InvalidData wrapping its own error.
            return Err(match e.kind() {
                // rustls 0.23 may quote names the certificate presents: peer text.
                io::ErrorKind::InvalidData => {
                    DbError::Connection(format!("tls handshake: {}", PeerText::new(&e.to_string())))
                }
                _ => io_err("tls handshake", e),
            });
        }
    }
    Ok(rustls::StreamOwned::new(conn, tcp))
}

/// Builds the rustls client configuration: trust anchors from a PEM file, or the system store.
pub fn tls_client_config(
    ca_file: Option<&std::path::Path>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| format!("read tls_ca_file {}: {e}", path.display()))?;
            let mut added = 0;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert
                    .map_err(|e| format!("tls_ca_file {}: not valid pem: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
                added += 1;
            }
            if added == 0 {
                return Err(format!(
                    "tls_ca_file {}: holds no certificate",
                    path.display()
                ));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            if let (true, Some(e)) = (native.certs.is_empty(), native.errors.first()) {
                return Err(format!("load the system trust store: {e}"));
            }
            let (_, _ignored) = roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                return Err("the system trust store holds no usable certificate".into());
            }
        }
    }
    // One explicit provider: no dependence on a process-wide default (rustls 0.23 panics at
    // `ClientConfig::builder()` when no single default provider can be chosen).
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("tls: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

/// RFC 5929 `tls-server-end-point`: the hash of the server's DER certificate, with the hash of
/// its signature algorithm, SHA-256 when that is MD5 or SHA-1. Signature algorithms without a
/// single hash (Ed25519, RSASSA-PSS) have no defined binding here and are refused.
pub fn tls_server_end_point(cert_der: &[u8]) -> Result<Vec<u8>, String> {
    use ring::digest;
    let oid = signature_algorithm_oid(cert_der)
        .ok_or("channel binding: cannot read the certificate's signature algorithm")?;
    // DER contents of the OIDs (1.2.840.113549.1.1.x RSA, 1.2.840.10045.4.x ECDSA).
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    let alg = match oid {
        o if o.len() == RSA.len() + 1 && o.starts_with(RSA) => match o[RSA.len()] {
            4 | 5 | 11 => &digest::SHA256, // md5, sha1 (both: SHA-256), sha256 with RSA
            12 => &digest::SHA384,
            13 => &digest::SHA512,
            _ => return Err(unsupported_sig()),
        },
        o if o == [ECDSA, &[0x01]].concat() => &digest::SHA256, // ecdsa-with-SHA1
        o if o.len() == ECDSA.len() + 2 && o.starts_with(ECDSA) && o[ECDSA.len()] == 3 => {
            match o[ECDSA.len() + 1] {
                2 => &digest::SHA256,
                3 => &digest::SHA384,
                4 => &digest::SHA512,
                _ => return Err(unsupported_sig()),
            }
        }
        _ => return Err(unsupported_sig()),
    };
    Ok(digest::digest(alg, cert_der).as_ref().to_vec())
}

fn unsupported_sig() -> String {
    "channel binding: the server certificate's signature algorithm has no tls-server-end-point \
     hash (only RSA and ECDSA with SHA-1/256/384/512 are supported)"
        .into()
}

/// `Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm AlgorithmIdentifier, ... }`:
/// the contents of the algorithm's OID.
fn signature_algorithm_oid(der: &[u8]) -> Option<&[u8]> {
    let (tag, cert, _) = der_tlv(der)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, _tbs, after_tbs) = der_tlv(cert)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, alg, _) = der_tlv(after_tbs)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, oid, _) = der_tlv(alg)?;
    (tag == 0x06).then_some(oid)
}

/// One DER element: (tag, contents, the bytes after it). Definite lengths only.
fn der_tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)? as usize;
    let (len, hdr) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | *b.get(2 + i)? as usize;
        }
        (len, 2 + n)
    };
    let end = hdr.checked_add(len)?;
    Some((tag, b.get(hdr..end)?, &b[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_point_hash_follows_the_signature_algorithm() {
        // A skeleton certificate: SEQUENCE { SEQUENCE {}, SEQUENCE { OID }, BIT STRING }.
        let cert = |oid: &[u8]| {
            let mut alg = vec![0x06, oid.len() as u8];
            alg.extend_from_slice(oid);
            let mut body = vec![0x30, 0x00, 0x30, alg.len() as u8];
            body.extend(alg);
            body.extend([0x03, 0x01, 0x00]);
            let mut c = vec![0x30, body.len() as u8];
            c.extend(body);
            c
        };
        let sha256_rsa = cert(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 11]);
        let sha1_rsa = cert(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 5]);
        let ecdsa384 = cert(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03]);
        let ed25519 = cert(&[0x2b, 0x65, 0x70]);
        use ring::digest::{digest, SHA256, SHA384};
        assert_eq!(
            tls_server_end_point(&sha256_rsa).unwrap(),
            digest(&SHA256, &sha256_rsa).as_ref()
        );
        assert_eq!(
            tls_server_end_point(&sha1_rsa).unwrap(),
            digest(&SHA256, &sha1_rsa).as_ref()
        );
        assert_eq!(
            tls_server_end_point(&ecdsa384).unwrap(),
            digest(&SHA384, &ecdsa384).as_ref()
        );
        assert!(tls_server_end_point(&ed25519).is_err());
        assert!(tls_server_end_point(b"\x30\x84\xff\xff\xff\xff").is_err());
        assert!(tls_server_end_point(b"").is_err());
    }
}
