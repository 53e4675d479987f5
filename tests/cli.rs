//! `svc validate`, `svc test-sink`, `--help`, `--version`: exact outputs and exit codes.

use crate::support::process::*;
use crate::support::*;
use serde_json::json;

fn valid(dir: &std::path::Path) -> serde_json::Value {
    json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"},
        "sink": {"type": "file", "directory": dir.join("out")}
    })
}

#[test]
fn validate_prints_the_three_lines() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "c.json", &valid(dir.path()));
    let (code, out, err) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "Configuration is valid.\nActive sink: file\nACK policy: commit-then-acknowledge\n\n\
         Consumes stream ORDERS through durable consumer svc filtered on orders.>; the \
         consumer must already exist. Writes to a file sink. Protections: none. No dead-letter queue (permanent \
         failures are left to the broker's limits). No metrics snapshot.\n"
    );
    assert!(
        !dir.path().join("out").exists(),
        "validate never touches the destination"
    );
}

#[test]
fn validate_lists_every_problem_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = valid(dir.path());
    c["nats"]["url"] = json!("nats://admin:s3cr3t-pw@broker:4222");
    c["delivery"] = json!({"batch_size": 0});
    c["colour"] = json!("blue");
    let cfg = write_config(dir.path(), "c.json", &c);
    let (code, out, err) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert_eq!(out, "");
    assert_eq!(
        err,
        "Configuration is invalid (3 problems):\n  \
         nats.url: must not contain credentials; use nats.auth with environment variables\n  \
         delivery.batch_size: must be an integer from 1 to 10000\n  \
         colour: unknown field\n"
    );
    assert!(!err.contains("s3cr3t-pw"), "never echo a secret");
}

#[test]
fn validate_reports_json_syntax_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.json");
    std::fs::write(&p, "{\"nats\": ").unwrap();
    let (code, _, err) = svc(&["validate", p.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("not valid JSON at line 1 column"), "{err}");
    let (code, _, err) = svc(&["validate", "/nonexistent/c.json"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("svc: cannot read /nonexistent/c.json:"),
        "{err}"
    );
}

#[test]
fn test_sink_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "c.json", &valid(dir.path()));
    let (code, out, err) = svc(&["test-sink", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("Sink file is usable: "), "{out}");

    // A regular file where the output directory should be.
    std::fs::write(dir.path().join("blocked"), b"x").unwrap();
    let mut c = valid(dir.path());
    c["sink"]["directory"] = json!(dir.path().join("blocked").join("out"));
    let cfg = write_config(dir.path(), "c2.json", &c);
    let (code, out, err) = svc(&["test-sink", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.starts_with("Sink file is NOT usable: sink file: "),
        "{err}"
    );
}

#[test]
fn usage_errors_help_and_version() {
    let (code, out, _) = svc(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("svc validate <config_file>") && out.contains("EXIT CODES"));
    let (code, out, _) = svc(&["run", "--help"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("Usage: svc run <config_file>"), "{out}");
    let (code, out, _) = svc(&["--version"]);
    assert_eq!(
        (code, out.trim()),
        (0, concat!("svc ", env!("CARGO_PKG_VERSION")))
    );
    let (code, _, err) = svc(&[]);
    assert_eq!(code, 2);
    assert!(err.contains("missing command"), "{err}");
    let (code, _, err) = svc(&["run"]);
    assert_eq!(code, 2);
    assert!(err.contains("run: missing <config_file>"), "{err}");
    let (code, _, err) = svc(&["explode", "x"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown command \"explode\""), "{err}");
}

/// `svc verify-custody ... | head`: a reader that leaves ends the command quietly with the
/// shell's SIGPIPE status, never a panic; so do `--help` and `init-db --print`.
#[test]
fn a_closed_pipe_ends_printing_commands_quietly() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let mut c = valid(dir.path());
    c["custody"] = json!({"enabled": true, "runner_id": "r1"});
    let cfg = write_config(dir.path(), "c.json", &c);
    // Many records, each a report line: more than a pipe holds.
    let records = dir.path().join("records.jsonl");
    std::fs::write(
        &records,
        "{\"stream\":\"S\",\"stream_sequence\":1}\n".repeat(20_000),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let records = records.to_str().unwrap();
    for args in [
        vec!["verify-custody", cfg, records],
        vec!["--help"],
        vec!["validate", cfg],
    ] {
        let (read, write) = std::io::pipe().unwrap();
        drop(read);
        let out = Command::new(env!("CARGO_BIN_EXE_svc"))
            .args(&args)
            .stdout(Stdio::from(write))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}");
        assert_eq!(out.status.code(), Some(141), "{args:?}");
    }
}
