//! The MySQL engine against a private MariaDB server (`support::mariadb_private`): verified
//! TLS with a throw-away CA (rows stored; a certificate for another name or from another CA
//! refused with nothing stored; a server without TLS refused, never downgraded) and each
//! authentication plugin allowed and refused by `sink.require_auth`.
//!
//! The sink reads its passwords from `password_env` variables, which a test must not set in
//! this process (tests/main.rs): as `relational_cluster` does, the test runs itself again in a
//! child of this binary that has them.

use std::process::Command;
use std::sync::Arc;

use serde_json::json;

use crate::support::mariadb_private::PrivateMariaDb;
use crate::support::postgres::{envelope, parse_cfg};
use svc::db::mysql::{AuthPolicy, Connection};
use svc::db::postgres::{tls_client_config, TlsMode};
use svc::metrics::Metrics;
use svc::sink::relational::my_sink::MySqlSink;
use svc::sink::{Sink, WriteOutcome};

const PASSWORDS: [(&str, &str); 4] = [
    ("SVC_TEST_MY_NATIVE_PW", "N4tive pässword"),
    ("SVC_TEST_MY_TLS_PW", "Tls-My-pw-9"),
    ("SVC_TEST_MY_ED_PW", "Ed-pw-2"),
    ("SVC_TEST_MY_WRONG_PW", "not-the-password"),
];

/// Runs `name` again in a child of this binary with [`PASSWORDS`] in its environment; true
/// when this is that child (the caller then runs the test), false when the child passed.
fn in_child(name: &str) -> bool {
    if std::env::var_os(PASSWORDS[0].0).is_some() {
        for (k, v) in PASSWORDS {
            assert_eq!(std::env::var(k).as_deref(), Ok(v), "started without {k}");
        }
        return true;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(PASSWORDS)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}{err}"
    );
    if err.contains("SKIPPED") {
        eprintln!("{err}");
    }
    false
}

