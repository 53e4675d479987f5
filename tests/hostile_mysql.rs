//! The relational sink's MySQL client against hostile servers (issue 49): a fake server
//! (tests/support/mysql_fake.rs) that switches authentication to a cleartext or a disallowed
//! plugin, asks for full caching_sha2_password authentication over plain TCP, requests a
//! LOCAL INFILE, streams rows forever, announces huge packets, drips its handshake, and sends
//! malformed packets. Each is refused with a clear error, and no secret reaches the fake.

use std::time::{Duration, Instant};

use crate::support::mysql::my_params;
use crate::support::mysql_fake::{auth_switch, err, handshake, ok, packet, Fake, NONCE};
use svc::db::mysql::auth::{scramble_caching_sha2, scramble_native};
use svc::db::mysql::conn::MAX_ROWS_PER_STATEMENT;
use svc::db::mysql::{AuthPolicy, Connection};
use svc::db::postgres::DbError;

const PASSWORD: &str = "Hostile-My-s3cret-4c1";

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn connect(fake: &Fake, policy: &str, timeout: Duration) -> Result<Connection, DbError> {
    let mut p = my_params("db", "app");
    p.port = fake.port;
    p.connect_timeout = timeout;
    p.io_timeout = timeout;
    Connection::connect(
        &p,
        &AuthPolicy::parse(policy).unwrap(),
        Some(PASSWORD.as_bytes()),
    )
}

fn assert_clean(e: &DbError) -> String {
    let shown = e.to_string();
    assert!(!shown.contains(PASSWORD), "{shown}");
    assert!(!shown.chars().any(char::is_control), "{shown:?}");
    assert!(shown.len() < 600, "{shown}");
    shown
}

#[test]
fn switch_to_cleartext_is_refused_before_the_password_leaves() {
    for plugin in [
        "mysql_clear_password",
        "dialog",
        "sha256_password",
        "client_ed25519",
    ] {
        let fake = Fake::start(move |peer| {
            peer.send(0, &handshake("mysql_native_password"));
            peer.read();
            peer.send(2, &auth_switch(plugin));
        });
        let e = connect(
            &fake,
            "caching_sha2_password,mysql_native_password",
            Duration::from_secs(5),
        )
        .unwrap_err();
        let shown = assert_clean(&e);
        assert!(
            shown.contains(plugin) && shown.contains("nothing was sent"),
            "{shown}"
        );
        let seen = fake.finish();
        assert!(
            !contains(&seen, PASSWORD.as_bytes()),
            "{plugin}: the password left"
        );
        // Only the handshake response went out: nothing answered the switch.
        assert!(
            !contains(&seen, &[0, 0, 3]),
            "{plugin}: an answer to the switch was sent"
        );
    }
}

#[test]
fn downgrade_to_native_when_only_sha2_is_allowed_is_refused() {
    let fake = Fake::start(|peer| {
        // The server's default is already native: the client answers with caching_sha2.
        peer.send(0, &handshake("mysql_native_password"));
        let response = peer.read().unwrap();
        assert!(
            contains(&response, b"caching_sha2_password"),
            "client offered its own plugin"
        );
        peer.send(2, &auth_switch("mysql_native_password"));
    });
    let e = connect(&fake, "caching_sha2_password", Duration::from_secs(5)).unwrap_err();
    assert!(assert_clean(&e).contains("does not allow"));
    let seen = fake.finish();
    assert!(!contains(
        &seen,
        &scramble_native(PASSWORD.as_bytes(), NONCE)
    ));
    assert!(!contains(&seen, PASSWORD.as_bytes()));
}

#[test]
fn full_sha2_authentication_over_plain_tcp_is_refused() {
    let fake = Fake::start(|peer| {
        peer.send(0, &handshake("caching_sha2_password"));
        let response = peer.read().unwrap();
        assert!(contains(
            &response,
            &scramble_caching_sha2(PASSWORD.as_bytes(), NONCE)
        ));
        peer.send(2, &[0x01, 0x04]); // perform full authentication
    });
    let e = connect(&fake, "caching_sha2_password", Duration::from_secs(5)).unwrap_err();
    assert!(assert_clean(&e).contains("needs tls"));
    assert!(!contains(&fake.finish(), PASSWORD.as_bytes()));
}

