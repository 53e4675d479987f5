//! The relational sink's PostgreSQL client against hostile servers (issue 13): a fake server
//! (tests/support/pg_fake.rs) that skips SCRAM's proof, asks for the password in clear or as MD5, streams
//! rows forever, drips its answers, sends malformed rows and absurd lengths.
//!
//! Each case asserts the secure outcome, a clear Display error, and that no secret appears in
//! any output: `svc test-sink`'s stdout/stderr, the error text, and every byte the fake
//! received. The fake itself is proven right with `psql`, which completes its SCRAM exchange
//! and refuses its impostor variants.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::pg_fake::{
    data_row, error_response, frame, scram_server, Fake, Peer, ScramEnd,
};
use crate::support::process::*;
use crate::support::*;
use serde_json::json;
use svc::db::postgres::{
    AuthPolicy, ChannelBindingMode, ConnectParams, Connection, TlsMode, MAX_ROWS_PER_STATEMENT,
};

const PASSWORD: &str = "Hostile-Test-s3cret-9f2";
const PASSWORD_ENV: &str = "SVC_HOSTILE_PG_PASSWORD";
const USER: &str = "app";

/// Every form of the secret an impostor could collect: the password, and the MD5 answer and
/// its inner hash (both replayable or crackable offline).
fn secret_forms(salt: [u8; 4]) -> Vec<String> {
    use md5::{Digest, Md5};
    let inner = format!("{:x}", Md5::digest(format!("{PASSWORD}{USER}").as_bytes()));
    vec![
        PASSWORD.to_string(),
        inner,
        svc::db::postgres::auth::md5_password(USER, PASSWORD.as_bytes(), &salt),
    ]
}

fn assert_no_secret(what: &str, text: &[u8], salt: [u8; 4]) {
    let text = String::from_utf8_lossy(text);
    for s in secret_forms(salt) {
        assert!(!text.contains(&s), "{what} holds a secret form: {text}");
    }
}

/// Runs `svc test-sink` against the fake with extra sink fields: (exit code, stdout, stderr,
/// elapsed).
fn test_sink(port: u16, extra: serde_json::Value) -> (i32, String, String, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = json!({
        "type": "relational_db",
        "dsn": format!("postgresql://{USER}@127.0.0.1:{port}/appdb"),
        "password_env": PASSWORD_ENV,
        "tls_mode": "disable",
        "table": "events",
        "connect_timeout_seconds": 5,
    });
    for (k, v) in extra.as_object().unwrap() {
        sink[k] = v.clone();
    }
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({"nats": {"url": "nats://127.0.0.1:1", "stream": "S", "consumer": "c",
                         "subject": "a.>"},
                "sink": sink}),
    );
    let start = Instant::now();
    // The password goes to the child only: the test process's environment is shared.
    let (code, out, err) = svc_with_env(
        &["test-sink", cfg.to_str().unwrap()],
        &[(PASSWORD_ENV, PASSWORD)],
    );
    (code, out, err, start.elapsed())
}

fn params(port: u16, require_auth: &str) -> ConnectParams {
    ConnectParams {
        host: "127.0.0.1".into(),
        port,
        user: USER.into(),
        database: "appdb".into(),
        application_name: "svc-hostile".into(),
        tls: TlsMode::Disable,
        tls_config: None,
        require_auth: AuthPolicy::parse(require_auth).unwrap(),
        channel_binding: ChannelBindingMode::Prefer,
        scram_min_iterations: 4096,
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(5),
    }
}

/// True when the client sent a query or an extended-protocol message (after startup).
fn sent_any_statement(received: &[u8]) -> bool {
    let text = String::from_utf8_lossy(received);
    text.contains("INSERT") || text.contains("statement_timeout") || text.contains("ROLLBACK")
}

