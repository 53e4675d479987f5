//! A fake MySQL server on plain `std::net`, written from the protocol documentation (MySQL
//! "Client/Server Protocol": Connection Phase, COM_QUERY Response, Text Resultset).
//!
//! Only for what no real server does: misbehave on purpose. Each fake serves ONE connection
//! with a script and records every byte the client sent, so a test can prove that a password
//! (or a scramble for a plugin not allowed) never left the client.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub const NONCE: &[u8; 20] = b"abcdefghijklmnopqrst";
/// Capabilities a 10.11 server announces (protocol 4.1, secure connection, plugin auth, TLS).
pub const SERVER_CAPS: u32 = 0x200 | 0x8000 | 0x8_0000 | 0x800 | 0x20_0000 | 0x2000 | 0x8;

/// A byte stream the fake serves: plain TCP or rustls over TCP.
pub trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

/// The server's side of one connection.
pub struct Peer {
    s: Box<dyn Io>,
    received: Arc<Mutex<Vec<u8>>>,
}

pub struct Fake {
    pub port: u16,
    received: Arc<Mutex<Vec<u8>>>,
    handle: Option<JoinHandle<()>>,
}

impl Fake {
    /// Listens on a free loopback port; the first connection runs `script`, then the fake
    /// records whatever else the client sends until it closes.
    pub fn start(script: impl FnOnce(&mut Peer) + Send + 'static) -> Fake {
        Fake::start_with("127.0.0.1", None, script)
    }

    /// Listens on `ip`; sends a handshake announcing `caching_sha2_password`, reads the
    /// SSLRequest, then serves the session over TLS with the certificate of
    /// `support::certs::make_certs` in `cert_dir`; the script starts at the client's
    /// handshake response (sequence 2).
    pub fn start_tls(
        ip: &str,
        cert_dir: &Path,
        script: impl FnOnce(&mut Peer) + Send + 'static,
    ) -> Fake {
        let config = super::certs::tls_server_config(cert_dir);
        Fake::start_with(ip, Some(config), script)
    }

    fn start_with(
        ip: &str,
        tls: Option<Arc<rustls::ServerConfig>>,
        script: impl FnOnce(&mut Peer) + Send + 'static,
    ) -> Fake {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let rec = received.clone();
        let handle = std::thread::Builder::new()
            .name("fake-mysql".into())
            .spawn(move || {
                let Ok((mut s, _)) = listener.accept() else {
                    return;
                };
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let s: Box<dyn Io> = match tls {
                    None => Box::new(s),
                    Some(config) => {
                        if s.write_all(&packet(0, &handshake("caching_sha2_password")))
                            .is_err()
                        {
                            return;
                        }
                        let mut req = [0u8; 36];
                        if s.read_exact(&mut req).is_err() {
                            return;
                        }
                        assert_eq!(req[..4], [32, 0, 0, 1], "SSLRequest");
                        rec.lock().unwrap().extend_from_slice(&req);
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

    /// Waits for the script and the drain (the client closed); every byte the client sent.
    pub fn finish(mut self) -> Vec<u8> {
        if let Some(h) = self.handle.take() {
            h.join().expect("fake server thread");
        }
        self.received.lock().unwrap().clone()
    }
}

/// One packet: 3-byte length, sequence id, payload.
pub fn packet(seq: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    out.push(seq);
    out.extend_from_slice(payload);
    out
}

/// An initial handshake v10 announcing `plugin`.
pub fn handshake(plugin: &str) -> Vec<u8> {
    let mut p = vec![10];
    p.extend_from_slice(b"5.5.5-10.11.99-MariaDB-fake\0");
    p.extend_from_slice(&42u32.to_le_bytes());
    p.extend_from_slice(&NONCE[..8]);
    p.push(0);
    p.extend_from_slice(&(SERVER_CAPS as u16).to_le_bytes());
    p.push(45);
    p.extend_from_slice(&2u16.to_le_bytes());
    p.extend_from_slice(&((SERVER_CAPS >> 16) as u16).to_le_bytes());
    p.push(21);
    p.extend_from_slice(&[0; 10]);
    p.extend_from_slice(&NONCE[8..]);
    p.push(0);
    p.extend_from_slice(plugin.as_bytes());
    p.push(0);
    p
}

/// An OK packet payload (status: autocommit).
pub fn ok() -> Vec<u8> {
    vec![0, 0, 0, 2, 0, 0, 0]
}

/// An ERR packet payload.
pub fn err(number: u16, state: &str, message: &str) -> Vec<u8> {
    let mut p = vec![0xFF];
    p.extend_from_slice(&number.to_le_bytes());
    p.push(b'#');
    p.extend_from_slice(state.as_bytes());
    p.extend_from_slice(message.as_bytes());
    p
}

/// An authentication switch request to `plugin` with the fake's nonce.
pub fn auth_switch(plugin: &str) -> Vec<u8> {
    let mut p = vec![0xFE];
    p.extend_from_slice(plugin.as_bytes());
    p.push(0);
    p.extend_from_slice(NONCE);
    p.push(0);
    p
}

impl Peer {
    /// Sends raw bytes; false when the client is gone.
    pub fn raw(&mut self, bytes: &[u8]) -> bool {
        self.s.write_all(bytes).is_ok()
    }

    pub fn send(&mut self, seq: u8, payload: &[u8]) -> bool {
        self.raw(&packet(seq, payload))
    }

    /// Reads one packet's payload; `None` when the client closed.
    pub fn read(&mut self) -> Option<Vec<u8>> {
        let mut head = [0u8; 4];
        self.s.read_exact(&mut head).ok()?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], 0]) as usize;
        let mut body = vec![0u8; len];
        self.s.read_exact(&mut body).ok()?;
        let mut rec = self.received.lock().unwrap();
        rec.extend_from_slice(&head);
        rec.extend_from_slice(&body);
        Some(body)
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

    /// Handshake, the client's response, OK: an accepted session (then `SET NAMES` answered).
    pub fn accept(&mut self) {
        self.send(0, &handshake("mysql_native_password"));
        self.read().expect("handshake response");
        self.send(2, &ok());
        self.read().expect("SET NAMES");
        self.send(1, &ok());
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
}
