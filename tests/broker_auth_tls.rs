//! Broker authentication (secrets from the environment, never printed) and TLS (a real
//! handshake against a self-signed certificate: trusted through `tls_ca_file`, a clean error
//! otherwise, never a panic).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::broker::*;
use crate::support::certs::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

fn config(url: &str, dir: &Path, nats_extra: serde_json::Value) -> serde_json::Value {
    let mut nats = json!({"url": url, "stream": "ORDERS", "consumer": "svc", "subject": "orders.>",
                          "create_consumer": true});
    for (k, v) in nats_extra.as_object().unwrap() {
        nats[k] = v.clone();
    }
    json!({"nats": nats,
           "delivery": {"fetch_expiry_ms": 200, "max_batch_wait_ms": 20},
           "sink": {"type": "file", "directory": dir.join("out")}})
}

/// Runs `svc run` with `env` until `n` files exist (Ok) or it exits (Err with its output).
fn run_until_stored(
    cfg: &Path,
    env: &[(&str, &str)],
    out: &Path,
    n: usize,
) -> Result<String, String> {
    let log = cfg.with_extension("log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_svc"));
    cmd.arg("run").arg(cfg).env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let file = std::fs::File::create(&log).unwrap();
    let mut child = cmd
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if files_below(out).len() >= n {
            let sent = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .expect("kill (Debian package procps)");
            assert!(sent.success(), "kill -TERM: {sent}");
            let status = child.wait().unwrap();
            let text = std::fs::read_to_string(&log).unwrap();
            return if status.success() {
                Ok(text)
            } else {
                Err(text)
            };
        }
        if let Some(status) = child.try_wait().unwrap() {
            let text = std::fs::read_to_string(&log).unwrap();
            return Err(format!("exit {status}: {text}"));
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!(
                "timed out: {}",
                std::fs::read_to_string(&log).unwrap()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn publish_via(url: &str, opts: nats::Options) {
    let nc = opts.connect(url).unwrap();
    let js = nats::jetstream::new(nc.clone());
    js.add_stream(nats::jetstream::StreamConfig {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .unwrap();
    for i in 0..3 {
        js.publish("orders.created", format!("{{\"n\":{i}}}"))
            .unwrap();
    }
}

#[test]
fn token_from_the_environment_and_never_printed() {
    let token = "tok-7f3a9-never-print-me";
    let server = NatsServer::start_with(&["--auth", token]);
    publish_via(&server.url(), nats::Options::with_token(token));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(
            &server.url(),
            dir.path(),
            json!({"auth": {"mode": "token", "token_env": "SVC_TEST_NATS_TOKEN"}}),
        ),
    );
    let log = run_until_stored(&cfg, &[("SVC_TEST_NATS_TOKEN", token)], &out, 3).unwrap();
    assert!(!log.contains(token));
    // Loopback is no excuse: whoever holds the port during a restart gets the token.
    let warned = format!(
        "broker: nats.auth sends the token to {} without TLS",
        server.url()
    );
    assert!(log.contains(&warned), "{log}");
    assert!(log.contains("use NKey authentication"), "{log}");

    // Wrong token: a clear failure, exit 1, and neither token in the output.
    let wrong = "wrong-token-also-secret";
    let err = run_until_stored(
        &cfg,
        &[("SVC_TEST_NATS_TOKEN", wrong)],
        &dir.path().join("none"),
        1,
    )
    .unwrap_err();
    assert!(err.starts_with("exit exit status: 1"), "{err}");
    assert!(err.contains("broker: connect"), "{err}");
    assert!(!err.contains(wrong) && !err.contains(token), "{err}");

    // Variable missing: names the variable, not a value.
    let err = run_until_stored(&cfg, &[], &dir.path().join("none"), 1).unwrap_err();
    assert!(
        err.contains("environment variable SVC_TEST_NATS_TOKEN is not set"),
        "{err}"
    );
}

#[test]
fn user_and_password_from_the_environment() {
    let server = NatsServer::start_with(&["--user", "svc", "--pass", "pw-1234-secret"]);
    publish_via(
        &server.url(),
        nats::Options::with_user_pass("svc", "pw-1234-secret"),
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(
            &server.url(),
            dir.path(),
            json!({"auth": {"mode": "user_password", "username_env": "SVC_U", "password_env": "SVC_P"}}),
        ),
    );
    let log = run_until_stored(
        &cfg,
        &[("SVC_U", "svc"), ("SVC_P", "pw-1234-secret")],
        &out,
        3,
    )
    .unwrap();
    assert!(!log.contains("pw-1234-secret"));
    assert!(
        log.contains("broker: nats.auth sends the user name and password to"),
        "{log}"
    );
    let err = run_until_stored(
        &cfg,
        &[("SVC_U", "svc"), ("SVC_P", "nope-secret")],
        &dir.path().join("x"),
        1,
    )
    .unwrap_err();
    assert!(
        err.contains("broker: connect") && !err.contains("nope-secret"),
        "{err}"
    );
}

#[test]
fn tls_broker_trusted_through_ca_file_and_a_clean_error_otherwise() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let p = |f: &str| certs.path().join(f).to_str().unwrap().to_string();
    let server = NatsServer::start_with(&[
        "--tls",
        "--tlscert",
        &p("server.pem"),
        "--tlskey",
        &p("server.key"),
    ]);
    let url = format!("tls://127.0.0.1:{}", server.port);
    publish_via(&url, nats::Options::new().add_root_certificate(p("ca.pem")));
    let dir = tempfile::tempdir().unwrap();

    // Not trusted: the handshake fails cleanly (no panic), exit 1.
    let cfg = write_config(
        dir.path(),
        "untrusted.json",
        &config(&url, dir.path(), json!({})),
    );
    let err = run_until_stored(&cfg, &[], &dir.path().join("none"), 1).unwrap_err();
    assert!(err.starts_with("exit exit status: 1"), "{err}");
    assert!(err.contains("broker: connect"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // Trusted through tls_ca_file: delivered.
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "trusted.json",
        &config(
            &url,
            dir.path(),
            json!({"tls_ca_file": p("ca.pem"), "tls_required": true}),
        ),
    );
    run_until_stored(&cfg, &[], &out, 3).unwrap();
}

/// A server process killed on drop (a failing test leaves nothing running).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `nats-server` with TLS on fixed ports; its store survives restarts.
fn start_tls_server(port: u16, monitor: u16, certs: &Path, store: &Path) -> Killed {
    let p = |f: &str| certs.join(f).to_str().unwrap().to_string();
    let child = Command::new(nats_server())
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .args(["-m", &monitor.to_string()])
        .args([
            "--tls",
            "--tlscert",
            &p("server.pem"),
            "--tlskey",
            &p("server.key"),
        ])
        .args(["-js", "-sd"])
        .arg(store)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "nats-server healthy", || {
        matches!(http_get(monitor, "/healthz"), Some((200, _)))
    });
    Killed(child)
}

/// TLS on every connection (the client's `tls_required`) does not get in the way of
/// reconnecting: after a graceful broker restart (SIGTERM, which closes TLS sessions
/// cleanly), the runner reconnects over TLS and delivers what was published meanwhile.
#[test]
fn tls_holds_across_a_graceful_broker_restart() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let store = tempfile::tempdir().unwrap();
    let (port, monitor) = (free_port(), free_port());
    let mut server = start_tls_server(port, monitor, certs.path(), store.path());
    let url = format!("tls://127.0.0.1:{port}");
    let ca = certs.path().join("ca.pem");
    let connect = || {
        nats::Options::new()
            .add_root_certificate(&ca)
            .connect(url.as_str())
            .unwrap()
    };
    publish_via(&url, nats::Options::new().add_root_certificate(&ca));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &config(&url, dir.path(), json!({"tls_ca_file": ca})),
    );
    let runner = Runner::start(&cfg, &dir.path().join("svc.log"));
    wait_until(
        Duration::from_secs(30),
        "3 files before the restart",
        || files_below(&out).len() >= 3,
    );

    let ok = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    server.0.wait().unwrap();
    server = start_tls_server(port, monitor, certs.path(), store.path());
    let js = nats::jetstream::new(connect());
    for i in 3..6 {
        js.publish("orders.created", format!("{{\"n\":{i}}}"))
            .unwrap();
    }
    wait_until(
        Duration::from_secs(60),
        "3 more files after the restart",
        || files_below(&out).len() >= 6,
    );
    let log = runner.log_text();
    assert!(log.contains("broker: reconnected"), "{log}");
    drop(server);
}

