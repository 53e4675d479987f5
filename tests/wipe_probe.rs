//! Which secrets reach the allocator's free list unwiped (docs/security.md, "Secrets in
//! memory"; the probe of the atk51a attack, kept as a test). A global allocator that, before
//! it frees or moves a block, looks in it for a marker that only the secret under test
//! contains; every hit is a copy of that secret released without being wiped (what a later
//! core dump, a heap reuse or a memory-disclosure bug could show). Each test builds its inputs
//! first, arms the probe, runs the code under test and drops everything it produced, then
//! disarms.
//!
//! Its own test target (`[[test]] name = "wipe_probe"`): a global allocator is one per binary,
//! and tests/main.rs must keep the system's. The probe's state is per thread (the marker,
//! the counts, armed or not), so the tests run in parallel as any other; a block another
//! thread frees is never counted. Every block is zeroed as it is freed, and `realloc` always
//! moves (old block zeroed), so a reused block never shows an earlier owner's bytes; a block
//! a growing buffer left behind is counted when it held the marker.
//!
//! Run: `cargo test --test wipe_probe`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

const MAX_NEEDLE: usize = 64;

thread_local! {
    /// Armed on the test's own thread only.
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static NEEDLE: Cell<[u8; MAX_NEEDLE]> = const { Cell::new([0; MAX_NEEDLE]) };
    static NEEDLE_LEN: Cell<usize> = const { Cell::new(0) };
    static HITS: Cell<usize> = const { Cell::new(0) };
    static MOVES: Cell<usize> = const { Cell::new(0) };
}

struct Probe;

/// True when this thread is armed and the `n` bytes at `p` (a block about to be freed or
/// moved) contain its needle.
unsafe fn holds_needle(p: *const u8, n: usize) -> bool {
    if !ARMED.try_with(Cell::get).unwrap_or(false) {
        return false;
    }
    let len = NEEDLE_LEN.try_with(Cell::get).unwrap_or(0);
    let Ok(needle) = NEEDLE.try_with(Cell::get) else {
        return false;
    };
    if len == 0 || n < len {
        return false;
    }
    'outer: for start in 0..=(n - len) {
        for (i, want) in needle.iter().take(len).enumerate() {
            if std::ptr::read_volatile(p.add(start + i)) != *want {
                continue 'outer;
            }
        }
        return true;
    }
    false
}

fn count(counter: &'static std::thread::LocalKey<Cell<usize>>) {
    let _ = counter.try_with(|c| c.set(c.get() + 1));
}

/// Zeroes `n` bytes at `p`, a block about to be freed. `black_box` keeps the stores: without
/// it an optimized build drops them as dead before `free` (the very thing the product's
/// `wipe` guards against), and a block handed out again shows its earlier owner's bytes.
unsafe fn zero(p: *mut u8, n: usize) {
    std::ptr::write_bytes(p, 0, n);
    std::hint::black_box(p);
}

unsafe impl GlobalAlloc for Probe {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if holds_needle(p, l.size()) {
            count(&HITS);
        }
        // Every block is zeroed as it is freed (armed or not): a block handed out again
        // cannot carry stale bytes of an earlier owner into a later count.
        zero(p, l.size());
        System.dealloc(p, l)
    }
    /// Always moves (new block, copy, old block zeroed and freed), so no stale copy is ever
    /// left in the allocator; a move of a block that held the marker is counted apart: it
    /// is what a growing `Vec`/`String` leaves behind whenever glibc's realloc moves it.
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let had = holds_needle(p, l.size());
        let q = System.alloc(Layout::from_size_align_unchecked(new_size, l.align()));
        if !q.is_null() {
            std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
            if had {
                count(&MOVES);
            }
            zero(p, l.size());
            System.dealloc(p, l);
        }
        q
    }
}

#[global_allocator]
static PROBE: Probe = Probe;

/// How many blocks holding `needle` this thread freed (or left behind by a move) while `f`
/// ran.
fn freed_copies(needle: &[u8], f: impl FnOnce()) -> usize {
    assert!(!needle.is_empty() && needle.len() <= MAX_NEEDLE);
    let mut n = [0u8; MAX_NEEDLE];
    n[..needle.len()].copy_from_slice(needle);
    NEEDLE.with(|c| c.set(n));
    NEEDLE_LEN.with(|c| c.set(needle.len()));
    HITS.with(|c| c.set(0));
    MOVES.with(|c| c.set(0));
    ARMED.with(|a| a.set(true));
    f();
    ARMED.with(|a| a.set(false));
    let (freed, moved) = (HITS.with(Cell::get), MOVES.with(Cell::get));
    if freed + moved > 0 {
        eprintln!("copies freed unwiped: {freed}; left behind by a growing buffer: {moved}");
    }
    freed + moved
}