#[test]
fn fake_scram_server_is_right_psql_completes_it_and_refuses_its_impostors() {
    // psql (libpq) against the honest fake: authentication succeeds and the query runs.
    let fake = Fake::start(|p| {
        p.startup();
        if scram_server(p, PASSWORD, ScramEnd::Honest) {
            p.serve_queries();
        }
    });
    let out = Command::new("psql")
        .arg(format!(
            "host=127.0.0.1 port={} user={USER} dbname=appdb sslmode=disable gssencmode=disable",
            fake.port
        ))
        .args(["-X", "-At", "-c", "SELECT 1"])
        .env("PGPASSWORD", PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("psql (apt-get install postgresql-client)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "psql vs honest fake: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    fake.finish();

    // psql against a wrong password: the fake checks the proof.
    let fake = Fake::start(|p| {
        p.startup();
        scram_server(p, PASSWORD, ScramEnd::Honest);
    });
    let out = Command::new("psql")
        .arg(format!(
            "host=127.0.0.1 port={} user={USER} dbname=appdb sslmode=disable gssencmode=disable",
            fake.port
        ))
        .args(["-X", "-At", "-c", "SELECT 1"])
        .env("PGPASSWORD", "wrong")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("password authentication failed"));
    fake.finish();

    // psql checks the server signature: it refuses the forged one (so the honest fake's
    // signature, which it accepts, is right), and ReadyForQuery without AuthenticationOk.
    // psql 15 (libpq 15, installed here) with default settings does NOT refuse a server that
    // skips SASLFinal and sends AuthenticationOk (measured with this fake). Our client refuses
    // all three (next test).
    for end in [ScramEnd::ForgedSignature, ScramEnd::SkipFinalThenReady] {
        let fake = Fake::start(move |p| {
            p.startup();
            if scram_server(p, PASSWORD, end) {
                p.serve_queries();
            }
        });
        let out = Command::new("psql")
            .arg(format!(
                "host=127.0.0.1 port={} user={USER} dbname=appdb sslmode=disable \
                 gssencmode=disable",
                fake.port
            ))
            .args(["-X", "-At", "-c", "SELECT 1"])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .unwrap();
        assert!(!out.status.success(), "psql accepted the {end:?} impostor");
        let received = fake.finish();
        assert!(
            !String::from_utf8_lossy(&received).contains("SELECT 1"),
            "{end:?}"
        );
    }

    // Our client completes the honest exchange too.
    let fake = Fake::start(|p| {
        p.startup();
        if scram_server(p, PASSWORD, ScramEnd::Honest) {
            p.serve_queries();
        }
    });
    let mut conn = Connection::connect(
        &params(fake.port, "scram-sha-256"),
        Some(PASSWORD.as_bytes()),
    )
    .unwrap();
    assert_eq!(
        conn.simple("SELECT 1").unwrap()[0].rows,
        vec![vec![Some("1".to_string())]]
    );
    drop(conn);
    let received = fake.finish();
    assert_no_secret("bytes sent to an honest scram server", &received, [0; 4]);
}

#[test]
fn scram_impostor_without_the_server_signature_is_refused_before_any_statement() {
    for (end, want) in [
        (
            ScramEnd::SkipFinalThenOk,
            "the server ended scram authentication without proving it knows the password",
        ),
        (
            ScramEnd::SkipFinalThenReady,
            "the server ended startup before authentication completed",
        ),
        (
            ScramEnd::ForgedSignature,
            "scram: server signature does not match (not the expected server)",
        ),
        (
            ScramEnd::OneIteration,
            "scram: the server asks for 1 iterations, fewer than sink.scram_min_iterations \
             (4096); no proof is sent",
        ),
    ] {
        let fake = Fake::start(move |p| {
            p.startup();
            if scram_server(p, PASSWORD, end) {
                p.serve_queries();
            }
        });
        let (code, out, err, _) = test_sink(fake.port, json!({}));
        let received = fake.finish();
        assert_eq!(code, 1, "{end:?}: {out}{err}");
        assert!(
            err.contains("Sink relational_db is NOT usable") && err.contains(want),
            "{end:?}: {err}"
        );
        assert!(!sent_any_statement(&received), "{end:?}: probe sent");
        if end == ScramEnd::OneIteration {
            assert!(
                !String::from_utf8_lossy(&received).contains(",p="),
                "a client-final proof was sent for one iteration"
            );
        }
        for (what, text) in [("stdout", out.as_bytes()), ("stderr", err.as_bytes())] {
            assert_no_secret(what, text, [0; 4]);
        }
        assert_no_secret("bytes sent to the impostor", &received, [0; 4]);
    }
}

#[test]
fn cleartext_and_md5_requests_are_refused_by_default_and_nothing_is_sent() {
    let salt = [0x5a, 0x01, 0xfe, 0x33];
    let cases: [(&str, Vec<u8>, &str); 3] = [
        (
            "cleartext",
            frame(b'R', &3i32.to_be_bytes()),
            "the server asked for password authentication, which sink.require_auth \
             (scram-sha-256) does not allow; nothing was sent",
        ),
        (
            "md5",
            frame(b'R', &[&5i32.to_be_bytes()[..], &salt].concat()),
            "the server asked for md5 authentication, which sink.require_auth \
             (scram-sha-256) does not allow; nothing was sent",
        ),
        (
            "trust",
            [
                frame(b'R', &0i32.to_be_bytes()),
                crate::support::pg_fake::after_auth(),
            ]
            .concat(),
            "the server asked for no authentication (trust), which sink.require_auth \
             (scram-sha-256) does not allow; nothing was sent",
        ),
    ];
    for (name, request, want) in cases {
        let fake = Fake::start(move |p| {
            p.startup();
            p.raw(&request);
        });
        let (code, out, err, _) = test_sink(fake.port, json!({}));
        let received = fake.finish();
        assert_eq!(code, 1, "{name}: {out}{err}");
        assert!(err.contains(want), "{name}: {err}");
        // Only the startup packet went out: no PasswordMessage ('p'), nothing after it.
        let startup_len = i32::from_be_bytes(received[..4].try_into().unwrap()) as usize;
        assert_eq!(received.len(), startup_len, "{name}: bytes after startup");
        for (what, text) in [
            ("stdout", out.as_bytes()),
            ("stderr", err.as_bytes()),
            ("received", &received),
        ] {
            assert_no_secret(&format!("{name} {what}"), text, salt);
        }
    }

    // Control: when allowed, the same requests are answered (so the assertions above could
    // fail): cleartext carries the password itself; md5 its salted hash.
    for (policy, request, secret) in [
        (
            "password",
            frame(b'R', &3i32.to_be_bytes()),
            PASSWORD.to_string(),
        ),
        (
            "md5",
            frame(b'R', &[&5i32.to_be_bytes()[..], &salt].concat()),
            secret_forms(salt)[2].clone(),
        ),
    ] {
        let fake = Fake::start(move |p| {
            p.startup();
            p.raw(&request);
            if p.read_msg().is_some() {
                p.ready();
                p.serve_queries();
            }
        });
        let mut conn =
            Connection::connect(&params(fake.port, policy), Some(PASSWORD.as_bytes())).unwrap();
        conn.simple("SELECT 1").unwrap();
        drop(conn);
        let received = fake.finish();
        assert!(
            String::from_utf8_lossy(&received).contains(&secret),
            "{policy}: the control did not see the answer"
        );
    }
}

/// A server that answers the first statement with rows forever. Returns how many it managed
/// to send before the client went away.
fn endless_rows(p: &mut Peer) -> usize {
    p.startup();
    p.ready();
    let _ = p.read_msg(); // the query
    let row = data_row(&[Some(b"0123456789abcdef0123456789abcdef")]);
    let chunk: Vec<u8> = (0..256).flat_map(|_| row.iter().copied()).collect();
    let mut sent = 0;
    while p.raw(&chunk) {
        sent += 256;
        if sent > 50 * MAX_ROWS_PER_STATEMENT {
            break; // the client never stopped reading: the test fails below
        }
    }
    sent
}

#[test]
fn endless_rows_end_in_an_error_not_in_unbounded_memory() {
    let (tx, rx) = std::sync::mpsc::channel();
    let fake = Fake::start(move |p| {
        tx.send(endless_rows(p)).unwrap();
    });
    let mut conn = Connection::connect(&params(fake.port, "none"), None).unwrap();
    let err = conn.simple("SELECT * FROM forever").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "protocol: the server sent more than {MAX_ROWS_PER_STATEMENT} rows or 16777216 bytes \
             for one statement"
        )
    );
    assert!(conn.is_broken());
    let after = conn.simple("SELECT 1").unwrap_err();
    assert_eq!(after.to_string(), "connection: connection is broken");
    drop(conn);
    let sent = rx.recv().unwrap();
    // The client stopped at the cap: what the server got out is the cap plus what the socket
    // buffers held, far from the 50x the fake would have sent to a client that kept reading.
    assert!(
        sent < 10 * MAX_ROWS_PER_STATEMENT,
        "server sent {sent} rows"
    );
    let received = fake.finish();
    // Nothing was written after the violation: no Terminate, no second query.
    let text = String::from_utf8_lossy(&received);
    assert!(text.ends_with("SELECT * FROM forever\0"), "{text:?}");
}