#[test]
fn local_infile_request_is_refused_and_the_connection_closed() {
    let fake = Fake::start(|peer| {
        peer.accept();
        peer.read().expect("query");
        peer.send(1, b"\xfb/etc/passwd");
    });
    let mut c = connect(&fake, "mysql_native_password", Duration::from_secs(5)).unwrap();
    let e = c.query("SELECT 1").unwrap_err();
    assert!(assert_clean(&e).contains("local file"));
    assert!(c.is_broken());
    drop(c);
    let seen = fake.finish();
    assert!(!contains(&seen, b"root:"), "a local file was sent");
}

#[test]
fn endless_rows_are_cut_at_the_bound() {
    let fake = Fake::start(|peer| {
        peer.accept();
        peer.read().expect("query");
        let mut out = packet(1, &[1]);
        out.extend(packet(
            2,
            b"\x03def\x00\x00\x00\x01v\x00\x0c\x21\x00\x00\x00\x00\x00\xfd\x00\x00\x00\x00\x00",
        ));
        out.extend(packet(3, &[0xFE, 0, 0, 2, 0]));
        peer.raw(&out);
        let mut seq = 4u8;
        let mut chunk = Vec::new();
        for _ in 0..(MAX_ROWS_PER_STATEMENT + 10) {
            chunk.extend(packet(seq, b"\x011"));
            seq = seq.wrapping_add(1);
            if chunk.len() > 60_000 {
                if !peer.raw(&chunk) {
                    return;
                }
                chunk.clear();
            }
        }
        peer.raw(&chunk);
    });
    let mut c = connect(&fake, "mysql_native_password", Duration::from_secs(30)).unwrap();
    let e = c.query("SELECT v FROM t").unwrap_err();
    assert!(assert_clean(&e).contains("more than"), "{e}");
    assert!(c.is_broken());
    drop(c);
    fake.finish();
}

#[test]
fn huge_packet_lengths_are_refused_without_waiting() {
    let fake = Fake::start(|peer| {
        peer.accept();
        peer.read().expect("query");
        // Fragments of 16 MiB - 1 forever: refused at the 16 MiB logical packet bound.
        let mut out = vec![0xFF, 0xFF, 0xFF, 1];
        out.extend(vec![b'x'; 0xFF_FFFF]);
        out.extend([0xFF, 0xFF, 0xFF, 2]);
        peer.raw(&out);
    });
    let mut c = connect(&fake, "mysql_native_password", Duration::from_secs(30)).unwrap();
    let e = c.query("SELECT 1").unwrap_err();
    assert!(assert_clean(&e).contains("larger than"), "{e}");
    assert!(c.is_broken());
    drop(c);
    fake.finish();
}

