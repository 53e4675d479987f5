//! A fake PostgreSQL server on plain `std::net`, written from the protocol documentation
//! (PostgreSQL "Frontend/Backend Protocol", chapters "Message Flow" and "Message Formats", and
//! "SASL Authentication" for SCRAM-SHA-256 per RFC 5802/7677).
//!
//! Only for what no real server can do: misbehave on purpose. Each fake serves ONE connection
//! with a script, and records every byte the client sent, so a test can prove that a password
//! (or its MD5 answer) never left the client. [`scram_server`] implements the server side of
//! SCRAM honestly (it checks the client proof and signs its answer); `psql` completes it and
//! refuses the impostor variants, which proves the fake right (tests/hostile_postgres.rs).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
pub const SALT: &[u8] = b"fake-pg-salt-16b";
pub const ITERATIONS: u32 = 4096;

/// A byte stream the fake serves: plain TCP or rustls over TCP.
pub trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

/// The server's side of one connection.
pub struct Peer {
    s: Box<dyn Io>,
    received: Arc<Mutex<Vec<u8>>>,
}

/// A fake server serving one connection with a script.
pub struct Fake {
    pub port: u16,
    received: Arc<Mutex<Vec<u8>>>,
    handle: Option<JoinHandle<()>>,
}

impl Fake {
    /// Listens on a free loopback port; the first connection runs `script`, then the fake
    /// reads (and records) whatever else the client sends until it closes.
    pub fn start(script: impl FnOnce(&mut Peer) + Send + 'static) -> Fake {
        Fake::start_with(None, script)
    }

    /// Like [`Fake::start`], but the fake answers the SSLRequest with `S` and serves the
    /// session over TLS with the certificate made by [`make_certs`] in `cert_dir`.
    pub fn start_tls(cert_dir: &Path, script: impl FnOnce(&mut Peer) + Send + 'static) -> Fake {
        Fake::start_with(Some(super::certs::tls_server_config(cert_dir)), script)
    }

    fn start_with(
        tls: Option<Arc<rustls::ServerConfig>>,
        script: impl FnOnce(&mut Peer) + Send + 'static,
    ) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let rec = received.clone();
        let handle = std::thread::Builder::new()
            .name("fake-pg".into())
            .spawn(move || {
                let Ok((mut s, _)) = listener.accept() else {
                    return;
                };
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
                let s: Box<dyn Io> = match tls {
                    None => Box::new(s),
                    Some(config) => {
                        let mut req = [0u8; 8];
                        s.read_exact(&mut req).unwrap();
                        assert_eq!(req, [0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f], "SSLRequest");
                        s.write_all(b"S").unwrap();
                        let conn = rustls::ServerConnection::new(config).unwrap();
                        Box::new(rustls::StreamOwned::new(conn, s))
                    }
                };
                let mut peer = Peer { s, received: rec };
                script(&mut peer);
                peer.drain();
            })
            .unwrap();
        Fake {
            port,
            received,
            handle: Some(handle),
        }
    }

    /// Waits for the script and the drain to end (the client closed), then returns every byte
    /// the client sent.
    pub fn finish(mut self) -> Vec<u8> {
        if let Some(h) = self.handle.take() {
            h.join().expect("fake server thread");
        }
        self.received.lock().unwrap().clone()
    }
}

impl Peer {
    pub fn read_exact(&mut self, buf: &mut [u8]) -> bool {
        if self.s.read_exact(buf).is_err() {
            return false;
        }
        self.received.lock().unwrap().extend_from_slice(buf);
        true
    }

    /// Reads the startup packet (answering an SSLRequest with `N`); returns its parameters.
    pub fn startup(&mut self) -> Vec<(String, String)> {
        loop {
            let mut len = [0u8; 4];
            assert!(self.read_exact(&mut len), "client sent no startup packet");
            let len = i32::from_be_bytes(len) as usize;
            let mut body = vec![0u8; len - 4];
            assert!(self.read_exact(&mut body));
            let code = i32::from_be_bytes(body[..4].try_into().unwrap());
            if code == 80_877_103 || code == 80_877_104 {
                self.raw(b"N"); // no SSL, no GSS encryption
                continue;
            }
            assert_eq!(code, 196_608, "protocol 3.0");
            let fields: Vec<String> = body[4..]
                .split(|&b| b == 0)
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect();
            return fields
                .chunks(2)
                .filter(|c| c.len() == 2 && !c[0].is_empty())
                .map(|c| (c[0].clone(), c[1].clone()))
                .collect();
        }
    }

