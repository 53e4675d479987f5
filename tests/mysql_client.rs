//! The in-tree MySQL client (src/sink/relational/mysql/) against the real MariaDB on
//! 127.0.0.1:3306: queries, result sets, quoting in both backslash modes, each authentication
//! plugin allowed and refused, LOCAL INFILE never possible, and the scrambles against PyMySQL's.

use std::process::Command;

use crate::support::mysql::{my_params, MyDb};
use crate::support::python::python;
use svc::db::mysql::auth::{rsa_encrypt_password, scramble_caching_sha2, scramble_native};
use svc::db::mysql::{AuthPolicy, Connection};
use svc::db::postgres::DbError;

const HOSTILE: &str = "a'b\"c\\d\0e\nf\rg\u{1a}h ' OR 1=1 -- ü€😀 \\' \\\\'";

#[test]
fn queries_rows_nulls_and_quoting_in_both_modes() {
    let db = MyDb::new("client");
    let mut c = db.conn();
    assert!(c.is_mariadb(), "{}", c.server_version());
    c.ping().unwrap();
    c.query("CREATE TABLE t (id INT PRIMARY KEY, v LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL)")
        .unwrap();
    for (id, mode) in [(1, ""), (2, "NO_BACKSLASH_ESCAPES")] {
        c.query(&format!("SET SESSION sql_mode = '{mode}'"))
            .unwrap();
        assert_eq!(c.no_backslash_escapes(), !mode.is_empty());
        let r = c
            .query(&format!(
                "INSERT INTO t VALUES ({id}, {})",
                c.quote(HOSTILE)
            ))
            .unwrap();
        assert_eq!(r.affected_rows, 1);
    }
    c.query("INSERT INTO t VALUES (3, NULL)").unwrap();
    let rows = c.query("SELECT id, v FROM t ORDER BY id").unwrap().rows;
    assert_eq!(rows.len(), 3);
    for row in &rows[..2] {
        assert_eq!(row[1].as_deref(), Some(HOSTILE));
    }
    assert_eq!(rows[2], vec![Some("3".to_string()), None]);
    // A server error leaves the connection usable, with the SQLSTATE.
    let e = c.query("INSERT INTO t VALUES (3, 'dup')").unwrap_err();
    assert_eq!(e.code(), Some("23000"), "{e}");
    assert!(!e.to_string().contains("dup"), "row data in the error: {e}");
    assert!(!c.is_broken());
    c.query("BEGIN").unwrap();
    assert!(c.in_transaction());
    c.query("ROLLBACK").unwrap();
    assert!(!c.in_transaction());
    let e = c.query("SELECT * FROM missing_table").unwrap_err();
    assert_eq!(e.code(), Some("42S02"), "{e}");
}

#[test]
fn local_infile_is_never_possible() {
    let db = MyDb::new("infile");
    let mut c = db.conn();
    c.query("CREATE TABLE t (line TEXT)").unwrap();
    // The client never announces CLIENT_LOCAL_FILES: the server refuses the statement itself.
    let e = c
        .query("LOAD DATA LOCAL INFILE '/etc/hostname' INTO TABLE t")
        .unwrap_err();
    assert!(matches!(e, DbError::Server(_)), "{e}");
    assert_eq!(
        db.rows("SELECT COUNT(*) FROM t")[0][0].as_deref(),
        Some("0")
    );
}

#[test]
fn native_password_allowed_refused_and_wrong() {
    let mut db = MyDb::new("native");
    let user = db.user("mysql_native_password", "N4tive-pw");
    let p = my_params(&db.name, &user);
    let mut c = Connection::connect(&p, &AuthPolicy::default(), Some(b"N4tive-pw")).unwrap();
    assert_eq!(
        c.query("SELECT CURRENT_USER()").unwrap().rows[0][0]
            .as_deref()
            .map(|u| u.starts_with(&user)),
        Some(true)
    );
    let only = AuthPolicy::parse("mysql_native_password").unwrap();
    Connection::connect(&p, &only, Some(b"N4tive-pw")).unwrap();
    let e = Connection::connect(&p, &AuthPolicy::default(), Some(b"wrong")).unwrap_err();
    assert_eq!(e.code(), Some("28000"), "{e}");
    // Only caching_sha2_password allowed: MariaDB switches to the account's plugin, refused.
    let sha2 = AuthPolicy::parse("caching_sha2_password").unwrap();
    let e = Connection::connect(&p, &sha2, Some(b"N4tive-pw")).unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.contains("mysql_native_password") && shown.contains("does not allow"),
        "{shown}"
    );
}