#[test]
fn dripped_handshake_hits_the_connect_deadline() {
    let fake = Fake::start(|peer| {
        let hello = packet(0, &handshake("mysql_native_password"));
        peer.drip(&hello, Duration::from_millis(100));
    });
    let start = Instant::now();
    let e = connect(&fake, "mysql_native_password", Duration::from_secs(1)).unwrap_err();
    assert!(assert_clean(&e).contains("timed out"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    fake.finish();
}

#[test]
fn malformed_packets_are_refused_clearly() {
    let mut v9 = handshake("mysql_native_password");
    v9[0] = 9;
    let truncated = handshake("mysql_native_password")[..30].to_vec();
    let mut short_nonce = handshake("mysql_native_password");
    short_nonce.truncate(60);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("protocol version 9", packet(0, &v9)),
        ("truncated handshake", packet(0, &truncated)),
        (
            "wrong sequence",
            packet(3, &handshake("mysql_native_password")),
        ),
        (
            "error instead of handshake",
            packet(0, &err(1040, "08004", "Too many\nconnections")),
        ),
        ("garbage", b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()),
    ];
    for (what, bytes) in cases {
        let fake = Fake::start(move |peer| {
            peer.raw(&bytes);
        });
        let e = connect(&fake, "mysql_native_password", Duration::from_secs(5)).unwrap_err();
        let shown = assert_clean(&e);
        assert!(
            shown.contains("malformed")
                || shown.contains("protocol version")
                || shown.contains("out of order")
                || shown.contains("08004")
                || shown.contains("closed"),
            "{what}: {shown}"
        );
        fake.finish();
    }
    // A malformed row after a good header.
    let fake = Fake::start(|peer| {
        peer.accept();
        peer.read().expect("query");
        let mut out = packet(1, &[1]);
        out.extend(packet(2, b"\x03def"));
        out.extend(packet(3, &[0xFE, 0, 0, 2, 0]));
        out.extend(packet(4, b"\x09ab"));
        peer.raw(&out);
    });
    let mut c = connect(&fake, "mysql_native_password", Duration::from_secs(5)).unwrap();
    let e = c.query("SELECT 1").unwrap_err();
    assert!(assert_clean(&e).contains("malformed row"), "{e}");
    assert!(c.is_broken());
    drop(c);
    fake.finish();
    let _ = ok();
}

fn tls_params(port: u16, host: &str, ca: &std::path::Path) -> svc::db::postgres::ConnectParams {
    let mut p = my_params("db", "app");
    p.host = host.into();
    p.port = port;
    p.tls = svc::db::postgres::TlsMode::VerifyFull;
    p.tls_config = Some(svc::db::postgres::tls_client_config(Some(ca)).unwrap());
    p.connect_timeout = Duration::from_secs(10);
    p
}

#[test]
fn tls_verify_full_sends_full_sha2_authentication_only_to_the_right_server() {
    let dir = tempfile::tempdir().unwrap();
    let certs = crate::support::certs::make_certs(dir.path());
    // The right name: the session is TLS, and full authentication sends the password inside it.
    let fake = Fake::start_tls("127.0.0.1", dir.path(), |peer| {
        let response = peer.read().unwrap();
        assert!(contains(
            &response,
            &scramble_caching_sha2(PASSWORD.as_bytes(), NONCE)
        ));
        peer.send(3, &[0x01, 0x04]);
        let clear = peer.read().unwrap();
        assert_eq!(
            clear,
            [PASSWORD.as_bytes(), b"\0"].concat(),
            "password over tls"
        );
        peer.send(5, &ok());
        peer.read().expect("SET NAMES");
        peer.send(1, &ok());
    });
    let policy = AuthPolicy::parse("caching_sha2_password").unwrap();
    let c = Connection::connect(
        &tls_params(fake.port, "127.0.0.1", &certs.ca),
        &policy,
        Some(PASSWORD.as_bytes()),
    )
    .unwrap();
    drop(c);
    let seen = fake.finish();
    // What crossed the socket in clear: only the SSLRequest (the rest is TLS records).
    assert!(!contains(&seen[..36], PASSWORD.as_bytes()));

    // A wrong name: the certificate names 127.0.0.1 and localhost, not 127.0.0.2.
    let fake = Fake::start_tls("127.0.0.2", dir.path(), |peer| {
        peer.read();
    });
    let e = Connection::connect(
        &tls_params(fake.port, "127.0.0.2", &certs.ca),
        &policy,
        Some(PASSWORD.as_bytes()),
    )
    .unwrap_err();
    let shown = assert_clean(&e);
    assert!(shown.contains("tls handshake"), "{shown}");
    fake.finish();

    // A server that does not offer TLS is refused before anything is sent.
    let fake = Fake::start(|peer| {
        let mut h = handshake("caching_sha2_password");
        // Clear CLIENT_SSL (0x800) in the lower capability bytes.
        let caps_at = 1 + h.iter().position(|&b| b == 0).unwrap() + 4 + 8 + 1;
        h[caps_at + 1] &= !0x08;
        peer.send(0, &h);
    });
    let e = Connection::connect(
        &tls_params(fake.port, "127.0.0.1", &certs.ca),
        &policy,
        Some(PASSWORD.as_bytes()),
    )
    .unwrap_err();
    assert!(assert_clean(&e).contains("does not accept tls"), "{e}");
    assert!(
        fake.finish().is_empty(),
        "nothing sent to a server without tls"
    );
}

/// An RSA key pair made by `openssl` in `dir` (`key.pem`, `pub.pem`) of `bits` bits.
fn rsa_key(dir: &std::path::Path, bits: u32) -> Vec<u8> {
    crate::support::certs::openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            &format!("rsa_keygen_bits:{bits}"),
            "-out",
            "key.pem",
        ],
    );
    crate::support::certs::openssl(
        dir,
        &["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"],
    );
    std::fs::read(dir.join("pub.pem")).unwrap()
}

fn rsa_policy() -> AuthPolicy {
    AuthPolicy {
        rsa_key_exchange: true,
        ..AuthPolicy::parse("caching_sha2_password").unwrap()
    }
}

fn connect_with(fake: &Fake, policy: &AuthPolicy) -> Result<Connection, DbError> {
    let mut p = my_params("db", "app");
    p.port = fake.port;
    Connection::connect(&p, policy, Some(PASSWORD.as_bytes()))
}