fn sink(db: &PrivateMariaDb, user: &str, host: &str, extra: serde_json::Value) -> MySqlSink {
    let mut v = json!({
        "type": "relational_db",
        "engine": "mysql",
        "dsn": format!("mysql://{user}@{host}:{}/audit", db.port),
        "tls_mode": "disable",
        "table": "events",
        "auto_create_tables": true,
        "connect_timeout_seconds": 5,
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    MySqlSink::new(parse_cfg(&v), Arc::new(Metrics::default())).unwrap()
}

fn stored(db: &PrivateMariaDb, seq: u64) -> usize {
    let rows = db
        .root()
        .query(&format!(
            "SELECT COUNT(*) FROM audit.events WHERE stream_sequence = {seq}"
        ))
        .unwrap()
        .rows;
    rows[0][0].as_deref().unwrap().parse().unwrap()
}

fn assert_clean(e: &str) {
    for (_, pw) in PASSWORDS {
        assert!(!e.contains(pw), "a password in: {e}");
    }
    assert!(!e.chars().any(char::is_control), "{e:?}");
}

#[test]
fn tls_and_authentication_plugins_against_a_private_mariadb() {
    if !in_child("mysql_private::tls_and_authentication_plugins_against_a_private_mariadb") {
        return;
    }
    let Some(db) = PrivateMariaDb::start(true) else {
        return;
    };
    db.admin(&[
        "CREATE DATABASE audit CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        "CREATE USER native_user@'%' IDENTIFIED VIA mysql_native_password \
         USING PASSWORD('N4tive pässword')",
        "CREATE USER tls_user@'%' IDENTIFIED VIA mysql_native_password \
         USING PASSWORD('Tls-My-pw-9') REQUIRE SSL",
        "CREATE USER ed_user@'%' IDENTIFIED VIA ed25519 USING PASSWORD('Ed-pw-2')",
        "GRANT ALL ON audit.* TO native_user@'%', tls_user@'%', ed_user@'%'",
    ]);
    let ca = db.ca().to_str().unwrap().to_string();
    let native = json!({"password_env": "SVC_TEST_MY_NATIVE_PW"});

    // mysql_native_password allowed (the default list, and alone): rows stored.
    for (seq, auth) in [(1, None), (2, Some("mysql_native_password"))] {
        let mut extra = native.clone();
        if let Some(a) = auth {
            extra["require_auth"] = json!(a);
        }
        let s = sink(&db, "native_user", "127.0.0.1", extra);
        let out = s.write_batch(&[envelope("a.b", seq, b"{\"n\":1}")]);
        assert_eq!(out, vec![WriteOutcome::Durable], "{auth:?}");
        assert!(s.check().is_ok(), "{auth:?}");
        assert_eq!(stored(&db, seq), 1);
    }

    // Not in the allow-list: refused before the scramble leaves, nothing stored.
    let s = sink(
        &db,
        "native_user",
        "127.0.0.1",
        json!({"password_env": "SVC_TEST_MY_NATIVE_PW", "require_auth": "caching_sha2_password"}),
    );
    let e = s.check().unwrap_err().to_string();
    assert_clean(&e);
    assert!(
        e.contains("mysql_native_password")
            && e.contains("does not allow")
            && e.contains("nothing was sent"),
        "{e}"
    );
    let out = s.write_batch(&[envelope("a.b", 3, b"{}")]);
    assert!(!out.contains(&WriteOutcome::Durable), "{out:?}");
    assert_eq!(stored(&db, 3), 0);

    // MariaDB's ed25519: allowed by default (rows stored), refused when not listed.
    let s = sink(
        &db,
        "ed_user",
        "127.0.0.1",
        json!({"password_env": "SVC_TEST_MY_ED_PW"}),
    );
    assert_eq!(
        s.write_batch(&[envelope("a.b", 4, b"{}")]),
        vec![WriteOutcome::Durable]
    );
    let s = sink(
        &db,
        "ed_user",
        "127.0.0.1",
        json!({"password_env": "SVC_TEST_MY_ED_PW", "require_auth": "mysql_native_password"}),
    );
    let e = s.check().unwrap_err().to_string();
    assert_clean(&e);
    assert!(
        e.contains("client_ed25519") && e.contains("does not allow"),
        "{e}"
    );

    // A wrong password: the server's verdict (28000), no password in it.
    let s = sink(
        &db,
        "native_user",
        "127.0.0.1",
        json!({"password_env": "SVC_TEST_MY_WRONG_PW"}),
    );
    let e = s.check().unwrap_err().to_string();
    assert_clean(&e);
    assert!(e.contains("28000"), "{e}");

    // Verified TLS by IP and by DNS name: rows stored, the session is encrypted.
    for (seq, host) in [(10, "127.0.0.1"), (11, "localhost")] {
        let s = sink(
            &db,
            "tls_user",
            host,
            json!({"password_env": "SVC_TEST_MY_TLS_PW", "tls_mode": "verify_full",
                   "tls_ca_file": ca}),
        );
        let out = s.write_batch(&[envelope("a.b", seq, b"{\"tls\":true}")]);
        assert_eq!(out, vec![WriteOutcome::Durable], "{host}");
        assert_eq!(stored(&db, seq), 1);
    }
    let mut p = db.params("tls_user");
    p.database = "audit".into();
    p.tls = TlsMode::VerifyFull;
    p.tls_config = Some(tls_client_config(Some(db.ca())).unwrap());
    let mut c = Connection::connect(&p, &AuthPolicy::default(), Some(b"Tls-My-pw-9")).unwrap();
    let cipher = c.query("SHOW SESSION STATUS LIKE 'Ssl_version'").unwrap();
    assert!(
        cipher.rows[0][1]
            .as_deref()
            .unwrap_or("")
            .starts_with("TLSv1."),
        "{cipher:?}"
    );

    // The REQUIRE SSL account over plain TCP: refused by the server.
    let s = sink(
        &db,
        "tls_user",
        "127.0.0.1",
        json!({"password_env": "SVC_TEST_MY_TLS_PW"}),
    );
    let e = s.check().unwrap_err().to_string();
    assert!(e.contains("28000"), "{e}");

    // A certificate for another name (127.0.0.2: the certificate names localhost and
    // 127.0.0.1), and one from another CA: refused, nothing stored.
    let other = crate::support::TempDir::new("other-ca");
    let other_ca = crate::support::certs::make_certs(other.path()).ca;
    for (seq, host, ca_file) in [
        (20, "127.0.0.2", ca.clone()),
        (21, "127.0.0.1", other_ca.to_str().unwrap().to_string()),
    ] {
        let s = sink(
            &db,
            "tls_user",
            host,
            json!({"password_env": "SVC_TEST_MY_TLS_PW", "tls_mode": "verify_full",
                   "tls_ca_file": ca_file}),
        );
        let e = s.check().unwrap_err().to_string();
        assert_clean(&e);
        assert!(
            e.contains("tls handshake") && e.contains("certificate"),
            "{host}: {e}"
        );
        let out = s.write_batch(&[envelope("a.b", seq, b"{}")]);
        assert!(!out.contains(&WriteOutcome::Durable), "{host}: {out:?}");
        assert_eq!(stored(&db, seq), 0, "{host}");
    }
}

/// A server that does not offer TLS (`--skip-ssl`) is refused when `tls_mode` is
/// `verify_full`: the client sends nothing but never falls back to plain TCP.
#[test]
fn a_private_mariadb_without_tls_is_refused_never_downgraded() {
    let Some(db) = PrivateMariaDb::start(false) else {
        return;
    };
    db.admin(&["CREATE DATABASE audit"]);
    // Reachable in plain TCP (root without a password)...
    let plain = sink(&db, "root", "127.0.0.1", json!({}));
    assert_eq!(
        plain.write_batch(&[envelope("a.b", 1, b"{}")]),
        vec![WriteOutcome::Durable]
    );
    // ...refused with TLS asked.
    let ca = db.ca().to_str().unwrap().to_string();
    let s = sink(
        &db,
        "root",
        "127.0.0.1",
        json!({"tls_mode": "verify_full", "tls_ca_file": ca}),
    );
    let e = s.check().unwrap_err().to_string();
    assert!(e.contains("does not accept tls"), "{e}");
    let out = s.write_batch(&[envelope("a.b", 2, b"{}")]);
    assert!(!out.contains(&WriteOutcome::Durable), "{out:?}");
    assert_eq!(stored(&db, 2), 0);
}
