//! h51wfix: the holes of atk51a that need no allocator probe, fixed (the probe's are in
//! tests/wipe_probe.rs). HOSTILE class 9: a PostgreSQL or MySQL server quoting the password
//! back into the client's error (H7), and `aws::credentials::ProfileSettings` printing its
//! secret keys in `Debug` (H6). Each test failed before its fix.

use std::time::Duration;

use crate::support::pg_fake::{error_response, frame, Fake};
use svc::db::postgres::{AuthPolicy, ChannelBindingMode, ConnectParams, Connection, TlsMode};

const PASSWORD: &str = "Atk51a-Pg-s3cret-7d0e";

/// A server that asked for the password in clear (allowed by require_auth) answers with an
/// ErrorResponse quoting it: the client's error (what `svc run` logs and `svc test-sink`
/// prints) shows `<redacted>` in its place.
#[test]
fn pg_error_quoting_the_password_is_scrubbed() {
    let shown =
        pg_startup_error(|pw| format!("password \"{pw}\" authentication failed for user \"app\""))
            .to_string();
    assert!(!shown.contains(PASSWORD), "{} characters", shown.len());
    assert!(
        shown.ends_with("password \"<redacted>\" authentication failed for user \"app\""),
        "{shown}"
    );
}

/// The password percent-encoded, base64-encoded, and md5(password + user) in hex (what a
/// PostgreSQL server with MD5 passwords stores, which logs in as the password does).
#[test]
fn pg_error_quoting_an_encoded_password_is_scrubbed() {
    use base64::Engine as _;
    use md5::{Digest, Md5};
    let b64 = base64::engine::general_purpose::STANDARD.encode(PASSWORD);
    let mut h = Md5::new();
    h.update(PASSWORD.as_bytes());
    h.update(b"app");
    let md5_hex = svc::text::hex::lower(&h.finalize());
    let (b, m) = (b64.clone(), md5_hex.clone());
    let shown = pg_startup_error(move |_| format!("got {b} and md5{m}")).to_string();
    assert!(
        !shown.contains(&b64) && !shown.contains(&md5_hex),
        "{shown}"
    );
    assert!(
        shown.ends_with("got <redacted> and md5<redacted>"),
        "{shown}"
    );
}

/// The password where the kept message (512 characters) is cut: hidden before the cut, so
/// not even its first characters remain.
#[test]
fn pg_error_with_the_password_across_the_cut_is_scrubbed() {
    let e = pg_startup_error(|pw| format!("{}{pw}", "x".repeat(505)));
    let svc::db::postgres::DbError::Server(s) = e else {
        panic!("not a server error: {e:?}");
    };
    assert!(
        !s.message.contains(&PASSWORD[..7]),
        "the kept message holds the password"
    );
    assert_eq!(s.message.chars().count(), 512);
    assert!(s.message.ends_with("x<redact"), "{}", &s.message[490..]);
}

/// Connects to a fake server that asks for the cleartext password and answers with the
/// error `message(password)`; returns the client's error.
fn pg_startup_error(
    message: impl FnOnce(&str) -> String + Send + 'static,
) -> svc::db::postgres::DbError {
    let fake = Fake::start(|p| {
        p.startup();
        p.raw(&frame(b'R', &3i32.to_be_bytes()));
        if let Some((b'p', body)) = p.read_msg() {
            let pw = String::from_utf8_lossy(&body[..body.len() - 1]).into_owned();
            p.raw(&error_response("FATAL", "28P01", &message(&pw)));
        }
    });
    let params = ConnectParams {
        host: "127.0.0.1".into(),
        port: fake.port,
        user: "app".into(),
        database: "appdb".into(),
        application_name: "svc-atk51a".into(),
        tls: TlsMode::Disable,
        tls_config: None,
        require_auth: AuthPolicy::parse("password").unwrap(),
        channel_binding: ChannelBindingMode::Prefer,
        scram_min_iterations: 4096,
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(5),
    };
    let e = Connection::connect(&params, Some(PASSWORD.as_bytes()))
        .err()
        .expect("refused");
    fake.finish();
    e
}

/// `aws::credentials::ProfileSettings` (now wiped on drop, holding
/// `aws_secret_access_key` and `aws_session_token`) derives `Debug`, which prints every value;
/// every other owner of an AWS secret prints `<redacted>`.
#[test]
fn profile_settings_debug_redacts_the_secret_keys() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    let secret = "Atk51aProfileSecretAccessKey0123456789ab";
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = {secret}\n\
             aws_session_token = {secret}Token\nregion = eu-west-1\n"
        ),
    )
    .unwrap();
    let mut env = std::collections::HashMap::new();
    env.insert(
        "AWS_SHARED_CREDENTIALS_FILE".to_string(),
        creds.display().to_string(),
    );
    env.insert(
        "AWS_CONFIG_FILE".to_string(),
        dir.path().join("none").display().to_string(),
    );
    let p = svc::aws::credentials::load_profile("default", &env)
        .unwrap()
        .unwrap();
    let shown = format!("{p:?}");
    assert!(
        !shown.contains(secret),
        "Debug of ProfileSettings shows a secret key"
    );
    // Not a secret's name: shown.
    assert!(shown.contains("\"region\": \"eu-west-1\""), "{shown}");
    assert!(
        shown.contains("\"aws_secret_access_key\": \"<redacted>\""),
        "{shown}"
    );
}

/// The same for MySQL/MariaDB: after caching_sha2_password full authentication over a
/// verified TLS session (the password in clear inside it), the server answers an ERR packet
/// quoting the password; the client's error shows `<redacted>` in its place.
#[test]
fn mysql_error_quoting_the_password_is_scrubbed() {
    use crate::support::mysql::my_params;
    use crate::support::mysql_fake::{err, Fake as MyFake};
    use svc::db::mysql::{AuthPolicy as MyPolicy, Connection as MyConnection};
    let dir = tempfile::tempdir().unwrap();
    let certs = crate::support::certs::make_certs(dir.path());
    let fake = MyFake::start_tls("127.0.0.1", dir.path(), |peer| {
        peer.read().unwrap();
        peer.send(3, &[0x01, 0x04]);
        let clear = peer.read().unwrap();
        let pw = String::from_utf8_lossy(&clear[..clear.len() - 1]).into_owned();
        peer.send(
            5,
            &err(1045, "28000", &format!("Access denied for password '{pw}'")),
        );
    });
    let mut p = my_params("db", "app");
    p.host = "127.0.0.1".into();
    p.port = fake.port;
    p.tls = svc::db::postgres::TlsMode::VerifyFull;
    p.tls_config = Some(svc::db::postgres::tls_client_config(Some(&certs.ca)).unwrap());
    p.connect_timeout = Duration::from_secs(10);
    let Err(e) = MyConnection::connect(
        &p,
        &MyPolicy::parse("caching_sha2_password").unwrap(),
        Some(PASSWORD.as_bytes()),
    ) else {
        panic!("refused")
    };
    fake.finish();
    let shown = e.to_string();
    assert!(!shown.contains(PASSWORD), "{} characters", shown.len());
    assert!(
        shown.ends_with("Access denied for password '<redacted>'"),
        "{shown}"
    );
}