/// With `allow_rsa_key_exchange`, full authentication over plain TCP asks for the server's
/// key and sends the password sealed to it: `openssl pkeyutl` (RSA-OAEP, SHA-1) opens it to
/// (password + NUL) XOR the nonce, as MySQL's server expects; the password never crosses
/// in clear.
#[test]
fn rsa_key_exchange_seals_the_password_to_the_servers_key() {
    let dir = tempfile::tempdir().unwrap();
    let public = rsa_key(dir.path(), 2048);
    let sealed_path = dir.path().join("sealed.bin");
    let out = sealed_path.clone();
    let fake = Fake::start(move |peer| {
        peer.send(0, &handshake("caching_sha2_password"));
        peer.read().unwrap();
        peer.send(2, &[0x01, 0x04]);
        assert_eq!(peer.read().unwrap(), [0x02], "public key request");
        peer.send(4, &[&[0x01][..], &public].concat());
        let sealed = peer.read().unwrap();
        std::fs::write(&out, &sealed).unwrap();
        peer.send(6, &ok());
        peer.read().expect("SET NAMES");
        peer.send(1, &ok());
    });
    let c = connect_with(&fake, &rsa_policy()).unwrap();
    drop(c);
    let seen = fake.finish();
    assert!(!contains(&seen, PASSWORD.as_bytes()), "password in clear");
    let sealed = std::fs::read(&sealed_path).unwrap();
    assert_eq!(sealed.len(), 256);
    let opened = std::process::Command::new("openssl")
        .current_dir(dir.path())
        .args([
            "pkeyutl",
            "-decrypt",
            "-inkey",
            "key.pem",
            "-in",
            "sealed.bin",
        ])
        .args([
            "-pkeyopt",
            "rsa_padding_mode:oaep",
            "-pkeyopt",
            "rsa_oaep_md:sha1",
        ])
        .args(["-pkeyopt", "rsa_mgf1_md:sha1"])
        .output()
        .unwrap();
    assert!(
        opened.status.success(),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    let expected: Vec<u8> = PASSWORD
        .bytes()
        .chain([0])
        .enumerate()
        .map(|(i, b)| b ^ NONCE[i % 20])
        .collect();
    assert_eq!(opened.stdout, expected);
}

/// Without the flag nothing asks for the key; with it, a weak, malformed or unasked-for key,
/// or a second full-authentication request, is refused before the password leaves.
#[test]
fn rsa_key_exchange_refuses_weak_malformed_and_unasked_keys() {
    let dir = tempfile::tempdir().unwrap();
    let weak = rsa_key(dir.path(), 1024);
    let good = rsa_key(dir.path(), 2048);
    let garbage = b"-----BEGIN PUBLIC KEY-----\nMIIB\x1b[2J\n-----END PUBLIC KEY-----\n".to_vec();
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "weak key",
            vec![[&[1u8][..], &weak].concat()],
            "at least 2048",
        ),
        (
            "control bytes",
            vec![[&[1u8][..], &garbage].concat()],
            "base64",
        ),
        (
            "not a key",
            vec![b"\x01-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n".to_vec()],
            "malformed",
        ),
        ("full twice", vec![vec![1, 4]], "twice"),
        ("fast after request", vec![vec![1, 3]], "unexpected"),
        (
            "oversized key",
            vec![[&[1u8][..], b"-----BEGIN ", &vec![b'A'; 9000]].concat()],
            "larger than",
        ),
    ];
    for (what, replies, wanted) in cases {
        let fake = Fake::start(move |peer| {
            peer.send(0, &handshake("caching_sha2_password"));
            peer.read().unwrap();
            peer.send(2, &[0x01, 0x04]);
            assert_eq!(peer.read().unwrap(), [0x02]);
            for (i, r) in replies.iter().enumerate() {
                peer.send(4 + i as u8, r);
            }
        });
        let e = connect_with(&fake, &rsa_policy()).unwrap_err();
        let shown = assert_clean(&e);
        assert!(shown.contains(wanted), "{what}: {shown}");
        let seen = fake.finish();
        assert!(!contains(&seen, PASSWORD.as_bytes()), "{what}");
        // Nothing went out after the key request.
        assert!(seen.ends_with(&[1, 0, 0, 3, 2]), "{what}: {seen:?}");
    }
    // A key the client did not ask for (the server sends it at once) is refused, as is the
    // flag off: no key request at all.
    for (policy, first) in [
        (rsa_policy(), [&[1u8][..], &good].concat()),
        (
            AuthPolicy::parse("caching_sha2_password").unwrap(),
            vec![1, 4],
        ),
    ] {
        let fake = Fake::start(move |peer| {
            peer.send(0, &handshake("caching_sha2_password"));
            peer.read().unwrap();
            peer.send(2, &first);
        });
        let e = connect_with(&fake, &policy).unwrap_err();
        let shown = assert_clean(&e);
        assert!(
            shown.contains("unexpected") || shown.contains("allow_rsa_key_exchange"),
            "{shown}"
        );
        let seen = fake.finish();
        assert!(!contains(&seen, PASSWORD.as_bytes()));
        assert!(!seen.ends_with(&[1, 0, 0, 3, 2]), "the key was requested");
    }
}