#[test]
fn a_dripped_handshake_fails_at_the_connect_deadline() {
    // 1 byte per 200 ms: the ~120 bytes of AuthenticationOk + parameters + ReadyForQuery would
    // take ~24 s; connect_timeout_seconds is 1.
    let fake = Fake::start(|p| {
        p.startup();
        let mut all = frame(b'R', &0i32.to_be_bytes());
        all.extend(crate::support::pg_fake::after_auth());
        assert!(all.len() > 100);
        p.drip(&all, Duration::from_millis(200));
    });
    let (code, out, err, elapsed) = test_sink(
        fake.port,
        json!({"connect_timeout_seconds": 1, "require_auth": "none"}),
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("connection: read: timed out"), "{err}");
    // Deadline 1 s plus a generous margin for a loaded machine; far below the drip's 24 s.
    assert!(elapsed < Duration::from_secs(12), "{elapsed:?}");
    assert_no_secret("stderr", err.as_bytes(), [0; 4]);
    fake.finish();
}

#[test]
fn a_dripped_statement_answer_fails_at_the_operation_deadline() {
    let fake = Fake::start(|p| {
        p.startup();
        p.ready();
        let _ = p.read_msg();
        let mut answer = Vec::new();
        for _ in 0..20 {
            answer.extend(data_row(&[Some(b"x")]));
        }
        answer.extend(frame(b'C', b"SELECT 20\0"));
        answer.extend(frame(b'Z', b"I"));
        p.drip(&answer, Duration::from_millis(200)); // ~60 s in all
    });
    let mut p = params(fake.port, "none");
    p.io_timeout = Duration::from_secs(2);
    let mut conn = Connection::connect(&p, None).unwrap();
    let start = Instant::now();
    let err = conn.simple("SELECT x").unwrap_err();
    let elapsed = start.elapsed();
    assert_eq!(err.to_string(), "connection: read: timed out");
    assert!(conn.is_broken());
    assert!(elapsed < Duration::from_secs(15), "{elapsed:?}");
    drop(conn);
    let received = fake.finish();
    assert!(String::from_utf8_lossy(&received).ends_with("SELECT x\0"));
}