    /// Reads one tagged frontend message; `None` when the client closed.
    pub fn read_msg(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 5];
        if !self.read_exact(&mut head) {
            return None;
        }
        let len = i32::from_be_bytes(head[1..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        if !self.read_exact(&mut body) {
            return None;
        }
        Some((head[0], body))
    }

    /// Sends raw bytes; false when the client is gone.
    pub fn raw(&mut self, bytes: &[u8]) -> bool {
        self.s.write_all(bytes).is_ok()
    }

    /// Sends one message.
    pub fn send(&mut self, tag: u8, body: &[u8]) -> bool {
        self.raw(&frame(tag, body))
    }

    /// Sends bytes one at a time with `gap` between them; stops when the client is gone.
    pub fn drip(&mut self, bytes: &[u8], gap: Duration) {
        for b in bytes {
            if !self.raw(&[*b]) {
                return;
            }
            std::thread::sleep(gap);
        }
    }

    /// AuthenticationOk, the usual parameters, key data, ReadyForQuery.
    pub fn ready(&mut self) {
        let mut out = frame(b'R', &0i32.to_be_bytes());
        out.extend(after_auth());
        self.raw(&out);
    }

    /// Reads and records until the client closes (or 60 s of silence).
    pub fn drain(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.s.read(&mut buf) {
            if n == 0 {
                break;
            }
            self.received.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    }

    /// Answers simple queries like a tiny server until the client terminates: `SHOW x` -> `on`,
    /// anything else -> one row `1`. Returns the queries seen.
    pub fn serve_queries(&mut self) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some((tag, body)) = self.read_msg() {
            match tag {
                b'Q' => {
                    let sql = String::from_utf8_lossy(&body[..body.len() - 1]).into_owned();
                    let mut out = Vec::new();
                    if sql.contains("SET ") {
                        out.extend(frame(b'C', b"SET\0"));
                    }
                    let value: &[u8] = if sql.contains("SHOW") { b"on" } else { b"1" };
                    out.extend(row_description());
                    out.extend(data_row(&[Some(value)]));
                    out.extend(frame(
                        b'C',
                        if sql.contains("SHOW") {
                            b"SHOW\0"
                        } else {
                            b"SELECT 1\0"
                        },
                    ));
                    out.extend(frame(b'Z', b"I"));
                    seen.push(sql);
                    self.raw(&out);
                }
                b'X' => break,
                _ => {}
            }
        }
        seen
    }
}

/// `tag`, length, body.
pub fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// What a server sends after AuthenticationOk: ParameterStatus x3, BackendKeyData,
/// ReadyForQuery.
pub fn after_auth() -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in [
        ("server_version", "15.99"),
        ("client_encoding", "UTF8"),
        ("standard_conforming_strings", "on"),
    ] {
        out.extend(frame(b'S', format!("{k}\0{v}\0").as_bytes()));
    }
    let mut key = 4242i32.to_be_bytes().to_vec();
    key.extend_from_slice(&77i32.to_be_bytes());
    out.extend(frame(b'K', &key));
    out.extend(frame(b'Z', b"I"));
    out
}

/// A RowDescription of one text column `?column?`.
pub fn row_description() -> Vec<u8> {
    let mut b = 1i16.to_be_bytes().to_vec();
    b.extend_from_slice(b"?column?\0");
    b.extend_from_slice(&0i32.to_be_bytes()); // table oid
    b.extend_from_slice(&0i16.to_be_bytes()); // column number
    b.extend_from_slice(&25i32.to_be_bytes()); // text
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes()); // text format
    frame(b'T', &b)
}

/// A DataRow of text columns.
pub fn data_row(cols: &[Option<&[u8]>]) -> Vec<u8> {
    let mut b = (cols.len() as i16).to_be_bytes().to_vec();
    for c in cols {
        match c {
            None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(v) => {
                b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                b.extend_from_slice(v);
            }
        }
    }
    frame(b'D', &b)
}

/// An ErrorResponse with severity, SQLSTATE and message.
pub fn error_response(severity: &str, code: &str, message: &str) -> Vec<u8> {
    let body = format!("S{severity}\0V{severity}\0C{code}\0M{message}\0\0");
    frame(b'E', body.as_bytes())
}

/// How the SCRAM fake ends the exchange after a valid client proof.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ScramEnd {
    /// SASLFinal with the true server signature, then AuthenticationOk: a real server.
    Honest,
    /// No SASLFinal: AuthenticationOk and ReadyForQuery right away (an impostor that does not
    /// know the password cannot sign).
    SkipFinalThenOk,
    /// No SASLFinal, no AuthenticationOk: ReadyForQuery right away.
    SkipFinalThenReady,
    /// SASLFinal with a forged signature.
    ForgedSignature,
    /// Asks for one PBKDF2 iteration (a proof cheap to crack offline), else honest.
    OneIteration,
}

/// The server side of SCRAM-SHA-256 for `password`. Returns false when the client's proof was
/// wrong (the fake then sent FATAL 28P01), or the client left.
pub fn scram_server(peer: &mut Peer, password: &str, end: ScramEnd) -> bool {
    scram_server_with(peer, password, end, &["SCRAM-SHA-256"], None)
}