/// MariaDB's ed25519: allowed (the default list) it connects, the key MariaDB stores is the
/// client's; not listed, it is refused before the signature leaves; a wrong password is the
/// server's 28000.
#[test]
fn ed25519_allowed_refused_and_wrong() {
    use base64::Engine as _;
    let mut db = MyDb::new("ed");
    let mut admin = crate::support::mysql::root();
    if let Err(e) = admin.query("INSTALL SONAME 'auth_ed25519'") {
        // Already installed (1968) is fine; anything else: the plugin is not on this machine.
        assert!(e.to_string().contains("1968"), "install auth_ed25519: {e}");
    }
    let user = db.user("ed25519", "Ed-pw-1");
    let stored = admin
        .query(&format!(
            "SELECT JSON_VALUE(priv, '$.authentication_string') FROM mysql.global_priv \
             WHERE User = '{user}'"
        ))
        .unwrap()
        .rows;
    let ours = base64::engine::general_purpose::STANDARD_NO_PAD
        .encode(svc::db::mysql::auth::ed25519_public_key(b"Ed-pw-1"));
    assert_eq!(stored[0][0].as_deref(), Some(ours.as_str()));
    let p = my_params(&db.name, &user);
    let mut c = Connection::connect(&p, &AuthPolicy::default(), Some(b"Ed-pw-1")).unwrap();
    c.ping().unwrap();
    let only = AuthPolicy::parse("client_ed25519").unwrap();
    Connection::connect(&p, &only, Some(b"Ed-pw-1")).unwrap();
    let e = Connection::connect(&p, &AuthPolicy::default(), Some(b"wrong")).unwrap_err();
    assert_eq!(e.code(), Some("28000"), "{e}");
    let native = AuthPolicy::parse("mysql_native_password").unwrap();
    let e = Connection::connect(&p, &native, Some(b"Ed-pw-1")).unwrap_err();
    assert!(
        e.to_string().contains("client_ed25519") && e.to_string().contains("does not allow"),
        "{e}"
    );
}

#[test]
fn scrambles_match_pymysql() {
    let cases: Vec<(String, Vec<u8>)> = (0..8u8)
        .map(|i| {
            let pw = format!("pw-{i}-{}", "ü".repeat(i as usize));
            let nonce: Vec<u8> = (0..20u8)
                .map(|b| b.wrapping_mul(37).wrapping_add(i))
                .collect();
            (pw, nonce)
        })
        .collect();
    let mut script = String::from("import pymysql._auth as a\n");
    for (pw, nonce) in &cases {
        script.push_str(&format!(
            "print(a.scramble_native_password({pw:?}.encode(), bytes.fromhex('{n}')).hex(), \
             a.scramble_caching_sha2({pw:?}.encode(), bytes.fromhex('{n}')).hex())\n",
            n = svc::text::hex::lower(nonce)
        ));
    }
    let out = Command::new(python())
        .args(["-c", &script])
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "PyMySQL (scripts/deps.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), cases.len());
    for ((pw, nonce), line) in cases.iter().zip(lines) {
        let (native, sha2) = line.split_once(' ').unwrap();
        assert_eq!(
            svc::text::hex::lower(&scramble_native(pw.as_bytes(), nonce)),
            native
        );
        assert_eq!(
            svc::text::hex::lower(&scramble_caching_sha2(pw.as_bytes(), nonce)),
            sha2
        );
    }
}

/// `caching_sha2_password` over plain TCP with `allow_rsa_key_exchange`: what the client seals
/// to a server's RSA key, opened by Python's `cryptography` with the padding PyMySQL's
/// `sha2_rsa_encrypt` uses (OAEP, SHA-1, MGF1-SHA-1), equals PyMySQL's
/// `_xor_password(password + NUL, nonce)`; and PyMySQL's own sealing opens the same way, so
/// the two agree on the whole construction.
#[test]
fn rsa_sealed_password_matches_pymysql() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.pem");
    let gen = "import sys\n\
        from cryptography.hazmat.primitives.asymmetric import rsa\n\
        from cryptography.hazmat.primitives import serialization as s\n\
        k = rsa.generate_private_key(public_exponent=65537, key_size=2048)\n\
        open(sys.argv[1], 'wb').write(k.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))\n\
        sys.stdout.buffer.write(k.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))\n";
    let out = Command::new(python())
        .args(["-c", gen])
        .arg(&key)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "cryptography (scripts/deps.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let public = out.stdout;
    let mut script = String::from(
        "import sys, pymysql._auth as a\n\
         from cryptography.hazmat.primitives import serialization as s, hashes\n\
         from cryptography.hazmat.primitives.asymmetric import padding\n\
         k = s.load_pem_private_key(open(sys.argv[1], 'rb').read(), None)\n\
         pad = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)\n\
         pub = k.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)\n",
    );
    let mut cases = Vec::new();
    for i in 0..6u8 {
        let pw = format!("pw-{i}-{}", "ü".repeat(i as usize * 7));
        let nonce: Vec<u8> = (0..20u8)
            .map(|b| b.wrapping_mul(53).wrapping_add(i))
            .collect();
        let sealed = rsa_encrypt_password(pw.as_bytes(), &nonce, &public).unwrap();
        assert_eq!(sealed.len(), 256);
        script.push_str(&format!(
            "n = bytes.fromhex('{n}'); w = {pw:?}.encode()\n\
             mine = k.decrypt(bytes.fromhex('{c}'), pad)\n\
             theirs = k.decrypt(a.sha2_rsa_encrypt(w, n, pub), pad)\n\
             print(mine == a._xor_password(w + b'\\0', n) == theirs)\n",
            n = svc::text::hex::lower(&nonce),
            c = svc::text::hex::lower(&sealed),
        ));
        cases.push(pw);
    }
    let out = Command::new(python())
        .args(["-c", &script])
        .arg(&key)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "PyMySQL: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().collect::<Vec<_>>(), vec!["True"; cases.len()]);
}