/// A server that answers the first query with `reply`; returns the bytes the client sent.
fn one_reply(reply: Vec<u8>, sql: &str) -> (String, bool, Vec<u8>) {
    let fake = Fake::start(move |p| {
        p.startup();
        p.ready();
        let _ = p.read_msg();
        p.raw(&reply);
    });
    let mut conn = Connection::connect(&params(fake.port, "none"), None).unwrap();
    let err = conn.simple(sql).unwrap_err().to_string();
    let broken = conn.is_broken();
    drop(conn);
    (err, broken, fake.finish())
}

#[test]
fn malformed_data_rows_and_huge_lengths_break_the_connection() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "row shorter than its columns",
            frame(b'D', &[0, 3, 0, 0, 0, 1, b'a']),
            "protocol: data row shorter than its column count",
        ),
        (
            "column length past the end",
            frame(b'D', &[0, 1, 0, 0, 0, 99, b'a']),
            "protocol: truncated message",
        ),
        (
            "negative column length",
            frame(b'D', &[0, 1, 0xff, 0xff, 0xff, 0x00]),
            "protocol: negative column length",
        ),
        (
            "huge length prefix",
            b"D\x7f\xff\xff\xff".to_vec(),
            "protocol: message length 2147483647 is outside 4 to 1048580 bytes",
        ),
        (
            "unknown message",
            frame(b'!', b""),
            "protocol: unknown message type 0x21",
        ),
    ];
    for (name, reply, want) in cases {
        let start = Instant::now();
        let (err, broken, received) = one_reply(reply, "SELECT 1");
        assert_eq!(err, want, "{name}");
        assert!(broken, "{name}");
        assert!(start.elapsed() < Duration::from_secs(10), "{name}");
        // Never written again: the last bytes the client sent are the query itself.
        assert!(
            String::from_utf8_lossy(&received).ends_with("SELECT 1\0"),
            "{name}"
        );
    }

    // A huge length during startup: refused the same way, within the connect deadline.
    let fake = Fake::start(|p| {
        p.startup();
        p.raw(b"R\x7f\xff\xff\xf0");
    });
    let err = Connection::connect(&params(fake.port, "none"), None)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("message length 2147483632"),
        "{err}"
    );
    let received = fake.finish();
    let startup_len = i32::from_be_bytes(received[..4].try_into().unwrap()) as usize;
    assert_eq!(
        received.len(),
        startup_len,
        "no Terminate after a violation"
    );
}

