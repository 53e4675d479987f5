//! A private MariaDB server of a test's own, as `relational_cluster` has a private PostgreSQL:
//! `mariadb-install-db` into a temporary directory, then `mariadbd` on its own port and unix
//! socket, with (or without) TLS from the throw-away CA of `support::certs::make_certs`.
//!
//! The shared server on 3306 has neither TLS nor accounts a test may reconfigure at will; this
//! one has both. Skipped (with a message saying why) only when the MariaDB server binaries are
//! not installed; scripts/deps.sh installs them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::certs::{make_certs, Certs};
use super::mysql::my_params;
use super::net::free_port;
use super::TempDir;
use svc::db::mysql::{AuthPolicy, Connection};
use svc::db::postgres::ConnectParams;

/// One private server; stopped (and its files removed) when dropped.
pub struct PrivateMariaDb {
    pub dir: TempDir,
    pub port: u16,
    /// The CA that signed the server's certificate (names `localhost` and 127.0.0.1).
    pub certs: Certs,
    server: Child,
}

/// `name` in the usual places (Debian: /usr/sbin/mariadbd, /usr/bin/mariadb-install-db).
fn binary(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PrivateMariaDb {
    /// Starts a server listening on 127.0.0.1 and 127.0.0.2 (one port), with TLS when `tls`
    /// (`--ssl-ca/--ssl-cert/--ssl-key`) and with `--skip-ssl` otherwise. `None`, after
    /// printing why, when the MariaDB server binaries are not installed.
    pub fn start(tls: bool) -> Option<PrivateMariaDb> {
        let (Some(mariadbd), Some(install)) = (binary("mariadbd"), binary("mariadb-install-db"))
        else {
            eprintln!(
                "SKIPPED: mariadbd or mariadb-install-db is not installed (scripts/deps.sh \
                 installs mariadb-server); the private MariaDB tests did not run"
            );
            return None;
        };
        let dir = TempDir::new("mariadb");
        let certs = make_certs(dir.path());
        let data = dir.join("data");
        // Its own temporary directory: two servers bootstrapping at once in one /tmp collide
        // on their temporary tables' names.
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        run(
            Command::new(install)
                .env("TMPDIR", &tmp)
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .args([
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--user=root",
                ]),
            "mariadb-install-db",
        );
        let port = free_port();
        let mut cmd = Command::new(mariadbd);
        cmd.arg("--no-defaults")
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg(format!("--socket={}", dir.join("s.sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--log-error={}", dir.join("error.log").display()))
            .args([
                "--bind-address=127.0.0.1,127.0.0.2",
                "--user=root",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=16M",
                "--innodb-flush-log-at-trx-commit=2",
                "--plugin-load-add=auth_ed25519",
            ]);
        if tls {
            cmd.arg(format!("--ssl-ca={}", certs.ca.display()))
                .arg(format!("--ssl-cert={}", certs.cert.display()))
                .arg(format!("--ssl-key={}", certs.key.display()));
        } else {
            cmd.arg("--skip-ssl");
        }
        let server = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mariadbd");
        let db = PrivateMariaDb {
            dir,
            port,
            certs,
            server,
        };
        db.wait_ready();
        Some(db)
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match Connection::connect(&self.params("root"), &AuthPolicy::default(), None) {
                Ok(_) => return,
                Err(e) => {
                    let log =
                        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
                    assert!(
                        Instant::now() < deadline,
                        "private mariadbd never ready: {e}\n{log}"
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Plain-TCP parameters for `user` on 127.0.0.1 (database `mysql`).
    pub fn params(&self, user: &str) -> ConnectParams {
        let mut p = my_params("mysql", user);
        p.port = self.port;
        p.connect_timeout = Duration::from_secs(5);
        p.io_timeout = Duration::from_secs(30);
        p
    }

    /// A root session (root@127.0.0.1 without a password, as mariadb-install-db makes it).
    pub fn root(&self) -> Connection {
        Connection::connect(&self.params("root"), &AuthPolicy::default(), None).unwrap()
    }

    /// Runs statements as root; panics with the server's error.
    pub fn admin(&self, statements: &[&str]) {
        let mut c = self.root();
        for s in statements {
            c.query(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }

    pub fn ca(&self) -> &Path {
        &self.certs.ca
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        // SIGTERM is mariadbd's clean shutdown; the child is ours (spawned above).
        let _ = Command::new("kill")
            .args(["-TERM", &self.server.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.server.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}
