//! `logging.format` and `logging.timestamps` as an operator sees them: the real runner's
//! stderr. JSON lines parse and name time, level, thread, target and message; the text format
//! drops its own timestamp only when stderr is the stream `JOURNAL_STREAM` names.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::broker::*;
use crate::support::process::*;
use crate::support::*;
use serde_json::json;

/// A config whose broker refuses connections: `svc run` logs one ERROR line and exits 1.
fn unreachable(dir: &Path, logging: serde_json::Value) -> std::path::PathBuf {
    write_config(
        dir,
        "c.json",
        &json!({
            "nats": {"url": format!("nats://127.0.0.1:{}", free_port()), "stream": "S",
                     "consumer": "c", "subject": "a.>"},
            "sink": {"type": "file", "directory": dir.join("out")},
            "logging": logging
        }),
    )
}

/// Runs `svc run cfg` with stderr into `log`, `JOURNAL_STREAM` as given; returns stderr.
fn run_into(cfg: &Path, log: &Path, journal: Option<&str>) -> String {
    let err = std::fs::File::create(log).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_svc"));
    cmd.arg("run")
        .arg(cfg)
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::null())
        .stderr(err);
    if let Some(v) = journal {
        cmd.env("JOURNAL_STREAM", v);
    }
    let status = cmd.status().unwrap();
    assert_eq!(status.code(), Some(1));
    std::fs::read_to_string(log).unwrap()
}

fn dev_ino(p: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).unwrap();
    format!("{}:{}", m.dev(), m.ino())
}

fn log_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_else(|| panic!("no ERROR line in {stderr}"))
}

fn starts_with_timestamp(line: &str) -> bool {
    // 2026-11-22T00:28:51.803Z
    let b = line.as_bytes();
    b.len() > 24 && b[4] == b'-' && b[10] == b'T' && b[23] == b'Z' && b[24] == b' '
}

#[test]
fn text_timestamps_follow_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("err.log");
    // auto (the default), stderr not the journal: stamped.
    let cfg = unreachable(dir.path(), json!({"level": "info"}));
    let text = run_into(&cfg, &log, None);
    let line = log_line(&text);
    assert!(starts_with_timestamp(line), "{line}");
    assert!(line.contains(" ERROR [main] broker: connect:"), "{line}");

    // auto, JOURNAL_STREAM names this very file (as systemd sets it for the journal socket):
    // the journal stamps the line, so the runner does not.
    let _ = std::fs::File::create(&log).unwrap();
    let here = dev_ino(&log);
    let text = run_into(&cfg, &log, Some(&here));
    assert!(
        log_line(&text).starts_with("ERROR [main] broker: connect:"),
        "{text}"
    );

    // Inherited by a process whose stderr went elsewhere: the variable names another file.
    let other = dir.path().join("other");
    std::fs::write(&other, b"").unwrap();
    let text = run_into(&cfg, &log, Some(&dev_ino(&other)));
    assert!(starts_with_timestamp(log_line(&text)), "{text}");
    let text = run_into(&cfg, &log, Some("not a stream"));
    assert!(starts_with_timestamp(log_line(&text)), "{text}");

    // The explicit switches win over detection.
    let cfg = unreachable(dir.path(), json!({"timestamps": "always"}));
    let _ = std::fs::File::create(&log).unwrap();
    let text = run_into(&cfg, &log, Some(&dev_ino(&log)));
    assert!(starts_with_timestamp(log_line(&text)), "{text}");
    let cfg = unreachable(dir.path(), json!({"timestamps": "never"}));
    let text = run_into(&cfg, &log, None);
    assert!(log_line(&text).starts_with("ERROR [main] "), "{text}");
}