#[test]
fn server_text_in_errors_is_bounded_and_escaped() {
    // A FATAL authentication error whose message forges a log line and runs for 1 MB... capped.
    let long = format!("no such role\nERROR forged line {}", "A".repeat(900_000));
    let fake = Fake::start(move |p| {
        p.startup();
        p.raw(&error_response("FATAL", "28000", &long));
    });
    let (code, out, err, _) = test_sink(fake.port, json!({}));
    fake.finish();
    assert_eq!(code, 1, "{out}");
    let line = err
        .lines()
        .find(|l| l.contains("28000"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("no such role\\nERROR forged line AAAA"),
        "{line}"
    );
    assert!(line.len() < 1024, "{}", line.len());
    assert!(!err.contains("\nERROR forged"));

    // A SASL mechanism list with control characters and no usable mechanism.
    let mut body = 10i32.to_be_bytes().to_vec();
    body.extend_from_slice(b"EVIL\x1b[31m\nMECH\0OTHER\0\0");
    let fake = Fake::start(move |p| {
        p.startup();
        p.send(b'R', &body);
    });
    let err = Connection::connect(
        &params(fake.port, "scram-sha-256"),
        Some(PASSWORD.as_bytes()),
    )
    .err()
    .unwrap()
    .to_string();
    fake.finish();
    assert_eq!(
        err,
        "protocol: server offers only unsupported sasl mechanisms: EVIL\\u{1b}[31m\\nMECH, OTHER"
    );
}

#[test]
fn a_protocol_error_inside_a_batch_is_never_followed_by_rollback_or_terminate() {
    // The sink itself: BEGIN succeeds, the batch INSERT gets a malformed reply. The old client
    // then sent ROLLBACK on a connection one reply out of step.
    let fake = Fake::start(|p| {
        p.startup();
        p.ready();
        // SET statement_timeout; SHOW synchronous_commit
        let _ = p.read_msg();
        let mut out = frame(b'C', b"SET\0");
        out.extend(crate::support::pg_fake::row_description());
        out.extend(data_row(&[Some(b"on")]));
        out.extend(frame(b'C', b"SHOW\0"));
        out.extend(frame(b'Z', b"I"));
        p.raw(&out);
        let _ = p.read_msg(); // BEGIN
        p.raw(&[frame(b'C', b"BEGIN\0"), frame(b'Z', b"T")].concat());
        // Parse, Bind, Execute, Sync of the INSERT: read up to Sync.
        while let Some((tag, _)) = p.read_msg() {
            if tag == b'S' {
                break;
            }
        }
        p.raw(&[frame(b'1', b""), frame(b'2', b""), frame(b'D', &[0, 9])].concat());
    });
    let cfg = svc::config::RuntimeConfig::parse(
        &json!({"nats": {"url": "nats://127.0.0.1:1", "stream": "S", "consumer": "c",
                         "subject": "a.>"},
                "sink": {"type": "relational_db", "require_auth": "none", "tls_mode": "disable",
                         "dsn": format!("postgresql://{USER}@127.0.0.1:{}/appdb", fake.port),
                         "table": "events"}})
        .to_string(),
    )
    .unwrap();
    let svc::sink::SinkConfig::RelationalDb(rc) = cfg.sink else {
        panic!("not a relational sink")
    };
    let sink =
        svc::sink::relational::RelationalSink::new(rc, Arc::new(svc::metrics::Metrics::default()))
            .unwrap();
    let env = svc::message::envelope::normalize(
        &svc::message::envelope::RawMessage {
            stream: "S".into(),
            consumer: "c".into(),
            ..svc::message::envelope::RawMessage::sample("a.b", 1, b"{}")
        },
        svc::message::envelope::now_unix_nanos(),
        &svc::message::envelope::EnvelopeConfig::default(),
    )
    .0;
    let outcomes = svc::sink::Sink::write_batch(&sink, &[env]);
    let shown = match &outcomes[0] {
        svc::sink::WriteOutcome::Transient(e) => e.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(
        shown.contains("write batch (nothing committed)")
            && shown.contains("protocol: data row shorter than its column count"),
        "{shown}"
    );
    drop(sink);
    let received = fake.finish();
    let text = String::from_utf8_lossy(&received);
    assert!(
        !text.contains("ROLLBACK"),
        "ROLLBACK sent on a broken connection"
    );
    // The last message the client sent is the INSERT's Sync: no Terminate after it.
    assert!(received.ends_with(b"S\0\0\0\x04"), "{text:?}");
}

#[test]
fn server_parameters_are_capped_and_only_accepted_after_authentication() {
    // An endless stream of distinct ParameterStatus messages after AuthenticationOk.
    let fake = Fake::start(|p| {
        p.startup();
        p.send(b'R', &0i32.to_be_bytes());
        for i in 0..100_000 {
            if !p.send(b'S', format!("param_{i}\0value\0").as_bytes()) {
                break;
            }
        }
    });
    let err = Connection::connect(&params(fake.port, "none"), None)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "protocol: the server sent more than 64 parameters"
    );
    fake.finish();

    // One oversized parameter.
    let fake = Fake::start(|p| {
        p.startup();
        p.send(b'R', &0i32.to_be_bytes());
        p.send(b'S', format!("big\0{}\0", "v".repeat(10_000)).as_bytes());
    });
    let err = Connection::connect(&params(fake.port, "none"), None)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "protocol: parameter status larger than 4096 bytes"
    );
    fake.finish();

    // ParameterStatus while SCRAM is still running: refused, the exchange goes no further.
    let fake = Fake::start(|p| {
        p.startup();
        p.send(
            b'R',
            &[&10i32.to_be_bytes()[..], b"SCRAM-SHA-256\0\0"].concat(),
        );
        let _ = p.read_msg();
        p.send(b'S', b"server_version\x0099\0");
    });
    let err = Connection::connect(
        &params(fake.port, "scram-sha-256"),
        Some(PASSWORD.as_bytes()),
    )
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "protocol: parameter status before authentication completed"
    );
    let received = fake.finish();
    assert_no_secret("received", &received, [0; 4]);
}

