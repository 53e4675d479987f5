//! Operator-facing behaviour of `svc` a newcomer meets first: each command's own help, the
//! command list, configuration problems that point at the fix, the `validate` summary, and a
//! broker failure that names the server and is printed once. No broker is started: the
//! connect test aims at a closed loopback port.

mod util;

use serde_json::json;
use util::*;

const COMMANDS: &[&str] = &[
    "validate",
    "run",
    "test-sink",
    "init-db",
    "decrypt",
    "verify-custody",
];

fn valid(dir: &std::path::Path) -> serde_json::Value {
    json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                 "subject": "orders.>"},
        "sink": {"type": "file", "directory": dir.join("out")}
    })
}

#[test]
fn every_command_has_its_own_help_and_no_command_lists_them_all() {
    for c in COMMANDS {
        let (code, out, err) = svc(&[c, "--help"]);
        assert_eq!(code, 0, "{c}: {err}");
        assert!(
            out.starts_with(&format!("Usage: svc {c} <config_file>")),
            "{c}: {out}"
        );
        assert!(out.contains("Exit codes:"), "{c}: {out}");
        // `svc help <command>` is the same text.
        assert_eq!(svc(&["help", c]).1, out, "{c}");
    }
    let (code, out, _) = svc(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("svc <command> --help"), "{out}");

    let (code, out, err) = svc(&[]);
    assert_eq!((code, out.as_str()), (2, ""));
    for c in COMMANDS {
        assert!(err.contains(c), "{c} missing from: {err}");
    }
    let (code, _, err) = svc(&["valdate", "c.json"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unknown command \"valdate\": one of validate, run,"),
        "{err}"
    );
}

#[test]
fn a_misspelt_field_names_the_field_meant_and_one_problem_reads_singular() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = valid(dir.path());
    c["delivery"] = json!({"batch_sise": 50});
    let cfg = write_config(dir.path(), "c.json", &c);
    let (code, out, err) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert_eq!(
        err,
        "Configuration is invalid (1 problem):\n  \
         delivery.batch_sise: unknown field; did you mean batch_size?\n"
    );
}

#[test]
fn a_string_where_a_number_belongs_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = valid(dir.path());
    c["delivery"] = json!({"batch_size": "50", "max_batch_wait_ms": "5"});
    let cfg = write_config(dir.path(), "c.json", &c);
    let (code, _, err) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("Configuration is invalid (2 problems):\n"),
        "{err}"
    );
    assert!(
        err.contains("delivery.batch_size: must be an integer from 1 to 10000 (got a string)"),
        "{err}"
    );
}

#[test]
fn validate_summarizes_what_the_runner_will_do() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = valid(dir.path());
    c["nats"]["create_consumer"] = json!(true);
    c["dead_letter"] = json!({"enabled": true, "subject": "dlq.orders"});
    c["metrics"] = json!({"enabled": true, "snapshot_file": dir.path().join("m.json")});
    c["advisories"] = json!({"enabled": true});
    let cfg = write_config(dir.path(), "c.json", &c);
    let (code, out, err) = svc(&["validate", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let summary = out.lines().last().unwrap();
    assert_eq!(
        summary,
        format!(
            "Consumes stream ORDERS through durable consumer svc filtered on orders.>; the \
             consumer is created when missing. Writes to a file sink. Protections: none. Dead \
             letters go to dlq.orders. Metrics snapshot: {}. Broker advisories are watched.",
            dir.path().join("m.json").display()
        )
    );
}

/// Nothing listens on the port: the failure names the server it tried, and appears once
/// (it used to be printed as a log line and again as a `svc:` line).
#[test]
fn a_broker_that_cannot_be_reached_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut c = valid(dir.path());
    c["nats"]["url"] = json!(format!("nats://127.0.0.1:{port}"));
    let cfg = write_config(dir.path(), "c.json", &c);
    let (code, out, err) = svc(&["run", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    let failures: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("broker: connect"))
        .collect();
    assert_eq!(failures.len(), 1, "{err}");
    assert!(
        failures[0].contains(&format!("(servers: nats://127.0.0.1:{port})")),
        "{err}"
    );
}
