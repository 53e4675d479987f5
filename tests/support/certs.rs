//! The one test PKI: a CA, a server certificate it signed, and an unrelated self-signed
//! certificate, made with the `openssl` command. ECDSA P-256: a key pair is made in
//! milliseconds, where RSA 2048 took a good part of a second per key on this machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use super::net::{free_port, wait_tcp};

/// What [`make_certs`] wrote. The server certificate names `localhost` and 127.0.0.1 (as
/// subject alternative names: rustls, Go and Python read those, not the common name); the
/// self-signed one names the same, so only its issuer makes it untrusted.
pub struct Certs {
    /// `ca.pem`; its key `ca.key` stays beside it (tests that sign client certificates use it).
    pub ca: PathBuf,
    /// `server.pem`, `server.key`.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `self.pem`, `self.key`: self-signed, trusted by nobody.
    pub rogue_cert: PathBuf,
    pub rogue_key: PathBuf,
}

/// Runs `openssl` in `dir`; panics with its stderr when it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is installed (scripts/deps.sh)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes the test PKI into `dir` (see [`Certs`]).
pub fn make_certs(dir: &Path) -> Certs {
    const EC: [&str; 5] = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    const SAN: &str = "subjectAltName=DNS:localhost,IP:127.0.0.1";
    let run = |args: &[&[&str]]| openssl(dir, &args.concat());
    run(&[
        &["req", "-x509"],
        &EC,
        &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"],
        &["-subj", "/CN=svc test CA"],
        &["-addext", "basicConstraints=critical,CA:TRUE"],
        &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
    ]);
    run(&[
        &["req"],
        &EC,
        &["-keyout", "server.key", "-out", "server.csr"],
        &["-subj", "/CN=localhost"],
    ]);
    std::fs::write(
        dir.join("server.ext"),
        format!("{SAN}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    run(&[
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
        ],
        &["-CAcreateserial", "-out", "server.pem", "-days", "2"],
        &["-extfile", "server.ext"],
    ]);
    run(&[
        &["req", "-x509"],
        &EC,
        &["-keyout", "self.key", "-out", "self.pem", "-days", "2"],
        &["-subj", "/CN=localhost", "-addext", SAN],
        &["-addext", "basicConstraints=critical,CA:FALSE"],
    ]);
    Certs {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        rogue_cert: dir.join("self.pem"),
        rogue_key: dir.join("self.key"),
    }
}

/// A rustls server configuration with the server certificate and key [`make_certs`] wrote in
/// `dir`, for fakes that speak TLS themselves (ring, the provider the product uses).
pub fn tls_server_config(dir: &Path) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    Arc::new(config)
}

/// `openssl s_server -www` on a free loopback port with the given certificate and key, for
/// real TLS handshakes against a server no test code wrote. Killed on drop.
pub struct TlsServer {
    child: Child,
    pub port: u16,
}

impl TlsServer {
    pub fn start(cert: &Path, key: &Path) -> TlsServer {
        let port = free_port();
        let child = Command::new("openssl")
            .args(["s_server", "-accept", &port.to_string(), "-cert"])
            .arg(cert)
            .arg("-key")
            .arg(key)
            .args(["-www", "-quiet"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server");
        let server = TlsServer { child, port };
        wait_tcp(port, Duration::from_secs(10));
        server
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