#[test]
fn a_server_switching_methods_mid_exchange_gets_nothing() {
    // SCRAM started, then a cleartext request: even with password allowed, a second method in
    // one startup is out of order (a relay trying to downgrade the exchange).
    let fake = Fake::start(|p| {
        p.startup();
        p.send(
            b'R',
            &[&10i32.to_be_bytes()[..], b"SCRAM-SHA-256\0\0"].concat(),
        );
        let _ = p.read_msg(); // client-first
        p.send(b'R', &3i32.to_be_bytes());
    });
    let err = Connection::connect(
        &params(fake.port, "scram-sha-256,password"),
        Some(PASSWORD.as_bytes()),
    )
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "protocol: authentication request cleartext password out of order (after the scram \
         client-first message)"
    );
    let received = fake.finish();
    assert_no_secret("received", &received, [0; 4]);

    // A SASLFinal nobody asked for.
    let fake = Fake::start(|p| {
        p.startup();
        p.send(b'R', &[&12i32.to_be_bytes()[..], b"v=AAAA"].concat());
    });
    let err = Connection::connect(
        &params(fake.port, "scram-sha-256"),
        Some(PASSWORD.as_bytes()),
    )
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "protocol: authentication request sasl final out of order (before any exchange)"
    );
    fake.finish();
}