/// Lower-case letters and digits only, so it survives every escaped and lower-cased form.
const MARK: &str = "zq7wipeprobe9xk";

/// A session-token-like secret: base64 alphabet with '/' and '+', about 1 KiB, marked.
fn token() -> String {
    let mut t = String::from("IQoJb3JpZ2luX2VjE");
    t.push_str(MARK);
    for i in 0..60 {
        t.push_str(&format!("Ab{i:02}/Cd+Ef/Gh"));
    }
    t.push('=');
    t
}

fn secret_key() -> String {
    format!("wJalrXUtnFEMI/K7MDENG{MARK}bPxRfiCY")
}

// ------------------------------------------- the holes atk51a found (H1 to H5)

/// text::secrets::Secrets (docs: "their escaped forms ... wiped when the holder drops"):
/// adding one plain secret and dropping the set must free no unwiped copy.
#[test]
fn secrets_add_then_drop_frees_no_copy() {
    let value = format!("plain{MARK}value");
    let n = freed_copies(MARK.as_bytes(), || {
        let mut s = svc::text::secrets::Secrets::new();
        s.add(&value);
        drop(s);
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of a plain secret freed by Secrets::add"
    );
}

/// The same with a token-shaped secret (many '/' and '+', the escaped forms grow).
#[test]
fn secrets_add_token_then_drop_frees_no_copy() {
    // Built before the probe is armed: the test's own copy is not the code's.
    let value = format!("Bearer {}", token());
    let n = freed_copies(MARK.as_bytes(), || {
        let mut s = svc::text::secrets::Secrets::new();
        s.add_authorization(&value);
        drop(s);
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of a bearer token freed by Secrets"
    );
}

/// A Basic credential: its base64 forms, and the decoded `user:password` and password that
/// `add_authorization` also hides (the decoded pair is a copy of its own, wiped).
#[test]
fn secrets_add_basic_authorization_frees_no_copy() {
    use base64::Engine as _;
    let pair = format!("alice:pw-{MARK}-x\"<&>'/+=");
    let value = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(&pair)
    );
    let echo = format!("bad password pw-{MARK}-x&quot;&lt;&amp;&gt;&apos;/+=");
    let n = freed_copies(MARK.as_bytes(), || {
        let mut s = svc::text::secrets::Secrets::new();
        s.add_authorization(&value);
        // The XML form of the password is built too: an echo of it is hidden.
        assert_eq!(s.scrub(&echo), "bad password <redacted>");
        drop(s);
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of a Basic credential freed by Secrets"
    );
}

/// svc-observe OCI resource principal: a variable naming a file that is not UTF-8 (the file
/// form of `value_or_file`) frees no copy of the file's bytes.
#[test]
fn oci_resource_principal_file_not_utf8_frees_no_copy() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("pem");
    let mut der = vec![0x30, 0x82, 0xff, 0xfe];
    der.extend_from_slice(MARK.as_bytes());
    der.extend_from_slice(&[0xc3; 100]);
    std::fs::write(&pem, &der).unwrap();
    let mut env = std::collections::HashMap::<String, String>::new();
    env.insert("OCI_RESOURCE_PRINCIPAL_VERSION".into(), "2.2".into());
    env.insert(
        "OCI_RESOURCE_PRINCIPAL_RPST".into(),
        "header.payload.sig".into(),
    );
    env.insert(
        "OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM".into(),
        pem.display().to_string(),
    );
    env.insert(
        "OCI_RESOURCE_PRINCIPAL_REGION".into(),
        "us-ashburn-1".into(),
    );
    let n = freed_copies(MARK.as_bytes(), || {
        let r = svc::observe::connectors::oci::auth::resource_principal(&env, 0);
        let Err(e) = r else {
            panic!("a file that is not UTF-8 is refused")
        };
        assert!(
            format!("{e:?}").contains("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM"),
            "{e:?}"
        );
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of the PEM file freed on the not-UTF-8 path"
    );
}

/// aws: credential_process output (docs: "the issued credentials ... wiped once parsed").
#[test]
fn aws_process_output_parse_frees_no_copy() {
    let body = format!(
        r#"{{"Version":1,"AccessKeyId":"AKIDEXAMPLE","SecretAccessKey":"{}","SessionToken":"{}"}}"#,
        secret_key(),
        token()
    );
    let n = freed_copies(MARK.as_bytes(), || {
        let issued = svc::aws::parse::parse_process_credentials(body.as_bytes()).unwrap();
        drop(issued);
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of the secret/token freed by the parse"
    );
}

/// aws: IMDS / container answer.
#[test]
fn aws_metadata_answer_parse_frees_no_copy() {
    let body = format!(
        r#"{{"Code":"Success","AccessKeyId":"ASIAEXAMPLE","SecretAccessKey":"{}","Token":"{}","Expiration":"2030-01-01T00:00:00Z"}}"#,
        secret_key(),
        token()
    );
    let n = freed_copies(MARK.as_bytes(), || {
        drop(svc::aws::parse::parse_metadata_credentials(body.as_bytes()).unwrap());
    });
    assert_eq!(n, 0, "{n} unwiped copies freed by the metadata parse");
}

/// aws: STS answer (XML).
#[test]
fn aws_sts_answer_parse_frees_no_copy() {
    let body = format!(
        "<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>ASIAEXAMPLE</AccessKeyId>\
         <SecretAccessKey>{}</SecretAccessKey><SessionToken>{}</SessionToken>\
         <Expiration>2030-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleResult>\
         </AssumeRoleResponse>",
        secret_key(),
        token()
    );
    let n = freed_copies(MARK.as_bytes(), || {
        drop(svc::aws::parse::parse_sts_credentials("AssumeRole", body.as_bytes()).unwrap());
    });
    assert_eq!(n, 0, "{n} unwiped copies freed by the STS parse");
}

/// aws: a refused answer (a session token with a space) returns before any owner wipes.
#[test]
fn aws_refused_answer_frees_no_copy() {
    let body = format!(
        r#"{{"Version":1,"AccessKeyId":"AKIDEXAMPLE","SecretAccessKey":"{}","SessionToken":"bad token"}}"#,
        secret_key()
    );
    let n = freed_copies(MARK.as_bytes(), || {
        assert!(svc::aws::parse::parse_process_credentials(body.as_bytes()).is_err());
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of the secret key freed on the error path"
    );
}

/// aws SigV4 with a session token (docs: the token is held by aws::Credentials, wiped on
/// drop): one signature must not leave copies of the token behind.
#[test]
fn sigv4_sign_with_session_token_frees_no_copy() {
    use svc::aws::sigv4::{sign, Request, Scope};
    let creds = svc::aws::credentials::Credentials {
        access_key_id: "ASIAEXAMPLE".into(),
        secret_access_key: "plainsecretaccesskeyplainsecret".into(),
        session_token: Some(token()),
    };
    let headers = [("content-type", "application/json")];
    let req = Request {
        method: "PUT",
        host: "127.0.0.1:9000",
        path: "/bucket/a.json",
        query: "",
        headers: &headers,
        payload_sha256: "UNSIGNED-PAYLOAD",
    };
    let scope = Scope {
        region: "us-east-1",
        service: "s3",
        amz_date: "20261129T120000Z",
    };
    let n = freed_copies(MARK.as_bytes(), || {
        drop(sign(&req, &scope, &creds));
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of the session token freed by one signature"
    );
}

/// aws shared credentials file, one profile, each key once (docs: "AWS shared
/// credentials/config file text and every profile's keys ... wiped once parsed").
#[test]
fn aws_profile_load_frees_no_copy() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = {}\n\
             [other]\naws_access_key_id = AKIDOTHER\naws_secret_access_key = other{MARK}\n",
            secret_key()
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
    let n = freed_copies(MARK.as_bytes(), || {
        let p = svc::aws::credentials::load_profile("default", &env).unwrap();
        assert!(p.is_some());
        drop(p);
    });
    assert_eq!(n, 0, "{n} unwiped copies of a profile key freed");
}

/// aws shared credentials file with the key set twice in one profile (a merge mistake):
/// the first value is replaced inside parse_ini and freed unwiped.
#[test]
fn aws_profile_with_a_repeated_key_frees_no_copy() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = old{MARK}old\n\
             aws_secret_access_key = {}\n",
            secret_key()
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
    let n = freed_copies(MARK.as_bytes(), || {
        let p = svc::aws::credentials::load_profile("default", &env).unwrap();
        assert!(p.is_some());
        drop(p);
    });
    assert_eq!(n, 0, "{n} unwiped copies of a profile key freed");
}

/// svc-observe OCI API key: a key_file that is not UTF-8 (a DER key named by mistake) is read
/// by std::fs::read_to_string, whose buffer is freed unwiped on the InvalidData error, before
/// the SecretString that is to wipe it exists (docs: "OCI API key ... text ... wiped").
#[test]
fn oci_key_file_not_utf8_frees_no_copy() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.der");
    let mut der = vec![0x30, 0x82, 0x04, 0xa4, 0xff, 0xfe];
    der.extend_from_slice(MARK.as_bytes());
    der.extend_from_slice(&[0xc3; 200]);
    std::fs::write(&key, &der).unwrap();
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        format!(
            "[DEFAULT]\nuser=ocid1.user.oc1..aaaaaaaaexample\n\
             tenancy=ocid1.tenancy.oc1..aaaaaaaaexample\n\
             fingerprint=20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34\n\
             region=us-ashburn-1\nkey_file={}\n",
            key.display()
        ),
    )
    .unwrap();
    let env = std::collections::HashMap::<String, String>::new();
    let n = freed_copies(MARK.as_bytes(), || {
        let r = svc::observe::connectors::oci::auth::config_file(&config, "DEFAULT", &env);
        let Err(e) = r else {
            panic!("a DER key file is refused")
        };
        assert!(format!("{e:?}").contains("key_file"), "{e:?}");
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of the key file freed on the not-UTF-8 path"
    );
}

/// The HTTP sink's `headers_env` value (docs: "SecretString for the sink's life ... the
/// sink's [copy is wiped] when it drops"): building the sink and dropping it, with the value
/// read as `std::env::var` would (one exact copy, handed to the sink), frees unwiped copies:
/// the escaped forms `text::secrets::Secrets::add` builds to scrub answers.
#[test]
fn http_sink_headers_env_value_frees_no_copy() {
    let value = format!("Bearer {}", token());
    let v: serde_json::Value = serde_json::from_str(
        r#"{"type": "http", "url": "http://127.0.0.1:9/hook", "allow_http_for_local_testing": true,
            "headers_env": {"Authorization": "ATK51A_HOOK_TOKEN"}}"#,
    )
    .unwrap();
    let problems = svc::document::reader::Problems::new();
    let cfg = match svc::sink::SinkConfig::read(svc::document::reader::ObjectReader::at(
        "sink".into(),
        &v,
        &problems,
    )) {
        Some(svc::sink::SinkConfig::Http(c)) if problems.is_empty() => *c,
        _ => panic!("bad test config"),
    };
    let n = freed_copies(MARK.as_bytes(), || {
        let sink = svc::sink::http::HttpSink::with_env(
            cfg,
            std::sync::Arc::new(svc::metrics::Metrics::default()),
            |name| (name == "ATK51A_HOOK_TOKEN").then(|| value.clone()),
        )
        .unwrap();
        drop(sink);
    });
    assert_eq!(
        n, 0,
        "{n} unwiped copies of the headers_env value freed by the sink"
    );
}

// ------------------------------------------- what held when atk51a attacked it

/// SigV4 without a session token: `AWS4<secret>` and the derived keys are wiped.
#[test]
fn sigv4_signing_key_frees_no_copy_of_the_secret() {
    use svc::aws::sigv4::{sign, Request, Scope};
    let creds = svc::aws::credentials::Credentials {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: secret_key(),
        session_token: None,
    };
    let req = Request {
        method: "GET",
        host: "h",
        path: "/",
        query: "",
        headers: &[],
        payload_sha256: "UNSIGNED-PAYLOAD",
    };
    let scope = Scope {
        region: "r",
        service: "s3",
        amz_date: "20261129T120000Z",
    };
    let n = freed_copies(MARK.as_bytes(), || drop(sign(&req, &scope, &creds)));
    assert_eq!(n, 0);
}

/// PostgreSQL SCRAM and MD5 and the MySQL scrambles make no unwiped heap copy of the password.
#[test]
fn database_scrambles_free_no_copy_of_the_password() {
    use svc::db::mysql::auth::{scramble_caching_sha2, scramble_native, sign_ed25519};
    use svc::db::postgres::auth::{md5_password, ChannelBinding, Scram};
    let password = format!("pw-{MARK}-pw");
    let n = freed_copies(MARK.as_bytes(), || {
        let mut s = Scram::new(
            "user",
            "rOprNGfwEbeRWgbNEkqO".into(),
            ChannelBinding::NotSupported,
        );
        let first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        drop(s.client_final(password.as_bytes(), first).unwrap());
        drop(s);
        drop(md5_password("user", password.as_bytes(), &[1, 2, 3, 4]));
        drop(scramble_native(password.as_bytes(), &[7; 20]));
        drop(scramble_caching_sha2(password.as_bytes(), &[7; 20]));
        let _ = sign_ed25519(password.as_bytes(), &[7; 32]);
    });
    assert_eq!(n, 0);
}

/// The MD5 inner hash md5(password + user), what the server stores, is not freed unwiped.
#[test]
fn md5_inner_hash_frees_no_copy() {
    use md5::{Digest, Md5};
    let password = b"pencil-md5";
    let mut h = Md5::new();
    h.update(password);
    h.update(b"user");
    let inner = svc::text::hex::lower(&h.finalize());
    let n = freed_copies(&inner.as_bytes()[..24], || {
        drop(svc::db::postgres::auth::md5_password(
            "user",
            password,
            &[9, 9, 9, 9],
        ));
    });
    assert_eq!(n, 0);
}

/// Payload/custody key files and variables: text and decoded bytes.
#[test]
fn key_source_load_frees_no_copy() {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    use svc::message::protection::keys::KeySource;
    let mut key = [0x5au8; 32];
    key[4..4 + 15].copy_from_slice(MARK.as_bytes());
    let text = base64::engine::general_purpose::STANDARD.encode(key);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k");
    std::fs::write(&path, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let src = KeySource::File(path);
    let n_bytes = freed_copies(MARK.as_bytes(), || {
        drop(src.load(32, 32).unwrap());
        assert!(src.load(16, 16).is_err());
    });
    let n_text = freed_copies(&text.as_bytes()[8..32], || {
        drop(src.load(32, 32).unwrap());
        assert!(src.load(16, 16).is_err());
    });
    assert_eq!((n_bytes, n_text), (0, 0));
}

/// OCI API key PEM: the base64 body and the DER are wiped.
#[test]
fn oci_private_key_load_frees_no_copy() {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .unwrap();
    let pem = String::from_utf8(out.stdout).unwrap();
    // A line of the body from the middle, and the same as DER bytes.
    let line = pem.lines().nth(8).unwrap().to_string();
    let n = freed_copies(&line.as_bytes()[..48], || {
        drop(svc::observe::connectors::oci::signature::load_private_key(&pem).unwrap());
    });
    assert_eq!(n, 0);
}

/// Custody checkpoint signing key (Ed25519 seed file): the file text, PEM body and decoded
/// seed are wiped once ring's key pair is built.
#[test]
fn checkpoint_signing_key_load_frees_no_copy() {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    let mut seed = [0x11u8; 32];
    seed[2..2 + 15].copy_from_slice(MARK.as_bytes());
    let text = base64::engine::general_purpose::STANDARD.encode(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("signing.key");
    std::fs::write(&path, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = svc::message::protection::checkpoint::CheckpointConfig {
        signing_key_file: path,
        key_id: "k1".into(),
        ..Default::default()
    };
    let n_seed = freed_copies(MARK.as_bytes(), || {
        drop(svc::message::protection::checkpoint::Signer::load(&cfg).unwrap());
    });
    let n_text = freed_copies(&text.as_bytes()[4..28], || {
        drop(svc::message::protection::checkpoint::Signer::load(&cfg).unwrap());
    });
    assert_eq!((n_seed, n_text), (0, 0));
}

/// A payload key read from a variable (`*_env`): the variable's copy and the decoded bytes.
#[test]
fn key_source_env_load_frees_no_copy() {
    use base64::Engine as _;
    let mut key = [0x22u8; 32];
    key[8..8 + 15].copy_from_slice(MARK.as_bytes());
    let text = base64::engine::general_purpose::STANDARD.encode(key);
    // A name no other test reads; std serializes its own environment reads and writes.
    std::env::set_var("WIPE_PROBE_PAYLOAD_KEY", &text);
    let src = svc::message::protection::keys::KeySource::Env("WIPE_PROBE_PAYLOAD_KEY".into());
    let n_bytes = freed_copies(MARK.as_bytes(), || drop(src.load(32, 32).unwrap()));
    let n_text = freed_copies(&text.as_bytes()[12..36], || drop(src.load(32, 32).unwrap()));
    std::env::remove_var("WIPE_PROBE_PAYLOAD_KEY");
    assert_eq!((n_bytes, n_text), (0, 0));
}
