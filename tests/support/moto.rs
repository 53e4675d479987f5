//! moto, the S3-compatible server of the object-store tests, with signature checking enforced:
//! started with `INITIAL_NO_AUTH_ACTION_COUNT=3`, then three IAM calls create the user whose
//! keys the tests sign with (a wrong secret gets 403 SignatureDoesNotMatch).
//!
//! Each [`Moto`] is its own server process on a free loopback port; it exits when dropped and
//! also by itself when the test process is gone (the helper watches its parent). An
//! [`OutageProxy`] in front of it simulates the store going away (connection refused) and
//! coming back without losing moto's in-memory state.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::net::{free_port, wait_tcp};
use super::python::{python, script};

pub struct Moto {
    child: Child,
    pub port: u16,
    pub key_id: String,
    pub secret: String,
    /// `https` when started with a certificate.
    pub scheme: &'static str,
    ca_bundle: Option<PathBuf>,
    /// Served by waitress (HTTP/1.1 keep-alive); werkzeug, the fallback, closes every
    /// connection after one response.
    pub keep_alive: bool,
}

impl Moto {
    pub fn start() -> Moto {
        Self::start_inner(None)
    }

    /// moto over TLS with the given certificate chain and key; `ca` is what boto3 trusts.
    pub fn start_tls(cert: &Path, key: &Path, ca: &Path) -> Moto {
        Self::start_inner(Some((cert, key, ca)))
    }

    fn start_inner(tls: Option<(&Path, &Path, &Path)>) -> Moto {
        // A free port can be taken by a parallel test between our pick and moto's bind: the
        // helper then exits without its ready line, and we try a new port.
        for _ in 0..4 {
            if let Some(m) = Self::try_start(tls) {
                return m;
            }
        }
        Self::try_start(tls).expect("moto failed to start on 5 ports")
    }