/// With `require_auth: client_ed25519` only, the handshake response names
/// mysql_native_password with an empty answer; a server (or an impostor on plain TCP) that then
/// answers OK at once was accepted although no allowed plugin ever ran (found by the attack on
/// the MySQL client, atk49 finding 1): the MySQL analogue of PostgreSQL's `trust`, which the
/// PostgreSQL client refuses by default. Now refused before SET NAMES.
#[test]
fn atk49_ok_without_any_allowed_plugin_is_refused() {
    let fake = Fake::start(|peer| {
        peer.send(0, &handshake("mysql_native_password"));
        let response = peer.read().unwrap();
        assert!(contains(&response, b"mysql_native_password"));
        peer.send(2, &ok());
        // A client that accepted goes on with SET NAMES: answer it so the hole is visible.
        if peer.read().is_some() {
            peer.send(1, &ok());
        }
    });
    // Keep only the outcome: a returned connection is closed before the fake is joined.
    let res = connect(&fake, "client_ed25519", Duration::from_secs(5)).map(drop);
    let seen = fake.finish();
    assert!(!contains(&seen, PASSWORD.as_bytes()));
    let e = res.expect_err(
        "atk49 finding 1: a login that no plugin in require_auth (client_ed25519) answered \
         was accepted",
    );
    assert_clean(&e);
    assert!(
        e.to_string()
            .contains("accepted the login before any plugin of require_auth"),
        "{e}"
    );
}

/// Relays one connection from a free port to `to`, the client's bytes at once, the server's
/// first `prefix` bytes at once and the rest one byte every `gap`: a server that drips its side
/// of the TLS handshake after a prompt greeting.
fn dripping_relay(to: u16, prefix: usize, gap: Duration) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else {
            return;
        };
        let server = std::net::TcpStream::connect(("127.0.0.1", to)).unwrap();
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c_in, &mut s_out);
        });
        let (mut s_in, mut c_out) = (server, client);
        let mut byte = [0u8; 1];
        let mut sent = 0;
        while s_in.read_exact(&mut byte).is_ok() {
            sent += 1;
            if sent > prefix {
                std::thread::sleep(gap);
            }
            if c_out.write_all(&byte).is_err() {
                return;
            }
        }
    });
    port
}

/// Issue 49's attack list, "dripped TLS": a server that answers the TLS handshake one byte at a
/// time (each byte well inside any read timeout) is cut at the one connect deadline, with a
/// clear error and the password never sent.
#[test]
fn a_dripped_tls_handshake_hits_the_connect_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let certs = crate::support::certs::make_certs(dir.path());
    let fake = Fake::start_tls("127.0.0.1", dir.path(), |peer| {
        peer.read();
    });
    // The greeting (the handshake packet, before the SSLRequest) comes at once: the drip is
    // the TLS server's flight (some 1,500 bytes: 30 s at this pace).
    let greeting = packet(0, &handshake("caching_sha2_password")).len();
    let relay = dripping_relay(fake.port, greeting, Duration::from_millis(20));
    let mut p = tls_params(relay, "127.0.0.1", &certs.ca);
    p.connect_timeout = Duration::from_secs(1);
    p.io_timeout = Duration::from_secs(1);
    let policy = AuthPolicy::parse("caching_sha2_password").unwrap();
    let start = Instant::now();
    let e = Connection::connect(&p, &policy, Some(PASSWORD.as_bytes())).unwrap_err();
    let shown = assert_clean(&e);
    assert!(
        shown.contains("tls") && shown.contains("timed out"),
        "{shown}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "one deadline for the whole connect: {:?}",
        start.elapsed()
    );
    drop(fake);
}
