//! What the integration tests share, one module per outside party: the broker
//! ([`broker`], [`cluster`]), the built binaries ([`process`]), PostgreSQL ([`postgres`], and the
//! hostile [`pg_fake`]), moto ([`moto`]), strict HTTP fakes ([`http`]), push receivers
//! ([`push`]), the exporter's helpers ([`observe`]), payload protection's Python twin
//! ([`protection`]), the test PKI ([`certs`]), a second account ([`accounts`]), the shipped
//! kit ([`kit`]). Loopback networking ([`net`]) is plain `std` so the benches include it too.
//!
//! Python helpers live beside the modules that run them (`moto_helper.py`,
//! `protection_helper.py`, `receivers/*.py`); [`python`] finds the interpreter and them.

pub mod accounts;
pub mod broker;
pub mod certs;
pub mod cluster;
pub mod crash;
pub mod http;
pub mod kit;
pub mod mariadb_private;
pub mod moto;
pub mod mysql;
pub mod mysql_fake;
pub mod net;
pub mod observe;
pub mod pg_fake;
pub mod postgres;
pub mod process;
pub mod protection;
pub mod push;
pub mod python;
pub mod receiver;
mod temp;

use std::path::{Path, PathBuf};

pub use net::{free_port, http_get, wait_until};
pub use temp::TempDir;

/// Writes a JSON config file into `dir` and returns its path. A valid config is also checked
/// to survive `svc show-effective-config` (see [`assert_effective_round_trip`]), so every
/// config the suite uses proves the round trip.
pub fn write_config(dir: &Path, name: &str, value: &serde_json::Value) -> PathBuf {
    let p = dir.join(name);
    let text = serde_json::to_string_pretty(value).unwrap();
    assert_effective_round_trip(&text);
    std::fs::write(&p, &text).unwrap();
    p
}

/// A valid config's effective form (every default filled in) is valid, reads back to the same
/// configuration (unless it redacted a value: a URL's query, a secret-named header), and
/// prints the same bytes again. Invalid configs are left to their test.
pub fn assert_effective_round_trip(text: &str) {
    use svc::config::{effective_json, RuntimeConfig};
    let Ok(cfg) = RuntimeConfig::parse(text) else {
        return;
    };
    let once = effective_json(text).unwrap_or_else(|e| panic!("effective config: {e}\n{text}"));
    let back = RuntimeConfig::parse(&once)
        .unwrap_or_else(|e| panic!("the effective config is invalid: {e}\n{once}"));
    assert!(
        back == cfg || once.contains("<redacted>"),
        "the effective config reads back differently:\n{once}"
    );
    assert_eq!(
        effective_json(&once).unwrap(),
        once,
        "show-effective-config of its own output"
    );
}

/// Every regular file below `dir` (recursive), relative paths, sorted.
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Reads a counter from a snapshot file (0 when absent).
pub fn snapshot_counter(path: &Path, name: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["counters"][name].as_u64())
        .unwrap_or(0)
}

/// Panics when a line of `text` holds any 10-character piece of a secret: a dependency that
/// hex-dumps request bytes prints them 16 to a row, so a whole secret never shows on one line
/// while every one of its rows does.
pub fn assert_no_secret_piece(text: &str, secrets: &[&str]) {
    const PIECE: usize = 10;
    for secret in secrets {
        let chars: Vec<char> = secret.chars().collect();
        assert!(
            chars.len() >= PIECE,
            "a secret too short to test: {} chars",
            chars.len()
        );
        for piece in chars.windows(PIECE) {
            let piece: String = piece.iter().collect();
            if let Some(line) = text.lines().find(|l| l.contains(&piece)) {
                panic!("a piece of a secret ({piece}) in: {line}");
            }
        }
    }
}