/// The journal's case exactly: stderr is a stream socket and `JOURNAL_STREAM` names it.
#[test]
fn text_timestamps_dropped_when_stderr_is_the_named_socket() {
    use std::io::Read;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixStream;

    let dir = tempfile::tempdir().unwrap();
    let cfg = unreachable(dir.path(), json!({"level": "info"}));
    for named in [true, false] {
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let m = std::fs::metadata(format!("/proc/self/fd/{}", theirs.as_raw_fd())).unwrap();
        let stream = if named {
            format!("{}:{}", m.dev(), m.ino())
        } else {
            format!("{}:{}", m.dev(), m.ino() + 1)
        };
        let status = Command::new(env!("CARGO_BIN_EXE_svc"))
            .arg("run")
            .arg(&cfg)
            .env_remove("RUST_LOG")
            .env("JOURNAL_STREAM", stream)
            .stdout(Stdio::null())
            .stderr(Stdio::from(OwnedFd::from(theirs)))
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(1));
        let mut text = String::new();
        ours.read_to_string(&mut text).unwrap();
        let line = log_line(&text);
        if named {
            assert!(line.starts_with("ERROR [main] broker: connect:"), "{text}");
        } else {
            assert!(starts_with_timestamp(line), "{text}");
        }
    }
}

#[test]
fn bad_logging_values_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = unreachable(
        dir.path(),
        json!({"format": "xml", "timestamps": "sometimes", "colour": true}),
    );
    let (code, _, err) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("logging.format: must be one of: text, json"),
        "{err}"
    );
    assert!(
        err.contains("logging.timestamps: must be one of: auto, always, never"),
        "{err}"
    );
    assert!(err.contains("logging.colour"), "{err}");
}

#[test]
fn json_lines_from_the_running_pipeline() {
    let server = NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(30));
    let n = 20;
    server.publish_n("ORDERS", "orders.created", n, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // A regular file where the key namespace directory must go: writes fail, so the sink
    // workers warn and svc-ack logs its NAK decisions (debug) until the blocker goes.
    let blocker = out.join("idempotency-key");
    std::fs::write(&blocker, b"in the way").unwrap();
    let snap = dir.path().join("metrics.json");
    let cfg = write_config(
        dir.path(),
        "c.json",
        &json!({
            "nats": {"url": server.url(), "stream": "ORDERS", "consumer": "svc",
                     "subject": "orders.>"},
            "delivery": {"batch_size": 8, "fetch_expiry_ms": 200,
                         "nak_backoff": {"mode": "fixed", "initial_ms": 100, "jitter": "none"}},
            "sink": {"type": "file", "directory": out},
            "metrics": {"enabled": true, "snapshot_file": snap, "write_interval_seconds": 1},
            "logging": {"level": "debug", "format": "json"}
        }),
    );
    let log = dir.path().join("svc.log");
    let err = std::fs::File::create(&log).unwrap();
    let mut runner = Runner {
        child: Command::new(env!("CARGO_BIN_EXE_svc"))
            .arg("run")
            .arg(&cfg)
            .env_remove("RUST_LOG")
            // Even under the journal, JSON keeps its time field.
            .env("JOURNAL_STREAM", dev_ino(&log))
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap(),
        log: log.clone(),
    };
    wait_until(Duration::from_secs(20), "NAKs after write errors", || {
        snapshot_counter(&snap, "messages_nacked_total") >= n as u64
    });
    std::fs::remove_file(&blocker).unwrap();
    wait_until(Duration::from_secs(30), "every message acked", || {
        server.try_consumer_state("ORDERS", "svc") == Some((n as u64, 0, 0))
    });
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(15)).unwrap();
    assert!(status.success());

    let text = runner.log_text();
    let mut threads = std::collections::BTreeSet::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let obj = v.as_object().unwrap();
        let keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
        assert_eq!(keys.len(), 5, "{line}");
        for k in ["time", "level", "thread", "target", "message"] {
            assert!(obj[k].is_string(), "{k} in {line}");
        }
        assert!(starts_with_timestamp(&format!(
            "{} ",
            v["time"].as_str().unwrap()
        )));
        assert!(["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&v["level"].as_str().unwrap()));
        assert!(!v["target"].as_str().unwrap().is_empty(), "{line}");
        threads.insert(v["thread"].as_str().unwrap().to_string());
    }
    for t in ["svc-ack", "svc-sink-1", "main"] {
        assert!(threads.contains(t), "no line from {t}: {threads:?}\n{text}");
    }
    let ack = text
        .lines()
        .find(|l| l.contains("\"thread\":\"svc-ack\""))
        .unwrap();
    assert!(ack.contains("not written, will retry"), "{ack}");
    assert!(text.contains("pipeline drained"), "{text}");
}