    fn try_start(tls: Option<(&Path, &Path, &Path)>) -> Option<Moto> {
        let port = free_port();
        let mut cmd = Command::new(python());
        cmd.arg(script("moto_helper.py"))
            .arg("serve")
            .arg(port.to_string());
        if let Some((cert, key, _)) = tls {
            cmd.arg(cert).arg(key);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto (python3 with moto[server] and boto3)");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("moto-ready".into())
            .spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = tx.send(line);
            })
            .unwrap();
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("moto did not start within 60 s");
        let Some(kind) = line.trim().strip_prefix("ready ") else {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        };
        wait_tcp(port, Duration::from_secs(20));
        let mut moto = Moto {
            child,
            port,
            key_id: String::new(),
            secret: String::new(),
            scheme: if tls.is_some() { "https" } else { "http" },
            ca_bundle: tls.map(|(_, _, ca)| ca.to_path_buf()),
            keep_alive: kind == "waitress",
        };
        let keys = moto.py(&["setup", &moto.endpoint()]);
        moto.key_id = keys["key_id"].as_str().unwrap().to_string();
        moto.secret = keys["secret"].as_str().unwrap().to_string();
        Some(moto)
    }

    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn py(&self, args: &[&str]) -> serde_json::Value {
        let mut cmd = Command::new(python());
        cmd.arg(script("moto_helper.py")).args(args);
        if let Some(ca) = &self.ca_bundle {
            cmd.env("AWS_CA_BUNDLE", ca);
        }
        let out = cmd.output().expect("run moto helper");
        assert!(
            out.status.success(),
            "helper {:?} failed: {}",
            args.first(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("helper prints JSON")
    }

    pub fn create_bucket(&self, name: &str, versioned: bool) {
        self.py(&[
            "bucket",
            &self.endpoint(),
            &self.key_id,
            &self.secret,
            name,
            if versioned { "true" } else { "false" },
        ]);
    }

    /// A bucket created with Object Lock enabled.
    pub fn create_locked_bucket(&self, name: &str) {
        let (endpoint, key, secret) = (self.endpoint(), &self.key_id, &self.secret);
        self.py(&["bucket", &endpoint, key, secret, name, "lock"]);
    }

    /// An object's retention, legal hold and encryption as the store reports them, after
    /// trying to delete its version (`delete`: "deleted" or "refused: ...").
    pub fn lock_of(&self, bucket: &str, key: &str) -> serde_json::Value {
        let (endpoint, id, secret) = (self.endpoint(), &self.key_id, &self.secret);
        self.py(&["lock", &endpoint, id, secret, bucket, key])
    }

    /// Every object version of a (versioned) bucket: key -> number of versions.
    pub fn versions(&self, bucket: &str) -> HashMap<String, usize> {
        let v = self.py(&[
            "versions",
            &self.endpoint(),
            &self.key_id,
            &self.secret,
            bucket,
        ]);
        let mut out = HashMap::new();
        for item in v.as_array().unwrap() {
            *out.entry(item["key"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
        out
    }

    /// Creates IAM role `name`, assumable by anyone and allowed everything: moto refuses
    /// (HTTP 500) requests signed with credentials of a role it does not know.
    pub fn create_role(&self, name: &str) {
        self.py(&["role", &self.endpoint(), &self.key_id, &self.secret, name]);
    }

    /// `n` sets of temporary credentials issued by moto's STS `AssumeRole` (signed with the
    /// IAM user's keys): `(key id, secret, session token)`.
    pub fn temporary_credentials(&self, n: usize) -> Vec<(String, String, String)> {
        let v = self.py(&[
            "assume",
            &self.endpoint(),
            &self.key_id,
            &self.secret,
            &n.to_string(),
        ]);
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let s = |k: &str| c[k].as_str().unwrap().to_string();
                (s("key_id"), s("secret"), s("token"))
            })
            .collect()
    }

    /// The environment the sink resolves credentials from (`credential_mode environment`
    /// with variables `T_KEY_ID`/`T_SECRET`).
    pub fn env(&self) -> HashMap<String, String> {
        HashMap::from([
            ("T_KEY_ID".to_string(), self.key_id.clone()),
            ("T_SECRET".to_string(), self.secret.clone()),
        ])
    }

    /// SIGSTOP / SIGCONT: the store hangs (requests time out) and comes back with its state.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too, so no SIGCONT is needed here; a drop must not
        // panic (it may run while a failed test unwinds).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `sig` with kill(1) (Debian package procps, installed by scripts/deps.sh). A pause
/// that silently failed would turn a "store hangs" test into a "store answers" test, so a
/// missing `kill` or a failed signal fails the test.
fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill (Debian package procps): {e}"));
    assert!(status.success(), "kill -{sig} {pid}: {status}");
}

/// A TCP forwarder in front of a server that can be taken down (listener closed, every open
/// connection cut: clients see connection refused/reset) and brought back on the same port.
pub struct OutageProxy {
    pub port: u16,
    target: u16,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    /// Stop flag of the current accept loop.
    stop: Mutex<Arc<AtomicBool>>,
    /// Client connections accepted so far.
    pub accepted: Arc<AtomicU64>,
}

impl OutageProxy {
    pub fn start(target: u16) -> OutageProxy {
        let p = OutageProxy {
            port: free_port(),
            target,
            conns: Arc::new(Mutex::new(Vec::new())),
            stop: Mutex::new(Arc::new(AtomicBool::new(false))),
            accepted: Arc::new(AtomicU64::new(0)),
        };
        p.bring_up();
        p
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn bring_up(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).expect("rebind proxy port");
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        *self.stop.lock().unwrap() = stop.clone();
        let (conns, target, accepted) = (self.conns.clone(), self.target, self.accepted.clone());
        std::thread::Builder::new()
            .name("outage-proxy".into())
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            accepted.fetch_add(1, Ordering::SeqCst);
                            client.set_nonblocking(false).unwrap();
                            let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                                continue;
                            };
                            let mut list = conns.lock().unwrap();
                            list.push(client.try_clone().unwrap());
                            list.push(server.try_clone().unwrap());
                            drop(list);
                            pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                            pipe(server, client);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
                // The listener is dropped here: new connections are refused.
            })
            .unwrap();
    }

    /// Closes the listener and cuts every connection.
    pub fn take_down(&self) {
        self.stop.lock().unwrap().store(true, Ordering::SeqCst);
        // Give the accept loop time to drop the listener.
        std::thread::sleep(Duration::from_millis(50));
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for OutageProxy {
    fn drop(&mut self) {
        self.take_down();
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::Builder::new()
        .name("outage-pipe".into())
        .spawn(move || {
            let mut buf = [0u8; 16384];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })
        .unwrap();
}
