//! PostgreSQL backend messages (src/sink/relational): the database server, or whatever answers
//! on its address, controls every byte the client reads.
//!
//! First input byte even: the rest goes to `codec::decode_backend_messages` (the pure message
//! parser the connection uses), or (bits 1-2) to the SCRAM parsers `auth::parse_server_first`,
//! `auth::parse_server_final` and `auth::saslprep`. Odd: a loopback fake server answers one connection with the
//! rest as its whole side of the conversation (then closes), and the client runs
//! `wire::Connection::connect` (startup and authentication, with the `require_auth` list
//! picked by the selector's bits) and, when that succeeds, `Connection::simple` and
//! `Connection::query`, as the relational sink does.
//! Properties: no panic, no hang; every error renders without control characters and bounded;
//! a session is accepted only after an AuthenticationOk, and never with a method outside the
//! allow-list; the password crosses the socket in clear only when `password` is allowed; a
//! protocol error leaves the connection broken.
#![no_main]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use svc::db::postgres::auth::{
    parse_server_final, parse_server_first, saslprep, MAX_SCRAM_ITERATIONS,
};
use svc::db::postgres::codec::decode_backend_messages;
use svc::db::postgres::{
    AuthPolicy, ChannelBindingMode, ConnectParams, Connection, DbError, TlsMode,
};
use svc_fuzz::{assert_clean_display, split_selector, MAX_ERROR_CHARS};

const PASSWORD: &[u8] = b"pw-Fuzz-Secret-7f3a";

struct Server {
    port: u16,
    scripts: Sender<Vec<u8>>,
    /// What the client sent on each connection.
    seen: Mutex<Receiver<Vec<u8>>>,
}

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = channel::<Vec<u8>>();
        let (seen_tx, seen_rx) = channel::<Vec<u8>>();
        std::thread::Builder::new()
            .name("fuzz-pg-server".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(mut s) = stream else { continue };
                    let Ok(script) = rx.recv() else { return };
                    let _ = s.write_all(&script);
                    let _ = s.shutdown(Shutdown::Write);
                    // Drain until the client closes, so the close is an orderly FIN.
                    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut got = Vec::new();
                    let _ = s.read_to_end(&mut got);
                    let _ = seen_tx.send(got);
                }
            })
            .expect("spawn server");
        Server {
            port,
            scripts: tx,
            seen: Mutex::new(seen_rx),
        }
    })
}

fn check_error(e: &DbError) {
    assert_clean_display("database error", &e.to_string(), MAX_ERROR_CHARS);
}

/// Did the script send AuthenticationOk (`R`, code 0) before its first ReadyForQuery?
fn auth_ok_before_ready(mut b: &[u8]) -> bool {
    while b.len() >= 5 {
        let tag = b[0];
        let len = i32::from_be_bytes([b[1], b[2], b[3], b[4]]);
        if len < 4 || (len as usize) > b.len() - 1 {
            return false;
        }
        let body = &b[5..1 + len as usize];
        match tag {
            b'R' if body.len() >= 4 && body[..4] == [0, 0, 0, 0] => return true,
            b'Z' => return false,
            _ => {}
        }
        b = &b[1 + len as usize..];
    }
    false
}

const CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";

/// SCRAM `server-first-message` (`auth::parse_server_first`): an accepted message extends the
/// client nonce with printable characters and has a salt and a bounded iteration count.
fn scram_server_first(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match parse_server_first(CLIENT_NONCE, text) {
        Ok(f) => {
            assert!(f.nonce.starts_with(CLIENT_NONCE) && f.nonce.len() > CLIENT_NONCE.len());
            assert!(f
                .nonce
                .bytes()
                .all(|b| (0x21..0x7f).contains(&b) && b != b','));
            assert!(!f.salt.is_empty());
            assert!((1..=MAX_SCRAM_ITERATIONS).contains(&f.iterations));
        }
        Err(e) => assert_clean_display("server-first", &e, MAX_ERROR_CHARS),
    }
}

/// SCRAM `server-final-message` (`auth::parse_server_final`) and SASLprep of the bytes as a
/// password (`auth::saslprep`, idempotent on what it changes).
fn scram_server_final(bytes: &[u8]) {
    let prepared = saslprep(bytes);
    assert_eq!(saslprep(&prepared), prepared, "saslprep is idempotent");
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Err(e) = parse_server_final(text) {
        assert_clean_display("server-final", &e, MAX_ERROR_CHARS);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, script)) = split_selector(data) else {
        return;
    };
    if sel & 1 == 0 {
        match (sel >> 1) % 4 {
            2 => scram_server_first(script),
            3 => scram_server_final(script),
            _ => match decode_backend_messages(script) {
                Ok(msgs) => assert!(msgs.len() <= script.len() / 5),
                Err(e) => check_error(&e),
            },
        }
        return;
    }
    let require_auth = AuthPolicy {
        scram_sha_256: sel & 2 == 0,
        md5: sel & 4 != 0,
        password: sel & 8 != 0,
        none: sel & 16 != 0,
    };
    let srv = server();
    srv.scripts.send(script.to_vec()).expect("server alive");
    let params = ConnectParams {
        host: "127.0.0.1".into(),
        port: srv.port,
        user: "svc".into(),
        database: "svc".into(),
        application_name: "svc-fuzz".into(),
        tls: TlsMode::Disable,
        tls_config: None,
        require_auth,
        channel_binding: ChannelBindingMode::Prefer,
        // The floor is tested elsewhere; here cheap iteration counts keep the exchange going.
        scram_min_iterations: 1,
        connect_timeout: Duration::from_secs(10),
        io_timeout: Duration::from_secs(10),
    };
    match Connection::connect(&params, Some(PASSWORD)) {
        Ok(mut conn) => {
            assert!(
                auth_ok_before_ready(script),
                "session accepted without AuthenticationOk"
            );
            for step in 0..2 {
                let r = if step == 0 {
                    conn.simple("SELECT 1").map(|_| ())
                } else {
                    conn.query("SELECT $1, $2", &[Some("a"), None]).map(|_| ())
                };
                if let Err(e) = r {
                    check_error(&e);
                    if matches!(e, DbError::Protocol(_)) {
                        assert!(
                            conn.is_broken(),
                            "protocol error left the connection usable: {e}"
                        );
                    }
                }
                if conn.is_broken() {
                    break;
                }
            }
        }
        Err(e) => check_error(&e),
    }
    let sent = srv.seen.lock().unwrap().recv().expect("server alive");
    if !require_auth.password {
        assert!(
            !sent.windows(PASSWORD.len()).any(|w| w == PASSWORD),
            "the password crossed the socket in clear"
        );
    }
});