/// A network namespace of the test's own, whose `/etc/hosts` (`/etc/netns/<name>/hosts`, as
/// `ip netns exec` mounts it) makes `names` resolve to its loopback; removed on drop.
struct Namespace {
    name: String,
}

impl Namespace {
    fn new(names: &[&str]) -> Namespace {
        // The process id alone is not unique: every test of the suite shares the process.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("svc-nc-{}-{n}", std::process::id());
        let ip = |args: &[&str]| {
            let ok = Command::new("ip")
                .args(args)
                .status()
                .expect("ip (iproute2)");
            assert!(ok.success(), "ip {args:?}");
        };
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        let etc = format!("/etc/netns/{name}");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            format!("{etc}/hosts"),
            format!("127.0.0.1 localhost {}\n", names.join(" ")),
        )
        .unwrap();
        Namespace { name }
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name));
    }
}

/// The advisories' own scenario (RUSTSEC-2026-0099, name constraints with wildcard names,
/// which rustls-webpki 0.102 under the published nats crate accepted): a CA whose permitted DNS
/// subtree is `accept.broker.test` issues `*.broker.test`; the runner connecting to
/// `reject.broker.test` (loopback, in a namespace of the test's own) refuses the broker. The
/// same CA's certificate for `accept.broker.test`, by that name, is accepted.
#[test]
fn a_name_constrained_ca_cannot_vouch_for_a_name_outside_its_subtree() {
    let certs = tempfile::tempdir().unwrap();
    let sh = |args: &str| {
        let ok = Command::new("sh")
            .args(["-c", args])
            .current_dir(certs.path())
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{args}: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
    };
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
        -subj /CN=svc-name-constrained-ca -addext basicConstraints=critical,CA:TRUE \
        -addext keyUsage=critical,keyCertSign,cRLSign \
        -addext nameConstraints=critical,permitted\\;DNS:accept.broker.test",
    );
    for (name, san) in [("wild", "*.broker.test"), ("accept", "accept.broker.test")] {
        sh(&format!(
            "openssl req -newkey rsa:2048 -nodes -keyout {name}.key -out {name}.csr -subj /CN={name} \
             && printf 'subjectAltName=DNS:{san}\\n' > {name}.ext \
             && openssl x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
                -out {name}.pem -days 2 -extfile {name}.ext"
        ));
    }
    let ns = Namespace::new(&["accept.broker.test", "reject.broker.test"]);
    let p = |f: &str| certs.path().join(f).to_str().unwrap().to_string();
    let run = |cert: &str, host: &str| -> String {
        let store = tempfile::tempdir().unwrap();
        let server = ns
            .command(&nats_server())
            .args(["-a", "127.0.0.1", "-p", "4222", "-m", "8222", "-js", "-sd"])
            .arg(store.path())
            .args(["--tls", "--tlscert", &p(&format!("{cert}.pem"))])
            .args(["--tlskey", &p(&format!("{cert}.key"))])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let _server = Killed(server);
        wait_until(
            Duration::from_secs(10),
            "nats-server in the namespace",
            || {
                ns.command("curl")
                    .args(["-sf", "http://127.0.0.1:8222/healthz"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        );
        let dir = tempfile::tempdir().unwrap();
        let url = format!("tls://{host}:4222");
        let cfg = write_config(
            dir.path(),
            "c.json",
            &config(
                &url,
                dir.path(),
                json!({"tls_ca_file": p("ca.pem"), "tls_required": true}),
            ),
        );
        // No stream exists: past TLS, the runner stops at the missing stream.
        let out = ns
            .command(env!("CARGO_BIN_EXE_svc"))
            .arg("run")
            .arg(&cfg)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let refused = run("wild", "reject.broker.test");
    assert!(refused.contains("broker: connect: TLS error"), "{refused}");
    assert!(refused.contains("NameConstraintViolation"), "{refused}");
    let accepted = run("accept", "accept.broker.test");
    assert!(!accepted.contains("TLS error"), "{accepted}");
    assert!(accepted.contains("stream not found"), "{accepted}");
}

/// A CA and, signed by it, the server certificate for 127.0.0.1 and client certificates for
/// each `clients` common name; `other-ca` signs `stranger` (a client from another CA).
fn make_mtls_certs(dir: &Path, clients: &[&str]) {
    let sh = |args: &str| {
        let ok = Command::new("sh")
            .args(["-c", args])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{args}: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
    };
    make_certs(dir);
    let client = |ca: &str, cn: &str| {
        sh(&format!(
            "openssl req -newkey rsa:2048 -nodes -keyout {cn}.key -out {cn}.csr -subj /CN={cn} \
             && printf 'extendedKeyUsage=clientAuth\\n' > {cn}.ext \
             && openssl x509 -req -in {cn}.csr -CA {ca}.pem -CAkey {ca}.key -CAcreateserial \
                -out {cn}.pem -days 2 -extfile {cn}.ext && chmod 600 {cn}.key"
        ))
    };
    for cn in clients {
        client("ca", cn);
    }
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem \
        -days 2 -subj /CN=other-ca",
    );
    client("other-ca", "stranger");
}

/// Mutual TLS: a server with `verify` refuses a runner without a client certificate or with
/// one from another CA, and takes one its CA signed; a key file others can read is refused
/// before anything is sent. With `verify_and_map`, the certificate is the user: a mapped one
/// runs with its permissions, an unmapped one from the same CA is refused.
#[test]
fn mutual_tls_with_verify_and_with_verify_and_map() {
    let certs = tempfile::tempdir().unwrap();
    make_mtls_certs(certs.path(), &["svc-client", "unmapped"]);
    let p = |f: &str| certs.path().join(f).to_str().unwrap().to_string();
    let client = |cn: &str| json!({"tls_cert_file": p(&format!("{cn}.pem")), "tls_key_file": p(&format!("{cn}.key"))});
    let with = |extra: serde_json::Value| {
        let mut v = json!({"tls_ca_file": p("ca.pem")});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };

    let server = NatsServer::start_with(&[
        "--tls",
        "--tlscert",
        &p("server.pem"),
        "--tlskey",
        &p("server.key"),
        "--tlsverify",
        "--tlscacert",
        &p("ca.pem"),
    ]);
    let url = format!("tls://127.0.0.1:{}", server.port);
    publish_via(
        &url,
        nats::Options::new()
            .add_root_certificate(p("ca.pem"))
            .client_cert(p("svc-client.pem"), p("svc-client.key")),
    );
    let dir = tempfile::tempdir().unwrap();
    let refused = |name: &str, extra: serde_json::Value| {
        let cfg = write_config(dir.path(), name, &config(&url, dir.path(), with(extra)));
        let err = run_until_stored(&cfg, &[], &dir.path().join("none"), 1).unwrap_err();
        assert!(err.starts_with("exit exit status: 1"), "{name}: {err}");
        assert!(err.contains("broker: connect"), "{name}: {err}");
        assert!(!err.contains("BEGIN"), "{name}: key material in {err}");
        err
    };
    refused("none.json", json!({}));
    refused("stranger.json", client("stranger"));
    std::fs::set_permissions(
        p("unmapped.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let e = refused("readable.json", client("unmapped"));
    assert!(
        e.contains("nats.tls_key_file") && e.contains("chmod 600"),
        "{e}"
    );
    std::fs::set_permissions(
        p("unmapped.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "mtls.json",
        &config(&url, dir.path(), with(client("svc-client"))),
    );
    run_until_stored(&cfg, &[], &out, 3).unwrap();
    drop(server);

    // verify_and_map: the certificate's subject is the user name.
    let conf = certs.path().join("map.conf");
    std::fs::write(
        &conf,
        format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify_and_map: true }}\n\
             authorization {{ users = [ {{ user: \"CN=svc-client\", permissions: {{ publish: \">\", subscribe: \">\" }} }} ] }}\n",
            p("server.pem"), p("server.key"), p("ca.pem")
        ),
    )
    .unwrap();
    let server = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    let url = format!("tls://127.0.0.1:{}", server.port);
    publish_via(
        &url,
        nats::Options::new()
            .add_root_certificate(p("ca.pem"))
            .client_cert(p("svc-client.pem"), p("svc-client.key")),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "unmapped.json",
        &config(&url, dir.path(), with(client("unmapped"))),
    );
    let err = run_until_stored(&cfg, &[], &dir.path().join("none"), 1).unwrap_err();
    assert!(err.contains("broker: connect"), "{err}");
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "mapped.json",
        &config(&url, dir.path(), with(client("svc-client"))),
    );
    run_until_stored(&cfg, &[], &out, 3).unwrap();
}

/// NKey authentication without a JWT: a server with an `nkey` user takes the runner signing
/// with that user's seed, refuses another seed; the seed is never printed, and a seed file
/// others can read is refused.
#[test]
fn nkey_user_authenticates_with_its_seed_file() {
    let user = nkeys::KeyPair::new_user();
    let other = nkeys::KeyPair::new_user();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nkey.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let server = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    let url = server.url();
    let seed = user.seed().unwrap();
    let sign_with = user.seed().unwrap();
    publish_via(
        &url,
        nats::Options::with_nkey(&user.public_key(), move |nonce| {
            nkeys::KeyPair::from_seed(&sign_with)
                .unwrap()
                .sign(nonce)
                .unwrap()
        }),
    );
    let write_seed = |name: &str, seed: &str, mode: u32| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{seed}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .unwrap();
        path
    };
    let cfg_for = |name: &str, seed_file: &Path| {
        write_config(
            dir.path(),
            name,
            &config(
                &url,
                dir.path(),
                json!({"auth": {"mode": "nkey", "nkey_seed_file": seed_file}}),
            ),
        )
    };
    let other_seed = other.seed().unwrap();
    let wrong = cfg_for("wrong.json", &write_seed("other.nk", &other_seed, 0o600));
    let err = run_until_stored(&wrong, &[], &dir.path().join("none"), 1).unwrap_err();
    assert!(err.contains("broker: connect"), "{err}");
    assert!(!err.contains(&other_seed), "the seed was printed: {err}");
    let readable = cfg_for("readable.json", &write_seed("readable.nk", &seed, 0o640));
    let err = run_until_stored(&readable, &[], &dir.path().join("none"), 1).unwrap_err();
    assert!(
        err.contains("nats.auth.nkey_seed_file") && err.contains("chmod 600"),
        "{err}"
    );
    assert!(!err.contains(&seed), "the seed was printed: {err}");
    let good = cfg_for("good.json", &write_seed("user.nk", &seed, 0o600));
    let log = run_until_stored(&good, &[], &dir.path().join("out"), 3).unwrap();
    assert!(!log.contains(&seed), "the seed was printed: {log}");
    // An NKey sends a signature of the server's nonce, never a secret: no warning.
    assert!(!log.contains("without TLS"), "{log}");
}

/// `credentials_file` (the runner's) and `SVC_ADMIN_NATS_CREDS` (`stream-plan --apply`'s) get
/// the NKey seed file's rule: a FIFO, a link, a file others may read and a file that is no
/// credentials file are refused at once, naming the field or variable and never quoting the
/// file. (The client opened the path itself at every connect: a FIFO hung `svc inspect`.)
#[test]
fn credentials_files_get_the_private_file_checks() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("creds.fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let open = dir.path().join("open.creds");
    std::fs::write(&open, "x").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let garbage = dir.path().join("garbage.creds");
    std::fs::write(&garbage, "SECRET-GARBAGE-NOT-A-JWT").unwrap();
    std::fs::set_permissions(&garbage, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.path().join("link.creds");
    std::os::unix::fs::symlink(&garbage, &link).unwrap();
    // Nothing listens here: every refusal comes before a connection is tried.
    let url = format!("nats://127.0.0.1:{}", free_port());
    let bounded = |args: &[&str], env: &[(&str, &std::path::Path)], log: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_svc"));
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = Runner::spawn(&mut cmd, &dir.path().join(log));
        let status = child.wait_timeout(Duration::from_secs(10));
        let text = child.log_text();
        let status = status.unwrap_or_else(|| panic!("{args:?} still running\n{text}"));
        assert_ne!(status.code(), Some(0), "{text}");
        assert!(!text.contains("SECRET-GARBAGE"), "{text}");
        text
    };
    for (name, path, why) in [
        ("fifo", &fifo, "not a regular file"),
        ("link", &link, "link"),
        ("open", &open, "readable or writable by group or others"),
        ("garbage", &garbage, "is not a NATS credentials file"),
    ] {
        let auth = json!({"mode": "credentials_file", "credentials_file": path});
        let cfg = write_config(
            dir.path(),
            &format!("{name}.json"),
            &config(&url, dir.path(), json!({"auth": auth})),
        );
        let text = bounded(
            &["inspect", cfg.to_str().unwrap(), "--timeout", "2"],
            &[],
            &format!("{name}.log"),
        );
        let field = format!("nats.auth.credentials_file {}: ", path.display());
        assert!(
            text.contains(&field) && text.contains(why),
            "{name}: {text}"
        );
    }
    let cfg = write_config(
        dir.path(),
        "plan.json",
        &config(&url, dir.path(), json!({})),
    );
    for (name, path, why) in [
        ("admin-fifo", &fifo, "not a regular file"),
        (
            "admin-open",
            &open,
            "readable or writable by group or others",
        ),
    ] {
        let text = bounded(
            &["stream-plan", cfg.to_str().unwrap(), "--apply"],
            &[("SVC_ADMIN_NATS_CREDS", path.as_path())],
            &format!("{name}.log"),
        );
        let var = format!("SVC_ADMIN_NATS_CREDS {}: ", path.display());
        assert!(text.contains(&var) && text.contains(why), "{name}: {text}");
    }
}