#[test]
fn a_server_refusing_tls_gets_no_plaintext_startup() {
    // verify_full: the server answers the SSLRequest with `N` (or garbage). The client must not
    // fall back to plaintext: after the 8-byte SSLRequest it sends nothing at all.
    for answer in [&b"N"[..], &b"E"[..]] {
        let fake = Fake::start(move |p| {
            let mut req = [0u8; 8];
            assert!(p.read_exact(&mut req));
            assert_eq!(req, [0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f], "SSLRequest");
            p.raw(answer);
        });
        let (code, out, err, _) = test_sink(
            fake.port,
            json!({"tls_mode": "verify_full", "dsn": format!(
                "postgresql://{USER}@localhost:{}/appdb", fake.port)}),
        );
        let received = fake.finish();
        assert_eq!(code, 1, "{out}{err}");
        let want = if answer == b"N" {
            "connection: server does not accept tls (tls_mode verify_full requires it)"
        } else {
            "protocol: unexpected answer to the tls request"
        };
        assert!(err.contains(want), "{err}");
        assert_eq!(received.len(), 8, "only the SSLRequest went out");
        assert_no_secret("stderr", err.as_bytes(), [0; 4]);
    }
}

#[test]
fn channel_binding_over_tls_against_a_fake_that_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::certs::make_certs(dir.path());
    let hash = crate::support::pg_fake::cert_hash(dir.path());
    let tls_params = |port: u16, mode: ChannelBindingMode| ConnectParams {
        host: "localhost".into(),
        tls: TlsMode::VerifyFull,
        tls_config: Some(
            svc::db::postgres::tls_client_config(Some(&dir.path().join("ca.pem"))).unwrap(),
        ),
        channel_binding: mode,
        ..params(port, "scram-sha-256")
    };
    let both: &'static [&'static str] = &["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"];
    let plain_only: &'static [&'static str] = &["SCRAM-SHA-256"];

    // (mechanisms offered, client mode, expected GS2 header or refusal)
    let cases: [(&[&str], ChannelBindingMode, Result<&str, &str>); 5] = [
        (
            both,
            ChannelBindingMode::Prefer,
            Ok("p=tls-server-end-point,,"),
        ),
        (
            both,
            ChannelBindingMode::Require,
            Ok("p=tls-server-end-point,,"),
        ),
        (both, ChannelBindingMode::Disable, Ok("n,,")),
        (plain_only, ChannelBindingMode::Prefer, Ok("y,,")),
        (
            plain_only,
            ChannelBindingMode::Require,
            Err(
                "protocol: sink.channel_binding require: the server does not offer \
                 SCRAM-SHA-256-PLUS (offers: SCRAM-SHA-256); nothing was sent",
            ),
        ),
    ];
    for (offered, mode, want) in cases {
        let h = hash.clone();
        let fake = Fake::start_tls(dir.path(), move |p| {
            p.startup();
            if crate::support::pg_fake::scram_server_with(
                p,
                PASSWORD,
                ScramEnd::Honest,
                offered,
                Some(&h),
            ) {
                p.serve_queries();
            }
        });
        let res = Connection::connect(&tls_params(fake.port, mode), Some(PASSWORD.as_bytes()));
        match (res, want) {
            (Ok(mut conn), Ok(gs2)) => {
                conn.simple("SELECT 1").unwrap();
                drop(conn);
                let received = String::from_utf8_lossy(&fake.finish()).into_owned();
                assert!(
                    received.contains(&format!("{gs2}n=,r=")),
                    "{offered:?} {mode:?}: {received:?}"
                );
            }
            (Err(e), Err(msg)) => {
                assert_eq!(e.to_string(), msg);
                let received = fake.finish();
                assert!(
                    !String::from_utf8_lossy(&received).contains("n=,r="),
                    "client-first sent"
                );
            }
            (res, want) => panic!(
                "{offered:?} {mode:?}: got {:?}, want {want:?}",
                res.map(|_| ()).map_err(|e| e.to_string())
            ),
        }
    }
}