/// The server side of SCRAM offering `mechanisms`; `cert_hash` is the `tls-server-end-point`
/// hash of the fake's own certificate (TLS sessions). Checks the client's GS2 header and
/// channel binding data like PostgreSQL: `y` while `-PLUS` was offered is a downgrade (FATAL
/// 28000), and `c=` must carry exactly the header and the certificate hash (FATAL 08P01).
pub fn scram_server_with(
    peer: &mut Peer,
    password: &str,
    end: ScramEnd,
    mechanisms: &[&str],
    cert_hash: Option<&[u8]>,
) -> bool {
    let mut offer = 10i32.to_be_bytes().to_vec();
    for m in mechanisms {
        offer.extend_from_slice(m.as_bytes());
        offer.push(0);
    }
    offer.push(0);
    peer.send(b'R', &offer);
    let Some((b'p', body)) = peer.read_msg() else {
        return false;
    };
    // SASLInitialResponse: mechanism, length, client-first-message.
    let nul = body.iter().position(|&b| b == 0).unwrap();
    let mechanism = String::from_utf8(body[..nul].to_vec()).unwrap();
    assert!(mechanisms.contains(&mechanism.as_str()), "{mechanism}");
    let client_first = String::from_utf8(body[nul + 5..].to_vec()).unwrap();
    let gs2_len = client_first.match_indices(',').nth(1).unwrap().0 + 1;
    let (gs2, bare) = client_first.split_at(gs2_len);
    let plus = mechanism.ends_with("-PLUS");
    let gs2_ok = match gs2 {
        "p=tls-server-end-point,," => plus && cert_hash.is_some(),
        "y,," => !plus && !mechanisms.iter().any(|m| m.ends_with("-PLUS")),
        "n,," => !plus,
        _ => false,
    };
    if !gs2_ok {
        peer.raw(&error_response(
            "FATAL",
            "28000",
            "SCRAM channel binding negotiation error",
        ));
        return false;
    }
    let mut cbind = gs2.as_bytes().to_vec();
    if plus {
        cbind.extend_from_slice(cert_hash.unwrap());
    }
    let expected_c = format!("c={}", B64.encode(&cbind));
    let client_nonce = bare.split_once(",r=").unwrap().1;
    let nonce = format!("{client_nonce}FakeServerNonce");
    let iterations = if matches!(end, ScramEnd::OneIteration) {
        1
    } else {
        ITERATIONS
    };
    let server_first = format!("r={nonce},s={},i={iterations}", B64.encode(SALT));
    peer.send(
        b'R',
        &[&11i32.to_be_bytes()[..], server_first.as_bytes()].concat(),
    );
    let Some((b'p', body)) = peer.read_msg() else {
        return false;
    };
    let client_final = String::from_utf8(body).unwrap();
    let (without_proof, proof) = client_final.rsplit_once(",p=").unwrap();
    if without_proof.split(',').next() != Some(expected_c.as_str()) {
        peer.raw(&error_response(
            "FATAL",
            "08P01",
            "SCRAM channel binding check failed",
        ));
        return false;
    }
    let auth_message = format!("{bare},{server_first},{without_proof}");

    let mut salted = [0u8; 32];
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        std::num::NonZeroU32::new(iterations).unwrap(),
        SALT,
        password.as_bytes(),
        &mut salted,
    );
    let salted = hmac::Key::new(hmac::HMAC_SHA256, &salted);
    let client_key = hmac::sign(&salted, b"Client Key");
    let stored_key = digest::digest(&digest::SHA256, client_key.as_ref());
    let client_sig = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, stored_key.as_ref()),
        auth_message.as_bytes(),
    );
    let proof = B64.decode(proof).unwrap_or_default();
    let recovered: Vec<u8> = proof
        .iter()
        .zip(client_sig.as_ref())
        .map(|(a, b)| a ^ b)
        .collect();
    if proof.len() != 32
        || digest::digest(&digest::SHA256, &recovered).as_ref() != stored_key.as_ref()
    {
        peer.raw(&error_response(
            "FATAL",
            "28P01",
            "password authentication failed for user",
        ));
        return false;
    }
    let server_key = hmac::sign(&salted, b"Server Key");
    let server_sig = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, server_key.as_ref()),
        auth_message.as_bytes(),
    );
    let sasl_final = |sig: &[u8]| {
        frame(
            b'R',
            &[
                &12i32.to_be_bytes()[..],
                format!("v={}", B64.encode(sig)).as_bytes(),
            ]
            .concat(),
        )
    };
    let mut out = match end {
        ScramEnd::Honest | ScramEnd::OneIteration => sasl_final(server_sig.as_ref()),
        ScramEnd::ForgedSignature => sasl_final(&[7u8; 32]),
        ScramEnd::SkipFinalThenOk | ScramEnd::SkipFinalThenReady => Vec::new(),
    };
    if end != ScramEnd::SkipFinalThenReady {
        out.extend(frame(b'R', &0i32.to_be_bytes()));
        out.extend(after_auth());
    } else {
        out.extend(frame(b'Z', b"I"));
    }
    peer.raw(&out)
}

/// SHA-256 of the DER of `dir/server.pem`: its `tls-server-end-point` hash (ECDSA with SHA-256).
pub fn cert_hash(dir: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_file(dir.join("server.pem")).unwrap();
    digest::digest(&digest::SHA256, der.as_ref())
        .as_ref()
        .to_vec()
}
