//! Operator-facing behaviour of `svc` a newcomer meets first: each command's own help, the
//! command list, configuration problems that point at the fix, the `validate` summary, and a
//! broker failure that names the server and is printed once. No broker is started: the
//! connect test aims at a closed loopback port.

mod util;

use serde_json::json;
use util::*;

const COMMANDS: &[&str] = &[
    "validate",
    "show-effective-config",
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
        err.contains("unknown command \"valdate\": one of validate, show-effective-config, run,"),
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

/// The JSON blocks of the docs that are whole configurations (`nats` and `sink` at the top),
/// and the config the package ships.
fn doc_configs() -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut files);
    // The starting config the Debian package ships.
    let shipped = root.join("contrib/debian/config.json");
    let mut out = vec![(
        shipped.display().to_string(),
        std::fs::read_to_string(&shipped).unwrap(),
    )];
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, block) in text.split("```json\n").skip(1).enumerate() {
            let body = block.split("\n```").next().unwrap();
            let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
                continue;
            };
            if v.get("nats").is_some() && v.get("sink").is_some() {
                out.push((format!("{} block {}", f.display(), i + 1), body.to_string()));
            }
        }
    }
    out
}

/// Every example configuration in the docs: `show-effective-config` prints a valid config,
/// and printing that again gives the same bytes; no environment value is ever read.
#[test]
fn effective_config_of_every_doc_example_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let examples = doc_configs();
    let mut checked = 0;
    for (what, body) in &examples {
        let cfg = dir.path().join("c.json");
        std::fs::write(&cfg, body).unwrap();
        let (code, _, _) = svc(&["validate", cfg.to_str().unwrap()]);
        if code != 0 {
            continue; // a fragment with placeholders, not a runnable example
        }
        let (code, once, err) = svc(&["show-effective-config", cfg.to_str().unwrap()]);
        assert_eq!(code, 0, "{what}: {err}");
        let eff = dir.path().join("e.json");
        std::fs::write(&eff, &once).unwrap();
        let (code, _, err) = svc(&["validate", eff.to_str().unwrap()]);
        assert_eq!(
            code, 0,
            "{what}: the effective config is invalid: {err}\n{once}"
        );
        let (code, twice, _) = svc(&["show-effective-config", eff.to_str().unwrap()]);
        assert_eq!((code, &twice), (0, &once), "{what}");
        assert_effective_round_trip(body);
        checked += 1;
    }
    // The two whole examples of docs/ (configuration.md, sinks/object-store.md) and the
    // shipped config; a new example only adds to this.
    assert!(
        checked >= 3,
        "only {checked} of {} examples validate",
        examples.len()
    );
}

#[test]
fn show_effective_config_fills_every_default_and_validates_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = valid(dir.path());
    c["nats"]["auth"] = json!({"mode": "token", "token_env": "SVC_NATS_TOKEN"});
    c["nats"]["tls_required"] = json!(true);
    let cfg = write_config(dir.path(), "c.json", &c);
    let (code, out, err) = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["show-effective-config", cfg.to_str().unwrap()])
        .env("SVC_NATS_TOKEN", "never-printed-token-value")
        .output()
        .map(|o| {
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("never-printed-token-value"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // The variable's name as written, the defaults filled, blocks in the documented order.
    assert_eq!(v["nats"]["auth"]["token_env"], "SVC_NATS_TOKEN");
    assert_eq!(v["delivery"]["batch_size"], 256);
    assert_eq!(v["sink"]["duplicate_policy"], "skip_existing");
    assert_eq!(v["logging"]["level"], "info");
    let top: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("  \""))
        .filter_map(|l| l.split('"').next())
        .collect();
    assert_eq!(
        top,
        [
            "nats",
            "delivery",
            "envelope",
            "sink",
            "metrics",
            "advisories",
            "logging",
            "message_metadata",
            "security_labels",
            "dead_letter",
            "payload_encryption",
            "authenticity",
            "custody"
        ]
    );

    // Invalid: the same problems and exit code as validate, nothing on stdout.
    c["delivery"] = json!({"batch_sise": 5});
    let bad = write_config(dir.path(), "bad.json", &c);
    let shown = svc(&["show-effective-config", bad.to_str().unwrap()]);
    let validated = svc(&["validate", bad.to_str().unwrap()]);
    assert_eq!(shown, (2, String::new(), validated.2));
}
