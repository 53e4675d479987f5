//! Password authentication and verified TLS against a private PostgreSQL cluster.
//!
//! The shared server on 5432 trusts every loopback connection, so it cannot prove that SCRAM,
//! MD5 or cleartext authentication work. This test runs `initdb` and `postgres` of the installed
//! PostgreSQL (as the `postgres` OS user when the tests run as root, since the server refuses
//! root), with its own `pg_hba.conf` and a certificate issued by a throw-away CA made with the
//! `openssl` command.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use svc::db::postgres::{
    tls_client_config, AuthPolicy, ChannelBindingMode, ConnectParams, Connection, TlsMode,
};
use svc::metrics::Metrics;
use svc::sink::relational::RelationalSink;
use svc::sink::{Sink, WriteOutcome};

use crate::support::certs::make_certs;
use crate::support::free_port;
use crate::support::postgres::{envelope, parse_cfg};

fn pg_bindir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().expect("id -u");
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// Runs a server-side command, as `postgres` when we are root.
fn server_cmd(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Cluster {
    dir: PathBuf,
    port: u16,
    server: Child,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Fast shutdown of our own server: `runuser` does not forward signals, so signal the
        // postmaster by the PID it wrote (first line of postmaster.pid), then remove its files.
        let pid_file = self.dir.join("data").join("postmaster.pid");
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.lines().next().map(str::to_string))
            .filter(|p| p.parse::<u32>().is_ok())
        {
            let _ = Command::new("kill").args(["-INT", &pid]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.server.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_cluster() -> Cluster {
    let bin = pg_bindir();
    let dir = std::env::temp_dir().join(format!(
        "svc-pgauth-{}-{}",
        std::process::id(),
        svc::message::envelope::now_unix_nanos() % 1_000_000_000
    ));
    std::fs::create_dir_all(&dir).unwrap();
    make_certs(&dir);
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    make_certs(&other);
    if is_root() {
        run(
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir),
            "chown",
        );
    }
    run(
        Command::new("chmod")
            .arg("0600")
            .arg(dir.join("server.key")),
        "chmod",
    );
    let data = dir.join("data");
    run(
        server_cmd(&bin.join("initdb")).arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]),
        "initdb",
    );
    std::fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\n\
         host all postgres 127.0.0.1/32 trust\n\
         host all scram_user 127.0.0.1/32 scram-sha-256\n\
         host all md5_user 127.0.0.1/32 md5\n\
         host all plain_user 127.0.0.1/32 password\n\
         host all prep_user 127.0.0.1/32 scram-sha-256\n\
         hostssl all tls_user 127.0.0.1/32 scram-sha-256\n\
         hostnossl all tls_user 127.0.0.1/32 reject\n",
    )
    .unwrap();
    let port = free_port();
    let server = server_cmd(&bin.join("postgres"))
        .arg("-D")
        .arg(&data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(&dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1,127.0.0.2",
            "-c",
            "ssl=on",
            "-c",
            "fsync=off",
        ])
        .arg("-c")
        .arg(format!(
            "ssl_cert_file={}",
            dir.join("server.pem").display()
        ))
        .arg("-c")
        .arg(format!("ssl_key_file={}", dir.join("server.key").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start postgres");
    let cluster = Cluster { dir, port, server };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Connection::connect(
            &params(port, "postgres", "127.0.0.1", TlsMode::Disable, None),
            None,
        ) {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "private cluster never ready: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    cluster
}

fn params(port: u16, user: &str, host: &str, tls: TlsMode, ca: Option<&Path>) -> ConnectParams {
    ConnectParams {
        host: host.into(),
        port,
        user: user.into(),
        database: "postgres".into(),
        application_name: "svc-test".into(),
        tls,
        tls_config: (tls == TlsMode::VerifyFull).then(|| tls_client_config(ca).unwrap()),
        // The cluster trusts the postgres role on loopback; the others use passwords.
        require_auth: if user == "postgres" {
            AuthPolicy::parse("none").unwrap()
        } else {
            AuthPolicy::default()
        },
        channel_binding: ChannelBindingMode::Prefer,
        scram_min_iterations: 4096,
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(10),
    }
}

fn sink_for(c: &Cluster, user: &str, host: &str, extra: serde_json::Value) -> RelationalSink {
    let mut v = json!({
        "type": "relational_db",
        "dsn": format!("postgresql://{user}@{host}:{}/postgres", c.port),
        "tls_mode": "disable",
        "table": "events",
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    RelationalSink::new(parse_cfg(&v), Arc::new(Metrics::default())).unwrap()
}

/// The passwords the sink reads from its `password_env` variables. The sink reads them in this
/// process, and a test binary's environment is shared by every test thread (setting a variable
/// while another thread reads one is a data race in libc), so the test runs in a child process
/// of this same binary that gets them at its start.
const PASSWORDS: [(&str, &str); 7] = [
    ("SVC_TEST_SCRAM_PW", "scr4m pässword"),
    ("SVC_TEST_MD5_PW", "md5-pw"),
    ("SVC_TEST_PLAIN_PW", "plain-pw"),
    ("SVC_TEST_TLS_PW", "tls-pw"),
    ("SVC_TEST_WRONG_PW", "not-the-password"),
    // SASLprep: U+2168 (ROMAN NUMERAL NINE) and "IX" are the same password after it; U+00AD
    // (soft hyphen) is mapped to nothing.
    ("SVC_TEST_PREP_PW", "\u{2168}"),
    ("SVC_TEST_PREP_PW2", "I\u{00ad}X"),
];

/// The sink reads its passwords from the environment, which a test must not change in this
/// process (see `PASSWORDS`): started without them, the test runs itself again in a child of
/// this binary that has them, and passes when that run passed.
#[test]
fn password_authentication_and_verified_tls_against_a_private_cluster() {
    if std::env::var_os(PASSWORDS[0].0).is_none() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "relational_cluster::password_authentication_and_verified_tls_against_a_private_cluster",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .envs(PASSWORDS)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    for (name, value) in PASSWORDS {
        assert_eq!(
            std::env::var(name).as_deref(),
            Ok(value),
            "started without {name}"
        );
    }
    let c = start_cluster();
    let mut admin = Connection::connect(
        &params(c.port, "postgres", "127.0.0.1", TlsMode::Disable, None),
        None,
    )
    .unwrap();
    admin
        .simple(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE scram_user LOGIN PASSWORD 'scr4m pässword';
             CREATE ROLE plain_user LOGIN PASSWORD 'plain-pw';
             CREATE ROLE tls_user LOGIN PASSWORD 'tls-pw';
             CREATE ROLE prep_user LOGIN PASSWORD 'IX';
             SET password_encryption = 'md5';
             CREATE ROLE md5_user LOGIN PASSWORD 'md5-pw';
             GRANT ALL ON SCHEMA public TO PUBLIC;",
        )
        .unwrap();
    let ca = c.dir.join("ca.pem");
    let other_ca = c.dir.join("other").join("ca.pem");

    // The default require_auth (scram-sha-256) refuses the md5 and cleartext servers before
    // sending anything; the SCRAM one works.
    for (user, var, method) in [
        ("md5_user", "SVC_TEST_MD5_PW", "md5"),
        ("plain_user", "SVC_TEST_PLAIN_PW", "password"),
    ] {
        let sink = sink_for(&c, user, "127.0.0.1", json!({"password_env": var}));
        let err = sink.check().unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "the server asked for {method} authentication, which sink.require_auth \
                 (scram-sha-256) does not allow; nothing was sent"
            )),
            "{user}: {err}"
        );
    }

    // Each method with the right password, when allowed: a batch is committed.
    for (i, (user, var, method)) in [
        ("scram_user", "SVC_TEST_SCRAM_PW", "scram-sha-256"),
        ("md5_user", "SVC_TEST_MD5_PW", "md5"),
        ("plain_user", "SVC_TEST_PLAIN_PW", "password"),
    ]
    .iter()
    .enumerate()
    {
        let sink = sink_for(
            &c,
            user,
            "127.0.0.1",
            json!({"password_env": var, "table": format!("events_{i}"), "auto_create_tables": true,
                   "require_auth": method}),
        );
        let out = sink.write_batch(&[envelope("a.b", 1, b"{}")]);
        assert_eq!(out, vec![WriteOutcome::Durable], "{user}");
        assert!(sink.check().is_ok(), "{user}");

        // A wrong password: the server's verdict, with no password in the message.
        let wrong = sink_for(
            &c,
            user,
            "127.0.0.1",
            json!({"password_env": "SVC_TEST_WRONG_PW", "table": format!("events_{i}"),
                   "require_auth": method}),
        );
        let err = wrong.check().unwrap_err().to_string();
        assert!(err.contains("28P01"), "{user}: {err}");
        assert!(
            !err.contains("not-the-password") && !err.contains("pw"),
            "{err}"
        );

        // No password configured at all (config validation refuses md5/password without
        // password_env, so only SCRAM reaches the server without one).
        if *method != "scram-sha-256" {
            continue;
        }
        let none = sink_for(
            &c,
            user,
            "127.0.0.1",
            json!({"table": format!("events_{i}"), "require_auth": "scram-sha-256"}),
        );
        let err = none.check().unwrap_err().to_string();
        assert!(
            err.contains("the server requires a password but sink.password_env is not set"),
            "{user}: {err}"
        );
    }

    // TLS with the test CA, by IP and by DNS name: verified, and the session is encrypted.
    for (seq, host) in [(7, "127.0.0.1"), (8, "localhost")] {
        let sink = sink_for(
            &c,
            "tls_user",
            host,
            json!({"password_env": "SVC_TEST_TLS_PW", "tls_mode": "verify_full",
                   "tls_ca_file": ca.to_str().unwrap(), "auto_create_tables": true,
                   "table": "tls_events"}),
        );
        assert_eq!(
            sink.write_batch(&[envelope("a.b", seq, b"{}")]),
            vec![WriteOutcome::Durable],
            "{host}"
        );
        let verdict = sink.check().unwrap();
        assert!(verdict.contains("(tls verified)"), "{verdict}");
    }
    // SCRAM-SHA-256-PLUS: the server offers it over TLS and the client binds the session to
    // the server's certificate (tls-server-end-point); `require` refuses anything else.
    let bound = sink_for(
        &c,
        "tls_user",
        "localhost",
        json!({"password_env": "SVC_TEST_TLS_PW", "tls_mode": "verify_full",
               "tls_ca_file": ca.to_str().unwrap(), "channel_binding": "require",
               "table": "tls_events"}),
    );
    assert!(bound.check().unwrap().contains("(tls verified)"));
    // The same with a wrong password: the server's verdict, not a binding error.
    let wrong_bound = sink_for(
        &c,
        "tls_user",
        "localhost",
        json!({"password_env": "SVC_TEST_WRONG_PW", "tls_mode": "verify_full",
               "tls_ca_file": ca.to_str().unwrap(), "channel_binding": "require",
               "table": "tls_events"}),
    );
    let err = wrong_bound.check().unwrap_err().to_string();
    assert!(err.contains("28P01"), "{err}");
    // SASLprep: a password stored as the NFKC form of what the client holds (see PASSWORDS).
    for var in ["SVC_TEST_PREP_PW", "SVC_TEST_PREP_PW2"] {
        let sink = sink_for(
            &c,
            "prep_user",
            "127.0.0.1",
            json!({"password_env": var, "table": "prep_events", "auto_create_tables": true}),
        );
        if let Err(e) = sink.check() {
            panic!("{var}: {e}");
        }
    }

    let mut tls_conn = Connection::connect(
        &params(
            c.port,
            "tls_user",
            "127.0.0.1",
            TlsMode::VerifyFull,
            Some(&ca),
        ),
        Some(b"tls-pw"),
    )
    .unwrap();
    let ssl = tls_conn
        .query(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .unwrap();
    assert_eq!(ssl.rows[0][0].as_deref(), Some("t"));

    // The same role over plaintext is refused by the server (hostnossl reject).
    let plain = sink_for(
        &c,
        "tls_user",
        "127.0.0.1",
        json!({"password_env": "SVC_TEST_TLS_PW"}),
    );
    let err = plain.check().unwrap_err().to_string();
    assert!(err.contains("28000"), "{err}");

    // A certificate from another CA is refused by the client.
    let wrong_ca = sink_for(
        &c,
        "tls_user",
        "127.0.0.1",
        json!({"password_env": "SVC_TEST_TLS_PW", "tls_mode": "verify_full",
               "tls_ca_file": other_ca.to_str().unwrap()}),
    );
    let err = wrong_ca.check().unwrap_err().to_string();
    assert!(
        err.contains("tls handshake") && err.contains("certificate"),
        "{err}"
    );

    // The server's certificate names localhost and 127.0.0.1 only: another name fails.
    let err = Connection::connect(
        &params(
            c.port,
            "tls_user",
            "127.0.0.2",
            TlsMode::VerifyFull,
            Some(&ca),
        ),
        Some(b"tls-pw"),
    );
    match err {
        Err(e) => assert!(e.to_string().contains("certificate"), "{e}"),
        Ok(_) => panic!("a certificate for another name was accepted"),
    }
}
